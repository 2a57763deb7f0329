"""Untrusted files stay data: no module of irc evaluates, unpickles or executes anything it
reads. An AST scan of irc, frontends, passes, backends and irc_cli finds no eval/exec/
compile/__import__, no pickle-family import, no unsafe YAML loader, no ``allow_pickle=True``,
no ``shell=True``, no ``os.system``, no ``torch.load`` without ``weights_only=True``, and
``exec_module`` only where a file is a program by design: the DSL ``.py`` spec loader (a
.py spec is a program; run only specs you trust) and the Triton backend's loader of the
module irc itself emitted (used by tests, never given a user's file)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("irc", "frontends", "passes", "backends", "irc_cli")
ALLOWED = {("frontends/__init__.py", "_load_python", "exec_module"),
           ("backends/triton/emit.py", "load_module", "exec_module")}

BUILTINS = {"eval", "exec", "compile", "__import__", "breakpoint"}
MODULES = {"pickle", "cPickle", "_pickle", "dill", "shelve", "marshal", "cloudpickle", "joblib"}
YAML_UNSAFE = {"load", "load_all", "unsafe_load", "unsafe_load_all", "full_load", "full_load_all", "Loader",
               "UnsafeLoader", "FullLoader", "UnsafeConstructor", "FullConstructor"}
CALLS = {("os", "system"), ("os", "popen"), ("os", "execv"), ("os", "execve"), ("os", "execvp")}


class Finder(ast.NodeVisitor):
    """Collects (file, function, what) for each forbidden construct."""

    def __init__(self, path: str):
        self.path, self.function, self.found = path, "<module>", []

    def flag(self, what: str) -> None:
        if (self.path, self.function, what) not in ALLOWED:
            self.found.append((self.path, self.function, what))

    def visit_FunctionDef(self, node):
        saved, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = saved

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node):
        for alias in node.names:
            if alias.name.split(".")[0] in MODULES:
                self.flag(f"import {alias.name}")

    def visit_ImportFrom(self, node):
        if (node.module or "").split(".")[0] in MODULES:
            self.flag(f"from {node.module} import")
        if node.module == "yaml" and any(a.name in YAML_UNSAFE for a in node.names):
            self.flag("from yaml import an unsafe loader")

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and node.value.id == "yaml" and node.attr in YAML_UNSAFE:
            self.flag(f"yaml.{node.attr}")
        if isinstance(node.value, ast.Name) and (node.value.id, node.attr) in CALLS:
            self.flag(f"{node.value.id}.{node.attr}")
        if node.attr == "exec_module":
            self.flag("exec_module")
        self.generic_visit(node)

    def visit_Call(self, node):
        if isinstance(node.func, ast.Name) and node.func.id in BUILTINS:
            self.flag(f"{node.func.id}()")
        for keyword in node.keywords:
            if keyword.arg in ("allow_pickle", "shell") and not _is_false(keyword.value):
                self.flag(f"{keyword.arg}=...")
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "load" and isinstance(func.value, ast.Name) \
                and func.value.id == "torch":
            weights_only = [k for k in node.keywords if k.arg == "weights_only"]
            if not weights_only or not (isinstance(weights_only[0].value, ast.Constant)
                                        and weights_only[0].value.value is True):
                self.flag("torch.load without weights_only=True")
        self.generic_visit(node)


def _is_false(value) -> bool:
    return isinstance(value, ast.Constant) and value.value in (False, None)


def scan(source: str, path: str) -> list:
    finder = Finder(path)
    finder.visit(ast.parse(source, filename=path))
    return finder.found


def test_no_module_executes_its_input():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += scan(path.read_text(), path.relative_to(ROOT).as_posix())
    assert found == []


def test_the_allowed_places_exist():
    """The two exceptions are still where they are said to be (a moved loader is re-checked)."""
    for path, function, what in ALLOWED:
        finder = Finder(path)
        finder.visit(ast.parse((ROOT / path).read_text()))
        assert finder.found == [], finder.found
        assert f"def {function}(" in (ROOT / path).read_text()


def test_the_scan_finds_what_it_looks_for():
    planted = """
import pickle
import yaml
from yaml import FullLoader
def f(text, path):
    eval(text)
    exec(text)
    yaml.load (text, Loader=yaml.Loader)
    np.load(path, allow_pickle=True)
    subprocess.run(text, shell=True)
    os.system(text)
    torch.load(path)
    spec.loader.exec_module(module)
"""
    whats = [what for _, _, what in scan(planted, "planted.py")]
    assert whats == ["import pickle", "from yaml import an unsafe loader", "eval()", "exec()", "yaml.load",
                     "yaml.Loader", "allow_pickle=...", "shell=...", "os.system", "torch.load without weights_only=True",
                     "exec_module"]
