"""ALiBi (BLOOM, MPT, Falcon) on the targets whose attention is not ONNX Runtime's, lowered,
not refused: --target onnx-npu adds one bias [1, K, G*T, N+T] per slopes constant, made in
the graph from the cache slots' positions and ``position_ids`` (f32: the interpreter's greedy
tokens; fp16: logits within 1e-2 relative), and npu-tile plans the attention with its slopes
(G fp32 per group of traffic, held against a lower bound counting them) that the tiled
executor reproduces, biasing each block on chip. The HF twins run these targets in
tests/frontends/test_hf_targets.py; Triton's kernels are in test_triton_alibi.py."""
import numpy as np
import onnx
import pytest

from backends.npu.executor import execute, reference
from backends.npu.operands import random_operands
from backends.onnx_npu.host import generate, prefill_logits
from frontends.dsl import Model
from irc.check import relative_error
from irc.evaluate import StreamingInterpreter
from irc.evaluate import prefill_logits as reference_prefill
from irc.interpreter import generate as reference_generate
from irc.npu.target import load_target
from irc.ops.alibi import bloom_slopes
from passes.npu_tile.plan import dumps, machine_of, plan_graph
from tests.backends.test_npu_executor import check, mini
from tests.backends.test_sinks_targets import attention_records, compile_npu

PROMPT = [3, 17, 42, 9, 5, 7, 25, 11, 60, 61, 62]   # 11 tokens: 3 chunks of 4, past the window of 4


def alibi_model(alibi=True, window=4):
    """Two layers, GQA 4 over 2 with BLOOM's slopes for 4 heads, the first sliding
    (``window``), the second full; LayerNorms, no RoPE."""
    m = Model("tiny-alibi", vocab=64, d_model=32)
    x = m.embed(m.input_ids())
    for layer, layer_window in zip(m.layers(2), (window, None)):
        x = x + layer.attention(layer.layer_norm(x, "attn_norm"), heads=4, kv_heads=2, head_dim=8,
                                alibi=bloom_slopes(4) if alibi else None, window=layer_window, qkv_bias=True)
        x = x + layer.gelu_mlp(layer.layer_norm(x, "mlp_norm"), d_ff=48, bias=True)
    m.logits(m.layer_norm(x, "norm"), tied=True)
    return m.graph


DSL = """from tests.backends.test_alibi_targets import alibi_model
model = alibi_model()
"""


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    path = tmp_path_factory.mktemp("alibi") / "alibi.py"
    path.write_text(DSL)
    return str(path)


def test_onnx_npu_lowers_alibi_f32_tokens_and_fp16_logits(spec, tmp_path):
    graph = alibi_model()
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
        assert "position_ids" in [i.name for i in model.graph.input], role  # claimed: no RoPE reads it
        biased = [n for n in model.graph.node if n.op_type == "Add" and n.output[0].endswith("/biased")]
        assert len(biased) == 2, role   # one bias per layer, before its mask


def test_onnx_npu_alibi_moves_the_result(spec, tmp_path):
    """The same model without ALiBi (its other weights the same seeded ones) gives other logits."""
    without = reference_prefill(StreamingInterpreter(alibi_model(alibi=False), 0), PROMPT)
    folder = compile_npu(spec, tmp_path / "f32", "--precision", "f32")
    assert relative_error(prefill_logits(folder, PROMPT), without) > 1e-2


def test_onnx_npu_is_deterministic(spec, tmp_path):
    first, second = compile_npu(spec, tmp_path / "a"), compile_npu(spec, tmp_path / "b")
    for name in ("chunk.onnx", "decode.onnx", "model.data", "irc_npu.json"):
        assert open(f"{first}/{name}", "rb").read() == open(f"{second}/{name}", "rb").read(), name


def test_npu_tile_plans_attention_with_alibi_slopes():
    """Every attention is planned, its shape names the group's G = 2 slopes, and they cost
    one burst of fp32 per group and phase, counted in the lower bound too."""
    target = load_target("examples/targets/edge-npu.yaml")
    plan = plan_graph(alibi_model(), target, tokens=8, past=8)
    machine = machine_of(plan)
    records = attention_records(plan)
    assert sorted((r["node"], r["phase"]) for r in records) == sorted(
        (f"layers.{i}.attn", phase) for i in range(2) for phase in ("prefill", "decode"))
    plain = plan_graph(alibi_model(alibi=False), target, tokens=8, past=8)
    for record, without in zip(records, attention_records(plain)):
        burst = -(-2 * 4 // machine.align) * machine.align
        assert record["shape"]["alibi"] == 2 and record["dram"]["slopes"] == record["count"] * burst
        assert record["dram_bytes"] >= record["lower_bound_bytes"] and record["ratio"] >= 1
        assert record["dram_bytes"] - without["dram_bytes"] == record["dram"]["slopes"]
        assert record["lower_bound"]["compulsory"] - without["lower_bound"]["compulsory"] == record["count"] * 2 * 4
    assert dumps(plan) == dumps(plan_graph(alibi_model(), target, tokens=8, past=8))


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_npu_tile_executor_runs_alibi_tile_by_tile(dtype):
    """On a target small enough for several query and key tiles: the tiled run equals the
    untiled reference with the slopes, its DMA moves the plan's bytes per stream (slopes
    included), and the slopes change the result."""
    target = mini()
    plan = plan_graph(alibi_model(), target, tokens=6, past=20, dtype=dtype)
    machine = machine_of(plan)
    records = attention_records(plan)  # a tiled prefill's query rows, a decode's 21 keys in blocks
    assert any(r["tile"]["q"] < r["shape"]["M"] for r in records)
    assert any(r["tile"]["kv"] < r["shape"]["S"] for r in records)
    for record in records:
        check(record, machine)
        operands, numbers = random_operands(record, machine)
        plain = {k: v for k, v in operands.items() if k != "slopes"}
        assert not np.array_equal(reference(record, machine, operands, numbers),
                                  reference(record, machine, plain, numbers))
        assert execute(record, machine, operands, numbers).dram["slopes"] == record["dram"]["slopes"]
