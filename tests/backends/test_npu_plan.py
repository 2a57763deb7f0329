"""NPU plans: the schema, determinism, prefill and decode, fusion and MoE routing, the
``npu-tile`` pass's contract, and the traffic against the I/O lower bound on Llama-3-8B
and DeepSeek-V2 shapes for every shipped target."""
import functools
import glob
import json
import math

import pytest

from irc import dims
from irc.analysis import state_inputs
from irc.npu import cost
from passes.npu_tile.plan import dumps, machine_of, naive_record, plan_graph
from irc.npu.target import load_target, parse_target
from frontends import load_spec
from irc.errors import BackendError, PassError
from irc.passmanager import PassManager
from irc.printer import print_graph
from irc.testing import apply_pass, assert_pass
from passes.npu_tile import NpuTile

EDGE = "examples/targets/edge-npu.yaml"
SHIPPED = sorted(glob.glob("examples/targets/*.yaml"))
OP_FIELDS = {"name", "op", "phase", "tile", "loop_order", "sram_bytes", "dram_bytes", "lower_bound_bytes", "cycles",
             "bound", "ratio", "intensity", "mac_utilization", "buffers", "dram", "shape", "count", "double_buffer",
             "fused", "epilogue", "compute_cycles", "transfer_cycles", "macs", "layer", "node", "role", "kind"}
TOTAL_FIELDS = {"dram_bytes", "lower_bound_bytes", "ratio", "cycles", "seconds", "seconds_per_token",
                "tokens_per_second", "peak_sram_bytes", "mac_utilization", "unplanned", "tokens", "ops"}
# (model, target, op role, phase) whose traffic is above 1.25x the bound, and why: see
# test_traffic_is_within_a_quarter_of_the_lower_bound
ABOVE_A_QUARTER = {("deepseek-v2", "ethos-u55-256", "attn_out:kv_a", "prefill")}


@functools.lru_cache(maxsize=None)
def full_plan(model: str, target: str) -> str:
    return dumps(plan_graph(load_spec(f"examples/{model}.yaml"), load_target(target), tokens=512, past=4096))


def test_schema_and_totals():
    plan = json.loads(full_plan("llama3-8b", EDGE))
    assert plan["format"] == "irc-npu-plan" and plan["version"] == 1 and plan["model"] == "llama3-8b"
    assert plan["phases"] == {"prefill": {"B": 1, "T": 512, "P": 0}, "decode": {"B": 1, "T": 1, "P": 4096}}
    assert plan["options"] == {"dtype": "int8", "accumulator": "int32", "tokens": 512, "past": 4096, "batch": 1}
    for record in plan["ops"]:
        assert OP_FIELDS <= set(record), record["name"]
        assert record["bound"] in ("compute", "bandwidth")
        assert record["dram_bytes"] == sum(record["dram"].values())
        assert record["sram_bytes"] <= plan["target"]["sram"]["bytes"]
        assert record["sram_bytes"] == sum(b["bytes"] * b["copies"] for b in record["buffers"].values())
    for phase, totals in plan["totals"].items():
        records = [r for r in plan["ops"] if r["phase"] == phase]
        assert TOTAL_FIELDS <= set(totals)
        assert totals["dram_bytes"] == sum(r["dram_bytes"] for r in records)
        assert totals["cycles"] == sum(r["cycles"] for r in records) + totals["unplanned"]["cycles"]
        assert totals["peak_sram_bytes"] == max(r["sram_bytes"] for r in records)
    assert plan["totals"]["decode"]["tokens"] == 1 and plan["totals"]["prefill"]["tokens"] == 512
    # 32 layers x (q, k, v, attention, o, gate_up, down) + the LM head, in each phase
    assert plan["totals"]["prefill"]["ops"] == plan["totals"]["decode"]["ops"] == 32 * 7 + 1


