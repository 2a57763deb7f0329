"""Sizes a spec may imply, checked before the graph is built.

A spec of a few lines can ask for 2^40 layers or a 2^40-wide model; building it would take
hours or all memory. The frontends check what a spec implies against these limits first and
refuse with one message naming the key, the size it implies and the limit:

- ``dim``: any single dimension a spec sets (d_model, vocab, heads, head_dim, d_ff,
  experts, rows of a table ...) [2^30 = 1,073,741,824];
- ``layers``: decoder layers [4,096];
- ``nodes``: nodes of the whole graph, estimated from the first layer before the others are
  built [2,000,000];
- ``tensor_elements``: elements of any single weight or input [2^38 = 274,877,906,944].

The defaults are far above every released model (DeepSeek-V3 671B: 61 layers, 256
experts, 370 nodes; a 405B dense model: 126 layers, a 2.1e9-element embedding; Qwen4-Exp's
hashed n-gram embedding tables: about 3.2e8 rows each),
so shape-only analysis of real models is never refused. They are set per run with the
environment variables ``IRC_MAX_DIM``, ``IRC_MAX_LAYERS``, ``IRC_MAX_NODES`` and
``IRC_MAX_TENSOR_ELEMENTS``, or ``irc ... --max-nodes N`` (``applied``, which wins).
"""
from __future__ import annotations

import contextvars
import functools
import os
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Mapping, Optional

from irc.errors import IRCError, SpecError


@dataclass(frozen=True)
class Limits:
    dim: int = 1 << 30
    layers: int = 4096
    nodes: int = 2_000_000
    tensor_elements: int = 1 << 38


ENVIRONMENT = {"dim": "IRC_MAX_DIM", "layers": "IRC_MAX_LAYERS", "nodes": "IRC_MAX_NODES",
               "tensor_elements": "IRC_MAX_TENSOR_ELEMENTS"}
FLAGS = {"nodes": "--max-nodes"}

_applied: contextvars.ContextVar[Optional[Limits]] = contextvars.ContextVar("irc_limits", default=None)


class LimitError(SpecError):
    """A spec implies a size beyond a limit (the frontend adds the key and location)."""


def from_environment(environ: Mapping[str, str] = os.environ) -> Limits:
    """The defaults, with any ``IRC_MAX_*`` variable that is set."""
    values = {}
    for name, variable in ENVIRONMENT.items():
        text = environ.get(variable)
        if text is None or text == "":
            continue
        try:
            values[name] = int(text.replace("_", ""))
        except ValueError:
            values[name] = 0
        if values[name] <= 0:
            raise IRCError(f"{variable}={text!r}: expected a positive integer")
    return Limits(**values)


def current() -> Limits:
    """The limits in force: those ``applied`` here, else the environment's as it was when
    first asked (a check runs once per tensor; reading the environment each time would
    cost more than the check)."""
    return _applied.get() or _process_limits()


@functools.lru_cache(maxsize=1)
def _process_limits() -> Limits:
    return from_environment()


@contextmanager
def applied(**overrides):
    """Run a block under the environment's limits as they are now (or those of an
    enclosing block), with ``overrides`` (None leaves one as it is); the CLI runs every
    command in one."""
    chosen = {k: v for k, v in overrides.items() if v is not None}
    known = {f.name for f in fields(Limits)}
    for name, value in chosen.items():
        if name not in known:
            raise TypeError(f"unknown limit {name!r}")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise IRCError(f"{FLAGS.get(name, name)} {value!r}: expected a positive integer")
    token = _applied.set(replace(_applied.get() or from_environment(), **chosen))
    try:
        yield
    finally:
        _applied.reset(token)


def _refuse(what: str, size: int, name: str, limit: int) -> LimitError:
    how = " or ".join(x for x in (FLAGS.get(name), ENVIRONMENT[name]) if x)
    return LimitError(f"{what} {size:,} is beyond the limit of {limit:,}",
                      hint=f"a real model is far smaller; to allow it anyway raise {how}")


def check_dim(size: int, limits: Optional[Limits] = None) -> None:
    """A single dimension (d_model, vocab, heads, d_ff, ...); the caller names the key."""
    limit = (limits or current()).dim
    if size > limit:
        raise _refuse("size", size, "dim", limit)


def check_layers(count: int) -> None:
    limit = current().layers
    if count > limit:
        raise _refuse("layer count", count, "layers", limit)


def check_nodes(estimate: int) -> None:
    limit = current().nodes
    if estimate > limit:
        raise _refuse("estimated node count", estimate, "nodes", limit)


def check_tensor(shape) -> None:
    """One tensor of ``shape``: its elements and each dimension (symbolic dims count as 1)."""
    limits = current()
    sizes = [d for d in shape if isinstance(d, int)]
    count = 1
    for d in sizes:
        count *= max(d, 1)
    if count > limits.tensor_elements:
        raise _refuse("element count", count, "tensor_elements", limits.tensor_elements)
    for d in sizes:
        check_dim(d, limits)
