"""``quantize{method=ort}``: onnxruntime's blockwise quantizer's scheme (MLAS's
``MlasQuantizeBlockwise`` behind ``onnxruntime.capi._pybind_state.quantize_matmul_4bits`` /
``quantize_matmul_8bits``, what ``MatMulNBitsQuantizer`` and onnxruntime-genai's builder int4
call), writing ``irc.ops.quant``'s layout: ``ort_blocks`` computes it with the compiled
kernel of ``passes._quantize_kernel`` (numba: 3-4x MLAS's speed, the GIL released),
``ort_blocks_mlas`` with onnxruntime's own kernel, and ``ort_blocks_numpy`` is the scheme
written afresh in NumPy; the tests hold the three equal, bit for bit.

The scheme, per group (block) of ``block_size`` weights along K, in float32 (zero padding
past K takes part, so padding codes equal the zero point and dequantize to 0):

- symmetric: v = the group's signed largest-magnitude weight (max when |max| > |min|, else
  min); scale s = -v / 2^(bits-1), so v lands on the code -2^(bits-1) (0 stored): the full
  range [-8, 7] for 4 bits, where max-abs RTN uses [-7, 7]. A weight of the other sign and
  the same magnitude clips to +7: error up to one step s, else half a step. A group of
  zeros gets s = -0 or +0, the sign of its first weight negated, as the kernel's scan leaves it;
- asymmetric: the range [min(w, 0), max(w, 0)], s = (max - min) / (2^bits - 1), zero point
  z = round(-min / s) clamped to [0, 2^bits - 1] (with s = 0: z = 0);
- codes q = clamp(roundf(w * (1 / s) + z), 0, 2^bits - 1), roundf rounding halves away from
  zero, 1 / s in float32 (0 for s = 0).

Scales are stored in ``scale_dtype`` (the source's). The kernel runs in float32, except for
a float16 weight with float16 scales, which goes through the kernel's float16 entry: there
s is rounded to float16 (to nearest) before the codes are computed from it, so codes and
stored scale agree exactly. Otherwise the codes come from the float32 s, and the stored scale
is s rounded to nearest in ``scale_dtype``: exact when s is representable, which is always
the case for symmetric scales of a bfloat16 (or float16) weight (s = v / 2^(bits-1), a
power-of-two division of a value of that type, subnormals apart); for asymmetric groups the
stored scale differs from s by at most half an ulp (the zero point is the kernel's, from the
float32 s), so a dequantized weight (``irc.ops.quant.dequantize_blocks`` of what is stored)
moves by at most |q - z| ulp / 2 beyond the half step: <= 2^-8 (2^bits - 1) s in bfloat16,
<= 2^-11 (2^bits - 1) s in float16.

Layout (``ort_blocks_mlas``): MLAS quantizes MatMul's B [K, N] (K along columns) and writes
qweight [N, nb, block_size * bits / 8] (low nibble first), scales [N, nb] and zero points
[N, ceil(nb * bits / 8)]: irc's, so a weight [..., N, K] is handed over transposed, a chunk of
``CHUNK_ELEMENTS`` weights at a time (each call holds the GIL, and a signal waits for it to
return), and a trailing odd zero point's high nibble is cleared as ``pack_codes`` leaves it.
MLAS takes block sizes 16, 32, 64, 128 and 256; the compiled kernel and NumPy take any.
"""
from __future__ import annotations

import numpy as np

from irc.ops.quant import block_count, pack_codes, packed_width
from irc.output import signals_held

KERNEL_BLOCKS = (16, 32, 64, 128, 256)
CHUNK_ELEMENTS = 1 << 22  # weights per kernel call: 16 MiB of float32, tens of ms


def kernel_dtype(weight: np.ndarray, scale_dtype: str) -> np.dtype:
    """The kernel's entry for ``weight``: float16 when both the weight and its scales are
    float16, else float32 (module docstring)."""
    half = np.asarray(weight).dtype == np.float16 and np.dtype(scale_dtype) == np.float16
    return np.dtype(np.float16 if half else np.float32)


