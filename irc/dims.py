"""Symbolic dimensions.

A ``Dim`` is an ``int`` or a string naming a symbol (``"B"``, ``"T"``, ``"P"``) or a small
polynomial of symbols with integer coefficients (``"P+T"``, ``"B*T"``, ``"2*P+3"``).
Strings are kept canonical (terms sorted, like terms merged), so two dims are equal
exactly when their canonical strings are equal. Symbols bind to ints only when something
runs (``evaluate``). No sympy: sums and products of symbols are all shapes need.
"""
from __future__ import annotations

import re
from typing import Mapping, Union

Dim = Union[int, str]
Shape = tuple  # tuple[Dim, ...]

_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# polynomial: {tuple of sorted symbol names (a monomial): coefficient}
_Poly = dict


def _parse(dim: Dim) -> _Poly:
    if isinstance(dim, bool):
        raise ValueError(f"bad dimension {dim!r}")
    if isinstance(dim, int):
        return {(): dim} if dim else {}
    if not isinstance(dim, str) or not dim.strip():
        raise ValueError(f"bad dimension {dim!r}")
    poly: _Poly = {}
    for term in dim.replace(" ", "").split("+"):
        coeff, symbols = 1, []
        for factor in term.split("*"):
            if factor.isdigit():
                coeff *= int(factor)
            elif _SYMBOL.match(factor):
                symbols.append(factor)
            else:
                raise ValueError(f"bad dimension {dim!r}: cannot read {factor!r}")
        key = tuple(sorted(symbols))
        poly[key] = poly.get(key, 0) + coeff
    return {k: v for k, v in poly.items() if v}


def _format(poly: _Poly) -> Dim:
    if not poly:
        return 0
    if set(poly) == {()}:
        return poly[()]
    terms = []
    # symbolic terms first (by degree then name), constant last: "P+T+1", "B*T"
    for monomial in sorted(poly, key=lambda m: (len(m) == 0, -len(m), m)):
        coeff = poly[monomial]
        parts = ([str(coeff)] if coeff != 1 or not monomial else []) + list(monomial)
        terms.append("*".join(parts))
    return "+".join(terms)


# text -> its canonical form, and -> its terms: shape inference and the cost analysis ask for
# the same few dims thousands of times in a compile (at most _KEPT texts are kept)
_CANONICAL: dict = {}
_TERMS: dict = {}
_KEPT = 1 << 16


def canonical(dim: Dim) -> Dim:
    """Canonical form of ``dim``; raises ValueError on malformed text or negative ints."""
    kind = type(dim)
    if kind is int and dim >= 0:  # a plain int is its own form (not bool: its type is bool)
        return dim
    if kind is str:
        found = _CANONICAL.get(dim)
        if found is None:
            found = _format(_parse(dim))  # a malformed text raises and is not kept
            if len(_CANONICAL) < _KEPT:
                _CANONICAL[dim] = found
        return found
    if isinstance(dim, int) and not isinstance(dim, bool) and dim < 0:
        raise ValueError(f"negative dimension {dim}")
    return _format(_parse(dim))


def add(a: Dim, b: Dim) -> Dim:
    pa, pb = _parse(a), _parse(b)
    for k, v in pb.items():
        pa[k] = pa.get(k, 0) + v
    return _format({k: v for k, v in pa.items() if v})


def mul(a: Dim, b: Dim) -> Dim:
    out: _Poly = {}
    for ka, va in _parse(a).items():
        for kb, vb in _parse(b).items():
            key = tuple(sorted(ka + kb))
            out[key] = out.get(key, 0) + va * vb
    return _format({k: v for k, v in out.items() if v})


def product(dims) -> Dim:
    result: Dim = 1
    for d in dims:
        result = mul(result, d)
    return result


def symbols(dim: Dim) -> set[str]:
    return {s for monomial in _parse(dim) for s in monomial}


def evaluate(dim: Dim, bindings: Mapping[str, int]) -> int:
    """The int value of ``dim`` with every symbol bound; KeyError names a missing one."""
    if isinstance(dim, int):
        return dim
    terms = _TERMS.get(dim)
    if terms is None:
        terms = tuple(_parse(dim).items())
        if len(_TERMS) < _KEPT:
            _TERMS[dim] = terms
    total = 0
    for monomial, coeff in terms:
        value = coeff
        for s in monomial:
            if s not in bindings:
                raise KeyError(f"symbol {s!r} is not bound (dimension {dim!r})")
            value *= bindings[s]
        total += value
    return total


def evaluate_shape(shape: Shape, bindings: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(evaluate(d, bindings) for d in shape)


def format_shape(shape: Shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def parse_dim(text: str) -> Dim:
    text = text.strip()
    return int(text) if text.isdigit() else canonical(text)


def binding_plan(inputs) -> list[tuple[str, str, int, Dim]]:
    """How each symbol in the shapes of ``inputs`` (values with ``name`` and ``shape``) is
    read off the arrays fed for them, in order: ``(symbol, input name, axis, rest, c)``
    means ``symbol = (array.shape[axis] - rest) // c``, ``rest`` a dim over symbols bound
    before it (0 for a plain symbol), ``c`` the symbol's coefficient there (1 but for a dim
    such as Qwen-VL's patches, ``4*I``). Plain symbols come first; then a compound dim with
    one unbound symbol binds it (``P`` from ``attention_mask`` [B, P+T]). The interpreter and
    every emitter bind symbols this one way."""
    plan, bound = [], set()
    for value in inputs:
        for axis, dim in enumerate(value.shape):
            if isinstance(dim, str) and symbols(dim) == {dim} and dim not in bound:
                bound.add(dim)
                plan.append((dim, value.name, axis, 0, 1))
    for value in inputs:
        for axis, dim in enumerate(value.shape):
            unbound = symbols(dim) - bound
            if len(unbound) == 1:
                (symbol,) = unbound
                poly = _parse(dim)
                if poly.get((symbol,), 0) < 1 or any(symbol in m and m != (symbol,) for m in poly):
                    continue  # only a symbol that appears alone, times a positive int, can be read off
                bound.add(symbol)
                plan.append((symbol, value.name, axis, _without(poly, symbol), poly[(symbol,)]))
    return plan


def _without(poly: _Poly, symbol: str) -> Dim:
    return _format({m: c for m, c in poly.items() if m != (symbol,)})


def solve_text(shape_text: str, rest: Dim, coefficient: int) -> str:
    """Python source of a binding: ``(shape - rest) // c`` as ``binding_plan`` reads it."""
    text = shape_text + subtract_text(rest)
    return text if coefficient == 1 else f"({text}) // {coefficient}"


def subtract_text(rest: Dim) -> str:
    """`` - rest`` as Python source (parenthesised when ``rest`` is a sum); "" for 0."""
    if rest == 0:
        return ""
    return f" - ({rest})" if "+" in str(rest) else f" - {rest}"
