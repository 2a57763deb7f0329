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

Nothing here imports pytest; failures raise ``AssertionError``. The reference interpreter
(a backend) is imported inside the functions that run graphs, since the core never imports
a backend at import time.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

import numpy as np

from irc.graph import Graph
from irc.printer import print_graph
from irc.verify import verify


@dataclass
class GoldenSettings:
    """Where golden files live and whether to rewrite them (``--update-golden``)."""

    directory: Path = Path(__file__).resolve().parent.parent / "tests" / "golden"
    update: bool = False


golden = GoldenSettings()

# Sizes the numeric comparison binds symbols to: small, but with a nonempty past cache.
CHECK_BATCH, CHECK_TOKENS, CHECK_PAST = 2, 3, 2


# ---- numbers ---------------------------------------------------------------------------

def relative_error(actual, expected) -> float:
    """max |actual - expected| / max |expected| (inf on a shape mismatch, or a NaN or an
    infinity in one tensor only).

    Relative to the scale of the whole expected tensor rather than per element, so values
    near zero do not blow the error up; 0.0 when both are all zeros.
    """
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    same = (a == b) | (np.isnan(a) & np.isnan(b))  # equal infinities, NaN in both: no error
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(a - b))
    if np.isnan(diff).any():
        return float("inf")
    scale = float(np.max(np.abs(np.where(np.isfinite(b), b, 0.0))))
    worst = float(np.max(diff))
    if worst == 0.0:
        return 0.0
    return worst / scale if scale > 0 else float("inf")


def check_feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for ``graph`` at the small sizes the numeric check uses."""
    from backends.numpy.interpreter import random_feeds

    return random_feeds(graph, batch=CHECK_BATCH, tokens=CHECK_TOKENS, past=CHECK_PAST, seed=seed)


def run_reference(graph: Graph, feeds: Mapping[str, np.ndarray], seed: int = 0) -> list[np.ndarray]:
    """The graph's outputs (in order) through the reference interpreter.

    Runs a clone, so params without data are seeded (by name, from ``seed``) there and the
    caller's graph is not touched.
    """
    outputs = _run_named(graph, feeds, seed)
    return [outputs[v.name] for v in graph.outputs]


def compare_outputs(before: Graph, after: Graph, feeds: Optional[Mapping[str, np.ndarray]] = None,
                    seed: int = 0) -> float:
    """Max relative error over all outputs of ``after`` against ``before``.

    Both graphs run through the reference interpreter on the same inputs (``feeds``, or
    seeded ones from ``check_feeds``) and the same weights (params without data are seeded
    by name, so a param keeps its values across a pass). Outputs are matched by position;
    a different number of outputs is an infinite error. Usable as ``PassManager.checker``.

    When the two graphs' inputs differ (names, dtypes or shapes: a pass that changes what
    is cached, such as ``mla-absorb``), one set of feeds cannot serve both, and
    ``compare_own_caches`` compares them instead; ``feeds`` then only sets the sizes. A pass
    that changes what a cache holds while its type stays the same by accident (one MLA
    head with d_c = nope + rope and rope = v) cannot be told from the types; its tests call
    ``compare_own_caches`` directly.
    """
    if _signature(before) != _signature(after):
        return compare_own_caches(before, after, feeds, seed)
    if feeds is None:
        feeds = check_feeds(before, seed)
    expected = run_reference(before, feeds, seed)
    actual = run_reference(after, feeds, seed)
    if len(expected) != len(actual):
        return float("inf")
    return max((relative_error(a, b) for a, b in zip(actual, expected)), default=0.0)


def compare_own_caches(before: Graph, after: Graph, feeds: Optional[Mapping[str, np.ndarray]] = None,
                       seed: int = 0) -> float:
    """Max relative error of ``after`` against ``before`` when their inputs differ.

    1. Prefill: both graphs run at P = 0, each on its own seeded feeds (``random_feeds``
       with the same seed and sizes), the inputs they share (same name, dtype and shape:
       ``input_ids``, ``attention_mask``, ``position_ids``) taken from ``before``'s feeds.
    2. Decode: when the graphs have cache inputs and every one has its ``present.*``
       output, one more token runs with each graph fed its own present caches back as
       ``past_key_values.*``, the shared inputs again from ``before``'s feeds.

    The caches are each graph's own state: cache inputs (those with the past length P) are
    never shared, and their ``present.*`` outputs, like the outputs of any input that
    differs, are not compared (a cache whose shape happens to match may hold something
    else); they are held through what they do to the other outputs at the decode step.
    Outputs are matched by name; a different set of names is an infinite error. Batch and
    token counts come from ``feeds`` (bound against ``before``) or default to the check
    sizes.
    """
    from backends.numpy.interpreter import bind_symbols, cache_inputs, present_name

    sizes = bind_symbols(before, feeds) if feeds is not None else {}
    batch, tokens = sizes.get("B", CHECK_BATCH), sizes.get("T", CHECK_TOKENS)
    graphs = (before, after)
    caches = [cache_inputs(g) for g in graphs]
    private = {c.name for cs in caches for c in cs}
    old, new = _signature(before), _signature(after)
    shared = {name for name in old if old[name] == new.get(name) and name not in private}
    moved = {present_name(name) for name in set(old) | set(new) if name not in shared}

    pair = _own_feeds(graphs, shared, batch, tokens, 0, sizes, seed)
    outputs = [_run_named(g, f, seed) for g, f in zip(graphs, pair)]
    error = _named_error(outputs[0], outputs[1], moved)
    if any(caches) and all(present_name(c.name) in out for cs, out in zip(caches, outputs) for c in cs):
        pair = _own_feeds(graphs, shared, batch, 1, tokens, sizes, seed + 1)
        for graph_feeds, graph_caches, out in zip(pair, caches, outputs):
            for cache in graph_caches:
                graph_feeds[cache.name] = out[present_name(cache.name)]
        outputs = [_run_named(g, f, seed) for g, f in zip(graphs, pair)]
        error = max(error, _named_error(outputs[0], outputs[1], moved))
    return error


def _signature(graph: Graph) -> dict:
    return {v.name: (v.dtype, v.shape) for v in graph.inputs}


def _own_feeds(graphs, shared: set, batch: int, tokens: int, past: int, sizes: dict, seed: int) -> list[dict]:
    """Seeded feeds for each graph; the shared inputs are the first graph's arrays."""
    from backends.numpy.interpreter import random_feeds

    pair = [random_feeds(g, batch, tokens, past, seed, sizes=sizes) for g in graphs]
    for name in shared:
        pair[1][name] = pair[0][name]
    return pair


def _named_error(expected: dict, actual: dict, skip: set) -> float:
    """Max relative error over the outputs both name, ``skip`` left out; inf when the
    names differ."""
    expected = {k: v for k, v in expected.items() if k not in skip}
    actual = {k: v for k, v in actual.items() if k not in skip}
    if list(expected) != list(actual):
        return float("inf")
    return max((relative_error(actual[k], expected[k]) for k in expected), default=0.0)


def _run_named(graph: Graph, feeds: Mapping[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    from backends.numpy.interpreter import run

    return run(graph.clone(), feeds, seed=seed)


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
