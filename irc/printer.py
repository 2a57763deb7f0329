"""The text form: one line per node, SSA names, sorted attributes, result types.

```
graph tiny(%input_ids: i64[B,T]) -> (%logits: f32[B,T,256]) {
  meta {"d_model": 64}
  param @embed: f32[256,64]
  %x = embedding %input_ids, @embed : f32[B,T,64]
  %h = rms_norm %x, @layers.0.attn_norm {eps=1e-05} : f32[B,T,64]
  return %logits
}
```
Attributes equal to the op's default are left out; an omitted optional operand prints as
``_``. ``irc.parser.parse_graph`` reads exactly this back.
"""
from __future__ import annotations

import json

from irc.graph import Graph, Node, Param, Value
from irc.ops import REQUIRED, get_op


def attr_value(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "))


def _is_default(value, default) -> bool:
    return default is not REQUIRED and type(value) is type(default) and value == default


def format_attrs(node: Node) -> str:
    spec = get_op(node.op).attrs
    shown = [f"{k}={attr_value(v)}" for k, v in sorted(node.attrs.items())
             if not (k in spec and _is_default(v, spec[k]))]
    return " {" + ", ".join(shown) + "}" if shown else ""


def operand(value) -> str:
    if value is None:
        return "_"
    return f"@{value.name}" if isinstance(value, Param) else f"%{value.name}"


def format_node(node: Node) -> str:
    lhs = ", ".join(f"%{v.name}" for v in node.outputs)
    args = ", ".join(operand(v) for v in node.inputs)
    types = ", ".join(v.type_str() for v in node.outputs)
    return f"{lhs} = {node.op}{' ' + args if args else ''}{format_attrs(node)} : {types}"


def _signature(values: list[Value]) -> str:
    return ", ".join(f"%{v.name}: {v.type_str()}" for v in values)


def print_graph(graph: Graph) -> str:
    lines = [f"graph {graph.name}({_signature(graph.inputs)}) -> ({_signature(graph.outputs)}) {{"]
    if graph.meta:
        lines.append(f"  meta {attr_value(graph.meta)}")
    for name in sorted(graph.params):
        lines.append(f"  param @{name}: {graph.params[name].type_str()}")
    lines.extend("  " + format_node(node) for node in graph.nodes)
    lines.append("  return " + ", ".join(f"%{v.name}" for v in graph.outputs))
    lines.append("}")
    return "\n".join(lines) + "\n"
