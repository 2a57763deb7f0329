"""The sorted mixture of experts of ``moe-sort`` in standard ops: ``moe_route``,
``moe_dispatch`` and ``grouped_gemm`` (``irc.ops.moe_sorted``; N tokens, k = top_k,
M = N * k token-slot pairs, E experts).

- ``moe_route``: the router MatMul (+ GPT-OSS's logit bias), then ``backends.onnx.moe.route``
  (softmax or sigmoid, selection bias, groups through ReduceMax/TopK and a OneHot mask,
  TopK, GatherElements, renormalised and scaled), the same steps the dense ``moe`` lowering
  takes.
- ``moe_dispatch``: the pairs in GShard priority order (expert_ids transposed, [k, N] ->
  [M]) sorted by the unique int64 keys expert * M + position with ``TopK(k=M,
  largest=0)`` (ORT's CPU TopK takes int64; unique keys make the sort stable by
  construction); counts per expert from ``OneHot`` + ``ReduceSum`` (int64), ``indptr`` their
  ``CumSum`` after a 0. With a ``capacity_factor`` the capacity ceil(factor * N * k / E) is
  computed in float64 in the reference's order; a row's rank within its expert is its
  sorted position minus the expert's start; kept rows go first by a second sort on
  (dropped, position), and the counts are clipped to the capacity.
- ``grouped_gemm``: a ``Loop`` over the E experts, each step one MatMul of the expert's
  contiguous rows ``rows[indptr[e]:indptr[e+1]]`` with its [in, out] weight, written back
  with ``ScatterND`` into a zero [M, out] accumulator (rows outside every segment, the
  dropped ones, stay 0). Only active work, as the op's cost says; the padded alternative
  (every row times every expert, then a select) costs E / k times the FLOPs.
"""
from __future__ import annotations

from functools import partial

import numpy as np
from onnx import TensorProto, helper

from irc.dtypes import DType
from irc.graph import Node, Param
from irc.ops.registry import pad_inputs

from backends.onnx.builder import ONNX_TYPES, Builder
from backends.onnx.moe import route
from backends.onnx.portable import linear


def lower_moe_route(b: Builder, node: Node, outs: list[str]) -> None:
    x, router, bias, logit_bias = pad_inputs(node.inputs, 4)
    name = outs[0]
    tokens = b.op("Reshape", [b.value(x), b.i64([-1, x.shape[-1]])], f"{name}/tokens")
    logits = linear(b, tokens, x.dtype, router, logit_bias, b.fresh(f"{name}/router_logits"))
    ids, weights = route(b, logits, bias, node.attrs, name, x.dtype)  # weights in f32, as moe_route gives them
    b.node("Identity", [ids], outs[:1])
    b.node("Identity", [weights], outs[1:])


def _sort_ascending(b: Builder, keys: str, count: str, hint: str) -> tuple[str, str]:
    """(sorted keys, order) of int64 ``keys`` [M] (unique), ``count`` = M as int64 [1]."""
    values, order = b.fresh(f"{hint}/sorted"), b.fresh(f"{hint}/order")
    b.node("TopK", [keys, count], [values, order], axis=0, largest=0, sorted=1)
    return values, order


def lower_moe_dispatch(b: Builder, node: Node, outs: list[str]) -> None:
    (ids,) = node.inputs
    experts, factor = node.attrs["experts"], node.attrs["capacity_factor"]
    top_k = ids.shape[1]
    name = outs[0]
    by_priority = b.op("Reshape", [b.op("Transpose", [b.value(ids)], f"{name}/ids_kN", perm=[1, 0]), b.i64([-1])],
                       f"{name}/by_priority")
    pairs = b.op("Shape", [by_priority], f"{name}/pairs")                          # [1]: M
    tokens = b.op("Shape", [b.value(ids)], f"{name}/tokens", start=0, end=1)        # [1]: N
    safe_tokens = b.op("Max", [tokens, b.i64([1])], f"{name}/tokens_or_1")
    position = b.op("Range", [b.i64(0), b.op("Squeeze", [pairs, b.i64([0])], f"{name}/pairs_scalar"), b.i64(1)],
                    f"{name}/position")
    keys = b.op("Add", [b.op("Mul", [by_priority, pairs], f"{name}/expert_major"), position], f"{name}/keys")
    sorted_keys, order = _sort_ascending(b, keys, pairs, name)
    slot = b.op("Add", [b.op("Mul", [b.op("Mod", [order, safe_tokens], f"{name}/token_of"), b.i64([top_k])],
                             f"{name}/slot_base"),
                        b.op("Div", [order, safe_tokens], f"{name}/choice_of")], f"{name}/slot_sorted")
    onehot = b.op("OneHot", [by_priority, b.i64(experts), b.i64([0, 1])], f"{name}/onehot", axis=-1)
    counts = b.op("ReduceSum", [onehot, b.i64([0])], f"{name}/counts", keepdims=0)
    if factor is not None:
        slot, counts = _apply_capacity(b, slot, counts, sorted_keys, pairs, position, tokens, factor, top_k,
                                       experts, name)
    cumulative = b.op("CumSum", [counts, b.i64(0)], f"{name}/cumulative")
    b.node("Div", [slot, b.i64([top_k])], outs[:1])
    b.node("Identity", [slot], outs[1:2])
    b.node("Concat", [b.i64([0]), cumulative], outs[2:3], axis=0)


