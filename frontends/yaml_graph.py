"""The YAML explicit graph form: values, params and nodes spelled out.

    graph:
      name: tiny-mlp                            # required
      meta: {d_model: 64}                       # optional, copied to graph.meta
      inputs:                                   # graph inputs, in order
        - {name: x, dtype: f32, shape: [B, T, 64]}
      params:                                   # weights (data absent)
        - {name: w, dtype: f32, shape: [64, 64]}
      nodes:                                    # in order; a name is used after it is made
        - {op: linear, inputs: [x, "@w"], outputs: [h0]}
        - repeat:                               # a layer stack
            count: 2
            params: [{name: "layers.{i}.w", dtype: f32, shape: [64, 64]}]
            nodes:
              - {op: linear, inputs: ["h{i}", "@layers.{i}.w"], outputs: ["h{i+1}"]}
            # inputs: [...] and outputs: [...] may repeat too (per-layer caches)
        - {op: softcap, inputs: [h2], attrs: {cap: 30.0}, outputs: [y]}
      outputs: [y]

Node ``inputs`` name values, ``@name`` params, or ``null`` for an omitted optional
operand; ``attrs`` are the op's attributes (defaults filled in); ``outputs`` name every
result of the op. Inside ``repeat`` every string has ``{i}``, ``{i+1}``, ``{i-1}``, ...
replaced by the iteration index (0 to count-1); repeats do not nest.

Every mistake (unknown op or key, undefined or duplicate name, a use before its
definition, wrong types, shape errors from inference) is a SpecError at the offending
key's file:line:col, the message starting with its key path. Node origins are the
``file:line`` of the node's entry.
"""
from __future__ import annotations

import difflib
import re
from typing import Any, Optional

from irc import yamlloc
from irc.yamlloc import Fields, LocDict, LocList, Loc, string
from irc import build, dims, limits, ops
from irc.dtypes import DType
from irc.errors import ShapeError, SpecError
from irc.graph import Graph, Value

GRAPH_KEYS = ("name", "meta", "inputs", "params", "nodes", "outputs")
TENSOR_KEYS = ("name", "dtype", "shape")
NODE_KEYS = ("op", "inputs", "attrs", "outputs")
REPEAT_KEYS = ("count", "inputs", "params", "nodes", "outputs")
_PLACEHOLDER = re.compile(r"\{i(?:([+-])(\d+))?\}")


def loads(text: str, filename: str = "<string>") -> Graph:
    return build_graph(yamlloc.loads(text, filename), filename)


def load(path) -> Graph:
    return build_graph(yamlloc.load_file(path), str(path))


def substitute(value: Any, i: int) -> Any:
    """``value`` with ``{i}``, ``{i+K}``, ``{i-K}`` in every string replaced; locations kept."""
    if isinstance(value, str):
        return _PLACEHOLDER.sub(lambda m: str(i + (int(m.group(2)) * (1 if m.group(1) == "+" else -1)
                                                   if m.group(1) else 0)), value)
    if isinstance(value, dict):
        out = LocDict((k, substitute(v, i)) for k, v in value.items())
        for attr in ("loc", "key_locs", "value_locs"):
            if hasattr(value, attr):
                setattr(out, attr, getattr(value, attr))
        return out
    if isinstance(value, list):
        out = LocList(substitute(v, i) for v in value)
        for attr in ("loc", "item_locs"):
            if hasattr(value, attr):
                setattr(out, attr, getattr(value, attr))
        return out
    return value


class _Entry:
    """One list item to build: its Fields and, inside a repeat, the iteration index."""

    def __init__(self, fields: Fields, index: Optional[int]):
        self.fields, self.index = fields, index

    def error(self, key, message: str, hint: Optional[str] = None) -> SpecError:
        err = self.fields.error(key, message, hint)
        if self.index is not None:
            err.message += f" (repeat i={self.index})"
        return err


def _list(container: Fields, key: str) -> list:
    items = container.data.get(key)
    if items is None:
        return []
    if not isinstance(items, list):
        raise container.error(key, f"expected a list, got {yamlloc.plain(items)!r}")
    return items


