"""Primitive ops: the targets that model-level ops lower to. Here the arithmetic ones
(elementwise, cast, constant, reductions, softmax, matmul); the ones that move data
(reshape, transpose, slice, gather, ...) are ``irc.ops.movement``.

Semantics follow NumPy (broadcasting, batched matmul); every rule is written once.
"""
from __future__ import annotations

import math

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.ops.registry import (REQUIRED, Cost, OpDef, TensorType, axis_index, broadcast_shapes, expect, register,
                              same_dims)


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


def _log_reference(inputs, attrs):
    """The natural logarithm (-inf at 0, NaN below)."""
    return float_unary(np.log, inputs)


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
_float_unary("log", _log_reference)
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

# irc dtype text -> NumPy dtype name ("bf16" -> "bfloat16"; ml_dtypes makes NumPy read the bf16/int4
# names: the interpreter imports it for a graph that has such values, irc.interpreter). Plain strings,
# so references need no DType.
NUMPY_DTYPES = {dtype.text: dtype.numpy_name for dtype in DType}


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
        axes = {axis_index(a, x.rank, name) for a in attrs["axes"]}
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
    if z.shape[attrs["axis"]] == 0:  # over nothing (a cross-attention with no image cached)
        return [z.astype(x.dtype)]
    z = np.exp(z - z.max(axis=attrs["axis"], keepdims=True))
    return [(z / z.sum(axis=attrs["axis"], keepdims=True)).astype(x.dtype)]


def _softmax_infer(inputs, attrs):
    axis_index(attrs["axis"], inputs[0].rank, "softmax")
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
