"""The IR: Value, Param, Node, Graph.

Plain, mutable, explicitly typed. A ``Graph`` holds its inputs, outputs, nodes in
topological order, params by name and a ``meta`` dict for the model config. Values have
identity semantics; names are deterministic (the builder's hint, suffixed ``_N`` on
collision). Use lists are kept on each value so rewrites are cheap.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np

from irc import dims, limits
from irc.dtypes import DType, Sized


def fresh_name(hint: str, taken: set) -> str:
    """``hint`` if not in ``taken``, else ``hint_1``, ``hint_2``, ...; the name is added to
    ``taken``. The one naming rule for graphs and the names backends give their values."""
    name, n = hint, 0
    while name in taken:
        n += 1
        name = f"{hint}_{n}"
    taken.add(name)
    return name


class Value:
    """An SSA value: a tensor with a dtype and a (possibly symbolic) shape."""

    __slots__ = ("name", "dtype", "shape", "producer", "uses")

    def __init__(self, name: str, dtype: DType, shape: Iterable[dims.Dim]):
        self.name = name
        self.dtype = dtype
        self.shape = tuple(dims.canonical(d) for d in shape)
        self.producer: Optional[Node] = None
        self.uses: list[Node] = []  # one entry per input slot that reads this value

    @property
    def rank(self) -> int:
        return len(self.shape)

    def type_str(self) -> str:
        return f"{self.dtype}{dims.format_shape(self.shape)}"

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type_str()}"


class Param(Value, Sized):
    """A named weight (``layers.3.attn.wq``).

    ``data`` is present (a NumPy array), lazy (an object with ``load() -> ndarray``, such
    as a seeded initializer or a safetensors slice) or absent (``None``: a shape-only
    compile). Nothing here allocates a weight that was not asked for.
    """

    __slots__ = ("data",)

    def __init__(self, name: str, dtype: DType, shape: Iterable[int], data: Any = None):
        super().__init__(name, dtype, shape)
        for d in self.shape:
            if not isinstance(d, int):
                raise ValueError(f"param @{name} has a symbolic dimension {d!r}")
        self.data = data

    def array(self) -> Optional[np.ndarray]:
        """The weight as an array: present data as is, lazy data loaded, absent -> None."""
        if self.data is None or isinstance(self.data, np.ndarray):
            return self.data
        return self.data.load()

    def __repr__(self) -> str:
        return f"@{self.name}: {self.type_str()}"


class Node:
    """One operation: ``op`` over ``inputs`` (values, params, or None for an omitted
    optional operand) producing ``outputs``, with JSON-able ``attrs``."""

    __slots__ = ("op", "inputs", "outputs", "attrs", "origin")

    def __init__(self, op: str, inputs: list, outputs: list[Value], attrs: dict, origin: Optional[str] = None):
        self.op = op
        self.inputs: list[Optional[Value]] = list(inputs)
        self.outputs = list(outputs)
        self.attrs = dict(attrs)
        self.origin = origin  # where the spec asked for it: "spec.yaml:12", a DSL call site
        for v in self.inputs:
            if v is not None:
                v.uses.append(self)
        for v in self.outputs:
            v.producer = self

    @property
    def name(self) -> str:
        """A node is named after its first output."""
        return self.outputs[0].name if self.outputs else f"<{self.op}>"

    def set_input(self, index: int, value: Optional[Value]) -> None:
        old = self.inputs[index]
        if old is not None:
            old.uses.remove(self)
        self.inputs[index] = value
        if value is not None:
            value.uses.append(self)

    def __repr__(self) -> str:
        return f"<Node {self.op} -> %{self.name}>"


def _check_size(name: str, shape) -> None:
    """A graph input or param must stay within ``irc.limits`` (its elements, each dimension)."""
    try:
        limits.check_tensor(shape)
    except limits.LimitError as err:
        err.message = f"{name} {list(shape)}: {err.message}"
        raise


class Graph:
    def __init__(self, name: str):
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.nodes: list[Node] = []
        self.params: dict[str, Param] = {}
        self.meta: dict[str, Any] = {}
        # graphs compiled beside this one, by role: a VLM decoder's "vision" model
        self.parts: dict[str, "Graph"] = {}
        self._names: set[str] = set()

    # ---- names -------------------------------------------------------------------
    def unique_name(self, hint: str) -> str:
        """``hint`` if free, else ``hint_1``, ``hint_2``, ... (deterministic)."""
        return fresh_name(hint, self._names)

    def rename(self, value: Value, name: str) -> None:
        """Give ``value`` the exact ``name`` (freed by a removed value, say)."""
        if name == value.name:
            return
        self._claim(name)
        self._names.discard(value.name)
        value.name = name

    def new_value(self, hint: str, dtype: DType, shape) -> Value:
        return Value(self.unique_name(hint), dtype, shape)

    # ---- building ----------------------------------------------------------------
    def add_input(self, name: str, dtype: DType, shape) -> Value:
        _check_size(name, shape)
        value = Value(self._claim(name), dtype, shape)
        self.inputs.append(value)
        return value

    def add_param(self, name: str, dtype: DType, shape, data: Any = None) -> Param:
        if name in self.params:
            raise ValueError(f"duplicate param @{name}")
        _check_size("@" + name, shape)
        param = Param(name, dtype, shape, data)
        self.params[name] = param
        return param

    def add_node(self, node: Node, before: Optional[Node] = None) -> Node:
        """Append ``node`` (or insert it before ``before``)."""
        if before is None:
            self.nodes.append(node)
        else:
            self.nodes.insert(self.nodes.index(before), node)
        return node

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"duplicate value name %{name}")
        self._names.add(name)
        return name

    def new_named_value(self, name: str, dtype: DType, shape) -> Value:
        """A value with exactly ``name`` (the parser's); a duplicate raises ValueError."""
        return Value(self._claim(name), dtype, shape)

    # ---- queries -----------------------------------------------------------------
    def users(self, value: Value) -> list[Node]:
        """Distinct nodes reading ``value``, in graph order of first use."""
        seen: dict[int, Node] = {}
        for node in value.uses:
            seen.setdefault(id(node), node)
        return list(seen.values())

    def values(self) -> Iterable[Value]:
        yield from self.inputs
        for node in self.nodes:
            yield from node.outputs

    # ---- rewriting ---------------------------------------------------------------
    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Point every reader of ``old`` (nodes and graph outputs) at ``new``."""
        for node in list(old.uses):
            for i, v in enumerate(node.inputs):
                if v is old:
                    node.set_input(i, new)
        self.outputs = [new if v is old else v for v in self.outputs]

    def remove(self, node: Node) -> None:
        """Delete ``node``; its outputs must be unused."""
        for out in node.outputs:
            if out.uses or out in self.outputs:
                raise ValueError(f"cannot remove {node}: %{out.name} is still used")
        for i in range(len(node.inputs)):
            node.set_input(i, None)
        self.nodes.remove(node)
        for out in node.outputs:
            self._names.discard(out.name)
            out.producer = None

    def remove_unused_params(self) -> list[str]:
        used = {v.name for n in self.nodes for v in n.inputs if isinstance(v, Param)}
        dropped = [name for name in self.params if name not in used]
        for name in dropped:
            del self.params[name]
        return dropped

    # ---- copies ------------------------------------------------------------------
    def clone(self) -> "Graph":
        """A deep copy of the structure; param data is shared, not copied."""
        other = Graph(self.name)
        other.meta = plain_copy(self.meta)
        other.parts = dict(self.parts)
        other._names = set(self._names)
        mapping: dict[int, Value] = {}
        for name, p in self.params.items():
            q = Param(p.name, p.dtype, p.shape, p.data)
            other.params[name] = q
            mapping[id(p)] = q
        for v in self.inputs:
            w = Value(v.name, v.dtype, v.shape)
            other.inputs.append(w)
            mapping[id(v)] = w
        for node in self.nodes:
            outs = [Value(v.name, v.dtype, v.shape) for v in node.outputs]
            for v, w in zip(node.outputs, outs):
                mapping[id(v)] = w
            ins = [None if v is None else mapping[id(v)] for v in node.inputs]
            other.nodes.append(Node(node.op, ins, outs, plain_copy(node.attrs), node.origin))
        other.outputs = [mapping[id(v)] for v in self.outputs]
        return other

    def __repr__(self) -> str:
        return f"<Graph {self.name}: {len(self.nodes)} nodes, {len(self.params)} params>"


def plain_copy(value: Any) -> Any:
    """A copy made of plain dicts and lists (attrs, meta, YAML read with locations); other
    values shared."""
    if isinstance(value, dict):
        return {k: plain_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_copy(v) for v in value]
    return value

