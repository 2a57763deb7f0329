"""Primitive ops: the targets that model-level ops lower to.

Semantics follow NumPy (broadcasting, batched matmul); every rule is written once here.
"""
from __future__ import annotations

import math

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.ops.registry import REQUIRED, Cost, OpDef, TensorType, broadcast_shapes, expect, register, same_dims


def _io_bytes(inputs, outputs) -> tuple[int, int]:
    return (sum(t.nbytes for t in inputs if t is not None), sum(t.nbytes for t in outputs))


def elementwise_cost(inputs, outputs, attrs) -> Cost:
    """One operation per output element; every operand read once, results written once."""
    read, written = _io_bytes(inputs, outputs)
    return Cost(other_flops=sum(t.numel for t in outputs), bytes_read=read, bytes_written=written)


def movement_cost(inputs, outputs, attrs) -> Cost:
    """Data movement: no arithmetic, bytes only."""
    read, written = _io_bytes(inputs, outputs)
    return Cost(bytes_read=read, bytes_written=written)


def _axis(axis: int, rank: int, op: str) -> int:
    expect(-rank <= axis < rank, f"{op}: axis {axis} out of range for rank {rank}")
    return axis % rank


# ---- elementwise -----------------------------------------------------------------------
# References are module-level functions (no lambdas, no closures) so the NumPy emitter can
# copy their source into a standalone module.

def elementwise_binary(fn, inputs):
    """fn(a, b) with NumPy broadcasting, in a's dtype."""
    a, b = inputs
    return [np.asarray(fn(a, b)).astype(a.dtype, copy=False)]


def _add_reference(inputs, attrs):
    """a + b, broadcasting."""
    return elementwise_binary(np.add, inputs)


def _sub_reference(inputs, attrs):
    """a - b, broadcasting."""
    return elementwise_binary(np.subtract, inputs)


def _mul_reference(inputs, attrs):
    """a * b, broadcasting."""
    return elementwise_binary(np.multiply, inputs)


def _div_reference(inputs, attrs):
    """a / b, broadcasting."""
    return elementwise_binary(np.divide, inputs)


def _maximum_reference(inputs, attrs):
    """Elementwise maximum."""
    return elementwise_binary(np.maximum, inputs)


def _binary(name: str, reference, commutative: bool = False) -> None:
    def infer(inputs, attrs):
        a, b = inputs
        expect(a.dtype == b.dtype, f"{name}: dtypes differ ({a.dtype} vs {b.dtype})")
        return [TensorType(a.dtype, broadcast_shapes(name, a.shape, b.shape))]

    register(OpDef(name, ("a", "b"), {}, infer, reference, elementwise_cost, commutative=commutative))


_binary("add", _add_reference, commutative=True)
_binary("sub", _sub_reference)
_binary("mul", _mul_reference, commutative=True)
_binary("div", _div_reference)
_binary("maximum", _maximum_reference, commutative=True)


def _same_type(inputs, attrs):
    return [TensorType(inputs[0].dtype, inputs[0].shape)]


def float_unary(fn, inputs):
    """fn(x) computed in float32, returned in x's dtype."""
    x = inputs[0]
    return [fn(x.astype(np.float32)).astype(x.dtype)]


def rsqrt(x):
    return 1.0 / np.sqrt(x)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu(x, approximate: str = "none"):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(x.dtype)


def _exp_reference(inputs, attrs):
    """e ** x."""
    return float_unary(np.exp, inputs)


def _tanh_reference(inputs, attrs):
    """Hyperbolic tangent."""
    return float_unary(np.tanh, inputs)


def _sqrt_reference(inputs, attrs):
    """Square root."""
    return float_unary(np.sqrt, inputs)


def _rsqrt_reference(inputs, attrs):
    """1 / sqrt(x)."""
    return float_unary(rsqrt, inputs)


def _sigmoid_reference(inputs, attrs):
    """1 / (1 + e ** -x)."""
    return float_unary(sigmoid, inputs)


