"""``mla_attention`` (DeepSeek-V2/V3 multi-head latent attention, un-absorbed) in standard ops.

The same steps as ``irc.ops.attention.mla_attention``: queries (direct, or low-rank through
``q_a``, an RMS norm and ``q_b``), the compressed latent c_kv and the shared RoPE key from
``kv_a``, per-head keys and values from ``kv_b``, RoPE on the decoupled part (interleaved
or half, YaRN factor included), then attention over the head-major cache [B, H, P+T, D]
(nope + rope for keys, v_head_dim for values) with the YaRN-corrected softmax scale, and
``wo``. At opset 23 the attention itself is one ``Attention`` node (4-D form: head sizes of
keys and values differ, which GroupQueryAttention cannot take, so the ORT flavour uses the
same path); before it, the written-out form of ``backends.onnx.attention``.

``mla_absorbed_attention`` (after ``mla-absorb``) reuses the same pieces: queries through
the absorbed weights, the latent and the shared RoPE key appended to their own caches
(``past_key_values.{i}.key`` [B, 1, P, d_c] and ``.value`` [B, 1, P, rope]), multi-query
attention over [latent | RoPE key] with the latent as value, and the absorbed ``wo``.
Its caches differ in width, so genai gets no config (as for un-absorbed MLA).
"""
from __future__ import annotations

from irc import dims
from irc.graph import Node
from irc.ops.attention import MLA_OPERANDS, mla_softmax_scale
from irc.ops.mla import OPERANDS as ABSORBED_OPERANDS
from irc.ops.registry import by_name

from backends.onnx.attention import attend_heads, heads_first, merge_heads, rope_tables, rotate_heads, visibility
from backends.onnx.builder import Builder
from backends.onnx.portable import linear, rms_norm, slice_


def lower_mla_attention(b: Builder, node: Node, outs: list[str]) -> None:
    ops = by_name(MLA_OPERANDS, node.inputs)
    a = node.attrs
    x_value = ops["x"]
    x = b.value(x_value)
    batch, seq = x_value.shape[:2]
    heads, nope, rope_dim, v_dim = a["heads"], a["qk_nope_head_dim"], a["qk_rope_head_dim"], a["v_head_dim"]
    rope = a["rope"]
    convention = rope.get("convention", "half")
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
    cos, sin = rope_tables(b, ops["position_ids"], rope_dim, rope["base"], rope.get("scaling"), x_value.dtype)
    q_nope = slice_(b, q4, 0, nope, 3, b.fresh(f"{name}/q_nope"))
    q_pe = slice_(b, q4, nope, nope + rope_dim, 3, b.fresh(f"{name}/q_pe"))
    q_pe = rotate_heads(b, q_pe, (batch, heads, seq, rope_dim), cos, sin, convention, b.fresh(f"{name}/q_pe_rotated"))
    query = b.op("Concat", [q_nope, q_pe], f"{name}/query", axis=3)

    # latent c_kv [B, T, rank] and the shared RoPE key [B, 1, T, rope]
    rank = a["kv_lora_rank"]
    compressed = linear(b, x, x_value.dtype, ops["kv_a"], None, b.fresh(f"{name}/kv_a"))
    c_kv = slice_(b, compressed, 0, rank, 2, b.fresh(f"{name}/c_kv_raw"))
    c_kv = rms_norm(b, c_kv, ops["kv_a_norm"], a["eps"], 0.0, x_value.dtype, b.fresh(f"{name}/c_kv"))
    k_pe = slice_(b, compressed, rank, rank + rope_dim, 2, b.fresh(f"{name}/k_pe_raw"))
    k_pe = b.op("Unsqueeze", [k_pe, b.i64([1])], f"{name}/k_pe_head")
    k_pe = rotate_heads(b, k_pe, (batch, 1, seq, rope_dim), cos, sin, convention, b.fresh(f"{name}/k_pe"))
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