def test_prefill_and_decode_differ():
    plan = json.loads(full_plan("llama3-8b", EDGE))
    by = {(r["name"], r["phase"]): r for r in plan["ops"]}
    q_prefill, q_decode = by["layers.0.q", "prefill"], by["layers.0.q", "decode"]
    assert q_prefill["shape"]["M"] == 512 and q_decode["shape"]["M"] == 1
    assert q_prefill["bound"] == "compute" and q_decode["bound"] == "bandwidth"
    attn_prefill, attn_decode = by["layers.0.attn:attention", "prefill"], by["layers.0.attn:attention", "decode"]
    assert attn_prefill["shape"] == {"M": 4 * 512, "S": 512, "Dk": 128, "Dv": 128}   # 4 query heads per KV head
    assert attn_decode["shape"] == {"M": 4, "S": 4097, "Dk": 128, "Dv": 128} and attn_decode["count"] == 8
    # decode reads every weight once: the GEMV bound is the weights, and the plan meets it
    assert q_decode["lower_bound_bytes"] == 4096 * 4096 + 4096 + 4096 and q_decode["ratio"] <= 1.001


def test_deterministic_bytes():
    graph = load_spec("examples/tiny-deepseek-v2.yaml")
    target = load_target(EDGE)
    assert dumps(plan_graph(graph, target)) == dumps(plan_graph(load_spec("examples/tiny-deepseek-v2.yaml"), target))


def test_residual_add_bias_and_softcap_fuse_into_the_producer():
    plan = plan_graph(load_spec("examples/tiny-llama3.yaml"), load_target(EDGE), tokens=8, past=8)
    by = {(r["name"], r["phase"]): r for r in plan["ops"]}
    wo = by["layers.0.attn_out", "prefill"]
    assert wo["fused"] == ["layers.0.x"] and wo["epilogue"][0]["operand"] == "tile"
    assert by["layers.0.mlp_out:down", "prefill"]["fused"] == ["layers.0.x_1"]
    assert by["layers.0.mlp_out:gate_up", "prefill"]["epilogue"] == [{"op": "glu", "activation": "silu"}]
    assert by["layers.0.q", "prefill"]["fused"] == []                      # rope is not fused
    qwen = plan_graph(load_spec("examples/tiny-qwen2-7b.yaml"), load_target(EDGE), tokens=8, past=8)
    q = next(r for r in qwen["ops"] if r["name"] == "layers.0.q")
    assert q["shape"]["row_operands"] == 1 and q["dram"]["epilogue"] > 0  # the qkv bias
    gemma = plan_graph(load_spec("examples/tiny-gemma2-9b.yaml"), load_target(EDGE), tokens=8, past=8)
    head = next(r for r in gemma["ops"] if r["node"] == "logits_uncapped")
    assert head["fused"] == ["logits"] and head["epilogue"][0]["op"] == "softcap"


def test_moe_experts_get_the_expected_balanced_rows():
    plan = json.loads(full_plan("deepseek-v2", EDGE))
    experts = {(r["role"], r["phase"]): r for r in plan["ops"] if r["layer"] == 1 and "experts" in r["role"]}
    # prefill: 512 tokens x top-6 = 3,072 slots over 160 experts: 32 of 20 rows, 128 of 19
    assert experts["experts.gate_up[20 rows]", "prefill"]["count"] == 32
    assert experts["experts.gate_up[19 rows]", "prefill"]["count"] == 128
    # decode: one token reaches top_k = 6 experts, one row each
    assert experts["experts.down[1 rows]", "decode"]["count"] == 6
    assert experts["experts.down[1 rows]", "decode"]["shape"] == {
        "M": 1, "K": 1536, "N": 5120, "weights": 1, "b_layout": "nk", "tile_operands": 0, "row_operands": 0}


