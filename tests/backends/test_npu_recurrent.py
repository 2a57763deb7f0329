"""npu-tile on recurrent layers (irc/npu/scan.py, passes/npu_tile/recurrent.py,
backends/npu/recurrent.py): every scan of every tiny hybrid, prefill and decode, on every
shipped target and a tiny one that forces unit tiles inside a group: the tiled executor's
outputs and present state equal the untiled reference op, its DMA bytes equal the plan's
stream by stream, and the planned traffic is within 1.25x of the lower bound."""
import glob

import numpy as np
import pytest

from backends.npu.executor import execute, reference

from backends.npu.operands import random_operands
from backends.npu.recurrent import reference_scan
from frontends import load_spec
from irc.check import relative_error
from irc.npu import scan
from irc.npu.target import load_target, parse_target
from passes.npu_tile.plan import machine_of, naive_record, plan_graph

HYBRIDS = ["examples/tiny-mamba2-2.7b.yaml", "examples/tiny-granite-4.0-h-small.yaml", "examples/tiny-lfm2-1.2b.yaml",
           "examples/tiny-qwen3-next-80b-a3b.yaml", "examples/tiny-nemotron-h-8b.yaml"]
SHIPPED = sorted(glob.glob("examples/targets/*.yaml"))
TIGHT = {"target": {"name": "tight", "clock_mhz": 100, "sram": {"bytes": 6144},
                    "mac": {"rows": 4, "cols": 4, "dtypes": {"int8": {}, "fp32": {}}},
                    "dram": {"bytes_per_cycle": 4}, "dma": {"channels": 3}, "alignment_bytes": 8}}


def targets():
    tight = parse_target(TIGHT, "<tight>")
    return [(tight, "fp32"), (tight, "int8")] + [(load_target(p), "int8") for p in SHIPPED]


@pytest.mark.parametrize("spec", HYBRIDS)
def test_every_scan_runs_as_planned(spec):
    graph = load_spec(spec)
    ops = {"causal_conv1d", "ssd", "gated_delta_rule"} & {n.op for n in graph.nodes}
    for target, dtype in targets():
        plan = plan_graph(graph, target, tokens=6, past=5, dtype=dtype)
        machine = machine_of(plan)
        scans = [r for r in plan["ops"] if r["kind"] == "scan"]
        assert {r["op"] for r in scans} == ops and {r["phase"] for r in scans} == {"prefill", "decode"}
        for record in scans:
            if record["layer"] not in (0, 1):   # layers repeat: two of them stand for all
                continue
            operands, numbers = random_operands(record, machine, seed=1)
            result = execute(record, machine, operands, numbers)
            assert result.dram == record["dram"] and result.dram_bytes == record["dram_bytes"], record["name"]
            assert result.sram_bytes == record["sram_bytes"] <= machine.sram_bytes
            expected = reference(record, machine, operands, numbers)
            states = np.stack([reference_scan(record, machine, {k: v[i] for k, v in operands.items()}, numbers)[1]
                               for i in range(record["count"])])
            if machine.is_float:
                assert relative_error(result.outputs, expected) <= 1e-6, record["name"]
            else:
                assert np.abs(result.outputs.astype(np.int64) - expected.astype(np.int64)).max() <= 1
            assert relative_error(result.states, states) <= 1e-6
            assert record["lower_bound_bytes"] <= record["dram_bytes"] <= 1.25 * record["lower_bound_bytes"]


def test_recurrent_layers_are_planned_not_left_over():
    graph = load_spec("examples/tiny-qwen3-next-80b-a3b.yaml")
    plan = plan_graph(graph, load_target("examples/targets/edge-npu.yaml"))
    planned = {r["node"] for r in plan["ops"] if r["kind"] == "scan"}
    assert planned == {n.name for n in graph.nodes if n.op in ("causal_conv1d", "gated_delta_rule")}


def test_decode_is_the_state_traffic():
    """One token: the state in and out dominates; the plan moves it once (ratio ~1)."""
    graph = load_spec("examples/mamba2-2.7b.yaml")
    plan = plan_graph(graph, load_target("examples/targets/edge-npu.yaml"), tokens=64, past=64)
    for record in (r for r in plan["ops"] if r["op"] == "ssd" and r["layer"] == 0):
        shape = record["shape"]
        state = 2 * shape["H"] * shape["state"] * 4
        assert record["lower_bound"]["compulsory"] >= state and record["ratio"] <= 1.25
        if record["phase"] == "decode":
            assert record["dram"]["state"] == state and record["ratio"] <= 1.01
        assert naive_record(record, machine_of(plan))["dram_bytes"] >= record["dram_bytes"]


def test_a_tile_inside_a_group_rereads_its_shared_rows():
    """Four heads in one group, one resident at a time: B and C are read once per head,
    which the lower bound allows (the SRAM holds one head's state only)."""
    shape = scan.ScanShape(8, 4, 4, (4, 1), (4, 4), 4, 16, (1,), 32)
    machine = parse_target(TIGHT, "<tight>").machine("fp32")
    one = scan.traffic(shape, machine, 1, 8)
    whole = scan.traffic(shape, machine, 4, 8)
    assert one["shared"] == 4 * whole["shared"] and one["state"] == whole["state"]
