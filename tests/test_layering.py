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


# ---- no import circles -------------------------------------------------------------------
# Within the packages (and benchmarks/, whose scripts import each other by bare name), the
# modules' imports, lazy ones inside functions and TYPE_CHECKING ones included, form no
# circle: what two modules share lives one floor down, in a module both import.
CIRCLE_ROOTS = PACKAGES + ("benchmarks",)


def module_files() -> dict[str, tuple[Path, bool]]:
    """module name -> (its file, whether it is a package's __init__)."""
    found = {}
    for root in CIRCLE_ROOTS:
        for path in sorted((ROOT / root).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def imported_modules(name: str, path: Path, package: bool, modules: dict) -> set[str]:
    """The modules of ``modules`` that ``name`` imports (a name imported from a module counts
    as that module, a submodule imported from a package as the submodule)."""
    here = name if package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here.split(".")[:len(here.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        if name.startswith("benchmarks."):  # a benchmark imports its neighbours by bare name
            targets = [f"benchmarks.{t}" if f"benchmarks.{t.split('.')[0]}" in modules else t for t in targets]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_circles():
    modules = module_files()
    edges = {name: imported_modules(name, path, package, modules) for name, (path, package) in modules.items()}
    found = circles(edges)
    described = [" <-> ".join(component) + "\n    " + "\n    ".join(
        f"{a} -> {b}" for a in component for b in sorted(edges[a]) if b in component) for component in found]
    assert not found, f"{len(found)} import circle(s):\n" + "\n".join(described)


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
