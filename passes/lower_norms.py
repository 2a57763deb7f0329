"""``lower-norms``: ``rms_norm`` and ``layer_norm`` to primitives."""
from __future__ import annotations

from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph, Node, Value
from irc.passmanager import Pass, register_pass
from irc.rewrite.edit import cast_to, constant, replace_node

F32 = DType.f32


@register_pass
class LowerNorms(Pass):
    """Rewrite ``rms_norm`` and ``layer_norm`` as elementwise ops and a mean over features.

    rms_norm:   x * rsqrt(reduce_mean(x * x) + eps) * (weight + offset)
    layer_norm: c = x - reduce_mean(x); c * rsqrt(reduce_mean(c * c) + eps) * weight + bias

    ``eps`` and a nonzero ``offset`` (Gemma stores weight - 1, offset 1.0) become
    ``constant`` nodes; ``weight + offset`` over a param becomes the param
    ``@<weight>.scale`` after ``fold``. The math runs in float32 as the reference does: an
    f16/bf16 activation is cast up first and the result cast back. Guarantees: the
    reference result up to float32 rounding; the output keeps its name.
    """

    name = "lower-norms"

    def run(self, graph: Graph) -> bool:
        changed = False
        for node in list(graph.nodes):
            if node.op in LOWERINGS:
                replace_node(graph, node, [LOWERINGS[node.op](graph, node)])
                changed = True
        return changed


class _Emitter:
    """Emits before ``node`` with names ``<output>.<role>``; the last result takes ``<output>``."""

    def __init__(self, graph: Graph, node: Node):
        self.graph, self.node, self.out = graph, node, node.outputs[0]

    def __call__(self, op: str, inputs, role: str, attrs=None) -> Value:
        return emit1(self.graph, op, inputs, attrs, f"{self.out.name}.{role}", before=self.node)

    def constant(self, value: float, role: str) -> Value:
        return constant(self.graph, float(value), F32, f"{self.out.name}.{role}", before=self.node)

    def f32(self, value: Value, name: str) -> Value:
        return cast_to(self.graph, value, F32, name, before=self.node)

    def inv_std(self, centred: Value) -> Value:
        """rsqrt(mean(centred^2) + eps) over the last axis."""
        squares = self("mul", [centred, centred], "square")
        mean = self("reduce_mean", [squares], "mean_square", {"axes": [-1], "keepdims": True})
        shifted = self("add", [mean, self.constant(self.node.attrs["eps"], "eps")], "mean_square_eps")
        return self("rsqrt", [shifted], "inv_std")

    def finish(self, result: Value) -> Value:
        """``result`` in the output's dtype."""
        return cast_to(self.graph, result, self.out.dtype, f"{self.out.name}.cast", before=self.node)


def lower_rms_norm(graph: Graph, node: Node) -> Value:
    e = _Emitter(graph, node)
    x, weight = node.inputs
    x32 = e.f32(x, f"{e.out.name}.input_f32")
    normed = e("mul", [x32, e.inv_std(x32)], "normed")
    scale = e.f32(weight, f"{weight.name}.f32")
    if node.attrs["offset"]:
        offset = e.constant(node.attrs["offset"], "offset")
        scale = emit1(graph, "add", [scale, offset], None, f"{weight.name}.scale", before=node)
    return e.finish(e("mul", [normed, scale], "scaled"))


def lower_layer_norm(graph: Graph, node: Node) -> Value:
    e = _Emitter(graph, node)
    x, weight, bias = (list(node.inputs) + [None])[:3]
    x32 = e.f32(x, f"{e.out.name}.input_f32")
    mean = e("reduce_mean", [x32], "mean", {"axes": [-1], "keepdims": True})
    centred = e("sub", [x32, mean], "centred")
    result = e("mul", [e("mul", [centred, e.inv_std(centred)], "normed"), e.f32(weight, f"{weight.name}.f32")],
               "scaled")
    if bias is not None:
        result = e("add", [result, e.f32(bias, f"{bias.name}.f32")], "biased")
    return e.finish(result)


LOWERINGS = {"rms_norm": lower_rms_norm, "layer_norm": lower_layer_norm}
