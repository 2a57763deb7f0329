"""Ungated squared-ReLU experts (``moe`` with ``activation="relu2"``: Nemotron-H's MoE, the form
of Nemotron-3 Nano) on the targets beyond the reference interpreter and ONNX Runtime (those, and
transformers, judge the twin in ``tests/frontends/test_hf_ssm.py`` / ``test_hf_ssm_onnx.py``):
Triton's default pipeline (moe-sort's grouped GEMMs, one weight per expert's first GEMM) in its
interpreter, the NumPy emitter bit for bit, onnx-npu's greedy tokens, and npu-tile's plan of the
ungated experts that the tiled executor reproduces."""
from __future__ import annotations

from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from frontends import load_spec  # noqa: E402
from tests.frontends.test_hf_models import TOLERANCE, built_once, irc_logits, prompts, relative_error  # noqa: E402

pytest.importorskip("transformers")
NAME = "nemotron-h-moe"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tests.frontends.test_hf_ssm import build_case
    return str(built_once(build_case, tmp_path_factory)(NAME)[1])


def test_triton_prefill_matches_the_reference(folder, tmp_path):
    from backends.onnx import runtime
    from tests.frontends.test_hf_targets import triton_engine

    graph, engine = triton_engine(folder, tmp_path, NAME)
    assert not any(n.op == "moe" for n in graph.nodes)  # moe-sort's grouped GEMMs
    ids, mask, positions = prompts()
    rows = [ids[0].tolist(), ids[1][mask[1] == 1].tolist()]
    result = runtime.greedy(engine, graph, rows, 3)
    real = mask.astype(bool)
    want = irc_logits(load_spec(folder), ids, mask, positions)[real]
    assert relative_error(np.asarray(result["prefill"]["logits"])[real], want) <= TOLERANCE


def test_numpy_module_matches_the_reference_exactly(folder, tmp_path):
    from irc.interpreter import random_feeds
    from tests.backends.test_numpy_emit import assert_matches_interpreter

    graph = load_spec(folder)
    assert_matches_interpreter(graph, random_feeds(graph, batch=2, tokens=3, past=2, left_pad=1), tmp_path)


def test_onnx_npu_f32_generates_the_reference_tokens(folder, tmp_path):
    from backends.onnx_npu.host import generate
    from irc.interpreter import generate as reference_generate
    from irc_cli.commands import main

    prompt = prompts()[0][0].tolist()
    expected, _ = reference_generate(load_spec(folder), prompt, 4)
    assert main(["compile", folder, "--target", "onnx-npu", "-o", str(tmp_path / "npu"), "--context", "32",
                 "--chunk", "4", "--quiet", "--precision", "f32"]) == 0
    assert generate(str(tmp_path / "npu"), prompt, 4) == expected


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_npu_tile_plans_the_ungated_experts(folder, dtype):
    """The experts' first GEMM reads one weight (up) and ends in the relu2 step; the tiled run
    equals the untiled reference, its DMA the plan's."""
    from passes.npu_tile.plan import machine_of, plan_graph
    from tests.backends.test_npu_executor import check, mini

    plan = plan_graph(load_spec(folder), mini(), tokens=6, past=5, dtype=dtype)
    experts = [r for r in plan["ops"] if ":experts.gate_up" in r["name"] or ":shared.gate_up" in r["name"]]
    assert experts and all(r["shape"]["weights"] == 1 and r["epilogue"][-1]["activation"] == "relu2"
                           for r in experts)
    for record in experts:
        check(record, machine_of(plan))
