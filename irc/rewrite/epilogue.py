"""Which consumers a producer can absorb: the one matcher every planner calls.

A GEMM kernel (Triton's matmul, an NPU tile loop) can finish its output tile with a short
chain of elementwise ops before storing it, and a norm can take the residual sum feeding
it. Three questions, answered once here, so the Triton kernels, the NPU plan and the ONNX
Runtime flavour cannot decide them differently by accident:

- ``epilogue_chain(graph, value, operands)``: the single-use elementwise consumers of
  ``value`` a producer's epilogue computes, in order. A consumer joins while the running
  value is read by it alone and is not a graph output, its op is one of ``UNARY``/``BINARY``
  (a ``cast`` only to a float type), it keeps the running value's shape, and a binary op's
  other operand is of a kind the caller's epilogue can read: ``"vector"`` (one value per
  output column: shape [..1, N], a bias or a norm weight) or ``"tile"`` (the running
  value's own shape, a residual read tile by tile). Targets differ only in that argument.
- ``glu_match(graph, mul, producers)``: ``mul(act(P(x, Wg)), P(x, Wu))`` for P one of
  ``producers``, both projections of the same input, every intermediate read only there:
  the gated MLP a dual GEMM computes in one K loop with the GLU in its epilogue.
- ``residual_norm(norm)``: the ``add`` of two same-shaped, same-typed operands that feeds
  a norm: the residual sum a fused "add + norm" kernel computes with the norm.

Shapes are compared symbolically (canonical dims), so a decision holds for every binding.
Nothing here imports a pass or a backend.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from irc.graph import Graph, Node, Value
from irc.ops.registry import same_dims
from irc.rewrite.edit import is_graph_output

UNARY = ("exp", "tanh", "sqrt", "rsqrt", "sigmoid", "silu", "cos", "sin", "neg", "gelu", "softcap", "cast")
BINARY = ("add", "sub", "mul", "div", "maximum")
FLOAT_CASTS = ("f32", "f16", "bf16")
OPERAND_KINDS = ("tile", "vector")      # in order of preference when an operand is both
GLU_ACTIVATIONS = ("silu", "gelu")


@dataclass(frozen=True)
class EpilogueStep:
    """One consumer in an epilogue chain. ``operand``: None for a unary op, else the kind
    (``"tile"`` or ``"vector"``) of ``other``, the binary op's other operand; ``swap``: the
    other operand comes first (``other - y``)."""
    node: Node
    operand: Optional[str] = None
    other: Optional[Value] = None
    swap: bool = False


def single_use(graph: Graph, value: Value) -> bool:
    """``value`` is read by exactly one input slot of one node and is not a graph output."""
    return len(value.uses) == 1 and not is_graph_output(graph, value)


def operand_kinds(other: Value, shape: tuple) -> list[str]:
    """The kinds (``OPERAND_KINDS`` order) ``other`` has as an operand next to a running
    value of ``shape``: its own shape (``tile``), one value per column (``vector``)."""
    kinds = []
    if _same_shape(other.shape, shape):
        kinds.append("tile")
    if other.shape and shape and same_dims(other.shape[-1], shape[-1]) and all(same_dims(d, 1)
                                                                                for d in other.shape[:-1]):
        kinds.append("vector")
    return kinds


def epilogue_step(user: Node, value: Value, operands: Sequence[str]) -> Optional[EpilogueStep]:
    """``user`` as the next step of an epilogue whose running value is ``value``, or None
    when an epilogue reading only ``operands`` kinds cannot compute it."""
    if user.op not in UNARY and user.op not in BINARY:
        return None
    if len(user.outputs) != 1 or not _same_shape(user.outputs[0].shape, value.shape):
        return None
    if user.op == "cast" and user.attrs.get("to") not in FLOAT_CASTS:
        return None
    if user.op in UNARY:
        return EpilogueStep(user)
    index = 1 if user.inputs[0] is value else 0
    other = user.inputs[index]
    if other is value or other is None:
        return None
    kind = next((k for k in operand_kinds(other, value.shape) if k in operands), None)
    if kind is None:
        return None
    return EpilogueStep(user, kind, other, swap=index == 0)


def epilogue_chain(graph: Graph, value: Value, operands: Sequence[str] = ("vector",),
                   free: Optional[Callable[[Node], bool]] = None) -> list[EpilogueStep]:
    """The consumers of ``value`` (a producer's output) its epilogue computes, in order; see
    the module docstring. ``free(node)`` False stops the chain at a node planned elsewhere."""
    unknown = set(operands) - set(OPERAND_KINDS)
    if unknown:
        raise ValueError(f"unknown epilogue operand kinds {sorted(unknown)}; known: {OPERAND_KINDS}")
    steps: list[EpilogueStep] = []
    while single_use(graph, value):
        user = value.uses[0]
        if free is not None and not free(user):
            break
        step = epilogue_step(user, value, operands)
        if step is None:
            break
        steps.append(step)
        value = user.outputs[0]
    return steps


def glu_match(graph: Graph, mul: Node, producers: Sequence[str],
              free: Optional[Callable[[Node], bool]] = None) -> Optional[tuple[Node, Node, Node]]:
    """(gate, act, up) when ``mul`` is act(P(x, Wg, ...)) * P(x, Wu, ...) with P one op of
    ``producers`` (the same for both), act silu or gelu, both projections reading the same
    ``x`` (and for ``grouped_gemm`` the same segments; for ``dequant_linear`` the same
    quantization), all three results of ``mul``'s shape and read only there; else None.
    ``free(node)`` False for gate, act or up refuses the match."""
    if mul.op != "mul":
        return None
    for act_value, up_value in (mul.inputs, mul.inputs[::-1]):
        act, up = act_value.producer, up_value.producer
        if act is None or up is None or act.op not in GLU_ACTIVATIONS or up.op not in producers:
            continue
        gate = act.inputs[0].producer
        if gate is None or gate.op != up.op or gate is up or gate.inputs[0] is not up.inputs[0]:
            continue
        if gate.op == "grouped_gemm" and gate.inputs[2] is not up.inputs[2]:
            continue
        if gate.op == "dequant_linear" and gate.attrs != up.attrs:
            continue
        same_shape = gate.outputs[0].shape == up.outputs[0].shape == mul.outputs[0].shape
        single = all(single_use(graph, v) for v in (gate.outputs[0], act.outputs[0], up.outputs[0]))
        available = free is None or all(free(n) for n in (gate, act, up))
        if same_shape and single and available:
            return gate, act, up
    return None


def residual_norm(norm: Node) -> Optional[Node]:
    """The ``add`` producing ``norm``'s input when it sums two operands of its own shape and
    one dtype (a residual stream plus a block's output); else None. The sum may be read
    elsewhere too: a fused kernel writes it beside the norm."""
    add = norm.inputs[0].producer
    if add is None or add.op != "add":
        return None
    left, right = add.inputs
    if left.shape == right.shape == add.outputs[0].shape and left.dtype == right.dtype:
        return add
    return None


def _same_shape(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(same_dims(x, y) for x, y in zip(a, b))
