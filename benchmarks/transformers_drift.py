"""Drift: the twin tests (``pytest -m twin``, every test that holds irc against transformers)
under the pinned transformers and under the newest one PyPI serves, side by side. Prints one
table of the tests whose outcome differs, then the counts; asserts nothing.

The pinned side is this interpreter's environment (the README's set-up: ``constraints.txt``).
The newest side is a second virtual environment (``--venv``, kept for the next run): the same
install with the same constraints, then ``pip install --upgrade transformers`` alone, which
moves transformers and whatever its new release requires (each moved package is listed). A
row is a behaviour change upstream to read and decide on (follow it, or honour the config both
ways), before ``constraints.txt`` moves; see its header for regenerating it.

    python benchmarks/transformers_drift.py [--version 5.26.0] [--pre] [-k EXPR] [--venv DIR]
                                            [--newest-only]

``--version`` tries a given release instead of the newest, ``--pre`` admits pre-releases,
``-k`` narrows the tests as pytest's ``-k`` does, ``--newest-only`` skips the pinned run (the
table then lists the newest side's failures). Both runs take the suite's parallelism
(``-n auto``); the whole twin set takes about as long as the suite, twice.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

from common import ROOT
EXTRAS = ".[dev,hf,triton,text,npu,vision]"


def run(command: list, **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(command), flush=True)
    return subprocess.run(command, cwd=ROOT, check=True, **kwargs)


def versions(python: str) -> dict:
    """name -> version of every package installed for ``python`` (pip's names, lower case)."""
    out = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return dict(line.lower().split("==", 1) for line in out.splitlines() if "==" in line)


def newest_environment(venv: str, version: str, pre: bool) -> str:
    """The python of ``venv``: the pinned set-up with transformers moved to ``version`` (or the
    newest)."""
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        run([sys.executable, "-m", "venv", venv])
        run([python, "-m", "pip", "install", "-q", "-c", "constraints.txt", "--upgrade", "pip"])
    run([python, "-m", "pip", "install", "-q", "-c", "constraints.txt", "-e", EXTRAS])  # today's pins and extras
    wanted = f"transformers=={version}" if version else "transformers"
    run([python, "-m", "pip", "install", "-q", "--upgrade", *(["--pre"] if pre else []), wanted])
    return python


def twin_outcomes(python: str, report: str, keyword: str) -> dict:
    """test id -> (outcome, first line of its message) for ``pytest -m twin`` under ``python``."""
    command = [python, "-m", "pytest", "-m", "twin", "-p", "no:cacheprovider", f"--junitxml={report}", "-q",
               "--tb=line"]
    subprocess.run(command + (["-k", keyword] if keyword else []), cwd=ROOT)  # failures are the point
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                message = (found.get("message") or "").strip().splitlines()[:1]
                message = message[0][:100] if message else ""
                break
        outcomes[name] = (outcome, message)
    return outcomes


def print_table(pinned: dict, newest: dict, left: str, right: str) -> None:
    rows = sorted(name for name in set(pinned) | set(newest)
                  if pinned.get(name, ("-",))[0] != newest.get(name, ("-",))[0])
    if not pinned:
        rows = sorted(name for name, (outcome, _) in newest.items() if outcome in ("failed", "error"))
    width = max([len(name) for name in rows] + [4])
    print(f"\n{'test':<{width}}  {left:<16}  {right:<16}  message (of the side that failed)")
    for name in rows:
        before, before_message = pinned.get(name, ("-", ""))
        after, after_message = newest.get(name, ("-", ""))
        print(f"{name:<{width}}  {before:<16}  {after:<16}  {after_message or before_message}")
    if not rows:
        print("(no test's outcome differs)")
    for label, outcomes in ((left, pinned), (right, newest)):
        if outcomes:
            counts = {}
            for outcome, _ in outcomes.values():
                counts[outcome] = counts.get(outcome, 0) + 1
            print(f"{label}: " + ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items())))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="", help="a transformers release to try (default: the newest)")
    parser.add_argument("--pre", action="store_true", help="admit pre-releases as the newest")
    parser.add_argument("-k", dest="keyword", default="", help="pytest -k expression narrowing the twin tests")
    parser.add_argument("--venv", default=os.path.join(ROOT, "out", "drift", "venv"),
                        help="the newest side's virtual environment (made once, then reused)")
    parser.add_argument("--newest-only", action="store_true", help="skip the run under the pinned versions")
    args = parser.parse_args()

    python = newest_environment(args.venv, args.version, args.pre)
    here, there = versions(sys.executable), versions(python)
    moved = {name: (here.get(name, "-"), version) for name, version in there.items() if here.get(name) != version}
    moved.pop("irc", None)
    print("\npackages that differ from the pinned set-up: " +
          (", ".join(f"{name} {old} -> {new}" for name, (old, new) in sorted(moved.items())) or "none"))
    if "transformers" not in moved:
        print(f"transformers {there.get('transformers')} is the pinned release: nothing to compare")
        return 0
    reports = os.path.join(ROOT, "out", "drift")
    os.makedirs(reports, exist_ok=True)
    pinned = {} if args.newest_only else twin_outcomes(sys.executable, os.path.join(reports, "pinned.xml"),
                                                       args.keyword)
    newest = twin_outcomes(python, os.path.join(reports, "newest.xml"), args.keyword)
    label = "tried" if args.version else "newest"
    print_table(pinned, newest, f"pinned {here.get('transformers')}", f"{label} {there.get('transformers')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
