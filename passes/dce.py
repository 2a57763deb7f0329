"""``dce``: dead code elimination."""
from __future__ import annotations

from irc.graph import Graph
from irc.passmanager import Pass, register_pass
from irc.rewrite.edit import is_graph_output


@register_pass
class DeadCodeElimination(Pass):
    """Remove nodes whose results are never read, then params no node reads.

    A node is dead when none of its outputs is read by a node or returned by the graph;
    removing it can make its producers dead, so nodes are visited last to first. Graph
    inputs stay (they are the graph's interface) even when unused. Guarantees: the graph's
    outputs, their names and every live node are untouched.
    """

    name = "dce"

    def run(self, graph: Graph) -> bool:
        removed = 0
        for node in reversed(list(graph.nodes)):
            if any(out.uses or is_graph_output(graph, out) for out in node.outputs):
                continue
            graph.remove(node)
            removed += 1
        dropped = graph.remove_unused_params()
        return bool(removed or dropped)
