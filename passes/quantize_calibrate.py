"""Calibration for ``quantize``'s calibrated methods: ``importance`` (``method=imatrix``:
the mean squared activation of every input channel of every weight the pass will quantize)
and ``sequential_hessians`` (``method=gptq``: each weight's Hessian X^T X from the
activations that reach it through the weights before it, already quantized), both from the
reference interpreter run over a calibration text.

One run of ``irc.evaluate.StreamingInterpreter`` per window of the text (consecutive
windows of ``window`` tokens, each a prefill with empty caches), on the graph as it is
before quantization: each weight is loaded when its node runs and dropped after, and each
activation freed after its last reader, so the run streams through the model layer by
layer; what it keeps is one float64 vector of K sums per weight (a few MB for an 8B
model). Observed, per op (``OBSERVERS``):

- ``linear`` / ``dequant_linear``: the weight's input x;
- ``swiglu`` / ``geglu``: x for w_gate and w_up, and the hidden act(x Wg^T) * (x Wu^T) for
  w_down (recomputed from the node's weights: the reference does not expose it);
- ``gelu_mlp``: x for w_up, gelu(x Wu^T + b) for w_down.

A tied LM head is a ``linear`` over the embedding table, so the table's statistics are the
head's inputs. Weights no observer sees (MoE experts, MLA projections, an untied embedding
table) get none and are quantized by the unweighted search (``mse``); the pass says which
in its notes.

``sequential_hessians`` (GPTQ's sequential calibration) runs the graph node by node over all
windows of the text at once (``_Layerwise``): every live activation is held for every window
(calibration_tokens x d floats each), each weight loaded when its node runs and dropped
after. At a node reading a weight to quantize (``linear``'s weight; a dense MLP's w_gate /
w_up from x and w_down from its hidden, recomputed from the already quantized gate and up,
one window at a time), H = X^T X / T over all windows' inputs (``hessian``: each window's
sums in float64, added into one float32 d_in² array) goes to the caller's ``quantize(names,
hessian)``, which returns the quantized weights; the node then runs with its dequantized
weight, so every later activation is the quantized model's. Weights read from the same
activation (q/k/v, gate/up) are one group: one Hessian, handed over once, at the first of
them. A weight read by several observed nodes is quantized at the first; the others read the
result. The run stops at the last node with a weight to quantize (a tied head's table: the
final hidden state's Hessian), and the model's outputs (logits, present caches) are never
kept. The tied table's lookup, first in the graph, reads the float table: its codes are
chosen at the end.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from irc import ops
from irc import dims
from irc.evaluate import StreamingInterpreter, prefill_logits, windows
from irc.graph import Graph, Node, Param
from irc.interpreter import past_inputs
from irc.weights import read_rows
from irc.ops.nn import f32, linear
from irc.ops.primitives import gelu, silu


def _inputs(node: Node, args: list) -> dict:
    names = ops.get_op(node.op).operand_names(len(node.inputs))
    return {name: (value, array) for name, value, array in zip(names, node.inputs, args)}


def _observe_linear(node: Node, args: list) -> list:
    operands = _inputs(node, args)
    key = "weight" if node.op == "linear" else "qweight"
    return [(operands[key][0], operands["x"][1])]


def _observe_gated(node: Node, args: list) -> list:
    x, gate, up, down = args
    x32 = f32(x)
    if node.op == "swiglu":
        hidden = silu(x32 @ f32(gate).T)
    else:
        hidden = gelu(x32 @ f32(gate).T, node.attrs["approximate"])
    hidden = hidden * (x32 @ f32(up).T)
    return [(node.inputs[1], x32), (node.inputs[2], x32), (node.inputs[3], hidden)]


def _observe_gelu_mlp(node: Node, args: list) -> list:
    operands = _inputs(node, args)
    x = operands["x"][1]
    bias = operands.get("b_up", (None, None))[1]
    hidden = gelu(linear(x, operands["w_up"][1], bias), node.attrs["approximate"])
    return [(node.inputs[1], f32(x)), (node.inputs[2], hidden)]


OBSERVERS: dict[str, Callable[[Node, list], list]] = {
    "linear": _observe_linear, "dequant_linear": _observe_linear, "swiglu": _observe_gated,
    "geglu": _observe_gated, "gelu_mlp": _observe_gelu_mlp,
}


class _Collector(StreamingInterpreter):
    """Sums x_k² and counts rows for every observed weight in ``wanted``."""

    def __init__(self, graph: Graph, wanted: set, seed: int):
        super().__init__(graph, seed)
        self.wanted = wanted
        self.sums: dict[str, np.ndarray] = {}
        self.rows: dict[str, int] = {}

    def run_node(self, node: Node, args: list, bindings: Mapping[str, int]) -> list:
        results = super().run_node(node, args, bindings)
        observer = OBSERVERS.get(node.op)
        if observer is not None:
            for weight, activation in observer(node, args):
                if isinstance(weight, Param) and weight.name in self.wanted:
                    x = np.asarray(activation, dtype=np.float64).reshape(-1, activation.shape[-1])
                    self.sums[weight.name] = self.sums.get(weight.name, 0.0) + np.einsum("tk,tk->k", x, x)
                    self.rows[weight.name] = self.rows.get(weight.name, 0) + x.shape[0]
        return results


def importance(graph: Graph, tokens: Sequence[int], wanted: set, window: int = 512,
               seed: int = 0) -> dict[str, np.ndarray]:
    """Mean x_k² per input channel for each weight named in ``wanted`` that an observer sees
    (module docstring), over ``tokens`` in windows of ``window``; float32 [K] each."""
    collector = _Collector(graph.clone(), set(wanted), seed)
    for chunk in windows(tokens, window):
        prefill_logits(collector, chunk)
    return {name: (collector.sums[name] / collector.rows[name]).astype(np.float32) for name in sorted(collector.sums)}


def unobserved(stats: Mapping[str, np.ndarray], wanted: Sequence[str]) -> list[str]:
    """The weights in ``wanted`` that have no statistics."""
    return sorted(set(wanted) - set(stats))


HESSIAN_ROWS = 256  # rows of H computed at once (in float64: 29 MB at d_in 14336)


def hessian(activations) -> np.ndarray:
    """X^T X / T (float32 [K, K]) of the rows of ``activations`` (an iterable of arrays
    [..., K], consumed one at a time: a generator computes each window's only when it is
    summed), each one's share computed in float64 ``HESSIAN_ROWS`` rows of H at a time and
    added to H. Only H and one window's activation (in float64) are held: for a down
    projection at 4096 calibration tokens, the hidden of every window at once would be
    0.24 GB in float32 and twice that in float64, on top of H's 0.82 GB (Llama-3-8B's
    d_ff 14336)."""
    h, rows = None, 0
    for activation in activations:
        x = np.asarray(activation, dtype=np.float64).reshape(-1, activation.shape[-1])
        if h is None:
            h = np.zeros((x.shape[1], x.shape[1]), np.float32)
        for start in range(0, x.shape[1], HESSIAN_ROWS):
            h[start:start + HESSIAN_ROWS] += x[:, start:start + HESSIAN_ROWS].T @ x
        rows += x.shape[0]
        del x, activation  # before the next one is made
    h /= np.float32(rows)
    return h


def _prefill_feeds(graph: Graph, ids: Sequence[int]) -> dict:
    """The feeds of one prefill over ``ids`` (batch 1, empty caches), as ``prefill_logits``."""
    t = len(ids)
    feeds = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, t), np.int64),
             "position_ids": np.arange(t, dtype=np.int64)[None, :]}
    for cache in past_inputs(graph):
        feeds[cache.name] = np.zeros(dims.evaluate_shape(cache.shape, {"B": 1, "P": 0}), cache.dtype.numpy)
    names = {v.name for v in graph.inputs}
    return {k: v for k, v in feeds.items() if k in names}


class _Layerwise:
    """The graph run node by node over several prefills at once (module docstring)."""

    def __init__(self, graph: Graph, chunks: list, seed: int):
        self.graph = graph
        self.runner = StreamingInterpreter(graph, seed)
        feeds = [_prefill_feeds(graph, chunk) for chunk in chunks]
        self.bindings = [self.runner.bind(f) for f in feeds]
        self.envs = [{id(v): np.asarray(f[v.name]) for v in graph.inputs} for f in feeds]
        self.last_reader: dict[int, int] = {}
        for index, node in enumerate(graph.nodes):
            for value in node.inputs:
                if value is not None and not isinstance(value, Param):
                    self.last_reader[id(value)] = index

    def values(self, value) -> list:
        """The activation ``value`` in every window."""
        return [env[id(value)] for env in self.envs]

    def rows(self, value) -> np.ndarray:
        """The activation ``value`` of every window as one float32 [T, d] (all tokens' rows)."""
        return np.concatenate([f32(a).reshape(-1, a.shape[-1]) for a in self.values(value)])

    def arguments(self, node: Node, weights: dict) -> list:
        """The node's arguments in every window, each param the ``dequantized()`` of its entry
        in ``weights`` (by name) when there, else loaded (once for all windows). An embedding
        lookup reads only the table rows the windows look up (``lookup_rows``)."""
        if node.op == "embedding" and isinstance(node.inputs[1], Param) and node.inputs[1].name not in weights:
            ids = [env[id(node.inputs[0])] for env in self.envs]
            used, rows = lookup_rows(node.inputs[1], np.concatenate([i.reshape(-1) for i in ids]))
            return [[np.searchsorted(used, i).astype(i.dtype), rows] for i in ids]
        arrays = {v.name: weights[v.name].dequantized() if v.name in weights else self.runner.weight(v)
                  for v in node.inputs if isinstance(v, Param)}
        return [[None if v is None else arrays[v.name] if isinstance(v, Param) else env[id(v)] for v in node.inputs]
                for env in self.envs]

    def run(self, index: int, node: Node, weights: dict) -> None:
        """Run node ``index`` in every window; free what no later node reads."""
        for env, bindings, args in zip(self.envs, self.bindings, self.arguments(node, weights)):
            results = self.runner.run_node(node, args, bindings)
            del args
            for value, result in zip(node.outputs, results):
                if self.last_reader.get(id(value), -1) > index:
                    env[id(value)] = result
            for value in node.inputs:
                if value is not None and self.last_reader.get(id(value)) == index:
                    env.pop(id(value), None)


LOOKUP_ROWS = 8192  # table rows read at once when gathering a lookup's rows


def lookup_rows(table: Param, ids: np.ndarray) -> tuple:
    """(the distinct ids, sorted; their rows of ``table``), read ``LOOKUP_ROWS`` rows at a
    time: a 128k-row table is never held whole (2 GB in float32 for Llama-3-8B's)."""
    used = np.unique(ids)
    rows = np.empty((len(used), *table.shape[1:]), table.dtype.numpy)
    for start in range(0, table.shape[0], LOOKUP_ROWS):
        inside = (used >= start) & (used < start + LOOKUP_ROWS)
        if inside.any():
            rows[inside] = read_rows(table, start, min(start + LOOKUP_ROWS, table.shape[0]))[used[inside] - start]
    return used, rows


def _plan(node: Node) -> list:
    """[(operand index, activation)] for the weights a node reads, in the order they are
    quantized: "x" (the node's input) or "hidden" (a dense MLP's, after its first weights)."""
    if node.op == "linear":
        return [(1, "x")]
    if node.op in ("swiglu", "geglu"):
        return [(1, "x"), (2, "x"), (3, "hidden")]
    if node.op == "gelu_mlp":
        return [(1, "x"), (2, "hidden")]
    return []


def _mlp_hidden(node: Node, args: list) -> np.ndarray:
    """The hidden activation a dense MLP's down projection reads (float32), from the node's
    arguments in one window (its first weights already quantized)."""
    if node.op == "gelu_mlp":
        return gelu(linear(args[0], args[1], args[3] if len(args) > 3 else None), node.attrs["approximate"])
    x = f32(args[0])
    pre = x @ f32(args[1]).T
    act = silu(pre) if node.op == "swiglu" else gelu(pre, node.attrs["approximate"])
    return act * (x @ f32(args[2]).T)


def _schedule(graph: Graph, wanted: set) -> list:
    """[(node index, activation, names)]: the wanted weights in groups that share one Hessian,
    each at the first node that reads it. "x" groups gather every wanted weight whose first
    observed read takes that activation as its input (q/k/v, gate/up, wherever they sit);
    "hidden" groups hold one dense MLP's down projection."""
    groups, by_input, seen = [], {}, set()
    for index, node in enumerate(graph.nodes):
        for operand, source in _plan(node):
            param = node.inputs[operand]
            if not (isinstance(param, Param) and param.name in wanted) or param.name in seen:
                continue
            seen.add(param.name)
            if source == "hidden":
                groups.append((index, source, [param.name]))
            elif id(node.inputs[0]) in by_input:
                by_input[id(node.inputs[0])][2].append(param.name)
            else:
                by_input[id(node.inputs[0])] = (index, source, [param.name])
                groups.append(by_input[id(node.inputs[0])])
    return groups


def sequential_hessians(graph: Graph, tokens: Sequence[int], wanted: set, quantize: Callable, window: int = 512,
                        seed: int = 0) -> dict:
    """{name: result} for each weight in ``wanted`` that an observer sees, in graph order,
    from ``quantize(names, hessian) -> {name: result}`` called once per group of weights
    that share a Hessian, computed from the activations through the quantized weights before
    them (module docstring). A result has ``dequantized()`` (the float weight the nodes then
    read); ``quantize`` may overwrite the Hessian it is given."""
    graph = graph.clone()
    groups = _schedule(graph, wanted)
    if not groups:
        return {}
    run = _Layerwise(graph, windows(tokens, window), seed)
    last_read = {v.name: i for i, n in enumerate(graph.nodes) for v in n.inputs if isinstance(v, Param)}
    done, quantized = {}, {}
    stop = max(index for index, _, names in groups)
    pending = iter(groups)
    group = next(pending, None)
    for index, node in enumerate(graph.nodes[:stop + 1]):
        while group is not None and group[0] == index:
            _, source, names = group
            if source == "x":
                h = hessian(run.values(node.inputs[0]))
            else:
                h = hessian(_mlp_hidden(node, args) for args in run.arguments(node, quantized))
            results = quantize(names, h)
            del h
            for name in names:  # dequantized when a node reads it (a tied head's table: never)
                done[name] = quantized[name] = results[name]
            group = next(pending, None)
        if index < stop:
            run.run(index, node, quantized)
        for name in [n for n in quantized if last_read[n] <= index]:
            del quantized[name]
    return done


__all__ = ["importance", "unobserved", "OBSERVERS", "sequential_hessians", "hessian"]