def _repeat(item: dict, path: str) -> tuple[Fields, int]:
    body = Fields(item, path, ("repeat",)).sub("repeat", REPEAT_KEYS, required=True)
    count = body.get("count", yamlloc.positive_int)
    nodes = body.data.get("nodes")
    try:  # before anything is expanded (irc.limits)
        limits.check_layers(count)
        limits.check_nodes(count * (len(nodes) if isinstance(nodes, list) else 1))
    except limits.LimitError as err:
        raise body.error("count", err.message, hint=err.hint) from None
    return body, count


def _is_repeat(item) -> bool:
    return isinstance(item, dict) and "repeat" in item


def _scopes(g: Fields):
    """(container, index): the graph itself (index None), then each repeat iteration."""
    yield g, None
    for k, item in enumerate(_list(g, "nodes")):
        if _is_repeat(item):
            body, count = _repeat(item, f"{g.path}.nodes[{k}]")
            for i in range(count):
                yield body, i


def _entry(items: list, k: int, path: str, index: Optional[int], allowed) -> _Entry:
    """Item ``k`` of ``items`` as an entry (a repeat body's substituted for ``index``)."""
    item, loc = items[k], yamlloc.where(items, k)
    if _is_repeat(item):
        raise SpecError(f"{path}.repeat: repeats do not nest", location=str(yamlloc.where(item, "repeat")))
    if not isinstance(item, dict):
        raise SpecError(f"{path}: expected a mapping, got {yamlloc.plain(item)!r}", location=str(loc))
    if index is not None:
        item = substitute(item, index)
    return _Entry(Fields(item, path, allowed, parent_loc=loc), index)


def _entries(container: Fields, key: str, index: Optional[int], allowed) -> list[_Entry]:
    items = _list(container, key)
    return [_entry(items, k, f"{container.path}.{key}[{k}]", index, allowed) for k in range(len(items))]


def _node_entries(g: Fields) -> list[_Entry]:
    """Nodes in order, each repeat expanded where it stands."""
    out, items = [], _list(g, "nodes")
    for k, item in enumerate(items):
        if _is_repeat(item):
            body, count = _repeat(item, f"{g.path}.nodes[{k}]")
            for i in range(count):
                out += _entries(body, "nodes", i, NODE_KEYS)
        else:
            out.append(_entry(items, k, f"{g.path}.nodes[{k}]", None, NODE_KEYS))
    return out


def _graph_outputs(g: Fields) -> list[tuple[Any, Loc, str]]:
    """(name, loc, key path) of the graph outputs: top level, then each repeat iteration."""
    found = []
    for container, index in _scopes(g):
        names = _list(container, "outputs")
        for k, name in enumerate(names):
            value = name if index is None else substitute(name, index)
            found.append((value, yamlloc.where(names, k), f"{container.path}.outputs[{k}]"))
    return found


def _dim(value):
    if isinstance(value, bool):
        raise yamlloc.Bad(f"expected a dimension, got {value!r}")
    try:
        return dims.canonical(value)
    except ValueError as err:
        raise yamlloc.Bad(str(err)) from None


def _dtype(value) -> DType:
    try:
        return DType.parse(value)
    except (ValueError, TypeError):
        raise yamlloc.Bad(f"expected a dtype ({', '.join(d.text for d in DType)}), got {value!r}") from None


def build_graph(data, filename: str) -> Graph:
    """The graph of a parsed graph-form spec (``{"graph": {...}}``)."""
    root = Fields(data, "", ("graph",), parent_loc=Loc(filename, 1, 1))
    g = root.sub("graph", GRAPH_KEYS, required=True)
    graph = Graph(g.get("name", string))
    meta = g.data.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise g.error("meta", "expected a mapping")
    graph.meta = yamlloc.plain(meta or {})
    values: dict[str, Value] = {}
    for container, index in _scopes(g):
        for entry in _entries(container, "inputs", index, TENSOR_KEYS):
            _add_input(graph, entry, values)
    for container, index in _scopes(g):
        for entry in _entries(container, "params", index, TENSOR_KEYS):
            _add_param(graph, entry)
    nodes = _node_entries(g)
    made_at = {}
    for entry in nodes:
        outputs = entry.fields.data.get("outputs")  # checked, with its location, when the node is added
        for k, name in enumerate(outputs if isinstance(outputs, list) else []):
            if isinstance(name, str):
                made_at.setdefault(name, yamlloc.where(entry.fields.data["outputs"], k))
    for entry in nodes:
        _add_node(graph, entry, values, made_at)
    outputs = []
    for name, loc, path in _graph_outputs(g):
        if not isinstance(name, str) or name not in values:
            raise SpecError(f"{path}: undefined value {name!r}", location=str(loc))
        outputs.append(values[name])
    graph.outputs = outputs
    return graph


