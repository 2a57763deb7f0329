"""Command-line glue: ``irc report DUMP_DIR -o report.html`` and ``irc compile ... --report
report.html``.

``irc_cli`` wires these in: ``add_parser(sub)`` adds the ``report`` command,
``add_compile_arguments(comp)`` adds ``--report`` to ``compile``, and ``cmd_compile`` runs
its passes inside ``compile_report(args, graph)``, which makes the pass manager dump (into a
temporary directory when ``--dump-dir`` is not given), keeps the input graph for the
nodes' origins, and writes the report once the passes have run.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from typing import Optional

from irc.errors import IRCError
from irc.inputs import read_json


def add_parser(subparsers):
    from irc_cli.help import parser_options

    p = subparsers.add_parser("report", **parser_options("report"))
    p.add_argument("dump_dir", help="a directory written by irc compile --dump-dir")
    p.add_argument("-o", "--output", required=True, help="the HTML file to write")
    p.add_argument("--spec", metavar="SPEC", help="the spec the dumps came from (any kind below), so nodes link to "
                   "the spec lines that produced them")
    p.add_argument("--npu-plan", help="an NPU plan JSON to chart (default: the graph's meta npu_plan, or plan.json "
                   "in DUMP_DIR)")
    p.add_argument("--no-times", action="store_true",
                   help="leave pass times out, so reports of two runs compare byte for byte")
    p.set_defaults(func=cmd_report)
    return p


def add_compile_arguments(parser) -> None:
    parser.add_argument("--report", metavar="FILE.html",
                        help="also write a self-contained HTML report of the run (pipeline, diffs, model, NPU plan)")


def _read_plan(path: str) -> dict:
    if not os.path.exists(path):
        raise IRCError(f"no such file: {path}")
    plan = read_json(path)  # unreadable, not UTF-8, not JSON: one IRCError naming the file
    if not isinstance(plan, dict):
        raise IRCError("an NPU plan is a JSON object", location=path)
    return plan


def _write(path: str, html: str) -> None:
    from irc.passmanager import write_atomic

    write_atomic(path, html)
    print(f"wrote {path} (report, {len(html.encode()) / 1024:.0f} KiB)", file=sys.stderr)


def cmd_report(args) -> int:
    from irc.report.html import build_report

    input_graph = None
    if args.spec:
        from irc_cli.spec import load
        input_graph = load(args.spec)
    plan = _read_plan(args.npu_plan) if args.npu_plan else None
    html = build_report(args.dump_dir, input_graph=input_graph, npu_plan=plan,
                        source_dirs=_folders(args.spec), times=not args.no_times)
    _write(args.output, html)
    return 0


def _folders(spec: Optional[str]) -> list[str]:
    return [os.path.dirname(os.path.abspath(spec))] if spec else []


class _Report:
    """What ``compile_report`` yields: ``write(manager, graph)`` after the passes ran."""

    def __init__(self, path: Optional[str], args, input_graph, times: bool = True):
        self.path, self.args, self.input_graph, self.times = path, args, input_graph, times

    def write(self, manager, graph, npu_plan: Optional[dict] = None) -> None:
        if not self.path:
            return
        from irc.report.html import build_report

        html = build_report(self.args.dump_dir, graph, input_graph=self.input_graph, records=manager.records,
                            passes=manager.passes, npu_plan=npu_plan, source_dirs=_folders(self.args.spec),
                            times=self.times)
        _write(self.path, html)


@contextmanager
def compile_report(args, graph, times: bool = True):
    """Around ``cmd_compile``'s passes. Without ``--report`` it does nothing. With it, the
    passes dump into ``--dump-dir`` or, when there is none, a temporary directory removed
    afterwards; the input graph is copied before any pass touches it."""
    path = getattr(args, "report", None)
    if not path:
        yield _Report(None, args, None)
        return
    own = None
    if not getattr(args, "dump_dir", None):
        own = tempfile.mkdtemp(prefix="irc-report-")
        args.dump_dir = own
    try:
        yield _Report(path, args, graph.clone(), times)
    finally:
        if own:
            shutil.rmtree(own, ignore_errors=True)
            args.dump_dir = None
