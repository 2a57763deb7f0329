"""``mla_attention`` (DeepSeek-V2/V3 multi-head latent attention, un-absorbed) in standard ops.

The same steps as ``irc.ops.attention.mla_attention``: queries (direct, or low-rank through
``q_a``, an RMS norm and ``q_b``), the compressed latent c_kv and the shared RoPE key from
``kv_a``, per-head keys and values from ``kv_b``, RoPE on the decoupled part (interleaved
or half, YaRN factor included), then attention over the head-major cache [B, H, P+T, D]
(nope + rope for keys, v_head_dim for values) with the YaRN-corrected softmax scale, and
``wo``. With the op's ``rope`` None (Kimi-Linear's NoPE MLA) nothing rotates and no RoPE
tables are built: the "rope" columns are plain shared key dims. At opset 23 the attention itself is one ``Attention`` node (4-D form: head sizes of
keys and values differ, which GroupQueryAttention cannot take, so the ORT flavour uses the
same path); before it, the written-out form of ``backends.onnx.attention``.

``mla_absorbed_attention`` (after ``mla-absorb``) reuses the same pieces: queries through
the absorbed weights, the latent and the shared RoPE key appended to their own caches
(``past_key_values.{i}.key`` [B, 1, P, d_c] and ``.value`` [B, 1, P, rope]), multi-query
attention over [latent | RoPE key] with the latent as value, and the absorbed ``wo``.
Its caches differ in width, so genai gets no config (as for un-absorbed MLA).

``mla_latent_attention`` (``mla-absorb``'s default) shares that attention and adds two
batched MatMuls over heads: q_nope [B, H, T, nope] x W^UK [H, nope, d_c] before it, and
[B, H, T, d_c] x W^UV^T [H, d_c, v] after it, then the checkpoint's ``wo``.
"""
from __future__ import annotations

import numpy as np

from irc import dims
from irc.graph import Node
from irc.ops.attention import MLA_OPERANDS, mla_softmax_scale
from irc.ops.mla import OPERANDS as ABSORBED_OPERANDS
from irc.ops.mla_latent import OPERANDS as LATENT_OPERANDS
from irc.ops.registry import by_name

from backends.onnx.attention import attend_heads, heads_first, merge_heads, rope_tables, rotate_heads, visibility
from backends.onnx.builder import Builder
from backends.onnx.portable import linear, rms_norm, slice_


def _tables(b: Builder, ops: dict, a: dict, dtype) -> tuple:
    """cos and sin for the op's RoPE, or (None, None) where ``rope`` is None."""
    rope = a["rope"]
    if rope is None:
        return None, None
    return rope_tables(b, ops["position_ids"], a["qk_rope_head_dim"], rope["base"], rope.get("scaling"), dtype)


def _rotated(b: Builder, x4: str, shape4: tuple, cos, sin, rope, out: str) -> str:
    """RoPE on [B, N, T, rope] in the op's convention; ``x4`` unchanged without RoPE."""
    if rope is None:
        return x4
    return rotate_heads(b, x4, shape4, cos, sin, rope.get("convention", "half"), out)