@pytest.mark.parametrize("model", ["llama3-8b", "deepseek-v2"])
@pytest.mark.parametrize("target", SHIPPED)
def test_traffic_is_within_a_quarter_of_the_lower_bound(model, target):
    """Every GEMM and attention core, prefill (T = 512) and decode (P = 4,096): traffic
    within 1.25x of the lower bound, never below it, and well below the naive tiling.

    The one exception, DeepSeek-V2's kv_a projection at prefill on the U55 (M = 512, K =
    5,120, N = 576), is the bound's, not the plan's: the pebbling term assumes square
    blocks of sqrt(S) = 362 accumulator words on a side, but N = 576 must be covered by
    whole tiles. A 512 KiB SRAM holds 131,072 int32 partial sums, so a C block is at most
    256 x 512 or 512 x 256: two blocks along M or N either way, and the best whole-tile
    tiling (each operand read twice) is 1.29x the bound. The test checks that case
    instead: the whole-tile optimum is itself above 1.25x and the plan reaches it."""
    plan = json.loads(full_plan(model, target))
    machine = machine_of(plan)
    above = set()
    for r in plan["ops"]:
        assert r["dram_bytes"] >= r["lower_bound_bytes"], r["name"]
        if r["ratio"] > 1.25:
            above.add((model, plan["target"]["name"], r["name"].split(".", 2)[-1] if r["layer"] is not None
                       else r["name"], r["phase"]))
            assert r["lower_bound"]["whole_tiles"] > 1.25 * r["lower_bound_bytes"]
            assert r["dram_bytes"] <= 1.01 * r["lower_bound"]["whole_tiles"]
        if r["phase"] == "prefill" and r["kind"] == "gemm" and r["shape"]["M"] >= 64 and r["layer"] in (0, 1):
            assert naive_record(r, machine)["dram_bytes"] > 2 * r["dram_bytes"], r["name"]
    assert above == {a for a in ABOVE_A_QUARTER if a[:2] == (model, plan["target"]["name"])}


@pytest.mark.parametrize("target", SHIPPED)
def test_run_time_mla_absorption_plans_its_head_gemms_at_the_bound(target):
    """DeepSeek-V2 after mla-absorb (run time): per layer, H = 128 small GEMMs through W^UK
    [nope, d_c] and H through W^UV [v, d_c], planned in both phases and held to 1.25x the
    lower bound like every other GEMM; the folded weights never appear."""
    from passes.mla_absorb import MlaAbsorb
    graph, _ = apply_pass(MlaAbsorb(), load_spec("examples/deepseek-v2.yaml"))
    plan = plan_graph(graph, load_target(target), tokens=512, past=4096)
    heads = {(r["role"], r["phase"]): r for r in plan["ops"] if r["layer"] == 1 and r["role"] in ("w_uk", "w_uv")}
    assert set(heads) == {(role, phase) for role in ("w_uk", "w_uv") for phase in ("prefill", "decode")}
    assert heads["w_uk", "decode"]["shape"]["K"] == 128 and heads["w_uk", "decode"]["shape"]["N"] == 512
    assert heads["w_uv", "prefill"]["shape"]["M"] == 512 and heads["w_uv", "prefill"]["count"] == 128
    assert not any(r["role"] in ("q_b_absorbed", "wo_absorbed") for r in plan["ops"])
    for r in plan["ops"]:
        assert r["lower_bound_bytes"] <= r["dram_bytes"], r["name"]
        if r["role"] in ("w_uk", "w_uv"):
            assert r["ratio"] <= 1.25, (r["name"], r["phase"], r["ratio"])


def test_an_op_that_fits_no_tiling_is_named():
    target = parse_target({"target": {"name": "tiny-sram", "clock_mhz": 100, "sram": {"bytes": 512},
                                      "mac": {"rows": 4, "cols": 4, "dtypes": {"int8": {}}},
                                      "dram": {"bytes_per_cycle": 4}}}, "<t>")
    with pytest.raises(BackendError) as err:
        plan_graph(load_spec("examples/tiny-deepseek-v3.yaml"), target, tokens=4, past=4)
    text = str(err.value)
    assert "no tiling fits the 512-byte SRAM of tiny-sram" in text and ":attention (prefill)" in text
    assert "the smallest tiling, 4x4, needs q " in text


