"""The gated delta rule (Qwen3-Next's and Qwen3.5's linear attention, "Gated DeltaNet"), and
the two linear attentions that are its special cases: Kimi Delta Attention (the decay per
key channel) and MiniMax's lightning attention (the gated rule with a constant decay).

Operands, activations [B, T, features]:

- ``q``, ``k`` [B, T, H_k·d_k] and ``v`` [B, T, H_v·d_v] (after the short convolution);
- ``a`` [B, T, H_v] (``decay="head"``) or [B, T, H_v·d_k] (``decay="channel"``, Kimi): the
  raw decay input (in_proj_a; Kimi's f_b(f_a(x))); absent, the decay is constant per head,
  g = -exp(A_log) (MiniMax: A_log = log(slope));
- ``b`` [B, T, H_v]: the raw write strength (in_proj_b), for ``update_rule="gated_delta"``
  only;
- ``A_log`` [H_v], ``dt_bias`` [H_v] or [H_v·d_k] with a per-channel decay (optional);
- ``past_state`` [B, H_v, d_k, d_v] (optional; the present state is returned with it) and
  ``attention_mask`` [B, P+T] (optional; its last T columns mark the new tokens).

Value head h reads key head h // (H_v / H_k) of q and k (transformers' repeat_interleave:
GQA with the roles of q/k and v swapped). Per token, per value head:

    g = -exp(A_log) · softplus(a + dt_bias)          (log of the decay, <= 0)
    β = sigmoid(b)
    q̂ = l2norm(q) · scale, k̂ = l2norm(k)            (l2norm: x / sqrt(Σx² + 1e-6))
    S' = exp(g) · S                                  (g per head, or per key channel: a row of S)
    S  = S' + β · k̂ ⊗ (v − S'ᵀ k̂)                   (update_rule "gated_delta": the correction)
    S  = S' + k̂ ⊗ v                                  (update_rule "gated": linear attention)
    o  = Sᵀ q̂

The rules are ONNX Runtime's ``LinearAttention`` ``update_rule`` values of the same names.

The state is key-major [d_k, d_v] per head: transformers' ``last_recurrent_state`` and ONNX
Runtime's ``LinearAttention`` layout, as irc's ``ssd`` keeps it. The L2 norms of q and k are
inside the op (``l2_norm``, default True: transformers' ``use_qk_l2norm_in_kernel=True``)
so that every backend normalises in float32 at the same place; ``scale`` None is d_k^-0.5.

Padding follows ``irc.ops.ssm``: a padded token's step is frozen (decay 1, β 0) and its
output is 0, so a left-padded prefill from a zero state ends where the unpadded prompt does.

The op means the sequential recurrence (``gated_delta_rule``); ``chunked_gated_delta_rule``
is the chunked form (chunks of 64 tokens by default, a unit-triangular solve per chunk, as
transformers' ``torch_chunk_gated_delta_rule`` and the fla kernels compute it), the same
numbers for every variant. The ``chunk`` attribute (None, or the tokens a chunk: set by the
``scan-chunk`` pass) picks the form the reference computes a prefill in; one token always
takes the step.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from irc.ops.nn import f32
from irc.ops.primitives import sigmoid
from irc.ops.registry import REQUIRED, Cost, OpDef, TensorType, by_name, expect, expect_shape, register
from irc.ops.ssm import (_activation, _io, _mask, _positive, _state_out, _with_state, check_chunk, new_token_mask,
                         softplus)

OPERANDS = ("q", "k", "v", "a?", "b?", "A_log", "dt_bias?", "past_state?", "attention_mask?")
ATTRS = {"key_heads": REQUIRED, "value_heads": REQUIRED, "key_dim": REQUIRED, "value_dim": REQUIRED,
         "l2_norm": True, "scale": None, "update_rule": "gated_delta", "decay": "head", "chunk": None}
UPDATE_RULES = ("gated_delta", "gated")
DECAYS = ("head", "channel")
L2_EPS = 1e-6


def l2norm(x) -> np.ndarray:
    """x / sqrt(Σ x² + 1e-6) over the last axis (fla's and transformers' form), float32."""
    x = f32(x)
    return (x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + np.float32(L2_EPS))).astype(np.float32)


def delta_inputs(q, k, v, a, b, A_log, dt_bias=None, attention_mask=None, *, key_heads: int, value_heads: int,
                 key_dim: int, value_dim: int, l2_norm: bool = True, scale: Optional[float] = None,
                 update_rule: str = "gated_delta", decay: str = "head") -> tuple:
    """(q̂, k̂ [B, T, H_v, d_k] (key heads repeated to the value heads), v [B, T, H_v, d_v],
    log decay g [B, T, H_v, d_k] (a per-head decay repeated over the key channels) and the
    write strength β [B, T, H_v]), float32. β is sigmoid(b) for the delta rule and 1 for the
    gated rule; a padded token's g and β are 0 (its step frozen)."""
    batch, seq = f32(q).shape[:2]
    group = value_heads // key_heads
    qs = f32(q).reshape(batch, seq, key_heads, key_dim)
    ks = f32(k).reshape(batch, seq, key_heads, key_dim)
    if l2_norm:
        qs, ks = l2norm(qs), l2norm(ks)
    qs = qs * np.float32(key_dim ** -0.5 if scale is None else scale)
    qs, ks = np.repeat(qs, group, axis=2), np.repeat(ks, group, axis=2)
    vs = f32(v).reshape(batch, seq, value_heads, value_dim)
    rate = np.exp(f32(A_log))
    if a is None:
        g = np.broadcast_to(-rate, (batch, seq, value_heads)).astype(np.float32)
    else:
        raw = f32(a) + (0.0 if dt_bias is None else f32(dt_bias))
        if decay == "channel":
            rate = np.repeat(rate, key_dim)
        g = (-rate * softplus(raw)).astype(np.float32)
    g = g.reshape(batch, seq, value_heads, -1) * np.ones(key_dim, np.float32)
    beta = sigmoid(f32(b)) if update_rule == "gated_delta" else np.ones((batch, seq, value_heads), np.float32)
    real = new_token_mask(attention_mask, batch, seq)[..., None]
    g, beta = np.where(real[..., None], g, np.float32(0.0)), np.where(real, beta, np.float32(0.0))
    return qs, ks, vs, g.astype(np.float32), beta