def lower_mla_absorbed_attention(b: Builder, node: Node, outs: list[str]) -> None:
    """Absorbed MLA (``irc.ops.mla``): multi-query attention of H heads of width d_c + rope
    over the key [latent | rotated RoPE key] and the value ``latent``, one KV head. The two
    caches are concatenated apart ([B, 1, P+T, d_c] and [B, 1, P+T, rope], the presents)
    and joined along the width for the key; attention then has no past of its own."""
    ops = by_name(ABSORBED_OPERANDS, node.inputs)
    a = node.attrs
    x_value = ops["x"]
    x, dtype = b.value(x_value), x_value.dtype
    batch, seq = x_value.shape[:2]
    heads, rank, rope_dim = a["heads"], a["kv_lora_rank"], a["qk_rope_head_dim"]
    rope = a["rope"]
    convention = rope.get("convention", "half")
    name = outs[0]
    shape = dict(batch=batch, seq=seq)

    # queries [B, H, T, d_c + rope]: W^UK already folded into the latent rows
    if ops["wq_absorbed"] is not None:
        q = linear(b, x, dtype, ops["wq_absorbed"], None, b.fresh(f"{name}/q"))
    else:
        q_a = linear(b, x, dtype, ops["q_a"], None, b.fresh(f"{name}/q_a"))
        q_a = rms_norm(b, q_a, ops["q_a_norm"], a["eps"], 0.0, dtype, b.fresh(f"{name}/q_a_norm"))
        q = linear(b, q_a, dtype, ops["q_b_absorbed"], None, b.fresh(f"{name}/q"))
    q4 = heads_first(b, q, heads=heads, width=rank + rope_dim, out=b.fresh(f"{name}/q_heads"), **shape)
    cos, sin = rope_tables(b, ops["position_ids"], rope_dim, rope["base"], rope.get("scaling"), dtype)
    q_latent = slice_(b, q4, 0, rank, 3, b.fresh(f"{name}/q_latent"))
    q_pe = slice_(b, q4, rank, rank + rope_dim, 3, b.fresh(f"{name}/q_pe"))
    q_pe = rotate_heads(b, q_pe, (batch, heads, seq, rope_dim), cos, sin, convention, b.fresh(f"{name}/q_pe_rotated"))
    query = b.op("Concat", [q_latent, q_pe], f"{name}/query", axis=3)

    # the new latent [B, 1, T, d_c] and rotated RoPE key [B, 1, T, rope], appended to the caches
    compressed = linear(b, x, dtype, ops["kv_a"], None, b.fresh(f"{name}/kv_a"))
    c_kv = slice_(b, compressed, 0, rank, 2, b.fresh(f"{name}/c_kv_raw"))
    c_kv = rms_norm(b, c_kv, ops["kv_a_norm"], a["eps"], 0.0, dtype, b.fresh(f"{name}/c_kv"))
    latent = b.op("Unsqueeze", [c_kv, b.i64([1])], f"{name}/latent_new")
    k_pe = slice_(b, compressed, rank, rank + rope_dim, 2, b.fresh(f"{name}/k_pe_raw"))
    k_pe = b.op("Unsqueeze", [k_pe, b.i64([1])], f"{name}/k_pe_head")
    k_pe = rotate_heads(b, k_pe, (batch, 1, seq, rope_dim), cos, sin, convention, b.fresh(f"{name}/k_pe"))
    past_latent, past_rope = ops["past_latent"], ops["past_rope"]
    total = seq
    if past_latent is not None:
        latent = b.node("Concat", [b.value(past_latent), latent], outs[1:2], axis=2)[0]
        k_pe = b.node("Concat", [b.value(past_rope), k_pe], outs[2:3], axis=2)[0]
        total = dims.add(past_latent.shape[2], seq)
    key = b.op("Concat", [latent, k_pe], f"{name}/key", axis=3)

    visible = visibility(b, ops["attention_mask"], seq, total, a["causal"], None)
    scale = mla_softmax_scale(a["qk_nope_head_dim"], rope_dim, rope, a["scale"])
    out4 = attend_heads(b, query, key, latent, (), [], visible, heads=heads, kv_heads=1, head_dim=rank + rope_dim,
                        v_head_dim=rank, scale=scale, cap=None, out=b.fresh(f"{name}/heads"), **shape)
    merged = merge_heads(b, out4, heads=heads, width=rank, out=b.fresh(f"{name}/merged"), **shape)
    linear(b, merged, dtype, ops["wo_absorbed"], None, name)
