"""The int8 KV cache of ``quantize{kv_cache=true}`` (see ``passes.quantize.Quantize``):
each float past cache of an attention node that is a graph input read by that node alone,
with its present cache a graph output and nothing else, becomes int8 codes plus float32
scales per head and token; the node reads ``dequantize_kv`` of the past and its float
present goes through ``quantize_kv``."""
from __future__ import annotations

from typing import Optional

from irc import ops
from irc.build import emit, emit1
from irc.dtypes import DType
from irc.graph import Graph, Node
from irc.rewrite.edit import is_graph_output, replace_node

# past-cache operands and the index of the present output each one becomes
CACHE_OPERANDS = {
    "attention": (("past_key", 1), ("past_value", 2)),
    "mla_attention": (("past_key", 1), ("past_value", 2)),
    "mla_absorbed_attention": (("past_latent", 1), ("past_rope", 2)),
    "mla_latent_attention": (("past_latent", 1), ("past_rope", 2)),
}


def _cache_slots(node: Node) -> list:
    """(operand index, past value, present value) for each past-cache operand of ``node``."""
    names = ops.get_op(node.op).operand_names(len(node.inputs))
    slots = []
    for name, output in CACHE_OPERANDS[node.op]:
        if name in names[:len(node.inputs)]:
            index = names.index(name)
            if node.inputs[index] is not None and output < len(node.outputs):
                slots.append((index, node.inputs[index], node.outputs[output]))
    return slots


def cache_refusal(graph: Graph, node: Node) -> Optional[str]:
    """Why the caches of ``node`` stay float, or None."""
    slots = _cache_slots(node)
    if len(slots) != len(CACHE_OPERANDS[node.op]):
        return "no past caches"
    for _, past, present in slots:
        if not any(v is past for v in graph.inputs):
            return f"%{past.name} is not a graph input"
        if not past.dtype.is_float:
            return f"%{past.name} is already {past.dtype}"
        if graph.users(past) != [node] or len(past.uses) != 1 or is_graph_output(graph, past):
            return f"%{past.name} has other readers"
        if present.uses or not is_graph_output(graph, present):
            return f"%{present.name} is not only a graph output"
    return None


def quantize_caches(graph: Graph, node: Node) -> None:
    """Retype the past caches of ``node`` to int8 + scale inputs and quantize its presents."""
    slots = _cache_slots(node)
    operands = list(node.inputs)
    for index, past, _ in slots:
        dtype = past.dtype
        past.dtype = DType.i8
        scale = graph.add_input(f"{past.name}_scale", DType.f32, past.shape[:-1])
        graph.inputs.remove(scale)
        graph.inputs.insert(graph.inputs.index(past) + 1, scale)
        operands[index] = emit1(graph, "dequantize_kv", [past, scale], {"dtype": str(dtype)},
                                f"{past.name}.dequantized", before=node, origin=node.origin)
    hints = [f"{out.name}.float" if any(out is p for *_, p in slots) else f"{out.name}.new" for out in node.outputs]
    outputs = emit(graph, node.op, operands, dict(node.attrs), hints, before=node, origin=node.origin)
    replacements = list(outputs)
    scales = []
    for index, past, present in slots:
        position = node.outputs.index(present)
        codes, scale = emit(graph, "quantize_kv", [outputs[position]], None,
                            [f"{present.name}.codes", f"{present.name}_scale"], before=node, origin=node.origin)
        replacements[position] = codes
        scales.append((present.name, scale))
    replace_node(graph, node, replacements)
    for name, scale in scales:
        position = next(i for i, v in enumerate(graph.outputs) if v.name == name)
        graph.outputs.insert(position + 1, scale)


__all__ = ["CACHE_OPERANDS", "cache_refusal", "quantize_caches"]
