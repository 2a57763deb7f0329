"""Running a compiled model: ONNX Runtime sessions, left-padded batches and greedy
decoding with the KV cache, for any engine that maps input arrays to output arrays (an
ORT session or ``irc.interpreter.Interpreter``), so tests and benchmarks drive
both the same way.

Batches of uneven prompts are left-padded: ``attention_mask`` 0 on the padding,
``position_ids`` counting real tokens only (0 on the padding). Each step feeds
``present.*`` back as ``past_key_values.*``.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional

import numpy as np

from irc import dims
from irc.analysis import EMPTY, past_inputs
from irc.interpreter import no_images
from irc.graph import Graph
from irc.output import import_native
from irc.ops.rope import cache_refresh_length
from irc.world import full_view

Engine = Callable[[Mapping[str, np.ndarray]], dict]


def ort_session(path: str, threads: Optional[int] = 2):
    """An ONNX Runtime CPU session (``threads`` intra-op threads; None: ORT's default)."""
    ort = import_native("onnxruntime")  # deferring Ctrl-C past its native init (irc.output)

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    # exact float math where ORT fuses DequantizeLinear -> MatMul into MatMulNBits
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def ort_engine(path: str, threads: int = 2) -> Engine:
    """An ONNX Runtime CPU session as an engine (``threads`` intra-op threads)."""
    session = ort_session(path, threads)
    names = [o.name for o in session.get_outputs()]
    inputs = {i.name for i in session.get_inputs()}

    def run(feeds):
        return dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in inputs})))

    return run


def interpreter_engine(graph: Graph, seed: int = 0) -> Engine:
    from irc.interpreter import Interpreter

    interp = Interpreter(graph, seed)
    names = {v.name for v in graph.inputs}
    return lambda feeds: interp.run({k: v for k, v in feeds.items() if k in names})


def left_padded(prompts: list, pad_id: int = 0) -> dict:
    """input_ids, attention_mask and position_ids [B, T] for uneven prompts, padded left."""
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = prompt
        mask[row, width - len(prompt):] = 1
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0) * mask
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions.astype(np.int64)}


def cache_names(graph: Graph) -> list[str]:
    return [v.name for v in past_inputs(graph)]


def empty_caches(graph: Graph, batch: int) -> dict:
    """Zero-length past caches [B, K, 0, D] and zero recurrent states for every
    past_key_values input."""
    return {v.name: np.zeros(dims.evaluate_shape(v.shape, {"B": batch, **EMPTY}), v.dtype.numpy)
            for v in full_view(graph, past_inputs(graph))}  # a sharded graph's: as its world takes them


def greedy(engine: Engine, graph: Graph, prompts: list, new_tokens: int, pad_id: int = 0) -> dict:
    """Greedy decoding of a left-padded batch. Returns ``tokens`` [B, new_tokens],
    ``prefill`` (the first step's outputs), ``steps`` (logits [B, V] of every decode step
    after the prefill) and ``feeds`` (the prefill inputs) and ``final`` (last outputs).
    A LongRoPE graph's step that reaches ``cache_refresh_length`` runs the whole batch
    again from empty caches, as transformers' generate does."""
    padded = left_padded(prompts, pad_id)  # a VLM decoder run on text alone
    feeds = {**padded, **empty_caches(graph, len(prompts)), **no_images(graph, len(prompts), padded["input_ids"].shape[1])}
    first = dict(feeds)
    caches = cache_names(graph)
    refresh = cache_refresh_length(graph)
    outputs = engine(feeds)
    prefill, steps, tokens = outputs, [], []
    for step in range(new_tokens):
        logits = outputs["logits"][:, -1]
        if step:
            steps.append(logits)
        token = np.argmax(logits, axis=-1).astype(np.int64)
        tokens.append(token)
        if step == new_tokens - 1:
            break
        mask = np.concatenate([feeds["attention_mask"], np.ones((len(prompts), 1), np.int64)], axis=1)
        positions = feeds["position_ids"][:, -1:] + 1
        feeds = {"input_ids": token[:, None], "attention_mask": mask, "position_ids": positions,
                 **{name: outputs["present." + name[len("past_key_values."):]] for name in caches},
                 **no_images(graph, len(prompts), 1)}
        if refresh is not None and mask.shape[1] == refresh:
            rows = [list(prompt) + [int(t[row]) for t in tokens] for row, prompt in enumerate(prompts)]
            feeds = {**left_padded(rows, pad_id), **empty_caches(graph, len(prompts)),
                     **no_images(graph, len(prompts), max(map(len, rows)))}
        outputs = engine(feeds)
    return {"tokens": np.stack(tokens, axis=1), "prefill": prefill, "steps": steps, "feeds": first,
            "final": outputs, "mask": feeds["attention_mask"]}
