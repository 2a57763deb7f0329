"""Sorted mixture of experts: the ops ``moe-sort`` lowers the ``moe`` op to.

The form real MoE kernels use, in small ops rather than one blob (N tokens, k = top_k,
M = N * k token-slot pairs, E experts):

- ``moe_route`` (x [N, d], router [E, d], router_bias? [E], router_logit_bias? [E]) ->
  (expert_ids [N, k] i64, weights [N, k] f32): ``irc.ops.moe.route`` (GPT-OSS's logit bias
  added to the router logits; softmax or sigmoid scores, selection bias,
  group-limited top-k, or sparsemixer's two rounds; renormalisation, routed scale), with the
  ``moe`` op's routing attrs.
- ``moe_dispatch`` (expert_ids [N, k]) -> (token_index [M], slot_index [M], indptr [E+1]),
  all i64: the token-slot pairs stably sorted by expert. Sorted row r reads token
  ``token_index[r]`` and gating weight ``weights.reshape(M)[slot_index[r]]``; expert e owns
  rows ``indptr[e]:indptr[e+1]``. Within an expert, rows keep GShard priority order: every
  token's first choice before any second choice, tokens in order. With ``capacity_factor``
  each expert keeps at most ``expert_capacity`` rows in that order; the dropped pairs follow
  ``indptr[E]``, are never computed and contribute nothing (a token that loses every slot
  keeps only the shared expert, i.e. passes through the residual).
- ``grouped_gemm`` (rows [M, in], w [E, out, in], indptr [E+1]) -> [M, out]: a segment GEMM,
  ``rows[indptr[e]:indptr[e+1]] @ w[e].T`` per expert, zeros outside every segment. Its cost
  counts only active work, 2 * rows * (out * in), and one token touches top_k / E of w: the
  ``top_k`` and ``experts`` attrs say so to analysis (``active_fraction``).

The gather of token rows, the multiply by gating weights and the scatter-add back to token
order are the existing ``gather``, ``mul`` and ``scatter_add`` primitives. ``moe_sorted``
chains the same references over arrays (the benchmark's subject), and ``tile_padding`` is
the rows a GEMM with row tiles of ``tile`` wastes on the segments. References are
module-level functions (emit-friendly).
"""
from __future__ import annotations

import math

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.ops.moe import check_routing_attrs, routing_other_flops
from irc.ops.moe import activate, route, routing_attrs, shared_expert
from irc.ops.nn import f32
from irc.ops.registry import REQUIRED, Cost, OpDef, TensorType, expect, pad_inputs, register, same_dims

ROUTING_DEFAULTS = {"experts": REQUIRED, "top_k": REQUIRED, "scoring": "softmax", "norm_topk_prob": True,
                    "routed_scale": 1.0, "n_group": None, "topk_group": None, "group_score": "max",
                    "jitter_eps": 0.01}


# ---- array functions ---------------------------------------------------------------------

def expert_capacity(tokens: int, top_k: int, experts: int, capacity_factor: float) -> int:
    """Rows an expert keeps: ceil(capacity_factor * tokens * top_k / experts) (GShard, Switch)."""
    return int(math.ceil(capacity_factor * tokens * top_k / experts))


