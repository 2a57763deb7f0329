"""``mla_attention`` (DeepSeek's multi-head latent attention, un-absorbed) for onnx-npu.

The steps of ``backends.onnx.mla.lower_mla_attention`` with static shapes: queries (direct
or low-rank with an RMS norm), the latent and the shared RoPE key from ``kv_a``, per-head
keys and values from ``kv_b``, RoPE from gathered tables on the decoupled part; then the
new keys [1, H, T, nope + rope] and values [1, H, T, v] are the ``present`` outputs, appended
to the fixed cache and attended with the additive mask (``backends.onnx_npu.lower.attend``,
one query head per cache head). The cache holds the decompressed keys and values, as the
un-absorbed op's cache does.
"""
from __future__ import annotations

from irc.errors import BackendError
from irc.graph import Node
from irc.ops.attention import MLA_OPERANDS, mla_softmax_scale
from irc.ops.registry import by_name

from backends.onnx.attention import heads_first, merge_heads, rotate
from backends.onnx.portable import linear, rms_norm, slice_
from backends.onnx_npu.lower import NpuBuilder, attend, gathered_rope, grouped_mask


def _rotate_heads(b: NpuBuilder, x4: str, shape4: tuple, cos: str, sin: str, convention: str, out: str) -> str:
    """RoPE on [1, N, T, R] with gathered cos/sin [1, T, R/2]."""
    cos4 = b.cached(("unsqueeze1", cos), lambda: b.op("Unsqueeze", [cos, b.i64([1])], f"{cos}/bhtr"))
    sin4 = b.cached(("unsqueeze1", sin), lambda: b.op("Unsqueeze", [sin, b.i64([1])], f"{sin}/bhtr"))
    return rotate(b, x4, shape4, cos4, sin4, convention, shape4[-1], out)


def lower_mla_attention(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    ops = by_name(MLA_OPERANDS, node.inputs)
    a = node.attrs
    if ops["past_key"] is None or not a["causal"]:
        raise BackendError("onnx-npu MLA needs a causal attention with a KV cache (the decoder form)")
    x_value = ops["x"]
    x, dtype = b.value(x_value), x_value.dtype
    tokens = b.size(x_value.shape[1])
    heads, nope, rope_dim, v_dim = a["heads"], a["qk_nope_head_dim"], a["qk_rope_head_dim"], a["v_head_dim"]
    rope = a["rope"]  # None: MLA without RoPE (Kimi-Linear), nothing rotated
    convention = rope.get("convention", "half") if rope else "half"
    name = outs[0]
    shape = dict(batch=1, seq=tokens)

    if ops["wq"] is not None:
        q = linear(b, x, dtype, ops["wq"], None, b.fresh(f"{name}/q"))
    else:
        q_a = linear(b, x, dtype, ops["q_a"], None, b.fresh(f"{name}/q_a"))
        q_a = rms_norm(b, q_a, ops["q_a_norm"], a["eps"], 0.0, dtype, b.fresh(f"{name}/q_a_norm"))
        q = linear(b, q_a, dtype, ops["q_b"], None, b.fresh(f"{name}/q"))
    q4 = heads_first(b, q, heads=heads, width=nope + rope_dim, out=b.fresh(f"{name}/q_heads"), **shape)
    if rope:
        cos, sin = gathered_rope(b, ops["position_ids"], rope_dim, rope["base"], rope.get("scaling"), dtype)
        q_nope = slice_(b, q4, 0, nope, 3, b.fresh(f"{name}/q_nope"))
        q_pe = slice_(b, q4, nope, nope + rope_dim, 3, b.fresh(f"{name}/q_pe"))
        q_pe = _rotate_heads(b, q_pe, (1, heads, tokens, rope_dim), cos, sin, convention,
                             b.fresh(f"{name}/q_pe_rot"))
        query = b.op("Concat", [q_nope, q_pe], f"{name}/query", axis=3)
    else:
        query = q4

    rank = a["kv_lora_rank"]
    compressed = linear(b, x, dtype, ops["kv_a"], None, b.fresh(f"{name}/kv_a"))
    c_kv = slice_(b, compressed, 0, rank, 2, b.fresh(f"{name}/c_kv_raw"))
    c_kv = rms_norm(b, c_kv, ops["kv_a_norm"], a["eps"], 0.0, dtype, b.fresh(f"{name}/c_kv"))
    k_pe = slice_(b, compressed, rank, rank + rope_dim, 2, b.fresh(f"{name}/k_pe_raw"))
    k_pe = b.op("Unsqueeze", [k_pe, b.i64([1])], f"{name}/k_pe_head")
    if rope:
        k_pe = _rotate_heads(b, k_pe, (1, 1, tokens, rope_dim), cos, sin, convention, b.fresh(f"{name}/k_pe"))
    k_pe = b.op("Tile", [k_pe, b.i64([1, heads, 1, 1])], f"{name}/k_pe_heads")

    kv = linear(b, c_kv, dtype, ops["kv_b"], None, b.fresh(f"{name}/kv"))
    kv4 = heads_first(b, kv, heads=heads, width=nope + v_dim, out=b.fresh(f"{name}/kv_heads"), **shape)
    k_nope = slice_(b, kv4, 0, nope, 3, b.fresh(f"{name}/k_nope"))
    b.node("Concat", [k_nope, k_pe], [outs[1]], axis=3)
    slice_(b, kv4, nope, nope + v_dim, 3, outs[2])

    keys = b.op("Concat", [b.value(ops["past_key"]), outs[1]], f"{name}/keys", axis=2)
    values = b.op("Concat", [b.value(ops["past_value"]), outs[2]], f"{name}/values", axis=2)
    scale = mla_softmax_scale(nope, rope_dim, rope, a["scale"])
    attended = attend(b, query, keys, values, grouped_mask(b, None, 1, tokens), kv_heads=heads, group=1,
                      tokens=tokens, width=nope + rope_dim, v_width=v_dim, scale=scale, cap=None, dtype=dtype,
                      out=b.fresh(f"{name}/heads"))
    merged = merge_heads(b, attended, heads=heads, width=v_dim, out=b.fresh(f"{name}/merged"), **shape)
    linear(b, merged, dtype, ops["wo"], None, name)