def ort_blocks(weight, *, bits: int, block_size: int, symmetric: bool, scale_dtype: str = "float32") -> tuple:
    """(qweight u8, scales, zero_points u8 or None) of ``weight`` [..., N, K] along K, by
    the scheme of the module docstring, computed by ``passes._quantize_kernel`` (compiled,
    ``CHUNK_ELEMENTS`` weights a call); equal, bit for bit, to ``ort_blocks_numpy`` and to
    onnxruntime's own kernel (``ort_blocks_mlas``)."""
    with signals_held():  # numba's native init, like onnx's, must not see a KeyboardInterrupt (irc.output)
        from passes._quantize_kernel import quantize_rows
    w = np.asarray(weight)
    if bits not in (4, 8):
        return ort_blocks_numpy(w, bits=bits, block_size=block_size, symmetric=symmetric, scale_dtype=scale_dtype)
    half = kernel_dtype(w, scale_dtype) == np.float16
    lead, k = w.shape[:-1], w.shape[-1]
    rows = w.reshape(-1, k)
    count, nb = rows.shape[0], block_count(k, block_size)
    qweight = np.empty((count, nb * block_size * bits // 8), np.uint8)
    scales = np.empty((count, nb), np.float32)
    zeros = np.zeros((count, packed_width(nb, bits)), np.uint8)
    step = max(1, CHUNK_ELEMENTS // (nb * block_size))
    for start in range(0, count, step):  # each call holds no lock, but a signal waits for it in the main thread
        stop = min(count, start + step)
        quantize_rows(rows[start:stop], bits=bits, block_size=block_size, symmetric=symmetric, half=half,
                      qweight=qweight[start:stop], scales=scales[start:stop], zeros=zeros[start:stop])
    # float32 scales (float16 values when half): rounded to ``scale_dtype`` once, exactly when half
    return (qweight.reshape(lead + (nb, block_size * bits // 8)), scales.astype(scale_dtype).reshape(lead + (nb,)),
            None if symmetric else zeros.reshape(lead + zeros.shape[1:]))


def ort_blocks_mlas(weight, *, bits: int, block_size: int, symmetric: bool, scale_dtype: str = "float32") -> tuple:
    """``ort_blocks`` by onnxruntime's own kernel (MLAS, ``quantize_matmul_4bits`` /
    ``quantize_matmul_8bits``): the scheme's origin, which the tests and
    ``benchmarks/quantize_speed.py`` hold the compiled kernel to. Block sizes the kernel
    lacks (``KERNEL_BLOCKS``) run ``ort_blocks_numpy``."""
    w = np.asarray(weight)
    if bits not in (4, 8) or block_size not in KERNEL_BLOCKS:
        return ort_blocks_numpy(w, bits=bits, block_size=block_size, symmetric=symmetric, scale_dtype=scale_dtype)
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    quantize = quantize_matmul_4bits if bits == 4 else quantize_matmul_8bits
    kernel = kernel_dtype(w, scale_dtype)
    lead, k = w.shape[:-1], w.shape[-1]
    rows = w.reshape(-1, k)
    count, nb = rows.shape[0], block_count(k, block_size)
    padded = nb * block_size
    qweight = np.empty((count, nb, block_size * bits // 8), np.uint8)
    scales = np.empty((count, nb), kernel)
    zeros = np.zeros((count, packed_width(nb, bits)), np.uint8)
    step = max(1, CHUNK_ELEMENTS // padded)
    columns = np.zeros((padded, min(step, count)), kernel)  # B [K, rows], zero past K
    for start in range(0, count, step):
        stop = min(count, start + step)
        b = columns if stop - start == columns.shape[1] else np.zeros((padded, stop - start), kernel)
        _transpose_into(b, rows[start:stop])
        quantize(qweight[start:stop], b, scales[start:stop], zeros[start:stop], block_size, stop - start, padded,
                 symmetric)
    if not symmetric and bits == 4 and nb % 2:
        zeros[:, -1] &= 0x0F
    stored = scales if scales.dtype == np.dtype(scale_dtype) else scales.astype(scale_dtype)
    return (qweight.reshape(lead + qweight.shape[1:]), stored.reshape(lead + (nb,)),
            None if symmetric else zeros.reshape(lead + zeros.shape[1:]))


def _transpose_into(b: np.ndarray, rows: np.ndarray) -> None:
    """B[:K] = rows.T, cast to B's dtype, copied in blocks of rows (cache friendly: several
    times NumPy's plain strided copy); bfloat16 as its bits shifted into float32's (exact)."""
    k = rows.shape[1]
    if rows.dtype.name == "bfloat16" and b.dtype == np.float32:
        source, target = rows.view(np.uint16), b.view(np.uint32)
    else:
        source, target = rows, b
    block = 128 if source.dtype.itemsize <= 2 else 64
    for start in range(0, source.shape[0], block):
        target[:k, start:start + block] = source[start:start + block].T
    if target is not b:
        target[:k] <<= 16


def ort_blocks_numpy(weight, *, bits: int, block_size: int, symmetric: bool, scale_dtype: str = "float32") -> tuple:
    """The scheme of the module docstring in NumPy, from the weight's values alone."""
    w = np.asarray(weight)
    half = kernel_dtype(w, scale_dtype) == np.float16
    lead, k = w.shape[:-1], w.shape[-1]
    nb = block_count(k, block_size)
    blocks = np.zeros(lead + (nb * block_size,), np.float32)
    blocks[..., :k] = w.astype(np.float16 if half else np.float32)
    blocks = blocks.reshape(lead + (nb, block_size))
    top = np.float32(2 ** bits - 1)
    low, high = blocks.min(axis=-1), blocks.max(axis=-1)
    if symmetric:
        v = np.where(np.abs(high) > np.abs(low), high, low)
        v = np.where(v == 0, blocks[..., 0], v)  # all ±0: the kernel keeps the first one's sign
        scale = -v / np.float32(2 ** (bits - 1))
        zero = np.full(scale.shape, np.float32(2 ** (bits - 1)))
    else:
        low, high = np.minimum(low, np.float32(0)), np.maximum(high, np.float32(0))
        scale = (high - low) / top + np.float32(0)  # never -0
        point = np.divide(-low, scale, out=np.zeros_like(scale), where=scale != 0)
        zero = np.clip(round_half_away(point), 0, top)
    stored = scale.astype(np.float16) if half else scale
    used = stored.astype(np.float32)
    inverse = np.divide(np.float32(1), used, out=np.zeros_like(used), where=used != 0)
    codes = np.clip(round_half_away(blocks * inverse[..., None] + zero[..., None]), 0, top)
    qweight = pack_codes(codes.astype(np.uint8), bits)
    zero_points = None if symmetric else pack_codes(zero.astype(np.uint8), bits)
    return qweight, stored.astype(scale_dtype), zero_points


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C's ``roundf``, elementwise and exactly: to nearest, halves away from zero."""
    whole = np.trunc(x)
    return whole + np.where(np.abs(x - whole) >= 0.5, np.sign(x), np.float32(0)).astype(x.dtype)


__all__ = ["ort_blocks", "ort_blocks_mlas", "ort_blocks_numpy", "kernel_dtype", "round_half_away", "KERNEL_BLOCKS"]
