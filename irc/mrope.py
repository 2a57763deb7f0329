"""Qwen-VL's multimodal RoPE positions for a prompt: where each token sits on the (time,
height, width) axes the text model's ``rope`` (``mrope``) reads, as transformers'
``Qwen2_5_VLModel.get_rope_index`` lays them out.

A text token's three positions are equal and count on from the token before it. An image's
tokens (its run of ``image_token`` ids, one per merge x merge block of its ``image_grid_thw``
row (t, h, w)) sit at start + (frame, block row, block column), start being the position after
the text before it; the text after the image goes on from start + max(h, w) / merge. Padding
(``attention_mask`` 0) is position 0 and is skipped. ``delta`` per row, max position + 1 -
real tokens, is what a decode step adds to its plain position (transformers' ``rope_deltas``):
step positions are the real tokens before it + delta, on every axis.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

AXES = 3


def mrope_positions(ids, grids, image_token: int, merge: int,
                    attention_mask: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
    """(positions i64 [3, B, T], delta i64 [B]) of a prompt ``ids`` [B, T] whose images have
    the ``grids`` [N, 3] in order (all rows' images one after another)."""
    ids = np.asarray(ids, np.int64)
    keep = np.ones(ids.shape, bool) if attention_mask is None else np.asarray(attention_mask) != 0
    grids = iter(np.asarray(grids, np.int64).reshape(-1, 3).tolist())
    positions = np.zeros((AXES,) + ids.shape, np.int64)
    deltas = np.zeros(ids.shape[0], np.int64)
    for row, (tokens, real) in enumerate(zip(ids, keep)):
        tokens = tokens[real]
        out, at, i = [], 0, 0
        while i < len(tokens):
            if tokens[i] != image_token:
                out.append(np.full((AXES, 1), at))
                at, i = at + 1, i + 1
                continue
            try:
                t, h, w = next(grids)
            except StopIteration:
                raise ValueError("mrope_positions: more images in the prompt than image grids") from None
            h, w = h // merge, w // merge
            frame, height, width = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
            block = np.stack([frame.reshape(-1), height.reshape(-1), width.reshape(-1)]) + at
            if tokens[i:i + block.shape[1]].tolist() != [image_token] * block.shape[1]:
                raise ValueError(f"mrope_positions: an image of grid {[t, h * merge, w * merge]} needs "
                                 f"{block.shape[1]} placeholder tokens in a row")
            out.append(block)
            at, i = at + max(h, w), i + block.shape[1]
        laid = np.concatenate(out, axis=1) if out else np.zeros((AXES, 0), np.int64)
        positions[:, row, real] = laid
        deltas[row] = (laid.max() + 1 if laid.size else 0) - len(tokens)
    if next(grids, None) is not None:
        raise ValueError("mrope_positions: more image grids than images in the prompt")
    return positions, deltas


def step_positions(past_real: np.ndarray, count: int, delta: np.ndarray) -> np.ndarray:
    """i64 [3, B, count]: the positions of ``count`` new text tokens after ``past_real`` [B]
    real tokens, each row shifted by its ``delta``."""
    plain = np.asarray(past_real, np.int64)[:, None] + np.arange(count, dtype=np.int64)[None, :]
    return np.broadcast_to(plain + np.asarray(delta, np.int64)[:, None], (AXES,) + plain.shape).copy()
