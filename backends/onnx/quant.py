"""Quantized weights and caches in ONNX: ``dequant_linear``, ``dequantize``, ``quantize_kv``,
``dequantize_kv`` (``irc.ops.quant``).

Weights (codes and scales in MatMulNBits' layout, ``irc.ops.quant``):

- ``onnx-ort``: ``dequant_linear`` with a power-of-two ``block_size`` >= 16 is one
  ``com.microsoft.MatMulNBits`` (qweight, scales and packed zero points as stored, bias
  as input 5), 1:1, except that those reading one activation share one over their stacked
  codes: q, k and v as GroupQueryAttention's packed query (``backends.onnx.gqa_fuse``'s
  ``pack-qkv``), others (gate and up) split after it (``backends.onnx.quant_pack``). Its ``accuracy_level`` is the node's, else
  ``ORT_ACCURACY_LEVEL`` (4: int8 activations; on SmolLM2-135M it decoded faster than the
  exact level 0 and moved perplexity by under 0.6%, ``benchmarks/int4_real.py``). Other
  block sizes take the portable form.
- ``dequant_embedding``: ``backends.onnx.quant_embedding`` (GatherBlockQuantized on
  ``onnx-ort``, the gathered rows dequantized alone on the portable target).
- portable (and the fallback): a blocked ``DequantizeLinear`` (opset 21) over codes
  stored transposed, [K, N] with ``axis=0``, then ``MatMul`` (+ ``Add`` for the bias). No
  run-time Transpose, and it is the QDQ pattern ORT itself fuses into MatMulNBits, with
  int8 activations unless the session sets ``session.qdq_matmulnbits_accuracy_level`` to
  "0" (``backends.onnx.runtime.ort_engine`` does). Symmetric codes are stored signed
  (int4/int8, code - 2^(bits-1)) with no zero point; asymmetric ones unsigned
  (uint4/uint8) with uint4/uint8 zero points [nb, N]. The padding of a last partial block
  is dropped (DequantizeLinear takes ceil(K / block_size) scales along the axis).
- Float zero points (one per block in the scales' type, ``frontends.gguf``'s Q4_1 and
  K-quants): on onnx-ort, 4-bit codes take MatMulNBits with the nearest u8 codes plus an exact
  correction for the fractions, shared by packed weights (``backends.onnx.quant_pack``); 8-bit
  codes (a GGUF's Q5_1 / Q5_K) the same way (ORT 1.32's CPU kernel refuses float zero points
  with 8-bit codes, not u8 ones). DequantizeLinear cannot, so
  the portable form computes what the reference does, (Cast(codes) - zero point) * scale
  per block, with codes, scales and zero points stored blocked ([nb, bs, N] and [nb, 1, N],
  or [..., N, nb, bs] and [..., N, nb, 1]), then Reshape (and Slice off a padded last
  block): the same float32 operations, so the same weights bit for bit. All its inputs
  are initializers, so ONNX Runtime folds it into a float weight when the session loads.
- ``dequantize`` is the same DequantizeLinear over [..., N, K] (``axis=-1``), giving the
  float weight its readers expect. A rank-2 one read only as x @ W.T (``linear``'s
  operand, and the MLPs' and MLA's, through ``portable.linear``) is not emitted there: each such reader gets the
  transposed form above (on
  ``onnx-ort``, one MatMulNBits over the codes where it fits: ``matmul_nbits``).

KV cache: ``quantize_kv`` is Abs, ReduceMax, Div by 127, Div, Round (half to even, as
NumPy), Clip to [-127, 127] and Cast to int8, with a zero scale giving zero codes;
``dequantize_kv`` is Cast * Unsqueeze(scale). Standard ops on both targets.
"""
from __future__ import annotations

from functools import partial

import numpy as np
from onnx import TensorProto

from irc.dtypes import DType
from irc.errors import BackendError
from irc.graph import Node, Value
from irc.ops.quant import KV_QMAX, block_count, unpack_codes

from backends.onnx import gqa_fuse, quant_embedding, quant_pack
from backends.onnx.builder import MS_DOMAIN, ONNX_TYPES, Builder
from backends.onnx.fits import dequant_parts, matmul_nbits_fits, nbits_refusal, only_matrix_uses

PARTS = ("qweight", "scales", "zero_points")
# MatMulNBits' activation precision where a node does not set one (quantize{accuracy_level}):
# 4 (int8 activations), chosen from benchmarks/int4_real.py on SmolLM2-135M (see there)
ORT_ACCURACY_LEVEL = 4


# ---- initializers, computed from the stored codes when the model is written ----------------

