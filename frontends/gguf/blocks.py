"""GGUF block formats -> irc's quantized weights (``irc.ops.quant``: MatMulNBits' layout).

A ggml block type stores a row of K weights in blocks; each format below is rewritten,
without dequantizing, as unsigned codes q with one scale (and a zero point) per irc block,
such that (q - zero_point) * scale is the weight:

=======  ==========================  ======  =====  ======================================
type     ggml value                  bits    block  irc form
=======  ==========================  ======  =====  ======================================
Q4_0     d * (q4 - 8)                4       32     q4, scale d (zero point 8: symmetric)
Q4_1     d * q4 + m                  4       32     q4, scale d, float zero point -m/d
Q5_0     d * (q5 - 16)               8       32     q5 + 112, scale d (symmetric, 128)
Q5_1     d * q5 + m                  8       32     q5, scale d, float zero point -m/d
Q8_0     d * q8 (q8 signed)          8       32     q8 + 128, scale d (symmetric)
Q2_K     d*s * q2 - dmin*m           4       16     q2, scale d*s, float zero (dmin*m)/(d*s)
Q3_K     d*(s - 32) * q3 (signed)    4       16     q3 + 8, scale d*(s - 32) (symmetric)
Q4_K     d*s * q4 - dmin*m           4       32     q4, scale d*s, float zero (dmin*m)/(d*s)
Q5_K     d*s * q5 - dmin*m           8       32     q5, scale d*s, float zero (dmin*m)/(d*s)
Q6_K     d*s * (q6 - 32)             8       16     q6 + 96, scale d*s (symmetric)
=======  ==========================  ======  =====  ======================================

Scales are float32 (d is float16 and s at most 8 bits, so d*s is exact in float32).

Exactness (what ``tests/frontends/test_gguf_blocks.py`` checks against ``gguf``'s own
dequantizer, per format): the symmetric forms give the same float32 values bit for bit,
since the code offset is an exact integer and the product is the same single rounding.
A float zero point cannot be exact: -m/d is rounded to float32, and (q - zp) * d rounds
twice where ggml's d*q + m rounds once, so an element differs by at most 2 ulp of the
larger of |d*q| and |m| (where the two nearly cancel, that is many ulp of the small
result). A sub-block whose scale is 0 holds the constant c = m (or -dmin*m) in every
element; it becomes codes 0, scale c, zero point -1, which is exact.

Other types (IQ*, TQ*, MXFP4, F16, BF16, ...) have no exact form here; ``EXACT`` lists
the ones that do. Decoding runs over chunks of blocks, so a large tensor never has more
than a few megabytes of intermediates.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
from gguf import GGML_QUANT_SIZES, QK_K, GGMLQuantizationType as T
from gguf.quants import Q4_K

from irc.ops.quant import pack_codes

CHUNK_BLOCKS = 1 << 14  # ggml blocks decoded at once


@dataclass(frozen=True)
class Scheme:
    """How one ggml type maps: irc code width, irc block size, float zero points or not."""
    bits: int
    block: int
    float_zero: bool
    decode: Callable  # blocks u8 [n, type_size] -> (codes u8 [n, QK], scale f32 [n, S], zero f32 [n, S] | None)


def _f16(column: np.ndarray) -> np.ndarray:
    """Bytes [n, 2] -> float32 [n, 1] (little-endian float16)."""
    return np.ascontiguousarray(column).view(np.float16).astype(np.float32)


def _nibbles_halves(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 codes: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """4 bytes (uint32, bit i = element i) -> the 5th bits of 32 elements."""
    bits = np.ascontiguousarray(qh).view(np.uint32) >> np.arange(32, dtype=np.uint32)
    return (bits & 1).astype(np.uint8)


def _with_offset(scale: np.ndarray, offset: np.ndarray, codes: np.ndarray) -> tuple:
    """value = scale * q + offset per sub-block -> (codes, scale, zero = -offset / scale);
    a zero scale holds the constant ``offset``: codes 0, scale offset, zero -1."""
    flat = scale == 0
    safe = np.where(flat, np.float32(1), scale)
    zero = np.where(flat, np.float32(-1), -offset / safe).astype(np.float32)
    scale = np.where(flat, offset, scale).astype(np.float32)
    if flat.any():
        per = codes.shape[-1] // scale.shape[-1]
        codes = np.where(np.repeat(flat, per, axis=-1), np.uint8(0), codes)
    return codes, scale, zero


def _q4_0(b):
    return _nibbles_halves(b[:, 2:]), _f16(b[:, :2]), None


def _q4_1(b):
    return _with_offset(_f16(b[:, :2]), _f16(b[:, 2:4]), _nibbles_halves(b[:, 4:]))


def _q5_0(b):
    q = _nibbles_halves(b[:, 6:]) | (_high_bits(b[:, 2:6]) << 4)
    return q + np.uint8(112), _f16(b[:, :2]), None


def _q5_1(b):
    q = _nibbles_halves(b[:, 8:]) | (_high_bits(b[:, 4:8]) << 4)
    return _with_offset(_f16(b[:, :2]), _f16(b[:, 2:4]), q)


def _q8_0(b):
    return (np.ascontiguousarray(b[:, 2:]).view(np.int8).astype(np.int16) + 128).astype(np.uint8), _f16(b[:, :2]), None


def _q2_k(b):
    n = len(b)
    scales, qs = b[:, :QK_K // 16], b[:, QK_K // 16:QK_K // 16 + QK_K // 4]
    d, dmin = _f16(b[:, -4:-2]), _f16(b[:, -2:])
    q = (qs.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    dl = d * (scales & 0xF).astype(np.float32)
    ml = dmin * (scales >> 4).astype(np.float32)
    return _with_offset(dl, -ml, q.reshape(n, QK_K).astype(np.uint8))


def _q3_k(b):
    n = len(b)
    hmask, qs = b[:, :QK_K // 8], b[:, QK_K // 8:QK_K // 8 + QK_K // 4]
    packed, d = b[:, QK_K // 8 + QK_K // 4:-2], _f16(b[:, -2:])
    low = (packed[:, :8].reshape(n, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(n, 16)
    high = (packed[:, 8:].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(n, 16)
    sub = ((low & 0x0F) | ((high & 0x03) << 4)).astype(np.int16) - 32
    ql = (qs.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)).reshape(n, QK_K) & 3
    qh = (hmask.reshape(n, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)).reshape(n, QK_K) & 1
    q = ql.astype(np.int16) - ((qh ^ 1).astype(np.int16) << 2)  # in [-4, 3]
    return (q + 8).astype(np.uint8), d * sub.astype(np.float32), None


def _k_scales(b):
    """(d*s [n, 8], dmin*m [n, 8], rest) of a Q4_K / Q5_K block."""
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, m = Q4_K.get_scale_min(np.ascontiguousarray(b[:, 4:4 + Q4_K.K_SCALE_SIZE]))
    return d * sc.astype(np.float32), dmin * m.astype(np.float32), b[:, 4 + Q4_K.K_SCALE_SIZE:]


def _q4_k(b):
    n = len(b)
    scale, offset, qs = _k_scales(b)
    q = (qs.reshape(n, -1, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    return _with_offset(scale, -offset, q.reshape(n, QK_K).astype(np.uint8))


def _q5_k(b):
    n = len(b)
    scale, offset, rest = _k_scales(b)
    qh, qs = rest[:, :QK_K // 8], rest[:, QK_K // 8:]
    ql = (qs.reshape(n, -1, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    high = (qh.reshape(n, -1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1
    q = ql.reshape(n, QK_K) | (high.reshape(n, QK_K) << 4)
    return _with_offset(scale, -offset, q.astype(np.uint8))


def _q6_k(b):
    n = len(b)
    ql, qh = b[:, :QK_K // 2], b[:, QK_K // 2:QK_K // 2 + QK_K // 4]
    sub, d = b[:, QK_K // 2 + QK_K // 4:-2], _f16(b[:, -2:])
    low = (ql.reshape(n, -1, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    high = (qh.reshape(n, -1, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 0x03
    q = low.reshape(n, -1, 32) | (high.reshape(n, -1, 32) << 4)
    scale = d * np.ascontiguousarray(sub).view(np.int8).astype(np.float32)
    return (q.reshape(n, QK_K) + np.uint8(96)).astype(np.uint8), scale, None


EXACT: dict[T, Scheme] = {
    T.Q4_0: Scheme(4, 32, False, _q4_0), T.Q4_1: Scheme(4, 32, True, _q4_1),
    T.Q5_0: Scheme(8, 32, False, _q5_0), T.Q5_1: Scheme(8, 32, True, _q5_1),
    T.Q8_0: Scheme(8, 32, False, _q8_0),
    T.Q2_K: Scheme(4, 16, True, _q2_k), T.Q3_K: Scheme(4, 16, False, _q3_k),
    T.Q4_K: Scheme(4, 32, True, _q4_k), T.Q5_K: Scheme(8, 32, True, _q5_k),
    T.Q6_K: Scheme(8, 16, False, _q6_k),
}


def repack(raw: np.ndarray, ggml_type: T, k: int) -> tuple:
    """Stored bytes [..., N, row bytes] of an ``EXACT`` type with K weights per row ->
    (qweight u8 [..., N, K/block, block*bits/8], scales f32 [..., N, K/block],
    zero_points f32 [..., N, K/block] or None), in ``irc.ops.quant``'s layout."""
    scheme = EXACT[ggml_type]
    qk, type_size = GGML_QUANT_SIZES[ggml_type]
    lead = raw.shape[:-1]
    blocks = np.asarray(raw).reshape(-1, type_size)
    per = qk // scheme.block  # irc blocks per ggml block
    codes = np.empty((len(blocks), qk), np.uint8)
    scales = np.empty((len(blocks), per), np.float32)
    zeros: Optional[np.ndarray] = np.empty((len(blocks), per), np.float32) if scheme.float_zero else None
    for start in range(0, len(blocks), CHUNK_BLOCKS):
        part = slice(start, start + CHUNK_BLOCKS)
        q, s, z = scheme.decode(blocks[part])
        codes[part], scales[part] = q, s
        if zeros is not None:
            zeros[part] = z
    nb = k // scheme.block
    codes = pack_codes(codes.reshape(*lead, nb, scheme.block), scheme.bits)
    zeros = None if zeros is None else zeros.reshape(*lead, nb)
    return codes, scales.reshape(*lead, nb), zeros
