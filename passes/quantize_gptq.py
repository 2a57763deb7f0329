"""``quantize{method=gptq}``: GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training
Quantization for Generative Pre-trained Transformers") for one weight, and the store that
keeps each weight's codes on disk between calibration and writing.

``gptq_blocks(W, hessian=H)`` quantizes W [N, K] to minimise the layer's output error
tr((W - Ŵ) H (W - Ŵ)^T), H = X^T X over calibration inputs X [T, K], one input column at a
time: column j is rounded, and its error is fed back into the columns after it, so they
absorb it where H says they can. Steps, as in the paper's reference code except where said:

1. dead columns (H_jj = 0: an input the calibration never excites) get H_jj = 1 and W[:, j]
   = 0 (code = the zero point); then dampening: H += ``DAMP`` mean(diag H) I. ``DAMP`` is
   0.1, not the paper's 0.01: with ~1k calibration tokens H has rank about T, and GPTQ fits
   the calibration text; on SmolLM2-135M's layer 3, held against the Hessian of another
   text, the mean weighted error (relative to RTN's) is 0.403 at 0.01 and 0.361 at 0.1;
2. the error feedback, with U the upper Cholesky factor of H^-1 (H^-1 = U^T U): column j
   is rounded to q_j, e_j = (w'_j - q_j) / U_jj, and w'_k -= e_j U_jk for k > j. U is found
   without forming H^-1: H = V V^T with V upper (a Cholesky of H with its axes reversed,
   ``upper_factor``) gives H^-1 = V^-T V^-1, so U = V^-1 (``invert_upper``); both run in
   place in H's own array, tile by tile, so the factorisation holds one d_in² array;
3. lazy batches: columns go in batches of ``BATCH`` (128, or a whole number of groups when a
   group is wider); inside a batch the feedback is applied column by column, to later
   batches at once (one matrix product per batch);
4. groups (static, in column order, so codes fit MatMulNBits' blocks of ``block_size``): a
   group's scale (and zero point, asymmetric) is chosen when its first column comes up, from
   the group's weights as updated so far. ``group_scales="search"`` (the default): the
   search of ``passes.quantize_search.search_blocks`` weighted by H's diagonal (imatrix's
   choice, applied to the updated weights); ``"rtn"``: RTN's max-abs rule
   (``irc.ops.quant.quantize_blocks``), the paper's; ``"static"``: the search on the
   original weights, before any feedback. On the layer above, against the other text's
   Hessian: rtn 0.604, static 0.379, search 0.361, and imatrix alone (no feedback) 0.489.
   Codes use the whole window (-8..7 for 4 bits symmetric): feedback may push a later
   column past the first's maximum;
5. per row, the better of GPTQ and RTN by the same weighted error (each row's error is
   separate: tr(D H D^T) = Σ_n d_n H d_n^T): GPTQ is greedy and can lose on a row, so this
   makes "never worse than RTN" a guarantee rather than a tendency;
6. act-order (``act_order=True``; the reference code's ``--act-order``, AutoGPTQ's
   ``desc_act`` with ``static_groups``): columns are processed by decreasing H_jj (stable,
   so ties keep column order and dead columns come last), so the inputs the calibration
   excites most are rounded first and the rest absorb their error. H is permuted in place
   (``permute_symmetric``) before the factorisation and each chunk's columns with it; the
   groups stay the blocks of ``block_size`` consecutive columns MatMulNBits stores: a
   column's group is its original position's, and a group's scale (by step 4's rule) is
   fixed when the first of its columns comes up, from the group's weights as updated so far
   (those in later lazy batches with the current batch's pending feedback applied, so the
   lazy form equals the column-by-column one). Codes are written back in column order.
   With H_jj already decreasing the order is the natural one and so are the codes.
   ``benchmarks/int4_quality.py`` (g32, ppl A / ppl B / top-1 / greedy of 32): at 1024
   calibration tokens it wins on SmolLM2-135M (94.62 / 88.77 / 75.7% / 2 against 96.66 /
   97.79 / 73.4% / 2) but loses on Qwen2.5-Coder-0.5B (72.43 / 57.92 / 83.4% / 8 against
   74.18 / 54.50 / 84.3% / 11). At 4096 tokens, two runs each (a change in the Hessian's
   float32 summation order alone moved the results this much: GPTQ is greedy, so read one
   run as one draw): act-order kept 0.25 / 0.26 and 0.21 / 0.28 of the builder's perplexity
   loss on SmolLM2 (texts A / B), 0.38 / 0.40 and 0.33 / 0.55 on Qwen; the natural order
   0.35 / 0.56 on SmolLM2 (one run), 0.26 / 0.21 and 0.48 / 0.36 on Qwen. The order is within the
   spread on Qwen and better on SmolLM2, so ``quantize``'s gptq defaults are act-order and
   4096 tokens (``passes.quantize.METHOD_DEFAULTS``).

The error is weighed by H as given (undampened). Scaling H changes nothing (the dampening is
relative), so callers may pass the mean X^T X / T. Arithmetic runs in the Hessian's dtype
(float32 for calibration: the reference code's precision, and half the memory of float64;
float64 in tests); dequantized values are formed in float32, as ``dequantize_blocks`` does.

Memory (``gptq_chunks``): rows are independent given U, so a weight is read and quantized
``CHUNK_ELEMENTS`` weights (whole rows) at a time; what is held is H (becoming U in place, d_in² float32: 822 MB
for Llama-3-8B's down_proj, d_in 14336), one chunk in float32 and its codes. Act-order adds
one d_in x ``FACTOR_BLOCK`` panel while H is permuted, a second chunk while a chunk's columns
are, and the order itself (d_in integers).

``SpilledWeight``: the codes of one weight in .npy files of a temporary directory, read back
(whole or by rows, memory-mapped) as ``irc.weights.Derived`` data of the pass's params,
written chunk by chunk as GPTQ makes them. The directory (in the system's temporary folder;
an 8B model's int4 codes take 4.5 GB there until the compile ends) lives as long as a
``SpillDirectory`` referring to it (held by every spilled weight, so by the graph's params),
and codes never sit in memory for the whole model. Spilling the codes beats spilling the
Hessians and recomputing: the codes are needed during calibration anyway (the layers after
read them), they are 1/8 of the float weight where the Hessians would be d_in² each, and
GPTQ runs once.
"""
from __future__ import annotations