def dispatch(expert_ids, experts: int, capacity_factor=None) -> tuple:
    """(token_index [M], slot_index [M], indptr [E+1]) for expert_ids [N, k]: the token-slot
    pairs sorted by expert, GShard priority order within an expert, dropped pairs (beyond
    the capacity, when ``capacity_factor`` is set) after indptr[E]."""
    expert_ids = np.asarray(expert_ids, dtype=np.int64)
    tokens, top_k = expert_ids.shape
    by_priority = expert_ids.T.reshape(-1)  # every token's first choice, then every second choice, ...
    order = np.argsort(by_priority, kind="stable")
    counts = np.bincount(by_priority, minlength=experts).astype(np.int64)
    slot_index = (order % max(tokens, 1)) * top_k + order // max(tokens, 1)  # index into weights [N, k]
    if capacity_factor is not None:
        capacity = expert_capacity(tokens, top_k, experts, capacity_factor)
        rank = np.arange(len(order)) - np.repeat(np.cumsum(counts) - counts, counts)
        kept = rank < capacity
        slot_index = np.concatenate([slot_index[kept], slot_index[~kept]])
        counts = np.minimum(counts, capacity)
    indptr = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(counts)]).astype(np.int64)
    return (slot_index // top_k).astype(np.int64), slot_index.astype(np.int64), indptr


def grouped_gemm(rows, weight, indptr) -> np.ndarray:
    """rows [M, in] times each expert's weight [out, in] over its segment of rows; float32,
    zeros for rows outside every segment (dropped pairs)."""
    rows = f32(rows)
    out = np.zeros((rows.shape[0], weight.shape[1]), dtype=np.float32)
    for expert in range(weight.shape[0]):
        start, end = int(indptr[expert]), int(indptr[expert + 1])
        if end > start:
            out[start:end] = rows[start:end] @ f32(weight[expert]).T
    return out


def tile_padding(counts, tile: int) -> int:
    """Rows wasted when every expert's segment is padded to a multiple of ``tile``."""
    counts = np.asarray(counts, dtype=np.int64)
    return int(np.sum(-(-counts // tile) * tile - counts))


def moe_sorted(x, router, w_gate, w_up, w_down, router_bias=None, shared_gate=None, shared_up=None,
               shared_down=None, shared_expert_gate=None, *, activation: str = "silu", capacity_factor=None,
               **routing) -> np.ndarray:
    """The sorted form over arrays: route, dispatch, gather, grouped GEMMs, weight, scatter-add.
    Equals ``irc.ops.moe.moe_dense`` (up to float32 rounding) when nothing is dropped."""
    tokens = f32(x).reshape(-1, x.shape[-1])
    expert_ids, weights = route(tokens, router, router_bias, **routing)
    token_index, slot_index, indptr = dispatch(expert_ids, len(w_gate), capacity_factor)
    rows = tokens[token_index]
    hidden = activate(grouped_gemm(rows, w_gate, indptr), activation) * grouped_gemm(rows, w_up, indptr)
    down = grouped_gemm(hidden, w_down, indptr) * weights.reshape(-1)[slot_index][:, None]
    out = shared_expert(tokens, shared_gate, shared_up, shared_down, shared_expert_gate, activation)
    np.add.at(out, token_index, down)
    return out.reshape(x.shape).astype(np.float32)


# ---- moe_route -----------------------------------------------------------------------------

def _route_infer(inputs, attrs):
    x, router, bias, logit_bias = pad_inputs(inputs, 4)
    check_routing_attrs({**attrs, "activation": "silu"})
    experts, d = attrs["experts"], x.shape[-1]
    expect(x.dtype.is_float and x.rank >= 2, f"moe_route: x must be float [..., d], got {dims.format_shape(x.shape)}")
    expect(router.rank == 2 and same_dims(router.shape[0], experts) and same_dims(router.shape[1], d),
           f"moe_route: router {dims.format_shape(router.shape)} should be [{experts},{d}]")
    expect(bias is None or (bias.rank == 1 and same_dims(bias.shape[0], experts)),
           f"moe_route: router_bias should be [{experts}]")
    expect(bias is None or attrs["scoring"] != "sparsemixer", "moe_route: sparsemixer routing takes no router_bias")
    expect(logit_bias is None or (logit_bias.rank == 1 and same_dims(logit_bias.shape[0], experts)),
           f"moe_route: router_logit_bias should be [{experts}]")
    shape = (dims.product(x.shape[:-1]), attrs["top_k"])
    return [TensorType(DType.i64, shape), TensorType(DType.f32, shape)]


def _route_reference(inputs, attrs):
    """Expert ids [N, k] (best first) and gating weights [N, k] of tokens x [..., d]."""
    x, router, bias, logit_bias = pad_inputs(inputs, 4)
    return list(route(x, router, bias, logit_bias=logit_bias, **routing_attrs(attrs)))


def _route_cost(inputs, outputs, attrs):
    """The router projection, 2 FLOPs per router weight per token; scoring and top-k apart."""
    x, router = inputs[:2]
    tokens = x.numel // x.shape[-1]
    return Cost(flops=2 * tokens * router.numel, other_flops=tokens * routing_other_flops(attrs),
                bytes_read=sum(t.nbytes for t in inputs if t is not None),
                bytes_written=sum(t.nbytes for t in outputs))


register(OpDef("moe_route", ("x", "router", "router_bias?", "router_logit_bias?"), dict(ROUTING_DEFAULTS),
               _route_infer, _route_reference, _route_cost))


# ---- moe_dispatch --------------------------------------------------------------------------

def _dispatch_infer(inputs, attrs):
    ids = inputs[0]
    experts, factor = attrs["experts"], attrs["capacity_factor"]
    expect(isinstance(experts, int) and experts > 0, f"moe_dispatch: experts must be a positive int, got {experts!r}")
    expect(factor is None or (isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 0),
           f"moe_dispatch: capacity_factor must be a positive number or null, got {factor!r}")
    expect(ids.dtype == DType.i64 and ids.rank == 2,
           f"moe_dispatch: expert_ids must be i64 [N,k], got {ids.dtype}{dims.format_shape(ids.shape)}")
    pairs = dims.mul(ids.shape[0], ids.shape[1])
    return [TensorType(DType.i64, (pairs,)), TensorType(DType.i64, (pairs,)), TensorType(DType.i64, (experts + 1,))]


def _dispatch_reference(inputs, attrs):
    """Token-slot pairs stably sorted by expert: token_index, slot_index and indptr."""
    return list(dispatch(inputs[0], attrs["experts"], attrs["capacity_factor"]))


def _dispatch_cost(inputs, outputs, attrs):
    """A counting sort: one step per pair and per expert; no matmul work."""
    return Cost(other_flops=inputs[0].numel + attrs["experts"], bytes_read=inputs[0].nbytes,
                bytes_written=sum(t.nbytes for t in outputs))


register(OpDef("moe_dispatch", ("expert_ids",), {"experts": REQUIRED, "capacity_factor": None}, _dispatch_infer,
               _dispatch_reference, _dispatch_cost))


# ---- grouped_gemm --------------------------------------------------------------------------

def _gemm_infer(inputs, attrs):
    rows, w, indptr = inputs
    experts, top_k = attrs["experts"], attrs["top_k"]
    expect(isinstance(experts, int) and experts > 0, f"grouped_gemm: experts must be a positive int, got {experts!r}")
    expect(isinstance(top_k, int) and 0 < top_k <= experts,
           f"grouped_gemm: top_k must be in 1..{experts}, got {top_k!r}")
    expect(rows.dtype.is_float and rows.rank == 2, f"grouped_gemm: rows must be float [M,in], got "
                                                   f"{rows.dtype}{dims.format_shape(rows.shape)}")
    expect(w.dtype.is_float and w.rank == 3 and same_dims(w.shape[0], experts) and same_dims(w.shape[2], rows.shape[1]),
           f"grouped_gemm: w {dims.format_shape(w.shape)} should be [{experts},out,{rows.shape[1]}]")
    expect(indptr.dtype == DType.i64 and indptr.rank == 1 and same_dims(indptr.shape[0], experts + 1),
           f"grouped_gemm: indptr must be i64 [{experts + 1}], got {indptr.dtype}{dims.format_shape(indptr.shape)}")
    return [TensorType(rows.dtype, (rows.shape[0], w.shape[1]))]


def _gemm_reference(inputs, attrs):
    """Segment GEMM: rows[indptr[e]:indptr[e+1]] @ w[e].T for each expert e, zeros elsewhere."""
    rows, weight, indptr = inputs
    return [grouped_gemm(rows, weight, indptr).astype(rows.dtype)]


def _gemm_cost(inputs, outputs, attrs):
    """Active work only: 2 FLOPs per row per weight of the one expert the row meets."""
    rows, w, indptr = inputs
    per_expert = w.numel // w.shape[0]
    active_bytes = w.nbytes * min(rows.shape[0], w.shape[0]) // w.shape[0]  # experts a batch can reach
    return Cost(flops=2 * rows.shape[0] * per_expert, bytes_read=rows.nbytes + active_bytes + indptr.nbytes,
                bytes_written=outputs[0].nbytes)


def _gemm_active_fraction(attrs: dict, operand: str) -> float:
    """One token's rows meet top_k of the experts' weights."""
    return attrs["top_k"] / attrs["experts"] if operand == "w" else 1.0


register(OpDef("grouped_gemm", ("rows", "w", "indptr"), {"experts": REQUIRED, "top_k": REQUIRED}, _gemm_infer,
               _gemm_reference, _gemm_cost, active_fraction=_gemm_active_fraction))
