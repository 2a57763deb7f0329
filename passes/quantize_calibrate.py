"""Calibration statistics for ``quantize{method=imatrix}``: the mean squared activation of
every input channel of every weight the pass will quantize, from the reference interpreter
run over a calibration text.

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
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from irc import ops
from irc.evaluate import StreamingInterpreter, prefill_logits, windows
from irc.graph import Graph, Node, Param
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


__all__ = ["importance", "unobserved", "OBSERVERS"]
