"""Cutting an ONNX model into a submodel between named tensors.

``submodel(model, inputs, outputs)`` keeps the nodes needed to compute ``outputs`` from
``inputs``, found by walking back from the outputs and stopping at the given inputs, and
nothing else. Names that subgraph attributes (If, Loop bodies) read from the outer scope
count as node inputs. Node order is the source's. The initializers reached are copied as
they are: one stored as external data still names the same file and offsets, and nothing
is loaded. A graph input of the source that is reached but not among ``inputs`` becomes
an input too, after the given ones. Any other name that nothing produces is a ValueError.
The opsets, IR version, producer and metadata are the source's, and the same arguments
always give the same bytes.
"""
from __future__ import annotations

import onnx
from onnx import helper


def _outer_names(graph: onnx.GraphProto) -> list[str]:
    """Names that ``graph`` (a subgraph attribute) reads but does not define, in order."""
    defined = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    names: list[str] = []
    for node in graph.node:
        for name in list(node.input) + _subgraph_names(node):
            if name and name not in defined and name not in names:
                names.append(name)
        defined.update(node.output)
    return [name for name in names if name not in defined]


def _subgraph_names(node: onnx.NodeProto) -> list[str]:
    """Outer-scope names read by the subgraphs among ``node``'s attributes."""
    names: list[str] = []
    for attr in node.attribute:
        for graph in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            names.extend(_outer_names(graph))
    return names


def submodel(model: onnx.ModelProto, inputs: list[str], outputs: list[str], doc: str = "",
             value_info: dict[str, onnx.ValueInfoProto] | None = None) -> onnx.ModelProto:
    """The part of ``model`` that computes ``outputs`` from ``inputs``.

    ``value_info`` gives the types of cut tensors that the source graph does not describe;
    it is consulted before the source's inputs, outputs and value_info.
    """
    g = model.graph
    producer = {name: i for i, node in enumerate(g.node) for name in node.output if name}
    inits = {t.name: t for t in g.initializer}
    source_inputs = [vi.name for vi in g.input]
    infos: dict[str, onnx.ValueInfoProto] = {}
    for vi in list(g.value_info) + list(g.output) + list(g.input):
        infos[vi.name] = vi
    infos.update(value_info or {})

    cut = set(inputs)
    kept: set[int] = set()
    used: set[str] = set()
    stack = list(reversed(outputs))
    while stack:
        name = stack.pop()
        if not name or name in used:
            continue
        used.add(name)
        if name in cut or name in inits:
            continue
        if name in producer:
            i = producer[name]
            if i not in kept:
                kept.add(i)
                node = g.node[i]
                stack.extend(reversed(list(node.input) + _subgraph_names(node)))
        elif name not in source_inputs:
            raise ValueError(f"submodel: tensor {name!r} is neither produced by a node, an "
                             f"initializer, nor a graph input")

    def info(name: str) -> onnx.ValueInfoProto:
        if name in infos:
            return infos[name]
        if name in inits:
            t = inits[name]
            return helper.make_tensor_value_info(name, t.data_type, list(t.dims))
        raise ValueError(f"submodel: no ValueInfo for {name!r}; pass it in value_info")

    graph_inputs = [name for name in inputs if name in used]
    graph_inputs += [name for name in source_inputs
                     if name in used and name not in cut and name not in inits]
    nodes = [node for i, node in enumerate(g.node) if i in kept]
    produced = {name for node in nodes for name in node.output} - set(outputs)
    graph = helper.make_graph(
        nodes, f"{g.name}/{doc}" if doc else g.name,
        [info(name) for name in graph_inputs], [info(name) for name in outputs],
        initializer=[t for t in g.initializer if t.name in used and t.name not in cut],
        doc_string=doc or g.doc_string,
        value_info=[vi for vi in g.value_info
                    if vi.name in produced])

    sub = onnx.ModelProto()
    sub.ir_version = model.ir_version
    sub.opset_import.extend(model.opset_import)
    sub.producer_name = model.producer_name
    sub.producer_version = model.producer_version
    sub.domain = model.domain
    sub.model_version = model.model_version
    sub.doc_string = model.doc_string
    sub.metadata_props.extend(model.metadata_props)
    sub.functions.extend(model.functions)
    sub.graph.CopyFrom(graph)
    return sub
