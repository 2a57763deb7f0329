"""Graphviz DOT text for a graph: one box per node (op and result type), params as notes.

Plain text, deterministic, no Graphviz needed to write it. Layers are grouped into
clusters (``layers.N.*`` names) so large graphs stay legible when rendered.
"""
from __future__ import annotations

from irc.analysis import layer_of
from irc.graph import Graph, Param


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def graph_to_dot(graph: Graph) -> str:
    lines = [f"digraph {_quote(graph.name)} {{", "  rankdir=TB;", "  node [shape=box, fontname=monospace];"]
    ids: dict[str, str] = {}
    for i, value in enumerate(graph.inputs):
        ids[value.name] = f"in{i}"
        lines.append(f"  in{i} [shape=ellipse, label={_quote(value.name + ': ' + value.type_str())}];")
    clusters: dict[object, list[str]] = {}
    for i, node in enumerate(graph.nodes):
        nid = f"n{i}"
        for value in node.outputs:
            ids[value.name] = nid
        params = [v.name for v in node.inputs if isinstance(v, Param)]
        label = f"{node.op}\\n" + "\\n".join(v.type_str() for v in node.outputs)
        if params:
            label += "\\n" + "\\n".join("@" + p for p in params)
        clusters.setdefault(layer_of(node.name), []).append(f"{nid} [label={_quote(label)}];")
    for layer, entries in clusters.items():
        if layer is None:
            lines.extend("  " + e for e in entries)
        else:
            lines.append(f"  subgraph cluster_layer{layer} {{ label={_quote(f'layer {layer}')};")
            lines.extend("    " + e for e in entries)
            lines.append("  }")
    for i, node in enumerate(graph.nodes):
        for value in node.inputs:
            if value is not None and not isinstance(value, Param) and value.name in ids:
                lines.append(f"  {ids[value.name]} -> n{i};")
    for i, value in enumerate(graph.outputs):
        lines.append(f"  out{i} [shape=ellipse, label={_quote(value.name)}];")
        lines.append(f"  {ids.get(value.name, 'in0')} -> out{i};")
    lines.append("}")
    return "\n".join(lines) + "\n"
