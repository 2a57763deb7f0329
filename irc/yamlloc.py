"""YAML that remembers where everything came from.

``LocatingSafeLoader`` is a ``yaml.SafeLoader`` subclass (safe loading only: no Python
tags) that builds mappings as ``LocDict`` and sequences as ``LocList``; both remember the
``Loc`` (file:line:column, 1-based) of themselves, of every key and of every value or
item. It refuses duplicate keys (plain PyYAML keeps the last silently) and reads
``1e-5`` as a float (YAML 1.1 needs ``1.0e-5``; model cards write both).

``Fields`` gives typed, located access to one mapping: every mistake becomes a
``SpecError`` whose location is the offending key and whose message starts with the key
path (``model.attention.n_kv_heads: ...``). Both YAML frontends use it.
"""
from __future__ import annotations

import difflib
import math
import re
from typing import Any, Callable, NamedTuple, Optional

import yaml

from irc import limits
from irc.errors import SpecError
from irc.graph import plain_copy as plain


class Loc(NamedTuple):
    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    @property
    def short(self) -> str:
        """``file:line``, the form node origins take."""
        return f"{self.file}:{self.line}"


class LocDict(dict):
    """A mapping with ``loc`` (where it starts), ``key_locs`` and ``value_locs``."""

    loc: Loc
    key_locs: dict
    value_locs: dict


class LocList(list):
    """A sequence with ``loc`` (where it starts) and ``item_locs``."""

    loc: Loc
    item_locs: list


MAX_DEPTH = 64  # levels of nesting; a spec uses four or five
_FLOAT_WITHOUT_DOT = re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$")


class LocatingSafeLoader(yaml.SafeLoader):
    """SafeLoader whose mappings and sequences carry their source locations."""

    def __init__(self, stream, filename: str):
        super().__init__(stream)
        self.filename = filename
        self.depth = 0

    def compose_node(self, parent, index):
        """Refuse runaway nesting at once (PyYAML recurses once per level)."""
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_DEPTH} levels deep",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def loc(self, mark) -> Loc:
        return Loc(self.filename, mark.line + 1, mark.column + 1)

    def construct_located_mapping(self, node):
        data = LocDict()
        data.loc, data.key_locs, data.value_locs = self.loc(node.start_mark), {}, {}
        yield data
        self.flatten_mapping(node)
        for key_node, value_node in node.value:
            key = self.construct_object(key_node)
            where = self.loc(key_node.start_mark)
            try:
                hash(key)
            except TypeError:
                raise SpecError("a mapping key must be a plain value", location=str(where)) from None
            if key in data:
                first = data.key_locs[key]
                raise SpecError(f"duplicate key {key!r} (first at line {first.line})", location=str(where))
            data[key] = self.construct_object(value_node)
            data.key_locs[key] = where
            data.value_locs[key] = self.loc(value_node.start_mark)

    def construct_located_sequence(self, node):
        data = LocList()
        data.loc, data.item_locs = self.loc(node.start_mark), []
        yield data
        for child in node.value:
            data.append(self.construct_object(child))
            data.item_locs.append(self.loc(child.start_mark))


LocatingSafeLoader.add_constructor("tag:yaml.org,2002:map", LocatingSafeLoader.construct_located_mapping)
LocatingSafeLoader.add_constructor("tag:yaml.org,2002:seq", LocatingSafeLoader.construct_located_sequence)
LocatingSafeLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_WITHOUT_DOT, list("-+0123456789"))


def loads(text: str, filename: str = "<string>") -> Any:
    """Parse YAML text; syntax errors become SpecError at file:line:col."""
    loader = None
    try:
        loader = LocatingSafeLoader(text, filename)  # refuses unprintable characters already
        return loader.get_single_data()
    except yaml.MarkedYAMLError as err:
        raise _syntax_error(err, text, filename) from None
    except yaml.YAMLError as err:
        raise SpecError(f"YAML error: {' '.join(str(err).split())}", location=filename) from None
    except RecursionError:
        raise SpecError("YAML nested too deeply to read", location=filename,
                        hint="a spec nests a few levels; look for runaway brackets") from None
    except ValueError as err:  # an integer of thousands of digits
        raise SpecError(f"YAML value out of range: {str(err).split(':')[0]}", location=filename) from None
    finally:
        if loader is not None:
            loader.dispose()


def _syntax_error(err: yaml.MarkedYAMLError, text: str, filename: str) -> SpecError:
    """Point at the problem, or, when the text simply ran out (an unclosed bracket or
    quote), at where the unfinished construct began."""
    mark, context = err.problem_mark, err.context_mark
    ran_out = mark is None or mark.index >= len(text.rstrip())
    if context is not None and ran_out:
        mark = context
    where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
    message = f"YAML syntax error: {err.problem or 'malformed YAML'}"
    if err.context and mark is context:
        message += f" ({err.context} that starts here)"
    return SpecError(message, location=where)


