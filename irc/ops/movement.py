"""Primitive ops that move data: reshape, transpose, slice, concat, gather, scatter_add,
topk, argsort and expand (the arithmetic primitives are ``irc.ops.primitives``).

Semantics follow NumPy; references are module-level functions, so the NumPy emitter can
copy their source into a standalone module.
"""
from __future__ import annotations

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.ops.primitives import elementwise_cost, movement_cost
from irc.ops.registry import REQUIRED, OpDef, TensorType, axis_index, broadcast_shapes, expect, register, same_dims


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
    axis = axis_index(attrs["axis"], x.rank, "slice")
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
    axis = axis_index(attrs["axis"], first.rank, "concat")
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
    axis = axis_index(attrs["axis"], data.rank, "gather")
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
    axis = axis_index(attrs["axis"], x.rank, "topk")
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
    axis_index(attrs["axis"], inputs[0].rank, "argsort")
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
               shape_attrs=("shape",),
               doc="Broadcast x to ``shape`` without copying (symbolic dims must already match x)."))