def _silu_reference(inputs, attrs):
    """x * sigmoid(x)."""
    return float_unary(silu, inputs)


def _cos_reference(inputs, attrs):
    """Cosine."""
    return float_unary(np.cos, inputs)


def _sin_reference(inputs, attrs):
    """Sine."""
    return float_unary(np.sin, inputs)


def _neg_reference(inputs, attrs):
    """-x."""
    return float_unary(np.negative, inputs)


def _float_unary(name: str, reference) -> None:
    def infer(inputs, attrs):
        expect(inputs[0].dtype.is_float, f"{name}: needs a float operand, got {inputs[0].dtype}")
        return _same_type(inputs, attrs)

    register(OpDef(name, ("x",), {}, infer, reference, elementwise_cost))


_float_unary("exp", _exp_reference)
_float_unary("tanh", _tanh_reference)
_float_unary("sqrt", _sqrt_reference)
_float_unary("rsqrt", _rsqrt_reference)
_float_unary("sigmoid", _sigmoid_reference)
_float_unary("silu", _silu_reference)
_float_unary("cos", _cos_reference)
_float_unary("sin", _sin_reference)
_float_unary("neg", _neg_reference)


def _gelu_reference(inputs, attrs):
    x = inputs[0]
    return [gelu(x.astype(np.float32), attrs["approximate"]).astype(x.dtype)]


register(OpDef("gelu", ("x",), {"approximate": "none"}, _same_type, _gelu_reference, elementwise_cost,
               doc="GELU; approximate='tanh' is the tanh form (gelu_pytorch_tanh)."))


def _softcap_reference(inputs, attrs):
    x, cap = inputs[0], attrs["cap"]
    return [(cap * np.tanh(x.astype(np.float32) / cap)).astype(x.dtype)]


register(OpDef("softcap", ("x",), {"cap": REQUIRED}, _same_type, _softcap_reference, elementwise_cost,
               doc="Logit soft-capping: cap * tanh(x / cap)."))


def _where_infer(inputs, attrs):
    cond, a, b = inputs
    expect(cond.dtype == DType.bool, f"where: condition must be bool, got {cond.dtype}")
    expect(a.dtype == b.dtype, f"where: dtypes differ ({a.dtype} vs {b.dtype})")
    shape = broadcast_shapes("where", broadcast_shapes("where", cond.shape, a.shape), b.shape)
    return [TensorType(a.dtype, shape)]


def _where_reference(inputs, attrs):
    """cond ? a : b, broadcasting."""
    return [np.where(*inputs).astype(inputs[1].dtype)]


register(OpDef("where", ("cond", "a", "b"), {}, _where_infer, _where_reference, elementwise_cost))


def compare(fn, inputs):
    """fn(a, b) with NumPy broadcasting; bool result."""
    return [np.asarray(fn(*inputs))]


def _less_reference(inputs, attrs):
    """a < b, broadcasting; bool result."""
    return compare(np.less, inputs)


def _equal_reference(inputs, attrs):
    """a == b, broadcasting; bool result."""
    return compare(np.equal, inputs)


def _compare(name: str, reference) -> None:
    def infer(inputs, attrs):
        a, b = inputs
        expect(a.dtype == b.dtype, f"{name}: dtypes differ ({a.dtype} vs {b.dtype})")
        return [TensorType(DType.bool, broadcast_shapes(name, a.shape, b.shape))]

    register(OpDef(name, ("a", "b"), {}, infer, reference, elementwise_cost))


_compare("less", _less_reference)
_compare("equal", _equal_reference)

# irc dtype text -> NumPy dtype name ("bf16" -> "bfloat16"; ml_dtypes, imported by irc.dtypes,
# makes NumPy read the bf16/int4 names). Plain strings, so references need no DType.
NUMPY_DTYPES = {dtype.text: dtype.numpy.name for dtype in DType}


def _cast_infer(inputs, attrs):
    return [TensorType(DType.parse(attrs["to"]), inputs[0].shape)]


