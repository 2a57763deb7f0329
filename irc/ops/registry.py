"""The op registry: each op defined once, with its operands, attributes, shape/dtype
inference rule, NumPy reference and cost rule side by side.

Adding an op is one ``register(OpDef(...))`` call; the verifier, printer, parser,
reference interpreter and analysis all read the registry.

Operand specs are names: ``"x"`` (required), ``"bias?"`` (optional: may be ``None``, printed
``_``), ``"*inputs"`` (variadic, last only). Attribute specs map a name to its default;
``REQUIRED`` marks attributes without one. Attribute values are plain JSON-able data.

Rules receive:
- ``infer(inputs, attrs) -> list[TensorType]``: inputs are Values (``.dtype``, ``.shape``,
  symbolic dims) or None; raise ``ShapeError`` with a plain message when they do not fit.
- ``reference(inputs, attrs) -> list[np.ndarray]``: NumPy arrays (None for omitted); attrs
  named in ``shape_attrs`` arrive with their symbols bound to ints.
- ``cost(inputs, outputs, attrs) -> Cost``: ``TensorType``s with int shapes (symbols bound).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

from irc import dims
from irc.dtypes import DType, Sized
from irc.errors import ShapeError


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()


class TensorType(NamedTuple("TensorType", [("dtype", DType), ("shape", tuple)]), Sized):
    """An op result's type: ``dtype`` and ``shape`` (canonical dims); ``numel`` and
    ``nbytes`` once the shape is bound to ints."""

    __slots__ = ()

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass
class Cost:
    """Work and traffic of one node at bound sizes.

    ``flops`` counts matmul-like work (2 per multiply-add: projections, attention scores and
    the weighted sum), the accounting used for FLOPs per token. ``other_flops`` counts
    elementwise and reduction work, reported apart so the two never blur.
    """

    flops: int = 0
    other_flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.flops + other.flops, self.other_flops + other.other_flops,
                    self.bytes_read + other.bytes_read, self.bytes_written + other.bytes_written)


@dataclass
class OpDef:
    name: str
    operands: tuple
    attrs: dict
    infer: Callable
    reference: Callable
    cost: Optional[Callable] = None
    doc: str = ""
    level: str = "primitive"  # "model" ops are lowered by passes; "primitive" ops are targets
    # fraction of an operand param's elements that one token touches (MoE experts: top_k/E)
    active_fraction: Optional[Callable[[dict, str], float]] = None
    commutative: bool = False
    # attrs holding dims (symbolic allowed); the interpreter binds them to ints before
    # calling ``reference`` (reshape and expand targets)
    shape_attrs: tuple = ()
    # False for ops whose point is to stay in the graph at run time even over constant
    # operands (dequantize: folding it would undo the quantization)
    foldable: bool = True
    # True for ops that turn weights into another form of the same weights (dequantize):
    # analysis credits their readers' active fraction to the params they read
    weight_view: bool = False
    # logical weight elements an operand param stands for (packed int4 codes stand for
    # N*K weights, their scales for none); None: the param's own element count
    logical_elements: Optional[Callable[[dict, str, tuple], int]] = None
    _slots: list = field(default_factory=list, repr=False)
    _counts: tuple = field(default=(), repr=False, compare=False)  # (fixed operands, required ones)

    def __post_init__(self):
        for i, spec in enumerate(self.operands):
            if spec.startswith("*") and i != len(self.operands) - 1:
                raise ValueError(f"op {self.name}: variadic operand must be last")
        self.doc = (self.doc or (self.reference.__doc__ or "")).strip()
        fixed = [s for s in self.operands if not s.startswith("*")]  # counted once: the verifier asks for every node
        self._counts = (len(fixed), sum(1 for s in fixed if not s.endswith("?")))

    @property
    def variadic(self) -> bool:
        return bool(self.operands) and self.operands[-1].startswith("*")

    def operand_names(self, count: int) -> list[str]:
        """Operand names for a node with ``count`` inputs (variadic ones numbered)."""
        names = [spec.lstrip("*").rstrip("?") for spec in self.operands]
        if self.variadic:
            base = names.pop()
            names += [f"{base}{i}" for i in range(count - len(names))]
        return names

    def check_arity(self, count: int) -> None:
        fixed, required = self._counts
        if self.variadic:
            if count < fixed + 1:
                raise ShapeError(f"{self.name} takes at least {fixed + 1} operands, got {count}")
        elif not required <= count <= fixed:
            want = str(fixed) if required == fixed else f"{required} to {fixed}"
            raise ShapeError(f"{self.name} takes {want} operands, got {count}")

    def check_inputs(self, inputs: list) -> None:
        self.check_arity(len(inputs))
        for spec, value in zip(self.operands, inputs):
            if value is None and not spec.endswith("?"):
                raise ShapeError(f"{self.name}: operand {spec.lstrip('*')!r} is required")

    def normalize_attrs(self, attrs: Optional[dict]) -> dict:
        """Fill defaults, reject unknown or missing attributes; returns a new sorted dict."""
        attrs = dict(attrs or {})
        unknown = sorted(set(attrs) - set(self.attrs))
        if unknown:
            known = ", ".join(sorted(self.attrs)) or "none"
            raise ShapeError(f"{self.name} has no attribute {unknown[0]!r} (attributes: {known})")
        out = {}
        for key in sorted(self.attrs):
            if key in attrs:
                out[key] = attrs[key]
            elif self.attrs[key] is REQUIRED:
                raise ShapeError(f"{self.name} needs attribute {key!r}")
            else:
                out[key] = self.attrs[key]
        return out


OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} registered twice")
    OPS[op.name] = op
    return op


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise ShapeError(f"unknown op {name!r}") from None


def infer(op: str, inputs: list, attrs: dict) -> list[TensorType]:
    """Check arity and attributes, then run the op's inference rule."""
    opdef = get_op(op)
    opdef.check_inputs(inputs)
    types = opdef.infer(inputs, attrs)
    return [TensorType(t[0], tuple(dims.canonical(d) for d in t[1])) for t in types]


