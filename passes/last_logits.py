"""``last-logits``: compute ``logits`` for the last position only."""
from __future__ import annotations

from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph, Node, Param
from irc.passmanager import Pass, register_pass
from irc.rewrite.edit import constant, replace_node

# position-wise ops the head may be made of: one activation operand (the first), the rest params
HEAD_OPS = ("linear", "dequant_linear", "rms_norm", "layer_norm", "softcap", "cast")


def head_chain(graph: Graph, name: str) -> tuple[list[Node], str]:
    """The position-wise nodes from the last shared activation to output ``name`` (first to
    last), or ([], why not)."""
    output = next((v for v in graph.outputs if v.name == name), None)
    if output is None:
        return [], f"the graph has no output %{name}"
    if output.rank != 3 or output.shape[1] == 1:
        return [], f"%{name} is {output.type_str()}, not [B, T, V] over several positions"
    chain, value = [], output
    while value.producer is not None and value.producer.op in HEAD_OPS:
        node = value.producer
        if any(not isinstance(v, Param) for v in node.inputs[1:] if v is not None):
            break
        chain.insert(0, node)
        value = node.inputs[0]
        if value.rank != 3 or value.shape[1] != output.shape[1] or len(value.uses) > 1:
            break
    if not chain:
        return [], f"%{name} is not computed by {', '.join(HEAD_OPS)} from a [B, T, d] activation"
    return chain, ""


@register_pass
class LastLogits(Pass):
    """Compute ``logits`` [B, 1, V] for the last position only.

    A generate loop (onnxruntime-genai) reads only the last row of a prefill's logits, yet
    the head is the largest matmul of a small model's prefill (Gemma-3-270M: a 262,144-row
    head, about half the prefill's time at 128 tokens). The pass finds the position-wise
    nodes that make ``logits`` from the last activation shared with the rest of the graph
    (final norm, head ``linear`` or ``dequant_linear``, softcap, casts), gathers that
    activation's last position (``gather`` of index -1 along T) and recomputes the chain on
    [B, 1, d]. The ONNX targets run it last, after their pipeline (``--logits all`` skips it).

    Changes the graph's contract: ``logits`` is [B, 1, V], so perplexity over every position
    needs a graph without this pass. Refuses, with a note, a graph whose ``logits`` is not
    such a chain. Guarantees: the last row of the logits is the reference's; the output keeps
    its name.
    """

    name = "last-logits"

    def run(self, graph: Graph) -> bool:
        chain, why = head_chain(graph, "logits")
        if not chain:
            self.notes = [f"last-logits: {why}; nothing changed"]
            return False
        self.notes = []
        first, last = chain[0], chain[-1]
        source = first.inputs[0]
        index = constant(graph, [-1], DType.i64, "logits.last_index", before=first)
        value = emit1(graph, "gather", [source, index], {"axis": 1}, f"{source.name}.last", before=first)
        for node in chain:
            value = emit1(graph, node.op, [value, *node.inputs[1:]], dict(node.attrs), f"{node.outputs[0].name}.last",
                          before=last, origin=node.origin)
        replace_node(graph, last, [value])
        for node in reversed(chain[:-1]):
            graph.remove(node)
        return True
