"""A harness for pass tests, and the numeric comparison behind ``--check``.

A pass test pins behaviour three ways (see STYLE.md): the printed IR before and after
(golden files), the ``changed`` flag, and numbers through the reference interpreter.

```python
from irc.testing import assert_pass, assert_unchanged

def test_rms_norm_lowers():
    graph = build_small_graph()                      # irc.build.emit / emit1
    assert assert_pass(LowerNorms(), graph, golden="lower-norms")
    assert_unchanged(LowerNorms(), graph_without_norms())
```

Golden files live in ``golden.directory`` (``tests/golden`` by default) as
``<name>.before.ir`` and ``<name>.after.ir``; ``pytest --update-golden`` (set up in
``tests/conftest.py``) sets ``golden.update`` so they are rewritten instead of compared.

Nothing here imports pytest; failures raise ``AssertionError``. The numbers come from
``irc.check`` (the comparison ``--check`` uses).
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

import numpy as np

from irc.check import compare_outputs
from irc.graph import Graph
from irc.printer import print_graph
from irc.verify import verify


@dataclass
class GoldenSettings:
    """Where golden files live and whether to rewrite them (``--update-golden``)."""

    directory: Path = Path(__file__).resolve().parent.parent / "tests" / "golden"
    update: bool = False


golden = GoldenSettings()

# ---- pass tests ------------------------------------------------------------------------

def apply_pass(pass_obj, graph: Graph) -> tuple[Graph, bool]:
    """Run ``pass_obj`` on a clone of ``graph`` (verified before and after); returns
    ``(clone, changed)``. Asserts that ``changed`` is honest: True exactly when the printed
    graph differs (the pass manager holds passes to the same rule)."""
    verify(graph)
    result = graph.clone()
    before = print_graph(result)
    changed = pass_obj.run(result)
    if not isinstance(changed, bool):
        raise AssertionError(f"pass {pass_obj.name} returned {changed!r}, not a bool")
    verify(result)
    after = print_graph(result)
    if not changed and after != before:
        raise AssertionError(f"pass {pass_obj.name} returned False but changed the graph:\n"
                             + text_diff(before, after))
    if changed and after == before:
        raise AssertionError(f"pass {pass_obj.name} returned True but the printed graph did not change")
    return result, changed


def assert_pass(pass_obj, graph: Graph, *, golden: Optional[str] = None,
                feeds: Optional[Mapping[str, np.ndarray]] = None, rtol: float = 1e-5, seed: int = 0) -> bool:
    """Run a pass the way every pass test should, and return its ``changed`` flag.

    1. runs the pass on a clone of ``graph`` and verifies the result;
    2. with ``golden="name"``, compares the printed IR before and after with
       ``name.before.ir`` / ``name.after.ir`` (rewritten under ``--update-golden``);
    3. checks that the outputs (names and values) match through the reference
       interpreter on seeded weights and ``feeds`` (seeded inputs by default) within
       ``rtol`` relative error;
    4. runs the pass again and checks that it returns False and leaves the text
       byte-identical (idempotence).
    ``graph`` itself is not modified.
    """
    after, changed = apply_pass(pass_obj, graph)
    before_text, after_text = print_graph(graph), print_graph(after)
    if golden is not None:
        check_golden(f"{golden}.before.ir", before_text)
        check_golden(f"{golden}.after.ir", after_text)
    names_before = [v.name for v in graph.outputs]
    names_after = [v.name for v in after.outputs]
    if names_before != names_after:
        raise AssertionError(f"pass {pass_obj.name} renamed the graph outputs: {names_before} -> {names_after}")
    error = compare_outputs(graph, after, feeds, seed)
    if not error <= rtol:
        raise AssertionError(f"pass {pass_obj.name} moved the outputs by {error:.3g} (relative), "
                             f"tolerance {rtol:g}")
    again = pass_obj.run(after)
    verify(after)
    if again is not False:
        raise AssertionError(f"pass {pass_obj.name} is not idempotent: a second run returned {again!r}")
    if print_graph(after) != after_text:
        raise AssertionError(f"pass {pass_obj.name} is not idempotent: a second run changed the graph:\n"
                             + text_diff(after_text, print_graph(after)))
    return changed


def assert_unchanged(pass_obj, graph: Graph) -> None:
    """A graph with nothing for the pass to do: it returns False and the text is unchanged."""
    _, changed = apply_pass(pass_obj, graph)
    if changed:
        raise AssertionError(f"pass {pass_obj.name} reported a change on a graph with nothing to do")


# ---- golden files ----------------------------------------------------------------------

def check_golden(filename: str, text: str) -> None:
    """Compare ``text`` with the golden file, or write it when ``golden.update`` is set."""
    path = Path(golden.directory) / filename
    if golden.update:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            tmp = path.with_name(f".tmp-{path.name}")
            tmp.write_text(text)
            os.replace(tmp, path)
        return
    if not path.exists():
        raise AssertionError(f"golden file {path} is missing; run pytest with --update-golden to write it")
    expected = path.read_text()
    if expected != text:
        raise AssertionError(f"{path} differs (run pytest with --update-golden to accept):\n"
                             + text_diff(expected, text, str(path), "actual"))


def text_diff(old: str, new: str, old_name: str = "before", new_name: str = "after") -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        old_name, new_name))


def run_op(name: str, inputs: list, attrs: Optional[dict] = None) -> list:
    """Run one op's reference on arrays, after inferring on their types, and check that the
    results have the inferred dtypes and shapes (for op tests)."""
    from irc import ops
    from irc.dtypes import DType
    from irc.graph import Value

    opdef = ops.get_op(name)
    attrs = opdef.normalize_attrs(attrs)
    values = [None if a is None else Value(f"in{i}", DType.of(a), a.shape) for i, a in enumerate(inputs)]
    inferred = ops.infer(name, values, attrs)
    outs = opdef.reference(inputs, attrs)
    got = [(o.dtype, o.shape) for o in outs]
    want = [(t.dtype.numpy, t.shape) for t in inferred]
    if got != want:
        raise AssertionError(f"{name}: reference returned {got}, inference says {want}")
    return outs


def one_graph(path) -> bool:
    """Is the example spec at ``path`` one graph? A VLM (``image_input:``, a vision model
    beside its decoder) compiles to the ONNX targets only; the others refuse it by name."""
    with open(path, encoding="utf-8") as f:
        return "image_input:" not in f.read()
