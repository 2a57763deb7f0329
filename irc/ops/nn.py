"""Model-level ops of the dense path: embedding, norms, linear, MLPs.

Weights follow checkpoint layouts: a linear weight is [out, in] and ``y = x @ W.T``.
References compute in float32 and return the activation's dtype.
"""
from __future__ import annotations

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.ops.primitives import elementwise_cost, gelu, silu
from irc.ops.registry import Cost, OpDef, TensorType, expect, pad_inputs, register, same_dims


def f32(array):
    return None if array is None else np.asarray(array).astype(np.float32)


def float_dtype(dtype):
    """``dtype`` when it is a float type (bfloat16 included), else float32."""
    return dtype if dtype.kind == "f" or dtype.name == "bfloat16" else np.dtype(np.float32)


def _bytes(inputs, outputs):
    return sum(t.nbytes for t in inputs if t is not None), sum(t.nbytes for t in outputs)


def tokens(t: TensorType) -> int:
    """Rows of an activation [..., features]: batch times sequence."""
    n = 1
    for d in t.shape[:-1]:
        n *= d
    return n


# ---- embedding ---------------------------------------------------------------------------

def _embedding_infer(inputs, attrs):
    ids, table = inputs
    expect(ids.dtype in (DType.i64, DType.i32), f"embedding: ids must be integer, got {ids.dtype}")
    expect(table.rank == 2, f"embedding: table must be [vocab, d], got {dims.format_shape(table.shape)}")
    dtype = DType.f32 if not table.dtype.is_float else table.dtype
    return [TensorType(dtype, ids.shape + (table.shape[1],))]


def _embedding_reference(inputs, attrs):
    """Rows of the table for each id, times ``scale`` when set (Gemma's sqrt(d))."""
    ids, table = inputs
    out = np.take(f32(table), ids, axis=0)
    if attrs["scale"] is not None:
        out = out * np.float32(attrs["scale"])
    return [out.astype(float_dtype(table.dtype))]


def _embedding_cost(inputs, outputs, attrs):
    """A lookup, not a matmul: no FLOPs; reads one row per id."""
    return Cost(bytes_read=inputs[0].nbytes + outputs[0].nbytes, bytes_written=outputs[0].nbytes)


register(OpDef("embedding", ("ids", "table"), {"scale": None}, _embedding_infer, _embedding_reference,
               _embedding_cost, level="model"))


# ---- norms -----------------------------------------------------------------------------

def _norm_infer(inputs, attrs):
    x, weight = inputs[0], inputs[1]
    expect(x.dtype.is_float, f"norm: activation must be float, got {x.dtype}")
    expect(weight.rank == 1 and same_dims(weight.shape[0], x.shape[-1]),
           f"norm: weight {dims.format_shape(weight.shape)} does not fit features {x.shape[-1]}")
    if len(inputs) > 2 and inputs[2] is not None:
        expect(inputs[2].shape == weight.shape, "norm: bias shape differs from weight")
    return [TensorType(x.dtype, x.shape)]


def rms_norm(x, weight, eps: float, offset: float = 0.0):
    x32 = f32(x)
    normed = x32 / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + np.float32(eps))
    return normed * (f32(weight) + np.float32(offset))


def _rms_norm_reference(inputs, attrs):
    """x / sqrt(mean(x^2) + eps) * (weight + offset); Gemma stores weight - 1 (offset 1)."""
    x, weight = inputs
    return [rms_norm(x, weight, attrs["eps"], attrs["offset"]).astype(x.dtype)]


def _norm_cost(inputs, outputs, attrs):
    read, written = _bytes(inputs, outputs)
    return Cost(other_flops=4 * inputs[0].numel, bytes_read=read, bytes_written=written)


register(OpDef("rms_norm", ("x", "weight"), {"eps": 1e-6, "offset": 0.0}, _norm_infer, _rms_norm_reference,
               _norm_cost, level="model"))


def _layer_norm_reference(inputs, attrs):
    """(x - mean) / sqrt(var + eps) * weight + bias."""
    x, weight, bias = pad_inputs(inputs, 3)
    x32 = f32(x)
    centred = x32 - x32.mean(axis=-1, keepdims=True)
    out = centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + np.float32(attrs["eps"]))
    out = out * f32(weight)
    if bias is not None:
        out = out + f32(bias)
    return [out.astype(x.dtype)]


register(OpDef("layer_norm", ("x", "weight", "bias?"), {"eps": 1e-5}, _norm_infer, _layer_norm_reference,
               _norm_cost, level="model"))


# ---- linear ----------------------------------------------------------------------------

def _linear_infer(inputs, attrs):
    x, weight, bias = pad_inputs(inputs, 3)
    expect(x.dtype.is_float, f"linear: activation must be float, got {x.dtype}")
    expect(weight.rank == 2, f"linear: weight must be [out, in], got {dims.format_shape(weight.shape)}")
    expect(same_dims(weight.shape[1], x.shape[-1]),
           f"linear: weight {dims.format_shape(weight.shape)} expects {weight.shape[1]} input features, "
           f"activation has {x.shape[-1]}")
    if bias is not None:
        expect(bias.shape == (weight.shape[0],), f"linear: bias must be [{weight.shape[0]}]")
    return [TensorType(x.dtype, x.shape[:-1] + (weight.shape[0],))]


