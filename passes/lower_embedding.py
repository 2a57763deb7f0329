"""``lower-embedding``: ``embedding`` to ``gather`` (and a scale)."""
from __future__ import annotations

from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph, Node, Value
from irc.passmanager import Pass, register_pass
from irc.rewrite.edit import cast_to, constant, replace_node


@register_pass
class LowerEmbedding(Pass):
    """Rewrite ``embedding ids, table {scale}`` as ``gather table, ids {axis=0}``, times a
    ``constant`` scale when one is set (Gemma's sqrt(d_model)).

    A table that is not float is cast to f32 first (the embedding's result type).
    Guarantees: the reference result up to rounding of the scale product; the output keeps
    its name.
    """

    name = "lower-embedding"

    def run(self, graph: Graph) -> bool:
        changed = False
        for node in list(graph.nodes):
            if node.op == "embedding":
                replace_node(graph, node, [lower(graph, node)])
                changed = True
        return changed


def lower(graph: Graph, node: Node) -> Value:
    ids, table = node.inputs
    out = node.outputs[0]
    scale = node.attrs["scale"]
    if not table.dtype.is_float:
        table = cast_to(graph, table, DType.f32, f"{table.name}.f32", before=node)
    rows = emit1(graph, "gather", [table, ids], {"axis": 0}, out.name if scale is None else f"{out.name}.rows",
                 before=node)
    if scale is None:
        return rows
    factor = constant(graph, float(scale), out.dtype, f"{out.name}.scale", before=node)
    return emit1(graph, "mul", [rows, factor], None, out.name, before=node)
