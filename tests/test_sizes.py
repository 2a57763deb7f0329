"""Small files and short functions (STYLE.md): no module of the shipped packages over 500
lines, no function or method over 80 (decorators to last line). tests/ and benchmarks/ are
not held to it."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("irc", "frontends", "passes", "backends", "irc_cli")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def too_long(path: Path, root: Path = ROOT) -> list[str]:
    """``path:line name: N lines`` for the module and each function past its limit."""
    text = path.read_text()
    where = path.relative_to(root)
    found = []
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{where}: {lines} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            length = node.end_lineno - first + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{where}:{node.lineno} {node.name}: {length} lines (at most {MAX_FUNCTION_LINES})")
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_modules_and_functions_stay_small(package):
    found = [entry for path in sorted((ROOT / package).rglob("*.py")) for entry in too_long(path)]
    assert not found, "\n".join(found)


def test_the_check_sees_a_long_function_and_module(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(79))
    path = tmp_path / "probe.py"
    path.write_text(f"@staticmethod\ndef long():\n{body}\n")
    assert too_long(path, tmp_path) == ["probe.py:2 long: 81 lines (at most 80)"]
    path.write_text(f"def short():\n{body}\n" + "\n" * 421)
    assert too_long(path, tmp_path) == ["probe.py: 501 lines (at most 500)"]
