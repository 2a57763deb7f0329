"""The report on recurrent and hybrid models: the layer map names every layer by its kind, the
block pictures draw each mixer (selective scan, gated delta rule, short conv) with its state
inputs, the memory section charts the flat state beside the growing KV cache with
``irc.analysis``'s numbers, the seed FLOP accounting counts attention layers only, and the
page is the same bytes for the same input."""
from __future__ import annotations

import re
from html import unescape

import pytest

from frontends import load_spec
from irc.analysis import analyze, elements_per_sequence, memory_against_context, state_inputs
from irc.report import build_report, model, recurrent, svg

from report_runs import ROOT, run_pipeline

PIPELINE = "lower-norms,cse,dce"
JAMBA, QWEN3_NEXT = "examples/tiny-jamba-1.5-mini.yaml", "examples/tiny-qwen3-next-80b-a3b.yaml"


def report(run, **kwargs) -> str:
    return build_report(run.dump_dir, run.graph, input_graph=run.input_graph, records=run.manager.records,
                        passes=run.manager.passes, times=False, **kwargs)


@pytest.fixture(scope="module")
def jamba(tmp_path_factory):
    run = run_pipeline(JAMBA, PIPELINE, tmp_path_factory.mktemp("jamba"), check=False)
    return run, report(run)


@pytest.fixture(scope="module")
def qwen3_next(tmp_path_factory):
    run = run_pipeline(QWEN3_NEXT, PIPELINE, tmp_path_factory.mktemp("qwen3-next"), check=False)
    return run, report(run)


def between(html: str, start: str, end: str) -> str:
    part = html[html.index(start):]
    return part[:part.index(end)]


def layer_cells(html: str) -> dict[int, tuple]:
    """{layer: (css category, hover text)} from the layer map."""
    strip = between(html, '<svg class="chart layers"', "</svg>")
    cells = re.findall(r'<g class="layer c-(\w+)"><title>layer (\d+): ([^<]*)</title>', strip)
    return {int(i): (category, unescape(text)) for category, i, text in cells}


def test_the_layer_map_names_every_layer_by_its_kind(jamba, qwen3_next):
    cells = layer_cells(jamba[1])
    assert sorted(cells) == list(range(8))
    assert [c for c, _ in cells.values()] == ["scan"] * 4 + ["attn"] + ["scan"] * 3
    assert cells[0][1].startswith("Mamba selective scan; ") and "state 5,632 bytes per sequence (fixed)" in cells[0][1]
    assert cells[4][1].startswith("attention; ") and "KV cache 64 elements per token (grows)" in cells[4][1]
    assert "mixture-of-experts MLP" in cells[1][1] and "dense MLP" in cells[0][1]
    cells = layer_cells(qwen3_next[1])
    assert [c for c, _ in cells.values()] == ["delta"] * 3 + ["attn"]
    assert cells[0][1].startswith("gated DeltaNet; ")
    facts = unescape(between(qwen3_next[1], "<table class='facts'>", "</table>"))
    assert "3 gated DeltaNet (layers 0, 1, 2), 1 attention (layer 3)" in facts


@pytest.mark.parametrize("spec, categories", [
    ("examples/tiny-lfm2-1.2b.yaml", "conv conv attn conv conv attn conv attn"),
    ("examples/tiny-mamba2-2.7b.yaml", "scan scan"),
    ("examples/tiny-nemotron-h-8b.yaml", "scan mlp scan attn mlp scan mlp"),
])
def test_other_recurrent_stacks_are_mapped(spec, categories):
    graph = load_spec(str(ROOT / spec))
    cells = layer_cells(recurrent.layer_map(model.glance(graph, graph)))
    assert " ".join(c for c, _ in cells.values()) == categories


def test_layer_groups_describe_mixer_state_and_mlp_only_layers():
    graph = load_spec(str(ROOT / "examples/tiny-nemotron-h-8b.yaml"))
    g = model.glance(graph, graph)
    described = {tuple(group.layers): group.description for group in g.groups}
    layer = next(layer for layer in g.summary["layers"] if layer["index"] == 0)
    assert described[(0, 2, 5)].startswith("Mamba-2 SSD mixer, no MLP op, ")
    assert described[(0, 2, 5)].endswith(f", {layer['state_elements']:,} state elements per sequence")
    assert described[(1, 4, 6)].startswith("no attention op, dense MLP, ")
    assert described[(3,)].startswith("attention, full attention, no MLP op, ")


def test_a_transformer_has_no_layer_map_and_keeps_its_seed_layers():
    graph = load_spec(str(ROOT / "examples/llama3-8b.yaml"))
    g = model.glance(graph, graph)
    assert recurrent.layer_map(g) == "" and recurrent.memory_section(g) == "" and not g.recurrent
    assert g.flops["layers"] == 32


def boxes(html: str) -> list[tuple]:
    """(class, text lines) of every graph box on the page."""
    found = re.findall(r'<g class="node ([^"]+)"><title>[^<]*</title><rect[^>]*/><text[^>]*>(.*?)</text></g>', html)
    return [(cls, [unescape(t) for t in re.findall(r"<tspan[^>]*>([^<]*)</tspan>", body)]) for cls, body in found]


