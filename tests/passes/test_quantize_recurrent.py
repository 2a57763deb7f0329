"""quantize on recurrent models: the in/out projections quantize, the recurrence's own
parameters and its Δ path stay float (pinned per family on every recurrent tiny example),
``recurrent=true`` quantizes the Δ path too, Mamba-2's dt rows are cut out of in_proj
(exact up to float rounding, through the interpreter and both ONNX targets), an int8
recurrent state is refused, and the report's error-against-position curve."""
import re

import numpy as np
import pytest

import passes  # noqa: F401  (registers the passes)
from backends.onnx.emit import emit_model
from backends.onnx.runtime import greedy, interpreter_engine, ort_engine
from backends.onnx.targets import TARGETS
from frontends import load_spec
from frontends.dsl import Model
from irc.check import relative_error
from irc.errors import PassError
from irc.interpreter import random_feeds, run
from irc.passmanager import PassManager, parse_pipeline
from irc.quant_report import chunk_logits, format_pass_report, position_curve, position_marks
from irc.report.quant import render
from irc.weights import seed_absent
from passes.quantize import Quantize, delta_rows, split_rows

OWN_MAMBA = ["ssm.A_log", "ssm.D", "ssm.conv", "ssm.conv_bias", "ssm.dt_bias"]
# (example, recurrent=) -> (the ssm params quantized, the params kept float on purpose), per layer
POLICY = {
    ("tiny-mamba2-2.7b", False): (["ssm.in_proj.rows_0_288", "ssm.out_proj"], OWN_MAMBA + ["ssm.in_proj.rows_288_296"]),
    ("tiny-mamba2-2.7b", True): (["ssm.in_proj", "ssm.out_proj"], OWN_MAMBA),
    ("tiny-jamba-1.5-mini", False): (["ssm.in_proj", "ssm.out_proj"],
                                     ["ssm.A_log", "ssm.D", "ssm.conv", "ssm.conv_bias", "ssm.dt_proj", "ssm.x_proj"]),
    ("tiny-jamba-1.5-mini", True): (["ssm.dt_proj", "ssm.in_proj", "ssm.out_proj", "ssm.x_proj"],
                                    ["ssm.A_log", "ssm.D", "ssm.conv", "ssm.conv_bias"]),
    ("tiny-granite-4.0-h-small", False): (["ssm.in_proj.rows_0_288", "ssm.out_proj"],
                                          OWN_MAMBA + ["ssm.in_proj.rows_288_296"]),
    ("tiny-granite-4.0-h-small", True): (["ssm.in_proj", "ssm.out_proj"], OWN_MAMBA),
    ("tiny-falcon-h1-7b", False): (["ssm.in_proj.rows_0_160", "ssm.out_proj"], OWN_MAMBA + ["ssm.in_proj.rows_160_164"]),
    ("tiny-falcon-h1-7b", True): (["ssm.in_proj", "ssm.out_proj"], OWN_MAMBA),
    ("tiny-nemotron-h-8b", False): (["ssm.in_proj.rows_0_320", "ssm.out_proj"],
                                    OWN_MAMBA + ["ssm.in_proj.rows_320_328"]),
    ("tiny-nemotron-h-8b", True): (["ssm.in_proj", "ssm.out_proj"], OWN_MAMBA),
    ("tiny-lfm2-1.2b", False): (["ssm.in_proj", "ssm.out_proj"], ["ssm.conv"]),
    ("tiny-lfm2-1.2b", True): (["ssm.in_proj", "ssm.out_proj"], ["ssm.conv"]),
    ("tiny-qwen3-next-80b-a3b", False): (["ssm.in_proj_qkvz", "ssm.out_proj"],
                                         ["ssm.A_log", "ssm.conv", "ssm.dt_bias", "ssm.in_proj_ba"]),
    ("tiny-qwen3-next-80b-a3b", True): (["ssm.in_proj_ba", "ssm.in_proj_qkvz", "ssm.out_proj"],
                                        ["ssm.A_log", "ssm.conv", "ssm.dt_bias"]),
}


def per_layer(name: str) -> str:
    return re.sub(r"^layers\.\d+\.", "", name)


def policy(graph, **options):
    """(sorted ssm weights with codes, sorted params kept float on purpose), per layer, and the pass."""
    q = Quantize(bits=4, **options)
    assert q.run(graph)
    quantized = sorted({per_layer(p[:-len(".qweight")]) for p in graph.params if p.endswith(".qweight") and ".ssm." in p})
    return quantized, sorted({per_layer(k["name"]) for k in q.kept}), q


