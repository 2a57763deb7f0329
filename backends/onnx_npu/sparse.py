"""DeepSeek sparse attention (DSA: ``irc.ops.sparse_index.topk_mask``) for onnx-npu.

The graphs that select keys with a lightning indexer (DeepSeek-V3.2, Hy-V4, the DSA kin)
build their MLA and the indexer from primitives over caches they concatenate themselves:
``present.{i}.key`` = concat(``past_key_values.{i}.key``, new) and the same for ``.value``
and the indexer's ``.index_key`` [B, 1, P, D_i]. Here, as ``attention``'s caches are:

- ``concat`` of a cache input and this call's entries that is a ``present.*`` output: the
  output is the new entries [1, ·, T, ·] only (the host writes them into the slots of the
  tokens just run, as it does the KV caches), and the concatenation [1, ·, N + T, ·] is what
  the graph reads on; a concat of another form is the portable one;
- ``topk_mask``: the keys a query may see are the host's ``attention_bias`` [1, 1, T, N + T]
  (0: the filled slots and the causal new keys), hidden scores -inf. With k' = min(k, N + T),
  ``TopK`` gives the k'-th best value v only (its indices are never read); a key is taken
  when it is visible and scores above v, or scores v and fewer than k' - #(above v) keys
  before it score v (``ties_before``): ties keep the lower key index whatever order the
  engine's TopK gives ties. The key index order is the real positions' order: slot j holds
  position j, the filled slots come before the new keys, the empty slots between them are
  hidden. k' = N + T takes every visible key, with no TopK. The op's ``attention_mask``
  operand is not read: the host's bias hides the empty slots, and onnx-npu runs one
  unpadded sequence. ``causal`` false is refused (a chunked prefill's query cannot pick the
  keys of chunks not run yet), and so are scores whose key axis is not N + T;
- ``where``: ONNX ``Where`` (the masked scores of the MLA the selection feeds; DeepSeek-V3.2's
  MLA is primitives over those caches, not ``mla_attention``, so ``backends.onnx_npu.mla``
  is not involved).

Found by compiling (``backends.onnx_npu.qnn``, soc 60 and 69) and running the HTP emulator:
the HTP places f16 ``TopK``, ``ScatterElements``, ``Equal``/``Greater``/``Less``/``And``/``Or``,
``Where`` on bool and bool -> float ``Cast``; it refuses float -> bool ``Cast`` and
``CumSum`` (hence the comparisons and the matmul prefix count); its ``TopK`` takes the
HIGHER index of equal values (the CPU provider the lower, as ONNX specifies), which is why
the indices are not used. Counts are exact in fp16 up to 2048, so k <= 2048 is decided
exactly (DeepSeek-V3.2's index_topk is 2048).
"""
from __future__ import annotations

import numpy as np

from irc.dtypes import DType
from irc.errors import BackendError
from irc.graph import Node

from backends.onnx import portable
from backends.onnx.builder import ONNX_TYPES
from backends.onnx_npu.lower import NpuBuilder, _where

PAST, PRESENT = "past_key_values.", "present."


def cache_concat(b: NpuBuilder, node: Node) -> bool:
    """Whether ``node`` is concat(past cache input, new entries) -> that cache's present output."""
    if node.op != "concat" or len(node.inputs) != 2 or node.attrs["axis"] not in (2, -2):
        return False
    past, out = node.inputs[0], node.outputs[0]
    return (past.name.startswith(PAST) and any(v is past for v in b.graph.inputs)
            and out.name == PRESENT + past.name[len(PAST):] and any(v is out for v in b.graph.outputs))