# ---- helpers shared by the rule modules ------------------------------------------------

def same_dims(a, b) -> bool:
    return dims.canonical(a) == dims.canonical(b)


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise ShapeError(message)


def axis_index(axis, rank: int, op: str) -> int:
    """``axis`` (negative counts from the end) as an index in [0, rank); a ShapeError
    naming ``op`` when it is not an int in range."""
    expect(isinstance(axis, int) and -rank <= axis < rank, f"{op}: axis {axis!r} out of range for rank {rank}")
    return axis % rank


def pad_inputs(inputs, n: int) -> list:
    """The first ``n`` inputs, optional operands left off the end as None."""
    return (list(inputs) + [None] * n)[:n]


def by_name(operands: tuple, inputs) -> dict:
    """The inputs keyed by operand name (``"bias?"`` -> ``"bias"``); optional operands
    left off the end are None."""
    names = [spec.lstrip("*").rstrip("?") for spec in operands]
    return dict(zip(names, pad_inputs(inputs, len(names))))


def expect_shape(op: str, name: str, value, want: tuple) -> None:
    """``value`` is present and has shape ``want`` (symbolic dims compared canonically)."""
    expect(value is not None, f"{op}: operand {name!r} is required here")
    expect(len(value.shape) == len(want) and all(same_dims(a, b) for a, b in zip(value.shape, want)),
           f"{op}: {name} {dims.format_shape(value.shape)} should be {dims.format_shape(want)}")


def broadcast_shapes(op: str, a: tuple, b: tuple) -> tuple:
    """NumPy broadcasting over symbolic dims: equal dims or one side 1."""
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + tuple(a)
    b = (1,) * (rank - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if same_dims(x, y) or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeError(f"{op}: shapes {dims.format_shape(a)} and {dims.format_shape(b)} do not broadcast")
    return tuple(out)


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
