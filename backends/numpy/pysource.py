"""Copying Python functions, with the helpers and constants they read, into one module.

The NumPy emitter's one mechanism: each op's reference is a module-level function in an
``irc.ops`` module. ``collect`` walks the globals a root function reads (``LOAD_GLOBAL``
in its code and nested code, plus names in its decorators and default values) and keeps

- functions defined in ``irc.ops`` modules: their source is copied, recursively;
- plain literal constants (numbers, strings, None, and tuples/lists/dicts/sets of them);
- the modules ``numpy`` (and its submodules), ``math`` and ``ml_dtypes``, and names
  imported from them (``from math import erf``): these become import lines.

Anything else (a class, an ``irc.dims`` helper, a lambda or closure as a reference) raises a
``BackendError`` naming the op, the chain of functions and the global, so op authors learn
to keep references emit-friendly. Names are resolved deterministically: when two different
objects want one name (or a name the caller reserves, or a builtin some copied code uses),
each of them is prefixed with its module stem (``linear`` -> ``nn_linear``, ``_mask`` ->
``_attention_mask``) and the copied sources are renamed token by token.
"""
from __future__ import annotations

import ast
import builtins
import dis
import importlib
import inspect
import io
import re
import tokenize
import types
from dataclasses import dataclass, field
from typing import Callable, Optional

from irc.errors import BackendError
from irc.text import literal

PACKAGE = "irc.ops"
IMPORTABLE = ("numpy", "math", "ml_dtypes")

_HINT = ("keep references emit-friendly: module-level functions in irc.ops that read only numpy, math, "
         "ml_dtypes, other irc.ops functions and literal constants")


@dataclass
class _Function:
    fn: Callable
    reads: dict = field(default_factory=dict)  # global name in the source -> key of what it names


@dataclass
class Bundle:
    """What ``collect`` found: import lines, copied definitions grouped by module, and the
    emitted name of every function and constant."""

    imports: list
    sections: list  # (module name, text)
    names: dict     # key -> emitted name
    modules: set    # top-level modules imported (numpy, math, ml_dtypes)

    def name_of(self, fn: Callable) -> str:
        return self.names[_function_key(fn)]


def _function_key(fn) -> tuple:
    return ("function", fn.__module__, fn.__qualname__)


def _code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _local_names(fn) -> set:
    names = set()
    for code in _code_objects(fn.__code__):
        names.update(code.co_varnames, code.co_cellvars, code.co_freevars)
    return names


