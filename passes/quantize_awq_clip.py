"""AWQ's clipping search (AutoAWQ's ``auto_clip``: ``_search_best_clip`` /
``_compute_best_clip``), run by ``passes.quantize_awq.awq_fold`` after the scale search, on
the weight as it is then folded, with the ``ort`` codes the pass writes.

Which weights (``plan_clips``): every ``linear`` weight being quantized that only its linear
reads, except the query and key projections (a linear whose output reaches an operand named
``q`` or ``k`` of ``attention`` or the delta rule through at most ``TRACE_DEPTH`` nodes and no
other linear: AutoAWQ skips q/k, "due to qk bmm, it is hard to clip precisely"; a fused qkv
projection is one of them) and the LM head (and a table tied to it), which AutoAWQ leaves.

Search (``search_clip``), for a weight W [N, K] (as folded: W s, rows / s of a later group
too) and its input x [T, K] (the calibration activations / s): per output row and block of
``block_size`` inputs along K (the blocks of the codes), the shrink r in ``RATIOS``
(AutoAWQ's: n_grid 20, max_shrink 0.5, so r = 1 - i / 20 for i = 0 .. 9: 1, 0.95, ..., 0.55)
whose clamp of the block to [-m r, m r] (m the block's largest |w|, in float32) rounded to the
param's dtype, then quantized by ``ort_blocks`` (the clamp lowers the block's extreme, so its
scale follows), gives the smallest mean over the sampled tokens of the block's squared
partial output error (x_b . (Q(clamp(w_b)) - w_b))^2: AutoAWQ's criterion, tokens x[::step]
with step = max(1, T // ``N_SAMPLE_TOKENS``), the first r on a tie. It is computed as
d^T (X_b^T X_b / T') d in float64 per block (X_b^T X_b a block_size² Gram matrix), the same
number as AutoAWQ's direct form up to rounding. r = 1 leaves the codes as they were.

Guard: the blocks are chosen one by one, so a row's whole output error (the blocks' cross
terms) could still grow; a row whose squared output error over all T calibration tokens is
larger clipped than not keeps r = 1 in every block. So, on the calibration activations, no
row's (and no weight's) output error is ever larger than without the clip, which is itself
never larger than ``ort``'s (the scale search's guarantee).

The clamped weight is lazy (``Clipped``: ``irc.weights.Derived``, by rows, over the folded
data): the choices are one uint8 per block (K / block_size bytes a row). The search reads
``CHUNK_ELEMENTS`` candidate weights at a time (10 per weight), float32 and float64 copies
of them, and holds one [nb, block_size, block_size] Gram matrix set.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from irc import ops
from irc.dtypes import DType
from irc.graph import Graph, Node, Param
from irc.ops.nn import f32
from irc.ops.quant import block_count, dequantize_blocks
from irc.weights import Derived, convert, read_rows

from passes.quantize_methods import is_embedding_or_head
from passes.quantize_ort import ort_blocks

N_GRID = 20           # AutoAWQ's n_grid
MAX_SHRINK = 0.5      # AutoAWQ's max_shrink: int(MAX_SHRINK * N_GRID) ratios
N_SAMPLE_TOKENS = 512  # AutoAWQ's n_sample_token
RATIOS = np.array([1 - i / N_GRID for i in range(int(MAX_SHRINK * N_GRID))], np.float32)
CHUNK_ELEMENTS = 1 << 21  # candidate weights searched at once (ratios x rows x K)
TRACE_DEPTH = 4       # nodes followed from a linear's output to an attention's q / k
QUERY_KEY = ("q", "k")


def feeds_query_or_key(graph: Graph, node: Node) -> bool:
    """``node``'s output reaches a ``q`` or ``k`` operand within ``TRACE_DEPTH`` nodes, no linear between."""
    frontier = [node.outputs[0]]
    for _ in range(TRACE_DEPTH):
        following = []
        for value in frontier:
            for user in graph.users(value):
                names = ops.get_op(user.op).operand_names(len(user.inputs))
                if any(v is value and name in QUERY_KEY for v, name in zip(user.inputs, names)):
                    return True
                if user.op not in ("linear", "dequant_linear"):
                    following += user.outputs
        frontier = following
    return False


def plan_clips(graph: Graph, wanted: set) -> tuple:
    """({node index: weight} of the linears whose weight is clipped, {weight name: why not})."""
    clips, skipped = {}, {}
    for index, node in enumerate(graph.nodes):
        weight = node.inputs[1] if node.op == "linear" else None
        if not (isinstance(weight, Param) and weight.name in wanted and weight.rank == 2):
            continue
        if is_embedding_or_head(weight):
            skipped[weight.name] = "the LM head (and a table tied to it), as AutoAWQ leaves the head"
        elif len(graph.users(weight)) > 1:
            skipped[weight.name] = "another node reads the weight too"
        elif feeds_query_or_key(graph, node):
            skipped[weight.name] = "a query / key projection (AutoAWQ does not clip q, k: the q.k product)"
        else:
            clips[index] = weight
    return clips, skipped


def _blocks(rows: np.ndarray, nb: int, block_size: int) -> np.ndarray:
    """float32 [..., nb, block_size] of ``rows`` [..., K], zero past K."""
    padded = np.zeros(rows.shape[:-1] + (nb * block_size,), np.float32)
    padded[..., :rows.shape[-1]] = rows
    return padded.reshape(rows.shape[:-1] + (nb, block_size))