def _cast_reference(inputs, attrs):
    """Convert to dtype ``to``."""
    return [inputs[0].astype(NUMPY_DTYPES[attrs["to"]])]


register(OpDef("cast", ("x",), {"to": REQUIRED}, _cast_infer, _cast_reference, elementwise_cost))


# ---- constants -------------------------------------------------------------------------

def _constant_infer(inputs, attrs):
    value = np.asarray(attrs["value"])
    return [TensorType(DType.parse(attrs["dtype"]), value.shape)]


def _constant_reference(inputs, attrs):
    return [np.asarray(attrs["value"], dtype=NUMPY_DTYPES[attrs["dtype"]])]


register(OpDef("constant", (), {"value": REQUIRED, "dtype": "f32"}, _constant_infer, _constant_reference,
               movement_cost, doc="A small literal tensor (a scalar or nested list) held in attrs."))


# ---- reductions ------------------------------------------------------------------------

def reduce(fn, inputs, attrs):
    """fn over ``axes`` (float32 for float operands), returned in x's dtype."""
    x = inputs[0]
    out = fn(x.astype(np.float32) if x.dtype.kind == "f" else x, axis=tuple(attrs["axes"]),
             keepdims=attrs["keepdims"])
    return [np.asarray(out).astype(x.dtype)]


def _reduce_sum_reference(inputs, attrs):
    """Sum over ``axes``."""
    return reduce(np.sum, inputs, attrs)


def _reduce_mean_reference(inputs, attrs):
    """Mean over ``axes``."""
    return reduce(np.mean, inputs, attrs)


def _reduce_max_reference(inputs, attrs):
    """Maximum over ``axes``."""
    return reduce(np.max, inputs, attrs)


def _reduce_cost(inputs, outputs, attrs):
    read, written = _io_bytes(inputs, outputs)
    return Cost(other_flops=inputs[0].numel, bytes_read=read, bytes_written=written)


def _reduce(name: str, reference) -> None:
    def infer(inputs, attrs):
        x = inputs[0]
        axes = {_axis(a, x.rank, name) for a in attrs["axes"]}
        if attrs["keepdims"]:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return [TensorType(x.dtype, shape)]

    register(OpDef(name, ("x",), {"axes": REQUIRED, "keepdims": True}, infer, reference, _reduce_cost))


_reduce("reduce_sum", _reduce_sum_reference)
_reduce("reduce_mean", _reduce_mean_reference)
_reduce("reduce_max", _reduce_max_reference)


def _softmax_reference(inputs, attrs):
    x = inputs[0]
    z = x.astype(np.float32)
    z = np.exp(z - z.max(axis=attrs["axis"], keepdims=True))
    return [(z / z.sum(axis=attrs["axis"], keepdims=True)).astype(x.dtype)]


def _softmax_infer(inputs, attrs):
    _axis(attrs["axis"], inputs[0].rank, "softmax")
    return _same_type(inputs, attrs)


register(OpDef("softmax", ("x",), {"axis": -1}, _softmax_infer, _softmax_reference, elementwise_cost,
               doc="Numerically stable softmax along ``axis``."))


# ---- matmul ----------------------------------------------------------------------------

def _matmul_infer(inputs, attrs):
    a, b = inputs
    expect(a.rank >= 2 and b.rank >= 2, "matmul: operands need rank >= 2")
    expect(a.dtype == b.dtype, f"matmul: dtypes differ ({a.dtype} vs {b.dtype})")
    expect(same_dims(a.shape[-1], b.shape[-2]),
           f"matmul: inner dims differ ({dims.format_shape(a.shape)} @ {dims.format_shape(b.shape)})")
    batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    return [TensorType(a.dtype, batch + (a.shape[-2], b.shape[-1]))]


def _matmul_reference(inputs, attrs):
    a, b = inputs
    return [np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)]


def matmul_cost(inputs, outputs, attrs) -> Cost:
    """2 FLOPs per multiply-add: 2 * (output elements) * K."""
    read, written = _io_bytes(inputs, outputs)
    return Cost(flops=2 * outputs[0].numel * inputs[0].shape[-1], bytes_read=read, bytes_written=written)


