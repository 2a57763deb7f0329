"""``retype``: one float type for the weights and activations of a graph."""
from __future__ import annotations

from irc import ops
from irc.dtypes import DType
from irc.errors import PassError
from irc.graph import Graph, Node, Param
from irc.passmanager import Pass, register_pass
from irc.rewrite.edit import cast_to, is_graph_output
from irc.weights import Cast

QUANTIZED_OPS = ("dequant_linear", "dequantize", "quantize_kv", "dequantize_kv")
FLOATS = ("f32", "f16", "bf16")


@register_pass
class Retype(Pass):
    """Give every float weight, float graph input (the KV cache) and activation the type ``dtype``.

    Weights keep their data lazy: each float param whose type changes reads through
    ``irc.weights.Cast``, which converts on every read (whole or a block of rows), so a bf16
    checkpoint becomes an f32 graph without a converted copy in memory. A ``cast`` from one
    float type to another now casts to ``dtype``, and is dropped when that makes it an
    identity (a bf16 table's lookup no longer needs one). Values computed from integers (the
    RoPE tables of a decomposed rotation, from positions and f32 constants) stay f32 until
    they meet an activation, where a ``cast`` to ``dtype`` is inserted. Every node's result
    types are then inferred again, so the graph verifies as it did.

    Run it first: quantization takes its scale type from the weights it quantizes, so after
    ``retype`` the scales follow the activations. It refuses a graph that is already
    quantized. Exact for ``f32`` from f32, f16 or bf16 weights (every f16 and bf16 value is an
    f32); f16 and bf16 round, and ``--check`` reports by how much.
    """

    name = "retype"
    exact = False
    options = {"dtype": "f32"}

    def __init__(self, **options):
        super().__init__(**options)
        if self.config["dtype"] not in FLOATS:
            raise PassError(f"pass retype: dtype must be one of {', '.join(FLOATS)}, got {self.config['dtype']!r}")
        self.dtype = DType.parse(self.config["dtype"])

    def precondition(self, graph: Graph):
        quantized = next((n for n in graph.nodes if n.op in QUANTIZED_OPS), None)
        typed = all(v.dtype == self.dtype for v in [*graph.params.values(), *graph.inputs] if v.dtype.is_float)
        if quantized is not None and not typed:  # a quantized graph already in ``dtype`` (a GGUF's) has nothing to do
            return (f"the graph is already quantized (%{quantized.name}, {quantized.op}); run retype before "
                    "quantize")
        return None

    def run(self, graph: Graph) -> bool:
        target = self.dtype
        changed = False
        for param in graph.params.values():
            if param.dtype.is_float and param.dtype != target:
                param.data = None if param.data is None else Cast(param.data, target)
                param.dtype = target
                changed = True
        for value in graph.inputs:
            if value.dtype.is_float and value.dtype != target:
                value.dtype = target
                changed = True
        for node in list(graph.nodes):
            changed |= self.retype_node(graph, node)
        changed |= drop_identity_casts(graph)
        if graph.meta.get("dtype") not in (None, str(target)):
            graph.meta["dtype"] = str(target)
            changed = True
        return changed

    def retype_node(self, graph: Graph, node: Node) -> bool:
        """Retarget a float->float cast, reconcile mixed float operands, re-infer results."""
        target, changed = self.dtype, False
        source = node.inputs[0] if node.inputs else None
        float_cast = node.op == "cast" and source is not None and source.dtype.is_float
        if float_cast and DType.parse(node.attrs["to"]).is_float and node.attrs["to"] != str(target):
            node.attrs["to"] = str(target)
            changed = True
        floats = {v.dtype for v in node.inputs if v is not None and v.dtype.is_float}
        if len(floats) > 1 and target in floats:
            for index, value in enumerate(node.inputs):
                if value is not None and value.dtype.is_float and value.dtype != target:
                    node.set_input(index, cast_to(graph, value, target, f"{value.name}.{target}", before=node))
                    changed = True
        types = ops.infer(node.op, node.inputs, node.attrs)
        for value, inferred in zip(node.outputs, types):
            if value.dtype != inferred.dtype:
                value.dtype = inferred.dtype
                changed = True
        return changed


def drop_identity_casts(graph: Graph) -> bool:
    """Remove casts to their input's own type (unless the cast's result is a graph output)."""
    dropped = False
    for node in list(graph.nodes):
        if node.op != "cast" or isinstance(node.inputs[0], Param):
            continue
        (source,), (out,) = node.inputs, node.outputs
        if source.dtype == out.dtype and not is_graph_output(graph, out):
            graph.replace_all_uses(out, source)
            graph.remove(node)
            dropped = True
    return dropped
