"""How each GGUF block type is held in the compiled model: the block codes as they are
(``frontends.gguf.blocks``), every block's values kept, or (asked for) re-expressed as 4-bit
codes, lossy, for irc's int4 size.

Measured on ONNX Runtime 1.32's CPU MatMulNBits, one token times a 4864 x 896 weight on 2
threads (``benchmarks/gguf_speed.py --kernels``' models, 2026-12-01; levels 1-3 2026-12-07): 4-bit codes
0.09-0.10 ms at accuracy level 4 (int8 activations), symmetric or with u8 zero points alike,
and 0.3-0.5 ms at levels 0-3 (float activations); 8-bit codes 0.06-0.28 ms at level 4 (as fast
as 4-bit codes while a weight sits in cache; a 151936 x 896 head, read from memory, 23-32 ms
against 15-20) but 12-40 ms at levels 0-3 (the kernel dequantizes the whole weight on every
call); float zero points 6-13 ms at either level (the same whole-weight path), which is why
``backends.onnx.quant_pack`` gives the kernel u8 zero points and adds the fractions back with
one small correction per activation (exact up to float rounding). So every weight runs at
level 4, the level irc's int4 uses (``backends.onnx.quant.ORT_ACCURACY_LEVEL``): the weights
stay the file's, the activations are rounded to int8 per block inside the kernel, as
llama.cpp's own CPU kernels round them (Q8_0 / Q8_1 / Q8_K activation blocks).

``form(ggml type)`` -> ``Form`` (``weights="blocks"``, the default: every block's values):

=========  ===================================================================================
Q4_0,Q3_K  4-bit codes, symmetric (Q3_K block 16): exact
Q4_1,      4-bit codes, float zero points: exact up to float rounding (``blocks``); the ONNX
Q4_K,Q2_K  backend adds the zero points' fractions back as a correction
Q5_0,Q6_K  8-bit codes, symmetric, under the file's per-block scale (Q5_0: q5 + 112, Q6_K:
Q8_0       q6 + 96, block 16): exact, bit for bit
Q5_1,Q5_K  8-bit codes, float zero points: exact up to float rounding, the same correction
           as Q4_1 / Q4_K (ORT's kernel takes u8 zero points, the fractions are added back)
=========  ===================================================================================

``weights="blocks4"`` (``irc compile --gguf-weights blocks4``; the default before 2026-12-07) re-expresses Q5_0, Q6_K, Q5_1 and Q5_K as 4-bit
codes with u8 zero points over the same blocks (``requantize``): a block whose integer levels
(with 0) span at most 16 values is exact, any other is rounded to 16 levels over its range,
and Q5_1 / Q5_K blocks are all rounded (their float zero points leave no integer levels).
What it costs (``benchmarks/gguf_faithful.py``, 2026-12-07, top-1 agreement with the file's
values over 512 tokens, perplexity, model bytes): Gemma-3-270M Q4_K_M 95.3% / 75.58 / 304 MB
kept, 74.8% / 91.99 / 267 MB as 4-bit codes (the file's values: 75.07); Qwen2.5-Coder-0.5B
Q4_K_M 97.1% / 65.58 / 698 MB kept, 84.3% / 70.16 / 552 MB (65.70). What the kept form still
differs by is the int8 activations: at level 0 (``exact``) both agree 100%, at level 0-3
speeds no 8-bit kernel can afford. Rounding activations to int8 makes the model chaotic in
float rounding too: on SmolLM2's Q4_1 file, block sums that differ in the last bit (the
corrections agree to 6e-8) differ by 4e-3 after the second layer and 0.34 in the logits (of 27),
so no layout of the same kernels gets nearer the file's float values. ``weights="int4"`` re-expresses Q8_0
too, every projection in 4-bit codes: irc's int4 size and speed, at the cost above (as 4-bit
codes SmolLM2's tied Q8_0 table and head moved perplexity from 85.06 to 97.8 and top-1
agreement with the file's float values from 95.7% to 77.1%). ``weights="exact"`` keeps the file's codes and asks for accuracy level 0: the products are
those of the file's weights in float32, at the 8-bit kernel's level-0 speed (the whole weight
dequantized per call). A table read only by ``embedding`` (not tied to a head) keeps the
file's codes in any case: a lookup reads a few rows whatever their form
(``dequant_embedding``, GatherBlockQuantized).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from frontends.gguf.blocks import EXACT
from irc.ops.quant import pack_codes, unpack_codes

ACCURACY_LEVEL = 4  # MatMulNBits' int8 activations: the fast kernels for 4-bit and 8-bit codes (module docstring)
EXACT_LEVEL = 0  # float activations: weights="exact" computes with the file's weights exactly (8-bit codes: slow)
REQUANTIZED = (T.Q5_0, T.Q6_K, T.Q5_1, T.Q5_K)  # re-expressed as 4-bit codes with weights="blocks4"


@dataclass(frozen=True)
class Form:
    """One type's form in the model: code width, block, zero points (``"none"``, ``"float"``
    or ``"u8"``), whether the values are the file's, and the note's words."""
    bits: int
    block: int
    zero: str
    exact: bool

    def describe(self) -> str:
        zero = {"none": "symmetric", "float": "float zero points", "u8": "u8 zero points"}[self.zero]
        how = "exact" if self.exact else "requantized from the file's codes: lossy"
        if self.zero == "float":
            how = "exact up to float rounding"
        return f"{self.bits}-bit codes, block {self.block}, {zero} ({how})"


def form(ggml_type: T, weights: str = "blocks") -> Form:
    """The ``Form`` a block type of ``blocks.EXACT`` takes under ``load_gguf``'s ``weights``
    (module docstring): the file's codes (``blocks``, ``exact``), ``REQUANTIZED`` as 4-bit codes
    (``blocks4``), or every type as 4-bit codes (``int4``)."""
    scheme = EXACT[ggml_type]
    if weights == "blocks4" and ggml_type in REQUANTIZED or weights == "int4" and scheme.bits > 4:
        return Form(4, scheme.block, "u8", False)
    return Form(scheme.bits, scheme.block, "float" if scheme.float_zero else "none", True)


def requantize(qweight: np.ndarray, scales: np.ndarray, zero_points=None) -> tuple:
    """8-bit codes [..., N, nb, block] with scales [..., N, nb] and zero points (None:
    symmetric, 128; or float [..., N, nb]) -> (4-bit qweight [..., N, nb, block/2], scales f32
    [..., N, nb], u8 zero points [..., N, ceil(nb/2)]). Per block the levels u = code - zero
    point and 0 span [lo, hi]; integer levels with hi - lo <= 15 become codes u - lo with zero
    point -lo and the same scale (exact), any other block is rounded to the nearest of 16
    levels over that range (scale (hi - lo) / 15 of the old one, an integer zero point)."""
    zero = np.float64(128) if zero_points is None else np.asarray(zero_points, np.float64)[..., None]
    levels = unpack_codes(qweight, 8).astype(np.float64) - zero
    lo = np.minimum(levels.min(axis=-1), 0)
    hi = np.maximum(levels.max(axis=-1), 0)
    span = hi - lo
    wide = span > 15 if zero_points is None else np.ones(span.shape, bool)
    step = np.where(wide, np.maximum(span, 1e-30) / 15, 1.0)  # the new step, in old levels
    new_zero = np.where(wide, np.round(-lo / step), -lo).clip(0, 15)
    codes = np.clip(np.round(levels / step[..., None]) + new_zero[..., None], 0, 15).astype(np.uint8)
    new_scales = np.where(wide, scales.astype(np.float64) * step, scales).astype(np.float32)
    return pack_codes(codes, 4), new_scales, pack_codes(new_zero.astype(np.uint8), 4)


def in_form(parts: tuple, held: Form) -> tuple:
    """``blocks.repack``'s (qweight, scales, zero points) of a tensor in the form ``held``
    (``form`` of its type)."""
    if held.exact:
        return parts
    return requantize(*parts)