def gated_delta_rule(q, k, v, a, b, A_log, dt_bias=None, past_state=None, attention_mask=None, **attrs
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(o [B, T, H_v·d_v], present_state [B, H_v, d_k, d_v]): the sequential recurrence."""
    qs, ks, vs, g, beta = delta_inputs(q, k, v, a, b, A_log, dt_bias, attention_mask, **attrs)
    batch, seq, heads, value_dim = vs.shape
    S = (np.zeros((batch, heads, qs.shape[-1], value_dim), np.float32) if past_state is None
         else f32(past_state).copy())
    out = np.zeros((batch, seq, heads, value_dim), np.float32)
    delta = attrs.get("update_rule", "gated_delta") == "gated_delta"
    for t in range(seq):
        S = S * np.exp(g[:, t])[..., None]
        k_t = ks[:, t]                                                    # [B, H, d_k]
        recalled = np.einsum("bhkv,bhk->bhv", S, k_t) if delta else np.float32(0.0)
        correction = (vs[:, t] - recalled) * beta[:, t, :, None]
        S = S + k_t[..., None] * correction[:, :, None, :]
        out[:, t] = np.einsum("bhkv,bhk->bhv", S, qs[:, t])
    real = new_token_mask(attention_mask, batch, seq)[..., None, None]
    out = np.where(real, out, np.float32(0.0))
    return out.reshape(batch, seq, heads * value_dim), S.astype(np.float32)


def chunked_gated_delta_rule(q, k, v, a, b, A_log, dt_bias=None, past_state=None, attention_mask=None, *,
                             chunk: int = 64, **attrs) -> tuple[np.ndarray, np.ndarray]:
    """The same result in chunks of ``chunk`` tokens (float64 inside): within a chunk the
    writes are one unit-lower-triangular system (the WY / UT transform; the gated rule
    writes v as it is), between chunks the state is carried once. The decay is per key
    channel where ``decay="channel"``; a per-head one takes its [n, n] decay matrix alone."""
    qs, ks, vs, g, beta = (np.asarray(t, np.float64) for t in delta_inputs(q, k, v, a, b, A_log, dt_bias,
                                                                           attention_mask, **attrs))
    delta = attrs.get("update_rule", "gated_delta") == "gated_delta"
    if attrs.get("decay", "head") == "head":
        g = g[..., :1]  # every channel alike: one decay a head, broadcast below
    batch, seq, heads, value_dim = vs.shape
    key_dim = qs.shape[-1]
    S = (np.zeros((batch, heads, key_dim, value_dim)) if past_state is None
         else np.asarray(past_state, np.float64).copy())
    out = np.zeros((batch, seq, heads, value_dim))
    strict = np.tril(np.ones((chunk, chunk), bool), -1)
    for start in range(0, seq, chunk):
        end = min(start + chunk, seq)
        n = end - start
        qc, kc, vc, gc = (t[:, start:end].transpose(0, 2, 1, 3) for t in (qs, ks, vs, g))   # [B, H, n, d]
        bc = beta[:, start:end].transpose(0, 2, 1)                                           # [B, H, n]
        cum = np.cumsum(gc, axis=-2)                                                         # [B, H, n, d_k]
        causal = (strict[:n, :n] | np.eye(n, dtype=bool))[..., None]
        pair = np.where(causal, np.exp(np.minimum(cum[..., :, None, :] - cum[..., None, :, :], 0.0)), 0.0)
        scores = _decayed_products(qc, kc, pair)
        if delta:
            kk = _decayed_products(kc, kc, pair) * strict[:n, :n] * bc[..., :, None]
            rhs_v = vc * bc[..., None] - np.einsum("bhid,bhdv->bhiv", kc * bc[..., None] * np.exp(cum), S)
            u = np.linalg.solve(np.eye(n) + kk, rhs_v)                     # the chunk's corrections
        else:
            u = vc * bc[..., None]
        out[:, start:end] = (np.einsum("bhid,bhdv->bhiv", qc * np.exp(cum), S)
                             + np.einsum("bhij,bhjv->bhiv", scores, u)).transpose(0, 2, 1, 3)
        tail = np.exp(cum[..., -1:, :] - cum)                              # decay from each token to the end
        S = S * np.exp(cum[..., -1, :])[..., None] + np.einsum("bhid,bhiv->bhdv", kc * tail, u)
    real = new_token_mask(attention_mask, batch, seq)[..., None, None]
    out = np.where(real, out, 0.0)
    return out.reshape(batch, seq, heads * value_dim).astype(np.float32), S.astype(np.float32)


def _decayed_products(x, y, pair) -> np.ndarray:
    """Σ_c x_ic · y_jc · pair_ijc [B, H, n, n]; ``pair`` [B, H, n, n, 1] (one decay a head)
    is the plain product scaled."""
    if pair.shape[-1] == 1:
        return np.einsum("bhid,bhjd->bhij", x, y) * pair[..., 0]
    return np.einsum("bhid,bhjd,bhijd->bhij", x, y, pair)


def _infer(inputs, attrs):
    ops = by_name(OPERANDS, inputs)
    op = "gated_delta_rule"
    _positive(op, attrs, "key_heads", "value_heads", "key_dim", "value_dim")
    key_heads, value_heads = attrs["key_heads"], attrs["value_heads"]
    key_dim, value_dim = attrs["key_dim"], attrs["value_dim"]
    expect(value_heads % key_heads == 0,
           f"{op}: value_heads ({value_heads}) must be a multiple of key_heads ({key_heads})")
    expect(isinstance(attrs["l2_norm"], bool), f"{op}: l2_norm must be true or false")
    rule, decay = attrs["update_rule"], attrs["decay"]
    expect(rule in UPDATE_RULES, f"{op}: update_rule must be one of {', '.join(UPDATE_RULES)}, got {rule!r}")
    expect(decay in DECAYS, f"{op}: decay must be one of {', '.join(DECAYS)}, got {decay!r}")
    check_chunk(op, attrs)
    scale = attrs["scale"]
    expect(scale is None or (isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0),
           f"{op}: scale must be None or a positive number")
    batch, seq = _activation(op, "q", ops["q"], width=key_heads * key_dim)
    _activation(op, "k", ops["k"], batch, seq, key_heads * key_dim)
    _activation(op, "v", ops["v"], batch, seq, value_heads * value_dim)
    decay_width = value_heads * key_dim if decay == "channel" else value_heads
    if ops["a"] is not None:
        _activation(op, "a", ops["a"], batch, seq, decay_width)
    else:
        expect(decay == "head" and ops["dt_bias"] is None,
               f"{op}: without 'a' the decay is constant per head (decay=head, no dt_bias)")
    if rule == "gated_delta":
        _activation(op, "b", ops["b"], batch, seq, value_heads)
    else:
        expect(ops["b"] is None, f"{op}: update_rule=gated has no write strength: leave 'b' out")
    expect(ops["A_log"] is not None, f"{op}: operand 'A_log' is required")
    expect_shape(op, "A_log", ops["A_log"], (value_heads,))
    if ops["dt_bias"] is not None:
        expect_shape(op, "dt_bias", ops["dt_bias"], (decay_width,))
    _mask(op, ops["attention_mask"], batch)
    v = ops["v"]
    return [TensorType(v.dtype, v.shape)] + _state_out(op, ops["past_state"], (batch, value_heads, key_dim, value_dim))


def _reference(inputs, attrs):
    """The gated delta rule, one token at a time: decay the state by exp(g), write
    β·k ⊗ (v − Sᵀk) (the gated rule: k ⊗ v), read Sᵀq (q and k L2-normalised, q scaled).
    With ``chunk`` set and more than one token, computed in chunks
    (``chunked_gated_delta_rule``); one token takes the step."""
    ops = by_name(OPERANDS, inputs)
    form = {k: v for k, v in attrs.items() if k != "chunk"}
    if attrs["chunk"] is None or ops["q"].shape[1] <= 1:
        out, state = gated_delta_rule(**ops, **form)
    else:
        out, state = chunked_gated_delta_rule(**ops, **form, chunk=attrs["chunk"])
    return _with_state(out, state, ops["v"], ops["past_state"])


def _cost(inputs, outputs, attrs):
    """Per token and value head, over the d_k x d_v state: 2 FLOPs per element for the read
    Sᵀk (the delta rule only), 2 for the write k ⊗ correction, 2 for the output Sᵀq (as
    attention counts 2 per cached number for scores and 2 for the weighted sum); the decay
    (1 per element), the norms and the gates apart."""
    q = inputs[0]
    rows = q.shape[0] * q.shape[1]
    state = attrs["value_heads"] * attrs["key_dim"] * attrs["value_dim"]
    per_element = 6 if attrs["update_rule"] == "gated_delta" else 4
    decay = attrs["value_heads"] * (attrs["key_dim"] if attrs["decay"] == "channel" else 1)
    gates = 6 * decay + 2 * attrs["value_heads"] + 6 * attrs["key_heads"] * attrs["key_dim"]
    return Cost(flops=per_element * rows * state, other_flops=rows * (state + gates)) + _io(inputs, outputs)


register(OpDef("gated_delta_rule", OPERANDS, ATTRS, _infer, _reference, _cost, level="model"))

__all__ = ["gated_delta_rule", "chunked_gated_delta_rule", "delta_inputs", "l2norm"]
