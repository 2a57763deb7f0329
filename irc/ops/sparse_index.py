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
