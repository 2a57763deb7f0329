"""``mla_absorbed_attention``: DeepSeek multi-head latent attention with the up-projections
folded into the query and output weights, attending directly over the cached latent (what
``mla-absorb{fold_weights=true}`` produces; its default, absorption at run time without new
weights, is ``irc.ops.mla_latent``).

The un-absorbed ``mla_attention`` expands the latent c_kv [S, d_c] per head through
kv_b = [W^UK_h; W^UV_h] (per head h: W^UK_h [nope, d_c], W^UV_h [v, d_c]) and caches the
expanded keys and values. Since

    q_nope_h . k_nope_h = q_nope_h . (W^UK_h c_kv) = (W^UK_h^T q_nope_h) . c_kv
    wo (concat_h W^UV_h P_h c_kv) = sum_h (wo_h W^UV_h) (P_h c_kv)

the query side can take W^UK and the output projection W^UV, and attention becomes MQA
over one shared "key" [c_kv | k_rope] (width d_c + rope) and one shared "value" c_kv
(width d_c). The weights this op reads:

- ``q_b_absorbed`` [H*(d_c+rope), q_lora] (or ``wq_absorbed`` [H*(d_c+rope), d] for a
  direct query): per head, the rows W^UK_h^T q_b_nope_h [d_c, q_lora] followed by that
  head's unchanged RoPE rows q_b_rope_h [rope, q_lora] (``absorb_query_weight``);
- ``wo_absorbed`` [d, H*d_c]: column block h is wo_h W^UV_h (``absorb_output_weight``);
- ``q_a``, ``q_a_norm``, ``kv_a``, ``kv_a_norm`` as in ``mla_attention``.

Caches (the layout transformers' DeepseekV2/V3Attention keep in their ``DynamicCache``):
``past_latent`` [B, 1, P, d_c] holds c_kv after ``kv_a_norm``; ``past_rope`` [B, 1, P, rope]
holds the shared RoPE key, stored rotated in the layout of ``rope["convention"]`` (as
``mla_attention`` stores it; unrotated, and no ``position_ids`` operand, where ``rope`` is
None). Results are (out, present_latent, present_rope); without caches only ``out``. Attributes are those of ``mla_attention``; ``qk_nope_head_dim`` sets
the softmax scale ((nope + rope) ** -0.5 times the YaRN mscale ** 2, unless ``scale``)
and ``v_head_dim`` is kept for analysis (the MHA-equivalent cache).
"""
from __future__ import annotations

import numpy as np

from irc.ops.attention import (MLA_ATTRS, attend, check_mla_inputs, latent_mla_cost, latent_outputs, merge_heads,
                               mla_rotated, mla_softmax_scale, visible_keys, with_caches, with_past)
from irc.ops.mla_latent import kv_b_views
from irc.ops.nn import linear
from irc.ops.registry import OpDef, by_name, expect, expect_shape, register

OP = "mla_absorbed_attention"
OPERANDS = ("x", "position_ids?", "attention_mask?", "past_latent?", "past_rope?", "wq_absorbed?", "q_a?",
            "q_a_norm?", "q_b_absorbed?", "kv_a", "kv_a_norm", "wo_absorbed")
WEIGHTS = ("wq_absorbed", "q_a", "q_b_absorbed", "kv_a", "wo_absorbed")
NORMS = ("q_a_norm", "kv_a_norm")


# ---- folding the weights (float64, then the caller's dtype) -----------------------------

