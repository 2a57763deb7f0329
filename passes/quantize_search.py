"""The per-group scale search of ``quantize``'s ``mse`` and ``imatrix`` methods (and of
GPTQ's group scales, ``passes.quantize_gptq``), in the layout of ``irc.ops.quant``
(``passes.quantize_methods`` says which method writes which codes).

``mse`` and ``imatrix`` search each group's scale to minimise its weighted squared error
Σ a (w - ŵ)², in the spirit of llama.cpp's ``make_qx_quants`` / ``make_qkx2_quants`` (read,
then written afresh here):

1. candidates: symmetric, s = v / -(m (1 + 0.0125 i)) for i in -9, -6, ..., 9, with v the
   group's signed largest-magnitude weight and m = 2^(bits-1) (so v lands near the code -m
   that max-abs RTN leaves unused), plus RTN's own |v| / (m - 1); asymmetric, the range
   [min(w, 0), max(w, 0)] over (2^bits - 1)(1 + i / 150) for the same i (RTN is i = 0),
   each with z = round(-min / s). Seven candidates do as well as nineteen on SmolLM2's
   weights (SQNR within 0.01 dB) at 2.5x the speed;
2. per candidate: codes j = clip(round(w / s)) in the window, then the scale that is
   optimal for those codes, s' = Σ a w j / Σ a j² (least squares), whose error is
   E = Σ a w² - (Σ a w j)² / Σ a j²;
3. keep the candidate with the smallest E, refine once more (round with s', solve again),
   store s' in the scales' dtype and round every weight with the stored scale.

Rounding with a fixed scale is the best code per element, so the stored codes do at least
as well as the E that chose them; RTN's scale is a candidate, so (with float32 scales) no
group ends with a larger weighted error than RTN's, up to the float32 rounding of the sums
that compare candidates (about 1e-6 of the group's weighted energy Σ a w²).

The weights a: for ``mse``, sqrt(σ² + w²) per element, σ² the group's mean square (llama.cpp
weighs its K-quant searches by magnitude the same way): the unweighted search clips the
largest weights, and on SmolLM2-135M (int4, group 32, every weight including the tied
table) that raised perplexity from RTN's 122.1 to 128.7, where the magnitude-weighted search
gives 116.5. For ``imatrix``, the importance of input channel k, a_k = mean x_k² over the
calibration tokens (llama.cpp's "importance matrix", its diagonal; the error of x·w is
then weighed by how much each channel carries), floored at 1e-6 of the largest so no
channel is free: 96.2 on the same model (1024 calibration tokens of another text);
multiplying in the magnitude weight as well gave 97.7.

Work is vectorised NumPy over chunks of whole rows (``CHUNK_ELEMENTS`` weights at a time,
laid out one group per column), never a Python loop over groups; memory is a few
chunk-sized arrays beyond the weight and its codes.
"""
from __future__ import annotations

from typing import Iterator, Optional

import numpy as np

from irc.ops.quant import block_count, pack_codes