def dq_codes(qweight, *, bits: int, k: int, signed: bool, transpose: bool) -> np.ndarray:
    """qweight u8 [..., N, nb, bs*bits/8] -> codes [..., N, K] (or [K, N]) for DequantizeLinear:
    signed (code - 2^(bits-1)) for symmetric weights, the padding of a last block dropped."""
    codes = unpack_codes(qweight, bits)
    codes = codes.reshape(codes.shape[:-2] + (-1,))[..., :k].astype(np.int16)
    if signed:
        codes = codes - 2 ** (bits - 1)
    return codes.T if transpose else codes


def dq_zero_points(zero_points, *, bits: int, nb: int, transpose: bool) -> np.ndarray:
    """Packed zero points u8 [..., N, ceil(nb*bits/8)] -> one per block [..., N, nb] (or [nb, N])."""
    zero = unpack_codes(zero_points, bits)[..., :nb]
    return zero.T if transpose else zero


def dq_scales(scales, *, transpose: bool) -> np.ndarray:
    return np.asarray(scales).T if transpose else np.asarray(scales)


def blocked_codes(qweight, *, bits: int, transpose: bool) -> np.ndarray:
    """qweight u8 [..., N, nb, bs*bits/8] -> unsigned codes [..., N, nb, bs] (or [nb, bs, N])."""
    codes = unpack_codes(qweight, bits)
    return np.moveaxis(codes, -3, -1) if transpose else codes


def blocked_per_block(values, *, transpose: bool) -> np.ndarray:
    """Scales or float zero points [..., N, nb] -> [..., N, nb, 1] (or [nb, 1, N])."""
    values = np.asarray(values)
    return values.T[:, None, :] if transpose else values[..., None]


def float_zero_dequantized(b: Builder, qweight, scales, zero_points, attrs: dict, *, transpose: bool,
                           hint: str) -> str:
    """(Cast(codes) - zero point) * scale per block, then Reshape (and Slice) to [..., N, K]
    (or [K, N]): the reference's float32 arithmetic, for float zero points."""
    bits, block, k = attrs["bits"], attrs["block_size"], attrs["K"]
    *lead, n = qweight.shape[:-2]
    nb = block_count(k, block)
    role = "T" if transpose else "dq"
    codes_shape, per_block = ((nb, block, n), (nb, 1, n)) if transpose else ((*lead, n, nb, block), (*lead, n, nb, 1))
    codes = b.derived(f"{qweight.name}.{role}", _code_type(bits, False), codes_shape, (qweight,),
                      partial(blocked_codes, bits=bits, transpose=transpose))
    scale, zero = (b.derived(f"{p.name}.{role}", p.dtype, per_block, (p,), partial(blocked_per_block, transpose=transpose))
                   for p in (scales, zero_points))
    values = b.op("Cast", [codes], f"{hint}.{role}/codes", to=ONNX_TYPES[scales.dtype])
    weight = b.op("Mul", [b.op("Sub", [values, zero], f"{hint}.{role}/centred"), scale], f"{hint}.{role}/blocks")
    padded = (nb * block, n) if transpose else (*lead, n, nb * block)
    weight = b.op("Reshape", [weight, b.i64(list(padded))], f"{hint}.{role}/padded" if k % block else f"{hint}.{role}")
    if k % block:
        axis = 0 if transpose else len(padded) - 1
        weight = b.op("Slice", [weight, b.i64([0]), b.i64([k]), b.i64([axis])], f"{hint}.{role}")
    return weight


def _code_type(bits: int, signed: bool) -> DType:
    return {(4, True): DType.i4, (4, False): DType.u4, (8, True): DType.i8, (8, False): DType.u8}[(bits, signed)]


def dequantized(b: Builder, qweight, scales, zero_points, attrs: dict, *, transpose: bool, hint: str) -> str:
    """A blocked DequantizeLinear giving the float weight [..., N, K] (or [K, N] when
    ``transpose``) of stored codes, once per weight and layout."""
    bits, block, k = attrs["bits"], attrs["block_size"], attrs["K"]
    signed = zero_points is None
    *lead, n = qweight.shape[:-2]
    nb = block_count(k, block)
    shape = (k, n) if transpose else (*lead, n, k)
    role = "T" if transpose else "dq"

    def make():
        if zero_points is not None and zero_points.dtype.is_float:
            return float_zero_dequantized(b, qweight, scales, zero_points, attrs, transpose=transpose, hint=hint)
        chunking = "columns" if transpose else "rows"  # row-wise functions: the writer streams them
        codes = b.derived(f"{qweight.name}.{role}", _code_type(bits, signed), shape, (qweight,),
                          partial(dq_codes, bits=bits, k=k, signed=signed, transpose=transpose), chunking)
        scale = (b.derived(f"{scales.name}.T", scales.dtype, (nb, n), (scales,), partial(dq_scales, transpose=True),
                           chunking) if transpose else b.weight(scales))
        inputs = [codes, scale]
        if not signed:
            zp_shape = (nb, n) if transpose else (*lead, n, nb)
            inputs.append(b.derived(f"{zero_points.name}.{role}", _code_type(bits, False), zp_shape, (zero_points,),
                                    partial(dq_zero_points, bits=bits, nb=nb, transpose=transpose), chunking))
        return b.op("DequantizeLinear", inputs, f"{hint}.{role}", axis=0 if transpose else -1, block_size=block)

    return b.cached(("dequantized", qweight.name, transpose), make)