register(OpDef("matmul", ("a", "b"), {}, _matmul_infer, _matmul_reference, matmul_cost,
               doc="Batched matrix product with NumPy broadcasting of batch dims."))


# ---- shape and data movement -----------------------------------------------------------

def _reshape_infer(inputs, attrs):
    x = inputs[0]
    shape = tuple(dims.canonical(d) for d in attrs["shape"])
    expect(dims.product(shape) == dims.product(x.shape),
           f"reshape: {dims.format_shape(x.shape)} has {dims.product(x.shape)} elements, "
           f"target {dims.format_shape(shape)} has {dims.product(shape)}")
    return [TensorType(x.dtype, shape)]


def _reshape_reference(inputs, attrs):
    return [inputs[0].reshape(attrs["shape"])]


register(OpDef("reshape", ("x",), {"shape": REQUIRED}, _reshape_infer, _reshape_reference, movement_cost,
               shape_attrs=("shape",), doc="View with a new shape of the same element count (dims may be symbolic)."))


def _transpose_infer(inputs, attrs):
    x, perm = inputs[0], attrs["perm"]
    expect(sorted(perm) == list(range(x.rank)), f"transpose: perm {perm} does not fit rank {x.rank}")
    return [TensorType(x.dtype, tuple(x.shape[p] for p in perm))]


def _transpose_reference(inputs, attrs):
    """Permute axes."""
    return [np.ascontiguousarray(np.transpose(inputs[0], attrs["perm"]))]


register(OpDef("transpose", ("x",), {"perm": REQUIRED}, _transpose_infer, _transpose_reference, movement_cost))


def _slice_infer(inputs, attrs):
    x = inputs[0]
    axis = _axis(attrs["axis"], x.rank, "slice")
    start, end, size = attrs["start"], attrs["end"], x.shape[axis]
    expect(isinstance(start, int) and start >= 0, f"slice: start must be a non-negative int, got {start!r}")
    if end is None:
        expect(start == 0 or isinstance(size, int), f"slice: cannot slice symbolic dim {size!r} from {start}")
        new = size if start == 0 else size - start
    else:
        expect(isinstance(end, int) and end >= start, f"slice: end {end!r} must be an int >= start")
        expect(not isinstance(size, int) or end <= size, f"slice: end {end} beyond dim {size}")
        new = end - start
    expect(isinstance(new, str) or new >= 0, f"slice: start {start} beyond dim {size}")
    return [TensorType(x.dtype, x.shape[:axis] + (new,) + x.shape[axis + 1:])]


def _slice_reference(inputs, attrs):
    x = inputs[0]
    index = [slice(None)] * x.ndim
    index[attrs["axis"]] = slice(attrs["start"], attrs["end"])
    return [np.ascontiguousarray(x[tuple(index)])]


register(OpDef("slice", ("x",), {"axis": REQUIRED, "start": 0, "end": None}, _slice_infer, _slice_reference,
               movement_cost, doc="x[start:end] along ``axis`` (end None: to the end)."))


def _concat_infer(inputs, attrs):
    first = inputs[0]
    axis = _axis(attrs["axis"], first.rank, "concat")
    total = 0
    for v in inputs:
        expect(v.rank == first.rank and v.dtype == first.dtype, "concat: operands differ in rank or dtype")
        for i, (a, b) in enumerate(zip(v.shape, first.shape)):
            expect(i == axis or same_dims(a, b), f"concat: dim {i} differs ({a} vs {b})")
        total = dims.add(total, v.shape[axis])
    return [TensorType(first.dtype, first.shape[:axis] + (total,) + first.shape[axis + 1:])]


def _concat_reference(inputs, attrs):
    """Join operands along ``axis``."""
    return [np.concatenate(inputs, axis=attrs["axis"])]


register(OpDef("concat", ("*inputs",), {"axis": REQUIRED}, _concat_infer, _concat_reference, movement_cost))


