"""The compiled kernel behind ``quantize{method=ort}``: onnxruntime's blockwise scheme
(``passes.quantize_ort``'s docstring) in one pass over each row, JIT-compiled by numba.

Why numba and not onnxruntime's own kernel (``quantize_matmul_4bits``, MLAS): measured by
``benchmarks/quantize_speed.py`` on a 14336 x 4096 bfloat16 weight (Llama-3-8B's gate), MLAS
takes 0.72-0.86 s, takes the weight transposed ([K, N], a copy), and holds the GIL for the
whole call, so the writer's two threads run one at a time and a signal waits for it; this
kernel takes 0.20 s on one core, reads the rows as they are stored (bfloat16 as its bits,
float32 as it is) and releases the GIL (``nogil``), so the writer's threads run it side by
side. Its codes and scales equal MLAS's and ``ort_blocks_numpy``'s bit for bit (tests).

Exactness: every step is float32 arithmetic in the order the NumPy statement takes (no
fused multiply-add, no fast-math), a block's min and max are found on the values' bits as
ordered integers (the same values; a NaN weight, which no checkpoint should hold, sorts past
infinity where NumPy would propagate it), rounding is C's ``roundf`` written as trunc plus a
comparison of the exact fraction, and a float16 scale (float16 weights with float16 scales)
is rounded by NumPy between two calls (numba has no float16 scalars): the first computes
float32 scales, the second the codes from the rounded ones. The kernel is compiled on first
use and cached beside this module (``cache=True``). The leading underscore keeps the module
out of ``passes``' import of every pass module: ``passes.quantize_ort`` imports it only when
it quantizes, so an ``irc compile`` that does not never loads numba.
"""
from __future__ import annotations

import numpy as np
from numba import njit


jit = njit(cache=True, nogil=True, error_model="numpy")


@jit
def round_half_away(x):
    whole = np.float32(np.trunc(x))
    frac = x - whole  # exact
    return whole + (np.float32(1) if frac >= np.float32(0.5) else np.float32(0)) \
        - (np.float32(1) if frac <= np.float32(-0.5) else np.float32(0))


@jit
def block_range(keys, base, block, pair):
    """(min, max) of the float32 values whose bits ``keys`` holds at [base, base + block),
    compared as integers: bits ^ ((bits >> 31) & 0x7FFFFFFF) orders floats as int32 (-0
    just below +0), and integer min/max vectorise where float ones need fast-math. ``pair``:
    two int32 slots whose float32 view turns the keys back into values."""
    low, high = np.int32(0x7FFFFFFF), np.int32(-0x80000000)
    for i in range(base, base + block):
        key = keys[i] ^ ((keys[i] >> 31) & np.int32(0x7FFFFFFF))
        low, high = min(low, key), max(high, key)
    pair[0] = low ^ ((low >> 31) & np.int32(0x7FFFFFFF))
    pair[1] = high ^ ((high >> 31) & np.int32(0x7FFFFFFF))
    values = pair.view(np.float32)
    return values[0], values[1]


@jit
def block_scale(low, high, first, bits, symmetric):
    """(scale, zero point) in float32 of a block with that min, max and first value."""
    if symmetric:
        v = high if abs(high) > abs(low) else low
        if v == 0:
            v = first  # all ±0: the first one's sign, as the kernel's scan leaves it
        return -v / np.float32(2 ** (bits - 1)), np.float32(2 ** (bits - 1))
    top = np.float32(2 ** bits - 1)
    low, high = min(low, np.float32(0)), max(high, np.float32(0))
    scale = (high - low) / top + np.float32(0)
    point = -low / scale if scale != 0 else np.float32(0)
    return scale, min(max(round_half_away(point), np.float32(0)), top)


@jit
def load_row(src, k, bf16, buf, bits_view):
    if bf16:
        for i in range(k):
            bits_view[i] = np.uint32(src[i]) << np.uint32(16)
    else:
        for i in range(k):
            buf[i] = src[i]
    for i in range(k, buf.shape[0]):
        buf[i] = np.float32(0)


@jit
def put_zero(zeros, r, b, bits, zero):
    if bits == 8:
        zeros[r, b] = np.uint8(zero)
    elif b % 2 == 0:
        zeros[r, b // 2] = np.uint8(zero)
    else:
        zeros[r, b // 2] |= np.uint8(zero) << np.uint8(4)


@jit
def rows_kernel(rows, k, block, bits, symmetric, given, bf16, qweight, scales, zeros, buf):
    """Codes of every row of ``rows`` [R, K] into qweight [R, nb * block * bits / 8]
    (low nibble first), float32 scales [R, nb] (read when ``given``, else written) and
    packed zero points [R, *] (asymmetric). Per row: each block's scale and zero point,
    spread over its elements, then one loop over the row for the codes (it vectorises)."""
    n = buf.shape[0]
    top = np.float32(2 ** bits - 1)
    codes = np.empty(n, np.uint8)
    inverses, points = np.empty(n, np.float32), np.empty(n, np.float32)
    bits_view, keys, pair = buf.view(np.uint32), buf.view(np.int32), np.empty(2, np.int32)
    for r in range(rows.shape[0]):
        load_row(rows[r], k, bf16, buf, bits_view)
        for b in range(n // block):
            base = b * block
            low, high = block_range(keys, base, block, pair)
            scale, zero = block_scale(low, high, buf[base], bits, symmetric)
            if given:
                scale = scales[r, b]
            else:
                scales[r, b] = scale
            inverse = np.float32(1) / scale if scale != 0 else np.float32(0)
            inverses[base:base + block] = inverse
            points[base:base + block] = zero
            if not symmetric:
                put_zero(zeros, r, b, bits, zero)
        for i in range(n):
            codes[i] = np.uint8(min(max(round_half_away(buf[i] * inverses[i] + points[i]), np.float32(0)), top))
        if bits == 4:
            for j in range(n // 2):
                qweight[r, j] = codes[2 * j] | (codes[2 * j + 1] << np.uint8(4))
        else:
            qweight[r, :] = codes


def quantize_rows(rows: np.ndarray, *, bits: int, block_size: int, symmetric: bool, half: bool, qweight: np.ndarray,
                  scales: np.ndarray, zeros: np.ndarray) -> None:
    """Fill qweight [R, nb * block_size * bits / 8] (u8), scales [R, nb] (float32; float16
    values when ``half``) and zeros [R, packed nb] (u8, asymmetric) from ``rows`` [R, K]
    (float32, bfloat16 or float16), by onnxruntime's scheme (module docstring)."""
    if rows.dtype.name == "bfloat16":
        rows, bf16 = rows.view(np.uint16), True
    else:
        rows, bf16 = rows.astype(np.float32, copy=False), False
    rows = np.ascontiguousarray(rows)
    kernel = rows_kernel
    buf = np.empty(scales.shape[1] * block_size, np.float32)
    if half:  # float32 scales first, rounded to float16 here, then the codes from them
        kernel(rows, rows.shape[1], block_size, bits, symmetric, False, bf16, qweight, scales, zeros, buf)
        scales[...] = scales.astype(np.float16)
    kernel(rows, rows.shape[1], block_size, bits, symmetric, half, bf16, qweight, scales, zeros, buf)


__all__ = ["quantize_rows"]
