"""Creating nodes with inferred types: the one way builders and passes add ops."""
from __future__ import annotations

from typing import Optional, Sequence

from irc import ops
from irc.errors import ShapeError
from irc.graph import Graph, Node, Value


def emit(graph: Graph, op: str, inputs: Sequence[Optional[Value]], attrs: Optional[dict] = None,
         names: Sequence[str] | str | None = None, *, before: Optional[Node] = None,
         origin: Optional[str] = None) -> list[Value]:
    """Add ``op`` over ``inputs`` to ``graph`` and return its outputs.

    Attributes are normalised (defaults filled, unknown ones refused) and the output types
    come from the op's inference rule. ``names`` are hints: each becomes unique in the graph.
    A ShapeError from inference is re-raised naming the op and the first hint.
    """
    opdef = ops.get_op(op)
    attrs = opdef.normalize_attrs(attrs)
    try:
        types = ops.infer(op, list(inputs), attrs)
    except ShapeError as err:
        where = origin or (names if isinstance(names, str) else (names[0] if names else op))
        raise ShapeError(err.message, location=str(where), hint=err.hint) from None
    if isinstance(names, str):
        names = [names]
    hints = list(names or [])
    hints += [f"{op}{'_' + str(i) if i else ''}" for i in range(len(hints), len(types))]
    outputs = [graph.new_value(h, t.dtype, t.shape) for h, t in zip(hints, types)]
    node = Node(op, list(inputs), outputs, attrs, origin)
    graph.add_node(node, before=before)
    return outputs


def emit1(graph: Graph, op: str, inputs, attrs=None, name=None, **kw) -> Value:
    """``emit`` for single-output ops."""
    outs = emit(graph, op, inputs, attrs, name, **kw)
    if len(outs) != 1:
        raise ValueError(f"{op} has {len(outs)} outputs; use emit()")
    return outs[0]