def _apply_capacity(b: Builder, slot, counts, sorted_keys, pairs, position, tokens, factor, top_k, experts, name):
    """Kept rows first (each expert's first ``capacity`` in sorted order), counts clipped."""
    as_double = b.op("Cast", [tokens], f"{name}/tokens_f64", to=TensorProto.DOUBLE)
    capacity = b.op("Mul", [b.const([factor], np.float64, f"{name}/factor"), as_double], f"{name}/capacity_raw")
    capacity = b.op("Mul", [capacity, b.const([top_k], np.float64, f"{name}/top_k_f64")], f"{name}/capacity_pairs")
    capacity = b.op("Div", [capacity, b.const([experts], np.float64, f"{name}/experts_f64")], f"{name}/capacity_f")
    capacity = b.op("Cast", [b.op("Ceil", [capacity], f"{name}/capacity_ceil")], f"{name}/capacity",
                    to=TensorProto.INT64)
    expert_of_row = b.op("Div", [sorted_keys, pairs], f"{name}/expert_of_row")
    starts = b.op("Sub", [b.op("CumSum", [counts, b.i64(0)], f"{name}/ends"), counts], f"{name}/starts")
    rank = b.op("Sub", [position, b.op("Gather", [starts, expert_of_row], f"{name}/row_start", axis=0)],
                f"{name}/rank")
    dropped = b.op("Cast", [b.op("GreaterOrEqual", [rank, capacity], f"{name}/dropped_bool")], f"{name}/dropped",
                   to=TensorProto.INT64)
    keys = b.op("Add", [b.op("Mul", [dropped, pairs], f"{name}/dropped_major"), position], f"{name}/kept_keys")
    _, kept_first = _sort_ascending(b, keys, pairs, f"{name}/kept")
    slot = b.op("Gather", [slot, kept_first], f"{name}/slot_kept_first", axis=0)
    return slot, b.op("Min", [counts, capacity], f"{name}/kept_counts")


def experts_transposed(w):
    """[E, out, in] -> [E, in, out]: each expert's weight as MatMul's right operand."""
    return np.asarray(w).transpose(0, 2, 1)


def _experts_in_out(b: Builder, w, dtype: DType) -> str:
    if isinstance(w, Param):
        name = b.derived(f"{w.name}.T", w.dtype, (w.shape[0], w.shape[2], w.shape[1]), (w,),
                         partial(experts_transposed), "rows")
    else:
        name = b.cached(("experts-T", w.name), lambda: b.op("Transpose", [b.value(w)], f"{w.name}.T", perm=[0, 2, 1]))
    if w.dtype != dtype:
        name = b.cached(("cast", name, dtype), lambda: b.op("Cast", [name], f"{name}.{dtype}", to=ONNX_TYPES[dtype]))
    return name


def lower_grouped_gemm(b: Builder, node: Node, outs: list[str]) -> None:
    rows, w, indptr = node.inputs
    experts, width = w.shape[0], w.shape[1]
    name = outs[0]
    weights = _experts_in_out(b, w, rows.dtype)
    rows_name, indptr_name = b.value(rows), b.value(indptr)
    elem = ONNX_TYPES[rows.dtype]
    shape = b.op("Concat", [b.op("Shape", [rows_name], f"{name}/rows", start=0, end=1), b.i64([width])],
                 f"{name}/shape", axis=0)
    zeros = b.op("ConstantOfShape", [shape], f"{name}/zeros", value=helper.make_tensor("zero", elem, [1], [0]))

    outer, b.nodes = b.nodes, []
    expert, keep_going, acc = b.fresh(f"{name}/expert"), b.fresh(f"{name}/cond_in"), b.fresh(f"{name}/acc_in")
    start = b.op("Gather", [indptr_name, expert], f"{name}/start", axis=0)
    end = b.op("Gather", [indptr_name, b.op("Add", [expert, b.i64(1)], f"{name}/next")], f"{name}/end", axis=0)
    segment = b.op("Slice", [rows_name, b.op("Unsqueeze", [start, b.i64([0])], f"{name}/start1"),
                             b.op("Unsqueeze", [end, b.i64([0])], f"{name}/end1"), b.i64([0])], f"{name}/segment")
    product = b.op("MatMul", [segment, b.op("Gather", [weights, expert], f"{name}/w_e", axis=0)], f"{name}/product")
    where = b.op("Unsqueeze", [b.op("Range", [start, end, b.i64(1)], f"{name}/row_ids"), b.i64([-1])],
                 f"{name}/row_ids2")
    acc_out = b.op("ScatterND", [acc, where, product], f"{name}/acc_out")
    cond_out = b.op("Identity", [keep_going], f"{name}/cond_out")
    body_nodes, b.nodes = b.nodes, outer
    body = helper.make_graph(
        body_nodes, f"{name}/body",
        [helper.make_tensor_value_info(expert, TensorProto.INT64, []),
         helper.make_tensor_value_info(keep_going, TensorProto.BOOL, []),
         helper.make_tensor_value_info(acc, elem, [None, width])],
        [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, []),
         helper.make_tensor_value_info(acc_out, elem, [None, width])])
    b.node("Loop", [b.i64(experts), b.const(True, np.bool_, "true"), zeros], outs, body=body)


LOWERINGS = {"moe_route": lower_moe_route, "moe_dispatch": lower_moe_dispatch, "grouped_gemm": lower_grouped_gemm}
