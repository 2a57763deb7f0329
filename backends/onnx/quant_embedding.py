"""``dequant_embedding`` (``irc.ops.quant``) in ONNX: only the looked-up rows are dequantized.

- ``onnx-ort``: one ``com.microsoft.GatherBlockQuantized`` (bits, block_size,
  gather_axis=0, quantize_axis=1) over the codes as stored, seen through a ``Reshape`` to
  [vocab, K*bits/8], with the stored scales and packed zero points. A tied head's
  MatMulNBits reads the very same initializers (qweight, scales, zero points), so the
  model holds one copy of the table, as the checkpoint does. Where GatherBlockQuantized
  does not apply (a block that is not a power of two >= 16, float zero points, scales
  other than f32/f16), the portable form.
- portable: Gather the packed rows ([..., nb, bs*bits/8] u8) and their scales (and zero
  points), unpack 4-bit codes (BitwiseAnd 0x0F, BitShift right by 4: low nibble first),
  then one blocked DequantizeLinear (opset 21) over the gathered rows only, with the
  zero point 2^(bits-1) for symmetric codes; float zero points (one per block) take
  (Cast(codes) - zero point) * scale per block instead. A padded last block is sliced
  off. On this target a tied head reads its own transposed int4 copy of the codes
  (``backends.onnx.quant.dequantized``): ONNX cannot gather rows of a 4-bit tensor.

Either way the result is the reference's, bit for bit: (code - zero point) * scale in
the scales' type, times the embedding's ``scale`` when set.
"""
from __future__ import annotations

import numpy as np

from irc.dtypes import DType
from irc.graph import Node
from irc.ops.quant import block_count

from backends.onnx.builder import MS_DOMAIN, ONNX_TYPES, Builder


def _operands(node: Node) -> tuple:
    ids, qweight, scales, zero_points = (list(node.inputs) + [None] * 4)[:4]
    return ids, qweight, scales, zero_points


def _flatten_tail(b: Builder, x: str, lead: int, hint: str, tail=(-1,)) -> str:
    """Reshape keeping the first ``lead`` dims (0 copies a dim) and folding the rest to ``tail``."""
    return b.op("Reshape", [x, b.i64([0] * lead + list(tail))], hint)


def _unpacked(b: Builder, packed: str, bits: int, lead: int, hint: str, tail=(-1,)) -> str:
    """u8 bytes [lead..., ...] -> codes (u8) folded to ``tail``: two per byte, low nibble first."""
    if bits == 8:
        return _flatten_tail(b, packed, lead, hint, tail)
    low = b.op("BitwiseAnd", [packed, b.const(0x0F, np.uint8, "nibble_mask")], f"{hint}/low")
    high = b.op("BitShift", [packed, b.const(4, np.uint8, "nibble_shift")], f"{hint}/high", direction="RIGHT")
    axis = b.i64([-1])
    pairs = b.op("Concat", [b.op("Unsqueeze", [low, axis], f"{hint}/low1"),
                            b.op("Unsqueeze", [high, axis], f"{hint}/high1")], f"{hint}/pairs", axis=-1)
    return _flatten_tail(b, pairs, lead, hint, tail)


def _finish(b: Builder, node: Node, rows: str, outs: list[str]) -> None:
    """From rows [..., nb * block] (not yet ``outs[0]``): slice a padded last block off,
    apply the embedding's ``scale``."""
    k, block, scale = node.attrs["K"], node.attrs["block_size"], node.attrs["scale"]
    if block_count(k, block) * block != k:
        target = outs[0] if scale is None else b.fresh(f"{outs[0]}/rows")
        rows = b.node("Slice", [rows, b.i64([0]), b.i64([k]), b.i64([-1])], [target])[0]
    if scale is not None:
        b.node("Mul", [rows, b.const(scale, node.outputs[0].dtype.numpy, f"{outs[0]}/scale")], outs)


def _direct(node: Node) -> bool:
    """Do the dequantized rows need no slice and no scale (so they are the output)?"""
    return node.attrs["K"] % node.attrs["block_size"] == 0 and node.attrs["scale"] is None


