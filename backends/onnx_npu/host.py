"""The host loop of an onnx-npu folder: chunked prefill, decode, the fixed-size KV cache.

``generate(folder, ids, max_new_tokens, eos_ids)`` reads ``irc_npu.json`` and drives
``chunk.onnx`` over the prompt, T tokens a call (the last chunk padded), then
``decode.onnx`` one token a call, greedily, on ONNX Runtime's CPU provider (or any
``engines``: the QNN emulator's sessions, say). The host owns the cache: slot j holds the
token at position j, so the graphs' new entries (``present.*`` [1, K, T, D]) are written
at the positions of the tokens just run; the additive masks say which slots each query
sees (filled slots, causal among the new tokens, within a sliding window where the layer
has one). A padded query row sees only itself; its outputs are never read and its cache
entries never written.

A recurrent layer's states (``contract["states"]``: a conv state, an SSD or delta-rule
state) are fixed-size: the host feeds each call the states the previous one returned
(zeros before the first). Its graphs read no padding mask, so every token they run must be
real: a prompt runs in whole chunks through ``chunk.onnx`` and its remainder (fewer than T
tokens) one token a call through ``decode.onnx``; ``step`` refuses a short chunk.

The sequence must fit the cache: prompt + new tokens - 1 <= ``context`` (an ``IRCError``
names both otherwise, before anything runs).

LongRoPE (``contract["rope_rows"]``): the host feeds the cos/sin table rows, the positions
plus ``offset`` while the sequence it knows (the whole prompt during a chunked prefill,
then every token so far) is longer than ``original``; and ``generate`` runs the whole
sequence again at ``original`` + 1 tokens, as transformers' generate does
(``irc.ops.rope.cache_refresh_length``).
"""
from __future__ import annotations

import json
import os
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from irc.dtypes import DType
from irc.errors import IRCError
from irc.output import import_native

CONTRACT = "irc_npu.json"
Engine = Callable[[Mapping[str, np.ndarray]], dict]


def load_contract(folder: str) -> dict:
    path = os.path.join(folder, CONTRACT)
    if not os.path.isfile(path):
        raise IRCError(f"{folder} is not an onnx-npu folder: it has no {CONTRACT}",
                       hint="compile with --target onnx-npu -o FOLDER")
    with open(path) as f:
        return json.load(f)


def ort_engines(folder: str, contract: dict, threads: int = 2) -> dict:
    """ONNX Runtime CPU sessions for the chunk and decode graphs."""
    return {role: session_engine(cpu_session(os.path.join(folder, name), threads))
            for role, name in contract["graphs"].items()}


def cpu_session(path: str, threads: int = 2):
    """An ONNX Runtime CPU session computing QDQ graphs exactly."""
    ort = import_native("onnxruntime")  # deferring Ctrl-C past its native init (irc.output)

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    # exact float math where ORT fuses DequantizeLinear -> MatMul into MatMulNBits (its default
    # accuracy level quantizes the activations to int8 inside the kernel: tens of uint16 steps off)
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def session_engine(session) -> Engine:
    names = [o.name for o in session.get_outputs()]
    inputs = {i.name for i in session.get_inputs()}

    def run(feeds):
        return dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in inputs})))

    return run


