"""RWKV-4's two recurrent pieces (transformers' ``RwkvForCausalLM``): the token shift and
the WKV recurrence.

- ``token_shift(x, past_state?)``: x [B, T, d] -> (shifted [B, T, d], present [B, d]):
  shifted_t = x_{t-1}, the first token's from ``past_state`` (zeros without one: transformers'
  ``nn.ZeroPad2d((0, 0, 1, -1))``); the present state is the last token's x. RWKV keeps two
  per layer (the time mixing's and the channel mixing's, transformers' ``state[1]`` and
  ``state[0]``), each over its LayerNorm's output.
- ``rwkv4_wkv(k, v, time_decay, time_first, past_state?)``: k, v [B, T, A] (after the key
  and value projections), ``time_decay`` w and ``time_first`` u [A] as stored ->
  (wkv [B, T, A], present [B, 3, A]). The state is (num, den, max) per channel, the numerator
  and denominator scaled by exp(-max) (transformers' ``state[2:5]``; irc keeps them stacked in
  one ``recurrent_state``). Per token, exactly as ``rwkv_linear_attention_cpu`` computes it,
  with w' = -exp(w)::

      m  = max(max, k + u);      wkv = (e^(max-m)·num + e^(k+u-m)·v) / (e^(max-m)·den + e^(k+u-m))
      m' = max(max + w', k);     num = e^(max+w'-m')·num + e^(k-m')·v
                                 den = e^(max+w'-m')·den + e^(k-m');   max = m'

Both ops are float32 inside. An empty state is a zero one: a channel whose ``den`` is 0 has
no past, and its ``max`` is read as -1e38 (transformers starts from -1e30 or -1e38: either
makes e^(max - m) exactly 0, as -1e38 does), so a zero state and transformers' initial state
give the same numbers and irc's runtimes start every recurrent state at zeros.

There is no attention mask: transformers' RWKV ignores ``attention_mask`` (it warns), so a
padded token enters the state like any other. The recurrence is sequential; running T tokens
at once equals running them in pieces with the state carried (``tests/ops/test_rwkv.py``).
"""
from __future__ import annotations

import numpy as np

from irc.ops.nn import f32
from irc.ops.registry import Cost, OpDef, TensorType, by_name, expect, expect_shape, register
from irc.ops.ssm import _activation, _io, _state_out, _with_state

SHIFT_OPERANDS = ("x", "past_state?")
WKV_OPERANDS = ("k", "v", "time_decay", "time_first", "past_state?")
EMPTY_MAX = -1e38  # a channel with no past (den == 0): e^(max - m) is exactly 0


def token_shift(x, past_state=None) -> tuple[np.ndarray, np.ndarray]:
    """(shifted [B, T, d], present [B, d]): each token's previous token, the first's from
    ``past_state`` (zeros without one); the present is the last token."""
    x = np.asarray(x)
    past = np.zeros((x.shape[0], x.shape[2]), x.dtype) if past_state is None else np.asarray(past_state, x.dtype)
    shifted = np.concatenate([past[:, None, :], x[:, :-1]], axis=1)
    present = x[:, -1] if x.shape[1] else past
    return np.ascontiguousarray(shifted), np.ascontiguousarray(present)


def initial_state(past_state, batch: int, channels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(num, den, max) [B, A] float32 from ``past_state`` [B, 3, A] (zeros without one), an
    empty channel's max (den 0) read as ``EMPTY_MAX``."""
    if past_state is None:
        state = np.zeros((batch, 3, channels), np.float32)
    else:
        state = f32(past_state)
    num, den, mx = (state[:, j].copy() for j in range(3))
    return num, den, np.where(den == 0, np.float32(EMPTY_MAX), mx).astype(np.float32)


def rwkv4_wkv(k, v, time_decay, time_first, past_state=None) -> tuple[np.ndarray, np.ndarray]:
    """(wkv [B, T, A], present [B, 3, A]): the recurrence of the module docstring, float32,
    one token at a time, in transformers' order of operations."""
    k, v, u = f32(k), f32(v), f32(time_first)
    w = (-np.exp(f32(time_decay))).astype(np.float32)
    batch, seq, channels = k.shape
    num, den, mx = initial_state(past_state, batch, channels)
    out = np.zeros((batch, seq, channels), np.float32)
    for t in range(seq):
        k_t, v_t = k[:, t], v[:, t]
        ku = k_t + u
        m = np.maximum(mx, ku)
        e1, e2 = np.exp(mx - m), np.exp(ku - m)
        out[:, t] = (e1 * num + e2 * v_t) / (e1 * den + e2)
        decayed = mx + w
        m = np.maximum(decayed, k_t)
        e1, e2 = np.exp(decayed - m), np.exp(k_t - m)
        num, den, mx = e1 * num + e2 * v_t, e1 * den + e2, m
    return out, np.stack([num, den, mx], axis=1).astype(np.float32)


def _shift_infer(inputs, attrs):
    ops = by_name(SHIFT_OPERANDS, inputs)
    batch, _ = _activation("token_shift", "x", ops["x"])
    x = ops["x"]
    width = x.shape[2]
    return [TensorType(x.dtype, x.shape)] + _state_out("token_shift", ops["past_state"], (batch, width))


def _shift_reference(inputs, attrs):
    """x shifted one token later along time, the first token's from the past state; the
    present state is the last token."""
    ops = by_name(SHIFT_OPERANDS, inputs)
    shifted, present = token_shift(ops["x"], ops["past_state"])
    return _with_state(shifted, present, ops["x"], ops["past_state"])


def _shift_cost(inputs, outputs, attrs):
    return _io(inputs, outputs)


def _wkv_infer(inputs, attrs):
    ops = by_name(WKV_OPERANDS, inputs)
    op = "rwkv4_wkv"
    batch, seq = _activation(op, "k", ops["k"])
    channels = ops["k"].shape[2]
    expect(isinstance(channels, int), f"{op}: the channel count must be a number, got {channels!r}")
    _activation(op, "v", ops["v"], batch, seq, channels)
    for name in ("time_decay", "time_first"):
        expect(ops[name] is not None, f"{op}: operand {name!r} is required")
        expect_shape(op, name, ops[name], (channels,))
    v = ops["v"]
    return [TensorType(v.dtype, v.shape)] + _state_out(op, ops["past_state"], (batch, 3, channels))


def _wkv_reference(inputs, attrs):
    """RWKV-4's WKV recurrence with (num, den, max) state per channel (transformers'
    ``rwkv_linear_attention_cpu``), one token at a time, float32."""
    ops = by_name(WKV_OPERANDS, inputs)
    out, state = rwkv4_wkv(**ops)
    return _with_state(out, state, ops["v"], ops["past_state"])


def _wkv_cost(inputs, outputs, attrs):
    """Per token and channel: 4 exponentials, 2 maxima, 13 adds, multiplies and a divide
    (elementwise: ``other_flops``); no matmul-like work."""
    k = inputs[0]
    return Cost(other_flops=19 * k.shape[0] * k.shape[1] * k.shape[2]) + _io(inputs, outputs)


register(OpDef("token_shift", SHIFT_OPERANDS, {}, _shift_infer, _shift_reference, _shift_cost, level="model"))
register(OpDef("rwkv4_wkv", WKV_OPERANDS, {}, _wkv_infer, _wkv_reference, _wkv_cost, level="model"))

__all__ = ["token_shift", "rwkv4_wkv", "initial_state", "EMPTY_MAX"]
