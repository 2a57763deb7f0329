"""The ONNX Runtime flavour: ``com.microsoft`` ops where they compute what irc means.

- ``attention`` -> ``GroupQueryAttention`` (needs a past cache, causal attention and equal
  key/value head sizes; otherwise the standard path). Left padding: GQA's own masking
  reads ``seqlens_k`` as "row b holds seqlens_k[b] + 1 tokens from the left", which is
  right padding; the ONNX Runtime GenAI builder's graphs pass the real lengths there and
  go wrong on a left-padded row. Here every row is declared full (``seqlens_k = P+T-1``,
  ``query_seqlens = T``, so batched prefill and decode with a past both run) and the
  padding and window masks arrive as ``attention_bias`` (0 or float32 min, [B, 1, T, P+T];
  with ALiBi slopes the bias itself where visible, [B, H, T, P+T]), added after the softcap
  as in the reference. GQA masks causally itself (query t sees keys up to P + t), so the bias
  repeats the causal mask only beside a window or chunks, where it is built as one. Rows are then exact for
  every real token; a padding query row that sees no key is left unspecified (the
  standard path gives zeros there), which no real token reads.
  Because GQA updates a max-length cache in place when past and present share a buffer,
  genai_config.json turns ``past_present_share_buffer`` on for these graphs.
- ``rope`` -> ``com.microsoft.RotaryEmbedding`` with cos/sin tables of ``context`` rows
  (the longest position the model serves), computed at compile time with the reference's
  own ``rope_cos_sin``; a position at or past ``context`` is a run-time error in ORT
  ("Updating cos_cache and sin_cache ... is not currently supported"), not a wrong
  answer. Dynamic NTK scaling is refused, as in the standard path. LongRoPE: the tables
  hold the short set's ``context`` rows, then the long set's, and the rows read are
  ``position_ids + context`` when max(position_ids) + 1 > n (``rope_rows``): one Add per
  call instead of selecting between whole tables.
- ``add`` feeding an ``rms_norm`` -> ``SkipSimplifiedLayerNormalization`` (one node gives
  the residual sum and its norm); an ``rms_norm`` without a residual add ->
  ``RMSNormalization`` (opset 23) or primitives (ORT registers SimplifiedLayerNormalization
  only in the default domain, where onnx.checker does not know it).
- ``moe`` -> ``com.microsoft.MoE`` where it fits (``backends.onnx.moe``).

- ``dequant_linear`` (from the ``quantize`` pass) -> ``com.microsoft.MatMulNBits`` where its
  block size is a power of two >= 16 (``backends.onnx.quant``). A float model has no
  MatMulNBits: irc never quantizes unless asked.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from irc.dtypes import DType
from irc.graph import Graph, Node, Value
from irc.ops.rope import rope_cos_sin, rope_inv_freq, rope_switch
from irc.rewrite.epilogue import residual_norm

from backends.onnx import gqa_fuse, portable
from backends.onnx.attention import (NEG, alibi_bias, attention_operands, check_scaling, head_sink, longrope_selected,
                                     lower_attention, lower_rope, visibility)
from backends.onnx.builder import MS_DOMAIN, ONNX_TYPES, Builder
from backends.onnx.fits import gqa_fits
from backends.onnx.moe import lower_moe_ort
from backends.onnx.quant import accuracy_level
from backends.onnx.quant_pack import packed_matmul, stacked


def _lengths(b: Builder, batch, seq, total) -> tuple[str, str, str]:
    """seqlens_k (P+T-1 for every row), total_sequence_length and query_seqlens (T), int32."""
    def make():
        rows = b.dim(batch)
        last = b.op("Sub", [b.dim(total), b.i64([1])], "gqa/last_index")
        seqlens_k = b.op("Cast", [b.op("Expand", [last, rows], "gqa/seqlens_k64")], "gqa/seqlens_k",
                         to=TensorProto.INT32)
        total_len = b.op("Cast", [b.scalar(total)], "gqa/total_sequence_length", to=TensorProto.INT32)
        query = b.op("Cast", [b.op("Expand", [b.dim(seq), rows], "gqa/query_seqlens64")], "gqa/query_seqlens",
                     to=TensorProto.INT32)
        return seqlens_k, total_len, query

    return b.cached(("gqa-lengths", batch, seq, total), make)


def packed_qkv(b: Builder, entry: gqa_fuse.Absorbed, out: str) -> str:
    """The packed projection: MatMul of the shared activation by the q|k|v weight, or one
    MatMulNBits over the q|k|v codes."""
    if entry.projections[0].op == "dequant_linear":
        return packed_matmul(b, list(entry.projections), accuracy_level(entry.projections[0].attrs))
    weights = [p.inputs[1] for p in entry.projections]
    packed = b.converted(stacked(b, weights, f"{weights[0].name}+kv"), weights[0].dtype, DType.f32)
    return portable.stored_matmul(b, b.value(entry.projections[0].inputs[0]), packed, b.fresh(f"{out}/qkv"))


def lower_attention_ort(b: Builder, node: Node, outs: list[str]) -> None:
    if gqa_fits(node) is not None:
        lower_attention(b, node, outs)
        return
    o, a = attention_operands(node), node.attrs
    # GQA is causal itself (query t sees keys up to seqlens_k - T + 1 + t, every row full), so
    # without a window or chunks the bias carries the padding alone: fewer nodes per step
    plain = a["window"] is None and a.get("chunk") is None
    visible = visibility(b, o["mask"], o["seq"], o["total"], not plain, a["window"], chunk=a.get("chunk"))
    alibi = alibi_bias(b, o["alibi"], o["heads"], o["seq"], o["total"])
    bias = b.cached(("gqa-bias", visible, alibi), lambda: b.op(
        "Where", [visible, alibi or b.const(0.0, np.float32, "zero"), b.const(NEG, np.float32, "mask/neg")],
        f"{alibi or visible}/bias"))
    if o["q"].dtype != DType.f32:
        bias = b.op("Cast", [bias], f"{bias}.{o['q'].dtype}", to=TensorProto.FLOAT16)
    seqlens_k, total_len, query_seqlens = _lengths(b, o["batch"], o["seq"], o["total"])
    fused = gqa_fuse.plan(b).get(id(node), gqa_fuse.Absorbed())
    qkv, rotary = _gqa_operands(b, node, fused, outs[0])
    inputs = [*qkv, *(b.value(o[name]) for name in ("past_key", "past_value"))]
    inputs += [seqlens_k, total_len, *rotary, bias, head_sink(b, node), "", "", "", "", query_seqlens]
    b.node("GroupQueryAttention", inputs, outs, domain=MS_DOMAIN, num_heads=o["heads"], kv_num_heads=o["kv_heads"],
           scale=float(o["scale"]), softcap=None if a["softcap"] is None else float(a["softcap"]),
           local_window_size=a["window"], do_rotary=1 if fused.rope_q else None,
           rotary_interleaved=int(fused.rope_q.attrs["convention"] == "interleaved") if fused.rope_q else None)


def _gqa_operands(b: Builder, node: Node, fused, hint: str) -> tuple[list, list]:
    """GQA's query/key/value inputs (packed or three) and its cos_cache, sin_cache and
    position_ids inputs (empty without ``do_rotary``), per ``backends.onnx.gqa_fuse``."""
    q, k, v = node.inputs[:3]
    if fused.rope_q:
        q, k = fused.rope_q.inputs[0], fused.rope_k.inputs[0]
    qkv = ([packed_qkv(b, fused, hint), "", ""] if fused.projections else
           [b.value(q), b.value(k), b.value(v)])
    if not fused.rope_q:
        return qkv, ["", "", ""]
    a = fused.rope_q.attrs
    return qkv, rope_cache(b, a["head_dim"], a["base"], a["scaling"], q.dtype, fused.rope_q.inputs[1])


def rope_cache(b: Builder, rotary: int, base: float, scaling, dtype: DType, position_ids: Value) -> list[str]:
    """cos/sin [context, rotary/2] for positions 0..context-1 and the rows to read
    (``position_ids``; LongRoPE: both sets' rows and ``rope_rows``)."""
    check_scaling("rope", scaling)
    inv_freq, factor = rope_inv_freq(rotary, base, scaling)
    positions = np.arange(b.context)[None, :]
    cos, sin = (table[0] for table in rope_cos_sin(positions, inv_freq, factor))
    switch = rope_switch(rotary, base, scaling)
    if switch is not None and b.context <= switch[2]:
        switch = None  # every position served is below n: the long set never applies
    if switch is not None:
        long_cos, long_sin = (table[0] for table in rope_cos_sin(positions, switch[1], factor))
        cos, sin = np.concatenate([cos, long_cos]), np.concatenate([sin, long_sin])
    hint = f"rope/{rotary}/{base:g}"
    rows = b.value(position_ids) if switch is None else rope_rows(b, position_ids, switch[2])
    return [b.const(cos.astype(dtype.numpy), dtype.numpy, f"{hint}/cos_cache"),
            b.const(sin.astype(dtype.numpy), dtype.numpy, f"{hint}/sin_cache"), rows]


def rope_rows(b: Builder, position_ids: Value, original: int) -> str:
    """position_ids, plus ``context`` when LongRoPE's long set applies (its rows follow)."""
    def make():
        long = b.op("Cast", [longrope_selected(b, position_ids, original)], "rope/long_rows",
                    to=ONNX_TYPES[position_ids.dtype])
        offset = b.op("Mul", [long, b.const(b.context, position_ids.dtype.numpy, "rope/context")], "rope/row_offset")
        return b.op("Add", [b.value(position_ids), offset], "rope/rows")

    return b.cached(("rope-rows", position_ids.name, original), make)


def lower_rope_ort(b: Builder, node: Node, outs: list[str]) -> None:
    x, position_ids = node.inputs
    a = node.attrs
    if gqa_fuse.absorbed(b, node):
        return
    if x.dtype not in (DType.f32, DType.f16) or a.get("mrope"):  # RotaryEmbedding reads one position axis
        lower_rope(b, node, outs)
        return
    head_dim = a["head_dim"]
    rotary = head_dim if a["rotary_dim"] is None else a["rotary_dim"]
    cos, sin, rows = rope_cache(b, rotary, a["base"], a["scaling"], x.dtype, position_ids)
    b.node("RotaryEmbedding", [b.value(x), rows, cos, sin], outs, domain=MS_DOMAIN,
           interleaved=int(a["convention"] == "interleaved"), num_heads=x.shape[-1] // head_dim,
           rotary_embedding_dim=rotary)


def skip_norms(graph: Graph) -> dict:
    """id(add node) -> the rms_norm it feeds, for every residual add + RMS norm pair
    (``irc.rewrite.epilogue.residual_norm``) that SkipSimplifiedLayerNormalization computes
    in one node: f32 or f16, rank 2 or 3, each add paired once."""
    pairs = {}
    for node in graph.nodes:
        add = residual_norm(node) if node.op == "rms_norm" else None
        if add is None or id(add) in pairs:
            continue
        x = add.inputs[0]
        if x.dtype in (DType.f32, DType.f16) and len(x.shape) in (2, 3):
            pairs[id(add)] = node
    return pairs


def lower_add_ort(b: Builder, node: Node, outs: list[str]) -> None:
    norm = b.cached(("skip-norms",), lambda: skip_norms(b.graph)).get(id(node))
    if norm is None:
        portable.lower_elementwise(b, node, outs)
        return
    x, weight = norm.inputs
    scale = portable.norm_scale(b, weight, norm.attrs["offset"], x.dtype, b.name_for(norm.outputs[0]))
    b.node("SkipSimplifiedLayerNormalization", [*(b.value(v) for v in node.inputs), scale],
           [b.name_for(norm.outputs[0]), "", "", outs[0]], domain=MS_DOMAIN, epsilon=float(norm.attrs["eps"]))
    b.handled.add(id(norm))


def lower_linear_ort(b: Builder, node: Node, outs: list[str]) -> None:
    if not gqa_fuse.absorbed(b, node):
        portable.lower_linear(b, node, outs)


def lower_rms_norm_ort(b: Builder, node: Node, outs: list[str]) -> None:
    x, weight = node.inputs
    portable.rms_norm(b, b.value(x), weight, node.attrs["eps"], node.attrs["offset"], x.dtype, outs[0])


OVERRIDES = {"attention": lower_attention_ort, "rope": lower_rope_ort, "add": lower_add_ort,
             "rms_norm": lower_rms_norm_ort, "moe": lower_moe_ort, "linear": lower_linear_ort}
