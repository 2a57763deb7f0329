"""``nvfp4_fake_quantize`` (``irc.ops.nvfp4``, Kolibri-1.1's NVFP4 rounding) in standard ops,
the same for both ONNX targets, as the reference computes it: x in float32 reshaped to blocks
[..., D/16, 16]; the bound max|x| / 6 clipped to [2^-9, 448]; its E4M3 spacing the largest
of the spacings whose power-of-two threshold it reaches (``Where`` over the 14 thresholds,
``ReduceMax``); the scale ``Round``(bound / spacing) · spacing (ONNX ``Round`` ties to even,
as E4M3 casts do); the E2M1 magnitude min(|x / scale|, 6) rounded the same way on its step
(0.5, 1 or 2), its sign restored, times the scale; reshaped back and cast to x's dtype. No
float8 or float4 type is used, so every ONNX Runtime computes it exactly."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from irc.graph import Node
from irc.ops.nvfp4 import BLOCK, E4M3_MAX, E4M3_MIN, E4M3_SPACINGS, E4M3_THRESHOLDS

from backends.onnx.builder import ONNX_TYPES, Builder


def _round_on(b: Builder, x: str, step: str, name: str) -> str:
    """Round(x / step) · step: x rounded to a multiple of ``step``, ties to even."""
    return b.op("Mul", [b.op("Round", [b.op("Div", [x, step], f"{name}_units")], f"{name}_rounded"), step], name)


def lower_nvfp4_fake_quantize(b: Builder, node: Node, outs: list[str]) -> None:
    (x,) = node.inputs
    out, rank = outs[0], len(x.shape)
    f32 = b.op("Cast", [b.value(x)], f"{out}/f32", to=TensorProto.FLOAT)
    blocks = b.op("Reshape", [f32, b.i64([0] * (rank - 1) + [x.shape[-1] // BLOCK, BLOCK], f"{out}/block_shape")],
                  f"{out}/blocks")
    amax = b.op("ReduceMax", [b.op("Abs", [blocks], f"{out}/abs"), b.i64([-1])], f"{out}/amax", keepdims=1)
    bound = b.op("Clip", [b.op("Div", [amax, b.const(6.0, np.float32, f"{out}/six")], f"{out}/bound_raw"),
                          b.const(E4M3_MIN, np.float32, f"{out}/e4m3_min"),
                          b.const(E4M3_MAX, np.float32, f"{out}/e4m3_max")], f"{out}/bound")
    reached = b.op("GreaterOrEqual", [bound, b.const(np.array(E4M3_THRESHOLDS, np.float32), np.float32,
                                                     f"{out}/thresholds")], f"{out}/reached")
    spacings = b.op("Where", [reached, b.const(np.array(E4M3_SPACINGS, np.float32), np.float32, f"{out}/spacings"),
                              b.const(E4M3_MIN, np.float32, f"{out}/finest")], f"{out}/spacing_each")
    spacing = b.op("ReduceMax", [spacings, b.i64([-1])], f"{out}/spacing", keepdims=1)
    scale = _round_on(b, bound, spacing, f"{out}/scale")
    scaled = b.op("Div", [blocks, scale], f"{out}/scaled")
    magnitude = b.op("Min", [b.op("Abs", [scaled], f"{out}/scaled_abs"), b.const(6.0, np.float32, f"{out}/six_max")],
                     f"{out}/magnitude")

    def below(limit: float):
        return b.op("Less", [magnitude, b.const(limit, np.float32, f"{out}/limit{limit:g}")], f"{out}/below{limit:g}")

    step = b.op("Where", [below(2.0), b.const(0.5, np.float32, f"{out}/half"),
                          b.op("Where", [below(4.0), b.const(1.0, np.float32, f"{out}/one"),
                                         b.const(2.0, np.float32, f"{out}/two")], f"{out}/step_high")], f"{out}/step")
    rounded = _round_on(b, magnitude, step, f"{out}/e2m1")
    negative = b.op("Less", [scaled, b.const(0.0, np.float32, f"{out}/zero")], f"{out}/negative")
    signed = b.op("Where", [negative, b.op("Neg", [rounded], f"{out}/e2m1_neg"), rounded], f"{out}/signed")
    back = b.op("Reshape", [b.op("Mul", [signed, scale], f"{out}/dequantized"), b.op("Shape", [f32], f"{out}/shape")],
                f"{out}/flat")
    b.node("Cast", [back], outs, to=ONNX_TYPES[node.outputs[0].dtype])


LOWERINGS = {"nvfp4_fake_quantize": lower_nvfp4_fake_quantize}
