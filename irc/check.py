"""The numeric comparison behind ``--check``: run graphs through the reference interpreter
on seeded inputs and weights, and measure how far their outputs moved.

``compare_outputs(before, after)`` is what the pass manager's checker calls after a pass;
``run_reference`` and ``check_feeds`` are the pieces. The interpreter is the core's own
instrument (``irc.interpreter``), so nothing here reaches outside ``irc``.
"""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from irc.graph import Graph
from irc.world import full_view
from irc.interpreter import bind_symbols, past_inputs, present_name, random_feeds, run

# Sizes the numeric comparison binds symbols to: small, but with a nonempty past cache.
CHECK_BATCH, CHECK_TOKENS, CHECK_PAST = 2, 3, 2


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
    narrowed = [_last_position(old, new) for old, new in zip(before.outputs, after.outputs)]
    return max((relative_error(a, b[:, -1:] if last else b) for a, b, last in zip(actual, expected, narrowed)),
               default=0.0)


def _last_position(old, new) -> bool:
    """Did a pass narrow this output from [B, T, ...] to its last position [B, 1, ...]
    (``last-logits``)? Then only the last row of the expected output is compared."""
    return (old.name == new.name and old.rank == new.rank >= 2 and isinstance(old.shape[1], str)
            and new.shape[1] == 1 and old.shape[:1] + old.shape[2:] == new.shape[:1] + new.shape[2:])


def compare_own_caches(before: Graph, after: Graph, feeds: Optional[Mapping[str, np.ndarray]] = None,
                       seed: int = 0) -> float:
    """Max relative error of ``after`` against ``before`` when their inputs differ.

    1. Prefill: both graphs run at P = 0, each on its own seeded feeds (``random_feeds``
       with the same seed and sizes), the inputs they share (same name, dtype and shape:
       ``input_ids``, ``attention_mask``, ``position_ids``) taken from ``before``'s feeds.
    2. Decode: when the graphs have cache inputs and every one has its ``present.*``
       output, one more token runs with each graph fed its own present caches back as
       ``past_key_values.*``, the shared inputs again from ``before``'s feeds.

    The caches are each graph's own state: cache and recurrent-state inputs
    (``past_key_values.*``) are never shared, and their ``present.*`` outputs, like the outputs of any input that
    differs, are not compared (a cache whose shape happens to match may hold something
    else); they are held through what they do to the other outputs at the decode step.
    Outputs are matched by name; a different set of names is an infinite error. Batch and
    token counts come from ``feeds`` (bound against ``before``) or default to the check
    sizes.

    A pass that fixes an input (``fix-image-grid``: one image size) leaves a specialised
    input (same name and dtype, its symbolic dims now numbers) and may drop one it bound to a
    value (``after.meta["bound_inputs"]``: the image grid). ``before`` then runs on
    ``after``'s array of the one and the bound value of the other, so both compute the same
    thing.
    """
    sizes = bind_symbols(before, feeds) if feeds is not None else {}
    batch, tokens = sizes.get("B", CHECK_BATCH), sizes.get("T", CHECK_TOKENS)
    graphs = (before, after)
    caches = [past_inputs(g) for g in graphs]
    private = {c.name for cs in caches for c in cs}
    old, new = _signature(before), _signature(after)
    shared = {name for name in old if old[name] == new.get(name) and name not in private}
    pair = _own_feeds(graphs, shared, batch, tokens, 0, sizes, seed)
    fixed = _fixed_inputs(before, after, pair[1])
    pair[0].update(fixed)
    shared |= set(fixed)
    moved = {present_name(name) for name in set(old) | set(new) if name not in shared}
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


def _fixed_inputs(before: Graph, after: Graph, feeds: dict) -> dict:
    """``before``'s feeds for the inputs a pass fixed (``compare_own_caches``): a specialised
    input gets ``after``'s array, a dropped one its bound value."""
    new = {v.name: v for v in after.inputs}
    bound = after.meta.get("bound_inputs") or {}
    fixed = {}
    for value in before.inputs:
        twin = new.get(value.name)
        if twin is None and value.name in bound:
            fixed[value.name] = np.asarray(bound[value.name], dtype=value.dtype.numpy)
        elif (twin is not None and twin.dtype == value.dtype and twin.shape != value.shape
              and len(twin.shape) == len(value.shape) and all(isinstance(d, int) for d in twin.shape)
              and all(isinstance(a, str) or a == b for a, b in zip(value.shape, twin.shape))):
            fixed[value.name] = feeds[value.name]
    return fixed


def _signature(graph: Graph) -> dict:
    """The inputs' names and types (a sharded graph's as its world takes them: ``irc.world``)."""
    return {v.name: (v.dtype, v.shape) for v in full_view(graph, graph.inputs)}


def _own_feeds(graphs, shared: set, batch: int, tokens: int, past: int, sizes: dict, seed: int) -> list[dict]:
    """Seeded feeds for each graph; the shared inputs are the first graph's arrays."""
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
    return run(graph.clone(), feeds, seed=seed)
