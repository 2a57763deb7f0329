"""``lower-norms``: ``rms_norm`` and ``layer_norm`` to primitives."""
from __future__ import annotations

from irc.dtypes import DType
from irc.graph import Node, Value
from irc.passmanager import register_pass
from irc.rewrite.lowering import Emitter, LoweringPass

F32 = DType.f32


def inv_std(e: Emitter, centred: Value) -> Value:
    """rsqrt(mean(centred^2) + eps) over the last axis."""
    squares = e("mul", [centred, centred], "square")
    mean = e("reduce_mean", [squares], "mean_square", {"axes": [-1], "keepdims": True})
    shifted = e("add", [mean, e.constant(float(e.node.attrs["eps"]), F32, "eps")], "mean_square_eps")
    return e("rsqrt", [shifted], "inv_std")


def lower_rms_norm(e: Emitter, node: Node) -> Value:
    x, weight = node.inputs
    x32 = e.cast(x, F32, "input_f32")
    normed = e("mul", [x32, inv_std(e, x32)], "normed")
    scale = e.cast(weight, F32, name=f"{weight.name}.f32")
    if node.attrs["offset"]:
        offset = e.constant(float(node.attrs["offset"]), F32, "offset")
        scale = e("add", [scale, offset], name=f"{weight.name}.scale")
    return e.cast(e("mul", [normed, scale], "scaled"), e.out.dtype, "cast")


def lower_layer_norm(e: Emitter, node: Node) -> Value:
    x, weight, bias = e.operands.values()
    x32 = e.cast(x, F32, "input_f32")
    mean = e("reduce_mean", [x32], "mean", {"axes": [-1], "keepdims": True})
    centred = e("sub", [x32, mean], "centred")
    normed = e("mul", [centred, inv_std(e, centred)], "normed")
    result = e("mul", [normed, e.cast(weight, F32, name=f"{weight.name}.f32")], "scaled")
    if bias is not None:
        result = e("add", [result, e.cast(bias, F32, name=f"{bias.name}.f32")], "biased")
    return e.cast(result, e.out.dtype, "cast")


@register_pass
class LowerNorms(LoweringPass):
    """Rewrite ``rms_norm`` and ``layer_norm`` as elementwise ops and a mean over features.

    rms_norm:   x * rsqrt(reduce_mean(x * x) + eps) * (weight + offset)
    layer_norm: c = x - reduce_mean(x); c * rsqrt(reduce_mean(c * c) + eps) * weight + bias

    ``eps`` and a nonzero ``offset`` (Gemma stores weight - 1, offset 1.0) become
    ``constant`` nodes; ``weight + offset`` over a param becomes the param
    ``@<weight>.scale`` after ``fold``. The math runs in float32 as the reference does: an
    f16/bf16 activation is cast up first and the result cast back. Never refuses.
    Guarantees: the reference result up to float32 rounding; the output keeps its name.
    """

    name = "lower-norms"
    lowerings = {"rms_norm": lower_rms_norm, "layer_norm": lower_layer_norm}
