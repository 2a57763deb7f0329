"""moe-sort: the moe op as route -> sort by expert -> grouped GEMMs -> weighted scatter-add,
equal to the op's reference on every routing the op has; capacity dropping in GShard
priority order; the report; FLOPs and active parameters unchanged."""
import io
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.numpy.emit import module_source, weights_npz
from irc.interpreter import random_feeds
from frontends.yaml_spec import load, loads
from irc import ops
from irc.analysis import analyze
from irc.build import emit1
from irc.dtypes import DType
from irc.errors import PassError, ShapeError
from irc.graph import Graph, Value
from irc.ops.moe import expert_mlp, moe_dense
from irc.ops.moe_sorted import dispatch, expert_capacity, grouped_gemm, moe_sorted, tile_padding
from irc.parser import parse_graph
from irc.passmanager import PassManager, parse_pipeline
from irc.printer import print_graph
from irc.testing import apply_pass, assert_pass, assert_unchanged
from irc.check import compare_outputs, run_reference
from irc.weights import seed_absent
from passes.moe_sort import MoeSort

F32 = DType.f32
TOLERANCE = 1e-5

QWEN3_MOE_LIKE = """
model:
  name: tiny-qwen3-moe
  vocab_size: 128
  d_model: 32
  n_layers: 2
  norm: {{kind: rms, eps: 1.0e-6}}
  attention:
    kind: gqa
    n_heads: 4
    n_kv_heads: 2
    head_dim: 8
    qk_norm: true
    rope: {{base: 1000000, convention: half}}
  moe:
    experts: 8
    top_k: 3
    d_ff: 16
    shared_experts: 1
    shared_d_ff: 24
    shared_expert_gate: true
    router: softmax
    norm_topk_prob: {norm}
"""

MODELS = {
    "mixtral": lambda: load("examples/tiny-mixtral-8x7b.yaml"),
    "qwen3-moe-norm": lambda: loads(QWEN3_MOE_LIKE.format(norm="true")),
    "qwen3-moe-no-norm": lambda: loads(QWEN3_MOE_LIKE.format(norm="false")),
    "deepseek-v2": lambda: load("examples/tiny-deepseek-v2.yaml"),
    "deepseek-v3": lambda: load("examples/tiny-deepseek-v3.yaml"),
    # hybrids: MoE layers between Mamba / Mamba-2 / gated DeltaNet mixers and their states
    "jamba": lambda: load("examples/tiny-jamba-1.5-mini.yaml"),
    "granite-4.0-h": lambda: load("examples/tiny-granite-4.0-h-small.yaml"),
    "qwen3-next": lambda: load("examples/tiny-qwen3-next-80b-a3b.yaml"),
}


def moe_graph(experts=4, top_k=2, d=8, d_ff=6, shared=0, shared_gate=False, bias=False, groups=None,
              top_groups=None, scoring="softmax", norm_topk_prob=True, routed_scale=1.0, group_score="max",
              activation="silu") -> Graph:
    """x [B,T,d] into one moe op; params seeded by name when run."""
    g = Graph("moe")
    x = g.add_input("x", F32, ("B", "T", d))
    p = [g.add_param("moe.router", F32, (experts, d)), g.add_param("moe.w_gate", F32, (experts, d_ff, d)),
         g.add_param("moe.w_up", F32, (experts, d_ff, d)), g.add_param("moe.w_down", F32, (experts, d, d_ff))]
    p.append(g.add_param("moe.router_bias", F32, (experts,)) if bias else None)
    if shared:
        p += [g.add_param("moe.shared_gate", F32, (shared, d)), g.add_param("moe.shared_up", F32, (shared, d)),
              g.add_param("moe.shared_down", F32, (d, shared))]
    else:
        p += [None, None, None]
    p.append(g.add_param("moe.shared_expert_gate", F32, (1, d)) if shared_gate else None)
    attrs = {"experts": experts, "top_k": top_k, "scoring": scoring, "norm_topk_prob": norm_topk_prob,
             "routed_scale": routed_scale, "n_group": groups, "topk_group": top_groups, "group_score": group_score,
             "activation": activation}
    g.outputs = [emit1(g, "moe", [x] + p, attrs, "out")]
    return g


