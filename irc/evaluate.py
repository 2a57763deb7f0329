"""A text through the reference interpreter: token ids, perplexity, top-1 agreement.

- ``text_tokens(text_file, tokenizer_json, chat=False)``: the text's token ids under a Hugging
  Face ``tokenizer.json`` (the ``tokenizers`` library, imported only here and only when
  called; ``chat``: the text as conversations in the model's chat template, ``irc.chat``);
  missing files, an unreadable tokenizer and a text of fewer than 2 tokens are
  ``EvalTextError`` (a user error: exit 2 through the CLI).
- ``StreamingInterpreter``: the reference interpreter holding one node's weights at a time
  (each param is loaded when a node reads it and dropped after) and freeing every
  activation after its last reader, so a whole-text run holds the live activations and
  one node's weights, not the model.
- ``prefill_logits(interpreter, ids)``: the logits [T, V] of one prefill over ``ids`` (batch 1,
  empty past caches).
- ``perplexity_and_agreement(reference, candidate, tokens, window)``: both graphs over the
  text in consecutive windows of ``window`` tokens (each an independent prefill); the
  perplexity exp(mean NLL of each next token) of each, and top-1 agreement, the fraction of
  positions where the candidate's most likely next token is the reference's. Only per-position
  scalars are kept between windows.
"""
from __future__ import annotations

import math
import os
from typing import Mapping, Optional, Sequence

import numpy as np

from irc import dims
from irc.analysis import EMPTY
from irc.errors import IRCError
from irc.graph import Graph, Param
from irc.interpreter import Interpreter, past_inputs

DEFAULT_WINDOW = 512


class EvalTextError(IRCError):
    """An evaluation or calibration text that cannot be used."""


def load_tokenizer(source, error=None):
    """A ``tokenizers.Tokenizer`` from a ``tokenizer.json`` path, or from its content (bytes);
    ``error`` (an IRCError subclass, EvalTextError by default) when the library is missing
    or the file cannot be read."""
    error = error or EvalTextError
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise error("reading a text needs the 'tokenizers' package", hint='pip install -e ".[text]"') from None
    try:
        if isinstance(source, bytes):
            return Tokenizer.from_str(source.decode("utf-8"))
        return Tokenizer.from_file(os.fspath(source))
    except Exception as err:  # the library raises its own exception types
        raise error(f"cannot read the tokenizer: {err}", location=None if isinstance(source, bytes) else
                    os.fspath(source)) from None


def text_tokens(path: str, tokenizer: str, limit: Optional[int] = None, what: str = "eval text",
                chat: bool = False) -> list[int]:
    """The token ids of the text in ``path`` (its first ``limit`` when given) under the
    ``tokenizer.json`` at ``tokenizer``; at least 2 of them, or EvalTextError. ``chat``: the
    text laid out as conversations by the chat template beside the tokenizer
    (``irc.chat.chat_text``), tokenized without adding special tokens (the template wrote them)."""
    for name, file in ((what, path), ("tokenizer", tokenizer)):
        if not file or not os.path.isfile(file):
            hint = "the tokenizer is the model folder's tokenizer.json" if name == "tokenizer" else None
            raise EvalTextError(f"{name} {file!r} is not a file", location=str(file), hint=hint)
    encoder = load_tokenizer(tokenizer)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as err:
        raise EvalTextError(f"{what} is not UTF-8 text: {err}", location=path) from None
    if chat:
        from irc.chat import chat_text

        text = chat_text(text, os.path.dirname(os.path.abspath(tokenizer)), path)
    ids = encoder.encode(text, add_special_tokens=not chat).ids
    ids = ids[:limit] if limit else ids
    if len(ids) < 2:
        raise EvalTextError(f"{what} has {len(ids)} token(s); perplexity needs at least 2", location=path,
                            hint="give a longer text")
    return [int(t) for t in ids]