@pytest.mark.parametrize("model", ["tiny-jamba-1.5-mini", "tiny-mamba2-2.7b"])
def test_recurrent_layers_are_planned_as_scans(model):
    """The planner tiles the GEMMs around a state-space mixer (in/out projections, the
    hybrid's attention and MoE) and plans the short convolution and Mamba-2's SSD as scans
    (tests/backends/test_npu_recurrent.py runs them); Mamba-1's selective scan, whose decay
    differs per channel and state index, stays in the unplanned traffic: every operand and
    state read once, results and states written once."""
    graph = load_spec(f"examples/{model}.yaml")
    plan = plan_graph(graph, load_target(EDGE), tokens=8, past=8)
    scans = {n.name for n in graph.nodes if n.op in ("causal_conv1d", "ssd")}
    left = {n for n in graph.nodes if n.op == "selective_scan"}
    planned = {op["node"] for op in plan["ops"]}
    assert scans and scans <= planned and not {n.name for n in left} & planned
    assert {op["kind"] for op in plan["ops"] if op["node"] in scans} == {"scan"}
    assert {f"layers.0.{name}" for name in ("ssm_in", "ssm_out")} <= planned
    left_states = [v for v in state_inputs(graph) if any(v in n.inputs for n in left)]
    state_elements = sum(math.prod(dims.evaluate_shape(v.shape, {"B": 1})) for v in left_states)
    for phase in ("prefill", "decode"):
        unplanned = plan["totals"][phase]["unplanned"]   # each state read and written at >= 1 byte an element
        assert unplanned["nodes"] >= len(left) and unplanned["dram_bytes"] >= 2 * state_elements


def test_bad_options():
    with pytest.raises(BackendError, match="tokens must be an integer >= 1"):
        plan_graph(load_spec("examples/tiny-llama3.yaml"), load_target(EDGE), tokens=0)


# ---- the pass ---------------------------------------------------------------------------

def test_pass_attaches_the_plan_and_nothing_else():
    graph = load_spec("examples/tiny-llama3.yaml")
    tile = NpuTile(target=EDGE, tokens=8, past=16)
    assert assert_pass(tile, graph)            # changed, same outputs, second run a no-op
    after, _ = apply_pass(tile, graph)
    before_lines, after_lines = print_graph(graph).splitlines(), print_graph(after).splitlines()
    changed = [(a, b) for a, b in zip(before_lines, after_lines) if a != b]
    assert len(before_lines) == len(after_lines) and len(changed) == 1 and changed[0][1].lstrip().startswith("meta ")
    assert after.meta["npu_plan"] == plan_graph(graph, load_target(EDGE), tokens=8, past=16)
    other, changed_again = apply_pass(NpuTile(target="examples/targets/large-npu.yaml", tokens=8, past=16), after)
    assert changed_again and other.meta["npu_plan"]["target"]["name"] == "large-npu"


def test_pass_needs_a_target_and_reports_target_errors():
    graph = load_spec("examples/tiny-llama3.yaml")
    with pytest.raises(PassError, match="needs a target description"):
        PassManager([NpuTile()]).run(graph)
    with pytest.raises(PassError, match="does not support fp16 operands"):
        PassManager([NpuTile(target=EDGE, dtype="fp16")]).run(graph)


def test_search_prefers_least_traffic_then_cycles():
    machine = load_target(EDGE).machine("int8")
    shape = cost.GemmShape(512, 4096, 4096)
    best = cost.search(shape, machine)
    for order in cost.GEMM_ORDERS:
        other = cost.choose(shape, machine, {"m": 128, "n": 128, "k": 64}, order, True)
        assert int(other.cost["dram_bytes"]) >= int(best.cost["dram_bytes"])
    assert best.double_buffer and best.order[-1] == "k"       # output-stationary, partial sums stay in SRAM