def lower_dequant_embedding(b: Builder, node: Node, outs: list[str]) -> None:
    """Gather the rows, then dequantize them alone (module docstring)."""
    ids, qweight, scales, zero_points = _operands(node)
    bits, block, k = node.attrs["bits"], node.attrs["block_size"], node.attrs["K"]
    nb = block_count(k, block)
    name, lead, index = outs[0], ids.rank, b.value(ids)
    packed = b.op("Gather", [b.weight(qweight), index], f"{name}/packed", axis=0)
    scale_rows = b.op("Gather", [b.weight(scales), index], f"{name}/scales", axis=0)
    padded = name if _direct(node) else b.fresh(f"{name}/padded")
    if zero_points is not None and zero_points.dtype.is_float:
        codes = _unpacked(b, packed, bits, lead, f"{name}/codes", (nb, block))
        zero_rows = b.op("Gather", [b.weight(zero_points), index], f"{name}/zero_points", axis=0)
        axis = b.i64([-1])
        centred = b.op("Sub", [b.op("Cast", [codes], f"{name}/values", to=ONNX_TYPES[scales.dtype]),
                               b.op("Unsqueeze", [zero_rows, axis], f"{name}/zero1")], f"{name}/centred")
        blocks = b.op("Mul", [centred, b.op("Unsqueeze", [scale_rows, axis], f"{name}/scale1")], f"{name}/blocks")
        b.node("Reshape", [blocks, b.i64([0] * lead + [-1])], [padded])
    else:
        codes = _unpacked(b, packed, bits, lead, f"{name}/codes")
        if zero_points is None:
            zero_rows = b.op("Expand", [b.const(2 ** (bits - 1), np.uint8, f"zero_point{bits}"),
                                        b.op("Shape", [scale_rows], f"{name}/scale_shape")], f"{name}/zero_points")
        else:
            packed_zero = b.op("Gather", [b.weight(zero_points), index], f"{name}/zero_packed", axis=0)
            zero_rows = b.op("Slice", [_unpacked(b, packed_zero, bits, lead, f"{name}/zero_all"), b.i64([0]),
                                       b.i64([nb]), b.i64([-1])], f"{name}/zero_points")
        b.node("DequantizeLinear", [codes, scale_rows, zero_rows], [padded], axis=-1, block_size=block)
    if not _direct(node):
        _finish(b, node, padded, outs)


def gather_block_quantized_refusal(node: Node):
    """Why GatherBlockQuantized cannot compute this dequant_embedding (None when it can)."""
    _, _, scales, zero_points = _operands(node)
    block = node.attrs["block_size"]
    if block < 16 or block & (block - 1):
        return f"block_size {block} (GatherBlockQuantized takes a power of two >= 16)"
    if scales.dtype not in (DType.f32, DType.f16):
        return f"{scales.dtype} scales"
    if zero_points is not None and zero_points.dtype.is_float:
        return "float zero points"
    return None


def lower_dequant_embedding_ort(b: Builder, node: Node, outs: list[str]) -> None:
    """GatherBlockQuantized over the stored codes (module docstring), else the portable form."""
    if gather_block_quantized_refusal(node) is not None:
        lower_dequant_embedding(b, node, outs)
        return
    ids, qweight, scales, zero_points = _operands(node)
    bits, block = node.attrs["bits"], node.attrs["block_size"]
    vocab, nb, width = qweight.shape
    name = outs[0]
    table = b.cached(("gather-view", qweight.name), lambda: b.op(
        "Reshape", [b.weight(qweight), b.i64([vocab, nb * width])], f"{qweight.name}.rows"))
    inputs = [table, b.value(ids), b.weight(scales)] + ([] if zero_points is None else [b.weight(zero_points)])
    rows = name if _direct(node) else b.fresh(f"{name}/padded")
    b.node("GatherBlockQuantized", inputs, [rows], domain=MS_DOMAIN, bits=bits, block_size=block, gather_axis=0,
           quantize_axis=1)
    if not _direct(node):
        _finish(b, node, rows, outs)


LOWERINGS = {"dequant_embedding": lower_dequant_embedding}
ORT_OVERRIDES = {"dequant_embedding": lower_dequant_embedding_ort}

__all__ = ["LOWERINGS", "ORT_OVERRIDES", "gather_block_quantized_refusal"]
