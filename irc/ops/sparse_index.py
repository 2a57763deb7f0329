"""``topk_mask``: the key selection of DeepSeek's sparse attention (DSA, DeepSeek-V3.2's
lightning indexer) as a bool mask, so the attention it feeds stays a masked dense one.

    topk_mask(scores [B, T, S] f32, attention_mask? [B, S]) -> bool [B, T, S]

Row (b, t) keeps the ``k`` keys with the largest scores among the keys it may see, and only
those: the visible keys are ``irc.ops.attention.visible_keys``' (query t sits at key index
S - T + t, so S - T past tokens are cached; ``causal`` hides later keys, ``attention_mask``
zeros hide padding). A row that sees fewer than ``k`` keys keeps all of them. Ties keep the
lower key index first, as ONNX ``TopK`` and a stable descending sort do (torch.topk leaves
the order of ties unspecified; transformers' indexer scores are sums of ReLU'd products,
so exact ties among visible keys need every index head to be zero for both keys).

This is transformers' ``DeepseekV32Indexer`` selection followed by its scatter into the
attention mask: it adds the causal mask to the scores (hidden keys at float32's minimum or
-inf), takes ``topk(min(index_topk, S))`` and masks every key not taken; a hidden key it
takes is masked by the causal mask anyway, so the keys left are exactly these.

Cost: one comparison per score for the selection, the scores read and the mask written.

``block_topk_mask`` (MiniMax-M3's indexer) selects by blocks of keys instead, per indexer head:

    block_topk_mask(scores [B, H, T, S] f32, position_ids [B, T], attention_mask? [B, S])
        -> bool [B, H, T, S]

(``block_topk_visible``: the keys past the query's position score -inf, blocks of ``block``
slots pool by max, the ``local`` blocks ending at the query's score +inf, the ``k`` best
finite blocks are taken, ties to the lower block; their keys the query may see are kept.)
"""
from __future__ import annotations

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.ops.primitives import elementwise_cost
from irc.ops.registry import REQUIRED, OpDef, TensorType, expect, register, same_dims

OP = "topk_mask"
OPERANDS = ("scores", "attention_mask?")


def topk_visible(scores, attention_mask=None, *, k: int, causal: bool = True) -> np.ndarray:
    """Bool [B, T, S]: each row's ``k`` highest-scoring visible keys (ties: lower index)."""
    scores = np.asarray(scores, dtype=np.float32)
    batch, seq, total = scores.shape
    query = (total - seq) + np.arange(seq)[:, None]
    key = np.arange(total)[None, :]
    visible = np.broadcast_to(key <= query if causal else np.ones((seq, total), bool), (batch, seq, total))
    if attention_mask is not None:
        visible = visible & (np.asarray(attention_mask) != 0)[:, None, :]
    ranked = np.where(visible, scores, -np.inf)
    order = np.argsort(-ranked, axis=-1, kind="stable")[..., :min(int(k), total)]
    selected = np.zeros(scores.shape, dtype=bool)
    np.put_along_axis(selected, order, True, axis=-1)
    return selected & visible


def _topk_mask_infer(inputs, attrs):
    scores = inputs[0]
    mask = inputs[1] if len(inputs) > 1 else None
    k = attrs["k"]
    expect(isinstance(k, int) and not isinstance(k, bool) and k > 0, f"{OP}: k must be a positive int, got {k!r}")
    expect(isinstance(attrs["causal"], bool), f"{OP}: causal must be true or false, got {attrs['causal']!r}")
    expect(scores.rank == 3 and scores.dtype.is_float, f"{OP}: scores must be float [B, T, S], got "
                                                        f"{scores.dtype} {dims.format_shape(scores.shape)}")
    if mask is not None:
        expect(mask.rank == 2 and same_dims(mask.shape[0], scores.shape[0]) and same_dims(mask.shape[1],
                                                                                         scores.shape[2]),
               f"{OP}: attention_mask must be [B, S] = [{scores.shape[0]}, {scores.shape[2]}], got "
               f"{dims.format_shape(mask.shape)}")
    return [TensorType(DType.bool, scores.shape)]


def _topk_mask_reference(inputs, attrs):
    """Each query row's k highest-scoring visible keys (causal, attention_mask), as a bool
    mask [B, T, S]; ties keep the lower key index."""
    scores = inputs[0]
    mask = inputs[1] if len(inputs) > 1 else None
    return [topk_visible(scores, mask, k=attrs["k"], causal=attrs["causal"])]


