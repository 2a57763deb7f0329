"""Quantized weights and caches: ``dequant_linear``, ``dequantize``, ``quantize_kv``,
``dequantize_kv``, and the round-to-nearest (RTN) math the ``quantize`` pass uses.

Weights (the layout of ONNX Runtime's ``MatMulNBits``, so the mapping is 1:1). A float
weight W [..., N, K] (N outputs, K inputs: checkpoint layout) is split along K into
``nb = ceil(K / block_size)`` blocks; the last block is padded with zeros when
``block_size`` does not divide K. Each block b of row n has a scale and a zero point:

    W[n, k] = (q[n, k] - zero_point[n, b]) * scale[n, b],   b = k // block_size

- ``qweight`` u8 [..., N, nb, block_size * bits / 8]: the unsigned codes q in [0, 2^bits);
  4-bit codes two per byte, element 2i in the low nibble and 2i+1 in the high nibble;
- ``scales`` [..., N, nb], a float type (the source weight's): the result type;
- ``zero_points`` u8 [..., N, ceil(nb * bits / 8)], 4-bit ones packed the same way, or
  float in the scales' dtype [..., N, nb], one per block, unpacked (MatMulNBits takes
  those too: llama.cpp's Q4_1 and K-quant minimums, ``frontends.gguf``), or omitted:
  symmetric, zero point 2^(bits-1) (MatMulNBits' default: 8 or 128).

Per output channel is one block spanning the row (block_size = K, rounded up to even for
4 bits). Padding codes equal the zero point, so they dequantize to exactly 0.

RTN with max-abs scaling (``quantize_blocks``): symmetric scale = max|w| / (2^(bits-1) - 1),
codes q - 2^(bits-1) in [-(2^(bits-1) - 1), 2^(bits-1) - 1]; asymmetric over the block's
range widened to hold 0 (as ORT's quantizer does), scale = (max - min) / (2^bits - 1),
zero point round(-min / scale). A scale stored in f16/bf16 is rounded up, never down, so no
code clips: every element dequantizes within scale / 2 of its float value.

KV cache: ``quantize_kv`` maps a float cache [..., S, D] to int8 codes and one float32 scale
per row ([..., S]: per head, per token), symmetric, scale = max|x| / 127;
``dequantize_kv`` maps back. Re-quantizing dequantized rows gives the same codes, so the
past part of a present cache keeps its codes from step to step.

References dequantize exactly in float32 (then compute in float32, as ``linear`` does).

ONNX (checked against ONNX Runtime 1.32 with ``session.qdq_matmulnbits_accuracy_level`` 0):
``dequant_linear`` with a power-of-two block_size >= 16 is ``com.microsoft`` MatMulNBits
(A=x, B=qweight, scales, zero_points, g_idx omitted, bias as input 5; same K, N, bits,
block_size). Any block size (per channel with K not a power of two, or standard opsets):
DequantizeLinear(codes as uint4/uint8 [N, K], scales [N, nb], zero points as uint4/uint8
[N, nb] or the constant 2^(bits-1), axis=1, block_size) -> Transpose -> MatMul (+ bias);
ONNX packs 4-bit tensors two per byte low nibble first too, so the codes are qweight's
bytes once the padding of a last partial block is dropped. ``dequantize`` is the same
DequantizeLinear (axis = -1; an embedding's table can also become GatherBlockQuantized).
"""
from __future__ import annotations

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.ops.nn import f32, linear, tokens
from irc.ops.primitives import NUMPY_DTYPES
from irc.ops.registry import REQUIRED, Cost, OpDef, TensorType, expect, register, same_dims

BITS = (4, 8)
KV_QMAX = 127
# MatMulNBits' compute precision for the activations: null (the backend's choice), 0 (exact:
# the activation's type), 1 f32, 2 f16, 3 bf16, 4 int8 (per block, symmetric)
ACCURACY_LEVELS = (None, 0, 1, 2, 3, 4)


# ---- the math (module level, emit-friendly) -------------------------------------------------