def _add_input(graph: Graph, entry: _Entry, values: dict) -> None:
    f = entry.fields
    name = f.get("name", string)
    dtype = f.get("dtype", _dtype)
    shape = f.items("shape", _dim, required=True)
    if name in values:
        raise entry.error("name", f"duplicate name {name!r}")
    try:
        values[name] = graph.add_input(name, dtype, shape)
    except limits.LimitError as err:
        raise entry.error("shape", err.message, hint=err.hint) from None


def _add_param(graph: Graph, entry: _Entry) -> None:
    f = entry.fields
    name = f.get("name", string).lstrip("@")
    dtype = f.get("dtype", _dtype)
    shape = f.items("shape", yamlloc.non_negative_int, required=True)
    if name in graph.params:
        raise entry.error("name", f"duplicate param @{name}")
    try:
        graph.add_param(name, dtype, shape)
    except limits.LimitError as err:
        raise entry.error("shape", err.message, hint=err.hint) from None


def _add_node(graph: Graph, entry: _Entry, values: dict, made_at: dict) -> None:
    f = entry.fields
    op = f.get("op", string)
    if op not in ops.OPS:
        close = difflib.get_close_matches(op, list(ops.OPS), n=1)
        raise entry.error("op", f"unknown op {op!r}", hint=f"did you mean {close[0]!r}?" if close else None)
    if f.data.get("inputs") is not None and not isinstance(f.data["inputs"], list):
        raise entry.error("inputs", "expected a list of value names, @params or null")
    inputs = []
    for k, ref in enumerate(f.data.get("inputs") or []):
        inputs.append(_resolve(graph, entry, ref, k, values, made_at))
    attrs = f.data.get("attrs")
    if attrs is not None and not isinstance(attrs, dict):
        raise entry.error("attrs", "expected a mapping")
    try:
        attrs = ops.get_op(op).normalize_attrs(yamlloc.plain(attrs))
    except ShapeError as err:
        raise entry.error("attrs", err.message) from None
    names = f.items("outputs", string, required=True)
    if not names:
        raise entry.error("outputs", "name at least one output")
    for k, name in enumerate(names):
        if name in values or names.index(name) != k:
            loc = yamlloc.where(f.data["outputs"], k)
            suffix = f" (repeat i={entry.index})" if entry.index is not None else ""
            raise SpecError(f"{f.path}.outputs[{k}]: duplicate name {name!r}{suffix}", location=str(loc))
    try:
        outs = build.emit(graph, op, inputs, attrs, names, origin=f.origin())
    except ShapeError as err:
        raise entry.error("op", err.message, hint=err.hint) from None
    if len(outs) != len(names):
        raise entry.error("outputs", f"{op} makes {len(outs)} outputs, {len(names)} named")
    values.update(zip(names, outs))


def _resolve(graph: Graph, entry: _Entry, ref, k: int, values: dict, made_at: dict) -> Optional[Value]:
    f = entry.fields
    loc = yamlloc.where(f.data["inputs"], k)
    path = f"{f.path}.inputs[{k}]"
    suffix = f" (repeat i={entry.index})" if entry.index is not None else ""
    if ref is None:
        return None
    if not isinstance(ref, str):
        raise SpecError(f"{path}: expected a value name, @param or null, got {ref!r}{suffix}", location=str(loc))
    if ref.startswith("@"):
        if ref[1:] not in graph.params:
            raise SpecError(f"{path}: undefined param {ref}{suffix}", location=str(loc))
        return graph.params[ref[1:]]
    if ref in values:
        return values[ref]
    if ref in made_at:
        later = made_at[ref]
        raise SpecError(f"{path}: {ref!r} is used before it is made (line {later.line}){suffix}",
                        location=str(loc), hint="nodes run in order; a value cannot feed the node that makes it")
    close = difflib.get_close_matches(ref, list(values), n=1)
    raise SpecError(f"{path}: undefined value {ref!r}{suffix}", location=str(loc),
                    hint=f"did you mean {close[0]!r}?" if close else None)
