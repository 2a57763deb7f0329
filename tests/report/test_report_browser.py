"""The report in headless Chromium: it renders (screenshot), the DOM holds the sections
and pass names, the console stays quiet, and the full-size Llama-3-8B report opens in time.

Chromium drives through its command line only (``--screenshot``, ``--dump-dom``, console
messages on stderr with ``--enable-logging=stderr``), with DNS mapped to nothing so a
page that reached for the network would show it. Skipped where Chromium is not installed
(``apt-get install chromium``; ``.ci/run`` installs it).
"""
from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from irc.report import build_report

from report_runs import BIG_PIPELINE, TINY_PIPELINE

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)")


def chromium(tmp_path, url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={tmp_path / 'profile'}",
               "--enable-logging=stderr", "--v=0", *args, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def console_messages(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if ":CONSOLE" in line]


def test_tiny_deepseek_report_renders(tiny_run, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(build_report(tiny_run.dump_dir, tiny_run.graph, input_graph=tiny_run.input_graph,
                                 records=tiny_run.manager.records, passes=tiny_run.manager.passes))
    shot = tmp_path / "report.png"
    result = chromium(tmp_path, page.as_uri(), f"--screenshot={shot}", "--window-size=1280,2400", "--hide-scrollbars")
    assert shot.exists(), result.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000        # not a blank page
    assert console_messages(result) == []

    result = chromium(tmp_path, page.as_uri(), "--dump-dom")
    dom = result.stdout
    assert console_messages(result) == []
    for section in ("pipeline", "passes", "model", "sources"):
        assert f'<section id="{section}">' in dom
    for name in TINY_PIPELINE.split(","):
        assert name in dom
    for heading in ("Passes that changed the graph", "One transformer block", "Parameters by component",
                    "KV cache against context", "Attention share of FLOPs per token"):
        assert heading in dom
    assert dom.count("<svg") >= 10


def test_full_size_llama3_8b_report_opens_in_time(big_run, tmp_path):
    page = tmp_path / "llama3-8b.html"
    html = build_report(big_run.dump_dir, big_run.graph, input_graph=big_run.input_graph,
                        records=big_run.manager.records, passes=big_run.manager.passes)
    page.write_text(html)
    assert len(html.encode()) < 5 * 2**20
    start = time.perf_counter()
    result = chromium(tmp_path, page.as_uri(), "--dump-dom", timeout=30)
    assert time.perf_counter() - start < 30
    assert console_messages(result) == []
    assert "Model at a glance" in result.stdout and BIG_PIPELINE.split(",")[-2] in result.stdout
