"""The verifier: re-runs inference on every node and checks SSA order, types and uses.

``verify(graph)`` raises ``VerifyError`` naming the first offending node; the pass manager
calls it after every pass.
"""
from __future__ import annotations

from irc import ops
from irc.errors import ShapeError, VerifyError
from irc.graph import Graph, Node, Param


def _where(node: Node) -> str:
    where = f"node %{node.name} ({node.op})"
    return f"{where} from {node.origin}" if node.origin else where


def verify(graph: Graph) -> None:
    defined: set[int] = set()
    names: set[str] = set()

    def define(value, where):
        if value.name in names:
            raise VerifyError(f"duplicate value name %{value.name}", location=where)
        names.add(value.name)
        defined.add(id(value))

    for value in graph.inputs:
        define(value, f"graph {graph.name} inputs")
    for node in graph.nodes:
        where = _where(node)
        try:
            opdef = ops.get_op(node.op)
        except ShapeError as err:
            raise VerifyError(err.message, location=where) from None
        for index, value in enumerate(node.inputs):
            if value is None:
                continue
            if isinstance(value, Param):
                if graph.params.get(value.name) is not value:
                    raise VerifyError(f"operand {index} is param @{value.name}, which the graph does not hold",
                                      location=where)
            elif id(value) not in defined:
                raise VerifyError(f"operand {index} %{value.name} is used before it is defined "
                                  f"(or is not in the graph)", location=where)
            if node not in value.uses:
                raise VerifyError(f"use list of %{value.name} misses this node", location=where)
        try:
            if opdef.normalize_attrs(node.attrs) != node.attrs:
                raise ShapeError("attributes are not normalised (defaults missing)")
            types = ops.infer(node.op, node.inputs, node.attrs)
        except ShapeError as err:
            raise VerifyError(err.message, location=where) from None
        if len(types) != len(node.outputs):
            raise VerifyError(f"{node.op} yields {len(types)} results, node has {len(node.outputs)}",
                              location=where)
        for value, expected in zip(node.outputs, types):
            if (value.dtype, value.shape) != (expected.dtype, expected.shape):
                raise VerifyError(f"result %{value.name} is {value.type_str()} but {node.op} infers "
                                  f"{expected.dtype}{list(expected.shape)}", location=where)
            if value.producer is not node:
                raise VerifyError(f"result %{value.name} does not point back at its producer", location=where)
            define(value, where)
    for value in graph.outputs:
        if id(value) not in defined:
            raise VerifyError(f"graph output %{value.name} is not defined", location=f"graph {graph.name}")
