"""``irc report DUMP_DIR -o FILE`` and the ``--report`` helper ``cmd_compile`` calls."""
from __future__ import annotations

import argparse
import os

import pytest

from irc.errors import IRCError
from irc_cli import report as report_cli
from irc.passmanager import PassManager, parse_pipeline

from report_runs import ROOT, TINY_PIPELINE, TINY_SPEC
from test_report_npu import PLAN


def _parse(argv):
    parser = argparse.ArgumentParser(prog="irc")
    report_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_report_command(tiny_run, tmp_path, capsys):
    out = tmp_path / "report.html"
    args = _parse(["report", tiny_run.dump_dir, "-o", str(out), "--spec", str(ROOT / TINY_SPEC), "--no-times"])
    assert args.func(args) == 0
    html = out.read_text()
    assert "wrote " in capsys.readouterr().err
    assert 'href="#src0-L' in html and '<section id="npu">' not in html
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]       # written atomically


def test_report_command_with_a_plan_file(tiny_run, tmp_path):
    import json
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    args = _parse(["report", tiny_run.dump_dir, "-o", str(tmp_path / "r.html"), "--npu-plan", str(plan)])
    args.func(args)
    assert '<section id="npu">' in (tmp_path / "r.html").read_text()
    plan.write_text("{not json")
    with pytest.raises(IRCError, match="not JSON"):
        args.func(args)
    assert _parse(["report", "missing", "-o", "x.html"]).func is report_cli.cmd_report
    with pytest.raises(IRCError, match="no such dump directory"):
        args = _parse(["report", str(tmp_path / "missing"), "-o", str(tmp_path / "x.html")])
        args.func(args)
    assert not (tmp_path / "x.html").exists()


def _compile(args, graph):
    """What cmd_compile does around its passes."""
    with report_cli.compile_report(args, graph) as report:
        manager = PassManager(parse_pipeline(TINY_PIPELINE), dump_dir=args.dump_dir)
        manager.run(graph)
        dump_dir = args.dump_dir
        report.write(manager, graph)
    return dump_dir


def test_compile_report_uses_a_temporary_dump_directory(tmp_path):
    from frontends import load_spec

    out = tmp_path / "report.html"
    args = argparse.Namespace(spec=str(ROOT / TINY_SPEC), report=str(out), dump_dir=None)
    used = _compile(args, load_spec(args.spec))
    assert used and not os.path.exists(used) and args.dump_dir is None
    html = out.read_text()
    assert "mla-absorb" in html and 'href="#src0-L' in html


def test_compile_report_keeps_a_given_dump_directory_and_does_nothing_without_report(tmp_path):
    from frontends import load_spec

    args = argparse.Namespace(spec=str(ROOT / TINY_SPEC), report=str(tmp_path / "r.html"), dump_dir=str(tmp_path / "d"))
    assert _compile(args, load_spec(args.spec)) == str(tmp_path / "d") and os.path.isdir(tmp_path / "d")
    args = argparse.Namespace(spec=str(ROOT / TINY_SPEC), report=None, dump_dir=None)
    assert _compile(args, load_spec(args.spec)) is None


def test_wired_into_irc_cli(tmp_path, capsys):
    """`irc compile --report` and `irc report` run end to end."""
    from irc_cli import commands as cli

    out = tmp_path / "compile.html"
    assert cli.main(["compile", str(ROOT / TINY_SPEC), "--passes", "mla-absorb,lower-norms,cse,dce",
                     "--report", str(out)]) == 0
    assert "mla-absorb" in out.read_text()
    dump = tmp_path / "dump"
    assert cli.main(["compile", str(ROOT / TINY_SPEC), "--passes", "dce,cse", "--dump-dir", str(dump)]) == 0
    assert cli.main(["report", str(dump), "-o", str(tmp_path / "r.html")]) == 0
    assert cli.main(["report", str(tmp_path / "nothing"), "-o", str(tmp_path / "n.html")]) == 2
