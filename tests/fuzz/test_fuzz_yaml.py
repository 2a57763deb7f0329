"""Mutated YAML specs (architecture form and graph form) and NPU target descriptions: every
case ends with exit 0 or one message and exit 2, in time, and no output unless it succeeded
(``fuzzing``)."""
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import check_irc, fuzz_settings, mutated_text, mutated_tree, workspace

pytestmark = pytest.mark.fuzz

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ARCHITECTURES = sorted(p for p in EXAMPLES.glob("tiny-*.yaml") if "graph" not in p.name)
GRAPH = EXAMPLES / "tiny-llama-graph.yaml"
TARGETS = sorted((EXAMPLES / "targets").glob("*.yaml"))


def _read(path: Path):
    return path.read_text(), yaml.safe_load(path.read_text())


SOURCES = {path.name: _read(path) for path in [*ARCHITECTURES, GRAPH, *TARGETS]}


@st.composite
def mutated_file(draw, name: str) -> bytes:
    text, tree = SOURCES[name]
    if draw(st.booleans()):
        return yaml.safe_dump(draw(mutated_tree(tree)), sort_keys=False, allow_unicode=True).encode()
    return draw(mutated_text(text))


def _spec_command(draw, spec: Path, outputs: Path) -> list[str]:
    if draw(st.booleans()):
        return ["show", str(spec)]
    return ["compile", str(spec), "--target", "ir", "-o", str(outputs / "model.ir")]


@fuzz_settings
@given(st.data(), st.sampled_from([p.name for p in ARCHITECTURES]))
def test_architecture_yaml(data, name):
    with workspace() as (inputs, outputs):
        spec = inputs / name
        spec.write_bytes(data.draw(mutated_file(name)))
        check_irc(_spec_command(data.draw, spec, outputs), outputs)


@fuzz_settings
@given(st.data())
def test_graph_yaml(data):
    with workspace() as (inputs, outputs):
        spec = inputs / GRAPH.name
        spec.write_bytes(data.draw(mutated_file(GRAPH.name)))
        check_irc(_spec_command(data.draw, spec, outputs), outputs)


@fuzz_settings
@given(st.data(), st.sampled_from([p.name for p in TARGETS]))
def test_npu_target_yaml(data, name):
    with workspace() as (inputs, outputs):
        target = inputs / name
        target.write_bytes(data.draw(mutated_file(name)))
        check_irc(["tile", str(EXAMPLES / "tiny-llama3.yaml"), "--target-npu", str(target), "--tokens", "8",
                   "--past", "16", "-o", str(outputs / "plan.json"), "--report", str(outputs / "plan.html")], outputs)
