"""The documentation site and the README say only what the code does.

- Every fenced ``bash`` / ``sh`` / ``console`` block on the site (``docs/**/*.md``) and in
  README.md is run: each line is an ``irc`` command (``&&`` chains several), run in-process
  through ``irc_cli.main`` in one scratch folder per page (``examples/`` and ``tests/`` linked in, so
  later blocks of a page see what earlier ones wrote) and must exit 0. A block that cannot run
  here (the network, a real checkpoint, a GPU, the set-up itself) is preceded by
  ``<!-- not-run: REASON -->``, and the reason may not be empty.
- Every ``python`` block is executed in that folder; every ``yaml`` block must parse.
- The generated pages (``docs/gen.py``: CLI, passes, targets, families) equal what the
  generator writes from the registries now.
"""
import contextlib
import importlib.util
import re
import shlex
import tempfile
from pathlib import Path

import pytest
import yaml

from irc_cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
MARKER = re.compile(r"<!--\s*not-run:(.*?)-->")
SHELL = ("bash", "sh", "console")


def blocks(text: str):
    """(language, code, reason or None) of each fenced block; the reason comes from a
    ``<!-- not-run: ... -->`` on the last non-blank line before the fence."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)(```+)\s*(\w*)", lines[i])
        if not fence:
            i += 1
            continue
        indent, ticks, lang = fence.groups()
        before = next((line for line in reversed(lines[:i]) if line.strip()), "")
        marker = MARKER.search(before)
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(ticks):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        yield lang, "\n".join(body), (marker.group(1).strip() if marker else None)


def commands(code: str):
    """The irc commands of a shell block: comments dropped, ``$ `` prompts and ``&&`` chains
    split, backslash continuations joined."""
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line.strip().removeprefix("$ "), comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            yield words[:cut]
            words = words[cut + 1:]


def run_irc(words, where: Path) -> tuple[int, str]:
    assert words[0] == "irc", f"a runnable block holds irc commands only, not {' '.join(words)!r}"
    with tempfile.TemporaryFile("w+") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(words[1:])
        except SystemExit as exit_:  # argparse
            code = exit_.code
        out.seek(0)
        return code, out.read()


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_blocks_run(page, tmp_path, monkeypatch):
    for shared in ("examples", "tests"):  # the tiny examples, and golden inputs (tests/golden/*.before.ir)
        (tmp_path / shared).symlink_to(ROOT / shared)
    monkeypatch.chdir(tmp_path)
    for lang, code, reason in blocks(page.read_text()):
        if reason is not None:
            assert reason, f"{page.name}: a not-run marker must say why"
            continue
        if lang in SHELL:
            for words in commands(code):
                code_, output = run_irc(words, tmp_path)
                assert code_ == 0, f"{page.name}: `{shlex.join(words)}` exited {code_}:\n{output[-3000:]}"
        elif lang == "python":
            exec(compile(code, f"{page.name}:python", "exec"), {"__name__": "__docs__"})
        elif lang == "yaml":
            yaml.safe_load(code)


def test_markers_precede_blocks():
    """A not-run marker is followed by a block (a stray one would hide nothing it names)."""
    for page in PAGES:
        text = page.read_text()
        for marker in MARKER.finditer(text):
            after = text[marker.end():].lstrip()
            assert after.startswith("```"), f"{page.name}: a not-run marker not followed by a block"


def test_generated_pages_current():
    spec = importlib.util.spec_from_file_location("docs_gen", ROOT / "docs" / "gen.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    for path, text in gen.render().items():
        assert (ROOT / "docs" / path).read_text() == text, f"docs/{path} is stale: run python docs/gen.py"


def test_nav_lists_every_page():
    """mkdocs.yml's nav names every page under docs/, and nothing else."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python/name:", ""))

    def listed(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            yield from (listed(value) if isinstance(value, list) else [value])
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert set(listed(config["nav"])) == pages
