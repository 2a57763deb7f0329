"""``topk_mask`` (``irc.ops.sparse_index``, DeepSeek-V3.2's indexer selection; and MiniMax-M3's
``block_topk_mask``, below) in standard
ops, the same for both ONNX targets: the scores of keys the row may not see set to -inf
(``backends.onnx.attention.visibility``'s causal and padding mask, [B, T, S]), ``TopK``
of min(k, S) along the keys (ties: the lower index, as ONNX specifies and the reference
does), a ``ScatterElements`` of ones at the indices taken into zeros, cast to bool and
ANDed with the visibility (a row that sees fewer than k keys takes hidden ones too)."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from irc.graph import Node
from irc.ops.registry import pad_inputs

from backends.onnx.attention import visibility
from backends.onnx.builder import Builder


def lower_topk_mask(b: Builder, node: Node, outs: list[str]) -> None:
    scores, mask = pad_inputs(node.inputs, 2)
    _, seq, total = scores.shape
    out = outs[0]
    ranked = b.op("Cast", [b.value(scores)], f"{out}/f32", to=TensorProto.FLOAT)
    visible = visibility(b, mask, seq, total, node.attrs["causal"], None)
    if visible:
        visible = b.op("Squeeze", [visible, b.i64([1])], f"{out}/visible")  # [B or 1, T, S]
        ranked = b.op("Where", [visible, ranked, b.const(-np.inf, np.float32, f"{out}/hidden")], f"{out}/ranked")
    keys = b.op("Shape", [ranked], f"{out}/keys", start=2, end=3)
    k = b.op("Min", [b.i64([node.attrs["k"]]), keys], f"{out}/k")
    taken = b.fresh(f"{out}/taken")
    b.node("TopK", [ranked, k], [b.fresh(f"{out}/top_values"), taken], axis=-1, largest=1, sorted=1)
    zeros = b.op("Expand", [b.const(0.0, np.float32, f"{out}/zero"), b.op("Shape", [ranked], f"{out}/shape")],
                 f"{out}/zeros")
    ones = b.op("Expand", [b.const(1.0, np.float32, f"{out}/one"), b.op("Shape", [taken], f"{out}/taken_shape")],
                f"{out}/ones")
    chosen = b.op("ScatterElements", [zeros, taken, ones], f"{out}/scattered", axis=-1)
    if not visible:
        b.node("Cast", [chosen], outs, to=TensorProto.BOOL)
        return
    b.node("And", [b.op("Cast", [chosen], f"{out}/chosen", to=TensorProto.BOOL), visible], outs)


def lower_block_topk_mask(b: Builder, node: Node, outs: list[str]) -> None:
    """``block_topk_mask`` (MiniMax-M3's block selection): the keys past the query's position
    at -inf, padded to whole blocks with -inf (``Pad``), pooled by ``ReduceMax``, the local
    blocks at +inf, ``TopK`` of min(k, blocks) (ties: the lower block), the finite ones
    scattered into a block mask, gathered back per key and ANDed with the visibility."""
    scores, positions, mask = pad_inputs(node.inputs, 3)
    _, _, seq, total = scores.shape
    block, out = node.attrs["block"], outs[0]
    ranked = b.op("Cast", [b.value(scores)], f"{out}/f32", to=TensorProto.FLOAT)
    keys = b.op("Shape", [ranked], f"{out}/keys", start=3, end=4)  # [1]: S
    key_index = b.op("Range", [b.i64(0), b.op("Squeeze", [keys], f"{out}/s"), b.i64(1)], f"{out}/key_index")
    position = b.op("Unsqueeze", [b.op("Cast", [b.value(positions)], f"{out}/pos", to=TensorProto.INT64),
                                  b.i64([1, 3])], f"{out}/pos4")  # [B, 1, T, 1]
    inf = b.const(np.inf, np.float32, f"{out}/inf")
    neg = b.op("Neg", [inf], f"{out}/neg_inf")
    ranked = b.op("Where", [b.op("Greater", [key_index, position], f"{out}/future"), neg, ranked], f"{out}/ranked")
    size = b.i64([block])
    blocks = b.op("Div", [b.op("Add", [keys, b.i64([block - 1])], f"{out}/keys_up"), size], f"{out}/blocks")
    pad = b.op("Sub", [b.op("Mul", [blocks, size], f"{out}/padded_keys"), keys], f"{out}/pad")
    pads = b.op("Concat", [b.i64([0, 0, 0, 0, 0, 0, 0]), pad], f"{out}/pads", axis=0)
    padded = b.op("Pad", [ranked, pads, neg], f"{out}/padded", mode="constant")
    shape = b.op("Concat", [b.i64([0, 0, 0]), blocks, size], f"{out}/block_shape", axis=0)
    pooled = b.op("ReduceMax", [b.op("Reshape", [padded, shape], f"{out}/by_block"), b.i64([-1])], f"{out}/pooled",
                  keepdims=0)  # [B, H, T, NB]
    block_index = b.op("Range", [b.i64(0), b.op("Squeeze", [blocks], f"{out}/nb"), b.i64(1)], f"{out}/block_index")
    own = b.op("Div", [position, size], f"{out}/own_block")
    for step in range(node.attrs["local"]):
        local = b.op("Max", [b.op("Sub", [own, b.i64(step)], f"{out}/local{step}_raw"), b.i64(0)], f"{out}/local{step}")
        pooled = b.op("Where", [b.op("Equal", [block_index, local], f"{out}/is_local{step}"), inf, pooled],
                      f"{out}/boosted{step}")
    k = b.op("Min", [b.i64([node.attrs["k"]]), blocks], f"{out}/k")
    values, taken = b.fresh(f"{out}/top_values"), b.fresh(f"{out}/taken")
    b.node("TopK", [pooled, k], [values, taken], axis=-1, largest=1, sorted=1)
    finite = b.op("Cast", [b.op("Greater", [values, neg], f"{out}/finite_bool")], f"{out}/finite", to=TensorProto.FLOAT)
    zeros = b.op("Expand", [b.const(0.0, np.float32, f"{out}/zero"), b.op("Shape", [pooled], f"{out}/shape")],
                 f"{out}/zeros")
    chosen = b.op("ScatterElements", [zeros, taken, finite], f"{out}/scattered", axis=-1)
    per_key = b.op("Gather", [chosen, b.op("Div", [key_index, size], f"{out}/key_block")], f"{out}/per_key", axis=3)
    kept = b.op("Cast", [per_key], f"{out}/kept", to=TensorProto.BOOL)
    visible = visibility(b, mask, seq, total, True, None)  # [B or 1, 1, T, S]
    b.node("And", [kept, visible], outs)


LOWERINGS = {"topk_mask": lower_topk_mask, "block_topk_mask": lower_block_topk_mask}
