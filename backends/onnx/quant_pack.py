"""``onnx-ort``: the ``dequant_linear`` nodes that read the same activation (an attention
layer's q, k and v projections; an MLP's gate and up after ``lower-mlp``) become one
``MatMulNBits`` over their codes stacked along N, then one ``Split`` into their outputs.

Why: a decode step multiplies one token by each weight, so each MatMulNBits call is small and
its fixed cost (a thread-pool dispatch) counts; onnxruntime-genai's builder packs q, k and v
for the same reason. Rows of a quantized weight are independent (codes, scales and zero points
are per output row), so the stacked initializers are the three weights' bytes one after
another: the model on disk is the same size, and each output row is computed from the same
numbers as before.

Packed when they all fit MatMulNBits (``backends.onnx.quant.matmul_nbits_fits``) and agree
on K, bits, block_size, accuracy level, the scales' dtype and whether there are (u8) zero
points and biases (``packable``); the first node in graph order emits the pack and marks the
others handled. Projections a GroupQueryAttention reads packed (``backends.onnx.gqa_fuse``'s
``pack-qkv``: q, k and v as its packed query, no Split) are not grouped here.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from irc.graph import Node

from backends.onnx.builder import MS_DOMAIN, Builder
from backends.onnx.gqa_fuse import absorbed

KEYS = ("K", "bits", "block_size", "accuracy_level")


def _operands(node: Node) -> list:
    return (list(node.inputs) + [None] * 5)[:5]


def _signature(node: Node) -> tuple:
    _, _, scales, zero_points, bias = _operands(node)
    return (tuple(node.attrs.get(k) for k in KEYS), scales.dtype, zero_points is not None, bias is not None)


def packable(nodes, fits) -> bool:
    """Can one MatMulNBits over stacked codes compute these dequant_linear nodes? Each fits
    MatMulNBits (``fits(n)`` is None), none has float zero points (their product takes a
    correction term per weight), and all share K, bits, block size, accuracy level, the
    scales' dtype and whether there are zero points and biases."""
    first = _signature(nodes[0])
    for n in nodes:
        zero_points = _operands(n)[3]
        if (n.op != "dequant_linear" or fits(n) is not None or _signature(n) != first
                or zero_points is not None and zero_points.dtype.is_float):
            return False
    return True


def siblings(b: Builder, node: Node, fits) -> list[Node]:
    """``node`` and the later dequant_linear readers of its activation it packs with, in graph
    order; just ``[node]`` when there are none. ``fits(n)``: None when MatMulNBits takes ``n``."""
    x = node.inputs[0]
    if not packable([node], fits):
        return [node]
    order = b.cached(("node-order",), lambda: {id(n): i for i, n in enumerate(b.graph.nodes)})
    group = sorted((n for n in b.graph.users(x) if n.op == "dequant_linear" and n.inputs[0] is x
                    and packable([node, n], fits) and not absorbed(b, n)), key=lambda n: order[id(n)])
    return group if len(group) > 1 and group[0] is node else [node]


def stack_rows(*arrays) -> np.ndarray:
    return np.concatenate(arrays, axis=0)


def _stacked(b: Builder, params: list, hint: str) -> str:
    rows = sum(p.shape[0] for p in params)
    return b.derived(hint, params[0].dtype, (rows, *params[0].shape[1:]), tuple(params), partial(stack_rows))


def packed_matmul(b: Builder, group: list[Node], accuracy: dict) -> str:
    """One MatMulNBits over the stacked codes (and biases) of ``group`` (``packable``), in
    that order: its output's last axis holds each node's output one after another."""
    first = group[0]
    columns = [_operands(n) for n in group]
    stem = columns[0][1].name[:-len(".qweight")] if columns[0][1].name.endswith(".qweight") else columns[0][1].name
    stem += "+" + "+".join(c[1].name.split(".")[-2] for c in columns[1:])
    inputs = [b.value(first.inputs[0])]
    for index, part in ((1, "qweight"), (2, "scales"), (3, "zero_points")):
        if columns[0][index] is None:
            inputs.append("")
        else:
            inputs.append(_stacked(b, [c[index] for c in columns], f"{stem}.{part}"))
    inputs.append("")  # g_idx
    if columns[0][4] is not None:
        inputs.append(_stacked(b, [c[4] for c in columns], f"{stem}.bias"))
    sizes = [n.attrs["N"] for n in group]
    a = first.attrs
    return b.op("MatMulNBits", inputs, f"{stem}/packed", domain=MS_DOMAIN, K=a["K"], N=sum(sizes), bits=a["bits"],
                block_size=a["block_size"], **accuracy)


def lower_packed(b: Builder, group: list[Node], accuracy: dict) -> None:
    """One MatMulNBits over the stacked codes, then Split into each node's output."""
    packed = packed_matmul(b, group, accuracy)
    outs = [b.name_for(n.outputs[0]) for n in group]
    b.node("Split", [packed, b.i64([n.attrs["N"] for n in group])], outs, axis=-1)
    for n in group[1:]:
        b.handled.add(id(n))


__all__ = ["packable", "siblings", "packed_matmul", "lower_packed", "stack_rows"]
