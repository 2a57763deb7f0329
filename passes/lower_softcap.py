"""``lower-softcap``: ``softcap`` to ``div``, ``tanh`` and ``mul``."""
from __future__ import annotations

import logging

from irc.build import emit1
from irc.graph import Graph, Node, Value
from irc.passmanager import Pass, register_pass
from irc.rewrite.edit import constant, replace_node

log = logging.getLogger(__name__)


@register_pass
class LowerSoftcap(Pass):
    """Rewrite ``softcap x {cap}`` (Gemma 2 logit soft-capping) as
    ``mul(tanh(div(x, cap)), cap)`` with one ``constant`` cap in the activation's dtype.

    Refuses (logs why) a non-float activation, which ``tanh`` does not take. Guarantees: the
    reference result up to rounding; the output keeps its name.
    """

    name = "lower-softcap"

    def run(self, graph: Graph) -> bool:
        changed = False
        for node in list(graph.nodes):
            if node.op != "softcap":
                continue
            if not node.inputs[0].dtype.is_float:
                log.debug("lower-softcap: leaving %%%s: %s is not a float type", node.name, node.inputs[0].dtype)
                continue
            replace_node(graph, node, [lower(graph, node)])
            changed = True
        return changed


def lower(graph: Graph, node: Node) -> Value:
    x, out = node.inputs[0], node.outputs[0].name
    cap = constant(graph, float(node.attrs["cap"]), x.dtype, f"{out}.cap", before=node)
    scaled = emit1(graph, "div", [x, cap], None, f"{out}.scaled", before=node)
    capped = emit1(graph, "tanh", [scaled], None, f"{out}.tanh", before=node)
    return emit1(graph, "mul", [capped, cap], None, out, before=node)
