"""Reads the text form that ``irc.printer`` writes (round trip is exact)."""
from __future__ import annotations

import json
import re

from irc import dims
from irc.dtypes import DType
from irc.errors import ParseError, ShapeError
from irc.graph import Graph, Node, Value
from irc.inputs import read_text
from irc.limits import LimitError, current as current_limits
from irc.ops import get_op

_HEADER = re.compile(r"graph ([A-Za-z0-9_.\-]+)\((.*)\) -> \((.*)\) \{\Z")
_NAME = r"[A-Za-z0-9_.\-]+"
_TYPED = re.compile(rf"%({_NAME}): (\w+)\[([^\]]*)\]\Z")
_TYPE = re.compile(r"(\w+)\[([^\]]*)\]\Z")
_PARAM = re.compile(rf"param @({_NAME}): (\w+)\[([^\]]*)\]\Z")
_DECODER = json.JSONDecoder()


class _Line:
    def __init__(self, text: str, number: int, source: str):
        self.text, self.number, self.source = text, number, source

    def error(self, message: str) -> ParseError:
        return ParseError(message, location=f"{self.source}:{self.number}")


def _type(line: _Line, dtype: str, shape: str):
    try:
        return DType.parse(dtype), tuple(dims.parse_dim(d) for d in shape.split(",") if d.strip())
    except ValueError as err:
        raise line.error(str(err)) from None


def _split_top(text: str) -> list[str]:
    """Split on ', ' outside brackets (types contain commas inside [...])."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


def _parse_attrs(line: _Line, text: str, pos: int) -> tuple[dict, int]:
    attrs, pos = {}, pos + 1  # after "{"
    while True:
        end = text.index("=", pos) if "=" in text[pos:] else -1
        if end < 0:
            raise line.error("unterminated attributes")
        key = text[pos:end].strip()
        try:
            value, pos = _DECODER.raw_decode(text, end + 1)
        except json.JSONDecodeError as err:
            raise line.error(f"attribute {key!r}: {err.msg}") from None
        attrs[key] = value
        if text.startswith(", ", pos):
            pos += 2
        elif text.startswith("}", pos):
            return attrs, pos + 1
        else:
            raise line.error(f"expected ',' or '}}' after attribute {key!r}")


def read_graph(path: str) -> Graph:
    """The graph in the ``.ir`` file ``path``; unreadable or non-UTF-8 files are ParseErrors."""
    return parse_graph(read_text(path, ParseError), source=path)


def parse_graph(text: str, source: str = "<text>") -> Graph:
    lines = [_Line(t.strip(), i + 1, source) for i, t in enumerate(text.splitlines())]
    lines = [ln for ln in lines if ln.text and not ln.text.startswith("#")]
    if not lines:
        raise ParseError("empty input", location=source)
    header = _HEADER.match(lines[0].text)
    if not header:
        raise lines[0].error("expected 'graph NAME(%in: type, ...) -> (%out: type, ...) {'")
    graph = Graph(header.group(1))
    env: dict[str, Value] = {}
    for item in _split_top(header.group(2)):
        m = _TYPED.match(item)
        if not m:
            raise lines[0].error(f"bad input declaration {item!r}")
        dtype, shape = _type(lines[0], m.group(2), m.group(3))
        env[m.group(1)] = _claim(graph, lines[0], graph.add_input, m.group(1), dtype, shape)
    declared_outputs = []
    for item in _split_top(header.group(3)):
        m = _TYPED.match(item)
        if not m:
            raise lines[0].error(f"bad output declaration {item!r}")
        declared_outputs.append((m.group(1), _type(lines[0], m.group(2), m.group(3))))

    body = lines[1:]
    if not body or body[-1].text != "}":
        raise (body[-1] if body else lines[0]).error("missing closing '}'")
    returned = None
    for line in body[:-1]:
        t = line.text
        if t.startswith("meta "):
            graph.meta = _meta(line, t[5:])
        elif t.startswith("param "):
            m = _PARAM.match(t)
            if not m:
                raise line.error("expected 'param @name: dtype[dims]'")
            dtype, shape = _type(line, m.group(2), m.group(3))
            try:
                graph.add_param(m.group(1), dtype, shape)
            except (ValueError, LimitError) as err:
                raise line.error(str(err)) from None
        elif t.startswith("return"):
            returned = [_lookup(graph, env, line, name) for name in _split_top(t[len("return"):])]
        else:
            _parse_node(graph, env, line)
    if returned is None:
        raise body[-1].error("missing 'return'")
    graph.outputs = returned
    for value, (name, (dtype, shape)) in zip(returned, declared_outputs):
        if value.name != name or value.dtype != dtype or value.shape != shape:
            raise lines[0].error(f"declared output %{name} does not match the returned %{value.name}")
    if len(returned) != len(declared_outputs):
        raise lines[0].error("the return list and the declared outputs differ in length")
    return graph


def _meta(line: _Line, text: str) -> dict:
    """The ``meta`` JSON object, its entries the analyses and backends read checked by type."""
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as err:
        raise line.error(f"meta: {err.msg}") from None
    except (ValueError, RecursionError):  # an integer of thousands of digits, runaway nesting
        raise line.error("meta: a value out of range or nested too deeply") from None
    if not isinstance(meta, dict):
        raise line.error("meta: expected a JSON object")
    for key, allowed in META_KINDS.items():
        if meta.get(key) is not None and not allowed(meta[key]):
            raise line.error(f"meta: {key} {json.dumps(meta[key])[:60]} is not {allowed.__doc__}")
    rope = meta.get("rope") or {}
    if rope.get("base") is not None and not _positive_number(rope["base"]):
        raise line.error("meta: rope.base must be a positive number")
    return meta


def _count(value) -> bool:
    """a non-negative integer within irc's size limits"""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= current_limits().dim


