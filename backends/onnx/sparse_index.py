"""``topk_mask`` (``irc.ops.sparse_index``, DeepSeek-V3.2's indexer selection) in standard
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


LOWERINGS = {"topk_mask": lower_topk_mask}
