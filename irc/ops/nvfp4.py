"""``nvfp4_fake_quantize``: a float tensor rounded to NVFP4 and back (Kolibri-1.1's sparse
attention keys and values, and its indexer's routing queries and keys; transformers'
``kolibri1_1.modeling_kolibri1_1.nvfp4_fake_quantize``).

    nvfp4_fake_quantize(x [..., D], D a multiple of 16) -> x's dtype [..., D]

Per block of 16 consecutive values of the last axis, in float32:

    scale  = E4M3(clamp(max|x| / 6, 2^-9, 448))      (round to nearest, ties to even)
    m      = min(|x / scale|, 6)
    step   = 0.5 if m < 2, 1 if m < 4, else 2          (E2M1's spacing)
    result = copysign(round_half_even(m / step) · step, x / scale) · scale

E4M3 rounding of s in [2^-9, 448] is round_half_even(s / u) · u with the spacing u =
2^(max(e, -6) - 3), e = floor(log2 s) (subnormals below 2^-6 spaced 2^-9): ``e4m3_spacing``
finds u by comparing s with the powers of two, so every target computes it exactly (no log,
no float8 type); every other step is exact float32 arithmetic, so the result is bitwise
transformers' (which casts through ``torch.float8_e4m3fn``).

Cost: about twenty operations per element; x read once, the result written once.
"""
from __future__ import annotations

import numpy as np

from irc import dims
from irc.ops.primitives import elementwise_cost
from irc.ops.registry import OpDef, TensorType, expect, register

OP = "nvfp4_fake_quantize"
BLOCK = 16
# s >= 2^k (k = -5..8) -> spacing 2^(k - 3); below 2^-5 the spacing is 2^-9
E4M3_THRESHOLDS = [2.0 ** k for k in range(-5, 9)]
E4M3_SPACINGS = [2.0 ** (k - 3) for k in range(-5, 9)]
E4M3_MIN, E4M3_MAX = 2.0 ** -9, 448.0


def e4m3_spacing(scale: np.ndarray) -> np.ndarray:
    """The E4M3 spacing at each float32 ``scale`` in [2^-9, 448]."""
    spacing = np.full(scale.shape, E4M3_MIN, np.float32)
    for threshold, step in zip(E4M3_THRESHOLDS, E4M3_SPACINGS):
        spacing = np.where(scale >= np.float32(threshold), np.float32(step), spacing)
    return spacing


def nvfp4_round(x) -> np.ndarray:
    """x rounded to NVFP4 and back, blocks of 16 along the last axis, in x's dtype."""
    x = np.asarray(x)
    blocks = x.astype(np.float32).reshape(x.shape[:-1] + (-1, BLOCK))
    bound = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(6)
    bound = np.minimum(np.maximum(bound, np.float32(E4M3_MIN)), np.float32(E4M3_MAX))
    spacing = e4m3_spacing(bound)
    scale = (np.round(bound / spacing) * spacing).astype(np.float32)
    scaled = blocks / scale
    magnitude = np.minimum(np.abs(scaled), np.float32(6))
    step = np.where(magnitude < 2, np.float32(0.5), np.where(magnitude < 4, np.float32(1), np.float32(2)))
    rounded = (np.round(magnitude / step) * step).astype(np.float32)  # np.round: ties to even
    out = np.where(scaled < 0, -rounded, rounded) * scale
    return out.reshape(x.shape).astype(x.dtype)


def _infer(inputs, attrs):
    x = inputs[0]
    width = x.shape[-1] if x.rank else None
    expect(x.rank >= 1 and x.dtype.is_float and isinstance(width, int) and width % BLOCK == 0,
           f"{OP}: x must be float [..., D] with D a multiple of {BLOCK}, got {x.dtype} "
           f"{dims.format_shape(x.shape)}")
    return [TensorType(x.dtype, x.shape)]


def _reference(inputs, attrs):
    """x rounded to NVFP4 (E2M1 values, one E4M3 scale per 16) and back (``nvfp4_round``)."""
    return [nvfp4_round(inputs[0])]


register(OpDef(OP, ("x",), {}, _infer, _reference, elementwise_cost))