def lower_mla_attention(b: Builder, node: Node, outs: list[str]) -> None:
    ops = by_name(MLA_OPERANDS, node.inputs)
    a = node.attrs
    x_value = ops["x"]
    x = b.value(x_value)
    batch, seq = x_value.shape[:2]
    heads, nope, rope_dim, v_dim = a["heads"], a["qk_nope_head_dim"], a["qk_rope_head_dim"], a["v_head_dim"]
    rope = a["rope"]
    name = outs[0]
    shape = dict(batch=batch, seq=seq)

    # queries [B, H, T, nope + rope], RoPE on the last rope dims
    if ops["wq"] is not None:
        q = linear(b, x, x_value.dtype, ops["wq"], None, b.fresh(f"{name}/q"))
    else:
        q_a = linear(b, x, x_value.dtype, ops["q_a"], None, b.fresh(f"{name}/q_a"))
        q_a = rms_norm(b, q_a, ops["q_a_norm"], a["eps"], 0.0, x_value.dtype, b.fresh(f"{name}/q_a_norm"))
        q = linear(b, q_a, x_value.dtype, ops["q_b"], None, b.fresh(f"{name}/q"))
    q4 = heads_first(b, q, heads=heads, width=nope + rope_dim, out=b.fresh(f"{name}/q_heads"), **shape)
    cos, sin = _tables(b, ops, a, x_value.dtype)
    if rope is None:
        query = q4
    else:
        q_nope = slice_(b, q4, 0, nope, 3, b.fresh(f"{name}/q_nope"))
        q_pe = slice_(b, q4, nope, nope + rope_dim, 3, b.fresh(f"{name}/q_pe"))
        q_pe = _rotated(b, q_pe, (batch, heads, seq, rope_dim), cos, sin, rope, b.fresh(f"{name}/q_pe_rotated"))
        query = b.op("Concat", [q_nope, q_pe], f"{name}/query", axis=3)

    # latent c_kv [B, T, rank] and the shared RoPE key [B, 1, T, rope]
    rank = a["kv_lora_rank"]
    compressed = linear(b, x, x_value.dtype, ops["kv_a"], None, b.fresh(f"{name}/kv_a"))
    c_kv = slice_(b, compressed, 0, rank, 2, b.fresh(f"{name}/c_kv_raw"))
    c_kv = rms_norm(b, c_kv, ops["kv_a_norm"], a["eps"], 0.0, x_value.dtype, b.fresh(f"{name}/c_kv"))
    k_pe = slice_(b, compressed, rank, rank + rope_dim, 2, b.fresh(f"{name}/k_pe_raw"))
    k_pe = b.op("Unsqueeze", [k_pe, b.i64([1])], f"{name}/k_pe_head")
    k_pe = _rotated(b, k_pe, (batch, 1, seq, rope_dim), cos, sin, rope, b.fresh(f"{name}/k_pe"))
    k_pe = b.op("Expand", [k_pe, b.i64([1, heads, 1, 1])], f"{name}/k_pe_heads")

    # per-head keys and values from the latent
    kv = linear(b, c_kv, x_value.dtype, ops["kv_b"], None, b.fresh(f"{name}/kv"))
    kv4 = heads_first(b, kv, heads=heads, width=nope + v_dim, out=b.fresh(f"{name}/kv_heads"), **shape)
    k_nope = slice_(b, kv4, 0, nope, 3, b.fresh(f"{name}/k_nope"))
    value = slice_(b, kv4, nope, nope + v_dim, 3, b.fresh(f"{name}/value"))
    key = b.op("Concat", [k_nope, k_pe], f"{name}/key", axis=3)

    past_key, past_value = ops["past_key"], ops["past_value"]
    past = () if past_key is None else (b.value(past_key), b.value(past_value))
    total = seq if past_key is None else dims.add(past_key.shape[2], seq)
    visible = visibility(b, ops["attention_mask"], seq, total, a["causal"], None)
    scale = mla_softmax_scale(nope, rope_dim, rope, a["scale"])
    out4 = attend_heads(b, query, key, value, past, outs[1:], visible, heads=heads, kv_heads=heads,
                        head_dim=nope + rope_dim, v_head_dim=v_dim, scale=scale, cap=None,
                        out=b.fresh(f"{name}/heads"), **shape)
    merged = merge_heads(b, out4, heads=heads, width=v_dim, out=b.fresh(f"{name}/merged"), **shape)
    linear(b, merged, x_value.dtype, ops["wo"], None, name)


def _project_query(b: Builder, ops: dict, a: dict, x: str, dtype, wq: str, q_b: str, name: str) -> str:
    """The query projection [B, T, H*W]: ``ops[wq]`` directly, or q_a, its RMS norm, ``ops[q_b]``."""
    if ops[wq] is not None:
        return linear(b, x, dtype, ops[wq], None, b.fresh(f"{name}/q"))
    q_a = linear(b, x, dtype, ops["q_a"], None, b.fresh(f"{name}/q_a"))
    q_a = rms_norm(b, q_a, ops["q_a_norm"], a["eps"], 0.0, dtype, b.fresh(f"{name}/q_a_norm"))
    return linear(b, q_a, dtype, ops[q_b], None, b.fresh(f"{name}/q"))