class Host:
    """The cache and the masks of one sequence (module docstring)."""

    def __init__(self, contract: dict, engines: Mapping[str, Engine]):
        self.contract, self.engines = contract, engines
        self.context = contract["context"]
        self.dtype = DType.parse(contract["dtype"]).numpy
        self.caches = {c["past"]: np.zeros(c["shape"], DType.parse(c["dtype"]).numpy) for c in contract["caches"]}
        self.states = {s["past"]: np.zeros(s["shape"], DType.parse(s["dtype"]).numpy)
                       for s in contract.get("states", [])}
        self.filled = 0
        self.known = 0  # the sequence length the host knows of (a prompt's, before its chunks run)

    def feeds(self, ids: Sequence[int], tokens: int) -> dict:
        """Inputs for ``ids`` (padded to ``tokens``) at the next positions."""
        real, start, n = len(ids), self.filled, self.context
        positions = np.minimum(start + np.arange(tokens), n - 1)
        padded = np.zeros(tokens, np.int64)
        padded[:real] = ids
        feeds = {self.contract["inputs"]["ids"]: padded[None].astype(np.int32),
                 self.contract["inputs"]["positions"]: positions[None].astype(np.int32), **self.caches,
                 **self.states}
        for rows in self.contract.get("rope_rows", []):
            long = max(self.known, start + real) > rows["original"]
            feeds[rows["name"]] = (positions + rows["offset"] * long)[None].astype(np.int32)
        query = start + np.arange(tokens)[:, None]                              # [T, 1] positions
        keys = np.concatenate([np.arange(n), start + np.arange(tokens)])[None]  # [1, N+T]
        filled = np.concatenate([np.arange(n) < start, np.ones(tokens, bool)])[None]
        causal = (keys <= query) & filled
        own = np.zeros((tokens, n + tokens), bool)
        own[np.arange(tokens), n + np.arange(tokens)] = True
        for mask in self.contract["masks"]:
            visible = causal if mask["window"] is None else causal & (query - keys < mask["window"])
            if mask.get("chunk"):  # Llama-4's chunks (a slot holds its position)
                visible = visible & (keys // mask["chunk"] == query // mask["chunk"])
            visible = np.where(np.arange(tokens)[:, None] < real, visible, own)
            bias = np.where(visible, 0.0, self.contract["mask_value"]).astype(self.dtype)
            feeds[mask["name"]] = bias[None, None]
        return feeds

    def step(self, role: str, ids: Sequence[int]) -> np.ndarray:
        """Run ``ids`` through graph ``role``, place their cache entries; the logits of the
        real tokens [len(ids), V]."""
        tokens = self.contract["chunk"] if role == "chunk" else 1
        real = len(ids)
        if self.states and real != tokens:
            raise IRCError(f"{real} tokens for the {tokens}-token {role} graph: a recurrent state would take the "
                           "padding in", hint="run whole chunks, and the rest one token at a time (prefill does)")
        outputs = self.engines[role](self.feeds(ids, tokens))
        for cache in self.contract["caches"]:
            new = outputs[cache["present"]][:, :, :real]
            self.caches[cache["past"]][:, :, self.filled:self.filled + real] = new
        for state in self.contract.get("states", []):
            self.states[state["past"]] = outputs[state["present"]]
        self.filled += real
        return outputs[self.contract["logits"]][0, :real]

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Every prompt position's logits [len(ids), V], T tokens a call."""
        chunk = self.contract["chunk"]
        if self.filled + len(ids) > self.context:
            raise IRCError(f"{len(ids)} tokens do not fit the {self.context}-slot KV cache")
        self.known = self.filled + len(ids)
        whole = len(ids) // chunk * chunk if self.states else len(ids)
        parts = [self.step("chunk", ids[i:i + chunk]) for i in range(0, whole, chunk)]
        parts += [self.step("decode", ids[i:i + 1]) for i in range(whole, len(ids))]
        return np.concatenate(parts)


def prefill_logits(folder: str, ids: Sequence[int], engines: Optional[Mapping[str, Engine]] = None) -> np.ndarray:
    """The logits [len(ids), V] of one chunked prefill over ``ids`` (teacher forcing: the
    numbers quantization error and top-1 agreement are measured on)."""
    contract = load_contract(folder)
    return Host(contract, engines or ort_engines(folder, contract)).prefill([int(t) for t in ids])


def generate(folder: str, ids: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int] = (),
             on_token: Optional[Callable[[int], None]] = None, engines: Optional[Mapping[str, Engine]] = None,
             logits: Optional[list] = None) -> list[int]:
    """Greedy decoding (module docstring): the new tokens, stopping after an ``eos_ids``
    token; ``on_token`` sees each as it comes; ``logits`` (a list) receives each step's."""
    contract = load_contract(folder)
    ids = [int(t) for t in ids]
    if not ids or max_new_tokens < 1:
        raise IRCError("generate needs a prompt and max_new_tokens >= 1")
    if len(ids) + max_new_tokens - 1 > contract["context"]:
        raise IRCError(f"a prompt of {len(ids)} tokens plus {max_new_tokens} new ones does not fit the "
                       f"{contract['context']}-slot KV cache of {folder}",
                       hint="compile with a larger --context, or ask for fewer tokens")
    engines = engines or ort_engines(folder, contract)
    host = Host(contract, engines)
    last = host.prefill(ids)[-1]
    new: list[int] = []
    rerun = min((rows["original"] for rows in contract.get("rope_rows", [])), default=None)
    while True:
        if logits is not None:
            logits.append(last)
        token = int(np.argmax(last))
        new.append(token)
        if on_token is not None:
            on_token(token)
        if len(new) == max_new_tokens or token in set(eos_ids):
            return new
        if rerun is not None and host.filled == rerun:  # LongRoPE: the whole sequence again
            host = Host(contract, engines)
            last = host.prefill(ids + new)[-1]
        else:
            last = host.step("decode", [token])[-1]