import os
import tempfile
from functools import partial
from typing import Optional

import numpy as np

from irc.errors import PassError
from irc.ops.quant import block_count, dequantize_blocks, pack_codes, packed_width, quantize_blocks, unpack_codes
from irc.weights import read_rows

from passes.quantize_search import search_blocks

DAMP = 0.1         # dampening: this fraction of the mean diagonal added to H's diagonal (module docstring)
BATCH = 128        # columns per lazy batch (the paper's B)
FACTOR_BLOCK = 512  # tile of the in-place factorisation (d x 512 panels: 29 MB at d=14336)
CHUNK_ELEMENTS = 1 << 23  # weights quantized at once: 32 MB of float32 (2048 rows of a 4096-wide head)
GROUP_SCALES = "search"  # how a group's scale is chosen (step 4)
ACT_ORDER = False  # gptq_blocks' column order when not given (step 6); the pass gives its act_order option


def upper_factor(h: np.ndarray, block: int = FACTOR_BLOCK) -> np.ndarray:
    """Overwrite the symmetric positive definite ``h`` [d, d] with V, upper triangular with
    a positive diagonal, H = V V^T (returned; it is ``h``). Blocked, right to left: each
    diagonal tile is a small Cholesky with reversed axes, the tiles above it a triangular
    solve, and the rest of the upper triangle is updated tile by tile, so the only memory
    beyond ``h`` is a few d x ``block`` panels. numpy.linalg.LinAlgError when H is not
    positive definite."""
    d = h.shape[0]
    starts = list(range(0, d, block))
    for j0 in reversed(starts):
        j1 = min(j0 + block, d)
        tile = np.linalg.cholesky(h[j0:j1, j0:j1][::-1, ::-1])[::-1, ::-1]
        h[j0:j1, j0:j1] = tile
        h[j1:, j0:j1] = 0
        if j0 == 0:
            continue
        panel = np.linalg.solve(tile, h[:j0, j0:j1].T).T  # V[:j0, j0:j1] tile^T = H[:j0, j0:j1]
        h[:j0, j0:j1] = panel
        for k0 in (s for s in starts if s < j0):
            k1 = min(k0 + block, j0)
            h[:k1, k0:k1] -= panel[:k1] @ panel[k0:k1].T
    return h


