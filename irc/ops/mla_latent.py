"""``mla_latent_attention``: DeepSeek multi-head latent attention absorbed at run time, as
FlashMLA, vLLM and SGLang run it (what ``mla-absorb`` produces by default).

``kv_b`` [H*(nope+v), d_c] is read as its two per-head blocks, W^UK [H, nope, d_c] and
W^UV [H, v, d_c] (views of the checkpoint tensor: ``kv_b.reshape(H, nope+v, d_c)`` split
along its middle axis). Nothing is folded into another weight; instead, per token,

    q_latent_h = W^UK_h^T q_nope_h                       (a batched matmul over heads, d_c wide)
    o_h        = softmax(q_latent_h . c_kv + q_rope_h . k_rope) c_kv     (attention over the latent)
    out        = wo concat_h(W^UV_h o_h)                  (a batched matmul back out, then wo)

which equals ``mla_attention`` since q_nope_h . (W^UK_h c) = (W^UK_h^T q_nope_h) . c and
W^UV_h sum_s p_s c_s = sum_s p_s (W^UV_h c_s). The cache is the latent plus the shared RoPE
key, d_c + rope elements per token per layer, in ``mla_absorbed_attention``'s layout:
``past_latent`` [B, 1, P, d_c] (c_kv after ``kv_a_norm``) and ``past_rope`` [B, 1, P, rope]
(the rotated RoPE key; unrotated, and no ``position_ids`` operand, where ``rope`` is None).
Results are (out, present_latent, present_rope); without caches only ``out``. Attributes are
those of ``mla_attention``.

The parameters are exactly the checkpoint's; the price is two small matmuls per head per
token (2·H·nope·d_c + 2·H·v·d_c FLOPs, kv_b's size twice) where the un-absorbed form
multiplies kv_b once per new token too, and attention over the latent, as in the folded form.
"""
from __future__ import annotations

import numpy as np

from irc.ops.attention import (MLA_ATTRS, attend, check_mla_inputs, latent_mla_cost, latent_outputs, merge_heads,
                               mla_rotated, mla_softmax_scale, visible_keys, with_caches, with_past)
from irc.ops.nn import f32, linear
from irc.ops.registry import OpDef, by_name, expect, expect_shape, register

OP = "mla_latent_attention"
OPERANDS = ("x", "position_ids?", "attention_mask?", "past_latent?", "past_rope?", "wq?", "q_a?", "q_a_norm?",
            "q_b?", "kv_a", "kv_a_norm", "w_uk", "w_uv", "wo")
WEIGHTS = ("wq", "q_a", "q_b", "kv_a", "w_uk", "w_uv", "wo")
NORMS = ("q_a_norm", "kv_a_norm")


def kv_b_views(kv_b, *, heads: int, qk_nope_head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """kv_b [H*(nope+v), d_c] -> (W^UK [H, nope, d_c], W^UV [H, v, d_c]): strided views of
    ``kv_b``'s own data, no copy."""
    per_head = np.asarray(kv_b).reshape(heads, -1, np.asarray(kv_b).shape[-1])
    return per_head[:, :qk_nope_head_dim], per_head[:, qk_nope_head_dim:]


def latent_query(query, w_uk, nope: int) -> np.ndarray:
    """[q_nope W^UK_h | q_rope]: query [B, H, T, nope+rope] -> [B, H, T, d_c+rope] (float32)."""
    q_latent = np.einsum("bhtn,hnc->bhtc", f32(query[..., :nope]), f32(w_uk))
    return np.concatenate([q_latent, f32(query[..., nope:])], axis=-1)


def mla_latent_attention(x, position_ids, attention_mask=None, past_latent=None, past_rope=None, wq=None, q_a=None,
                         q_a_norm=None, q_b=None, kv_a=None, kv_a_norm=None, w_uk=None, w_uv=None, wo=None, *,
                         heads: int, q_lora_rank, kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                         v_head_dim: int, rope, eps: float = 1e-6, scale=None,
                         causal: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out [B, T, d], present_latent [B, 1, P+T, d_c], present_rope [B, 1, P+T, rope]),
    float32: multi-query attention of the latent queries over [latent | rotated rope key]
    with the latent as value, W^UV applied per head to the result, then ``wo``."""
    nope = qk_nope_head_dim
    query, c_kv, k_rope = mla_rotated(x, position_ids, wq, q_a, q_a_norm, q_b, kv_a, kv_a_norm, heads=heads,
                                      kv_lora_rank=kv_lora_rank, rope_dim=qk_rope_head_dim, rope=rope, eps=eps,
                                      rotate_from=nope)
    latent = with_past(past_latent, c_kv[:, None])
    rope_key = with_past(past_rope, k_rope)
    batch, seq = x.shape[:2]
    visible = visible_keys(batch, seq, latent.shape[2] - seq, attention_mask, causal)
    key = np.concatenate([latent, rope_key], axis=-1)
    scale = mla_softmax_scale(nope, qk_rope_head_dim, rope, scale)
    out_latent = attend(latent_query(query, w_uk, nope), key, latent, visible, scale)
    out = np.einsum("bhtc,hvc->bhtv", out_latent, f32(w_uv))
    return linear(merge_heads(out), wo), latent, rope_key


def _infer(inputs, attrs):
    ops = by_name(OPERANDS, inputs)
    heads, rank = attrs["heads"], attrs["kv_lora_rank"]
    nope, rope_dim, v_dim = attrs["qk_nope_head_dim"], attrs["qk_rope_head_dim"], attrs["v_head_dim"]
    batch, seq, _ = check_mla_inputs(OP, ops, attrs, "wq", "q_b", nope + rope_dim)
    expect_shape(OP, "w_uk", ops["w_uk"], (heads, nope, rank))
    expect_shape(OP, "w_uv", ops["w_uv"], (heads, v_dim, rank))
    wo = ops["wo"]
    expect(len(wo.shape) == 2, f"{OP}: wo must be [d_out, H*v_head_dim]")
    expect_shape(OP, "wo", wo, (wo.shape[0], heads * v_dim))
    return latent_outputs(OP, ops, batch, seq, wo, rank, rope_dim)


def _reference(inputs, attrs):
    """DeepSeek multi-head latent attention absorbed at run time: the query's nope part
    through W^UK per head into latent space, multi-query attention over the cached
    normalised latent plus the shared rotated RoPE key, W^UV per head, then wo."""
    ops = by_name(OPERANDS, inputs)
    out, latent, rope_key = mla_latent_attention(**ops, **attrs)
    return with_caches(out, (latent, rope_key), ops["x"], (ops["past_latent"], ops["past_rope"]))


# 2 FLOPs per weight per token (W^UK and W^UV once each per token: kv_b's size), plus
# attention of H heads over P+T latent keys: 2·S·H·(d_c+rope) for the scores, 2·S·H·d_c for
# the weighted sum
_cost = latent_mla_cost(OPERANDS, WEIGHTS, NORMS)


register(OpDef(OP, OPERANDS, MLA_ATTRS,
               _infer, _reference, _cost, level="model"))
