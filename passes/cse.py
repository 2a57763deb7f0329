"""``cse``: common subexpression elimination."""
from __future__ import annotations

import json
from collections import Counter

from irc import ops
from irc.graph import Graph, Node
from irc.passmanager import Pass, register_pass
from irc.rewrite.edit import is_graph_output, rename


def node_key(node: Node) -> tuple:
    """What makes two nodes compute the same thing: op, operands (by identity) and attrs.

    Operands of a commutative op are taken as a multiset, so ``add %a, %b`` and
    ``add %b, %a`` share a key.
    """
    if ops.get_op(node.op).commutative:
        operands = frozenset(Counter(node.inputs).items())
    else:
        operands = tuple(node.inputs)
    return node.op, operands, json.dumps(node.attrs, sort_keys=True)


@register_pass
class CommonSubexpressionElimination(Pass):
    """Merge nodes that apply the same op with equal attrs to the same operands.

    Nodes are visited in order; a node equal to an earlier one is removed and its readers
    read the earlier node's results (so chains of duplicates collapse in one run). Operands
    of commutative ops (``OpDef.commutative``) match in either order. When a removed result
    was a graph output, the kept result takes over its name (``%logits`` stays); a node is
    kept when both results are graph outputs, since one value cannot carry two names.
    Guarantees: identical outputs, every op kept is one that ran before.
    """

    name = "cse"

    def run(self, graph: Graph) -> bool:
        first: dict[tuple, Node] = {}
        changed = False
        for node in list(graph.nodes):
            key = node_key(node)
            kept = first.get(key)
            if kept is None:
                first[key] = node
                continue
            pairs = list(zip(node.outputs, kept.outputs))
            if any(is_graph_output(graph, old) and is_graph_output(graph, new) for old, new in pairs):
                continue
            takeover = [(new, old.name) for old, new in pairs if is_graph_output(graph, old)]
            for old, new in pairs:
                graph.replace_all_uses(old, new)
            graph.remove(node)
            for new, name in takeover:
                rename(graph, new, name)
            changed = True
        return changed