def _latent_attention(b: Builder, ops: dict, a: dict, query: str, cos: str, sin: str, outs: list[str]) -> str:
    """Multi-query attention of the latent queries [B, H, T, d_c + rope] over the key
    [latent | rotated RoPE key] and the value ``latent``, one KV head; returns [B, H, T, d_c].
    The two caches are concatenated apart ([B, 1, P+T, d_c] and [B, 1, P+T, rope], the
    presents) and joined along the width for the key; attention then has no past of its own."""
    x_value = ops["x"]
    x, dtype = b.value(x_value), x_value.dtype
    batch, seq = x_value.shape[:2]
    heads, rank, rope_dim = a["heads"], a["kv_lora_rank"], a["qk_rope_head_dim"]
    name = outs[0]
    compressed = linear(b, x, dtype, ops["kv_a"], None, b.fresh(f"{name}/kv_a"))
    c_kv = slice_(b, compressed, 0, rank, 2, b.fresh(f"{name}/c_kv_raw"))
    c_kv = rms_norm(b, c_kv, ops["kv_a_norm"], a["eps"], 0.0, dtype, b.fresh(f"{name}/c_kv"))
    latent = b.op("Unsqueeze", [c_kv, b.i64([1])], f"{name}/latent_new")
    k_pe = slice_(b, compressed, rank, rank + rope_dim, 2, b.fresh(f"{name}/k_pe_raw"))
    k_pe = b.op("Unsqueeze", [k_pe, b.i64([1])], f"{name}/k_pe_head")
    k_pe = _rotated(b, k_pe, (batch, 1, seq, rope_dim), cos, sin, a["rope"], b.fresh(f"{name}/k_pe"))
    past_latent, past_rope = ops["past_latent"], ops["past_rope"]
    total = seq
    if past_latent is not None:
        latent = b.node("Concat", [b.value(past_latent), latent], outs[1:2], axis=2)[0]
        k_pe = b.node("Concat", [b.value(past_rope), k_pe], outs[2:3], axis=2)[0]
        total = dims.add(past_latent.shape[2], seq)
    key = b.op("Concat", [latent, k_pe], f"{name}/key", axis=3)
    visible = visibility(b, ops["attention_mask"], seq, total, a["causal"], None)
    scale = mla_softmax_scale(a["qk_nope_head_dim"], rope_dim, a["rope"], a["scale"])
    if b.opset < 23:
        return attend_heads(b, query, key, latent, (), [], visible, heads=heads, kv_heads=1,
                            head_dim=rank + rope_dim, v_head_dim=rank, scale=scale, cap=None,
                            out=b.fresh(f"{name}/heads"), batch=batch, seq=seq)
    # every head reads the one latent "KV head": the heads become query rows [B, 1, H*T, .] of
    # single-head attention (as FlashMLA does), so no runtime repeats the cache per head
    rows = b.op("Reshape", [query, b.shape((batch, 1, dims.mul(heads, seq), rank + rope_dim))], f"{name}/q_rows",
                allowzero=1)
    if visible:
        visible = b.cached(("head rows", visible, heads), lambda: b.op(
            "Tile", [visible, b.i64([1, 1, heads, 1])], f"{visible}/head_rows"))
    out = b.op("Attention", [rows, key, latent, visible], f"{name}/rows", scale=float(scale), is_causal=0)
    return b.op("Reshape", [out, b.shape((batch, heads, seq, rank))], f"{name}/heads", allowzero=1)


