"""``lower-mlp``: gated and plain MLP ops to ``linear`` layers and activations."""
from __future__ import annotations

from irc.graph import Node, Value
from irc.passmanager import register_pass
from irc.rewrite.lowering import Emitter, LoweringPass


def lower_gated(e: Emitter, node: Node) -> Value:
    """swiglu / geglu: linear(act(linear(x, w_gate)) * linear(x, w_up), w_down)."""
    x, w_gate, w_up, w_down = node.inputs
    gate = e("linear", [x, w_gate], "gate")
    if node.op == "swiglu":
        act = e("silu", [gate], "act")
    else:
        act = e("gelu", [gate], "act", {"approximate": node.attrs["approximate"]})
    hidden = e("mul", [act, e("linear", [x, w_up], "up")], "hidden")
    return e("linear", [hidden, w_down], "down")


def lower_gelu_mlp(e: Emitter, node: Node) -> Value:
    """linear(gelu(linear(x, w_up, b_up)), w_down, b_down); absent biases are left off."""
    x, w_up, w_down, b_up, b_down = e.operands.values()
    up = e("linear", [x, w_up] + ([b_up] if b_up is not None else []), "up")
    act = e("gelu", [up], "act", {"approximate": node.attrs["approximate"]})
    return e("linear", [act, w_down] + ([b_down] if b_down is not None else []), "down")


@register_pass
class LowerMlp(LoweringPass):
    """Rewrite ``swiglu``, ``geglu`` and ``gelu_mlp`` as ``linear`` layers and activations.

    swiglu:   linear(silu(linear(x, w_gate)) * linear(x, w_up), w_down)
    geglu:    the same with ``gelu {approximate}`` in place of silu
    gelu_mlp: linear(gelu(linear(x, w_up, b_up)), w_down, b_down)

    Run ``lower-linear`` afterwards to reach ``matmul``. Intermediate values are named
    ``<output>.gate``, ``.up``, ``.act``, ``.hidden``. Never refuses. Guarantees: the
    reference result up to float32 rounding; the output keeps its name.
    """

    name = "lower-mlp"
    lowerings = {"swiglu": lower_gated, "geglu": lower_gated, "gelu_mlp": lower_gelu_mlp}
