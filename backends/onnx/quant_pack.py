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
on K, bits, block_size, accuracy level, the scales' dtype, the zero points' kind (none, u8
or float) and whether there are biases (``packable``); the first node in graph order emits the pack and marks the
others handled. Projections a GroupQueryAttention reads packed (``backends.onnx.gqa_fuse``'s
``pack-qkv``: q, k and v as its packed query, no Split) are not grouped here.

Float zero points (a GGUF's Q4_1 and K-quant minima, 4-bit codes; Q5_1 / Q5_K, 8-bit codes):
ORT 1.32's CPU MatMulNBits takes them with 4-bit codes (and refuses them with 8-bit codes), but
then dequantizes the whole weight on every call (6-13 ms where u8 zero points
take 0.1 ms for a 4864 x 896 weight at one token, ``benchmarks/gguf_speed.py --kernels``). So
the kernel gets zi, the nearest code to each zero point zp, as u8 zero points, and the rest
is added back exactly: x @ ((q - zp) * s).T = MatMulNBits(x, q, s, zi) - blocksums(x) @
((zp - zi) * s).T, the block sums over each block of K inputs (``subtract_zero_fractions``:
Reshape, ReduceSum, MatMul, Sub). The second term is small (|zp - zi| <= 1/2 inside the code
range), so little is lost to cancellation. Packed weights share it: one block sum of x and one
correction MatMul over their offsets stacked along N, so a packed group costs four small ops,
not four per weight.

What that costs, and what was tried (SmolLM2-135M's Q4_1 file, onnxruntime-genai's loop,
``benchmarks/gguf_speed.py``, 2026-12-02): the corrections are 480 of the decode graph's 837
nodes and about 15% of a step (79.9 tok/s; 94.8 with them deleted, wrong values, against irc's
int4 at 103.2). Block sums from a MatMulNBits over indicator codes instead of Reshape and
ReduceSum (one op for two) measured the same (76.1 against 77.9), and so did the other one-op
block sums (2026-12-07, 6 interleaved rounds, 120 fewer nodes): 157.1 tok/s as written,
153.6 with ``AveragePool`` (kernel and stride one block, the offsets times the block) and
151.8 with a float MatMul by a 0/1 block indicator, each prefilling 128 tokens slower (150 and
142 ms against 136): the correction's cost is not its node count. Dropping the fractions, each
block's zero point rounded or its 16 levels refitted on an integer zero point, costs
perplexity 85.06 -> 111.6 or, searched, 98.7, and top-1 agreement with the file 95.7% -> 69%:
so the file's values are kept and the correction paid.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from irc.dtypes import DType
from irc.graph import Node
from irc.ops.quant import pack_codes, packed_width

from backends.onnx.builder import MS_DOMAIN, Builder
from backends.onnx.fits import dequant_operands, packable
from backends.onnx.gqa_fuse import absorbed

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


def stacked(b: Builder, params: list, hint: str) -> str:
    """One initializer of ``params`` stacked along their rows, streamed by the writer param by
    param at its place (no stacked copy in memory)."""
    rows = sum(p.shape[0] for p in params)
    return b.derived(hint, params[0].dtype, (rows, *params[0].shape[1:]), tuple(params), partial(stack_rows),
                     "stacked")


def packed_matmul(b: Builder, group: list[Node], accuracy: dict) -> str:
    """One MatMulNBits over the stacked codes (and biases) of ``group`` (``packable``), in
    that order: its output's last axis holds each node's output one after another (float
    zero points: after the shared correction, module docstring)."""
    first = group[0]
    columns = [dequant_operands(n) for n in group]
    stem = columns[0][1].name[:-len(".qweight")] if columns[0][1].name.endswith(".qweight") else columns[0][1].name
    stem += "+" + "+".join(c[1].name.split(".")[-2] for c in columns[1:])
    zero_points, scales = [c[3] for c in columns], [c[2] for c in columns]
    float_zero = zero_points[0] is not None and zero_points[0].dtype.is_float
    a = first.attrs
    inputs = [b.value(first.inputs[0])]
    for index, part in ((1, "qweight"), (2, "scales"), (3, "zero_points")):
        if columns[0][index] is None:
            inputs.append("")
        elif index == 3 and float_zero:
            inputs.append(zero_codes(b, zero_points, scales, a["bits"], f"{stem}.zero_points.codes"))
        else:
            inputs.append(stacked(b, [c[index] for c in columns], f"{stem}.{part}"))
    inputs.append("")  # g_idx
    if columns[0][4] is not None:
        inputs.append(stacked(b, [c[4] for c in columns], f"{stem}.bias"))
    sizes = [n.attrs["N"] for n in group]
    out = b.fresh(f"{stem}/packed")
    product = b.fresh(f"{stem}/packed_codes") if float_zero else out
    b.node("MatMulNBits", inputs, [product], domain=MS_DOMAIN, K=a["K"], N=sum(sizes), bits=a["bits"],
           block_size=a["block_size"], **accuracy)
    if float_zero:
        subtract_zero_fractions(b, inputs[0], first.inputs[0].rank, product, zero_points, scales, a, stem, out)
    return out


def integer_zero_points(*zero_points, bits: int) -> np.ndarray:
    """Float zero points [N_i, nb] (stacked along N) -> the nearest codes (clipped to
    [0, 2^bits)), packed u8 [sum N_i, ceil(nb * bits / 8)]."""
    zero = np.concatenate([np.asarray(z, np.float32) for z in zero_points], axis=0)
    return pack_codes(np.clip(np.round(zero), 0, 2 ** bits - 1).astype(np.uint8), bits)


def zero_offsets(*zeros_then_scales, bits: int) -> np.ndarray:
    """Float zero points [N_i, nb] then their scales -> (zero point - its nearest code) *
    scale per block, [nb, sum N_i]: what the block sums of x are multiplied by to finish
    ``integer_zero_points``' product."""
    half = len(zeros_then_scales) // 2
    zero = np.concatenate([np.asarray(z, np.float32) for z in zeros_then_scales[:half]], axis=0)
    scales = np.concatenate([np.asarray(s, np.float32) for s in zeros_then_scales[half:]], axis=0)
    fraction = zero - np.clip(np.round(zero), 0, 2 ** bits - 1)
    return np.ascontiguousarray((fraction * scales).T)


def zero_codes(b: Builder, zero_points: list, scales: list, bits: int, name: str) -> str:
    """The u8 zero points MatMulNBits reads for float ones (``integer_zero_points``), stacked."""
    rows = sum(z.shape[0] for z in zero_points)
    return b.derived(name, DType.u8, (rows, packed_width(scales[0].shape[-1], bits)), tuple(zero_points),
                     partial(integer_zero_points, bits=bits))


def subtract_zero_fractions(b: Builder, x: str, rank, product: str, zero_points: list, scales: list, attrs: dict,
                            stem: str, out: str) -> None:
    """out = product - blocksums(x) @ offsets (module docstring): x [..., K] of known ``rank``
    (None: unknown, reshaped back to the product's shape), ``product`` the MatMulNBits over
    the codes with ``zero_codes``, one float zero point per block for each weight."""
    nb, block = scales[0].shape[-1], attrs["block_size"]
    n = sum(z.shape[0] for z in zero_points)
    lead = [0] * (rank - 1) if rank else [-1]
    blocks = b.op("Reshape", [x, b.i64(lead + [nb, block])], f"{stem}/blocks")
    sums = b.op("ReduceSum", [blocks, b.i64([-1])], f"{stem}/block_sums", keepdims=0)
    offsets = b.derived(f"{stem}.zero_points.offsets", scales[0].dtype, (nb, n), (*zero_points, *scales),
                        partial(zero_offsets, bits=attrs["bits"]))
    correction = b.op("MatMul", [sums, offsets], f"{stem}/zero_correction")
    if not rank:
        shape = b.op("Shape", [product], f"{stem}/shape")
        correction = b.op("Reshape", [correction, shape], f"{stem}/zero_correction_shaped")
    b.node("Sub", [product, correction], [out])


def lower_packed(b: Builder, group: list[Node], accuracy: dict) -> None:
    """One MatMulNBits over the stacked codes, then Split into each node's output."""
    packed = packed_matmul(b, group, accuracy)
    outs = [b.name_for(n.outputs[0]) for n in group]
    b.node("Split", [packed, b.i64([n.attrs["N"] for n in group])], outs, axis=-1)
    for n in group[1:]:
        b.handled.add(id(n))


__all__ = ["packable", "siblings", "packed_matmul", "lower_packed", "stack_rows", "zero_codes",
           "subtract_zero_fractions"]
