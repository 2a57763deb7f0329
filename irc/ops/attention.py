"""Attention ops: ``attention`` (MHA/GQA/MQA with window, softcap, KV cache) and
``mla_attention`` (DeepSeek-V2/V3 multi-head latent attention, un-absorbed; with ``rope`` None
the decoupled key is not rotated and no ``position_ids`` are read: Kimi-Linear's NoPE MLA).

Layouts: activations [B, T, features]; caches [B, K, P, D] (K kv heads, P past tokens);
``attention_mask`` i64 [B, P+T], 1 for a real token, 0 for padding (left padding works).

Visibility: the query at row t sits at cache index P+t; key j is visible iff j <= P+t
(when causal), j > P+t-W (with window W, HF ``sliding_window`` semantics) and
attention_mask[b, j] == 1. Without ``causal`` (bidirectional: an encoder) the window is
symmetric, |j - (P+t)| < W, as transformers' Gemma 3 with ``use_bidirectional_attention``
masks its sliding layers. A query row that sees no key outputs zeros, never NaN.

Chunks (``chunk`` C, Llama-4's chunked attention): key j is visible to query t only in the
query's chunk, ⌊(j − pad)/C⌋ = ⌊(P + t − pad)/C⌋, where pad is the row's left padding (the
leading zeros of attention_mask): chunks start at each row's first real token, as
transformers' ``create_chunked_causal_mask`` counts them.

Image blocks (``attention``'s optional ``blocks`` operand [B, T], int: ``image_blocks`` of the
ids, Gemma 3's image tokens): query t also sees key P+t' of the current chunk when
blocks[t] == blocks[t'] >= 0, i.e. one image's tokens see each other both ways; the window
(a lower bound on j) and the padding still apply: visible = (causal or same block) and
window and mask, transformers' ``create_masks_for_vision_model``. In bidirectional attention
the blocks restrict instead: key j is visible to query t only when blocks[t] == blocks[j]
(block-diagonal attention over one packed sequence: Qwen-VL's vision windows and frames,
transformers' ``cu_seqlens``).

Sinks (``attention``'s optional ``sinks`` operand [H], GPT-OSS's ``self_attn.sinks``): one
learned logit per query head joins every softmax denominator, always visible, with no value:
weights_j = exp(s_j) / (sum_visible exp(s_i) + exp(sink_h)), so a row's weights sum to less
than one. It is not soft-capped (GPT-OSS has no cap; transformers concatenates it after the
mask).

ALiBi (``attention``'s optional ``alibi`` operand [H], per-head slopes: BLOOM, MPT, Falcon):
alibi[h] · (j − (P + t)) is added to the scaled, soft-capped score of query row t on key j
before masking (``irc.ops.alibi``).

The math lives in module-level functions (``visible_keys``, ``attend``, ``mla_query``,
``mla_latent``, ``mla_expand_kv``, ...) so passes such as mla-absorb reuse them; the
registrations at the bottom wire them to the registry.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.ops.alibi import alibi_bias
from irc.ops.nn import f32, linear, rms_norm
from irc.ops.registry import (REQUIRED, Cost, OpDef, TensorType, by_name, expect, expect_shape, pad_inputs,
                              register, same_dims)
from irc.ops.rope import (apply_rope, check_rope_config, rope_cos_sin, rope_inv_freq, rope_seq_len,
                          yarn_softmax_mscale)


# ---- shared math -----------------------------------------------------------------------

def visible_keys(batch: int, seq: int, past: int, attention_mask=None, causal: bool = True,
                 window: Optional[int] = None, blocks=None, chunk: Optional[int] = None) -> np.ndarray:
    """Bool [B, T, P+T]: may query row t see key j (see the module docstring)."""
    query = past + np.arange(seq)[:, None]
    key = np.arange(past + seq)[None, :]
    visible = np.ones((seq, past + seq), dtype=bool)
    if causal:
        visible &= key <= query
    visible = np.broadcast_to(visible, (batch, seq, past + seq))
    if blocks is not None and causal:  # one image's tokens see each other (the current chunk's keys only)
        ids = np.asarray(blocks)
        same = (ids[:, :, None] == ids[:, None, :]) & (ids[:, :, None] >= 0)
        visible = visible | np.concatenate([np.zeros((batch, seq, past), bool), same], axis=2)
    elif blocks is not None:  # bidirectional: only the query's own block
        ids = np.asarray(blocks)
        visible = visible & np.concatenate([np.zeros((batch, seq, past), bool),
                                            ids[:, :, None] == ids[:, None, :]], axis=2)
    if window is not None:
        visible = visible & ((key > query - window) if causal else (np.abs(key - query) < window))
    if chunk is not None:  # Llama-4's chunks, counted from each row's first real token
        pad = left_padding(attention_mask, batch)[:, None, None]
        visible = visible & ((key - pad) // chunk == (query - pad) // chunk)
    if attention_mask is not None:
        visible = visible & (np.asarray(attention_mask) != 0)[:, None, :]
    return visible


def left_padding(attention_mask, batch: int) -> np.ndarray:
    """[B] int64: each row's leading zeros of ``attention_mask`` (0 without one)."""
    if attention_mask is None:
        return np.zeros(batch, np.int64)
    return (np.cumsum(np.asarray(attention_mask) != 0, axis=1) == 0).sum(axis=1).astype(np.int64)


