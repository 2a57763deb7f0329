"""``lower-softcap``: ``softcap`` to ``div``, ``tanh`` and ``mul``."""
from __future__ import annotations

from typing import Union

from irc.graph import Node, Value
from irc.passmanager import register_pass
from irc.rewrite.lowering import Emitter, LoweringPass


def lower_softcap(e: Emitter, node: Node) -> Union[Value, str]:
    x = node.inputs[0]
    if not x.dtype.is_float:
        return f"{x.dtype} is not a float type"
    cap = e.constant(float(node.attrs["cap"]), x.dtype, "cap")
    capped = e("tanh", [e("div", [x, cap], "scaled")], "tanh")
    return e("mul", [capped, cap])


@register_pass
class LowerSoftcap(LoweringPass):
    """Rewrite ``softcap x {cap}`` (Gemma 2 logit soft-capping) as
    ``mul(tanh(div(x, cap)), cap)`` with one ``constant`` cap in the activation's dtype.

    Refuses, with a note saying why, a non-float activation, which ``tanh`` does not take.
    Guarantees: the reference result up to rounding; the output keeps its name.
    """

    name = "lower-softcap"
    lowerings = {"softcap": lower_softcap}
