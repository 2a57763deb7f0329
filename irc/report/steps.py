"""The pipeline as the report sees it: one ``Step`` per dump (``NN-<pass>.ir`` and its
``.stats.json``), step 0 being the input graph.

A dump directory holds everything but the pass times and the rules' notes when the pass
manager does not write them into the stats line; ``load_steps`` takes them from the pass
manager's records and passes when it is given them (``irc compile --report``) and from the
stats line otherwise (``"seconds"``, ``"notes"``), and leaves them out when neither has them.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Optional, Sequence

from irc.errors import IRCError
from irc.inputs import parse_json, read_text

_DUMP = re.compile(r"(\d+)-(.+)\.ir\Z")


@dataclass
class Step:
    index: int
    name: str                    # the pass name ("input" for step 0)
    label: str                   # as the pipeline spelt it, options included: quantize{bits=8}
    text: str                    # the printed IR after the step
    changed: Optional[bool] = None
    seconds: Optional[float] = None
    check_error: Optional[float] = None
    stats: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


def load_steps(dump_dir: str, records: Optional[Sequence] = None, passes: Optional[Sequence] = None) -> list[Step]:
    """The steps a dump directory holds, in order.

    ``records`` (``PassRecord``s) and ``passes`` (the pass instances, for their ``notes``)
    come from the pass manager that wrote the dumps; with them, only the steps the run made
    are read, so stale files of an earlier, longer pipeline are ignored.
    """
    if not os.path.isdir(dump_dir):
        raise IRCError(f"no such dump directory: {dump_dir}", hint="irc compile SPEC --dump-dir DIR writes one")
    found: dict[int, list[str]] = {}
    for entry in sorted(os.listdir(dump_dir)):
        match = _DUMP.match(entry)
        if match:
            found.setdefault(int(match.group(1)), []).append(entry)
    limit = len(records) if records is not None else None
    steps = []
    for index in sorted(found):
        if limit is not None and index > limit:
            continue
        entries = found[index]
        if records is not None and index > 0:
            wanted = f"{index:02d}-{_base_name(records[index - 1].name)}.ir"
            entries = [e for e in entries if e == wanted] or entries
        if len(entries) > 1:
            raise IRCError(f"dump directory {dump_dir} holds {len(entries)} dumps for step {index:02d} "
                           f"({', '.join(entries)})", hint="clear it and run the pipeline again")
        steps.append(_read_step(dump_dir, index, entries[0]))
    if not steps or steps[0].index != 0:
        raise IRCError(f"dump directory {dump_dir} has no 00-input.ir",
                       hint="irc compile SPEC --dump-dir DIR writes one")
    missing = sorted(set(range(len(steps))) - {s.index for s in steps})
    if missing:
        raise IRCError(f"dump directory {dump_dir} lacks step {missing[0]:02d}", hint="run the pipeline again")
    for step in steps[1:]:
        record = records[step.index - 1] if records is not None else None
        if record is not None:
            step.label, step.changed, step.seconds = record.name, record.changed, record.seconds
            step.check_error = record.check_error if record.check_error is not None else step.check_error
        if passes is not None and step.index - 1 < len(passes):
            step.notes = list(getattr(passes[step.index - 1], "notes", ()) or ())
    return steps


def _base_name(label: str) -> str:
    return label.split("{", 1)[0]


def _flag(value) -> bool:
    return isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < float("inf")


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _list(value) -> bool:
    return isinstance(value, list)


STAT_KINDS = {"changed": (_flag, "true or false"), "seconds": (_number, "a number"),
              "check_error": (_number, "a number"), "nodes": (_count, "a node count"), "notes": (_list, "a list")}


def _check_stats(stats, path: str) -> None:
    """A dump's stats as the report reads them (a file handed back may hold anything)."""
    if not isinstance(stats, dict):
        raise IRCError("expected a JSON object", location=path)
    for key, (allowed, kind) in STAT_KINDS.items():
        if stats.get(key) is not None and not allowed(stats[key]):
            raise IRCError(f"{key}: expected {kind}, got {str(stats[key])[:40]}", location=path)
    for key, value in stats.items():  # counts and sizes the report charts
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not abs(value) < 1e30:
            raise IRCError(f"{key}: {str(value)[:40]} is out of range", location=path)


def _read_step(dump_dir: str, index: int, entry: str) -> Step:
    name = _DUMP.match(entry).group(2)
    text = read_text(os.path.join(dump_dir, entry))
    stats: dict = {}
    stats_path = os.path.join(dump_dir, entry[:-3] + ".stats.json")
    if os.path.exists(stats_path):
        stats = parse_json(read_text(stats_path) or "{}", stats_path)
        _check_stats(stats, stats_path)
    step = Step(index, name, name, text)
    step.changed = stats.pop("changed", None)
    step.check_error = stats.pop("check_error", None)
    step.seconds = stats.pop("seconds", None)
    step.notes = list(stats.pop("notes", None) or [])
    stats.pop("pass", None)
    step.stats = stats
    return step
