"""Graph pictures and IR diffs: boxes never overlap, residual edges are found, a
thousand-node graph collapses per layer, alike layers fold into one region."""
from __future__ import annotations

import pytest

from frontends import load_spec
from irc.report import diff, layout, svg
from irc.report.diff import layer_index

from report_runs import ROOT


@pytest.fixture(scope="module")
def llama():
    return load_spec(str(ROOT / "examples/tiny-llama3.yaml"))


def _no_overlap(pic):
    rows = {}
    for b in pic.boxes:
        rows.setdefault(b.rank, []).append(b)
    for row in rows.values():
        row.sort(key=lambda b: b.x)
        for a, b in zip(row, row[1:]):
            assert a.x + a.w / 2 <= b.x - b.w / 2 + 1e-6, (a.lines, b.lines)


def test_block_picture_labels_and_residual_edges(llama):
    pic = layout.place(layout.picture(llama, lambda n: layer_index(n.name) == 0, context=True))
    _no_overlap(pic)
    ops = {b.lines[0] for b in pic.boxes if b.kind == "op"}
    assert {"rms_norm", "linear", "rope", "attention", "add", "swiglu"} <= ops
    attention = next(b for b in pic.boxes if b.op == "attention")
    assert any("heads=4" in line and "kv_heads=2" in line for line in attention.lines)
    assert any(line.startswith("f32[B,T,64]") for line in attention.lines)
    residual = [e for e in pic.edges if e.residual]
    assert len(residual) == 2                                  # around attention, around the MLP
    for e in pic.edges:                                        # every edge runs downwards
        assert all(y1 <= y2 + 1e-6 for (_, y1), (_, y2) in zip(e.points, e.points[1:]))
    drawn = svg.graph_svg(pic, "layer 0")
    assert drawn.count('class="edge residual"') == 2 and drawn.startswith("<svg")


def test_a_thousand_node_graph_collapses_per_layer(big_run):
    graph = big_run.graph
    assert len(graph.nodes) > 1000
    pic = layout.place(layout.picture(graph, lambda n: layer_index(n.name) is None,
                                      collapse=lambda name: None if layer_index(name) is None else
                                      f"layers.{layer_index(name)}"))
    groups = [b for b in pic.boxes if b.kind == "group"]
    assert len(groups) == 32 and len(pic.boxes) < 80
    assert groups[0].lines[:2] == ["layers.0", f"{sum(1 for n in graph.nodes if layer_index(n.name) == 0)} nodes"]
    _no_overlap(pic)
    assert pic.height < 5000


def test_layout_is_deterministic(llama):
    def draw():
        return svg.graph_svg(layout.place(layout.picture(llama, lambda n: True)), "all")
    assert draw() == draw()


def test_alike_layers_fold_into_one_region(big_run):
    steps = {}
    import os
    for entry in sorted(os.listdir(big_run.dump_dir)):
        if entry.endswith(".ir"):
            with open(os.path.join(big_run.dump_dir, entry)) as f:
                steps[entry] = f.read()
    texts = list(steps.values())
    mlp = diff.group_regions(diff.regions(texts[1], texts[2]))           # lower-mlp
    assert len(mlp) == 1 and mlp[0].layers() == list(range(32))
    region = mlp[0].first
    assert region.layer == 0 and "layers.0.mlp_out" in region.removed
    assert "layers.0.mlp_out.gate" in region.added


def test_compact_ranges():
    assert diff.compact_ranges([0, 1, 2, 5, 7, 9, 11]) == "0–2, 5–11 step 2"
    assert diff.compact_ranges([3]) == "3"
    assert diff.compact_ranges([1, 3]) == "1, 3"