def test_the_block_pictures_draw_each_mixer_with_its_state(jamba, qwen3_next):
    for (run, html), op, category in ((jamba, "selective_scan", "c-scan"), (qwen3_next, "gated_delta_rule", "c-delta")):
        block = between(html, '<h3 id="block">', '<h3 id="params">')
        assert block.startswith('<h3 id="block">One block of each layer kind</h3>')
        drawn = boxes(block)
        assert any(cls == f"op {category}" and lines[0] == op for cls, lines in drawn)
        assert any(cls == "op c-conv" and lines[0] == "causal_conv1d" for cls, lines in drawn)
        states = {lines[0]: lines[-1] for cls, lines in drawn if "role-state" in cls}
        for state in state_inputs(run.input_graph):
            if state.name.startswith("past_key_values.0."):
                n = elements_per_sequence(state)
                assert states["%" + state.name] == f"state: {n:,} elements ({4 * n:,} B)/seq, fixed"
    # Jamba's attention layer is the first of its kind: drawn open, its KV cache marked as growing
    block = between(jamba[1], '<h3 id="block">', '<h3 id="params">')
    opened = between(block, "<details open><summary>layer 4 (attention, full attention", "</details>")
    assert any("role-cache" in cls and lines[-1] == "KV cache: grows with P" for cls, lines in boxes(opened))
    compiled = between(block, "The compiled graph, one box per layer", "</details>")
    assert ">layers.4 attention</tspan>" in compiled and ">layers.0 mamba</tspan>" in compiled


def memory_rows(html: str) -> list[list[str]]:
    table = between(html, "<table class='num memory'>", "</table>")
    return [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr>(<td.*?)</tr>", table)]


@pytest.mark.parametrize("case", ["jamba", "qwen3_next"])
def test_the_memory_section_holds_the_analysis_numbers(case, request):
    run, html = request.getfixturevalue(case)
    want = memory_against_context(run.graph)
    assert [r[0] for r in memory_rows(html)] == [f"{w['context']:,}" for w in want]
    table = between(html, "<table class='num memory'>", "</table>")
    for w in want:
        row = re.search(rf"<tr><td>{w['context']:,}</td>(.*?)</tr>", table).group(1)
        for key in ("kv_cache_bytes", "state_bytes", "total_bytes"):
            assert f"<td title='{w[key]:,} bytes'>{svg.format_bytes(w[key])}</td>" in row
    summary = analyze(run.graph)
    assert len({w["state_bytes"] for w in want}) == 1 and want[0]["state_bytes"] == summary["state_bytes_per_sequence"]
    assert want[-1]["kv_cache_bytes"] > want[0]["kv_cache_bytes"] > 0
    chart = between(html, '<h3 id="memory">', "<table class='num memory'>")
    for row in memory_against_context(run.graph, model.memory_contexts(summary)):
        at = svg.format_context(row["context"])
        assert f"KV cache (grows with the context) at {at}: {svg.format_bytes(row['kv_cache_bytes'])}</title>" in chart
        assert f"recurrent state (flat) at {at}: {svg.format_bytes(row['state_bytes'])}</title>" in chart
        assert f"total at {at}: {svg.format_bytes(row['total_bytes'])}</title>" in chart
    cross = -(-summary["state_bytes_per_sequence"] // summary["kv_cache_bytes_per_token"])
    assert f"The KV cache outgrows the state from {cross:,} tokens on." in chart
    facts = unescape(between(html, "<table class='facts'>", "</table>"))
    assert f"{summary['state_bytes_per_sequence']:,} bytes (" in facts


def test_a_model_without_attention_has_state_and_no_kv(tmp_path):
    run = run_pipeline("examples/tiny-mamba2-2.7b.yaml", PIPELINE, tmp_path, check=False)
    html = report(run)
    assert "No layer keeps a KV cache" in html and "No layer attends" in html
    assert "(L = 0 attention layers of 2, d = 64)" in unescape(html)
    assert {r[1] for r in memory_rows(html)} == {"0 B"}


def test_the_seed_accounting_counts_attention_layers_of_a_hybrid(jamba):
    run, html = jamba
    g = model.glance(run.input_graph, run.graph)
    assert g.flops["layers"] == 1 and g.flops["all_layers"] == 8
    assert g.flops["train_attention"] == [6 * 1 * s * 64 for s in g.contexts]
    assert "(L = 1 attention layers of 8, d = 64)" in unescape(html)


def test_same_input_same_bytes(jamba, qwen3_next, tmp_path):
    for (run, html), spec in ((jamba, JAMBA), (qwen3_next, QWEN3_NEXT)):
        assert report(run) == html
        again = run_pipeline(spec, PIPELINE, tmp_path / spec.rsplit("/", 1)[-1], check=False)
        assert report(again) == html


def test_from_the_dump_directory_alone_the_kinds_survive(qwen3_next):
    run, _ = qwen3_next
    html = build_report(run.dump_dir, times=False)
    assert [c for c, _ in layer_cells(html).values()] == ["delta"] * 3 + ["attn"]
    assert "<table class='num memory'>" in html