register(OpDef(OP, OPERANDS, {"k": REQUIRED, "causal": True}, _topk_mask_infer, _topk_mask_reference,
               elementwise_cost))


# ---- block_topk_mask: MiniMax-M3's block selection ------------------------------------------

BLOCK_OP = "block_topk_mask"
BLOCK_OPERANDS = ("scores", "position_ids", "attention_mask?")


def block_topk_visible(scores, position_ids, attention_mask=None, *, block: int, k: int, local: int) -> np.ndarray:
    """Bool [B, H, T, S]: MiniMax-M3's lightning-indexer selection (``MiniMaxM3VLIndexer``).

    Per (b, h, t): a key slot j later than the query's position (``position_ids``, not its
    slot: with left padding the two differ) scores -inf; the slots pool by max into blocks
    of ``block`` (the last one padded with -inf); the ``local`` blocks
    max(position // block - l, 0), l < local, score +inf; the min(k, blocks) best blocks are
    taken, those scoring -inf are not (ties: the lower block first); a key is kept when its
    block is taken and the query may see it (causal by slot, attention_mask)."""
    scores = np.asarray(scores, dtype=np.float32)
    batch, heads, seq, total = scores.shape
    positions = np.asarray(position_ids, dtype=np.int64)[:, None, :, None]  # [B, 1, T, 1]
    key = np.arange(total)
    ranked = np.where(key[None, None, None, :] > positions, np.float32(-np.inf), scores)
    blocks = -(-total // block)
    padded = np.full((batch, heads, seq, blocks * block), -np.inf, np.float32)
    padded[..., :total] = ranked
    pooled = padded.reshape(batch, heads, seq, blocks, block).max(axis=-1)
    index = np.arange(blocks)
    for step in range(local):
        pooled = np.where(index == np.maximum(positions // block - step, 0), np.float32(np.inf), pooled)
    order = np.argsort(-pooled, axis=-1, kind="stable")[..., :min(int(k), blocks)]
    taken = np.zeros(pooled.shape, dtype=bool)
    np.put_along_axis(taken, order, np.take_along_axis(pooled, order, axis=-1) > -np.inf, axis=-1)
    query = (total - seq) + np.arange(seq)[:, None]
    visible = np.broadcast_to(key[None, :] <= query, (batch, 1, seq, total))
    if attention_mask is not None:
        visible = visible & (np.asarray(attention_mask) != 0)[:, None, None, :]
    return taken[..., key // block] & visible


def _block_infer(inputs, attrs):
    scores, positions = inputs[0], inputs[1]
    mask = inputs[2] if len(inputs) > 2 else None
    for name in ("block", "k"):
        value = attrs[name]
        expect(isinstance(value, int) and not isinstance(value, bool) and value > 0,
               f"{BLOCK_OP}: {name} must be a positive int, got {value!r}")
    local = attrs["local"]
    expect(isinstance(local, int) and not isinstance(local, bool) and 0 <= local <= attrs["k"],
           f"{BLOCK_OP}: local must be an int in [0, k], got {local!r}")
    expect(scores.rank == 4 and scores.dtype.is_float, f"{BLOCK_OP}: scores must be float [B, H, T, S], got "
                                                        f"{scores.dtype} {dims.format_shape(scores.shape)}")
    expect(positions.rank == 2 and not positions.dtype.is_float and same_dims(positions.shape[0], scores.shape[0])
           and same_dims(positions.shape[1], scores.shape[2]),
           f"{BLOCK_OP}: position_ids must be integer [B, T], got {dims.format_shape(positions.shape)}")
    if mask is not None:
        expect(mask.rank == 2 and same_dims(mask.shape[0], scores.shape[0]) and same_dims(mask.shape[1],
                                                                                         scores.shape[3]),
               f"{BLOCK_OP}: attention_mask must be [B, S], got {dims.format_shape(mask.shape)}")
    return [TensorType(DType.bool, scores.shape)]


def _block_reference(inputs, attrs):
    """Each query row's taken blocks' visible keys, bool [B, H, T, S] (``block_topk_visible``)."""
    mask = inputs[2] if len(inputs) > 2 else None
    return [block_topk_visible(inputs[0], inputs[1], mask, block=attrs["block"], k=attrs["k"], local=attrs["local"])]


register(OpDef(BLOCK_OP, BLOCK_OPERANDS, {"block": REQUIRED, "k": REQUIRED, "local": 0}, _block_infer,
               _block_reference, elementwise_cost))
