"""The tiled NPU executor: every planned op of every tiny example runs tile by tile against
an explicit SRAM buffer and equals the untiled reference (exactly for int8 with int32
accumulators, 1e-6 relative in fp32), and the bytes its DMA moves equal the plan's, stream
by stream. Every loop order, single and double buffering, spills and edge tiles are
driven directly as well."""
import glob
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from irc.npu import cost
from backends.npu.executor import Numbers, execute, reference
from backends.npu.operands import random_operands
from passes.npu_tile.plan import machine_of, op_record, plan_graph
from irc.npu.target import load_target, parse_target
from passes.npu_tile.workloads import Work
from frontends import load_spec
from irc.errors import BackendError
from irc.check import relative_error
from irc.testing import one_graph  # noqa: E402

TINY = sorted(p for p in glob.glob("examples/tiny*.yaml") if one_graph(p)) + sorted(glob.glob("examples/tiny*_dsl.py"))
SHIPPED = sorted(glob.glob("examples/targets/*.yaml"))
# a target small enough that tiny models need many tiles, edge tiles and several orders
MINI = {"target": {"name": "mini", "clock_mhz": 100, "sram": {"bytes": 6144},
                   "mac": {"rows": 4, "cols": 4, "dtypes": {"int8": {}, "fp32": {}}},
                   "dram": {"bytes_per_cycle": 4}, "dma": {"channels": 3}, "alignment_bytes": 8}}


def mini():
    return parse_target(MINI, "<mini>")


def check(record, machine, seed=0):
    """Run one planned op: outputs against the reference, DMA bytes and SRAM against the plan."""
    operands, numbers = random_operands(record, machine, seed)
    result = execute(record, machine, operands, numbers)
    expected = reference(record, machine, operands, numbers)
    assert result.dram == record["dram"], record["name"]
    assert result.dram_bytes == record["dram_bytes"]
    assert result.sram_bytes == record["sram_bytes"] <= machine.sram_bytes
    if machine.is_float:
        assert relative_error(result.outputs, expected) <= 1e-6, record["name"]
    elif record["kind"] == "gemm":
        np.testing.assert_array_equal(result.outputs, expected, err_msg=record["name"])
    else:  # the flash rescaling rounds differently from one softmax: at most one step of the int8 output
        assert np.abs(result.outputs.astype(np.int64) - expected.astype(np.int64)).max() <= 1, record["name"]


@pytest.mark.parametrize("spec", TINY)
def test_tiny_examples_match_the_reference_on_every_target(spec):
    graph = load_spec(spec)
    targets = [(mini(), "int8"), (mini(), "fp32")] + [(load_target(p), "int8") for p in SHIPPED]
    for target, dtype in targets:
        plan = plan_graph(graph, target, tokens=6, past=5, dtype=dtype)
        machine = machine_of(plan)
        assert {r["phase"] for r in plan["ops"]} == ({"image"} if "vision" in graph.meta else {"prefill", "decode"})
        for record in plan["ops"]:
            check(record, machine)


def test_run_time_absorbed_mla_runs_tiled():
    """The per-head W^UK / W^UV GEMMs of mla-absorb's default, tile by tile on every target."""
    from irc.testing import apply_pass
    from passes.mla_absorb import MlaAbsorb
    graph, _ = apply_pass(MlaAbsorb(), load_spec("examples/tiny-deepseek-v2.yaml"))
    for target, dtype in [(mini(), "int8"), (mini(), "fp32")]:
        plan = plan_graph(graph, target, tokens=6, past=5, dtype=dtype)
        records = [r for r in plan["ops"] if r["role"] in ("w_uk", "w_uv")]
        assert len(records) == 2 * 2 * 2  # two layers, two roles, two phases
        for record in records:
            check(record, machine_of(plan))


def _gemm_work(shape, steps=()):
    return Work("g", "g", "linear", "linear", shape, 2, epilogue=list(steps))


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_every_loop_order_buffering_and_edge_tile(dtype):
    """A 2-instance gate/up GEMM and a GEMM with a residual, a bias and a softcap fused,
    with tiles that leave edges on every dim: spills when k is outside m or n."""
    machine = mini().machine(dtype)
    steps = [{"op": "add", "operand": "row", "swap": False}, {"op": "sub", "operand": "tile", "swap": True},
             {"op": "softcap", "cap": 3.0}]
    works = [_gemm_work(cost.GemmShape(10, 12, 9, weights=2), [{"op": "glu", "activation": "silu"}]),
             _gemm_work(cost.GemmShape(10, 12, 9, tile_operands=1, row_operands=1), steps)]
    for work, order, db in itertools.product(works, cost.GEMM_ORDERS, (True, False)):
        choice = cost.choose(work.shape, machine, {"m": 4, "n": 8, "k": 8 if dtype == "int8" else 6}, order, db)
        check(op_record(work, "prefill", choice, machine), machine)


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_every_epilogue_op_the_shared_matcher_fuses_runs_tiled(dtype):
    """The ops ``irc.rewrite.epilogue`` lets a plan fuse (beyond the ones above) run in the
    executor, tile by tile as on the whole matrix."""
    from irc.rewrite.epilogue import BINARY, UNARY

    machine = mini().machine(dtype)
    steps = [{"op": "exp"}, {"op": "sqrt"}, {"op": "rsqrt"}, {"op": "cos"}, {"op": "sin"}, {"op": "tanh"},
             {"op": "neg"}, {"op": "sigmoid"}, {"op": "silu"}, {"op": "gelu", "approximate": "tanh"},
             {"op": "cast"}, {"op": "div", "operand": "tile", "swap": True},
             {"op": "maximum", "operand": "row", "swap": False}, {"op": "mul", "operand": "row", "swap": True}]
    assert {step["op"] for step in steps} | {"add", "sub", "softcap"} == set(UNARY) | set(BINARY)
    work = _gemm_work(cost.GemmShape(10, 12, 9, tile_operands=1, row_operands=2), steps)
    choice = cost.choose(work.shape, machine, {"m": 4, "n": 8, "k": 8 if dtype == "int8" else 6}, ("m", "n", "k"),
                         True)
    check(op_record(work, "prefill", choice, machine), machine)


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_attention_both_orders_spill_and_mask(dtype):
    machine = mini().machine(dtype)
    info = {"group": 2, "tokens": 3, "past": 4, "causal": True, "scale": 0.3, "softcap": None, "window": 5}
    work = Work("a", "a", "attention", "attention", cost.AttentionShape(6, 7, 8, 4), 2, attention=info)
    for order, db in itertools.product(cost.ATTENTION_ORDERS, (True, False)):
        check(op_record(work, "decode", cost.choose(work.shape, machine, {"q": 4, "kv": 4}, order, db), machine),
              machine)


