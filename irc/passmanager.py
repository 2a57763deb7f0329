"""Passes and the pass manager.

A pass is a small class: a kebab-case ``name``, a docstring saying what it rewrites and
why, optional ``options`` (from ``name{key=value}`` in a pipeline string), and
``run(graph) -> bool`` that rewrites in place and returns True only when it changed
something. ``precondition(graph)`` returns a reason string when the pass cannot run.
``notes`` holds what a run has to tell the user (why a rule or a lowering refused a node):
the manager clears it before each run and prints it with print-after-change (whether or
not the pass changed anything) and print-after-all; the report shows it beside the pass.

The manager owns the instruments: verify after every pass, timing, dumps
(``NN-<pass>.ir``, ``.dot`` and a stats line), print-after-all / print-after-change, and
the numeric check, which runs the reference interpreter before and after each pass on the
same seeded inputs and weights and stops at the first pass whose outputs move.
"""
from __future__ import annotations

import difflib
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, TextIO

from irc.errors import IRCError, PassError, VerifyError
from irc.graph import Graph
from irc.output import write_atomic  # noqa: F401  (also imported from here)
from irc.verify import verify


class Pass:
    name: str = ""
    options: dict = {}          # option name -> default; values come from the pipeline string
    exact: bool = True          # False: the numeric check reports the error instead of failing
    notes: Sequence[str] = ()   # messages of the last run for the user (refusals); see the module docstring
    headline: Sequence[str] = ()  # lines of the last run a compile prints after the pass list (quantize's)

    def __init__(self, **options):
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            known = ", ".join(sorted(self.options)) or "none"
            raise PassError(f"pass {self.name} has no option {unknown[0]!r} (options: {known})")
        self.config = {**self.options, **options}

    def precondition(self, graph: Graph) -> Optional[str]:
        """A reason the pass cannot run on ``graph``, or None."""
        return None

    def run(self, graph: Graph) -> bool:
        raise NotImplementedError

    @classmethod
    def summary(cls) -> str:
        """The docstring's first paragraph, on one line."""
        paragraph = (cls.__doc__ or "").strip().split("\n\n")[0]
        return " ".join(line.strip() for line in paragraph.splitlines())

    def __repr__(self) -> str:
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.config.items()) if self.options.get(k) != v)
        return self.name + (f"{{{opts}}}" if opts else "")


PASSES: dict[str, type[Pass]] = {}


def register_pass(cls: type[Pass]) -> type[Pass]:
    if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", cls.name or ""):
        raise ValueError(f"pass name {cls.name!r} is not kebab-case")
    if cls.name in PASSES:
        raise ValueError(f"pass {cls.name!r} registered twice")
    PASSES[cls.name] = cls
    return cls


def _option_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_pipeline(text: str) -> list[Pass]:
    """``"dce,cse,quantize{bits=4,group=64}"`` -> pass instances."""
    passes = []
    for match in re.finditer(r"\s*([^,{\s]+)\s*(\{[^}]*\})?\s*(,|$)", text.strip()):
        name, opts = match.group(1), match.group(2)
        if not name:
            continue
        if name not in PASSES:
            raise PassError(f"unknown pass {name!r}", hint=f"known passes: {', '.join(sorted(PASSES))}")
        options = {}
        for item in filter(None, (opts or "{}")[1:-1].split(",")):
            key, sep, value = item.partition("=")
            if not sep:
                raise PassError(f"pass {name}: option {item!r} needs key=value")
            options[key.strip()] = _option_value(value.strip())
        passes.append(PASSES[name](**options))
    return passes


# ---- the manager -----------------------------------------------------------------------

@dataclass
class PassRecord:
    index: int
    name: str
    changed: bool
    seconds: float
    stats: dict = field(default_factory=dict)
    check_error: Optional[float] = None  # max relative error against the previous graph
    exact: bool = True                   # False: the pass approximates (quantize); its error is reported


Checker = Callable[[Graph, Graph], float]  # (before, after) -> max relative error