def image_blocks(ids, token: int) -> np.ndarray:
    """[B, T] int64: each run of ``token`` ids numbered 0, 1, ... along the row (one image's
    placeholders), -1 elsewhere (transformers' ``get_block_sequence_ids_for_mask``)."""
    is_image = np.asarray(ids) == token
    starts = is_image & ~np.pad(is_image, ((0, 0), (1, 0)))[:, :-1]
    return np.where(is_image, np.cumsum(starts, axis=1) - 1, -1).astype(np.int64)


def masked_softmax(scores, visible, sinks=None) -> np.ndarray:
    """Softmax over the last axis restricted to ``visible``; rows with nothing visible are 0.
    ``sinks`` (broadcastable to scores[..., :1]) are logits that join every denominator and
    take no weight of their own (attention sinks)."""
    masked = np.where(visible, scores, -np.inf)
    peak = masked.max(axis=-1, keepdims=True)
    if sinks is not None:
        peak = np.maximum(peak, sinks)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    weights = np.where(visible, np.exp(masked - peak), 0.0)
    total = weights.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total = total + np.exp(sinks - peak)
    return (weights / np.where(total > 0, total, 1.0)).astype(np.float32)


def attend(query, key, value, visible, scale: float, softcap: Optional[float] = None, sinks=None,
           bias=None) -> np.ndarray:
    """Grouped scaled-dot-product attention in float32.

    query [B, H, T, D], key [B, K, S, D], value [B, K, S, Dv], visible bool [B, T, S];
    query head h reads kv head h // (H / K); ``sinks`` [H] join each head's softmax
    denominator (the module docstring); ``bias`` [H, T, S] (ALiBi's) is added to the scaled,
    soft-capped scores. Returns [B, H, T, Dv]."""
    q, k, v = f32(query), f32(key), f32(value)
    batch, heads, seq, _ = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    q5 = q.reshape(batch, kv_heads, group, seq, q.shape[-1])
    scores = np.einsum("bkgtd,bksd->bkgts", q5, k) * np.float32(scale)
    if softcap is not None:
        scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
    if bias is not None:
        scores = scores + f32(bias).reshape(1, kv_heads, group, seq, -1)
    sink = None if sinks is None else f32(sinks).reshape(1, kv_heads, group, 1, 1)
    weights = masked_softmax(scores, np.asarray(visible)[:, None, None, :, :], sink)
    out = np.einsum("bkgts,bksd->bkgtd", weights, v)
    return out.reshape(batch, heads, seq, v.shape[-1]).astype(np.float32)