CHUNK_ELEMENTS = 1 << 16  # weights searched at once: 256 KiB of float32, cache-sized
SYMMETRIC_STEPS = range(-9, 10, 3)   # 7 candidates (plus RTN's): as good as 19 on real weights
ASYMMETRIC_STEPS = range(-9, 10, 3)
def search_blocks(weight, *, bits: int, block_size: int, symmetric: bool, scale_dtype: str = "float32",
                  importance: Optional[np.ndarray] = None) -> tuple:
    """The searched quantization (module docstring) of ``weight`` [..., N, K] along K."""
    w = np.asarray(weight, dtype=np.float32)
    lead, k = w.shape[:-1], w.shape[-1]
    nb = block_count(k, block_size)
    rows = w.reshape(-1, k)
    count = rows.shape[0]
    codes = np.empty((count, nb, block_size), np.uint8)
    scales = np.empty((count, nb), scale_dtype)
    zeros = np.empty((count, nb), np.uint8)
    a = _channel_weights(importance, k, nb, block_size)
    step = max(1, CHUNK_ELEMENTS // (nb * block_size))
    for start in range(0, count, step):
        chunk = rows[start:start + step]
        columns = _group_columns(chunk, nb, block_size)
        weights = None if a is None else np.tile(a, (1, chunk.shape[0]))
        chunk_codes, chunk_scales, chunk_zeros = _search_chunk(columns, weights, bits, symmetric, scale_dtype)
        done = slice(start, start + chunk.shape[0])
        codes[done] = chunk_codes.T.reshape(-1, nb, block_size)
        scales[done] = chunk_scales.reshape(-1, nb)
        zeros[done] = chunk_zeros.reshape(-1, nb)
    qweight = pack_codes(codes, bits).reshape(lead + (nb, block_size * bits // 8))
    zero_points = None if symmetric else pack_codes(zeros, bits).reshape(lead + (-1,))
    return qweight, scales.reshape(lead + (nb,)), zero_points


def _group_columns(rows: np.ndarray, nb: int, block_size: int) -> np.ndarray:
    """Rows [r, K] -> [block_size, r * nb], one group per column (zero padding past K): the
    per-group arithmetic then runs along contiguous columns, not over a short last axis."""
    padded = np.zeros((rows.shape[0], nb * block_size), np.float32)
    padded[:, :rows.shape[1]] = rows
    return np.ascontiguousarray(padded.reshape(-1, block_size).T)


def _channel_weights(importance, k: int, nb: int, block_size: int) -> Optional[np.ndarray]:
    """Per-element error weights [block_size, nb] (0 on padding), or None for plain MSE."""
    if importance is None:
        return None
    imp = np.asarray(importance, dtype=np.float64).reshape(-1)
    if imp.shape != (k,) or not np.all(np.isfinite(imp)):
        raise ValueError(f"importance must be {k} finite values, got shape {imp.shape}")
    imp = np.maximum(imp, 1e-6 * max(float(imp.max()), 1e-30))
    a = np.zeros(nb * block_size, np.float32)
    a[:k] = imp / imp.mean()
    return np.ascontiguousarray(a.reshape(nb, block_size).T)


def _candidates(columns: np.ndarray, bits: int, symmetric: bool) -> Iterator[tuple]:
    """(scale, zero) per group [G] for each candidate; zero holds integers (as float32)."""
    if symmetric:
        m = 2 ** (bits - 1)
        v = columns[np.abs(columns).argmax(axis=0), np.arange(columns.shape[1])]
        zero = np.full(v.shape, float(m), np.float32)
        yield np.abs(v) / np.float32(m - 1), zero  # RTN
        for i in SYMMETRIC_STEPS:
            yield v / np.float32(-m * (1 + 0.0125 * i)), zero
        return
    top = 2 ** bits - 1
    low = np.minimum(columns.min(axis=0), 0)
    span = np.maximum(columns.max(axis=0), 0) - low
    for i in ASYMMETRIC_STEPS:
        scale = span / np.float32(top * (1 + i / 150))
        zero = np.clip(np.rint(np.divide(-low, scale, out=np.zeros_like(low), where=scale > 0)), 0, top)
        yield scale, zero


def _round(columns, scale, window: tuple, out: np.ndarray) -> np.ndarray:
    """j = clip(round(w / scale), *window) into ``out`` (0 where scale is 0); the window's
    ends are numbers (symmetric: NumPy's fast scalar path) or per-group arrays."""
    inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)
    np.multiply(columns, inverse, out=out)
    np.rint(out, out=out)
    np.maximum(out, window[0], out=out)
    np.minimum(out, window[1], out=out)
    return out


def _fit(weighted, a, j, scratch) -> tuple:
    """(least-squares scale for codes j, its weighted squared error minus Σ a w²), per group."""
    wj = np.einsum("kg,kg->g", weighted, j)
    jj = np.einsum("kg,kg->g", np.multiply(a, j, out=scratch), j)
    scale = np.divide(wj, jj, out=np.zeros_like(wj), where=jj > 0)
    return scale, -scale * wj


def _search_chunk(columns: np.ndarray, a, bits: int, symmetric: bool, scale_dtype: str) -> tuple:
    """(codes u8 [bs, G], stored scales [G], zero points u8 [G]) of one chunk of groups."""
    top = 2 ** bits - 1

    def window(zero):
        return (-2.0 ** (bits - 1), 2.0 ** (bits - 1) - 1) if symmetric else (-zero, top - zero)

    if a is None:  # mse: sqrt(sigma² + w²), sigma² the group's mean square
        a = np.einsum("kg,kg->g", columns, columns)
        a /= columns.shape[0]
        a = np.sqrt(a + columns * columns)
    weighted = columns * a
    j = np.empty_like(columns)
    scratch = np.empty_like(columns)
    best_error = best_scale = best_zero = None
    for scale, zero in _candidates(columns, bits, symmetric):
        fitted, error = _fit(weighted, a, _round(columns, scale, window(zero), j), scratch)
        if best_error is None:
            best_error, best_scale, best_zero = error, fitted, zero
            continue
        better = error < best_error
        best_error = np.where(better, error, best_error)
        best_scale = np.where(better, fitted, best_scale)
        best_zero = np.where(better, zero, best_zero)
    fitted, error = _fit(weighted, a, _round(columns, best_scale, window(best_zero), j), scratch)
    best_scale = np.where(error < best_error, fitted, best_scale)
    stored = best_scale.astype(scale_dtype)
    _round(columns, stored.astype(np.float32), window(best_zero), j)
    j += best_zero
    return j.astype(np.uint8), stored, best_zero.astype(np.uint8)