def _gather_infer(inputs, attrs):
    data, indices = inputs
    expect(indices.dtype in (DType.i64, DType.i32), f"gather: indices must be integer, got {indices.dtype}")
    axis = _axis(attrs["axis"], data.rank, "gather")
    return [TensorType(data.dtype, data.shape[:axis] + indices.shape + data.shape[axis + 1:])]


def _gather_reference(inputs, attrs):
    """data indexed by ``indices`` along ``axis`` (numpy.take)."""
    return [np.take(inputs[0], inputs[1], axis=attrs["axis"])]


register(OpDef("gather", ("data", "indices"), {"axis": 0}, _gather_infer, _gather_reference, movement_cost))


def _scatter_add_infer(inputs, attrs):
    data, indices, updates = inputs
    expect(indices.rank == 1, "scatter_add: indices must be 1-D")
    expect(updates.shape[1:] == data.shape[1:] and same_dims(updates.shape[0], indices.shape[0]),
           f"scatter_add: updates {dims.format_shape(updates.shape)} do not fit rows of "
           f"{dims.format_shape(data.shape)} at {dims.format_shape(indices.shape)}")
    return [TensorType(data.dtype, data.shape)]


def _scatter_add_reference(inputs, attrs):
    data, indices, updates = inputs
    out = data.astype(np.float32 if data.dtype.kind == "f" else data.dtype, copy=True)
    np.add.at(out, indices, updates.astype(out.dtype))
    return [out.astype(data.dtype)]


register(OpDef("scatter_add", ("data", "indices", "updates"), {}, _scatter_add_infer, _scatter_add_reference,
               elementwise_cost, doc="Copy of data with updates[i] added to row indices[i] (duplicates sum)."))


def _topk_infer(inputs, attrs):
    x = inputs[0]
    axis = _axis(attrs["axis"], x.rank, "topk")
    k = attrs["k"]
    expect(isinstance(k, int) and k > 0, f"topk: k must be a positive int, got {k!r}")
    expect(not isinstance(x.shape[axis], int) or k <= x.shape[axis], f"topk: k={k} exceeds dim {x.shape[axis]}")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [TensorType(x.dtype, shape), TensorType(DType.i64, shape)]


def _topk_reference(inputs, attrs):
    x, k, axis = inputs[0], attrs["k"], attrs["axis"]
    key = -x if attrs["largest"] else x
    order = np.argsort(key, axis=axis, kind="stable")  # ties: lower index first
    index = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, index, axis=axis), index.astype(np.int64)]


register(OpDef("topk", ("x",), {"k": REQUIRED, "axis": -1, "largest": True}, _topk_infer, _topk_reference,
               elementwise_cost, doc="The k largest (or smallest) values and their indices, sorted; ties "
                                     "keep the lower index first."))


def _argsort_infer(inputs, attrs):
    _axis(attrs["axis"], inputs[0].rank, "argsort")
    return [TensorType(DType.i64, inputs[0].shape)]


def _argsort_reference(inputs, attrs):
    """Indices that sort x ascending along ``axis``; stable."""
    return [np.argsort(inputs[0], axis=attrs["axis"], kind="stable").astype(np.int64)]


register(OpDef("argsort", ("x",), {"axis": -1}, _argsort_infer, _argsort_reference, elementwise_cost))


def _expand_infer(inputs, attrs):
    x = inputs[0]
    shape = tuple(dims.canonical(d) for d in attrs["shape"])
    expect(broadcast_shapes("expand", x.shape, shape) == shape,
           f"expand: {dims.format_shape(x.shape)} does not broadcast to {dims.format_shape(shape)}")
    return [TensorType(x.dtype, shape)]


def _expand_reference(inputs, attrs):
    return [np.broadcast_to(inputs[0], attrs["shape"])]


register(OpDef("expand", ("x",), {"shape": REQUIRED}, _expand_infer, _expand_reference, movement_cost,
               shape_attrs=("shape",), doc="Broadcast x to ``shape`` without copying (symbolic dims must already match x)."))