def split_heads(x, heads: int) -> np.ndarray:
    """[B, T, H*D] -> [B, H, T, D]."""
    batch, seq, features = x.shape
    return np.ascontiguousarray(np.asarray(x).reshape(batch, seq, heads, features // heads).transpose(0, 2, 1, 3))


def merge_heads(x) -> np.ndarray:
    """[B, H, T, D] -> [B, T, H*D]."""
    batch, heads, seq, width = x.shape
    return np.ascontiguousarray(np.asarray(x).transpose(0, 2, 1, 3).reshape(batch, seq, heads * width))


def with_past(past, new) -> np.ndarray:
    """present = concat(past, new) along the sequence axis of [B, K, S, D]."""
    return new if past is None else np.concatenate([f32(past), new], axis=2)


def attention(q, k, v, attention_mask=None, past_key=None, past_value=None, sinks=None, blocks=None, alibi=None, *,
              heads: int, kv_heads: int,
              head_dim: int, v_head_dim: Optional[int] = None, causal: bool = True,
              window: Optional[int] = None, softcap: Optional[float] = None,
              scale: Optional[float] = None, chunk: Optional[int] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out [B, T, H*Dv], present_key [B, K, P+T, D], present_value [B, K, P+T, Dv]), float32."""
    key = with_past(past_key, split_heads(f32(k), kv_heads))
    value = with_past(past_value, split_heads(f32(v), kv_heads))
    batch, seq = q.shape[:2]
    visible = visible_keys(batch, seq, key.shape[2] - seq, attention_mask, causal, window, blocks, chunk)
    scale = head_dim ** -0.5 if scale is None else scale
    bias = None if alibi is None else alibi_bias(alibi, seq, key.shape[2])
    out = attend(split_heads(f32(q), heads), key, value, visible, scale, softcap, sinks, bias)
    return merge_heads(out), key, value


# ---- attention: the op -----------------------------------------------------------------

def _check_mask_and_past(op, batch, seq, mask, past_key, past_value, kv_heads, key_dim, value_dim):
    """Check the optional mask and cache operands; returns the present length P+T."""
    expect((past_key is None) == (past_value is None), f"{op}: past_key and past_value must be given together")
    past = 0
    if past_key is not None:
        expect(len(past_key.shape) == 4 and len(past_value.shape) == 4, f"{op}: past caches must be [B,K,P,D]")
        past = past_key.shape[2]
        for name, cache, width in (("past_key", past_key, key_dim), ("past_value", past_value, value_dim)):
            want = (batch, kv_heads, past, width)
            expect(all(same_dims(a, b) for a, b in zip(cache.shape, want)),
                   f"{op}: {name} {dims.format_shape(cache.shape)} should be {dims.format_shape(want)}")
    total = dims.add(past, seq)
    if mask is not None:
        expect(mask.dtype in (DType.i64, DType.i32, DType.bool),
               f"{op}: attention_mask must be integer, got {mask.dtype}")
        expect(len(mask.shape) == 2 and same_dims(mask.shape[0], batch) and same_dims(mask.shape[1], total),
               f"{op}: attention_mask {dims.format_shape(mask.shape)} should be {dims.format_shape((batch, total))}")
    return total


def _check_activation(op, name, value, batch, seq, width):
    expect(value.dtype.is_float, f"{op}: {name} must be float, got {value.dtype}")
    want = (batch, seq, width)
    expect(len(value.shape) == 3 and all(same_dims(a, b) for a, b in zip(value.shape, want)),
           f"{op}: {name} {dims.format_shape(value.shape)} should be {dims.format_shape(want)}")


def _attention_infer(inputs, attrs):
    q, k, v, mask, past_key, past_value, sinks, blocks, alibi = pad_inputs(inputs, 9)
    heads, kv_heads, head_dim = attrs["heads"], attrs["kv_heads"], attrs["head_dim"]
    v_head_dim = head_dim if attrs["v_head_dim"] is None else attrs["v_head_dim"]
    for name in ("heads", "kv_heads", "head_dim"):
        expect(isinstance(attrs[name], int) and attrs[name] > 0, f"attention: {name} must be a positive int")
    expect(heads % kv_heads == 0, f"attention: heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    for name in ("window", "chunk"):
        value = attrs[name]
        expect(value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0),
               f"attention: {name} must be a positive int or None, got {value!r}")
    expect(attrs["chunk"] is None or attrs["causal"], "attention: chunks are a causal attention's")
    expect(len(q.shape) == 3, f"attention: q must be [B,T,H*D], got {dims.format_shape(q.shape)}")
    batch, seq = q.shape[:2]
    _check_activation("attention", "q", q, batch, seq, heads * head_dim)
    _check_activation("attention", "k", k, batch, seq, kv_heads * head_dim)
    _check_activation("attention", "v", v, batch, seq, kv_heads * v_head_dim)
    expect(q.dtype == k.dtype == v.dtype, "attention: q, k and v dtypes differ")
    total = _check_mask_and_past("attention", batch, seq, mask, past_key, past_value, kv_heads, head_dim, v_head_dim)
    if sinks is not None:
        expect(sinks.dtype.is_float, f"attention: sinks must be float, got {sinks.dtype}")
        expect_shape("attention", "sinks", sinks, (heads,))
    if alibi is not None:
        expect(alibi.dtype.is_float, f"attention: alibi (per-head slopes) must be float, got {alibi.dtype}")
        expect_shape("attention", "alibi", alibi, (heads,))
    if blocks is not None:
        expect(not blocks.dtype.is_float, "attention: blocks (image tokens seeing each other, or the blocks of "
                                          "a block-diagonal attention) must be integer")
        expect_shape("attention", "blocks", blocks, (batch, seq))
    out = [TensorType(q.dtype, (batch, seq, heads * v_head_dim))]
    if past_key is not None:
        out += [TensorType(past_key.dtype, (batch, kv_heads, total, head_dim)),
                TensorType(past_value.dtype, (batch, kv_heads, total, v_head_dim))]
    return out


def _attention_reference(inputs, attrs):
    """Scaled-dot-product attention with grouped KV heads, causal/window/padding masks,
    optional Gemma-2 softcap on the scores, optional per-head sinks in the softmax
    denominator (GPT-OSS), optional image blocks (Gemma 3), optional ALiBi slopes, and
    past/present KV cache."""
    q, k, v, mask, past_key, past_value, sinks, blocks, alibi = pad_inputs(inputs, 9)
    out, key, value = attention(q, k, v, mask, past_key, past_value, sinks, blocks, alibi, **attrs)
    if past_key is None:
        return [out.astype(q.dtype)]
    return [out.astype(q.dtype), key.astype(past_key.dtype), value.astype(past_value.dtype)]


def attention_core_cost(batch, seq, total, heads, key_dim, value_dim) -> Cost:
    """Scores and weighted sum over all P+T keys (no causal or window discount), softmax apart."""
    flops = 2 * batch * seq * total * heads * key_dim + 2 * batch * seq * total * heads * value_dim
    return Cost(flops=flops, other_flops=5 * batch * heads * seq * total)


def _io(inputs, outputs) -> Cost:
    return Cost(bytes_read=sum(t.nbytes for t in inputs if t is not None),
                bytes_written=sum(t.nbytes for t in outputs))


def _attention_cost(inputs, outputs, attrs):
    q = inputs[0]
    batch, seq = q.shape[:2]
    total = outputs[1].shape[2] if len(outputs) > 1 else seq
    v_head_dim = attrs["head_dim"] if attrs["v_head_dim"] is None else attrs["v_head_dim"]
    sinks = Cost(other_flops=2 * batch * seq * attrs["heads"]) if len(inputs) > 6 and inputs[6] is not None else Cost()
    alibi = Cost(other_flops=2 * batch * seq * total * attrs["heads"]) if len(inputs) > 8 and inputs[8] is not None \
        else Cost()  # a multiply and an add per score
    return (attention_core_cost(batch, seq, total, attrs["heads"], attrs["head_dim"], v_head_dim) + sinks + alibi
            + _io(inputs, outputs))


register(OpDef("attention", ("q", "k", "v", "attention_mask?", "past_key?", "past_value?", "sinks?", "blocks?",
                             "alibi?"),
               {"heads": REQUIRED, "kv_heads": REQUIRED, "head_dim": REQUIRED, "v_head_dim": None, "causal": True,
                "window": None, "softcap": None, "scale": None, "chunk": None},
               _attention_infer, _attention_reference, _attention_cost, level="model"))


# ---- MLA: the math ---------------------------------------------------------------------

def mla_query(x, wq=None, q_a=None, q_a_norm=None, q_b=None, *, heads: int, eps: float) -> np.ndarray:
    """Queries [B, H, T, nope+rope] before RoPE: x @ wq.T, or the low-rank path
    q_b(rms_norm(q_a(x)))."""
    q = linear(x, wq) if wq is not None else linear(rms_norm(linear(x, q_a), q_a_norm, eps), q_b)
    return split_heads(q, heads)


def mla_latent(x, kv_a, kv_a_norm, *, kv_lora_rank: int, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The compressed KV: normalised latent c_kv [B, T, kv_lora_rank] and the shared RoPE key
    k_rope [B, T, rope] before RoPE (both from kv_a_proj_with_mqa)."""
    compressed = linear(x, kv_a)
    return rms_norm(compressed[..., :kv_lora_rank], kv_a_norm, eps), compressed[..., kv_lora_rank:]


def mla_expand_kv(c_kv, kv_b, *, heads: int, qk_nope_head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-head keys without position k_nope [B, H, T, nope] and values [B, H, T, Dv] from the
    latent via kv_b_proj."""
    kv = split_heads(linear(c_kv, kv_b), heads)
    return kv[..., :qk_nope_head_dim], kv[..., qk_nope_head_dim:]


def mla_rope_cos_sin(position_ids, rope_dim: int, rope_config: dict):
    """cos/sin [B, T, rope/2] for the decoupled RoPE part (attention factor included)."""
    inv_freq, attention_factor = rope_inv_freq(rope_dim, rope_config["base"], rope_config.get("scaling"),
                                               rope_seq_len(position_ids))
    return rope_cos_sin(position_ids, inv_freq, attention_factor)


def mla_rotate(x_bhtr, cos, sin, convention: str) -> np.ndarray:
    """RoPE on [B, H, T, rope] (H may be 1 for the shared key)."""
    return apply_rope(x_bhtr.transpose(0, 2, 1, 3), cos, sin, convention).transpose(0, 2, 1, 3)


def mla_softmax_scale(qk_nope_head_dim: int, qk_rope_head_dim: int, rope_config: Optional[dict],
                      scale: Optional[float] = None) -> float:
    """(nope + rope) ** -0.5 times DeepSeek's YaRN mscale ** 2 (none without RoPE), unless
    ``scale`` is given."""
    if scale is not None:
        return scale
    mscale = 1.0 if rope_config is None else yarn_softmax_mscale(rope_config.get("scaling"))
    return (qk_nope_head_dim + qk_rope_head_dim) ** -0.5 * mscale


def mla_rotated(x, position_ids, wq, q_a, q_a_norm, q_b, kv_a, kv_a_norm, *, heads: int, kv_lora_rank: int,
                rope_dim: int, rope: Optional[dict], eps: float, rotate_from: int) -> tuple:
    """What every MLA form starts with: the query [B, H, T, .] with its columns from
    ``rotate_from`` on rotated, the KV latent c_kv [B, T, d_c], and the rotated RoPE key
    [B, 1, T, rope]. With ``rope`` None nothing is rotated (the "RoPE" columns are plain
    shared key dims, Kimi-Linear's NoPE MLA) and ``position_ids`` is not read."""
    query = mla_query(x, wq, q_a, q_a_norm, q_b, heads=heads, eps=eps)
    c_kv, k_rope = mla_latent(x, kv_a, kv_a_norm, kv_lora_rank=kv_lora_rank, eps=eps)
    if rope is None:
        return query, c_kv, k_rope[:, None]
    convention = rope.get("convention", "half")
    cos, sin = mla_rope_cos_sin(position_ids, rope_dim, rope)
    query[..., rotate_from:] = mla_rotate(query[..., rotate_from:], cos, sin, convention)
    return query, c_kv, mla_rotate(k_rope[:, None], cos, sin, convention)


def mla_attention(x, position_ids, attention_mask=None, past_key=None, past_value=None, wq=None, q_a=None,
                  q_a_norm=None, q_b=None, kv_a=None, kv_a_norm=None, kv_b=None, wo=None, *, heads: int,
                  q_lora_rank: Optional[int], kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                  v_head_dim: int, rope: Optional[dict], eps: float = 1e-6, scale: Optional[float] = None,
                  causal: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Un-absorbed MLA: (out [B, T, d], present_key [B, H, P+T, nope+rope],
    present_value [B, H, P+T, Dv]), float32. The RoPE half of each cached key is stored
    rotated, in the layout of ``rope["convention"]`` (unrotated with ``rope`` None)."""
    nope = qk_nope_head_dim
    query, c_kv, k_rope = mla_rotated(x, position_ids, wq, q_a, q_a_norm, q_b, kv_a, kv_a_norm, heads=heads,
                                      kv_lora_rank=kv_lora_rank, rope_dim=qk_rope_head_dim, rope=rope, eps=eps,
                                      rotate_from=nope)
    k_nope, value = mla_expand_kv(c_kv, kv_b, heads=heads, qk_nope_head_dim=nope)
    key = np.concatenate([k_nope, np.broadcast_to(k_rope, k_nope.shape[:3] + (qk_rope_head_dim,))], axis=-1)
    key, value = with_past(past_key, key), with_past(past_value, value)
    batch, seq = x.shape[:2]
    visible = visible_keys(batch, seq, key.shape[2] - seq, attention_mask, causal)
    out = attend(query, key, value, visible, mla_softmax_scale(nope, qk_rope_head_dim, rope, scale))
    return linear(merge_heads(out), wo), key, value


# ---- MLA: the op -----------------------------------------------------------------------

MLA_OPERANDS = ("x", "position_ids?", "attention_mask?", "past_key?", "past_value?", "wq?", "q_a?", "q_a_norm?",
                "q_b?", "kv_a", "kv_a_norm", "kv_b", "wo")


def check_mla_inputs(op: str, ops: dict, attrs: dict, wq: str, q_b: str, q_head_width: int) -> tuple:
    """What every MLA form checks alike: positive int sizes, the RoPE config (a dict with a
    base, or None: no rotation), x float [B,T,d] and integer position_ids [B,T] (absent
    exactly when ``rope`` is None), the query weights (``wq`` alone, or ``q_a``,
    ``q_a_norm`` and ``q_b`` when q_lora_rank is set; H * ``q_head_width`` rows) and
    ``kv_a``/``kv_a_norm``. Returns (batch, seq, d)."""
    x, position_ids = ops["x"], ops["position_ids"]
    for name in ("heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        expect(isinstance(attrs[name], int) and attrs[name] > 0, f"{op}: {name} must be a positive int")
    heads, rank, q_rank = attrs["heads"], attrs["kv_lora_rank"], attrs["q_lora_rank"]
    rope_dim = attrs["qk_rope_head_dim"]
    rope_config = attrs["rope"]
    expect(x.dtype.is_float and len(x.shape) == 3,
           f"{op}: x must be float [B,T,d], got {x.dtype}{dims.format_shape(x.shape)}")
    batch, seq, d = x.shape
    if rope_config is None:
        expect(position_ids is None, f"{op}: rope is None (no rotation), so it reads no position_ids: leave them out")
    else:
        expect(isinstance(rope_config, dict) and "base" in rope_config,
               f"{op}: rope must be a dict with a base, or None (no rotation)")
        check_rope_config(op, rope_dim, rope_config["base"], rope_config.get("convention", "half"),
                          rope_config.get("scaling"))
        expect(position_ids is not None, f"{op}: operand 'position_ids' is required with a rope")
        expect(position_ids.dtype in (DType.i64, DType.i32), f"{op}: position_ids must be integer")
        expect_shape(op, "position_ids", position_ids, (batch, seq))
    q_width = heads * q_head_width
    if q_rank is None:
        expect_shape(op, wq, ops[wq], (q_width, d))
        expect(ops["q_a"] is None and ops[q_b] is None, f"{op}: q_a/{q_b} given but q_lora_rank is None")
    else:
        expect(ops[wq] is None, f"{op}: {wq} given but q_lora_rank is set")
        expect_shape(op, "q_a", ops["q_a"], (q_rank, d))
        expect_shape(op, "q_a_norm", ops["q_a_norm"], (q_rank,))
        expect_shape(op, q_b, ops[q_b], (q_width, q_rank))
    expect_shape(op, "kv_a", ops["kv_a"], (rank + rope_dim, d))
    expect_shape(op, "kv_a_norm", ops["kv_a_norm"], (rank,))
    return batch, seq, d


def _mla_infer(inputs, attrs):
    ops = by_name(MLA_OPERANDS, inputs)
    x = ops["x"]
    heads, rank = attrs["heads"], attrs["kv_lora_rank"]
    nope, rope_dim, v_dim = attrs["qk_nope_head_dim"], attrs["qk_rope_head_dim"], attrs["v_head_dim"]
    batch, seq, _ = check_mla_inputs("mla_attention", ops, attrs, "wq", "q_b", nope + rope_dim)
    expect_shape("mla_attention", "kv_b", ops["kv_b"], (heads * (nope + v_dim), rank))
    expect(ops["wo"] is not None and len(ops["wo"].shape) == 2, "mla_attention: wo must be [d_out, H*v_head_dim]")
    expect_shape("mla_attention", "wo", ops["wo"], (ops["wo"].shape[0], heads * v_dim))
    total = _check_mask_and_past("mla_attention", batch, seq, ops["attention_mask"], ops["past_key"],
                                 ops["past_value"], heads, nope + rope_dim, v_dim)
    out = [TensorType(x.dtype, (batch, seq, ops["wo"].shape[0]))]
    if ops["past_key"] is not None:
        out += [TensorType(ops["past_key"].dtype, (batch, heads, total, nope + rope_dim)),
                TensorType(ops["past_value"].dtype, (batch, heads, total, v_dim))]
    return out


def latent_outputs(op, ops, batch, seq, wo, rank: int, rope_dim: int) -> list:
    """The output types of an absorbed MLA op: [B, T, d_out], then the whole latent and
    RoPE-key caches [B, 1, P+T, d_c] and [B, 1, P+T, rope] when it is given a past."""
    total = _check_mask_and_past(op, batch, seq, ops["attention_mask"], ops["past_latent"], ops["past_rope"], 1,
                                 rank, rope_dim)
    out = [TensorType(ops["x"].dtype, (batch, seq, wo.shape[0]))]
    if ops["past_latent"] is not None:
        out += [TensorType(ops["past_latent"].dtype, (batch, 1, total, rank)),
                TensorType(ops["past_rope"].dtype, (batch, 1, total, rope_dim))]
    return out


def with_caches(out, caches, x, pasts) -> list:
    """An attention reference's results: ``out`` in ``x``'s dtype, then the present caches
    in their pasts' dtypes (none without a past)."""
    if pasts[0] is None:
        return [out.astype(x.dtype)]
    return [out.astype(x.dtype)] + [cache.astype(past.dtype) for cache, past in zip(caches, pasts)]


def _mla_reference(inputs, attrs):
    """DeepSeek multi-head latent attention (un-absorbed): low-rank q, compressed KV latent
    expanded per head, decoupled RoPE key shared by all heads, YaRN softmax scale."""
    ops = by_name(MLA_OPERANDS, inputs)
    out, key, value = mla_attention(**ops, **attrs)
    return with_caches(out, (key, value), ops["x"], (ops["past_key"], ops["past_value"]))


def mla_cost(ops: dict, inputs, outputs, attrs, key_dim: int, value_dim: int, weights, norms) -> Cost:
    """An MLA op's cost: 2 FLOPs per projection weight (``weights``, by operand name) per
    token, 4 per norm weight, the RoPE rotations (where ``rope`` is set), and scores
    (``key_dim``) and weighted sum (``value_dim``) of every head over all P+T keys."""
    batch, seq = ops["x"].shape[:2]
    tokens = batch * seq
    total = outputs[1].shape[2] if len(outputs) > 1 else seq
    heads = attrs["heads"]
    rope_dim = 0 if attrs["rope"] is None else attrs["qk_rope_head_dim"]  # the rotations (none without RoPE)
    weight_count = sum(ops[name].numel for name in weights if ops[name] is not None)
    norm_count = sum(ops[name].numel for name in norms if ops[name] is not None)
    core = attention_core_cost(batch, seq, total, heads, key_dim, value_dim)
    extra = Cost(flops=2 * tokens * weight_count,
                 other_flops=4 * tokens * norm_count + 3 * tokens * (heads + 1) * rope_dim)
    return core + extra + _io(inputs, outputs)


def latent_mla_cost(operands, weights, norms):
    """The cost rule of an MLA op that attends over the latent (both absorbed forms): keys
    of d_c + rope for the scores, values of d_c for the weighted sum (``mla_cost``)."""
    def cost(inputs, outputs, attrs):
        rank = attrs["kv_lora_rank"]
        return mla_cost(by_name(operands, inputs), inputs, outputs, attrs, rank + attrs["qk_rope_head_dim"], rank,
                        weights, norms)
    return cost


# the attributes of every MLA op (mla_attention and its two absorbed forms)
MLA_ATTRS = {"heads": REQUIRED, "q_lora_rank": None, "kv_lora_rank": REQUIRED, "qk_nope_head_dim": REQUIRED,
             "qk_rope_head_dim": REQUIRED, "v_head_dim": REQUIRED, "eps": 1e-6, "rope": REQUIRED, "scale": None,
             "causal": True}


def _mla_cost(inputs, outputs, attrs):
    """2 FLOPs per projection weight per token, plus scores and weighted sum over P+T keys."""
    return mla_cost(by_name(MLA_OPERANDS, inputs), inputs, outputs, attrs,
                    attrs["qk_nope_head_dim"] + attrs["qk_rope_head_dim"], attrs["v_head_dim"],
                    ("wq", "q_a", "q_b", "kv_a", "kv_b", "wo"), ("q_a_norm", "kv_a_norm"))


register(OpDef("mla_attention", MLA_OPERANDS, MLA_ATTRS,
               _mla_infer, _mla_reference, _mla_cost, level="model"))
