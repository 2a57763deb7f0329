"""What ``com.microsoft.GroupQueryAttention`` absorbs on the onnx-ort target.

- ``gqa-rope``: the ``rope`` nodes that make its query and key (same configuration, same
  ``position_ids``, whole head rotated, head size a multiple of 16) become ``do_rotary=1``
  with the cos/sin caches and ``position_ids`` as GQA inputs (input 9), so a left-padded
  row rotates at its own positions exactly as the separate ``RotaryEmbedding`` nodes did.
- ``pack-qkv``: when the q, k and v projections on one activation are each read only on
  the way to this attention, one product feeds GQA's packed ``query`` input (key and value
  left empty): for three bias-free f32 ``linear`` nodes, a ``FusedMatMul(transB=1)`` with
  their weights stacked as stored, [(H + 2K) * D, d] (``portable.stored_matmul``); for three
  ``dequant_linear`` nodes one ``MatMulNBits`` takes
  (``backends.onnx.quant_pack.packable``: same K, bits, block size, accuracy level, scales'
  dtype, zero points or none, biases or none), one MatMulNBits over their codes, scales,
  zero points and biases stacked q|k|v along N (``quant_pack.packed_matmul``). Rows of a
  quantized weight are independent (every block is within one output row), so each output
  column is computed from the same codes as before and the model is the same size; where
  the int4 path otherwise wrote a MatMulNBits and a Split, GQA reads the packed product
  directly, as onnxruntime-genai's builder's int4 graphs do. Only with ``gqa-rope`` (or no
  RoPE at all): a separate RoPE sits between the projections and the attention.

``--unfuse gqa-rope,pack-qkv`` turns either off (``benchmarks/cpu_speed.py`` measures both
ways). Each absorbed node is skipped by its own lowering (``absorbed``) and emitted by the
attention's (``backends.onnx.ort.lower_attention_ort``, which also writes the packed product:
``packed_qkv``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from irc.dtypes import DType
from irc.graph import Graph, Node, Param

from backends.onnx.builder import Builder
from backends.onnx.fits import gqa_fits, matmul_nbits_fits, only_matrix_uses, packable

FUSIONS = ("gqa-rope", "pack-qkv")


@dataclass
class Absorbed:
    """What one attention node's GroupQueryAttention computes besides attention."""

    rope_q: Optional[Node] = None
    rope_k: Optional[Node] = None
    projections: tuple = ()         # the q, k, v linear nodes, when packed


def plan(b: Builder) -> dict:
    """{id(attention node): Absorbed} for the graph (computed once per builder)."""
    return b.cached(("gqa-fuse",), lambda: _plan(b.graph, b.unfused))


def absorbed(b: Builder, node: Node) -> bool:
    """Is ``node`` (a rope or linear) computed inside some GroupQueryAttention?"""
    inside = b.cached(("gqa-fuse-nodes",), lambda: {id(n) for entry in plan(b).values()
                                                    for n in (entry.rope_q, entry.rope_k, *entry.projections) if n})
    return id(node) in inside


def _plan(graph: Graph, unfused: frozenset) -> dict:
    result = {}
    for node in graph.nodes:
        if node.op != "attention" or gqa_fits(node) is not None:
            continue
        entry = Absorbed()
        if "gqa-rope" not in unfused:
            entry.rope_q, entry.rope_k = _ropes(node)
        if "pack-qkv" not in unfused and (entry.rope_q or not _has_rope(node)):
            entry.projections = _projections(node, entry)
        if entry.rope_q or entry.projections:
            result[id(node)] = entry
    return result


def _has_rope(node: Node) -> bool:
    return any(v.producer is not None and v.producer.op == "rope" for v in node.inputs[:2])


def _ropes(node: Node) -> tuple:
    q, k = node.inputs[:2]
    rq, rk = q.producer, k.producer
    if rq is None or rk is None or rq.op != "rope" or rk.op != "rope" or len(q.uses) != 1 or len(k.uses) != 1:
        return None, None
    a = rq.attrs
    if (rq.attrs != rk.attrs or rq.inputs[1] is not rk.inputs[1] or a["head_dim"] != node.attrs["head_dim"]
            or a["rotary_dim"] not in (None, a["head_dim"]) or a["head_dim"] % 16
            or q.dtype not in (DType.f32, DType.f16) or rq.inputs[1].dtype != DType.i64 or a.get("mrope")):
        return None, None
    return rq, rk


def _projections(node: Node, entry: Absorbed) -> tuple:
    sources = [entry.rope_q.inputs[0], entry.rope_k.inputs[0]] if entry.rope_q else list(node.inputs[:2])
    sources.append(node.inputs[2])
    producers = [v.producer for v in sources]
    if any(p is None for p in producers):
        return ()
    x = producers[0].inputs[0]
    if any(p.inputs[0] is not x or len(p.outputs[0].uses) != 1 for p in producers):
        return ()
    if all(p.op == "dequant_linear" for p in producers):
        return tuple(producers) if packable(producers, matmul_nbits_fits) else ()
    if any(p.op != "linear" or len(p.inputs) > 2 and p.inputs[2] is not None or not isinstance(p.inputs[1], Param)
           or not only_matrix_uses(p.inputs[1]) for p in producers) or x.dtype != DType.f32:
        return ()
    return tuple(producers)