def _group_scale(group: np.ndarray, bits: int, symmetric: bool, scale_dtype: str, importance) -> tuple:
    """(stored scales [N], their float32 values [N], zero points [N] float32) of one group's
    current weights [N, g]: RTN's rule, or with ``importance`` (H's diagonal over the group)
    the search ``passes.quantize_search.search_blocks`` weighted by it."""
    if importance is None:
        _, scales, zeros = quantize_blocks(group, bits=bits, block_size=group.shape[1], symmetric=symmetric,
                                           scale_dtype=scale_dtype)
    else:
        _, scales, zeros = search_blocks(group, bits=bits, block_size=group.shape[1], symmetric=symmetric,
                                         scale_dtype=scale_dtype, importance=importance)
    zero = np.full(group.shape[0], 2 ** (bits - 1), np.float32) if zeros is None else \
        unpack_codes(zeros, bits)[:, 0].astype(np.float32)
    return scales[:, 0], scales[:, 0].astype(np.float32), zero


def _rtn_errors(rows: np.ndarray, h: np.ndarray, rtn: tuple, bits: int, block_size: int) -> np.ndarray:
    """d_n H d_n^T per row for RTN's codes (d = w - ŵ), in float64, by chunks of rows."""
    k = rows.shape[1]
    errors = np.empty(rows.shape[0])
    step = max(1, CHUNK_ELEMENTS // k)
    for start in range(0, rows.shape[0], step):
        stop = start + step
        zeros = None if rtn[2] is None else rtn[2][start:stop]
        d = (rows[start:stop] - dequantize_blocks(rtn[0][start:stop], rtn[1][start:stop], zeros, bits=bits,
                                                  block_size=block_size, k=k)).astype(h.dtype)
        errors[start:stop] = np.einsum("nk,nk->n", d @ h, d)
    return errors


def _prepare(h: np.ndarray, kp: int, overwrite: bool) -> tuple:
    """(H [kp, kp], the dampening λ, the dead columns [kp]): H padded with dead columns, dead
    columns set to H_jj = 1, then dampened (in place when ``overwrite`` and nothing pads)."""
    k = h.shape[0]
    if overwrite and kp == k:
        big = h
    else:
        big = np.zeros((kp, kp), h.dtype)
        big[:k, :k] = h
    index = np.arange(kp)
    dead = big[index, index] == 0
    big[index[dead], index[dead]] = 1
    damp = DAMP * float(big[index, index].mean())
    big[index, index] += damp
    return big, damp, dead


def permute_symmetric(h: np.ndarray, perm: np.ndarray, block: int = FACTOR_BLOCK) -> np.ndarray:
    """Overwrite ``h`` [d, d] with H[perm][:, perm] (returned; it is ``h``): its rows panel by
    panel of columns, then its columns tile by tile of rows, so the only memory beyond ``h``
    is one d x ``block`` panel."""
    d = h.shape[0]
    for c0 in range(0, d, block):
        h[:, c0:c0 + block] = h[perm, c0:c0 + block]
    for r0 in range(0, d, block):
        h[r0:r0 + block] = h[r0:r0 + block][:, perm]
    return h


def column_order(diagonal: np.ndarray) -> np.ndarray:
    """Positions -> columns (step 6): the columns by decreasing H_jj, ties in column order (so
    dead and padding columns, H_jj = 0, come last)."""
    return np.argsort(-np.asarray(diagonal, np.float64), kind="stable")


def invert_upper(v: np.ndarray, block: int = FACTOR_BLOCK) -> np.ndarray:
    """Overwrite the upper triangular ``v`` [d, d] (positive diagonal) with its inverse U,
    also upper triangular (returned; it is ``v``). Blocked, left to right: U V = I gives each
    column panel U[:j, J] = -(U[:j, :j] V[:j, J]) V_JJ^-1 from the columns already inverted."""
    d = v.shape[0]
    for j0 in range(0, d, block):
        j1 = min(j0 + block, d)
        tile = np.linalg.inv(v[j0:j1, j0:j1])
        if j0:
            v[:j0, j0:j1] = -(v[:j0, :j0] @ v[:j0, j0:j1]) @ tile
        v[j0:j1, j0:j1] = np.triu(tile)
    return v


def _group_now(current: np.ndarray, w: np.ndarray, errors: np.ndarray, u: np.ndarray, spans: tuple,
               columns: np.ndarray, position: np.ndarray, original: Optional[np.ndarray]) -> np.ndarray:
    """A group's weights [N, g] (its ``columns`` in column order) when its first column comes up
    at position j (``spans`` = (b1, j, b2), the batch [b1, b2)): from ``original`` [N, K]
    (zero past K) when given (``"static"``), else as updated so far: those in this batch from
    ``current``, those in later batches from ``w`` with this batch's pending feedback (columns
    b1..j-1) applied, exactly what the column-by-column algorithm would hold."""
    b1, j, b2 = spans
    group = np.zeros((w.shape[0], columns.size), w.dtype)
    if original is not None:
        live = columns < original.shape[1]
        group[:, live] = original[:, columns[live]]
        return group
    places = position[columns]
    here = places < b2
    group[:, here] = current[:, places[here] - b1]
    if not here.all():
        later = places[~here]
        group[:, ~here] = w[:, later] - errors[:, :j - b1] @ u[b1:j, later]
    return group


def _feedback(w: np.ndarray, u: np.ndarray, original: np.ndarray, dead: np.ndarray, perm: np.ndarray, bits: int,
              block_size: int, symmetric: bool, scale_dtype: str, importance: Optional[np.ndarray],
              static: bool) -> tuple:
    """The column loop (module docstring, steps 2-4) on W [N, kp] (overwritten) whose position
    j holds column ``perm[j]`` (step 6), with U [kp, kp], the upper Cholesky factor of the
    equally permuted H^-1. Returns, in column order, (codes u8 [N, kp], stored scales [N, nb],
    zero points u8 [N, nb], and per row, float64: Σ_j e_j² (= d H_damp d^T) and Σ_j (w_j -
    ŵ_j)² over the live columns of ``original`` [N, K])."""
    n, kp = w.shape
    k = original.shape[1]
    nb = kp // block_size
    low, high = (-2.0 ** (bits - 1), 2.0 ** (bits - 1) - 1) if symmetric else (0.0, 2.0 ** bits - 1)
    middle = 2 ** (bits - 1) if symmetric else 0
    codes = np.empty((n, kp), np.uint8)
    scales = np.empty((n, nb), scale_dtype)
    zeros = np.empty((n, nb), np.uint8)
    steps, points = np.empty((n, nb), np.float32), np.empty((n, nb), np.float32)
    position, chosen = np.argsort(perm), np.zeros(nb, bool)
    scaled, plain = np.zeros(n), np.zeros(n)
    batch = block_size * max(1, BATCH // block_size)
    for b1 in range(0, kp, batch):
        b2 = min(b1 + batch, kp)
        current = w[:, b1:b2].copy()
        errors = np.empty_like(current)
        for j in range(b1, b2):
            c, source = j - b1, int(perm[j])
            g = source // block_size
            if not chosen[g]:  # the group's first column: its scale and zero point, fixed from now on
                chosen[g] = True
                columns = np.arange(g * block_size, (g + 1) * block_size)
                group = _group_now(current, w, errors, u, (b1, j, b2), columns, position,
                                   original if static else None)
                weights = None if importance is None else importance[columns]
                scales[:, g], steps[:, g], points[:, g] = _group_scale(group, bits, symmetric, scale_dtype, weights)
                zeros[:, g] = points[:, g]
            step, zero = steps[:, g], points[:, g]
            divisor = step.astype(w.dtype)
            window = (low, high) if symmetric else (low - zero, high - zero)
            column = current[:, c]
            signed = np.clip(np.rint(np.divide(column, divisor, out=np.zeros_like(column), where=divisor != 0)),
                             *window)
            quantized = (signed.astype(np.float32) * step).astype(w.dtype)
            codes[:, source] = (signed + (middle if symmetric else zero)).astype(np.uint8)
            error = (column - quantized) / u[j, j]
            scaled += error.astype(np.float64) ** 2
            if source < k and not dead[source]:
                plain += (original[:, source] - quantized).astype(np.float64) ** 2
            errors[:, c] = error
            current[:, c + 1:] -= np.outer(error, u[j, j + 1:b2])
        w[:, b2:] -= errors @ u[b1:b2, b2:]
    return codes, scales, zeros, scaled, plain


def _rows(weight, k: int) -> np.ndarray:
    w = np.asarray(weight)
    if w.shape[-1] != k:
        raise ValueError(f"hessian must be a finite [{w.shape[-1]}, {w.shape[-1]}] matrix for a weight with "
                         f"K={w.shape[-1]}, got shape {[k, k]}")
    return w.reshape(-1, k).astype(np.float32)


def _chunk(rows: np.ndarray, u: np.ndarray, dead, perm, damp: float, rtn_error, config: tuple) -> tuple:
    """GPTQ of one chunk of rows [r, K] against U, its columns in ``perm``'s order (steps 2-6):
    its (qweight, scales, zero_points), in column order."""
    bits, block_size, symmetric, scale_dtype, importance, static = config
    kp = u.shape[0]
    nb = kp // block_size
    rtn = quantize_blocks(rows, bits=bits, block_size=block_size, symmetric=symmetric, scale_dtype=scale_dtype)
    padded = np.zeros((rows.shape[0], kp), u.dtype)
    padded[:, :rows.shape[1]] = rows
    padded[:, dead] = 0
    if perm is not None:
        padded = padded[:, perm]
    else:
        perm = np.arange(kp)
    codes, scales, zeros, scaled, plain = _feedback(padded, u, rows, dead, perm, bits, block_size, symmetric,
                                                    scale_dtype, importance, static)
    del padded
    qweight = pack_codes(codes.reshape(-1, nb, block_size), bits)
    zero_points = None if symmetric else pack_codes(zeros, bits)
    if rtn_error is not None:
        worse = scaled - damp * plain > rtn_error
        qweight[worse], scales[worse] = rtn[0][worse], rtn[1][worse]
        if zero_points is not None:
            zero_points[worse] = rtn[2][worse]
    return qweight, scales, zero_points


def gptq_chunks(weights: list, hessian, *, bits: int, block_size: int, symmetric: bool,
                group_scales: str = GROUP_SCALES, act_order: bool = ACT_ORDER, rtn_rows: bool = True,
                overwrite_hessian: bool = False):
    """GPTQ of several weights that share one Hessian (q/k/v, gate/up): one factorisation for
    all, and each weight by chunks of ``CHUNK_ELEMENTS`` weights in whole rows (rows are
    independent given H), so
    what is held is H, one chunk and its codes. ``weights``: [(read, rows, scale_dtype)],
    ``read(start, stop)`` giving rows [start, stop) of the weight as [r, K]; each chunk is
    read twice (RTN's error against H, then GPTQ). ``act_order``: columns by decreasing H_jj
    (step 6). Yields (weight index, first row, (qweight, scales, zero_points or None)) in order."""
    h = np.asarray(hessian)
    if h.dtype not in (np.float32, np.float64):
        h, overwrite_hessian = h.astype(np.float32), True
    if h.ndim != 2 or h.shape[0] != h.shape[1] or not np.all(np.isfinite(np.einsum("ii->i", h))):
        raise ValueError(f"hessian must be a finite [K, K] matrix, got shape {list(h.shape)}")
    k = h.shape[0]
    nb = block_count(k, block_size)
    step = max(1, CHUNK_ELEMENTS // k)
    spans = [[(start, min(start + step, count)) for start in range(0, count, step)] for _, count, _ in weights]
    rtn_errors = []
    for (read, _, scale_dtype), chunks in zip(weights, spans):
        errors = []
        for start, stop in chunks if rtn_rows else ():
            rows = _rows(read(start, stop), k)
            rtn = quantize_blocks(rows, bits=bits, block_size=block_size, symmetric=symmetric, scale_dtype=scale_dtype)
            errors.append(_rtn_errors(rows, h, rtn, bits, block_size))
        rtn_errors.append(errors)
    diagonal = np.zeros(nb * block_size)
    diagonal[:k] = np.einsum("ii->i", h)
    importance = diagonal if group_scales in ("search", "static") else None
    perm = column_order(diagonal) if act_order else None
    big, damp, dead = _prepare(h, nb * block_size, overwrite_hessian)
    del h
    if perm is not None:
        permute_symmetric(big, perm)
    try:
        upper_factor(big)
    except np.linalg.LinAlgError:
        raise ValueError("hessian is not positive semidefinite (its dampened Cholesky failed)") from None
    invert_upper(big)
    for index, ((read, _, scale_dtype), chunks, errors) in enumerate(zip(weights, spans, rtn_errors)):
        config = (bits, block_size, symmetric, scale_dtype, importance, group_scales == "static")
        for number, (start, stop) in enumerate(chunks):
            yield index, start, _chunk(_rows(read(start, stop), k), big, dead, perm, damp,
                                       errors[number] if errors else None, config)


def gptq_blocks(weight, *, hessian, bits: int, block_size: int, symmetric: bool, scale_dtype: str = "float32",
                group_scales: str = GROUP_SCALES, act_order: bool = ACT_ORDER, rtn_rows: bool = True,
                overwrite_hessian: bool = False) -> tuple:
    """(qweight u8, scales, zero_points u8 or None) of ``weight`` [..., N, K] in
    ``irc.ops.quant``'s layout, by GPTQ against ``hessian`` [K, K] (module docstring; every
    row of a leading dim shares it). ``group_scales``: "search", "rtn" or "static" (step 4).
    ``act_order``: process columns by decreasing H_jj, groups unchanged (step 6).
    ``rtn_rows``: keep RTN's codes for the rows where they weigh less (step 5; off only to
    compare with the bare algorithm). ``overwrite_hessian``: ``hessian`` may be used as
    scratch (saves a d_in² copy). ValueError for a Hessian of the wrong shape, not finite,
    or not positive semidefinite."""
    w = np.asarray(weight)
    lead, k = w.shape[:-1], w.shape[-1]
    rows = w.reshape(-1, k)
    chunks = [parts for _, _, parts in gptq_chunks([(lambda a, b: rows[a:b], rows.shape[0], scale_dtype)], hessian,
                                                   bits=bits, block_size=block_size, symmetric=symmetric,
                                                   group_scales=group_scales, act_order=act_order,
                                                   rtn_rows=rtn_rows, overwrite_hessian=overwrite_hessian)]
    qweight, scales = np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks])
    zero_points = None if symmetric else np.concatenate([c[2] for c in chunks])
    return (qweight.reshape(lead + qweight.shape[1:]), scales.reshape(lead + scales.shape[1:]),
            None if zero_points is None else zero_points.reshape(lead + zero_points.shape[1:]))


class SpillDirectory:
    """A temporary directory for spilled codes, removed when the last holder lets it go (or
    at exit)."""

    def __init__(self):
        self._directory = tempfile.TemporaryDirectory(prefix="irc-gptq-")
        self.path = self._directory.name
        self.count = 0

    def next_stem(self) -> str:
        self.count += 1
        return os.path.join(self.path, f"{self.count:06d}")


class SpilledWeight:
    """One weight's GPTQ codes, on disk; the interface ``passes.quantize_methods``'s
    ``quantized_params`` / ``QuantizedPart`` read (source, bits, block_size, symmetric,
    ``part(name, rows)``, ``scheme()``). Written by rows (``write``) into memory-mapped .npy
    files (each part as its raw bytes: u8, or u16 for 16-bit scales) and read back the same
    way: rows [start, stop) read only those rows."""

    def __init__(self, source, directory: SpillDirectory, bits: int, block_size: int, symmetric: bool):
        self.source, self.bits, self.block_size, self.symmetric = source, bits, block_size, symmetric
        self.directory = directory
        n, k = source.shape[0], source.shape[-1]
        nb = block_count(k, block_size)
        self.scale_dtype = np.dtype(source.dtype.numpy)
        shapes = {"qweight": ((n, nb, block_size * bits // 8), np.dtype(np.uint8)),
                  "scales": ((n, nb), self.scale_dtype)}
        if not symmetric:
            shapes["zero_points"] = ((n, packed_width(nb, bits)), np.dtype(np.uint8))
        stem = directory.next_stem()
        self.paths, self.raw = {}, {}
        for name, (shape, dtype) in shapes.items():
            self.paths[name] = f"{stem}.{name}.npy"
            self.raw[name] = np.dtype(f"u{dtype.itemsize}")
            np.lib.format.open_memmap(self.paths[name], mode="w+", dtype=self.raw[name], shape=shape).flush()

    def write(self, start: int, parts: tuple) -> None:
        """Rows from ``start`` of each part (qweight, scales, zero_points or None)."""
        for name, array in zip(("qweight", "scales", "zero_points"), parts):
            if array is not None:
                mapped = np.load(self.paths[name], mmap_mode="r+")
                mapped[start:start + array.shape[0]] = np.ascontiguousarray(array).view(self.raw[name])
                mapped.flush()
                del mapped

    def part(self, name: str, rows: Optional[tuple] = None) -> np.ndarray:
        mapped = np.load(self.paths[name], mmap_mode="r")
        data = np.array(mapped if rows is None else mapped[rows[0]:rows[1]])
        return data.view(self.scale_dtype) if name == "scales" else data

    def dequantized(self) -> np.ndarray:
        """The float32 weight [..., N, K] the codes stand for."""
        return dequantize_blocks(self.part("qweight"), self.part("scales"),
                                 self.part("zero_points") if "zero_points" in self.paths else None,
                                 bits=self.bits, block_size=self.block_size, k=self.source.shape[-1])

    def scheme(self) -> str:
        return (f"bits={self.bits}, block_size={self.block_size}, "
                f"{'symmetric' if self.symmetric else 'asymmetric'}, gptq")


def calibrated_codes(graph, tokens: list, params: list, config: dict, block_size, bits_of=None) -> dict:
    """{name: SpilledWeight} of GPTQ with sequential Hessians
    (``passes.quantize_calibrate.sequential_hessians``) for the observed weights among
    ``params``; ``config`` the pass's options, ``block_size(k, bits)`` its block rule,
    ``bits_of(name)`` each weight's bits (default ``config["bits"]``: weights sharing one
    Hessian at different bits run apart, on copies of it). PassError
    when the text gives fewer than ``calibration_tokens`` tokens (the count asked for: a
    Hessian of fewer rows has lower rank than asked, and a silent shortfall would hide it),
    or when a Hessian cannot be factored."""
    from passes.quantize_calibrate import sequential_hessians

    if len(tokens) < config["calibration_tokens"]:
        raise PassError(f"quantize: the calibration text gives {len(tokens)} tokens, method=gptq asks for "
                        f"calibration_tokens={config['calibration_tokens']}", location=config["calibration"],
                        hint=f"give a longer text, or calibration_tokens={len(tokens)}")
    by_name = {p.name: p for p in params}
    directory = SpillDirectory()
    symmetric = config["symmetric"]
    bits_of = bits_of or (lambda name: config["bits"])

    def quantize(names: list, hessian: np.ndarray) -> dict:
        widths = sorted({bits_of(name) for name in names})
        done = {}
        for i, bits in enumerate(widths):
            params = [by_name[name] for name in names if bits_of(name) == bits]
            block = block_size(params[0].shape[-1], bits)
            spilled = [SpilledWeight(p, directory, bits, block, symmetric) for p in params]
            sources = [(partial(read_rows, p), p.shape[0], p.dtype.numpy.name) for p in params]
            try:
                for index, start, parts in gptq_chunks(sources, hessian if i == len(widths) - 1 else hessian.copy(),
                                                       bits=bits, block_size=block, symmetric=symmetric,
                                                       act_order=config["act_order"], overwrite_hessian=True):
                    spilled[index].write(start, parts)
            except ValueError as err:
                raise PassError(f"quantize: GPTQ of @{params[0].name}: {err}", location=config["calibration"]) from None
            done.update({p.name: w for p, w in zip(params, spilled)})
        return done

    return sequential_hessians(graph, tokens, set(by_name), quantize)


__all__ = ["calibrated_codes", "column_order", "gptq_blocks", "gptq_chunks", "permute_symmetric", "upper_factor",
           "SpillDirectory", "SpilledWeight", "DAMP", "BATCH"]
