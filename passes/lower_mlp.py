"""``lower-mlp``: gated and plain MLP ops to ``linear`` layers and activations."""
from __future__ import annotations

from irc.build import emit1
from irc.graph import Graph, Node, Value
from irc.passmanager import Pass, register_pass
from irc.rewrite.edit import replace_node


@register_pass
class LowerMlp(Pass):
    """Rewrite ``swiglu``, ``geglu`` and ``gelu_mlp`` as ``linear`` layers and activations.

    swiglu:   linear(silu(linear(x, w_gate)) * linear(x, w_up), w_down)
    geglu:    the same with ``gelu {approximate}`` in place of silu
    gelu_mlp: linear(gelu(linear(x, w_up, b_up)), w_down, b_down)

    Run ``lower-linear`` afterwards to reach ``matmul``. Intermediate values are named
    ``<output>.gate``, ``.up``, ``.act``, ``.hidden``. Guarantees: the reference result up
    to float32 rounding; the output keeps its name.
    """

    name = "lower-mlp"

    def run(self, graph: Graph) -> bool:
        changed = False
        for node in list(graph.nodes):
            if node.op in ("swiglu", "geglu", "gelu_mlp"):
                replace_node(graph, node, [lower(graph, node)])
                changed = True
        return changed


def lower(graph: Graph, node: Node) -> Value:
    out = node.outputs[0].name

    def emit(op, inputs, role, attrs=None):
        return emit1(graph, op, inputs, attrs, f"{out}.{role}", before=node)

    if node.op == "gelu_mlp":
        x, w_up, w_down, b_up, b_down = (list(node.inputs) + [None] * 5)[:5]
        up = emit("linear", [x, w_up] + ([b_up] if b_up is not None else []), "up")
        act = emit("gelu", [up], "act", {"approximate": node.attrs["approximate"]})
        return emit("linear", [act, w_down] + ([b_down] if b_down is not None else []), "down")
    x, w_gate, w_up, w_down = node.inputs
    gate = emit("linear", [x, w_gate], "gate")
    if node.op == "swiglu":
        act = emit("silu", [gate], "act")
    else:
        act = emit("gelu", [gate], "act", {"approximate": node.attrs["approximate"]})
    hidden = emit("mul", [act, emit("linear", [x, w_up], "up")], "hidden")
    return emit("linear", [hidden, w_down], "down")