def _clamped(w: np.ndarray, ratios: np.ndarray, block_size: int, dtype: DType) -> np.ndarray:
    """``w`` [..., r, K] float32 with each block clamped to ±(its largest |w|) x ``ratios``
    (broadcast against [..., r, nb]), rounded to ``dtype``: [..., r, K]."""
    k = w.shape[-1]
    blocks = _blocks(w, block_count(k, block_size), block_size)
    limit = (np.abs(blocks).max(axis=-1) * ratios)[..., None]
    clamped = np.clip(blocks, -limit, limit)
    return convert(clamped.reshape(clamped.shape[:-2] + (-1,))[..., :k], dtype)


def clipped_rows(rows: np.ndarray, choice: np.ndarray, block_size: int, dtype: DType) -> np.ndarray:
    """``rows`` [r, K] with each block clamped to ±(its largest |w|) x RATIOS[choice] ([r, nb]
    indices), in float32, rounded to ``dtype``. choice 0 (r = 1) leaves a block as it is."""
    return _clamped(f32(rows), RATIOS[choice], block_size, dtype)


def _candidates(rows: np.ndarray, block_size: int, dtype: DType, quantizer: dict) -> tuple:
    """(W float32 [r, K], the dequantized codes of each clamp, float32 [len(RATIOS), r, K])."""
    w = f32(rows)
    clamped = _clamped(w, RATIOS[:, None, None], block_size, dtype)
    parts = ort_blocks(clamped, block_size=block_size, scale_dtype=dtype.numpy.name, **quantizer)
    return w, dequantize_blocks(*parts, bits=quantizer["bits"], block_size=block_size, k=w.shape[-1])


def block_errors(gram: np.ndarray, w: np.ndarray, fake: np.ndarray, block_size: int) -> np.ndarray:
    """float64 [len(fake), r, nb]: mean_t (x_b . (fake_b - w_b))^2 for each block b, from
    ``gram`` [nb, g, g] = X_b^T X_b / T' (float64)."""
    nb = gram.shape[0]
    d = _blocks(fake - w, nb, block_size).astype(np.float64)  # [m, r, nb, g]
    d = d.transpose(2, 0, 1, 3).reshape(nb, -1, block_size)    # [nb, m r, g]
    err = np.einsum("bng,bng->bn", np.matmul(d, gram), d)
    return err.reshape((nb,) + fake.shape[:2]).transpose(1, 2, 0)


def row_errors(x: np.ndarray, w: np.ndarray, fake: np.ndarray) -> np.ndarray:
    """float64 [r]: sum_t (x_t . (fake_n - w_n))^2 per row n, ``x`` [T, K] float32."""
    out = x @ (fake - w).T
    return np.einsum("tn,tn->n", out, out, dtype=np.float64)


def search_clip(x: np.ndarray, read: Callable, count: int, dtype: DType, *, bits: int, block_size: int,
                symmetric: bool, guard: bool = True) -> tuple:
    """(choice uint8 [count, nb] indices into RATIOS, [unclipped, clipped] row output error
    summed over all rows and tokens) for one weight: ``x`` [..., K] its calibration inputs,
    ``read(start, stop)`` its rows as folded (module docstring; ``guard=False``: AutoAWQ's
    choice alone)."""
    x = f32(x).reshape(-1, np.shape(x)[-1])
    k = x.shape[1]
    nb = block_count(k, block_size)
    sampled = _blocks(x[::max(1, x.shape[0] // N_SAMPLE_TOKENS)], nb, block_size).astype(np.float64)
    sampled = sampled.transpose(1, 0, 2)  # [nb, T', g]
    gram = np.matmul(sampled.transpose(0, 2, 1), sampled) / sampled.shape[1]
    del sampled
    quantizer = {"bits": bits, "symmetric": symmetric}
    choice = np.zeros((count, nb), np.uint8)
    totals = np.zeros(2)
    step = max(1, CHUNK_ELEMENTS // (len(RATIOS) * nb * block_size))
    for start in range(0, count, step):
        stop = min(start + step, count)
        w, fake = _candidates(np.asarray(read(start, stop)), block_size, dtype, quantizer)
        best = block_errors(gram, w, fake, block_size).argmin(axis=0)  # [r, nb], the first minimum
        chosen = np.take_along_axis(_blocks(fake, nb, block_size), best[None, :, :, None], axis=0)[0]
        chosen = chosen.reshape(w.shape[0], -1)[:, :k]
        before, after = row_errors(x, w, fake[0]), row_errors(x, w, chosen)
        if guard:
            worse = after > before
            best[worse], after[worse] = 0, before[worse]
        choice[start:stop] = best
        totals += before.sum(), after.sum()
    return choice, totals


class Clipped:
    """Lazy data of a clipped weight (``irc.weights.Derived``'s compute): the source's rows
    [start, stop) through ``clipped_rows`` with their rows of ``choice``."""

    def __init__(self, source: Param, choice: np.ndarray, block_size: int):
        self.source, self.choice, self.block_size = source, choice, block_size

    def __call__(self) -> np.ndarray:
        return self.rows(0, self.source.shape[0])

    def rows(self, start: int, stop: int) -> np.ndarray:
        return clipped_rows(read_rows(self.source, start, stop), self.choice[start:stop], self.block_size,
                            self.source.dtype)

    @property
    def row_elements(self) -> int:
        return self.source.numel // max(self.source.shape[0], 1)


def clip(param: Param, choice: np.ndarray, block_size: int) -> None:
    """Replace ``param``'s data by ``Clipped`` over its current data."""
    source = Param(param.name, param.dtype, param.shape, param.data)
    shrunk = float(np.mean(choice > 0))
    param.data = Derived(Clipped(source, choice, block_size),
                         f"awq @{param.name}: clipped, {shrunk:.0%} of blocks shrunk")


__all__ = ["RATIOS", "N_SAMPLE_TOKENS", "plan_clips", "feeds_query_or_key", "clipped_rows",
           "block_errors", "search_clip", "Clipped", "clip"]