def example(name: str):
    graph = load_spec(f"examples/{name}.yaml")
    seed_absent(graph)
    return graph


@pytest.mark.parametrize("name,recurrent", POLICY)
def test_policy_per_family(name, recurrent):
    graph = example(name)
    quantized, kept, q = policy(graph, recurrent=recurrent)
    assert (quantized, kept) == POLICY[name, recurrent]
    for param in graph.params.values():  # what stays float is still float, under its name
        if per_layer(param.name) in kept:
            assert param.dtype.is_float
    for entry in q.kept:  # every kept param says why, in the notes too
        assert entry["reason"] and any(f"@{entry['name']} stays" in note for note in q.notes)


def dsl_model(mixer: str, **kwargs):
    m = Model(f"tiny-{mixer}", vocab=64, d_model=32)
    x = m.embed(m.input_ids())
    for layer in m.layers(2):
        h = layer.rms_norm(x, name="ssm_norm")
        x = x + getattr(layer, mixer)(h, **kwargs)
    m.logits(m.rms_norm(x, name="norm"))
    graph = m.graph
    seed_absent(graph)
    return graph


@pytest.mark.parametrize("mixer,kwargs,quantized,kept", [
    ("gated_delta", {"key_heads": 2, "value_heads": 4, "key_dim": 8, "value_dim": 8, "projections": "split"},
     ["ssm.in_proj_qkv", "ssm.in_proj_z", "ssm.out_proj"], ["ssm.A_log", "ssm.conv", "ssm.dt_bias", "ssm.in_proj_a",
                                                           "ssm.in_proj_b"]),
    ("mamba", {"state_size": 8, "bcdt_norm": "plain"}, ["ssm.in_proj", "ssm.out_proj"],
     ["ssm.A_log", "ssm.D", "ssm.conv", "ssm.conv_bias", "ssm.dt_proj", "ssm.x_proj"]),
    ("mamba", {"state_size": 8, "bcdt_norm": "weighted"}, ["ssm.in_proj", "ssm.out_proj"],
     ["ssm.A_log", "ssm.D", "ssm.conv", "ssm.conv_bias", "ssm.dt_proj", "ssm.x_proj"]),
    ("mamba2", {"heads": 4, "head_dim": 16, "state_size": 8, "proj_bias": True},
     ["ssm.in_proj.rows_0_144", "ssm.out_proj"], OWN_MAMBA + ["ssm.in_proj.rows_144_148"]),
])
def test_policy_traces_the_delta_path_in_every_form(mixer, kwargs, quantized, kept):
    """Qwen3.5's split a / b projections, Falcon-Mamba's B/C/dt norms (plain and weighted)
    between x_proj and dt_proj, and a Mamba-2 in_proj with a bias (cut like its rows)."""
    graph = dsl_model(mixer, **kwargs)
    reference = graph.clone()
    assert policy(graph)[:2] == (quantized, kept)
    int8 = reference.clone()
    Quantize(bits=8).run(int8)
    feeds = random_feeds(reference, batch=1, tokens=5)
    assert relative_error(run(int8, feeds)["logits"], run(reference, feeds)["logits"]) < 0.15  # broken: ~1


def test_mamba2_dt_rows_are_cut_out_exactly():
    """split_rows alone changes no number (up to float rounding); after quantize, layer 0's
    Δ (read before any quantized weight: the table stays float here) equals the float
    model's while its x moved."""
    graph = example("tiny-mamba2-2.7b")
    ranges = {p.name: r for p, r in delta_rows(graph).items()}
    assert ranges == {"layers.0.ssm.in_proj": [(288, 296)], "layers.1.ssm.in_proj": [(288, 296)]}
    cut = graph.clone()
    for param in [p for p in cut.params.values() if p.name.endswith("ssm.in_proj")]:
        split_rows(cut, param, ranges[param.name])
    feeds = random_feeds(graph, batch=2, tokens=5)
    assert relative_error(run(cut, feeds)["logits"], run(graph, feeds)["logits"]) < 1e-6

    quantized = graph.clone()
    Quantize(bits=4, embeddings=False).run(quantized)
    for g in (graph, quantized):
        ssd = next(n for n in g.nodes if n.op == "ssd")
        g.outputs = g.outputs + [ssd.inputs[0], ssd.inputs[1]]  # layer 0's x and dt
    before, after = run(graph, feeds), run(quantized, feeds)
    x, dt = (graph.outputs[-2].name, quantized.outputs[-2].name), (graph.outputs[-1].name, quantized.outputs[-1].name)
    assert relative_error(after[dt[1]], before[dt[0]]) < 1e-6
    assert relative_error(after[x[1]], before[x[0]]) > 1e-3