@dataclass
class PassManager:
    passes: list
    dump_dir: Optional[str] = None
    print_after_all: bool = False
    print_after_change: bool = False
    checker: Optional[Checker] = None      # the reference interpreter's comparison, when --check
    tolerance: float = 1e-5
    # a graph with recurrent layers: the check's random states and decode step run the
    # recurrence, which compounds float32 rounding token by token (a lowering that is exact
    # up to rounding moved a tiny Qwen3-Next by 1.4e-5, every token the same)
    recurrent_tolerance: float = 1e-4
    stats: Optional[Callable[[Graph], dict]] = None
    dot: Optional[Callable[[Graph], str]] = None
    out: TextIO = sys.stdout
    records: list = field(default_factory=list)
    on_pass: Optional[Callable[[str], None]] = None  # told each pass's name as it starts (a progress bar)

    def tolerance_for(self, graph: Graph) -> float:
        """The error an exact pass may show: ``recurrent_tolerance`` when the graph carries
        recurrent states, else ``tolerance``."""
        from irc.analysis import state_inputs
        return self.recurrent_tolerance if state_inputs(graph) else self.tolerance

    def run(self, graph: Graph) -> Graph:
        from irc.printer import print_graph

        verify(graph)
        if self.dump_dir:
            os.makedirs(self.dump_dir, exist_ok=True)
        done: list[str] = []
        text = print_graph(graph)
        if self.dump_dir:
            self._dump(graph, 0, "input", text)
        for index, p in enumerate(self.passes, start=1):
            if self.on_pass:
                self.on_pass(repr(p))
            reason = p.precondition(graph)
            if reason:
                raise PassError(f"pass {p!r} cannot run: {reason}", location=_after(done))
            before = graph.clone() if self.checker else None
            p.notes = ()
            start = time.perf_counter()
            try:
                changed = bool(p.run(graph))
            except IRCError as err:
                raise PassError(f"pass {p!r} failed: {err}", location=_after(done)) from None
            seconds = time.perf_counter() - start
            try:
                verify(graph)
            except VerifyError as err:
                raise PassError(f"pass {p!r} broke the graph: {err}", location=_after(done)) from None
            record = PassRecord(index, repr(p), changed, seconds, exact=p.exact)
            if self.checker:  # unchanged passes are held too: `changed` must be honest
                try:
                    record.check_error = self.checker(before, graph)
                except (IRCError, ValueError, KeyError) as err:
                    raise PassError(f"numeric check could not run after pass {p!r}: {err}",
                                    location=_after(done)) from None
                tolerance = self.tolerance_for(before)
                if p.exact and not record.check_error <= tolerance:
                    raise PassError(f"numeric check failed after pass {p!r}: outputs moved by "
                                    f"{record.check_error:.3g} (relative), tolerance {tolerance:g}",
                                    location=_after(done),
                                    hint="the pass's rewrite does not preserve the reference semantics")
            previous, text = text, print_graph(graph)
            if changed != (text != previous):
                said = "a change" if changed else "no change"
                raise PassError(f"pass {p!r} reported {said} but the printed graph "
                                f"{'did not change' if changed else 'changed'}", location=_after(done))
            if self.stats:
                record.stats = self.stats(graph)
                report = getattr(p, "report", None)  # a pass's own figures (moe-sort's load per expert)
                if changed and callable(report):
                    record.stats[p.name] = report(graph)
            self.records.append(record)
            done.append(repr(p))
            if self.dump_dir:
                self._dump(graph, index, p.name, text, record)
            if self.print_after_all:
                self.out.write(f"# ----- after {p!r} ({'changed' if changed else 'unchanged'}) -----\n{text}")
            elif self.print_after_change and changed:  # the rewritten region, with context
                self.out.write(f"# ----- after {p!r} (changed) -----\n{region_diff(previous, text)}")
            if self.print_after_all or self.print_after_change:
                for note in p.notes:  # why a rule refused, so users learn why nothing fused
                    self.out.write(f"# {note}\n")
        return graph

    def _dump(self, graph: Graph, index: int, name: str, text: str, record: Optional[PassRecord] = None) -> None:
        stem = os.path.join(self.dump_dir, f"{index:02d}-{name}")
        stats = record.stats if record else (self.stats(graph) if self.stats else {})
        line = {"pass": name, "changed": record.changed if record else None, **stats}
        if record and record.check_error is not None:
            line["check_error"] = record.check_error
        write_atomic(stem + ".ir", text)
        write_atomic(stem + ".stats.json", json.dumps(line, sort_keys=True) + "\n")
        if self.dot:
            write_atomic(stem + ".dot", self.dot(graph))


def region_diff(before: str, after: str, context: int = 2) -> str:
    """The changed lines of two printed graphs as a unified diff (``-`` old, ``+`` new)."""
    lines = difflib.unified_diff(before.splitlines(), after.splitlines(), "before", "after", n=context,
                                 lineterm="")
    return "\n".join(list(lines)[2:]) + "\n"


def _after(done: list[str]) -> str:
    return "pipeline start" if not done else "after " + ", ".join(done)
