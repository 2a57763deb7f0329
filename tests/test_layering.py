"""The layering rule (DESIGN.md): data flows frontend -> Graph -> passes -> backend.

``irc`` (the core) imports none of the other packages; frontends and backends import only
``irc``; passes import ``irc`` and each other; only ``irc_cli`` imports everything. Every
import counts, lazy ones inside functions too: a lazy import hides a cycle, not a dependency.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("irc", "frontends", "passes", "backends", "irc_cli")
ALLOWED = {"irc": {"irc"}, "frontends": {"irc", "frontends"}, "passes": {"irc", "passes"},
           "backends": {"irc", "backends"}, "irc_cli": set(PACKAGES)}


def imported_packages(path: Path) -> set[tuple[str, int]]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
        found |= {(name.split(".")[0], node.lineno) for name in names if name.split(".")[0] in PACKAGES}
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_follow_the_layers(package):
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {top}"
             for path in sorted((ROOT / package).rglob("*.py"))
             for top, line in sorted(imported_packages(path)) if top not in ALLOWED[package]]
    assert not wrong, "\n".join(wrong)
