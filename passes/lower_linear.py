"""``lower-linear``: ``linear`` to ``matmul`` against the transposed weight."""
from __future__ import annotations

import logging

from irc.build import emit1
from irc.graph import Graph, Node, Value
from irc.passmanager import Pass, register_pass
from irc.rewrite.edit import cast_to, replace_node

log = logging.getLogger(__name__)


@register_pass
class LowerLinear(Pass):
    """Rewrite ``linear x, W, b`` (W [out, in]) as ``matmul x, transpose(W)`` plus ``add b``.

    Each weight is transposed once however many linears read it (``%<W>.T``); after
    ``fold`` the transpose of a weight param is itself a (lazy, derived) param
    ``@<W>.T`` and no transpose runs. A float weight or bias of another dtype than the
    activation is cast to it first. Refuses (leaves the linear, logs why) for an activation
    of rank 1 or an integer weight (quantized weights are lowered by their own pass).
    Guarantees: the reference result up to float32 rounding; the output keeps its name.
    """

    name = "lower-linear"

    def run(self, graph: Graph) -> bool:
        transposed: dict[tuple, Value] = {}
        changed = False
        for node in list(graph.nodes):
            if node.op != "linear":
                continue
            reason = refusal(node)
            if reason:
                log.debug("lower-linear: leaving %%%s: %s", node.name, reason)
                continue
            replace_node(graph, node, [lower(graph, node, transposed)])
            changed = True
        return changed


def refusal(node: Node):
    x, weight = node.inputs[0], node.inputs[1]
    if x.rank < 2:
        return "matmul needs an activation of rank >= 2"
    if weight.dtype != x.dtype and not weight.dtype.is_float:
        return f"weight dtype {weight.dtype} is not a float type"
    return None


def lower(graph: Graph, node: Node, transposed: dict) -> Value:
    """Emit the matmul (and bias add) before ``node``; returns the value replacing its output."""
    x, weight, bias = (list(node.inputs) + [None])[:3]
    out = node.outputs[0].name
    key = (weight, x.dtype)
    if key not in transposed:
        w = cast_to(graph, weight, x.dtype, f"{weight.name}.{x.dtype}", before=node)
        transposed[key] = emit1(graph, "transpose", [w], {"perm": [1, 0]}, f"{weight.name}.T", before=node)
    product = emit1(graph, "matmul", [x, transposed[key]], None, out if bias is None else f"{out}.matmul",
                    before=node)
    if bias is None:
        return product
    b = cast_to(graph, bias, x.dtype, f"{bias.name}.{x.dtype}", before=node)
    return emit1(graph, "add", [product, b], None, out, before=node)
