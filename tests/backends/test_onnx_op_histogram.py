"""The ONNX graphs the tiny example models compile to, as op histograms held against
``tests/golden/onnx_ops/<model>.json`` (both ONNX targets, default options).

CPU speed on ONNX Runtime is a property of the graph: an extra Reshape that copies the
logits, a head read through a transposed copy, an unfused norm. A timing test would be
noisy; a changed histogram shows the same regression in review. After a deliberate change
to the emitted graphs, accept the new histograms with

    .venv/bin/python -m pytest tests/backends/test_onnx_op_histogram.py --update-golden

and give the measured effect (``benchmarks/cpu_speed.py``) in the commit message.
"""
from __future__ import annotations

import collections
import glob
import json
import os

import pytest

import passes  # noqa: F401  (registers the passes)
from backends.onnx.emit import build
from backends.onnx.targets import TARGETS, whole_pipeline
from frontends import load_spec
from irc.passmanager import PassManager, parse_pipeline
from irc.testing import golden

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(ROOT, "examples", "tiny-*.yaml")))


def histogram(spec: str, target: str) -> dict:
    """{op type (``com.microsoft.`` prefixed where it is one): count} of the emitted graph."""
    graph = load_spec(spec)
    PassManager(parse_pipeline(whole_pipeline(target, {}))).run(graph)
    nodes = build(graph, target=target).nodes
    counts = collections.Counter((f"{n.domain}." if n.domain else "") + n.op_type for n in nodes)
    return dict(sorted(counts.items()))


@pytest.mark.parametrize("model", MODELS)
def test_op_histogram_matches_golden(model):
    got = {target: histogram(os.path.join(ROOT, "examples", f"{model}.yaml"), target) for target in sorted(TARGETS)}
    path = golden.directory / "onnx_ops" / f"{model}.json"
    text = json.dumps(got, indent=1, sort_keys=True) + "\n"
    if golden.update:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), (f"{path} is missing; write it with: .venv/bin/python -m pytest "
                           f"tests/backends/test_onnx_op_histogram.py --update-golden")
    expected = json.loads(path.read_text())
    changes = [f"  {target} {op}: {expected.get(target, {}).get(op, 0)} -> {got[target].get(op, 0)}"
               for target in sorted(set(got) | set(expected))
               for op in sorted(set(got.get(target, {})) | set(expected.get(target, {})))
               if expected.get(target, {}).get(op, 0) != got.get(target, {}).get(op, 0)]
    assert not changes, (f"the ONNX graphs of {model} changed (op counts, golden {path}):\n" + "\n".join(changes)
                         + "\nIf deliberate, measure it (benchmarks/cpu_speed.py), then accept with: "
                         ".venv/bin/python -m pytest tests/backends/test_onnx_op_histogram.py --update-golden")
