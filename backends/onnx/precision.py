"""fp16 graphs on ONNX Runtime's CPU provider: where the kernels are missing, and the casts.

Measured on ORT 1.32's CPU provider (x86-64): these ONNX ops have fp16 kernels, so an irc
op that lowers to them runs in fp16 as it is: ``RMSNormalization``,
``SimplifiedLayerNormalization``, ``SkipSimplifiedLayerNormalization``,
``LayerNormalization``, ``Attention`` (opset 23), ``RotaryEmbedding`` (opset 23 and
com.microsoft), ``GroupQueryAttention``, ``MatMulNBits``, ``GatherBlockQuantized``,
``Gather``, ``Concat``, ``Slice``, ``Reshape``, ``Transpose``, ``Expand``, ``Cast``,
``Max``, ``Clip``, ``Round``, ``ScatterElements``/``ScatterND``, ``GatherElements``.
These have none: ``MatMul``, ``Gemm``, ``FusedMatMul``, ``Add``, ``Sub``, ``Mul``, ``Div``,
``Neg``, ``Abs``, ``Pow``, ``Sqrt``, ``Reciprocal``, ``Sigmoid``, ``Tanh``, ``Erf``,
``Gelu``, ``FastGelu``, ``QuickGelu``, ``Softmax``, ``ReduceMean/Max/Sum``, ``Where``,
``TopK``, ``OneHot``, ``CumSum``, ``Trilu``, ``Einsum``, comparisons and
``MultiHeadAttention``: ORT would put a Cast to f32 before and after every such node.

irc casts at the irc op instead (``lower_in_f32``): an op outside ``NATIVE_F16`` (linear
and the MLPs, residual adds, softcap, MoE, MLA attention...) is lowered as if its f16
activations were f32: its f16 inputs are cast to f32 once (shared by every such reader),
it computes in f32, and its results are cast back to f16. The rounding points are then the
reference interpreter's (which computes each op in f32 and rounds its result). Weights stay
f16 in the file; the lowering reads them through ``Cast(initializer)``, a constant that
ORT folds once when the session is created (graph optimizations on, their default): no
step casts a weight. fp16 ``dequant_linear`` is ``MatMulNBits`` with f16 scales, native.

bf16 graphs are emitted as they are: ORT 1.32's CPU provider has no bf16 kernels for
MatMul, Add, the norms or attention, so they are for execution providers that do (CUDA).
"""
from __future__ import annotations

from typing import Callable

from onnx import TensorProto

from irc.dtypes import DType
from irc.graph import Node, Param, Value

from backends.onnx.builder import Builder

NATIVE_F16 = frozenset({
    "rms_norm", "layer_norm", "rope", "attention", "embedding", "dequant_linear", "dequantize",
    "reshape", "transpose", "concat", "slice", "strided_slice", "expand", "gather", "cast", "constant",
    "dim_size", "range_like",
})


def needs_f32(node: Node) -> bool:
    """Does ``node`` read or write f16 activations through ops without fp16 CPU kernels?"""
    if node.op in NATIVE_F16:
        return False
    inputs = [v for v in node.inputs if v is not None and not isinstance(v, Param)]
    if any(v.producer is not None and v.producer.op == "dequantize" for v in inputs):
        return False  # a dequantized weight: ORT fuses DequantizeLinear -> MatMul into fp16 MatMulNBits
    values = inputs + list(node.outputs)
    return any(v.dtype == DType.f16 for v in values)


def lower_in_f32(b: Builder, lowering: Callable, node: Node, outs: list[str]) -> None:
    """Lower ``node`` with its f16 activations seen as f32 (module docstring)."""
    inputs = [_as_f32_input(b, v) for v in node.inputs]
    outputs = []
    for value, name in zip(node.outputs, outs):
        if value.dtype != DType.f16:
            outputs.append(value)
            continue
        shadow = _shadow(value)
        b.bind(shadow, b.fresh(f"{name}/f32"))
        outputs.append(shadow)
    proxy = _proxy(node, inputs, outputs)
    lowering(b, proxy, [b.name_for(v) for v in outputs])
    for value, shadow, name in zip(node.outputs, outputs, outs):
        if shadow is not value:
            b.node("Cast", [b.name_for(shadow)], [name], to=TensorProto.FLOAT16)


def _as_f32_input(b: Builder, value):
    if value is None or isinstance(value, Param) or value.dtype != DType.f16:
        return value
    shadow = _shadow(value)
    b.bind(shadow, b.cached(("as-f32", value.name),
                            lambda: b.op("Cast", [b.value(value)], f"{value.name}/f32", to=TensorProto.FLOAT)))
    return shadow


def _shadow(value: Value) -> Value:
    """An f32 stand-in for ``value`` that is not in the graph (it reads the same users)."""
    shadow = Value(value.name, DType.f32, value.shape)
    shadow.uses = value.uses
    return shadow


def _proxy(node: Node, inputs: list, outputs: list) -> Node:
    """A copy of ``node`` over stand-ins, built without registering itself as a user."""
    proxy = object.__new__(Node)
    proxy.op, proxy.inputs, proxy.outputs = node.op, inputs, outputs
    proxy.attrs, proxy.origin = node.attrs, node.origin
    for value in outputs:
        if value not in node.outputs:
            value.producer = proxy
    return proxy