def block_count(k: int, block_size: int) -> int:
    return -(-k // block_size)


def packed_width(count: int, bits: int) -> int:
    """Bytes holding ``count`` codes of ``bits`` bits."""
    return -(-count * bits // 8)


def pack_codes(codes, bits: int) -> np.ndarray:
    """Codes [..., n] (0 <= code < 2^bits) -> u8 [..., ceil(n * bits / 8)]; for 4 bits two per
    byte, element 2i in the low nibble (a trailing odd element gets a zero high nibble)."""
    codes = np.asarray(codes).astype(np.uint8)
    if bits == 8:
        return codes
    if codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.zeros(codes.shape[:-1] + (1,), np.uint8)], axis=-1)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_codes(packed, bits: int) -> np.ndarray:
    """u8 [..., m] -> codes [..., m * 8 / bits] (u8), the inverse of ``pack_codes``."""
    packed = np.asarray(packed).astype(np.uint8)
    if bits == 8:
        return packed
    low, high = packed & 0x0F, packed >> 4
    return np.stack([low, high], axis=-1).reshape(packed.shape[:-1] + (2 * packed.shape[-1],))


def round_up_scale(scale, dtype_name: str) -> np.ndarray:
    """Positive float32 scales in ``dtype_name`` ("float32", "float16", "bfloat16"), rounded
    up where the conversion rounded down (so codes computed with them never clip)."""
    scale = np.asarray(scale, dtype=np.float32)
    stored = scale.astype(dtype_name)
    if stored.dtype == np.float32:
        return stored
    low = stored.astype(np.float32) < scale
    bumped = (stored.view(np.uint16) + np.uint16(1)).view(stored.dtype)
    return np.where(low, bumped, stored).astype(dtype_name)


def quantize_blocks(weight, *, bits: int, block_size: int, symmetric: bool,
                    scale_dtype: str = "float32") -> tuple:
    """RTN of ``weight`` [..., N, K] along K: (qweight u8, scales, zero_points u8 or None) in
    the layout of the module docstring."""
    w = f32(weight)
    k = w.shape[-1]
    nb = block_count(k, block_size)
    padded = np.zeros(w.shape[:-1] + (nb * block_size,), np.float32)
    padded[..., :k] = w
    blocks = padded.reshape(w.shape[:-1] + (nb, block_size))
    top = 2 ** bits - 1
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        scales = round_up_scale(np.abs(blocks).max(axis=-1) / np.float32(qmax), scale_dtype)
        step = scales.astype(np.float32)[..., None]
        signed = np.divide(blocks, step, out=np.zeros_like(blocks), where=step > 0)
        codes = np.clip(np.round(signed), -qmax, qmax) + 2 ** (bits - 1)
        zero_points = None
    else:
        low = np.minimum(blocks.min(axis=-1), 0)
        high = np.maximum(blocks.max(axis=-1), 0)
        scales = round_up_scale((high - low) / np.float32(top), scale_dtype)
        step = scales.astype(np.float32)
        zero = np.clip(np.round(np.divide(-low, step, out=np.zeros_like(low), where=step > 0)), 0, top)
        step = step[..., None]
        codes = np.clip(np.round(np.divide(blocks, step, out=np.zeros_like(blocks), where=step > 0))
                        + zero[..., None], 0, top)
        zero_points = pack_codes(zero, bits)
    qweight = pack_codes(codes.reshape(codes.shape[:-1] + (block_size,)), bits)
    return qweight, scales, zero_points


def dequantize_blocks(qweight, scales, zero_points=None, *, bits: int, block_size: int, k: int) -> np.ndarray:
    """The float32 weight [..., N, K] that (qweight, scales, zero_points) stand for."""
    codes = unpack_codes(qweight, bits).astype(np.float32)
    scales = f32(scales)
    nb = scales.shape[-1]
    if zero_points is None:
        zero = np.float32(2 ** (bits - 1))
    elif np.asarray(zero_points).dtype == np.uint8:
        zero = unpack_codes(zero_points, bits)[..., :nb].astype(np.float32)[..., None]
    else:  # float zero points, one per block
        zero = f32(zero_points)[..., None]
    weight = (codes - zero) * scales[..., None]
    return weight.reshape(weight.shape[:-2] + (nb * block_size,))[..., :k]