def feeds_for(graph, batch=2, tokens=5, past=3, left_pad=0, seed=0):
    """Seeded inputs; the last row's first ``left_pad`` cache slots are padding."""
    return random_feeds(graph, batch=batch, tokens=tokens, past=past, seed=seed, left_pad=left_pad)


# ---- golden dump, changed both ways, idempotence, options ----------------------------------

def test_moe_sort_golden():
    """Sigmoid scores with a selection bias, groups, a gated shared expert, gelu_tanh experts."""
    graph = moe_graph(experts=4, top_k=2, shared=5, shared_gate=True, bias=True, groups=2, top_groups=1,
                      scoring="sigmoid", routed_scale=2.5, group_score="top2_sum", activation="gelu_tanh")
    assert assert_pass(MoeSort(), graph, golden="moe-sort", feeds=feeds_for(graph, tokens=7))


def test_graphs_without_moe_are_left_alone(tiny_llama):
    assert_unchanged(MoeSort(), tiny_llama)
    assert_unchanged(MoeSort(capacity_factor=1.0), load("examples/tiny-llama3.yaml"))


def test_printed_form_round_trips():
    after, _ = apply_pass(MoeSort(capacity_factor=1.5), load("examples/tiny-deepseek-v3.yaml"))
    text = print_graph(after)
    assert print_graph(parse_graph(text)) == text
    assert "capacity_factor=1.5" in text and not any(n.op == "moe" for n in after.nodes)


def test_pipeline_options():
    (p,) = parse_pipeline("moe-sort{capacity_factor=1.25,tile=32}")
    assert isinstance(p, MoeSort) and p.config == {"capacity_factor": 1.25, "tile": 32} and not p.exact
    assert MoeSort().exact
    for bad in ({"capacity_factor": 0}, {"capacity_factor": "many"}, {"tile": 0}, {"tile": 1.5}):
        with pytest.raises(PassError):
            MoeSort(**bad)


# ---- whole models: prefill, decode, left padding --------------------------------------------

@pytest.mark.parametrize("model", sorted(MODELS))
def test_tiny_models_match(model):
    graph = MODELS[model]()
    assert assert_pass(MoeSort(), graph)
    after, _ = apply_pass(MoeSort(), graph)
    assert not any(n.op == "moe" for n in after.nodes)
    cases = {"prefill": dict(past=0, tokens=6), "decode": dict(past=5, tokens=1), "chunk": dict(past=3, tokens=4),
             "left-padded prefill": dict(past=0, tokens=6, left_pad=3),
             "left-padded decode": dict(past=5, tokens=1, left_pad=4)}
    for case, sizes in cases.items():
        error = compare_outputs(graph, after, feeds_for(graph, **sizes))
        assert error <= TOLERANCE, f"{model} {case}: {error:.3g}"


@pytest.mark.parametrize("spec", ["mixtral-8x7b", "deepseek-v2", "deepseek-v3", "tiny-mixtral-8x7b"])
def test_flops_and_active_params_unchanged(spec):
    """Grouped GEMMs count only active expert work; one token touches top_k / E of each expert
    weight. Full-size specs compile shape-only: no weight is allocated."""
    graph = load(f"examples/{spec}.yaml")
    after, _ = apply_pass(MoeSort(), graph)
    before, now = analyze(graph), analyze(after)
    for key in ("flops_per_token", "params_active", "params_total", "param_bytes", "kv_cache_bytes_per_token"):
        assert now[key] == before[key], key
    assert all(p.data is None for p in after.params.values())  # shape-only stays shape-only


def test_emitted_numpy_module_matches():
    """The new ops' references are emit-friendly: the standalone module computes the same."""
    after, _ = apply_pass(MoeSort(capacity_factor=1.0), MODELS["qwen3-moe-norm"]())
    module = types.ModuleType("moe_sorted_np")
    exec(compile(module_source(after), "moe_sorted_np", "exec"), module.__dict__)
    weights = dict(np.load(io.BytesIO(weights_npz(after))))
    feeds = feeds_for(after, tokens=4, past=2)
    outputs = module.forward(weights, **feeds)
    for value, expected in zip(after.outputs, run_reference(after, feeds)):
        assert np.array_equal(outputs[value.name], expected)


# ---- the ops --------------------------------------------------------------------------------

