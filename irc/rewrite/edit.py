"""Rewriting helpers shared by passes: constants, renames, and replacing a node's results.

The naming rule every pass keeps: when a rewrite replaces a value, the replacement takes
over the replaced value's name, so ``%logits`` or ``%present.0.key`` survive any pipeline
and a dump reads like the one before it (``%q = linear ...`` becomes ``%q = matmul ...``).
Intermediate values of a rewrite are named ``<replaced>.<role>`` (``%h.inv_rms``).
"""
from __future__ import annotations

from typing import Optional, Sequence

from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph, Node, Param, Value


def rename(graph: Graph, value: Value, name: str) -> None:
    """Give ``value`` exactly ``name``, which must be free in ``graph``."""
    graph.rename(value, name)


def constant(graph: Graph, value, dtype: DType, name: str, before: Optional[Node] = None) -> Value:
    """A ``constant`` node holding ``value`` (a Python scalar or nested list)."""
    return emit1(graph, "constant", [], {"value": value, "dtype": str(dtype)}, name, before=before)


def cast_to(graph: Graph, value: Value, dtype: DType, name: str, before: Optional[Node] = None) -> Value:
    """``value`` converted to ``dtype``; ``value`` itself when it already has that dtype."""
    if value.dtype == dtype:
        return value
    return emit1(graph, "cast", [value], {"to": str(dtype)}, name, before=before)


def replace_node(graph: Graph, node: Node, replacements: Sequence[Value]) -> None:
    """Replace ``node`` by values a rewrite just emitted before it.

    Every reader of ``node.outputs[i]`` (graph outputs included) reads ``replacements[i]``,
    ``node`` is deleted, and each replacement takes over the replaced value's name (a
    ``Param`` keeps its own: params have their own namespace).
    """
    names = [v.name for v in node.outputs]
    for old, new in zip(node.outputs, replacements):
        graph.replace_all_uses(old, new)
    graph.remove(node)
    for new, name in zip(replacements, names):
        if not isinstance(new, Param):
            rename(graph, new, name)


def is_graph_output(graph: Graph, value: Value) -> bool:
    return any(v is value for v in graph.outputs)