def _source(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        raise BackendError(f"the source of {fn.__module__}.{fn.__qualname__} cannot be read", hint=_HINT) from None


def _global_reads(fn) -> list:
    """Global names ``fn`` reads, in first-read order: bytecode, then decorators and defaults."""
    names = {}
    for code in _code_objects(fn.__code__):
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"):
                names.setdefault(ins.argval)
    tree = ast.parse(_source(fn)).body[0]
    header = list(tree.decorator_list) + list(tree.args.defaults) + [d for d in tree.args.kw_defaults if d]
    for node in header:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                names.setdefault(sub.id)
    return list(names)


class _Collector:
    def __init__(self):
        self.functions: dict[tuple, _Function] = {}
        self.constants: dict[tuple, tuple] = {}  # key -> (module, name, literal text)
        self.imports: dict[tuple, tuple] = {}    # key -> (module, attr or None, alias)
        self.builtins_used: set[str] = set()

    def add(self, fn, owner: str, chain: tuple = ()) -> tuple:
        chain = chain + (getattr(fn, "__qualname__", repr(fn)),)
        where = " -> ".join(chain)
        if not isinstance(fn, types.FunctionType):
            raise BackendError(f"{owner}: {where} is a {type(fn).__name__}, not a function", hint=_HINT)
        if fn.__name__ == "<lambda>":
            raise BackendError(f"{owner}: {where} is a lambda; give it a name at module level", hint=_HINT)
        if fn.__code__.co_freevars:
            raise BackendError(f"{owner}: {where} is a closure over {', '.join(fn.__code__.co_freevars)}; "
                               f"define it at module level", hint=_HINT)
        if not (fn.__module__ + ".").startswith(PACKAGE + ".") or fn.__qualname__ != fn.__name__:
            raise BackendError(f"{owner}: {where} is not a module-level function of {PACKAGE} "
                               f"(it lives in {fn.__module__})", hint=_HINT)
        key = _function_key(fn)
        if key in self.functions:
            return key
        record = self.functions[key] = _Function(fn)
        for name in _global_reads(fn):
            if name not in fn.__globals__:
                if hasattr(builtins, name):
                    self.builtins_used.add(name)
                continue
            record.reads[name] = self._classify(fn.__globals__[name], name, fn, owner, chain)
        return key

    def _classify(self, obj, name: str, fn, owner: str, chain: tuple) -> tuple:
        if isinstance(obj, types.ModuleType) and _importable(obj.__name__):
            key = ("import", obj.__name__, None, name)
            self.imports[key] = (obj.__name__, None, name)
            return key
        if isinstance(obj, types.FunctionType) and (obj.__module__ + ".").startswith(PACKAGE + "."):
            return self.add(obj, owner, chain)
        text = literal(obj)
        if text is not None:
            key = ("constant", name, text)
            module = min(self.constants.get(key, (fn.__module__,))[0], fn.__module__)
            self.constants[key] = (module, name, _long_literal(obj, text))
            return key
        for module_name in IMPORTABLE:
            module = importlib.import_module(module_name)
            if getattr(module, name, None) is obj and not isinstance(obj, types.ModuleType):
                key = ("import", module_name, name, name)
                self.imports[key] = (module_name, name, name)
                return key
        what = f"{type(obj).__name__} from {getattr(obj, '__module__', None) or getattr(obj, '__name__', '?')}"
        raise BackendError(f"{owner}: {' -> '.join(chain)} reads global {name!r} ({what}), which the NumPy "
                           f"emitter cannot copy", hint=_HINT)


def _long_literal(value, text: str) -> str:
    """A dict, list or tuple literal over 80 characters, one item per line."""
    if len(text) <= 80 or not isinstance(value, (dict, list, tuple)) or not value:
        return text
    if isinstance(value, dict):
        items = [f"{literal(k)}: {literal(v)}" for k, v in value.items()]
    else:
        items = [literal(v) for v in value]
    opening, closing = {dict: "{}", list: "[]"}.get(type(value), "()")
    return opening + "\n" + "".join(f"    {item},\n" for item in items) + closing


def _importable(module: str) -> bool:
    return module.split(".")[0] in IMPORTABLE


def _prefixed(module: str, name: str) -> str:
    stem = module.rsplit(".", 1)[-1]
    lead = name[:len(name) - len(name.lstrip("_"))]
    return f"{lead}{stem}_{name[len(lead):]}"


def _import_key(item) -> tuple:
    module, attr, alias = item[1]
    return module, attr or "", alias


def _assign_names(col: _Collector, reserved: set, standard_imports: dict) -> dict:
    names: dict[tuple, str] = {}
    aliases: dict[str, tuple] = {}
    for key, (module, attr, alias) in sorted(col.imports.items(), key=_import_key):
        standard = attr is None and standard_imports.get(alias) == module
        if aliases.setdefault(alias, key) != key or (alias in reserved and not standard):
            raise BackendError(f"the NumPy emitter cannot import {module} as {alias!r}: the name is taken")
        names[key] = alias
    taken = reserved | set(aliases) | col.builtins_used
    wanted: dict[str, list] = {}
    for key, record in col.functions.items():
        wanted.setdefault(record.fn.__name__, []).append((key, record.fn.__module__))
    for key, (module, name, _) in col.constants.items():
        wanted.setdefault(name, []).append((key, module))
    for name in sorted(wanted):
        claims = sorted(wanted[name], key=lambda claim: claim[1])
        clash = len(claims) > 1 or name in taken
        for key, module in claims:
            names[key] = _prefixed(module, name) if clash else name
    emitted = sorted(names.values())
    for a, b in zip(emitted, emitted[1:]):
        if a == b:
            raise BackendError(f"the NumPy emitter cannot give two definitions the name {a!r}")
    return names


def rename(source: str, renames: dict) -> str:
    """Rename global names in ``source``, skipping attributes (``x.name``) and keyword
    arguments (``f(name=...)``)."""
    if not renames:
        return source
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type not in (tokenize.NL, tokenize.COMMENT)]
    edits, depth = [], 0
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.STRING and "f" in tok.string.split(tok.string[-1])[0].lower():
            # before Python 3.12 an f-string is one token: its names cannot be renamed safely
            for old in renames:
                if re.search(rf"\b{re.escape(old)}\b", tok.string):
                    raise BackendError(f"cannot rename {old!r} inside the f-string {tok.string}", hint=_HINT)
        if tok.type == tokenize.OP and tok.string in "([{":
            depth += 1
        elif tok.type == tokenize.OP and tok.string in ")]}":
            depth -= 1
        if tok.type != tokenize.NAME or tok.string not in renames:
            continue
        after_dot = i > 0 and tokens[i - 1].string == "."
        keyword_arg = depth > 0 and i + 1 < len(tokens) and tokens[i + 1].string == "="
        if not (after_dot or keyword_arg):
            edits.append(tok)
    lines = source.splitlines(keepends=True)
    for tok in reversed(edits):
        row, col = tok.start
        line = lines[row - 1]
        lines[row - 1] = line[:col] + renames[tok.string] + line[col + len(tok.string):]
    return "".join(lines)