class StreamingInterpreter(Interpreter):
    """The reference interpreter with bounded memory (module docstring); same results."""

    def weight(self, param: Param) -> np.ndarray:
        return np.asarray(param.array())

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        bindings = self.bind(feeds)
        last_reader: dict[int, int] = {}
        for index, node in enumerate(self.graph.nodes):
            for value in node.inputs:
                if value is not None and not isinstance(value, Param):
                    last_reader[id(value)] = index
        keep = {id(v) for v in self.graph.outputs}
        env = {id(v): np.asarray(feeds[v.name]) for v in self.graph.inputs}
        for index, node in enumerate(self.graph.nodes):
            args = [None if v is None else (self.weight(v) if isinstance(v, Param) else env[id(v)])
                    for v in node.inputs]
            results = self.run_node(node, args, bindings)
            del args
            for value, result in zip(node.outputs, results):
                if tuple(result.shape) != dims.evaluate_shape(value.shape, bindings):
                    raise IRCError(f"reference of {node.op} returned shape {list(result.shape)}",
                                   location=f"node %{node.name}")
                env[id(value)] = result
            for value in node.inputs:
                if value is not None and last_reader.get(id(value)) == index and id(value) not in keep:
                    env.pop(id(value), None)
        return {v.name: env[id(v)] for v in self.graph.outputs}


def prefill_logits(interpreter: Interpreter, ids: Sequence[int]) -> np.ndarray:
    """Logits [T, V] (float32) of one prefill over ``ids``: batch 1, empty past caches and zero states."""
    graph = interpreter.graph
    names = {v.name for v in graph.inputs}
    t = len(ids)
    feeds = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, t), np.int64),
             "position_ids": np.arange(t, dtype=np.int64)[None, :]}
    for cache in past_inputs(graph):
        feeds[cache.name] = np.zeros(dims.evaluate_shape(cache.shape, {"B": 1, **EMPTY}), cache.dtype.numpy)
    outputs = interpreter.run({k: v for k, v in feeds.items() if k in names})
    return np.asarray(outputs["logits"][0], dtype=np.float32)


def next_token_nll(logits: np.ndarray, ids: Sequence[int]) -> np.ndarray:
    """-log p(ids[t+1] | ids[..t]) for t < T-1, from logits [T, V], in float64."""
    x = np.asarray(logits, dtype=np.float64)[:-1]
    top = x.max(axis=-1)
    log_norm = np.log(np.exp(x - top[:, None]).sum(axis=-1)) + top
    return log_norm - x[np.arange(x.shape[0]), np.asarray(ids[1:])]


def windows(tokens: Sequence[int], window: int) -> list[list[int]]:
    """Consecutive windows of at most ``window`` tokens; a last one shorter than 2 joins none."""
    return [list(tokens[i:i + window]) for i in range(0, len(tokens), window) if len(tokens[i:i + window]) >= 2]


def perplexity(nll: Sequence[float]) -> float:
    return float(math.exp(float(np.mean(nll))))


def perplexity_and_agreement(reference: Graph, candidate: Optional[Graph], tokens: Sequence[int],
                             window: int = DEFAULT_WINDOW, seed: int = 0) -> dict:
    """{"tokens", "window", "perplexity": {"reference", "candidate"}, "top1_agreement"} of
    both graphs over ``tokens`` (module docstring); the candidate's entries are None
    without one. Graphs are cloned, never changed."""
    runners = [StreamingInterpreter(g.clone(), seed) for g in (reference, candidate) if g is not None]
    nll: list[list[float]] = [[] for _ in runners]
    agree: list[bool] = []
    for chunk in windows(tokens, window):
        tops = []
        for index, runner in enumerate(runners):
            logits = prefill_logits(runner, chunk)
            nll[index].extend(next_token_nll(logits, chunk).tolist())
            tops.append(logits[:-1].argmax(axis=-1))
            del logits
        if len(tops) == 2:
            agree.extend((tops[0] == tops[1]).tolist())
    return {"tokens": len(tokens), "window": window, "positions": len(nll[0]),
            "perplexity": {"reference": perplexity(nll[0]), "candidate": perplexity(nll[1]) if candidate else None},
            "top1_agreement": float(np.mean(agree)) if agree else None}


__all__ = ["EvalTextError", "text_tokens", "StreamingInterpreter", "prefill_logits", "next_token_nll",
           "perplexity_and_agreement", "windows", "DEFAULT_WINDOW"]
