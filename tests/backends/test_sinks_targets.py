"""Attention sinks (GPT-OSS) on the targets whose attention is not the ONNX one, lowered, not
refused: --target onnx-npu writes one constant sink column per grouped query row before the
Softmax (f32: the interpreter's greedy tokens; fp16: logits within 1e-2 relative, as
test_onnx_npu.py measures), and npu-tile plans the attention with its sinks (H fp32 logits
of traffic, held against a lower bound counting them) that the tiled executor reproduces,
stream by stream. Triton's kernels are in test_triton_sinks.py; the HF twins of GPT-OSS on
these targets in tests/frontends/test_hf_gpt_oss_targets.py."""
import numpy as np
import onnx
import pytest

from backends.npu.executor import execute, reference

from backends.npu.operands import random_operands
from backends.onnx_npu.host import generate, prefill_logits
from frontends.dsl import Model, Rope
from irc.check import relative_error
from irc.evaluate import StreamingInterpreter
from irc.evaluate import prefill_logits as reference_prefill
from irc.interpreter import generate as reference_generate
from irc.npu.target import load_target
from irc_cli.commands import main
from passes.npu_tile.plan import dumps, machine_of, plan_graph
from tests.backends.test_npu_executor import check, mini

PROMPT = [3, 17, 42, 9, 5, 7, 25, 11, 60, 61, 62]   # 11 tokens: 3 chunks of 4, past the window of 4


SINKS = np.array([1.5, -0.5, 3.0, 0.25], np.float32)  # of order one: they move the softmax


def sinks_model(sinks=True, window=4):
    """Two layers, GQA 4 over 2 with sinks (``SINKS``, the rest seeded), the first sliding
    (``window``), the second full."""
    m = Model("tiny-sinks", vocab=64, d_model=32)
    x = m.embed(m.input_ids())
    for layer, layer_window in zip(m.layers(2), (window, None)):
        x = x + layer.attention(layer.rms_norm(x, "attn_norm"), heads=4, kv_heads=2, head_dim=8,
                                rope=Rope(base=1e4), sinks=sinks, window=layer_window)
        x = x + layer.swiglu(layer.rms_norm(x, "mlp_norm"), d_ff=48)
    m.logits(m.rms_norm(x, "norm"))
    for index, param in enumerate(p for name, p in sorted(m.graph.params.items()) if name.endswith("attn.sinks")):
        param.data = SINKS * (1 + index)
    return m.graph


DSL = """from tests.backends.test_sinks_targets import sinks_model
model = sinks_model()
"""


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    path = tmp_path_factory.mktemp("sinks") / "sinks.py"
    path.write_text(DSL)
    return str(path)


def compile_npu(spec, folder, *extra):
    assert main(["compile", spec, "--target", "onnx-npu", "-o", str(folder), "--context", "32", "--chunk", "4",
                 "--quiet", *extra]) == 0
    return str(folder)


def test_onnx_npu_lowers_sinks_f32_tokens_and_fp16_logits(spec, tmp_path):
    graph = sinks_model()
    expected, _ = reference_generate(graph, PROMPT, 6, seed=0)
    exact = compile_npu(spec, tmp_path / "f32", "--precision", "f32")
    assert generate(exact, PROMPT, 6) == expected
    folder = compile_npu(spec, tmp_path / "fp16")
    ids = PROMPT + expected[:-1]
    want = reference_prefill(StreamingInterpreter(graph, 0), ids)
    got = prefill_logits(folder, ids).astype(np.float32)
    assert relative_error(got, want) < 1e-2
    for role in ("chunk", "decode"):
        model = onnx.load(f"{folder}/{role}.onnx", load_external_data=False)
        concats = [n for n in model.graph.node if n.op_type == "Concat" and "masked_and_sink" in n.output[0]]
        assert len(concats) == 2, role   # one sink column per layer, before its Softmax


def test_onnx_npu_sinks_move_the_result(spec, tmp_path):
    """The same model without sinks (its other weights the same seeded ones) gives other logits."""
    without = reference_prefill(StreamingInterpreter(sinks_model(sinks=False), 0), PROMPT)
    folder = compile_npu(spec, tmp_path / "f32", "--precision", "f32")
    got = prefill_logits(folder, PROMPT)
    assert relative_error(got, without) > 1e-2


def test_onnx_npu_is_deterministic(spec, tmp_path):
    first, second = compile_npu(spec, tmp_path / "a"), compile_npu(spec, tmp_path / "b")
    for name in ("chunk.onnx", "decode.onnx", "model.data", "irc_npu.json"):
        assert open(f"{first}/{name}", "rb").read() == open(f"{second}/{name}", "rb").read(), name


def attention_records(plan):
    return [r for r in plan["ops"] if r["kind"] == "attention"]


def test_npu_tile_plans_attention_with_sinks():
    """Every attention is planned (none left unplanned), its shape names the group's G = 2
    sinks, and they cost H fp32 logits per layer and phase (B = 1, one burst of the target),
    counted in the lower bound too."""
    target = load_target("examples/targets/edge-npu.yaml")
    plan = plan_graph(sinks_model(), target, tokens=8, past=8)
    machine = machine_of(plan)
    records = attention_records(plan)
    assert sorted((r["node"], r["phase"]) for r in records) == sorted(
        (f"layers.{i}.attn", phase) for i in range(2) for phase in ("prefill", "decode"))
    for record in records:
        assert record["shape"]["sinks"] == 2 and record["count"] == 2
        burst = -(-2 * 4 // machine.align) * machine.align
        assert record["dram"]["sinks"] == record["count"] * burst
        assert record["buffers"]["sinks"]["bytes"] >= 2 * 4
        assert record["dram_bytes"] >= record["lower_bound_bytes"] and record["ratio"] >= 1
    plain = plan_graph(sinks_model(sinks=False), target, tokens=8, past=8)
    for with_sinks, without in zip(records, attention_records(plain)):
        assert with_sinks["dram_bytes"] - without["dram_bytes"] == with_sinks["dram"]["sinks"]
        assert with_sinks["lower_bound"]["compulsory"] - without["lower_bound"]["compulsory"] == \
            with_sinks["count"] * 2 * 4
    assert dumps(plan) == dumps(plan_graph(sinks_model(), target, tokens=8, past=8))


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_npu_tile_executor_runs_sinks_tile_by_tile(dtype):
    """On a target small enough for several tiles and spills: the tiled run equals the
    untiled reference with the sinks, its DMA moves the plan's bytes per stream (sinks
    included), and the sinks change the result."""
    target = mini()
    plan = plan_graph(sinks_model(), target, tokens=6, past=5, dtype=dtype)
    machine = machine_of(plan)
    records = attention_records(plan)
    assert records and any(r["tile"]["q"] < r["shape"]["M"] for r in records)
    for record in records:
        check(record, machine)
        operands, numbers = random_operands(record, machine)
        plain = {k: v for k, v in operands.items() if k != "sinks"}
        assert not np.array_equal(reference(record, machine, operands, numbers),
                                  reference(record, machine, plain, numbers))
        assert execute(record, machine, operands, numbers).dram["sinks"] == record["dram"]["sinks"]
