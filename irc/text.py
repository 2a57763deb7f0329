"""Small text helpers every layer shares: byte counts and times for people, and Python
source text for the emitters (identifiers, constants, shape tuples)."""
from __future__ import annotations

import keyword
import math
from typing import Optional


BINARY = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
DECIMAL = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))


def in_unit(n: float, units) -> Optional[tuple[float, str]]:
    """(n in the unit, its name) for the first of ``units`` ((name, size) pairs, largest
    first) that ``|n|`` reaches; None below the smallest."""
    for unit, size in units:
        if abs(n) >= size:
            return n / size, unit
    return None


def format_bytes(n: Optional[float]) -> str:
    """``1.5 GiB``: three significant digits in the largest binary unit that fits (``-``
    for None)."""
    if n is None:
        return "-"
    scaled = in_unit(n, BINARY)
    return f"{scaled[0]:.3g} {scaled[1]}" if scaled else f"{n:.0f} B"


def describe_bytes(n: int) -> str:
    """``1,610,612,736 bytes (1.5 GiB)``: the exact count, then the unit (GiB at most)."""
    scaled = in_unit(n, BINARY[1:])
    return f"{n:,} bytes ({scaled[0]:.4g} {scaled[1]})" if scaled else f"{n:,} bytes"


def format_seconds(s: float) -> str:
    """``3.832 µs``: four significant digits in the largest unit (s, ms, µs, ns) that fits."""
    scaled = in_unit(s, (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)))
    return f"{scaled[0]:.4g} {scaled[1]}" if scaled else f"{s * 1e9:.4g} ns"


def identifier(text: str) -> str:
    """A Python identifier close to ``text`` (``layers.0.q`` -> ``layers_0_q``): ASCII
    letters, digits and ``_``; ``v_`` before a leading digit; ``_`` after a keyword."""
    name = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in text) or "_"
    if not name.isidentifier() or name[0].isdigit():
        name = "v_" + name
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        name += "_"
    return name


def literal(value) -> Optional[str]:
    """Python source for a plain constant (None where ``value`` is not one): numbers
    exactly (floats by repr, ``float("inf")``), strings in double quotes where they need
    no escape, lists, tuples, dicts (order kept) and sets (sorted) of those."""
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f'float("{value}")'
    if isinstance(value, str):
        plain = value.isascii() and value.isprintable() and '"' not in value and "\\" not in value
        return f'"{value}"' if plain else repr(value)
    if isinstance(value, (list, tuple)):
        items = [literal(v) for v in value]
        if None in items:
            return None
        if isinstance(value, list):
            return "[" + ", ".join(items) + "]"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(value, dict):
        pairs = [(literal(k), literal(v)) for k, v in value.items()]
        if any(k is None or v is None for k, v in pairs):
            return None
        return "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"
    if isinstance(value, (set, frozenset)):
        items = [literal(v) for v in value]
        if None in items:
            return None
        inner = "{" + ", ".join(sorted(items)) + "}" if items else ""
        if isinstance(value, frozenset) or not items:
            return f"{type(value).__name__}({inner})"
        return inner
    return None


def one_line(text: str, docstring: bool = False) -> str:
    """``text`` safe in a comment (one line) or, with ``docstring``, inside triple quotes:
    unprintable characters (and there quotes and backslashes) escaped."""
    unsafe = '"\\' if docstring else ""
    return "".join(c if c.isprintable() and c not in unsafe else repr(c)[1:-1].replace('"', '\\"')
                   for c in str(text))


def interface_lines(graph) -> list[str]:
    """A generated module's docstring block: ``inputs:`` and ``outputs:``, then one
    ``    %name: type`` line per graph input and output, docstring-safe."""
    def lines(values):
        return [f"    %{one_line(v.name, True)}: {v.type_str()}" for v in values]
    return ["inputs:", *lines(graph.inputs), "outputs:", *lines(graph.outputs)]


def shape_text(shape) -> str:
    """A shape as a Python tuple, symbolic dims as bare names: ``(B, T, 64)``, ``(8,)``."""
    items = [str(d) for d in shape]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
