"""The mLSTM recurrence of xLSTM (transformers' ``xLSTMBackend`` in ``modeling_xlstm.py``).

``mlstm(q, k, v, igate, fgate, past_state?, past_normalizer?, past_max?)`` with attrs
``heads`` H and ``eps``: q, k [B, T, H·dk], v [B, T, H·dv] (the projections, heads
concatenated), ``igate`` / ``fgate`` [B, T, H] the input and forget gate pre-activations
(after their soft-caps: those are ordinary irc ops outside), the state per head: the matrix
memory C ``past_state`` [B, H, dk, dv] (key-major, transformers' ``c_state``), the
normalizer n ``past_normalizer`` [B, H, dk] and the max-stabilizer m ``past_max`` [B, H, 1]
(all three or none) -> (h [B, T, H·dv], present C, present n, present m). Per token and head,
in the order of transformers' ``mlstm_recurrent_step_native`` (float32)::

    f' = logsigmoid(f);   m_t = max(f' + m, i);   a = exp(f' + m - m_t);   b = exp(i - m_t)
    C  = a · C + b · k ⊗ v;   n = a · n + b · k;   q' = q · dk^-0.5
    h  = (q' · C) / (max(|q' · n|, exp(-m_t)) + eps)

A zero state is an empty one (transformers' ``xLSTMCache`` starts at zeros, m included).
transformers' prefill runs whole chunks of ``chunk_size`` tokens through its chunkwise
kernel and the rest through this step: the chunkwise form computes the same max-stabilizer
(a max over the same terms), so the two agree to rounding; irc computes the step form for
every token (``tests/ops/test_mlstm.py`` holds it against both of transformers' kernels).
There is no attention mask: transformers' xLSTM takes none, so a padded token enters the
state like any other. Running T tokens at once equals running them in pieces with the state
carried.
"""
from __future__ import annotations

import numpy as np

from irc.ops.nn import f32
from irc.ops.registry import REQUIRED, Cost, OpDef, TensorType, by_name, expect, expect_shape, register
from irc.ops.ssm import _activation, _io

OPERANDS = ("q", "k", "v", "igate", "fgate", "past_state?", "past_normalizer?", "past_max?")
STATES = ("past_state", "past_normalizer", "past_max")


def logsigmoid(x) -> np.ndarray:
    """log(sigmoid(x)) as torch computes it: min(x, 0) - log1p(exp(-|x|)), float32."""
    x = f32(x)
    return (np.minimum(x, np.float32(0.0)) - np.log1p(np.exp(-np.abs(x)))).astype(np.float32)


def mlstm_step(q, k, v, i, f, c, n, m, eps: float) -> tuple:
    """One token: q, k [B, H, dk], v [B, H, dv], i, f [B, H, 1] and the state (C, n, m) ->
    (h [B, H, dv], C, n, m), float32 (the module docstring's update)."""
    f_log = logsigmoid(f)
    m_new = np.maximum(f_log + m, i)
    a = np.exp(f_log + m - m_new)
    b = np.exp(i - m_new)
    q_scaled = q * np.float32(q.shape[-1] ** -0.5)
    c = a[..., None] * c + b[..., None] * (k[..., :, None] * v[..., None, :])
    n = a * n + b * k
    numerator = np.einsum("bhk,bhkv->bhv", q_scaled, c).astype(np.float32)
    qn = np.sum(q_scaled * n, axis=-1, keepdims=True, dtype=np.float32)
    denominator = np.maximum(np.abs(qn), np.exp(-m_new)) + np.float32(eps)
    return (numerator / denominator).astype(np.float32), c.astype(np.float32), n.astype(np.float32), m_new


