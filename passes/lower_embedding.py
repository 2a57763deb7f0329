"""``lower-embedding``: ``embedding`` to ``gather`` (and a scale)."""
from __future__ import annotations

from irc.dtypes import DType
from irc.graph import Node, Value
from irc.passmanager import register_pass
from irc.rewrite.lowering import Emitter, LoweringPass


def lower_embedding(e: Emitter, node: Node) -> Value:
    ids, table = node.inputs
    scale = node.attrs["scale"]
    if not table.dtype.is_float:
        table = e.cast(table, DType.f32, name=f"{table.name}.f32")
    rows = e("gather", [table, ids], None if scale is None else "rows", {"axis": 0})
    if scale is None:
        return rows
    return e("mul", [rows, e.constant(float(scale), e.out.dtype, "scale")])


@register_pass
class LowerEmbedding(LoweringPass):
    """Rewrite ``embedding ids, table {scale}`` as ``gather table, ids {axis=0}``, times a
    ``constant`` scale when one is set (Gemma's sqrt(d_model)).

    A table that is not float is cast to f32 first (the embedding's result type). Never
    refuses. Guarantees: the reference result up to rounding of the scale product; the
    output keeps its name.
    """

    name = "lower-embedding"
    lowerings = {"embedding": lower_embedding}