def linear(x, weight, bias=None):
    y = f32(x) @ f32(weight).T
    return y if bias is None else y + f32(bias)


def _linear_reference(inputs, attrs):
    """x @ weight.T (+ bias), weight [out, in] as in checkpoints."""
    x, weight, bias = pad_inputs(inputs, 3)
    return [linear(x, weight, bias).astype(x.dtype)]


def _linear_cost(inputs, outputs, attrs):
    """2 FLOPs per weight per token."""
    read, written = _bytes(inputs, outputs)
    return Cost(flops=2 * tokens(inputs[0]) * inputs[1].numel, bytes_read=read, bytes_written=written)


register(OpDef("linear", ("x", "weight", "bias?"), {}, _linear_infer, _linear_reference, _linear_cost,
               level="model"))


# ---- MLPs ------------------------------------------------------------------------------

def _gated_infer(inputs, attrs):
    x, gate, up, down = inputs
    d = x.shape[-1]
    expect(gate.rank == 2 and same_dims(gate.shape[1], d), f"mlp: gate weight must be [d_ff, {d}]")
    expect(up.shape == gate.shape, "mlp: up weight must match the gate weight")
    expect(down.shape == (gate.shape[1], gate.shape[0]), f"mlp: down weight must be [{d}, {gate.shape[0]}]")
    return [TensorType(x.dtype, x.shape)]


def _mlp_cost(inputs, outputs, attrs):
    """2 FLOPs per weight per token (matmul work); the activation and any bias adds (GELU
    and squared-ReLU MLPs' biases) are other FLOPs, as they are once the MLP is lowered."""
    read, written = _bytes(inputs, outputs)
    weights = sum(t.numel for t in inputs[1:] if t is not None and t.rank == 2)
    biases = sum(t.numel for t in inputs[1:] if t is not None and t.rank == 1)
    hidden = tokens(inputs[0]) * inputs[1].shape[0]
    return Cost(flops=2 * tokens(inputs[0]) * weights, other_flops=4 * hidden + tokens(inputs[0]) * biases,
                bytes_read=read, bytes_written=written)


def swiglu(x, gate, up, down):
    x32 = f32(x)
    return (silu(x32 @ f32(gate).T) * (x32 @ f32(up).T)) @ f32(down).T


def _swiglu_reference(inputs, attrs):
    """down(silu(gate(x)) * up(x))."""
    x, gate, up, down = inputs
    return [swiglu(x, gate, up, down).astype(x.dtype)]


def _geglu_reference(inputs, attrs):
    """down(gelu(gate(x)) * up(x)); approximate='tanh' for gelu_pytorch_tanh (Gemma)."""
    x, gate, up, down = inputs
    x32 = f32(x)
    hidden = gelu(x32 @ f32(gate).T, attrs["approximate"]) * (x32 @ f32(up).T)
    return [(hidden @ f32(down).T).astype(x.dtype)]


register(OpDef("swiglu", ("x", "w_gate", "w_up", "w_down"), {}, _gated_infer, _swiglu_reference, _mlp_cost,
               level="model"))
register(OpDef("geglu", ("x", "w_gate", "w_up", "w_down"), {"approximate": "tanh"}, _gated_infer,
               _geglu_reference, _mlp_cost, level="model"))


def _gelu_mlp_infer(inputs, attrs):
    x, up, down, b_up, b_down = pad_inputs(inputs, 5)
    d = x.shape[-1]
    expect(up.rank == 2 and same_dims(up.shape[1], d), f"gelu_mlp: up weight must be [d_ff, {d}]")
    expect(down.shape == (up.shape[1], up.shape[0]), f"gelu_mlp: down weight must be [{d}, {up.shape[0]}]")
    expect(b_up is None or b_up.shape == (up.shape[0],), "gelu_mlp: up bias must be [d_ff]")
    expect(b_down is None or b_down.shape == (up.shape[1],), "gelu_mlp: down bias must be [d]")
    return [TensorType(x.dtype, x.shape)]


def _gelu_mlp_reference(inputs, attrs):
    """down(gelu(up(x) + b_up)) + b_down."""
    x, up, down, b_up, b_down = pad_inputs(inputs, 5)
    hidden = gelu(linear(x, up, b_up), attrs["approximate"])
    return [linear(hidden, down, b_down).astype(x.dtype)]


register(OpDef("gelu_mlp", ("x", "w_up", "w_down", "b_up?", "b_down?"), {"approximate": "none"},
               _gelu_mlp_infer, _gelu_mlp_reference, _mlp_cost, level="model"))

__all__ = ["rms_norm", "linear", "swiglu", "f32", "tokens", "elementwise_cost"]