def mlstm(q, k, v, igate, fgate, past_state=None, past_normalizer=None, past_max=None, *, heads: int,
          eps: float = 1e-6) -> tuple:
    """(h [B, T, H·dv], C [B, H, dk, dv], n [B, H, dk], m [B, H, 1]): the recurrence of the
    module docstring from the given state (zeros without one), float32."""
    q, k, v, i, f = f32(q), f32(k), f32(v), f32(igate), f32(fgate)
    batch, seq = q.shape[:2]
    dk, dv = q.shape[2] // heads, v.shape[2] // heads
    q, k = q.reshape(batch, seq, heads, dk), k.reshape(batch, seq, heads, dk)
    v = v.reshape(batch, seq, heads, dv)
    c = np.zeros((batch, heads, dk, dv), np.float32) if past_state is None else f32(past_state).copy()
    n = np.zeros((batch, heads, dk), np.float32) if past_normalizer is None else f32(past_normalizer).copy()
    m = np.zeros((batch, heads, 1), np.float32) if past_max is None else f32(past_max).copy()
    out = np.zeros((batch, seq, heads, dv), np.float32)
    for t in range(seq):
        out[:, t], c, n, m = mlstm_step(q[:, t], k[:, t], v[:, t], i[:, t, :, None], f[:, t, :, None], c, n, m, eps)
    return out.reshape(batch, seq, heads * dv), c, n, m


def _infer(inputs, attrs):
    ops = by_name(OPERANDS, inputs)
    heads = attrs["heads"]
    expect(isinstance(heads, int) and not isinstance(heads, bool) and heads > 0,
           f"mlstm: heads must be a positive int, got {heads!r}")
    eps = attrs.get("eps", 1e-6)
    expect(isinstance(eps, float) and eps >= 0, f"mlstm: eps must be a float >= 0, got {eps!r}")
    batch, seq = _activation("mlstm", "q", ops["q"])
    qk = ops["q"].shape[2]
    _activation("mlstm", "k", ops["k"], batch, seq, qk)
    _activation("mlstm", "v", ops["v"], batch, seq)
    value = ops["v"].shape[2]
    for name, width in (("q", qk), ("v", value)):
        expect(isinstance(width, int) and width % heads == 0,
               f"mlstm: {name}'s width {width!r} is not a multiple of heads {heads}")
    for name in ("igate", "fgate"):
        _activation("mlstm", name, ops[name], batch, seq, heads)
    given = [ops[s] is not None for s in STATES]
    expect(all(given) or not any(given), "mlstm: past_state, past_normalizer and past_max come together")
    out = [TensorType(ops["v"].dtype, ops["v"].shape)]
    if not any(given):
        return out
    dk, dv = qk // heads, value // heads
    for name, shape in zip(STATES, ((batch, heads, dk, dv), (batch, heads, dk), (batch, heads, 1))):
        expect_shape("mlstm", name, ops[name], shape)
        expect(ops[name].dtype.is_float, f"mlstm: {name} must be float, got {ops[name].dtype}")
        out.append(TensorType(ops[name].dtype, shape))
    return out


def _reference(inputs, attrs):
    """The mLSTM recurrence (transformers' ``mlstm_recurrent_step_native``), float32."""
    ops = by_name(OPERANDS, inputs)
    h, c, n, m = mlstm(**ops, heads=attrs["heads"], eps=attrs["eps"])
    if ops["past_state"] is None:
        return [h.astype(ops["v"].dtype)]
    return [h.astype(ops["v"].dtype), c.astype(ops["past_state"].dtype), n.astype(ops["past_normalizer"].dtype),
            m.astype(ops["past_max"].dtype)]


def _cost(inputs, outputs, attrs):
    """Per token and head: the state update k ⊗ v and the read q · C, 2 · dk · dv multiply-adds
    each (``flops``, 4 · dk · dv), and the normalizer's 4 · dk; the gates' exponentials and the
    divisions (about 10 + dv per head) are ``other_flops``."""
    q, v = inputs[0], inputs[2]
    batch, seq, heads = q.shape[0], q.shape[1], attrs["heads"]
    dk, dv = q.shape[2] // heads, v.shape[2] // heads
    per_head = batch * seq * heads
    return (Cost(flops=per_head * (4 * dk * dv + 4 * dk), other_flops=per_head * (10 + dv))
            + _io(inputs, outputs))


register(OpDef("mlstm", OPERANDS, {"heads": REQUIRED, "eps": 1e-6}, _infer, _reference, _cost, level="model"))

__all__ = ["mlstm", "mlstm_step", "logsigmoid", "OPERANDS", "STATES"]