def split_kv_b(kv_b, *, heads: int, qk_nope_head_dim: int, v_head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """kv_b [H*(nope+v), d_c] -> W^UK [H, nope, d_c] and W^UV [H, v, d_c] (float64)."""
    per_head = np.asarray(kv_b).astype(np.float64).reshape(heads, qk_nope_head_dim + v_head_dim, -1)
    return kv_b_views(per_head, heads=heads, qk_nope_head_dim=qk_nope_head_dim)


def absorb_query_weight(w_q, kv_b, *, heads: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                        v_head_dim: int) -> np.ndarray:
    """The query weight with W^UK folded in: w_q [H*(nope+rope), in] (q_b or wq) ->
    [H*(d_c+rope), in], per head W^UK_h^T w_q_nope_h then w_q_rope_h (float64)."""
    w_uk, _ = split_kv_b(kv_b, heads=heads, qk_nope_head_dim=qk_nope_head_dim, v_head_dim=v_head_dim)
    per_head = np.asarray(w_q).astype(np.float64).reshape(heads, qk_nope_head_dim + qk_rope_head_dim, -1)
    latent_rows = np.einsum("hnc,hni->hci", w_uk, per_head[:, :qk_nope_head_dim])
    rows = np.concatenate([latent_rows, per_head[:, qk_nope_head_dim:]], axis=1)
    return rows.reshape(-1, rows.shape[-1])


def absorb_output_weight(wo, kv_b, *, heads: int, qk_nope_head_dim: int, v_head_dim: int) -> np.ndarray:
    """The output weight with W^UV folded in: wo [d, H*v] -> [d, H*d_c], column block h
    being wo_h W^UV_h (float64)."""
    _, w_uv = split_kv_b(kv_b, heads=heads, qk_nope_head_dim=qk_nope_head_dim, v_head_dim=v_head_dim)
    wo_heads = np.asarray(wo).astype(np.float64).reshape(-1, heads, v_head_dim)
    return np.einsum("dhv,hvc->dhc", wo_heads, w_uv).reshape(wo_heads.shape[0], -1)


# ---- the math ------------------------------------------------------------------------

def mla_absorbed_attention(x, position_ids, attention_mask=None, past_latent=None, past_rope=None,
                           wq_absorbed=None, q_a=None, q_a_norm=None, q_b_absorbed=None, kv_a=None, kv_a_norm=None,
                           wo_absorbed=None, *, heads: int, q_lora_rank, kv_lora_rank: int, qk_nope_head_dim: int,
                           qk_rope_head_dim: int, v_head_dim: int, rope, eps: float = 1e-6, scale=None,
                           causal: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Absorbed MLA: (out [B, T, d], present_latent [B, 1, P+T, d_c], present_rope
    [B, 1, P+T, rope]), float32. Multi-query attention of H query heads of width
    d_c + rope over the key [latent | rotated rope key] and the value ``latent``."""
    rank = kv_lora_rank
    query, c_kv, k_rope = mla_rotated(x, position_ids, wq_absorbed, q_a, q_a_norm, q_b_absorbed, kv_a, kv_a_norm,
                                      heads=heads, kv_lora_rank=rank, rope_dim=qk_rope_head_dim, rope=rope, eps=eps,
                                      rotate_from=rank)
    latent = with_past(past_latent, c_kv[:, None])
    rope_key = with_past(past_rope, k_rope)
    batch, seq = x.shape[:2]
    visible = visible_keys(batch, seq, latent.shape[2] - seq, attention_mask, causal)
    key = np.concatenate([latent, rope_key], axis=-1)
    out = attend(query, key, latent, visible, mla_softmax_scale(qk_nope_head_dim, qk_rope_head_dim, rope, scale))
    return linear(merge_heads(out), wo_absorbed), latent, rope_key


# ---- the op --------------------------------------------------------------------------

def _mla_absorbed_infer(inputs, attrs):
    ops = by_name(OPERANDS, inputs)
    heads, rank, rope_dim = attrs["heads"], attrs["kv_lora_rank"], attrs["qk_rope_head_dim"]
    batch, seq, _ = check_mla_inputs(OP, ops, attrs, "wq_absorbed", "q_b_absorbed", rank + rope_dim)
    wo = ops["wo_absorbed"]
    expect(len(wo.shape) == 2, f"{OP}: wo_absorbed must be [d_out, H*kv_lora_rank]")
    expect_shape(OP, "wo_absorbed", wo, (wo.shape[0], heads * rank))
    return latent_outputs(OP, ops, batch, seq, wo, rank, rope_dim)


def _mla_absorbed_reference(inputs, attrs):
    """DeepSeek multi-head latent attention, absorbed: W^UK folded into the query weight,
    W^UV into the output weight, multi-query attention over the cached normalised latent
    plus the shared rotated RoPE key."""
    ops = by_name(OPERANDS, inputs)
    out, latent, rope_key = mla_absorbed_attention(**ops, **attrs)
    return with_caches(out, (latent, rope_key), ops["x"], (ops["past_latent"], ops["past_rope"]))


# 2 FLOPs per projection weight per token, plus attention over P+T cached tokens with
# H heads of width d_c + rope for the scores and d_c for the weighted sum.
#
# The trade against ``mla_attention``: per decoded token the scores and the weighted sum
# cost 2·S·H·(d_c+rope) + 2·S·H·d_c instead of 2·S·H·(nope+rope) + 2·S·H·v (more FLOPs
# when d_c > nope, v; DeepSeek-V2: 576 + 512 against 192 + 128 per head and key), and the
# absorbed weights are larger than q_b and wo, while the cache read per key is d_c + rope
# elements instead of H·(nope+rope+v).
_mla_absorbed_cost = latent_mla_cost(OPERANDS, WEIGHTS, NORMS)


register(OpDef(OP, OPERANDS, MLA_ATTRS,
               _mla_absorbed_infer, _mla_absorbed_reference, _mla_absorbed_cost, level="model"))
