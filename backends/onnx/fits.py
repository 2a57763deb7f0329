"""Which ORT kernel can take a node, and the operand readings those checks share: the
lowering primitives under the ONNX targets. ``gqa_fits`` (GroupQueryAttention),
``matmul_nbits_fits`` (MatMulNBits), ``packable`` (one MatMulNBits over stacked codes),
``only_matrix_uses`` (a weight stored [in, out]), ``attention_operands`` and the
``dequant_linear`` operands. They read the graph only and emit nothing, so the planners
(``backends.onnx.gqa_fuse``) and the lowerings (``portable``, ``quant``, ``quant_pack``,
``attention``, ``ort``) all stand on them."""
from __future__ import annotations

from irc import dims
from irc.dtypes import DType
from irc.graph import Node, Value
from irc.ops.registry import pad_inputs


# operands that are a [out, in] weight applied as x @ W.T, per op
MATRIX_OPERANDS = {"linear": {1}, "swiglu": {1, 2, 3}, "geglu": {1, 2, 3}, "gelu_mlp": {1, 2},
                   "moe": {1, 6, 7, 8, 9}, "mla_attention": {5, 6, 8, 9, 11, 12},
                   "mla_absorbed_attention": {5, 6, 8, 9, 11}, "mla_latent_attention": {5, 6, 8, 9, 13}}


def only_matrix_uses(param: Value) -> bool:
    """Is every use of ``param`` a weight applied as x @ W.T? (Then it is stored [in, out].)"""
    return all(all(i in MATRIX_OPERANDS.get(user.op, ()) for i, v in enumerate(user.inputs) if v is param)
               for user in param.uses)


def attention_operands(node: Node) -> dict:
    q, k, v, mask, past_key, past_value, sinks, blocks, alibi = pad_inputs(node.inputs, 9)
    a = node.attrs
    batch, seq = q.shape[:2]
    total = seq if past_key is None else dims.add(past_key.shape[2], seq)
    return dict(q=q, k=k, v=v, mask=mask, past_key=past_key, past_value=past_value, sinks=sinks, blocks=blocks,
                alibi=alibi, batch=batch, seq=seq,
                total=total, heads=a["heads"], kv_heads=a["kv_heads"], head_dim=a["head_dim"],
                v_head_dim=a["head_dim"] if a["v_head_dim"] is None else a["v_head_dim"],
                scale=a["head_dim"] ** -0.5 if a["scale"] is None else a["scale"])


def gqa_fits(node: Node):
    """Why GroupQueryAttention cannot compute this attention node (None when it can)."""
    o = attention_operands(node)
    if o["past_key"] is None:
        return "no past cache"
    if not node.attrs["causal"]:
        return "non-causal attention"
    if o["v_head_dim"] != o["head_dim"]:
        return "value heads wider or narrower than key heads"
    if o["head_dim"] % 8:
        return f"head size {o['head_dim']} is not a multiple of 8, which ORT's GroupQueryAttention needs"
    if o["q"].dtype not in (DType.f32, DType.f16):
        return f"{o['q'].dtype} activations"
    if o["blocks"] is not None:
        return "image tokens that see each other (its causal mask cannot be opened)"
    return None


def dequant_parts(node: Node, first: int) -> tuple:
    qweight, scales, zero_points = (list(node.inputs[first:first + 3]) + [None] * 3)[:3]
    return qweight, scales, zero_points


def matmul_nbits_fits(node: Node):
    """Why MatMulNBits cannot compute this dequant_linear (None when it can)."""
    _, _, zero_points = dequant_parts(node, 1)
    return nbits_refusal(node.attrs, node.inputs[0].dtype, node.inputs[2].dtype, zero_points)


def nbits_refusal(attrs: dict, x_dtype: DType, scale_dtype: DType, zero_points):
    block = attrs["block_size"]
    if block < 16 or block & (block - 1):
        return f"block_size {block} (MatMulNBits takes a power of two >= 16)"
    if x_dtype not in (DType.f32, DType.f16) or scale_dtype != x_dtype:
        return f"{x_dtype} activations with {scale_dtype} scales"
    # float zero points (4- or 8-bit codes): u8 codes plus a correction (backends.onnx.quant_pack)
    if zero_points is not None and zero_points.dtype.is_float and attrs["K"] % block:
        return "float zero points with a padded last block"
    return None


PACK_KEYS = ("K", "bits", "block_size", "accuracy_level")


def dequant_operands(node: Node) -> list:
    return (list(node.inputs) + [None] * 5)[:5]


def _pack_signature(node: Node) -> tuple:
    _, _, scales, zero_points, bias = dequant_operands(node)
    return (tuple(node.attrs.get(k) for k in PACK_KEYS), scales.dtype, None if zero_points is None else zero_points.dtype,
            bias is not None)


def packable(nodes, fits) -> bool:
    """Can one MatMulNBits over stacked codes compute these dequant_linear nodes? Each fits
    MatMulNBits (``fits(n)`` is None), and all share K, bits, block size, accuracy level, the
    scales' dtype, the zero points' (none, u8 or float: then one shared correction) and
    whether there are biases."""
    first = _pack_signature(nodes[0])
    return all(n.op == "dequant_linear" and fits(n) is None and _pack_signature(n) == first for n in nodes)