def load_file(path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise SpecError(f"cannot read spec: {err.strerror}", location=str(path)) from None
    except UnicodeDecodeError as err:
        raise SpecError(f"not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start})",
                        location=str(path)) from None
    return loads(text, str(path))


def where(container, key=None) -> Optional[Loc]:
    """The location of ``container`` itself, or of ``key`` (a mapping key or list index)."""
    if key is None:
        return getattr(container, "loc", None)
    if isinstance(container, LocDict) and key in container.key_locs:
        return container.key_locs[key]
    if isinstance(container, LocList) and isinstance(key, int) and key < len(container.item_locs):
        return container.item_locs[key]
    return getattr(container, "loc", None)


# ---- value kinds -------------------------------------------------------------------------
# A kind checks one YAML value and returns it (converted), or raises Bad with a message.

class Bad(Exception):
    pass


Kind = Callable[[Any], Any]


def _show(value: Any) -> str:
    text = "null" if value is None else repr(plain(value))
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text):,} characters)"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(value):
    if not _is_int(value) or value <= 0:
        raise Bad(f"expected a positive integer, got {_show(value)}")
    return value


def layer_count(value):
    """A positive integer within the layer limit (``irc.limits``)."""
    return _within(positive_int(value), limits.check_layers)


def size(value):
    """A positive integer within the dimension limit (``irc.limits``): d_model, heads, ..."""
    return _within(positive_int(value), limits.check_dim)


def _within(value: int, check) -> int:
    try:
        check(value)
    except limits.LimitError as err:
        raise Bad(f"{err.message}; {err.hint}") from None
    return value


def non_negative_int(value):
    if not _is_int(value) or value < 0:
        raise Bad(f"expected a non-negative integer, got {_show(value)}")
    return value


def number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Bad(f"expected a number, got {_show(value)}")
    return _finite(value)


def positive_number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise Bad(f"expected a positive number, got {_show(value)}")
    return _finite(value)


def _finite(value) -> float:
    """``value`` as a float, refusing NaN, infinities and integers past the float range."""
    try:
        result = float(value)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result):
        raise Bad(f"expected a finite number, got {_show(value)}")
    return result


def boolean(value):
    if not isinstance(value, bool):
        raise Bad(f"expected true or false, got {_show(value)}")
    return value


def string(value):
    if not isinstance(value, str) or not value:
        raise Bad(f"expected a non-empty string, got {_show(value)}")
    return value


def choice(*options: str) -> Kind:
    def check(value):
        if value not in options:
            raise Bad(f"expected one of {', '.join(options)}, got {_show(value)}")
        return value
    return check


def optional(kind: Kind) -> Kind:
    def check(value):
        return None if value is None else kind(value)
    return check


_MISSING = object()


class Fields:
    """Typed, located reading of one YAML mapping at key path ``path``.

    Unknown keys are refused on construction (with a did-you-mean); ``get`` checks a key's
    kind; ``error`` builds a SpecError at a key's location naming ``path.key``.
    """

    def __init__(self, data, path: str, allowed, *, parent_loc: Optional[Loc] = None):
        if not isinstance(data, dict):
            raise SpecError(f"{path}: expected a mapping, got {_show(data)}",
                            location=str(where(data) or parent_loc or "<spec>"))
        self.data, self.path = data, path
        self.loc = where(data) or parent_loc
        self.key_loc = parent_loc or self.loc  # the key naming this mapping in its parent
        self.allowed = tuple(allowed)
        for key in data:
            if key not in self.allowed:
                close = difflib.get_close_matches(str(key), [str(k) for k in self.allowed], n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(self.allowed)}"
                raise self.error(key, "unknown key", hint=hint)

    def key_path(self, key) -> str:
        return f"{self.path}.{key}" if self.path else str(key)

    def where(self, key=None) -> Loc:
        if key is None or key not in self.data:
            return self.key_loc
        return where(self.data, key) or self.loc

    def origin(self, key=None) -> str:
        """``file:line`` of ``key`` (of the key naming this mapping when ``key`` is absent
        or None): a node origin."""
        loc = self.where(key)
        return loc.short if loc else "<spec>"

    def error(self, key, message: str, hint: Optional[str] = None) -> SpecError:
        return SpecError(f"{self.key_path(key)}: {message}", location=str(self.where(key)), hint=hint)

    def has(self, key) -> bool:
        return key in self.data

    def get(self, key, kind: Kind, default: Any = _MISSING):
        if key not in self.data:
            if default is _MISSING:
                raise SpecError(f"{self.key_path(key)}: missing required key", location=str(self.key_loc))
            return default
        try:
            return kind(self.data[key])
        except Bad as err:
            raise self.error(key, str(err)) from None

    def sub(self, key, allowed, *, required: bool = False) -> Optional["Fields"]:
        """The nested mapping at ``key`` (None when absent or null, unless required)."""
        value = self.data.get(key)
        if value is None:
            if required:
                if key in self.data:
                    raise self.error(key, "expected a mapping, got null")
                raise SpecError(f"{self.key_path(key)}: missing required key", location=str(self.key_loc))
            return None
        if not isinstance(value, dict):
            raise self.error(key, f"expected a mapping, got {_show(value)}")
        return Fields(value, self.key_path(key), allowed, parent_loc=self.where(key))

    def items(self, key, kind: Kind, *, required: bool = False) -> Optional[list]:
        """A list at ``key``, each item checked by ``kind``; errors point at the item."""
        value = self.data.get(key)
        if value is None:
            if required:
                raise SpecError(f"{self.key_path(key)}: missing required key", location=str(self.key_loc))
            return None
        if not isinstance(value, list):
            raise self.error(key, f"expected a list, got {_show(value)}")
        out = []
        for i, item in enumerate(value):
            try:
                out.append(kind(item))
            except Bad as err:
                raise SpecError(f"{self.key_path(key)}[{i}]: {err}", location=str(where(value, i))) from None
        return out
