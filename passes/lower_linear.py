"""``lower-linear``: ``linear`` to ``matmul`` against the transposed weight."""
from __future__ import annotations

from typing import Union

from irc.graph import Node, Value
from irc.passmanager import register_pass
from irc.rewrite.lowering import Emitter, LoweringPass


def lower_linear(e: Emitter, node: Node) -> Union[Value, str]:
    """The matmul (and bias add) replacing ``node``'s output, or why it stays."""
    x, weight, bias = e.operands.values()
    if x.rank < 2:
        return "matmul needs an activation of rank >= 2"
    if weight.dtype != x.dtype and not weight.dtype.is_float:
        return f"weight dtype {weight.dtype} is not a float type"
    key = ("transposed", weight, x.dtype)
    if key not in e.memo:
        w = e.cast(weight, x.dtype, name=f"{weight.name}.{x.dtype}")
        e.memo[key] = e("transpose", [w], attrs={"perm": [1, 0]}, name=f"{weight.name}.T")
    product = e("matmul", [x, e.memo[key]], None if bias is None else "matmul")
    if bias is None:
        return product
    return e("add", [product, e.cast(bias, x.dtype, name=f"{bias.name}.{x.dtype}")])


@register_pass
class LowerLinear(LoweringPass):
    """Rewrite ``linear x, W, b`` (W [out, in]) as ``matmul x, transpose(W)`` plus ``add b``.

    Each weight is transposed once however many linears read it (``%<W>.T``); after
    ``fold`` the transpose of a weight param is itself a (lazy, derived) param
    ``@<W>.T`` and no transpose runs. A float weight or bias of another dtype than the
    activation is cast to it first. Refuses, with a note saying why, an activation of
    rank 1 or an integer weight (quantized weights are lowered by their own pass).
    Guarantees: the reference result up to float32 rounding; the output keeps its name.
    """

    name = "lower-linear"
    lowerings = {"linear": lower_linear}
