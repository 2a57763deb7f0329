"""Dequant matmuls: int8/int4 weights from ``quantize`` decoded inside the GEMM's K loop.

``quantize`` stores a weight [N, K] (or [E, N, K] for experts) in ONNX Runtime
MatMulNBits' layout (``irc.ops.quant``): u8 codes [N, K/bs, bs*bits/8] (4-bit codes two
per byte, element 2i in the low nibble), scales [N, K/bs] and optional u8 zero points
[N, ceil(K/bs * bits/8)] (symmetric: zero point 2^(bits-1)). The generated weight-tile
load reads the bytes of a [BLOCK_K, BLOCK_N] tile, unpacks the nibbles, and computes
(code - zero) * scale in fp32 (what ``dequantize_blocks`` computes) before the tl.dot; the
float weight never exists in memory, so a decode step reads 1/4 (int8) or 1/8 (int4) of
the fp32 bytes.

``dequant_linear`` nodes become such matmuls (epilogues as for ``linear``); a
``dequantize`` node whose readers all take it as a GEMM weight (``swiglu``/``geglu``/
``gelu_mlp``/``grouped_gemm``/``linear``) is folded into those GEMMs the same way; any
other ``dequantize`` runs as a torch op (``dequantize_blocks`` in the module).
"""
from __future__ import annotations

from typing import Optional

from irc.dtypes import DType
from irc.errors import BackendError
from irc.graph import Node, Value
from irc.ops.registry import pad_inputs

from backends.triton.kernels import signature_type

WEIGHT_SLOTS = {"linear": (1,), "swiglu": (1, 2, 3), "geglu": (1, 2, 3), "gelu_mlp": (1, 2), "grouped_gemm": (1,),
                "mla_absorbed_attention": (5, 6, 8, 9, 11), "mla_latent_attention": (5, 6, 8, 9, 13)}

def weight_fields(bits: int, block_size: int, has_zero: bool, scale_dtype: DType, grouped: bool) -> dict:
    """GemmSpec fields decoding a quantized weight tile into fp32 ``{w}`` [BLOCK_K, BLOCK_N]."""
    per_byte = 8 // bits
    params = [("scales", "*" + signature_type(scale_dtype), "{w}_scales"),
              ("stride_s", "i32", "{w}_scales.stride(-2)")]
    if has_zero:
        params += [("zeros", "*u8", "{w}_zeros"), ("stride_z", "i32", "{w}_zeros.stride(-2)")]
    if grouped:
        params.append(("stride_se", "i32", "{w}_scales.stride(0)"))
        if has_zero:
            params.append(("stride_ze", "i32", "{w}_zeros.stride(0)"))
    expert = "expert * " if grouped else ""
    lines = ["{w}_k = k0 + rk[:, None]",
             "{w}_ok = k_ok[:, None] & n_ok[None, :]",
             "{w}_byte = tl.load({w}_ptr + {w}_offset + rn[None, :] * stride_{w}n + {w}_k"
             + (f" // {per_byte}" if per_byte > 1 else "") + ", mask={w}_ok, other=0).to(tl.int32)",
             "{w}_code = " + ("({w}_byte >> (({w}_k % 2) * 4)) & 15" if bits == 4 else "{w}_byte"),
             f"{{w}}_block = {{w}}_k // {block_size}",
             f"{{w}}_scale = tl.load({{w}}_scales + {expert + '{w}_stride_se + ' if grouped else ''}"
             "rn[None, :] * {w}_stride_s + {w}_block, mask={w}_ok, other=0.0).to(tl.float32)"]
    if has_zero:
        lines += [f"{{w}}_zb = tl.load({{w}}_zeros + {expert + '{w}_stride_ze + ' if grouped else ''}"
                  "rn[None, :] * {w}_stride_z + {w}_block" + (" // 2" if bits == 4 else "")
                  + ", mask={w}_ok, other=0).to(tl.int32)",
                  "{w}_zero = (" + ("({w}_zb >> (({w}_block % 2) * 4)) & 15" if bits == 4 else "{w}_zb")
                  + ").to(tl.float32)"]
        zero = "{w}_zero"
    else:
        zero = f"{float(2 ** (bits - 1))!r}"
    lines.append(f"{{w}} = ({{w}}_code.to(tl.float32) - {zero}) * {{w}}_scale")
    return dict(weight_params=params, weight_load=lines, n_expr="w.shape[-3]", stride_expr="{w}.stride(-3)",
                w_dtype=DType.u8)


def claim(planner) -> None:
    """Fold each ``dequantize`` whose readers all take its output as a GEMM weight."""
    planner.dequantized = {}
    for node in planner.graph.nodes:
        if node.op != "dequantize":
            continue
        value = node.outputs[0]
        slots = [(user, i) for user in value.uses for i, v in enumerate(user.inputs) if v is value]
        if value not in planner.graph.outputs and slots and all(
                i in WEIGHT_SLOTS.get(user.op, ()) for user, i in slots):
            planner.dequantized[value.name] = node
            planner.claimed[node.name] = "fused"


def _quant(node: Node, bits_attrs: dict, qweight: Value, scales: Value, zeros: Optional[Value], grouped: bool):
    if zeros is not None and zeros.dtype.is_float:
        raise BackendError(f"float zero points (@{zeros.name}) are not supported by the Triton kernels",
                           location=f"node %{node.name} ({node.op})",
                           hint="compile GGUF Q4_1/K-quant weights for onnx/onnx-ort, or load them as float")
    fields = weight_fields(bits_attrs["bits"], bits_attrs["block_size"], zeros is not None, scales.dtype, grouped)
    return fields, [qweight, scales] + ([zeros] if zeros is not None else [])


def weight(planner, value: Value, grouped: bool = False) -> tuple[dict, list]:
    """(GemmSpec fields, [weight operand, extra operands]) for a GEMM weight operand: a float
    weight as it is, or the codes of the folded ``dequantize`` behind it."""
    node = getattr(planner, "dequantized", {}).get(value.name)
    if node is None:
        return {"w_dtype": value.dtype}, [value]
    qweight, scales, zeros = pad_inputs(node.inputs, 3)
    return _quant(node, node.attrs, qweight, scales, zeros, grouped)


def linear_weight(node: Node) -> tuple[dict, list]:
    """(GemmSpec fields, operands) of a ``dequant_linear`` node's quantized weight."""
    qweight, scales, zeros = pad_inputs(node.inputs, 4)[1:]
    return _quant(node, node.attrs, qweight, scales, zeros, grouped=False)


def launch_args(planner, operands_per_weight: list[list]) -> tuple[list[str], list[str]]:
    """(the weights' main launch args, trailing args: scales/zero points per weight in order)."""
    main = [planner.var(ops[0]) for ops in operands_per_weight]
    trailing = [planner.var(v) for ops in operands_per_weight for v in ops[1:]]
    return main, trailing


def base_name(fields: dict, base: str) -> str:
    return ("dequant_" + base) if fields.get("weight_load") else base