@pytest.mark.parametrize("spec", ["tiny-mamba2-2.7b", "tiny-jamba-1.5-mini"])
def test_quantized_recurrent_models_match_on_both_onnx_targets(spec, tmp_path):
    prompts = [[1, 5, 9, 3], [7, 2]]
    for target in ("onnx", "onnx-ort"):
        graph = example(spec)
        PassManager(parse_pipeline(f"quantize{{bits=4,group=32,accuracy_level=0}},{TARGETS[target].pipeline(23)}")
                    ).run(graph)
        path = str(tmp_path / f"model.{target}.onnx")
        emit_model(graph, path, target=target, opset=23, context=64)
        ours, ref = greedy(ort_engine(path), graph, prompts, 3), greedy(interpreter_engine(graph), graph, prompts, 3)
        np.testing.assert_array_equal(ours["tokens"], ref["tokens"])
        assert relative_error(ours["prefill"]["logits"], ref["prefill"]["logits"]) < 1e-4
        for got, expected in zip(ours["steps"], ref["steps"]):
            assert relative_error(got, expected) < 1e-4


def test_int8_recurrent_state_is_refused_and_kv_cache_says_the_state_stays_float():
    with pytest.raises(PassError, match="int8 recurrent state is not built"):
        parse_pipeline("quantize{bits=4,recurrent_state=true}")
    graph = example("tiny-granite-4.0-h-small")
    q = Quantize(bits=4, kv_cache=True)
    assert q.run(graph)
    assert sum("recurrent state of %" in note and "stays float" in note for note in q.notes) == 3  # 3 Mamba-2 layers
    assert any(v.name == "past_key_values.1.key_scale" for v in graph.inputs)  # the attention layer's cache is int8
    assert all(v.dtype.is_float for v in graph.inputs if v.name.endswith("recurrent_state"))


def test_position_marks():
    assert position_marks(4096) == [128, 1024, 4096]
    assert position_marks(300) == [128, 300]
    assert position_marks(64) == [64]


def test_chunks_carry_the_state():
    """One prefill, chunks of 7 and one token at a time give the same logits."""
    graph = example("tiny-granite-4.0-h-small")
    ids = list(np.random.default_rng(0).integers(0, 256, 20))
    whole, *_ = chunk_logits(graph, ids, chunk=20)
    for chunk in (7, 1):
        assert relative_error(np.concatenate(list(chunk_logits(graph, ids, chunk=chunk))), whole) < 1e-5


def test_report_has_the_error_against_position_and_what_was_kept():
    graph = example("tiny-mamba2-2.7b")
    q = Quantize(bits=4, positions=200)
    q.run(graph)
    report = q.report(graph)
    rows = report["positions"]["rows"]
    assert [(r["start"], r["stop"]) for r in rows] == [(0, 128), (128, 200)]
    assert all(r["rms_relative_error"] > 0 and 0 <= r["top1_agreement"] <= 1 for r in rows)
    assert {k["name"] for k in report["kept"]} >= {"layers.0.ssm.in_proj.rows_288_296", "layers.1.ssm.A_log"}
    assert {t["name"]: t["shape"] for t in report["tensors"]}["layers.0.ssm.in_proj.rows_0_288"] == [288, 64]
    text = format_pass_report(report)
    assert "positions 128-200" in text and "kept float on purpose (12 params)" in text
    page = render(report)
    assert "error against position" in page and "layers.0.ssm.in_proj.rows_288_296" in page
    same = position_curve(q.float_graph, q.float_graph, list(range(40)), chunk=16)
    assert same["rows"] == [{"start": 0, "stop": 40, "rms_relative_error": 0.0, "max_relative_error": 0.0,
                             "top1_agreement": 1.0}]


def test_positions_zero_and_attention_models_have_no_curve():
    graph = example("tiny-mamba2-2.7b")
    q = Quantize(bits=4, positions=0)
    q.run(graph)
    assert "positions" not in q.report(graph)
    graph = example("tiny-llama3")
    q = Quantize(bits=4, positions=64)
    q.run(graph)
    assert "positions" not in q.report(graph) and q.report(graph)["kept"] == []
    with pytest.raises(PassError, match="positions"):
        Quantize(positions=-1)