def _layers(value) -> bool:
    """a layer count within irc's limits"""
    return _count(value) and value <= current_limits().layers


def _positive_number(value) -> bool:
    """a positive number"""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def _number(value) -> bool:
    """a number"""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < float("inf")


def _mapping(value) -> bool:
    """a JSON object"""
    return isinstance(value, dict)


def _dtype(value) -> bool:
    """a dtype"""
    try:
        DType.parse(value)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


def _token_ids(value) -> bool:
    """a token id or a list of them"""
    return _count(value) or (isinstance(value, list) and all(_count(v) for v in value))


META_KINDS = {"vocab_size": _count, "d_model": _count, "n_layers": _layers, "n_heads": _count, "n_kv_heads": _count,
              "head_dim": _count, "max_positions": _count, "dtype": _dtype, "norm_offset": _number, "rope": _mapping,
              "generation": _mapping, "eos_token_id": _token_ids, "bos_token_id": _token_ids}


def _claim(graph, line, add, name, *args):
    try:
        return add(name, *args)
    except (ValueError, LimitError) as err:
        raise line.error(str(err)) from None


def _lookup(graph: Graph, env: dict, line: _Line, token: str):
    if token == "_":
        return None
    if token.startswith("@"):
        if token[1:] not in graph.params:
            raise line.error(f"unknown param {token}")
        return graph.params[token[1:]]
    if not token.startswith("%") or token[1:] not in env:
        raise line.error(f"unknown value {token}")
    return env[token[1:]]


def _parse_node(graph: Graph, env: dict, line: _Line) -> None:
    t = line.text
    if " = " not in t:
        raise line.error("expected '%out = op operands : type'")
    lhs, rest = t.split(" = ", 1)
    names = [n.strip() for n in lhs.split(",")]
    if not all(n.startswith("%") for n in names):
        raise line.error("results must be %names")
    op, _, rest = rest.partition(" ")
    try:
        opdef = get_op(op)
    except ShapeError as err:
        raise line.error(err.message) from None
    # operands run until " {" (attributes) or " : " (types)
    stop = len(rest)
    for marker in ("{", ": "):
        i = rest.find(marker)
        if i >= 0:
            stop = min(stop, i)
    operand_text, pos = rest[:stop].strip(), stop
    inputs = [_lookup(graph, env, line, tok) for tok in _split_top(operand_text)]
    attrs = {}
    if rest.startswith("{", pos):
        attrs, pos = _parse_attrs(line, rest, pos)
    rest = rest[pos:].strip()
    if not rest.startswith(":"):
        raise line.error("expected ': type' after the operands")
    types = []
    for item in _split_top(rest[1:]):
        m = _TYPE.match(item)
        if not m:
            raise line.error(f"bad result type {item!r}")
        types.append(_type(line, m.group(1), m.group(2)))
    if len(types) != len(names):
        raise line.error(f"{len(names)} results but {len(types)} types")
    try:
        attrs = opdef.normalize_attrs(attrs)
    except ShapeError as err:
        raise line.error(err.message) from None
    outputs = []
    for name, (dtype, shape) in zip(names, types):
        outputs.append(_claim(graph, line, graph.new_named_value, name[1:], dtype, shape))
    for v in outputs:
        env[v.name] = v
    graph.nodes.append(Node(op, inputs, outputs, attrs, origin=f"{line.source}:{line.number}"))
