"""Primitives the attention passes lower to: index ranges of symbolic length, sizes,
comparisons and a strided slice.

``gqa-broadcast`` builds the causal/window/padding mask from key and query positions whose
lengths (T, P+T) are symbolic, so they come from the shapes of tensors at run time:
``range_like`` (0, 1, ..., n-1 along one axis of a tensor) and ``dim_size`` (that n as a
scalar). ``rope-fuse`` matches the strided form of interleaved RoPE (``x[..., 0::2]``),
which ``strided_slice`` expresses. References are module-level functions (emit-friendly).
"""
from __future__ import annotations

import numpy as np

from irc.dtypes import DType
from irc.ops.primitives import compare, elementwise_binary, elementwise_cost, movement_cost
from irc.ops.registry import Cost, OpDef, TensorType, axis_index, broadcast_shapes, expect, register

# ---- sizes and ranges of a tensor's shape ------------------------------------------------

def _written_only(inputs, outputs, attrs) -> Cost:
    """Reads only a shape, writes its result."""
    return Cost(bytes_written=sum(t.nbytes for t in outputs))


def _range_like_infer(inputs, attrs):
    x = inputs[0]
    axis = axis_index(attrs["axis"], x.rank, "range_like")
    return [TensorType(DType.i64, (x.shape[axis],))]


def _range_like_reference(inputs, attrs):
    """0, 1, ..., n-1 (i64) where n is the length of x along ``axis``; x's values are not read."""
    return [np.arange(inputs[0].shape[attrs["axis"]], dtype=np.int64)]


register(OpDef("range_like", ("x",), {"axis": 0}, _range_like_infer, _range_like_reference, _written_only))


def _dim_size_infer(inputs, attrs):
    axis_index(attrs["axis"], inputs[0].rank, "dim_size")
    return [TensorType(DType.i64, ())]


def _dim_size_reference(inputs, attrs):
    """The length of x along ``axis`` as an i64 scalar (P from a past cache [B,K,P,D])."""
    return [np.asarray(inputs[0].shape[attrs["axis"]], dtype=np.int64)]


register(OpDef("dim_size", ("x",), {"axis": 0}, _dim_size_infer, _dim_size_reference, _written_only))


# ---- comparisons and logic ---------------------------------------------------------------

def _less_equal_reference(inputs, attrs):
    """a <= b, broadcasting; bool result."""
    return compare(np.less_equal, inputs)


def _less_equal_infer(inputs, attrs):
    a, b = inputs
    expect(a.dtype == b.dtype, f"less_equal: dtypes differ ({a.dtype} vs {b.dtype})")
    return [TensorType(DType.bool, broadcast_shapes("less_equal", a.shape, b.shape))]


register(OpDef("less_equal", ("a", "b"), {}, _less_equal_infer, _less_equal_reference, elementwise_cost))


def _logical_and_reference(inputs, attrs):
    """a and b, broadcasting (bool operands)."""
    return elementwise_binary(np.logical_and, inputs)


def _logical_and_infer(inputs, attrs):
    a, b = inputs
    expect(a.dtype == DType.bool and b.dtype == DType.bool,
           f"logical_and: operands must be bool, got {a.dtype} and {b.dtype}")
    return [TensorType(DType.bool, broadcast_shapes("logical_and", a.shape, b.shape))]


register(OpDef("logical_and", ("a", "b"), {}, _logical_and_infer, _logical_and_reference, elementwise_cost,
               commutative=True))


# ---- strided slice -----------------------------------------------------------------------

def _strided_slice_infer(inputs, attrs):
    x = inputs[0]
    axis = axis_index(attrs["axis"], x.rank, "strided_slice")
    start, end, step, size = attrs["start"], attrs["end"], attrs["step"], x.shape[axis]
    expect(isinstance(start, int) and start >= 0, f"strided_slice: start must be a non-negative int, got {start!r}")
    expect(isinstance(step, int) and step > 0, f"strided_slice: step must be a positive int, got {step!r}")
    if end is None:
        expect(isinstance(size, int), f"strided_slice: give end to slice symbolic dim {size!r}")
        end = size
    expect(isinstance(end, int) and end >= start, f"strided_slice: end {end!r} must be an int >= start")
    expect(not isinstance(size, int) or end <= size, f"strided_slice: end {end} beyond dim {size}")
    length = len(range(start, end, step))
    return [TensorType(x.dtype, x.shape[:axis] + (length,) + x.shape[axis + 1:])]


def _strided_slice_reference(inputs, attrs):
    """x[start:end:step] along ``axis`` (end None: to the end)."""
    x = inputs[0]
    index = [slice(None)] * x.ndim
    index[attrs["axis"]] = slice(attrs["start"], attrs["end"], attrs["step"])
    return [np.ascontiguousarray(x[tuple(index)])]


register(OpDef("strided_slice", ("x",), {"axis": -1, "start": 0, "end": None, "step": 1}, _strided_slice_infer,
               _strided_slice_reference, movement_cost))