def test_sorted_arrays_equal_dense_reference():
    rng = np.random.default_rng(1)
    x, router = rng.standard_normal((3, 5, 8)).astype(np.float32), rng.standard_normal((6, 8)).astype(np.float32)
    w = [(rng.standard_normal(s) * 0.3).astype(np.float32) for s in ((6, 4, 8), (6, 4, 8), (6, 8, 4))]
    shared = [(rng.standard_normal(s) * 0.3).astype(np.float32) for s in ((5, 8), (5, 8), (8, 5), (1, 8))]
    routing = dict(top_k=3, scoring="softmax", norm_topk_prob=False, routed_scale=1.5, n_group=3, topk_group=2)
    expected = moe_dense(x, router, *w, None, *shared, **routing)
    assert np.allclose(moe_sorted(x, router, *w, None, *shared, **routing), expected, rtol=1e-5, atol=1e-6)


def test_dispatch_sorts_by_expert_in_priority_order():
    ids = np.array([[2, 0], [0, 2], [2, 1]])
    token_index, slot_index, indptr = dispatch(ids, experts=4)
    assert indptr.tolist() == [0, 2, 3, 6, 6]
    # expert 0: token 1 (first choice) before token 0 (second); expert 2: tokens 0, 2, then 1
    assert token_index.tolist() == [1, 0, 2, 0, 2, 1]
    assert slot_index.tolist() == [2, 1, 5, 0, 4, 3]
    assert np.array_equal(ids.reshape(-1)[slot_index], [0, 0, 1, 2, 2, 2])


def test_grouped_gemm_is_a_segment_gemm():
    rng = np.random.default_rng(2)
    rows, w = rng.standard_normal((7, 3)).astype(np.float32), rng.standard_normal((3, 4, 3)).astype(np.float32)
    indptr = np.array([0, 2, 2, 6])  # expert 1 empty, row 6 outside every segment (dropped)
    out = grouped_gemm(rows, w, indptr)
    expected = np.concatenate([rows[:2] @ w[0].T, rows[2:6] @ w[2].T, np.zeros((1, 4), np.float32)])
    assert np.allclose(out, expected, rtol=1e-6)
    assert tile_padding([0, 1, 16, 17], tile=16) == 0 + 15 + 0 + 15


def test_grouped_gemm_refuses_mismatched_shapes():
    rows, indptr = Value("rows", F32, ("M", 8)), Value("indptr", DType.i64, (5,))
    with pytest.raises(ShapeError, match="grouped_gemm: w"):
        ops.infer("grouped_gemm", [rows, Value("w", F32, (4, 6, 7)), indptr], {"experts": 4, "top_k": 2})
    with pytest.raises(ShapeError, match="indptr"):
        ops.infer("grouped_gemm", [rows, Value("w", F32, (4, 6, 8)), Value("p", DType.i64, (4,))],
                  {"experts": 4, "top_k": 2})


# ---- capacity: GShard priority, dropped tokens reported ---------------------------------------