# ---- weights --------------------------------------------------------------------------------

def lower_dequant_linear(b: Builder, node: Node, outs: list[str]) -> None:
    """DequantizeLinear([K, N]) -> MatMul (+ Add)."""
    x, _, _, _, bias = (list(node.inputs) + [None] * 5)[:5]
    qweight, scales, zero_points = dequant_parts(node, 1)
    if scales.dtype != x.dtype:
        raise BackendError(f"dequant_linear with {scales.dtype} scales and {x.dtype} activations",
                           hint="quantize weights stored in the activations' type")
    weight = dequantized(b, qweight, scales, zero_points, node.attrs, transpose=True, hint=qweight.name)
    product = outs[0] if bias is None else b.fresh(f"{outs[0]}/matmul")
    b.node("MatMul", [b.value(x), weight], [product])
    if bias is not None:
        b.node("Add", [product, b.weight(bias, dtype=x.dtype)], outs)


def matmul_nbits(b: Builder, x: str, dtype: DType, weight: Value, out: str) -> bool:
    """onnx-ort: x @ W.T as one MatMulNBits over the stored codes when W is a 2-D
    ``dequantize`` result MatMulNBits can take (a dense MLP's or MLA's weight that was not
    lowered to ``dequant_linear``); False, emitting nothing, otherwise."""
    producer = weight.producer
    if b.flavour != "ort" or producer is None or producer.op != "dequantize" or weight.rank != 2:
        return False
    qweight, scales, zero_points = dequant_parts(producer, 0)
    a = producer.attrs
    if nbits_refusal(a, dtype, scales.dtype, zero_points) is not None:
        return False
    emit_matmul_nbits(b, x, None, qweight, scales, zero_points, a, weight.shape[0], out)
    return True


def emit_matmul_nbits(b: Builder, x: str, rank, qweight, scales, zero_points, attrs: dict, n: int, out: str,
                      bias: str = "") -> None:
    """x @ W.T (+ bias) as MatMulNBits over the stored codes; float zero points as u8 codes
    plus the correction ``quant_pack.subtract_zero_fractions`` adds (ORT 1.32's CPU kernel
    for float zero points dequantizes the whole weight on every call)."""
    a = attrs
    float_zero = zero_points is not None and zero_points.dtype.is_float
    if float_zero:
        zero = quant_pack.zero_codes(b, [zero_points], [scales], a["bits"], f"{zero_points.name}.codes")
    else:
        zero = b.value(zero_points)
    product = b.fresh(f"{out}/codes") if float_zero else out
    b.node("MatMulNBits", [x, b.weight(qweight), b.weight(scales), zero, "", bias], [product], domain=MS_DOMAIN,
           K=a["K"], N=n, bits=a["bits"], block_size=a["block_size"], **accuracy_level(a))
    if float_zero:
        stem = qweight.name[:-len(".qweight")] if qweight.name.endswith(".qweight") else qweight.name
        quant_pack.subtract_zero_fractions(b, x, rank, product, [zero_points], [scales], a, stem, out)


def accuracy_level(attrs: dict) -> dict:
    """MatMulNBits' ``accuracy_level`` attribute for a node: the node's own, else
    ``ORT_ACCURACY_LEVEL``; none when that is 0 (ORT's default: exact)."""
    level = attrs.get("accuracy_level")
    level = ORT_ACCURACY_LEVEL if level is None else level
    return {"accuracy_level": level} if level else {}


