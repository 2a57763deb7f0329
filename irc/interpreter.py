"""The reference interpreter: runs any graph on NumPy through each op's reference.

Every other result in irc is held against this. ``run`` binds symbolic dims from the
arrays it is given, materialises weights (present, lazy, or seeded by name when absent)
and evaluates nodes in order. ``Interpreter.run_node`` can be overridden (as in torch.fx)
to observe or replace single ops.
"""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from irc import dims, ops
from irc.ops.vision import CROSS_MASK, FEATURES
from irc.analysis import EMPTY, cache_inputs, past_inputs  # noqa: F401 (cache_inputs: re-exported)
from irc.errors import IRCError
from irc.graph import Graph, Node, Param
from irc.ops.rope import cache_refresh_length
from irc.weights import seed_absent
from irc.world import Shard, full_view, run_world, runs_on, world_size


class Interpreter:
    def __init__(self, graph: Graph, seed: int = 0):
        self.graph, self.seed = graph, seed
        for dtype in {v.dtype for v in [*graph.values(), *graph.params.values()]}:
            dtype.numpy  # bf16 / int4 values: ml_dtypes imported (irc.dtypes), so NumPy knows their names
        seed_absent(graph, seed)
        self._weights: dict = {}

    def weight(self, param: Param, rank: Optional[int] = None) -> np.ndarray:
        """The param's array (a sharded graph's: rank ``rank``'s block, ``irc.world``)."""
        key = param.name if rank is None else (param.name, rank)
        if key not in self._weights:
            if isinstance(param.data, Shard):
                if rank is None:
                    raise IRCError(f"@{param.name} is sharded: the graph runs as a world (irc.world)")
                offset = float(self.graph.meta.get("norm_offset", 0.0) or 0.0)
                self._weights[key] = param.data.for_rank(rank, self.seed, centre=1.0 - offset)
            else:
                self._weights[key] = np.asarray(param.array())
        return self._weights[key]

    def bind(self, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
        return bind_symbols(self.graph, feeds)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The graph's outputs; a sharded graph's (``irc.world``) from all its ranks, joined."""
        if world_size(self.graph):
            return run_world(self, feeds)
        return self.run_rank(feeds, None)

    def run_rank(self, feeds: Mapping[str, np.ndarray], rank: Optional[int]) -> dict[str, np.ndarray]:
        """One rank's run (None: an unsharded graph)."""
        bindings = self.bind(feeds)
        env: dict[int, np.ndarray] = {}
        for value in self.graph.inputs:
            env[id(value)] = np.asarray(feeds[value.name])
        runs = runs_on(self.graph, rank)  # a pipeline stage's rank runs its own nodes (irc.world)
        for node in self.graph.nodes:
            if not runs(node):
                continue
            args = [None if v is None else (self.weight(v, rank) if isinstance(v, Param) else
                                            env.get(id(v)) if node.op == "pipe" else env[id(v)])
                    for v in node.inputs]  # a pipe's receiving rank has not made what it receives
            results = self.run_node(node, args, bindings)
            for value, result in zip(node.outputs, results):
                expected = dims.evaluate_shape(value.shape, bindings)
                if tuple(result.shape) != expected or result.dtype != value.dtype.numpy:
                    raise IRCError(f"reference of {node.op} returned {result.dtype}{list(result.shape)}, "
                                   f"inference says {value.dtype}{list(expected)}", location=f"node %{node.name}")
                env[id(value)] = result
        return {v.name: env[id(v)] for v in self.graph.outputs if id(v) in env}

    def run_node(self, node: Node, args: list, bindings: Mapping[str, int]) -> list[np.ndarray]:
        opdef = ops.get_op(node.op)
        attrs = node.attrs
        if opdef.shape_attrs:
            attrs = dict(attrs)
            for key in opdef.shape_attrs:
                attrs[key] = [dims.evaluate(d, bindings) for d in attrs[key]]
        return opdef.reference(args, attrs)


def bind_symbols(graph: Graph, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Bind the symbols of the graph inputs' shapes to the fed arrays' sizes
    (``irc.dims.binding_plan``), then check every input's shape against them."""
    missing = [v.name for v in graph.inputs if v.name not in feeds]
    if missing:
        raise IRCError(f"missing inputs: {', '.join(missing)}", location=f"graph {graph.name}")
    shapes = {v.name: np.shape(feeds[v.name]) for v in graph.inputs}
    for value in graph.inputs:
        if len(shapes[value.name]) != value.rank:
            raise IRCError(f"input %{value.name} has rank {len(shapes[value.name])}, expected {value.rank}")
    bindings: dict[str, int] = {}
    for symbol, name, axis, rest, coefficient in dims.binding_plan(graph.inputs):
        bindings[symbol] = (shapes[name][axis] - dims.evaluate(rest, bindings)) // coefficient
    for value in graph.inputs:
        for dim, size in zip(value.shape, shapes[value.name]):
            if dims.symbols(dim) <= set(bindings) and dims.evaluate(dim, bindings) != size:
                raise IRCError(f"input %{value.name}: dim {dim} should be {dims.evaluate(dim, bindings)}, "
                               f"got {size}")
    return bindings


def run(graph: Graph, feeds: Mapping[str, np.ndarray], seed: int = 0) -> dict[str, np.ndarray]:
    return Interpreter(graph, seed).run(feeds)


# ---- inputs for LLM graphs ---------------------------------------------------------------

def random_feeds(graph: Graph, batch: int = 2, tokens: int = 5, past: int = 0, seed: int = 0,
                 vocab: Optional[int] = None, sizes: Optional[Mapping[str, int]] = None,
                 left_pad: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for any graph: ids below the vocabulary, an all-ones mask, positions
    continuing after the past, random past caches; other inputs standard normal.
    Symbols other than B, T and P take their size from ``sizes`` (default 3). With
    ``left_pad``, the last row's first ``left_pad`` cache slots are padding and its
    positions count real tokens only (as HF generate does)."""
    rng = np.random.default_rng(seed)
    bindings = {"B": batch, "T": tokens, "P": past}
    grid = None
    if any(v.name == "image_grid_thw" for v in graph.inputs):  # Qwen-VL's patches: one image of 2 x 3 merged blocks
        merge = int((graph.meta.get("vision") or {}).get("merge", 1))
        grid = np.asarray([[1, 2 * merge, 3 * merge]], np.int64)
        bindings.update(N=1, I=6)
    for value in full_view(graph, graph.inputs):  # a sharded graph's as its world takes them
        for d in value.shape:
            for symbol in sorted(dims.symbols(d) - set(bindings)):
                bindings[symbol] = (sizes or {}).get(symbol, 3)
    vocab = vocab or int(graph.meta.get("vocab_size", 2))
    feeds = {}
    for value in full_view(graph, graph.inputs):  # a sharded graph's as its world takes them
        shape = dims.evaluate_shape(value.shape, bindings)
        if value.name == "input_ids":
            feeds[value.name] = rng.integers(0, vocab, size=shape, dtype=np.int64)
        elif value.name == "attention_mask":
            feeds[value.name] = np.ones(shape, dtype=np.int64)
        elif value.name == "position_ids":
            feeds[value.name] = np.broadcast_to(np.arange(past, past + tokens, dtype=np.int64), shape).copy()
        elif value.name == "image_grid_thw" and grid is not None:
            feeds[value.name] = grid
        elif value.name == FEATURES:  # a VLM decoder's image rows: one per placeholder in the ids
            rows = int((feeds["input_ids"] == graph.meta["image_token_id"]).sum())
            feeds[value.name] = rng.standard_normal((rows,) + shape[1:]).astype(value.dtype.numpy)
        elif value.dtype.is_float:
            feeds[value.name] = rng.standard_normal(shape).astype(value.dtype.numpy)
        else:
            feeds[value.name] = rng.integers(0, 2, size=shape).astype(value.dtype.numpy)
    if left_pad and "attention_mask" in feeds:
        feeds["attention_mask"][-1, :left_pad] = 0
        positions = np.cumsum(feeds["attention_mask"], axis=1) - 1
        if "position_ids" in feeds:
            feeds["position_ids"][-1] = np.maximum(positions[-1, -tokens:], 0)
    return feeds


def generate(graph: Graph, prompt: list[int], max_new_tokens: int, seed: int = 0) -> tuple[list[int], np.ndarray]:
    """Greedy decoding with the KV cache and recurrent states: one prefill over the prompt
    (empty caches, zero states), then one step per token feeding each ``present.*`` output
    back as the matching ``past_key_values.*``. Returns the new tokens and the logits of
    the last step. A LongRoPE graph's step that reaches ``cache_refresh_length`` runs the
    whole sequence again from empty caches, as transformers' generate does."""
    interp = Interpreter(graph, seed)
    caches = full_view(graph, past_inputs(graph))  # a sharded graph's as its world takes them
    empty = {v.name: np.zeros(dims.evaluate_shape(v.shape, {"B": 1, **EMPTY}), v.dtype.numpy) for v in caches}
    state = dict(empty)
    ids = np.asarray([prompt], dtype=np.int64)
    past, tokens, last = 0, [], None
    refresh = cache_refresh_length(graph)
    for _ in range(max_new_tokens):
        if refresh is not None and past == refresh - 1 and ids.shape[1] == 1:
            ids, past, state = np.asarray([list(prompt) + tokens], dtype=np.int64), 0, dict(empty)
        t = ids.shape[1]
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, past + t), np.int64),
                 "position_ids": np.arange(past, past + t, dtype=np.int64)[None, :], **state, **no_images(graph, 1, t)}
        outputs = interp.run({k: v for k, v in feeds.items() if k in {i.name for i in graph.inputs}})
        last = outputs["logits"][0, -1]
        token = int(np.argmax(last))
        tokens.append(token)
        for v in caches:
            state[v.name] = outputs[present_name(v.name)]
        past += t
        ids = np.asarray([[token]], dtype=np.int64)
    return tokens, last


def no_images(graph: Graph, batch: int = 1, tokens: int = 1) -> dict:
    """A VLM decoder's ``image_features`` with no rows (a text-only step of ``batch``
    sequences and ``tokens`` tokens): [0, d], or a cross-attention decoder's [B, 0, d] and its
    ``cross_attention_mask`` over no image keys [B, T, 0] (``frontends.dsl_cross``); {} for
    other decoders."""
    value = next((v for v in graph.inputs if v.name == FEATURES), None)
    if value is None:
        return {}
    if len(value.shape) == 2:
        return {FEATURES: np.zeros((0, value.shape[1]), value.dtype.numpy)}
    return {FEATURES: np.zeros((batch, 0, value.shape[2]), value.dtype.numpy),
            CROSS_MASK: np.zeros((batch, tokens, 0), np.int64)}


def present_name(past_name: str) -> str:
    """``past_key_values.3.key`` -> ``present.3.key`` (onnxruntime-genai's names)."""
    return "present." + past_name[len("past_key_values."):] if past_name.startswith("past_key_values.") else past_name