def _latent_query(b: Builder, ops: dict, a: dict, name: str, weights: tuple, width: int, first: str,
                  to_latent) -> tuple:
    """The query of both absorbed forms, [B, H, T, d_c + rope]: the projection (``weights``:
    the names of the direct and the low-rank query weight) split per head into its first
    ``width`` columns, taken into latent space by ``to_latent`` (nothing when W^UK is folded
    in), and the RoPE part, rotated (not without RoPE); with the RoPE tables (cos, sin; None
    without RoPE) the key shares."""
    x_value = ops["x"]
    x, dtype = b.value(x_value), x_value.dtype
    batch, seq = x_value.shape[:2]
    heads, rope_dim, rope = a["heads"], a["qk_rope_head_dim"], a["rope"]
    q = _project_query(b, ops, a, x, dtype, *weights, name)
    q4 = heads_first(b, q, heads=heads, width=width + rope_dim, out=b.fresh(f"{name}/q_heads"), batch=batch, seq=seq)
    cos, sin = _tables(b, ops, a, dtype)
    q_latent = to_latent(slice_(b, q4, 0, width, 3, b.fresh(f"{name}/{first}")))
    q_pe = slice_(b, q4, width, width + rope_dim, 3, b.fresh(f"{name}/q_pe"))
    q_pe = _rotated(b, q_pe, (batch, heads, seq, rope_dim), cos, sin, rope, b.fresh(f"{name}/q_pe_rotated"))
    return b.op("Concat", [q_latent, q_pe], f"{name}/query", axis=3), cos, sin


def lower_mla_absorbed_attention(b: Builder, node: Node, outs: list[str]) -> None:
    """Absorbed MLA with folded weights (``irc.ops.mla``): the query through the absorbed
    weight is already latent; attention over the latent (``_latent_attention``), then the
    absorbed ``wo``."""
    ops, a, name = by_name(ABSORBED_OPERANDS, node.inputs), node.attrs, outs[0]
    batch, seq = ops["x"].shape[:2]
    query, cos, sin = _latent_query(b, ops, a, name, ("wq_absorbed", "q_b_absorbed"), a["kv_lora_rank"], "q_latent",
                                    lambda q_latent: q_latent)  # W^UK already folded into the latent rows
    out4 = _latent_attention(b, ops, a, query, cos, sin, outs)
    merged = merge_heads(b, out4, heads=a["heads"], width=a["kv_lora_rank"], out=b.fresh(f"{name}/merged"),
                         batch=batch, seq=seq)
    linear(b, merged, ops["x"].dtype, ops["wo_absorbed"], None, name)


def lower_mla_latent_attention(b: Builder, node: Node, outs: list[str]) -> None:
    """MLA absorbed at run time (``irc.ops.mla_latent``): the query's nope part goes into
    latent space by one batched MatMul over heads with W^UK [H, nope, d_c]; attention over the
    latent (``_latent_attention``); the result [B, H, T, d_c] comes back out by one batched
    MatMul with W^UV stored per head as [H, d_c, v] (the same elements as the checkpoint's
    W^UV, laid out for MatMul as linear weights are); then ``wo``. No per-head loops."""
    ops, a, name = by_name(LATENT_OPERANDS, node.inputs), node.attrs, outs[0]
    dtype = ops["x"].dtype
    batch, seq = ops["x"].shape[:2]
    heads, rank, v_dim = a["heads"], a["kv_lora_rank"], a["v_head_dim"]
    query, cos, sin = _latent_query(b, ops, a, name, ("wq", "q_b"), a["qk_nope_head_dim"], "q_nope", lambda q_nope: b.op(
        "MatMul", [q_nope, b.weight(ops["w_uk"], dtype=dtype)], f"{name}/q_latent"))
    out4 = _latent_attention(b, ops, a, query, cos, sin, outs)
    w_uv = ops["w_uv"]
    w_uv_t = b.converted(b.derived(f"{w_uv.name}.T", w_uv.dtype, (heads, rank, v_dim), (w_uv,), heads_transposed),
                         w_uv.dtype, dtype)
    out_v = b.op("MatMul", [out4, w_uv_t], f"{name}/heads_v")
    merged = merge_heads(b, out_v, heads=heads, width=v_dim, out=b.fresh(f"{name}/merged"), batch=batch, seq=seq)
    linear(b, merged, dtype, ops["wo"], None, name)


def heads_transposed(array) -> np.ndarray:
    """[H, v, d_c] -> [H, d_c, v], contiguous: W^UV per head as MatMul's right operand."""
    return np.ascontiguousarray(np.swapaxes(np.asarray(array), 1, 2))