def lower_dequant_linear_ort(b: Builder, node: Node, outs: list[str]) -> None:
    if gqa_fuse.absorbed(b, node):
        return  # q, k or v inside GroupQueryAttention's packed query (``pack-qkv``)
    if matmul_nbits_fits(node) is not None:
        lower_dequant_linear(b, node, outs)
        return
    group = quant_pack.siblings(b, node, matmul_nbits_fits)  # q, k, v (gate, up) reading one x
    if len(group) > 1:
        quant_pack.lower_packed(b, group, accuracy_level(node.attrs))
        return
    x, _, _, _, bias = (list(node.inputs) + [None] * 5)[:5]
    qweight, scales, zero_points = dequant_parts(node, 1)
    emit_matmul_nbits(b, b.value(x), x.rank, qweight, scales, zero_points, node.attrs, node.attrs["N"], outs[0],
                      b.value(bias))


def reads_only_as_matrix(value: Value) -> bool:
    """Does every reader take ``value`` as a weight applied as x @ W.T (``portable.linear``)?"""
    return value.rank == 2 and bool(value.uses) and only_matrix_uses(value)


def lower_dequantize(b: Builder, node: Node, outs: list[str]) -> None:
    out = node.outputs[0]
    if reads_only_as_matrix(out):
        return  # each reader takes the transposed form (``transposed_weight``)
    qweight, scales, zero_points = dequant_parts(node, 0)
    weight = dequantized(b, qweight, scales, zero_points, node.attrs, transpose=False, hint=qweight.name)
    b.node("Identity", [weight], outs)


def transposed_weight(b: Builder, weight: Value) -> str:
    """[in, out] for a float weight value [out, in] that is not a param: the transposed
    DequantizeLinear for a ``dequantize`` result, else a Transpose (once per value)."""
    producer = weight.producer
    if producer is not None and producer.op == "dequantize" and weight.rank == 2:
        qweight, scales, zero_points = dequant_parts(producer, 0)
        return dequantized(b, qweight, scales, zero_points, producer.attrs, transpose=True, hint=qweight.name)
    return b.cached(("transposed", weight.name),
                    lambda: b.op("Transpose", [b.value(weight)], f"{weight.name}.T", perm=[1, 0]))


# ---- KV cache -------------------------------------------------------------------------------

def lower_quantize_kv(b: Builder, node: Node, outs: list[str]) -> None:
    (x,) = node.inputs
    name = outs[0]
    x32 = b.value(x) if x.dtype == DType.f32 else b.op("Cast", [b.value(x)], f"{name}/f32", to=TensorProto.FLOAT)
    top = b.op("ReduceMax", [b.op("Abs", [x32], f"{name}/abs"), b.i64([-1])], f"{name}/max", keepdims=1)
    scale = b.op("Div", [top, b.const(KV_QMAX, np.float32, "kv/qmax")], f"{name}/scale")
    positive = b.op("Greater", [scale, b.const(0.0, np.float32, "zero")], f"{name}/positive")
    step = b.op("Where", [positive, scale, b.const(1.0, np.float32, "one")], f"{name}/step")
    ratio = b.op("Where", [positive, b.op("Div", [x32, step], f"{name}/ratio_raw"), b.const(0.0, np.float32, "zero")],
                 f"{name}/ratio")
    rounded = b.op("Clip", [b.op("Round", [ratio], f"{name}/round"), b.const(-KV_QMAX, np.float32, "kv/min"),
                            b.const(KV_QMAX, np.float32, "kv/qmax")], f"{name}/clipped")
    b.node("Cast", [rounded], outs[:1], to=TensorProto.INT8)
    b.node("Squeeze", [scale, b.i64([-1])], outs[1:])


def lower_dequantize_kv(b: Builder, node: Node, outs: list[str]) -> None:
    codes, scale = node.inputs
    name = outs[0]
    dtype = DType.parse(node.attrs["dtype"])
    values = b.op("Cast", [b.value(codes)], f"{name}/f32", to=TensorProto.FLOAT)
    scale32 = b.value(scale) if scale.dtype == DType.f32 else b.op("Cast", [b.value(scale)], f"{name}/scale_f32",
                                                                    to=TensorProto.FLOAT)
    per_row = b.op("Unsqueeze", [scale32, b.i64([-1])], f"{name}/scale_rows")
    if dtype == DType.f32:
        b.node("Mul", [values, per_row], outs)
    else:
        b.node("Cast", [b.op("Mul", [values, per_row], f"{name}/scaled")], outs, to=ONNX_TYPES[dtype])


LOWERINGS = {"dequant_linear": lower_dequant_linear, "dequantize": lower_dequantize,
             "quantize_kv": lower_quantize_kv, "dequantize_kv": lower_dequantize_kv, **quant_embedding.LOWERINGS}
ORT_OVERRIDES = {"dequant_linear": lower_dequant_linear_ort, **quant_embedding.ORT_OVERRIDES}