def test_capacity_drops_what_gshard_priority_says():
    """4 tokens, top-2 of 2 experts, capacity_factor 0.5: C = ceil(0.5 * 4 * 2 / 2) = 2.
    Expert 0 is asked by tokens 0, 1, 3 (first choices) and 2 (second): it keeps 0, 1 and
    drops token 3's first choice and token 2's second. Expert 1 is asked by token 2 (first)
    and 0, 1, 3 (second): it keeps 2 and 0. So token 3 loses both slots, token 1 its second."""
    ids = np.array([[0, 1], [0, 1], [1, 0], [0, 1]])
    assert expert_capacity(4, 2, 2, 0.5) == 2
    token_index, slot_index, indptr = dispatch(ids, experts=2, capacity_factor=0.5)
    assert indptr.tolist() == [0, 2, 4]
    kept = sorted((int(s) // 2, int(s) % 2) for s in slot_index[:indptr[-1]])  # (token, choice)
    assert kept == [(0, 0), (0, 1), (1, 0), (2, 0)]
    assert sorted(token_index[indptr[-1]:].tolist()) == [1, 2, 3, 3]


def forced_routing_graph() -> tuple[Graph, np.ndarray]:
    """One moe with 2 experts whose router sends tokens [1,0] to expert 0 first and [0,1] to
    expert 1 first: the hand-checked routing above."""
    g = moe_graph(experts=2, top_k=2, d=2, d_ff=3)
    g.params["moe.router"].data = np.eye(2, dtype=np.float32)
    x = np.array([[[1, 0], [1, 0], [0, 1], [1, 0]]], dtype=np.float32)
    return g, x


def test_capacity_factor_in_a_graph_and_its_report():
    graph, x = forced_routing_graph()
    after, changed = apply_pass(MoeSort(capacity_factor=0.5, tile=4), graph)
    assert changed
    (out,) = run_reference(after, {"x": x})
    seeded = graph.clone()
    seed_absent(seeded)  # the weights the interpreter runs with
    w = {n: seeded.params[n].array() for n in ("moe.w_gate", "moe.w_up", "moe.w_down")}
    router = np.eye(2, dtype=np.float32)
    scores = np.exp(x[0] @ router.T) / np.exp(x[0] @ router.T).sum(-1, keepdims=True)  # renormalised: top-2 of 2

    def expert(e, t):
        return scores[t, e] * expert_mlp(x[0, t][None], w["moe.w_gate"][e], w["moe.w_up"][e], w["moe.w_down"][e])[0]

    expected = np.stack([expert(0, 0) + expert(1, 0), expert(0, 1), expert(1, 2), np.zeros(2, np.float32)])
    assert np.allclose(out[0], expected, rtol=1e-5, atol=1e-6)
    report = MoeSort(capacity_factor=0.5, tile=4).report(after, {"x": x})
    (layer,) = report["layers"]
    assert layer["tokens_per_expert"] == [4, 4] and layer["kept_per_expert"] == [2, 2]
    assert layer["capacity"] == 2 and layer["dropped"] == 4 == report["dropped"]
    assert layer["padding"] == 2 + 2 and layer["imbalance"] == 1.0
    # without a capacity nothing drops and the result is the op's
    after, _ = apply_pass(MoeSort(), graph)
    assert MoeSort().report(after, {"x": x})["dropped"] == 0
    assert compare_outputs(graph, after, {"x": x}) <= TOLERANCE


def test_pass_manager_reports_the_capacity_error_instead_of_failing():
    graph = load("examples/tiny-mixtral-8x7b.yaml")
    manager = PassManager(parse_pipeline("moe-sort{capacity_factor=0.25}"), checker=compare_outputs)
    manager.run(graph)
    (record,) = manager.records
    assert record.changed and record.check_error > TOLERANCE  # tokens were dropped, and it says so


# ---- the report ---------------------------------------------------------------------------------

def test_report_on_tiny_mixtral():
    graph = load("examples/tiny-mixtral-8x7b.yaml")
    after, _ = apply_pass(MoeSort(), graph)
    report = MoeSort(tile=8).report(after)
    assert [layer["layer"] for layer in report["layers"]] == [0, 1]
    for layer in report["layers"]:
        counts = np.array(layer["tokens_per_expert"])
        assert layer["tokens"] == 6 and counts.sum() == layer["pairs"] == 12  # check sizes: B=2, T=3
        assert layer["imbalance"] == pytest.approx(counts.max() / counts.mean(), abs=1e-4)
        assert layer["padding"] == int(np.sum(np.ceil(counts / 8) * 8 - counts))
        assert layer["dropped"] == 0 and layer["capacity"] is None
    assert report["padding"] == sum(layer["padding"] for layer in report["layers"])
    assert MoeSort().report(graph)["layers"] == []  # nothing sorted yet: nothing to count
    assert "skipped" in MoeSort().report(apply_pass(MoeSort(), load("examples/mixtral-8x7b.yaml"))[0])


# ---- random shapes ----------------------------------------------------------------------------

@st.composite
def moe_configs(draw):
    groups = draw(st.sampled_from([None, 1, 2, 4]))
    per_group = draw(st.integers(1, 4))
    experts = groups * per_group if groups else draw(st.integers(1, 12))
    top_groups = draw(st.integers(1, groups)) if groups else None
    top_k = draw(st.integers(1, min(experts, top_groups * per_group if groups else experts, 6)))
    return dict(experts=experts, top_k=top_k, groups=groups, top_groups=top_groups,
                scoring=draw(st.sampled_from(["softmax", "sigmoid"])), bias=draw(st.booleans()),
                norm_topk_prob=draw(st.booleans()), shared=draw(st.sampled_from([0, 5])),
                group_score=draw(st.sampled_from(["max", "top2_sum"])) if per_group >= 2 else "max")


@settings(max_examples=20, deadline=None)
@given(config=moe_configs(), batch=st.integers(1, 3), tokens=st.integers(1, 9), seed=st.integers(0, 3))
def test_random_moes(config, batch, tokens, seed):
    graph = moe_graph(**config)
    after, changed = apply_pass(MoeSort(), graph)
    assert changed
    feeds = random_feeds(graph, batch=batch, tokens=tokens, seed=seed)
    assert compare_outputs(graph, after, feeds, seed=seed) <= TOLERANCE
    layer = MoeSort().report(after, feeds, seed=seed)["layers"][0]
    assert layer["pairs"] == batch * tokens * config["top_k"] and layer["dropped"] == 0


def gshard_kept(ids: np.ndarray, experts: int, capacity: int) -> set:
    """The kept (token, choice) pairs, one at a time in GShard priority order."""
    used, kept = [0] * experts, set()
    for choice in range(ids.shape[1]):
        for token in range(ids.shape[0]):
            if used[ids[token, choice]] < capacity:
                used[ids[token, choice]] += 1
                kept.add((token, choice))
    return kept


@settings(max_examples=40, deadline=None)
@given(experts=st.integers(1, 8), top_k=st.integers(1, 4), tokens=st.integers(1, 12),
       factor=st.sampled_from([0.25, 0.5, 1.0, 1.25, 2.0]), seed=st.integers(0, 1000))
def test_random_capacity_drops(experts, top_k, tokens, factor, seed):
    top_k = min(top_k, experts)
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.permutation(experts)[:top_k] for _ in range(tokens)])
    token_index, slot_index, indptr = dispatch(ids, experts, factor)
    capacity = expert_capacity(tokens, top_k, experts, factor)
    kept = {(int(s) // top_k, int(s) % top_k) for s in slot_index[:indptr[-1]]}
    assert kept == gshard_kept(ids, experts, capacity)
    assert sorted(slot_index.tolist()) == list(range(tokens * top_k))  # a permutation: dropped pairs at the end
    assert np.array_equal(token_index, slot_index // top_k)
    assert np.array_equal(np.diff(indptr), np.minimum(np.bincount(ids.reshape(-1), minlength=experts), capacity))
    assert np.all(np.diff(ids.reshape(-1)[slot_index[:indptr[-1]]]) >= 0)  # sorted by expert


# ---- hybrids from Hugging Face twins --------------------------------------------------------

@pytest.mark.parametrize("case", ["jamba-moe-every-other", "jamba-top1-mqa-proj-bias",
                                  "granite-moe-shared-rope-multipliers"])
def test_hybrid_hf_twins_match(case, tmp_path):
    """Jamba's and Granite-4.0-H's MoE layers as the HF frontend builds them from a saved
    transformers model (Nemotron-H's MoE is refused at the frontend: nothing to sort)."""
    pytest.importorskip("transformers")
    from frontends import load_spec
    from tests.frontends.test_hf_ssm import build_case

    _, folder = build_case(case, tmp_path / case)
    graph = load_spec(str(folder))
    assert any(n.op == "moe" for n in graph.nodes)
    assert assert_pass(MoeSort(), graph)
    after, _ = apply_pass(MoeSort(), graph)
    for sizes in (dict(past=0, tokens=6), dict(past=5, tokens=1, left_pad=4)):
        assert compare_outputs(graph, after, feeds_for(graph, **sizes)) <= TOLERANCE


def test_moe_sort_then_quantize_on_a_hybrid():
    """moe-sort then quantize on Granite-4.0-H: grouped expert GEMMs quantized, the Mamba-2
    Δ rows still float."""
    from passes.quantize import Quantize

    graph = load("examples/tiny-granite-4.0-h-small.yaml")
    seed_absent(graph)
    MoeSort().run(graph)
    assert Quantize(bits=4).run(graph)
    assert "layers.0.moe.w_gate.qweight" in graph.params
    assert graph.params["layers.0.ssm.in_proj.rows_288_296"].dtype == F32