def quantize_kv(x) -> tuple:
    """Float [..., S, D] -> (int8 codes [..., S, D], float32 scales [..., S]): symmetric per row."""
    x = f32(x)
    scale = (np.abs(x).max(axis=-1) / np.float32(KV_QMAX)).astype(np.float32)
    step = scale[..., None]
    codes = np.clip(np.round(np.divide(x, step, out=np.zeros_like(x), where=step > 0)), -KV_QMAX, KV_QMAX)
    return codes.astype(np.int8), scale


def dequantize_kv(codes, scale) -> np.ndarray:
    """int8 codes [..., S, D] and scales [..., S] -> float32 [..., S, D]."""
    return np.asarray(codes).astype(np.float32) * f32(scale)[..., None]


# ---- weight ops ------------------------------------------------------------------------------

def _check_blocks(op, qweight, scales, zero_points, attrs, k) -> tuple:
    """Check the quantized operands against the attributes; returns (leading dims, N)."""
    bits, block_size = attrs["bits"], attrs["block_size"]
    expect(bits in BITS, f"{op}: bits must be one of {', '.join(map(str, BITS))}, got {bits!r}")
    expect(isinstance(block_size, int) and block_size > 0 and block_size * bits % 8 == 0,
           f"{op}: block_size must be a positive int filling whole bytes, got {block_size!r}")
    expect(isinstance(k, int) and k > 0, f"{op}: K must be a positive int, got {k!r}")
    expect(qweight.dtype == DType.u8 and len(qweight.shape) >= 3,
           f"{op}: qweight must be u8 [..., N, K/block, block*bits/8], got "
           f"{qweight.dtype}{dims.format_shape(qweight.shape)}")
    nb = block_count(k, block_size)
    lead, n = qweight.shape[:-3], qweight.shape[-3]
    want = lead + (n, nb, block_size * bits // 8)
    expect(all(same_dims(a, b) for a, b in zip(qweight.shape, want)),
           f"{op}: qweight {dims.format_shape(qweight.shape)} should be {dims.format_shape(want)}")
    expect(scales.dtype.is_float, f"{op}: scales must be float, got {scales.dtype}")
    expect(scales.shape == lead + (n, nb),
           f"{op}: scales {dims.format_shape(scales.shape)} should be {dims.format_shape(lead + (n, nb))}")
    if zero_points is not None and zero_points.dtype.is_float:
        expect(zero_points.dtype == scales.dtype and zero_points.shape == lead + (n, nb),
               f"{op}: float zero_points should be {scales.dtype}{dims.format_shape(lead + (n, nb))} (one per "
               f"block, the scales' type), got {zero_points.dtype}{dims.format_shape(zero_points.shape)}")
    elif zero_points is not None:
        zp = lead + (n, packed_width(nb, bits))
        expect(zero_points.dtype == DType.u8 and zero_points.shape == zp,
               f"{op}: zero_points should be u8{dims.format_shape(zp)}, got "
               f"{zero_points.dtype}{dims.format_shape(zero_points.shape)}")
    return lead, n


def _dequant_linear_infer(inputs, attrs):
    x, qweight, scales, zero_points, bias = (list(inputs) + [None] * 5)[:5]
    k = attrs["K"]
    lead, n = _check_blocks("dequant_linear", qweight, scales, zero_points, attrs, k)
    expect(not lead, "dequant_linear: qweight must be [N, K/block, block*bits/8]")
    expect(attrs["N"] == n, f"dequant_linear: N={attrs['N']!r} but qweight has {n} rows")
    expect(x.dtype.is_float, f"dequant_linear: activation must be float, got {x.dtype}")
    expect(same_dims(x.shape[-1], k), f"dequant_linear: activation has {x.shape[-1]} features, K={k}")
    if bias is not None:
        expect(bias.shape == (n,), f"dequant_linear: bias must be [{n}]")
    _check_accuracy_level("dequant_linear", attrs)
    return [TensorType(x.dtype, x.shape[:-1] + (n,))]


def _check_accuracy_level(op, attrs) -> None:
    """``accuracy_level``: a backend hint for the matmuls that read these codes (MatMulNBits'
    activation precision); the reference always computes exactly."""
    expect(attrs["accuracy_level"] in ACCURACY_LEVELS,
           f"{op}: accuracy_level must be null or one of {', '.join(map(str, ACCURACY_LEVELS[1:]))}, "
           f"got {attrs['accuracy_level']!r}")


def _dequant_linear_reference(inputs, attrs):
    """x @ W.T (+ bias) with W [N, K] dequantized exactly from blocked codes (MatMulNBits)."""
    x, qweight, scales, zero_points, bias = (list(inputs) + [None] * 5)[:5]
    weight = dequantize_blocks(qweight, scales, zero_points, bits=attrs["bits"], block_size=attrs["block_size"],
                               k=attrs["K"])
    return [linear(x, weight, bias).astype(x.dtype)]


def _dequant_linear_cost(inputs, outputs, attrs):
    """2 FLOPs per weight per token (as ``linear``); dequantizing, 2 per weight, apart."""
    weights = attrs["N"] * attrs["K"]
    return Cost(flops=2 * tokens(inputs[0]) * weights, other_flops=2 * weights,
                bytes_read=sum(t.nbytes for t in inputs if t is not None),
                bytes_written=sum(t.nbytes for t in outputs))


def quantized_elements(attrs, operand, shape):
    """Logical weights behind a quantized operand: packed codes [..., N, K/bs, bytes] stand
    for N*K weights (per leading expert), scales and zero points for none."""
    if operand == "qweight":
        count = attrs["K"]
        for d in shape[:-2]:
            count *= d
        return count
    return 0 if operand in ("scales", "zero_points") else None


register(OpDef("dequant_linear", ("x", "qweight", "scales", "zero_points?", "bias?"),
               {"K": REQUIRED, "N": REQUIRED, "bits": REQUIRED, "block_size": REQUIRED, "accuracy_level": None},
               _dequant_linear_infer, _dequant_linear_reference, _dequant_linear_cost, level="model",
               logical_elements=quantized_elements))


def _dequantize_infer(inputs, attrs):
    qweight, scales, zero_points = (list(inputs) + [None] * 3)[:3]
    lead, n = _check_blocks("dequantize", qweight, scales, zero_points, attrs, attrs["K"])
    _check_accuracy_level("dequantize", attrs)
    return [TensorType(scales.dtype, lead + (n, attrs["K"]))]


def _dequantize_reference(inputs, attrs):
    """The float weight [..., N, K] of blocked codes, in the scales' dtype (DequantizeLinear
    with block_size along the last axis)."""
    qweight, scales, zero_points = (list(inputs) + [None] * 3)[:3]
    weight = dequantize_blocks(qweight, scales, zero_points, bits=attrs["bits"], block_size=attrs["block_size"],
                               k=attrs["K"])
    return [weight.astype(scales.dtype)]


def _dequantize_cost(inputs, outputs, attrs):
    return Cost(other_flops=2 * outputs[0].numel, bytes_read=sum(t.nbytes for t in inputs if t is not None),
                bytes_written=outputs[0].nbytes)


register(OpDef("dequantize", ("qweight", "scales", "zero_points?"),
               {"K": REQUIRED, "bits": REQUIRED, "block_size": REQUIRED, "accuracy_level": None},
               _dequantize_infer, _dequantize_reference, _dequantize_cost, foldable=False, weight_view=True,
               logical_elements=quantized_elements))


def _dequant_embedding_infer(inputs, attrs):
    ids, qweight, scales, zero_points = (list(inputs) + [None] * 4)[:4]
    expect(ids.dtype in (DType.i64, DType.i32), f"dequant_embedding: ids must be integer, got {ids.dtype}")
    lead, _ = _check_blocks("dequant_embedding", qweight, scales, zero_points, attrs, attrs["K"])
    expect(not lead, "dequant_embedding: qweight must be [vocab, K/block, block*bits/8]")
    return [TensorType(scales.dtype, ids.shape + (attrs["K"],))]


def _dequant_embedding_reference(inputs, attrs):
    """The table rows of ``ids``, dequantized from their codes alone (GatherBlockQuantized),
    times ``scale`` when set; the same values as ``embedding`` of the ``dequantize``d table."""
    ids, qweight, scales, zero_points = (list(inputs) + [None] * 4)[:4]
    ids = np.asarray(ids)
    rows = dequantize_blocks(np.asarray(qweight)[ids], np.asarray(scales)[ids],
                             None if zero_points is None else np.asarray(zero_points)[ids],
                             bits=attrs["bits"], block_size=attrs["block_size"], k=attrs["K"])
    if attrs["scale"] is not None:
        rows = rows * np.float32(attrs["scale"])
    return [rows.astype(scales.dtype)]


def _dequant_embedding_cost(inputs, outputs, attrs):
    """A lookup: reads the ids and, per id, one row of codes, scales and zero points;
    dequantizing costs 2 FLOPs per element written (apart, as for ``dequantize``)."""
    ids, parts = inputs[0], [t for t in inputs[1:] if t is not None]
    rows = sum(t.nbytes // t.shape[0] for t in parts)
    return Cost(other_flops=2 * outputs[0].numel, bytes_read=ids.nbytes + ids.numel * rows,
                bytes_written=outputs[0].nbytes)


register(OpDef("dequant_embedding", ("ids", "qweight", "scales", "zero_points?"),
               {"K": REQUIRED, "bits": REQUIRED, "block_size": REQUIRED, "scale": None},
               _dequant_embedding_infer, _dequant_embedding_reference, _dequant_embedding_cost, level="model",
               logical_elements=quantized_elements))


# ---- KV cache ops ----------------------------------------------------------------------------

def _quantize_kv_infer(inputs, attrs):
    (x,) = inputs
    expect(x.dtype.is_float and len(x.shape) >= 2,
           f"quantize_kv: x must be float of rank >= 2, got {x.dtype}{dims.format_shape(x.shape)}")
    return [TensorType(DType.i8, x.shape), TensorType(DType.f32, x.shape[:-1])]


def _quantize_kv_reference(inputs, attrs):
    """int8 codes and float32 per-row scales (max|x| / 127) of a cache [..., S, D]."""
    codes, scale = quantize_kv(inputs[0])
    return [codes, scale]


def _dequantize_kv_infer(inputs, attrs):
    codes, scale = inputs
    expect(codes.dtype == DType.i8, f"dequantize_kv: codes must be i8, got {codes.dtype}")
    expect(scale.dtype.is_float and len(scale.shape) == len(codes.shape) - 1
           and all(same_dims(a, b) for a, b in zip(scale.shape, codes.shape[:-1])),
           f"dequantize_kv: scale {dims.format_shape(scale.shape)} should be "
           f"{dims.format_shape(codes.shape[:-1])}")
    dtype = DType.parse(attrs["dtype"])
    expect(dtype.is_float, f"dequantize_kv: dtype must be a float type, got {dtype}")
    return [TensorType(dtype, codes.shape)]


def _dequantize_kv_reference(inputs, attrs):
    """codes * scale per row, in ``dtype``."""
    codes, scale = inputs
    return [dequantize_kv(codes, scale).astype(NUMPY_DTYPES[attrs["dtype"]])]


def _kv_cost(inputs, outputs, attrs):
    return Cost(other_flops=2 * max(t.numel for t in [*inputs, *outputs]),
                bytes_read=sum(t.nbytes for t in inputs), bytes_written=sum(t.nbytes for t in outputs))


register(OpDef("quantize_kv", ("x",), {}, _quantize_kv_infer, _quantize_kv_reference, _kv_cost))
register(OpDef("dequantize_kv", ("codes", "scale"), {"dtype": "f32"}, _dequantize_kv_infer,
               _dequantize_kv_reference, _kv_cost))

__all__ = ["quantize_blocks", "dequantize_blocks", "pack_codes", "unpack_codes", "quantize_kv", "dequantize_kv",
           "round_up_scale", "block_count", "packed_width"]