def _function_text(record: _Function, names: dict, owner_of: Callable[[tuple], str]) -> str:
    fn = record.fn
    renames = {name: names[key] for name, key in record.reads.items() if names[key] != name}
    own = names[_function_key(fn)]
    if own != fn.__name__:
        renames[fn.__name__] = own
    local = _local_names(fn)
    for old, new in renames.items():
        if (old in local and old != fn.__name__) or new in local:
            raise BackendError(f"{owner_of(_function_key(fn))}: cannot rename {old!r} to {new!r} in "
                               f"{fn.__qualname__}: a local variable there has that name", hint=_HINT)
    source = _source(fn)
    if not source.startswith(("def ", "@")):
        raise BackendError(f"{owner_of(_function_key(fn))}: the source of {fn.__qualname__} is not a top-level "
                           f"def", hint=_HINT)
    return rename(source, renames).rstrip() + "\n"


def collect(roots: dict, reserved: set, standard_imports: Optional[dict] = None) -> Bundle:
    """Copy ``roots`` (owner text such as ``"op 'linear'"`` -> function) and their closure.

    ``reserved`` names are left to the caller (``forward``, ``np``, ...); a definition that
    wants one is prefixed with its module stem. ``standard_imports`` (alias -> module, such
    as ``{"np": "numpy"}``) are imports the caller writes anyway; copied code may share them.
    """
    col = _Collector()
    owners: dict[tuple, str] = {}
    for owner, fn in roots.items():
        owners.setdefault(col.add(fn, owner), owner)
    names = _assign_names(col, set(reserved), standard_imports or {})

    def owner_of(key):
        return owners.get(key, f"function {key[1]}.{key[2]}")

    by_module: dict[str, list] = {}
    for key, (module, _, text) in col.constants.items():
        by_module.setdefault(module, []).append((0, names[key], f"{names[key]} = {text}\n"))
    for key, record in col.functions.items():
        text = _function_text(record, names, owner_of)
        by_module.setdefault(record.fn.__module__, []).append((1, record.fn.__code__.co_firstlineno, text))
    sections = []
    for module in sorted(by_module):
        items = sorted(by_module[module], key=lambda item: item[:2])
        constants = "".join(text for kind, _, text in items if kind == 0)
        functions = "\n\n".join(text for kind, _, text in items if kind == 1)
        sections.append((module, "\n\n".join(part for part in (constants, functions) if part)))
    imports = []
    for _, (module, attr, alias) in sorted(col.imports.items(), key=_import_key):
        if attr is not None:
            imports.append(f"from {module} import {attr}")
        else:
            imports.append(f"import {module}" + ("" if alias == module else f" as {alias}"))
    return Bundle(imports, sections, names, {m.split(".")[0] for m, _, _ in col.imports.values()})
