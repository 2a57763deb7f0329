"""Fusion rules: a pattern that reads like the unfused math, a check that returns a reason
when it refuses, and a rewrite.

A pattern is built from three pieces and matched against a value, walking producers:

- ``Capture("x")`` matches any value (a param too) and binds it; a second ``Capture("x")``
  in the same pattern must see the very same value, so ``x * cos + rotate(x) * sin`` says
  that both products read one ``x``.
- ``Op("mul", a, b, name="scaled")`` matches a value produced by a ``mul`` whose operands
  match ``a`` and ``b``; ``name`` binds the node. Ops the registry marks commutative
  (``add``, ``mul``, ...) match either operand order.
- ``AnyOf(p, q)`` matches what ``p`` or ``q`` matches.

``match(pattern, value)`` yields every consistent binding (a dict of names to values and
nodes), trying commutative orders and alternatives by backtracking, so a rule can take the
first binding its own checks accept. Attributes are not part of patterns: a rule's
``check`` reads them and says what it did not like (``slice x[..., 3:7]`` is not half of an
odd dim 7), which is where a refusal's reason comes from.

``Rule`` is the shape every fusion takes; ``evaluate`` runs a small subgraph on NumPy with
the op references, for checks that hold a candidate against numbers (a rotary table against
the frequencies of a base). Nothing here imports a pass or a backend.
"""
from __future__ import annotations

import logging
from typing import Iterator, Mapping, Optional

import numpy as np

from irc import dims, ops
from irc.graph import Graph, Node, Param, Value


class Pattern:
    """Base of the pattern pieces; see the module docstring."""

    def match(self, value: Optional[Value], bound: dict) -> Iterator[dict]:
        raise NotImplementedError


class Capture(Pattern):
    def __init__(self, name: str):
        self.name = name

    def match(self, value, bound):
        if value is None:
            return
        if self.name in bound:
            if bound[self.name] is value:
                yield bound
            return
        yield {**bound, self.name: value}

    def __repr__(self) -> str:
        return self.name


class Op(Pattern):
    def __init__(self, op: str, *operands: Pattern, name: Optional[str] = None):
        self.op, self.operands, self.name = op, operands, name

    def match(self, value, bound):
        node = None if value is None or isinstance(value, Param) else value.producer
        if node is None or node.op != self.op or len(node.inputs) != len(self.operands):
            return
        if self.name is not None:
            if self.name in bound and bound[self.name] is not node:
                return
            bound = {**bound, self.name: node}
        orders = [list(node.inputs)]
        if len(node.inputs) == 2 and ops.get_op(self.op).commutative and node.inputs[0] is not node.inputs[1]:
            orders.append(list(reversed(node.inputs)))
        for inputs in orders:
            yield from _match_all(self.operands, inputs, bound)

    def __repr__(self) -> str:
        return f"{self.op}({', '.join(map(repr, self.operands))})"


class AnyOf(Pattern):
    def __init__(self, *alternatives: Pattern):
        self.alternatives = alternatives

    def match(self, value, bound):
        for alternative in self.alternatives:
            yield from alternative.match(value, bound)

    def __repr__(self) -> str:
        return " | ".join(map(repr, self.alternatives))


def _match_all(patterns, values, bound) -> Iterator[dict]:
    if not patterns:
        yield bound
        return
    for partial in patterns[0].match(values[0], bound):
        yield from _match_all(patterns[1:], values[1:], partial)


def match(pattern: Pattern, value: Value) -> Iterator[dict]:
    """Every binding under which ``pattern`` matches ``value`` (first-found order)."""
    yield from pattern.match(value, {})


class Rule:
    """One fusion: ``pattern`` (rooted at the value a node produces), ``check`` (None to
    accept, else the reason it refuses) and ``rewrite``. ``find`` returns, per node whose
    output matches, the first binding ``check`` accepts, or the first refusal's reason."""

    name = ""
    pattern: Pattern

    def check(self, graph: Graph, bound: dict) -> Optional[str]:
        return None

    def rewrite(self, graph: Graph, bound: dict):
        raise NotImplementedError

    def find(self, graph: Graph, node: Node) -> tuple[Optional[dict], Optional[str]]:
        """(accepted binding, None), (None, reason) when every binding was refused, or
        (None, None) when the pattern is absent at ``node``."""
        reason = None
        for bound in match(self.pattern, node.outputs[0]):
            refused = self.check(graph, bound)
            if refused is None:
                return bound, None
            reason = reason or refused
        return None, reason


class Notes:
    """Messages a pass keeps for the user (why a rule refused), logged at debug level too."""

    def __init__(self, logger: logging.Logger):
        self.logger, self.messages = logger, []

    def add(self, message: str) -> None:
        self.messages.append(message)
        self.logger.debug("%s", message)


# ---- evaluating small subgraphs --------------------------------------------------------

class EvaluationError(Exception):
    """A subgraph could not be evaluated (an unbound symbol, a param without data, ...)."""


def evaluate(value: Value, feeds: Mapping[str, np.ndarray], bindings: Mapping[str, int],
             allowed_ops: Optional[set] = None, limit: int = 200) -> np.ndarray:
    """``value`` computed with the op references from ``feeds`` (value name -> array).

    Values named in ``feeds`` are not looked behind; params load their data (present or
    lazy); ``constant`` nodes evaluate; every other node must be in ``allowed_ops`` (when
    given). Symbols in shape attributes bind through ``bindings``. At most ``limit`` nodes
    are run. Raises ``EvaluationError`` saying what stopped it.
    """
    results: dict[str, np.ndarray] = dict(feeds)
    budget = [limit]

    def compute(v: Value) -> np.ndarray:
        if v.name in results:
            return results[v.name]
        if isinstance(v, Param):
            data = v.array()
            if data is None:
                raise EvaluationError(f"param @{v.name} has no data")
            results[v.name] = np.asarray(data)
            return results[v.name]
        node = v.producer
        if node is None:
            raise EvaluationError(f"%{v.name} is a graph input")
        if node.op != "constant" and allowed_ops is not None and node.op not in allowed_ops:
            raise EvaluationError(f"%{v.name} comes from {node.op}")
        budget[0] -= 1
        if budget[0] < 0:
            raise EvaluationError(f"more than {limit} nodes behind %{value.name}")
        args = [None if i is None else compute(i) for i in node.inputs]
        opdef = ops.get_op(node.op)
        attrs = dict(node.attrs)
        try:
            for key in opdef.shape_attrs:
                attrs[key] = [dims.evaluate(d, bindings) for d in attrs[key]]
            outs = opdef.reference(args, attrs)
        except (KeyError, ValueError) as err:
            raise EvaluationError(f"cannot run {node.op} -> %{node.name}: {err}") from None
        for out, array in zip(node.outputs, outs):
            results[out.name] = np.asarray(array)
        return results[v.name]

    return compute(value)