def lower_concat(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    """A cache's present output is its new entries; the graph reads on the concatenation."""
    if not cache_concat(b, node):
        portable.lower_concat(b, node, outs)
        return
    past, new = node.inputs
    b.node("Identity", [b.value(new)], outs)
    joined = b.op("Concat", [b.value(past), b.value(new)], f"{outs[0]}/with_cache", axis=2)
    b.bind(node.outputs[0], joined)


def lower_topk_mask(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    """Each query's min(k, N + T) best visible keys, bool [1, T, N + T] (module docstring)."""
    if not node.attrs["causal"]:
        raise BackendError("onnx-npu's topk_mask is the causal selection; causal false would let a query pick "
                           "keys of chunks not run yet", location=_where(node),
                           hint="compile with --target onnx or onnx-ort")
    scores = node.inputs[0]
    tokens, total = b.size(scores.shape[1]), b.size(scores.shape[2])
    out, dtype = outs[0], scores.dtype.numpy
    if total != b.context + tokens:
        raise BackendError(f"onnx-npu selects over the {b.context} cache slots and the {tokens} new keys; these "
                           f"scores have {total} keys (a selection not over a cache)", location=_where(node))
    bias = b.op("Reshape", [b.mask(None), b.i64([1, tokens, total])], f"{out}/bias")
    visible = b.op("Equal", [bias, b.const(0.0, dtype, f"{out}/zero")], f"{out}/visible")
    k = min(int(node.attrs["k"]), total)
    if k == total:
        b.node("Identity", [visible], outs)
        return
    ranked = b.op("Where", [visible, b.value(scores), b.const(-np.inf, dtype, f"{out}/hidden")], f"{out}/ranked")
    best = b.fresh(f"{out}/best")
    b.node("TopK", [ranked, b.i64([k])], [best, b.fresh(f"{out}/taken")], axis=-1, largest=1, sorted=1)
    kth = b.op("Slice", [best, b.i64([k - 1]), b.i64([k]), b.i64([-1])], f"{out}/kth")  # [1, T, 1]
    above = b.op("Greater", [ranked, kth], f"{out}/above")
    tied = b.op("Equal", [ranked, kth], f"{out}/tied")
    counted = b.op("ReduceSum", [b.op("Cast", [above], f"{out}/above_n", to=ONNX_TYPES[scores.dtype]),
                                 b.i64([-1])], f"{out}/above_count", keepdims=1)
    need = b.op("Sub", [b.const(float(k), dtype, f"{out}/k"), counted], f"{out}/need")
    before = ties_before(b, b.op("Cast", [tied], f"{out}/tied_n", to=ONNX_TYPES[scores.dtype]), tokens, total,
                         scores.dtype, f"{out}/ties_before")
    early = b.op("And", [tied, b.op("Less", [before, need], f"{out}/early")], f"{out}/tied_taken")
    b.node("And", [b.op("Or", [above, early], f"{out}/taken_mask"), visible], outs)


def ties_before(b: NpuBuilder, flags: str, tokens: int, total: int, dtype: DType, out: str) -> str:
    """[1, T, S]: per key j, how many keys i < j have flag 1 (an exclusive prefix sum; the HTP
    takes no ``CumSum``): the keys in blocks of ``width``, the sums before each key within
    its block and the blocks' totals before each block, both as a matmul by a strictly
    upper triangular 0/1 matrix; counts are exact in fp16 up to 2048, so a count compared
    with k <= 2048 is decided right."""
    width = int(np.ceil(np.sqrt(total)))
    blocks = -(-total // width)
    padded = flags
    if blocks * width > total:
        padded = b.op("Concat", [flags, b.const(np.zeros((1, tokens, blocks * width - total)), dtype.numpy,
                                                f"{out}/pad")], f"{out}/padded", axis=-1)
    grid = b.op("Reshape", [padded, b.i64([1, tokens, blocks, width])], f"{out}/grid")
    within = b.op("MatMul", [grid, b.const(np.triu(np.ones((width, width)), 1), dtype.numpy, f"{out}/within_tri")],
                  f"{out}/within")
    totals = b.op("ReduceSum", [grid, b.i64([-1])], f"{out}/totals", keepdims=0)  # [1, T, blocks]
    earlier = b.op("MatMul", [totals, b.const(np.triu(np.ones((blocks, blocks)), 1), dtype.numpy,
                                              f"{out}/blocks_tri")], f"{out}/earlier")
    summed = b.op("Add", [within, b.op("Unsqueeze", [earlier, b.i64([-1])], f"{out}/earlier4")], f"{out}/summed")
    flat = b.op("Reshape", [summed, b.i64([1, tokens, blocks * width])], f"{out}/flat")
    if blocks * width == total:
        return flat
    return b.op("Slice", [flat, b.i64([0]), b.i64([total]), b.i64([-1])], out)


LOWERINGS = {"concat": lower_concat, "topk_mask": lower_topk_mask, "where": portable.lower_elementwise}
