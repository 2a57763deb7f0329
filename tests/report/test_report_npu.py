"""The NPU plan section, from a small hand-made plan dict."""
from __future__ import annotations

import json

from irc.report import build_report, npu

PLAN = {
    "target": {"name": "toy-npu", "sram_bytes": 1 << 20},
    "ops": [
        {"name": "layers.0.q", "op": "matmul", "phase": "decode", "dram_bytes": 3000, "lower_bound_bytes": 2000,
         "sram_bytes": 400_000, "cycles": 900, "bound": "memory"},
        {"name": "layers.0.attn", "op": "attention", "phase": "decode", "dram_bytes": 5000, "lower_bound_bytes": 5000,
         "sram_bytes": 700_000, "cycles": 1500, "bound": "memory"},
        {"name": "layers.1.q", "op": "matmul", "phase": "decode", "dram_bytes": 2500, "lower_bound_bytes": 2000,
         "sram_bytes": 300_000, "cycles": 800, "bound": "compute"},
        {"name": "logits", "op": "matmul", "phase": "prefill", "dram_bytes": 9000, "lower_bound_bytes": 3000,
         "sram_bytes": 900_000, "cycles": 4000, "bound": "compute"},
        {"name": "layers.1.mlp", "op": "matmul", "phase": "prefill"},          # fields missing: counted as zero
    ],
    "totals": {"dram_bytes": 19500, "lower_bound_bytes": 12000, "cycles": 7200},
}


def test_per_layer_rows():
    labels, rows = npu.per_layer([e for e in PLAN["ops"] if e.get("phase") == "decode"])
    assert labels == ["L0", "L1"]
    assert rows["L0"] == {"dram": 8000, "bound": 7000, "cycles": 2400, "sram": 700_000}


def test_section_renders_charts_ratios_and_totals():
    html = npu.render(PLAN)
    assert "toy-npu" in html and html.count('<svg class="chart"') == 4      # traffic and SRAM, two phases
    assert "SRAM capacity" in html
    assert "ratio <b>1.17×</b>" in html                                    # decode: 10,500 / 9,000
    assert "ratio <b>3.00×</b>" in html                                    # prefill: 9,000 / 3,000
    decode = html[html.index('id="npu-decode"'):]
    table = decode[decode.index("<table"):decode.index("</table>")]
    assert table.index("layers.0.q") < table.index("layers.1.q") < table.index("layers.0.attn")  # worst first
    assert "Plan totals" in html and "19,500" in html


def test_plan_is_found_in_meta_or_beside_the_dumps(tiny_run, tmp_path):
    assert npu.find_plan({"npu_plan": PLAN}) is PLAN
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    assert npu.find_plan({}, str(tmp_path)) == PLAN
    assert npu.find_plan({}, None) is None
    assert "no per-op entries" in npu.render({"totals": {}})


def test_report_carries_the_plan(tiny_run):
    html = build_report(tiny_run.dump_dir, tiny_run.graph, input_graph=tiny_run.input_graph, npu_plan=PLAN)
    assert '<section id="npu">' in html and '<a href="#npu">NPU plan</a>' in html
    assert "DRAM traffic per layer (decode)" in html


PER_PHASE = {   # the shape backends/npu writes: target.sram.bytes, a layer field, totals per phase
    "target": {"name": "edge", "sram": {"bytes": 262144, "banks": 4}},
    "ops": [{"name": "layers.3.mlp_out:gate_up", "layer": 3, "op": "matmul", "phase": "decode", "dram_bytes": 4096,
             "lower_bound_bytes": 4096, "sram_bytes": 20480, "cycles": 100, "bound": "bandwidth"},
            {"name": "lm_head", "layer": None, "op": "matmul", "phase": "decode", "dram_bytes": 8192,
             "lower_bound_bytes": 4096, "sram_bytes": 30000, "cycles": 300, "bound": "compute"}],
    "totals": {"decode": {"ops": 2, "dram_bytes": 12288, "ratio": 1.5, "unplanned": {"nodes": 4}},
               "prefill": {"ops": 0, "dram_bytes": 0, "ratio": None, "unplanned": {"nodes": 9}}},
}


def test_plan_in_the_npu_backends_shape():
    html = npu.render(PER_PHASE)
    assert "SRAM 256 KiB" in html and "SRAM capacity" in html
    assert npu.per_layer(PER_PHASE["ops"])[0] == ["L3", "other"]
    totals = html[html.index("Plan totals"):]
    assert "<th>decode</th><th>prefill</th>" in totals and "unplanned.nodes" in totals and "12,288" in totals


def test_plan_from_the_npu_tile_pass(tmp_path):
    """Once passes/npu_tile lands: its plan, carried in graph.meta, shows up in the report."""
    import pytest
    npu_tile = pytest.importorskip("passes.npu_tile")
    from frontends import load_spec
    from irc.analysis import stats_line
    from irc.passmanager import PassManager

    from report_runs import ROOT

    graph = load_spec(str(ROOT / "examples/tiny-llama3.yaml"))
    target = ROOT / "examples/targets/edge-npu.yaml"
    if not target.exists():
        pytest.skip("no examples/targets/edge-npu.yaml")
    manager = PassManager([npu_tile.NpuTile(target=str(target), tokens=16, past=64, batch=1, dtype="int8")],
                          dump_dir=str(tmp_path), stats=stats_line)
    manager.run(graph)
    html = build_report(str(tmp_path), graph, records=manager.records)
    assert '<section id="npu">' in html and "DRAM traffic per layer (decode)" in html
