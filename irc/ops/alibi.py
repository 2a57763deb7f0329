"""ALiBi, the third position encoding the seeds teach (beside learned tables and RoPE): no
position is added to the tokens; each head h adds ``slope_h · (j − i)`` to the score of query
i on key j, a linear penalty on distance.

The ``attention`` op takes the slopes as its optional ``alibi`` operand [H] (f32, a
``constant`` node: they are not learned) and adds ``alibi[h] · (j − (P + t))`` to the scaled
(and soft-capped) scores of query row t, key index j of the cache, before masking
(``irc.ops.attention``). Only key index minus query index enters, so the KV cache holds no
positions and left padding is exact: transformers' BLOOM and Falcon count a key's position
among the row's real tokens (``cumsum(mask) − 1``) and MPT from the end of a fixed table,
and both differ from ``j − i`` by a constant per query row, which the softmax drops.

The families' slopes differ only in how a head count that is not a power of two is served:

- ``bloom_slopes`` (BLOOM, Falcon: the paper's rule): for the largest power of two n ≤ H,
  2^(−8k/n) for k = 1..n, then the odd terms 2^(−4k/n), k = 1, 3, 5, ..., of the sequence
  for 2n, until there are H;
- ``mpt_slopes`` (MPT, its ``alibi_bias_max`` m, 8 by default): for the power of two N ≥ H,
  2^(−m·k/N) for k = 1..N, then the odd-indexed terms before the even-indexed ones, the
  first H of them.
"""
from __future__ import annotations

import math

import numpy as np


def bloom_slopes(heads: int) -> np.ndarray:
    """[H] f32: transformers' ``_get_alibi_slopes`` (BLOOM's, Falcon's)."""
    closest = 2 ** int(math.floor(math.log2(heads)))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [base ** k for k in range(1, closest + 1)]
    if closest != heads:
        extra = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra ** k for k in range(1, 1 + 2 * min(closest, heads - closest), 2)]
    return np.asarray(slopes, np.float32)


def mpt_slopes(heads: int, bias_max: float = 8.0) -> np.ndarray:
    """[H] f32: transformers' ``build_mpt_alibi_tensor`` slopes."""
    power = 2 ** int(math.ceil(math.log2(heads)))
    slopes = 1.0 / np.power(2.0, np.arange(1, power + 1, dtype=np.float32) * np.float32(bias_max / power))
    if power != heads:
        slopes = np.concatenate([slopes[1::2], slopes[::2]])[:heads]
    return slopes.astype(np.float32)


def alibi_bias(slopes, seq: int, total: int) -> np.ndarray:
    """[H, T, S] f32: slope_h · (j − (P + t)) for the T new queries over S = P + T keys."""
    distance = np.arange(total)[None, :] - (total - seq + np.arange(seq))[:, None]
    return np.asarray(slopes, np.float32)[:, None, None] * distance.astype(np.float32)[None]
