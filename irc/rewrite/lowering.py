"""Rewriting a graph node by node: an ``Emitter`` that adds nodes before the node being
replaced, and ``LoweringPass``, a pass that declares ``{op: lower_fn}``.

``LoweringPass.run`` walks the graph once, in order, over a snapshot of its nodes (what a
lowering emits is not visited again), and calls ``lower_fn(emitter, node)`` for each node
whose op has a lowering. ``lower_fn`` answers with one of:

- the values replacing the node's outputs, in order (a single ``Value`` for one output):
  readers of each output (graph outputs included) read its replacement, the node is
  removed, and each replacement takes over the replaced value's name (``irc.rewrite.edit``'s
  naming rule; a ``Param`` keeps its own name, params having their own namespace);
- a string, the reason it refuses: the node stays as it was, and the reason becomes a note,
  ``<pass>: left <op> %<node>: <reason>``, in the pass's ``notes``, which the pass manager
  prints with ``--print-after-change`` (changed or not) and ``--print-after-all``, and the
  report shows beside the pass; it is logged at debug level too;
- None: the node is none of this pass's business (gqa-broadcast and an MHA attention), and
  nothing is said.

A lowering decides before it emits: refusing or passing by after nodes were emitted is a
bug in the pass and raises ``RuntimeError`` (the emitted nodes would dangle). ``run`` returns True exactly
when some node was replaced, so the ``changed`` flag is honest by construction.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence, Union

from irc import ops
from irc.build import emit, emit1
from irc.dtypes import DType
from irc.graph import Graph, Node, Value
from irc.ops.registry import by_name
from irc.passmanager import Pass
from irc.rewrite.edit import cast_to, constant, replace_node
from irc.rewrite.patterns import Notes

Lowered = Union[Value, Sequence[Value], str, None]


class Emitter:
    """Adds nodes before ``node`` (the node being lowered) under ``irc.rewrite.edit``'s naming rule.

    Names are hints, made unique in the graph. A ``role`` names a value after the node's
    first output: ``e("rsqrt", [x], "inv_std")`` gives ``%<output>.inv_std``; no role gives
    ``%<output>`` itself, the hint of the value that will replace the output (suffixed while
    the old value lives, renamed when it is replaced); ``name=`` gives any other hint (a
    weight's derived value: ``%<W>.T``).

    ``operands`` holds the node's inputs by operand name (an optional one left off: None),
    ``options`` the pass's options, and ``memo`` a dict shared by the lowerings of one run
    (a weight transposed once for every linear that reads it).
    """

    def __init__(self, graph: Graph, node: Node, options: Optional[dict] = None, memo: Optional[dict] = None):
        self.graph, self.node, self.out = graph, node, node.outputs[0]
        self.options = {} if options is None else options
        self.memo = {} if memo is None else memo

    @property
    def operands(self) -> dict:
        return by_name(ops.get_op(self.node.op).operands, self.node.inputs)

    def name(self, role: Optional[str] = None) -> str:
        """``<output>.<role>``, or ``<output>`` without a role."""
        return self.out.name if role is None else f"{self.out.name}.{role}"

    def __call__(self, op: str, inputs, role: Optional[str] = None, attrs: Optional[dict] = None, *,
                 name: Optional[str] = None) -> Value:
        """The result of a single-output ``op`` over ``inputs``."""
        return emit1(self.graph, op, inputs, attrs, name or self.name(role), before=self.node)

    def emit(self, op: str, inputs, names: Sequence[str], attrs: Optional[dict] = None) -> list[Value]:
        """The results of a multi-output ``op``, one hint per output."""
        return emit(self.graph, op, inputs, attrs, list(names), before=self.node)

    def constant(self, value, dtype: DType, role: Optional[str] = None, *, name: Optional[str] = None) -> Value:
        """A ``constant`` node holding ``value`` (a Python scalar or nested list)."""
        return constant(self.graph, value, dtype, name or self.name(role), before=self.node)

    def cast(self, value: Value, dtype: DType, role: Optional[str] = None, *, name: Optional[str] = None) -> Value:
        """``value`` in ``dtype``: ``value`` itself when it has that dtype already."""
        return cast_to(self.graph, value, dtype, name or self.name(role), before=self.node)


LowerFn = Callable[[Emitter, Node], Lowered]


class LoweringPass(Pass):
    """A pass that replaces nodes one at a time; see the module docstring.

    Subclasses set ``lowerings = {op: lower_fn}`` (or override ``lowering`` to choose per
    node) and keep their own docstring for what they guarantee. ``keep_origin`` gives every
    node emitted for a node that node's ``origin`` (the spec line it came from).
    """

    lowerings: dict = {}
    keep_origin: bool = False

    def lowering(self, node: Node) -> Optional[LowerFn]:
        """The function lowering ``node``, or None to pass it by."""
        return self.lowerings.get(node.op)

    def note(self, node: Node, reason: str) -> str:
        """The note a refusal of ``node`` leaves for the user."""
        return f"{self.name}: left {node.op} %{node.name}: {reason}"

    def run(self, graph: Graph) -> bool:
        notes = Notes(logging.getLogger(type(self).__module__))
        changed = self.lower_nodes(graph, notes)
        self.notes = notes.messages
        return changed

    def lower_nodes(self, graph: Graph, notes: Notes) -> bool:
        """The walk: lower every node that has a lowering; True when one was replaced.

        Public so a pass with work besides lowering nodes (quantize rewrites params too)
        can run it inside its own ``run``, sharing one ``Notes``.
        """
        memo: dict = {}
        changed = False
        for node in list(graph.nodes):
            lower = self.lowering(node)
            if lower is None:
                continue
            count, start = len(graph.nodes), graph.nodes.index(node) if self.keep_origin else 0
            result = lower(Emitter(graph, node, self.config, memo), node)
            if result is None or isinstance(result, str):
                if len(graph.nodes) != count:
                    raise RuntimeError(f"{self.name}: the lowering of %{node.name} emitted nodes, then left "
                                       f"the node ({result}); a lowering must decide before it emits")
                if result is not None:
                    notes.add(self.note(node, result))
                continue
            if self.keep_origin:
                for new in graph.nodes[start:graph.nodes.index(node)]:
                    new.origin = node.origin
            _replace(graph, node, [result] if isinstance(result, Value) else list(result))
            changed = True
        return changed


def _replace(graph: Graph, node: Node, values: list) -> None:
    if len(values) != len(node.outputs):
        raise RuntimeError(f"a lowering of %{node.name} returned {len(values)} values for "
                           f"{len(node.outputs)} outputs")
    replace_node(graph, node, values)
