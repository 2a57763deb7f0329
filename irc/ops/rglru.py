"""The RG-LRU recurrence of Griffin / RecurrentGemma (transformers' ``RecurrentGemmaRglru``).

``rg_lru(x, a_param, input_gate, recurrence_gate, position_ids?, past_state?)``: x [B, T, W]
(the causal convolution's output), ``a_param`` Λ [W] as stored (``recurrent_param``), the
gates [B, T, W] *after* their sigmoids (the block-diagonal gate projections and sigmoids are
ordinary irc ops outside), ``position_ids`` i64 [B, T] (a token at position 0 resets the
recurrence, as transformers' ``reset = position_ids == 0``), the state [B, W] float32 ->
(y [B, T, W], present [B, W]). Per token, in transformers' order of operations (float32)::

    log_a = (-8 · r) · softplus(Λ);   a = exp(log_a);   a² = exp(2 · log_a)
    m     = 1 at a reset token, else sqrt(1 - a²)      (``SqrtBoundDerivative``: a plain sqrt
                                                          forward; it only clips the gradient)
    n     = (x · i) · m;   a' = a · (not reset);   h = a' · h + n;   y = h

Without ``position_ids`` no token resets. A zero state is an empty one. transformers' RG-LRU
ignores ``attention_mask``: a padded token enters the state like any other. Running T tokens
at once equals running them in pieces with the state carried (``tests/ops/test_rglru.py``).
"""
from __future__ import annotations

import numpy as np

from irc.dtypes import DType
from irc.ops.nn import f32
from irc.ops.registry import Cost, OpDef, TensorType, by_name, expect, expect_shape, register
from irc.ops.ssm import _activation, _io, _state_out, _with_state, softplus

OPERANDS = ("x", "a_param", "input_gate", "recurrence_gate", "position_ids?", "past_state?")
C = 8.0  # transformers' -8.0 in log_recurrent_gate


def gates(a_param, recurrence_gate, input_gate, x, position_ids=None) -> tuple[np.ndarray, np.ndarray]:
    """(a' [B, T, W], n [B, T, W]): the decay with resets applied and the normalised input."""
    r, i, x = f32(recurrence_gate), f32(input_gate), f32(x)
    log_a = (np.float32(-C) * r) * softplus(f32(a_param))
    a = np.exp(log_a)
    a_square = np.exp(np.float32(2.0) * log_a)
    multiplier = np.sqrt(np.float32(1.0) - a_square)
    if position_ids is None:
        reset = np.zeros(x.shape[:2] + (1,), bool)
    else:
        reset = (np.asarray(position_ids) == 0)[:, :, None]
    multiplier = np.where(reset, np.float32(1.0), multiplier).astype(np.float32)
    normalized = (x * i) * multiplier
    return (a * ~reset).astype(np.float32), normalized.astype(np.float32)


def rg_lru(x, a_param, input_gate, recurrence_gate, position_ids=None, past_state=None) -> tuple[np.ndarray, np.ndarray]:
    """(y [B, T, W], present [B, W]): the recurrence of the module docstring, float32."""
    a, n = gates(a_param, recurrence_gate, input_gate, x, position_ids)
    batch, seq, width = a.shape
    h = np.zeros((batch, width), np.float32) if past_state is None else f32(past_state).copy()
    out = np.zeros((batch, seq, width), np.float32)
    for t in range(seq):
        h = a[:, t] * h + n[:, t]
        out[:, t] = h
    return out, h.astype(np.float32)


def _infer(inputs, attrs):
    ops = by_name(OPERANDS, inputs)
    batch, seq = _activation("rg_lru", "x", ops["x"])
    width = ops["x"].shape[2]
    expect(isinstance(width, int), f"rg_lru: the width must be a number, got {width!r}")
    for name in ("input_gate", "recurrence_gate"):
        _activation("rg_lru", name, ops[name], batch, seq, width)
    expect(ops["a_param"] is not None, "rg_lru: operand 'a_param' is required")
    expect_shape("rg_lru", "a_param", ops["a_param"], (width,))
    pos = ops["position_ids"]
    if pos is not None:
        expect(pos.dtype in (DType.i64, DType.i32), f"rg_lru: position_ids must be integer, got {pos.dtype}")
        expect_shape("rg_lru", "position_ids", pos, (batch, seq))
    x = ops["x"]
    return [TensorType(x.dtype, x.shape)] + _state_out("rg_lru", ops["past_state"], (batch, width))


def _reference(inputs, attrs):
    """The RG-LRU recurrence (transformers' ``RecurrentGemmaRglru``), float32."""
    ops = by_name(OPERANDS, inputs)
    out, state = rg_lru(**ops)
    return _with_state(out, state, ops["x"], ops["past_state"])


def _cost(inputs, outputs, attrs):
    """Per token and channel: 3 exponentials/softplus, a sqrt, about 10 adds and multiplies
    (elementwise: ``other_flops``); no matmul-like work."""
    x = inputs[0]
    return Cost(other_flops=14 * x.shape[0] * x.shape[1] * x.shape[2]) + _io(inputs, outputs)


register(OpDef("rg_lru", OPERANDS, {}, _infer, _reference, _cost, level="model"))

__all__ = ["rg_lru", "gates", "OPERANDS", "C"]
