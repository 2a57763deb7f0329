"""``moe-sort`` models (moe_route, moe_dispatch, grouped_gemm) through both ONNX targets in
ONNX Runtime, held against the reference interpreter (1e-5): a left-padded prefill and a
few greedy decode steps, with and without a capacity that drops pairs."""
from pathlib import Path

import onnx
import pytest

import passes  # noqa: F401  (registers the passes)
from backends.onnx.emit import emit_model
from backends.onnx.runtime import greedy, interpreter_engine, ort_engine
from backends.onnx.targets import TARGETS
from frontends import load_spec
from irc.passmanager import PassManager, parse_pipeline
from irc.weights import seed_absent
from test_onnx_models import PROMPTS, assert_matches

NEW_TOKENS = 5
CASES = {
    "mixtral": ("examples/tiny-mixtral-8x7b.yaml", "moe-sort", 23),
    "mixtral-capacity": ("examples/tiny-mixtral-8x7b.yaml", "moe-sort{capacity_factor=0.5}", 23),
    "deepseek-v2": ("examples/tiny-deepseek-v2.yaml", "moe-sort", 23),
    "deepseek-v3-opset21": ("examples/tiny-deepseek-v3.yaml", "moe-sort{capacity_factor=1.0}", 21),
}


def compile_with(spec: str, pipeline: str, target: str, opset: int, directory: Path):
    graph = load_spec(spec)
    seed_absent(graph, 0)  # before the passes, which may derive weights from these
    PassManager(parse_pipeline(f"{pipeline},{TARGETS[target].pipeline(opset)}")).run(graph)
    path = directory / f"model.{target}.onnx"
    emit_model(graph, str(path), target=target, opset=opset, context=64)
    onnx.checker.check_model(str(path), full_check=True)
    return graph, str(path)


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("case", CASES)
def test_sorted_moe_matches_the_interpreter(case, target, tmp_path):
    spec, pipeline, opset = CASES[case]
    graph, path = compile_with(spec, pipeline, target, opset, tmp_path)
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert {"Loop", "TopK", "ScatterND"} <= ops and "MoE" not in ops
    ref = greedy(interpreter_engine(graph), graph, PROMPTS, NEW_TOKENS)
    assert_matches(greedy(ort_engine(path), graph, PROMPTS, NEW_TOKENS), ref)