def test_kn_layout_and_int16():
    target = parse_target({"target": {**MINI["target"], "mac": {"rows": 4, "cols": 4, "dtypes": {
        "int16": {"rate": 0.5, "accumulator_bits": 40}}}}}, "<mini16>")
    machine = target.machine("int16")
    work = Work("m", "m", "matmul", "matmul", cost.GemmShape(7, 9, 6, b_layout="kn"), 3)
    for order in cost.GEMM_ORDERS:
        check(op_record(work, "prefill", cost.choose(work.shape, machine, {"m": 4, "n": 4, "k": 4}, order, True),
                        machine), machine)


def test_sram_overflow_and_a_tile_too_big_for_its_buffer_are_errors():
    machine = mini().machine("int8")
    work = _gemm_work(cost.GemmShape(8, 8, 8))
    record = op_record(work, "prefill", cost.choose(work.shape, machine, {"m": 4, "n": 4, "k": 8}, ("m", "n", "k"),
                                                    True), machine)
    operands, numbers = random_operands(record, machine)
    too_big = {**record, "buffers": {**record["buffers"], "c": {"bytes": machine.sram_bytes, "copies": 1}}}
    with pytest.raises(BackendError, match="SRAM overflow: buffer c"):
        execute(too_big, machine, operands, numbers)
    too_small = {**record, "buffers": {**record["buffers"], "a": {"bytes": 8, "copies": 2}}}
    with pytest.raises(BackendError, match="does not fit buffer a"):
        execute(too_small, machine, operands, numbers)


def test_large_plan_ops_run_tiled_at_reduced_size():
    """A real Llama-shaped tiling (the edge NPU's choice for a 4096-wide projection) at a
    size NumPy runs quickly: 48 rows x 512 x 512, same tile shape and order."""
    machine = load_target("examples/targets/edge-npu.yaml").machine("int8")
    work = _gemm_work(cost.GemmShape(48, 512, 512, tile_operands=1), [{"op": "add", "operand": "tile", "swap": True}])
    choice = cost.search(work.shape, machine)
    record = op_record(work, "prefill", choice, machine)
    check(record, machine)
    operands, numbers = random_operands(record, machine)
    assert numbers != Numbers()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 13), st.integers(1, 13), st.integers(1, 13), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 2), st.sampled_from(cost.GEMM_ORDERS), st.booleans(), st.integers(1, 2),
       st.sampled_from(["nk", "kn"]), st.booleans())
def test_random_gemm_tilings_count_what_the_model_says(M, K, N, tm, tn, tk, order, db, weights, layout, residual):
    """The closed-form traffic and SRAM of ``irc.npu.cost`` against the executor's
    count, for random shapes, tiles (in MAC-array and burst units), orders and buffering."""
    machine = mini().machine("int8")
    steps = [{"op": "glu", "activation": "silu"}] if weights == 2 else []
    if residual:
        steps.append({"op": "add", "operand": "tile", "swap": False})
    work = _gemm_work(cost.GemmShape(M, K, N, weights, layout, int(residual)), steps)
    tile = {"m": 4 * tm, "n": 4 * tn, "k": 8 * tk}
    check(op_record(work, "prefill", cost.choose(work.shape, machine, tile, order, db), machine), machine, seed=M)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 12), st.integers(1, 12), st.integers(1, 3), st.integers(1, 3),
       st.sampled_from(cost.ATTENTION_ORDERS), st.booleans(), st.booleans())
def test_random_attention_tilings_count_what_the_model_says(M, S, tq, tkv, order, db, causal):
    machine = mini().machine("fp32")
    info = {"group": 1, "tokens": M, "past": max(0, S - M), "causal": causal, "scale": 0.25, "softcap": None,
            "window": None}
    work = Work("a", "a", "attention", "attention", cost.AttentionShape(M, S, 6, 4), 1, attention=info)
    record = op_record(work, "prefill", cost.choose(work.shape, machine, {"q": 4 * tq, "kv": 4 * tkv}, order, db),
                       machine)
    check(record, machine, seed=S)
