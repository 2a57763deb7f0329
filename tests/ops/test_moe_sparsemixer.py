"""moe with ``scoring="sparsemixer"`` (Phi-3.5-MoE's routing at inference): ``route`` against
transformers' own ``sparsemixer`` (random logits at several scales and thresholds, and rows
written by hand for ties, all-equal and zero logits, the strict threshold, the |logit| clamp
of round 2), the moe op against transformers' PhimoeSparseMoeBlock, the ONNX lowerings (both
targets: ORT's MoE op ignores ``use_sparse_mixer``, so onnx-ort keeps standard ops), moe-sort,
inference refusals, cost and the printed form."""
import numpy as np
import pytest

from irc import ops
from irc.build import emit1
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Graph, Value
from irc.ops.moe import OPERANDS, moe_dense, moe_per_token, route, sparsemixer
from irc.ops.registry import TensorType
from irc.testing import run_op

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

D, F, E = 16, 8, 4
B, T = 2, 5
NAMES = [spec.rstrip("?") for spec in OPERANDS]
MIXER = {"experts": E, "top_k": 2, "scoring": "sparsemixer", "norm_topk_prob": False, "jitter_eps": 0.01}


def hf_sparsemixer(logits: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """transformers' sparsemixer at inference: (ids [N, 2], weights [N, 2])."""
    from transformers.models.phimoe.modeling_phimoe import sparsemixer as hf

    with torch.no_grad():
        weights, ids = hf(torch.from_numpy(np.ascontiguousarray(logits, np.float32)), eps, False)
    return ids.numpy(), weights.numpy()


def logits_route(logits: np.ndarray, eps: float, **routing):
    """``route`` on exactly these logits: tokens = the logits, router = the identity."""
    logits = np.asarray(logits, np.float32)
    return route(logits, np.eye(logits.shape[1], dtype=np.float32), top_k=2, scoring="sparsemixer", jitter_eps=eps,
                 norm_topk_prob=False, **routing)


@pytest.mark.parametrize("eps", [0.0, 0.01, 0.1, 0.4])
@pytest.mark.parametrize("scale", [0.01, 0.3, 3.0])
def test_route_equals_transformers_on_random_logits(scale, eps):
    rng = np.random.default_rng(int(scale * 100) + int(eps * 1000))
    x = rng.standard_normal((400, D)).astype(np.float32)
    router = (rng.standard_normal((8, D)) * scale).astype(np.float32)
    ids, weights = route(x, router, top_k=2, scoring="sparsemixer", jitter_eps=eps, norm_topk_prob=False)
    want_ids, want_weights = hf_sparsemixer(x @ router.T, eps)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-6, atol=1e-7)
    if eps >= 0.1:  # the mixer is partly open: some weights are neither 1 nor a full softmax's
        assert (weights < 1 - 1e-6).any() and (weights > 1 - 1e-6).any()


# rows of logits, their threshold eps, and (ids, weights) by hand
HAND = [
    ([1.0, 3.0, 3.0, 2.0], 0.01, [1, 2], [0.5, 1.0]),            # a tie at the max: the lower index first
    ([2.0, 2.0, 2.0, 2.0], 0.01, [0, 1], [0.25, 1 / 3]),          # all equal: nothing masked
    ([0.0, 0.0, 0.0, 0.0], 0.01, [0, 1], [0.25, 1 / 3]),          # 0 / 0 compares false: kept
    ([-1.0, -1.0, -2.0, -3.0], 0.01, [0, 1], [0.5, 1.0]),         # negative logits, a tie
    ([1.0, 0.75, 0.5, -4.0], 0.125, [0, 1], [1 / (1 + np.exp(-0.25)), 1.0]),  # ratio == 2 eps: kept
    ([1.0, 0.7499, 0.5, -4.0], 0.125, [0, 1], [1.0, 1.0]),       # just past it: masked
    # round 2 divides by max(|s|, max2): -10 stays (10.5 / 10 < 2), as in round 1 (15 / 10 < 2)
    ([5.0, 0.5, -0.45, -10.0], 1.0, [0, 1], None),
]


@pytest.mark.parametrize("row, eps, want_ids, want_weights", HAND)
def test_hand_written_rows(row, eps, want_ids, want_weights):
    ids, weights = logits_route([row], eps)
    hf_ids, hf_weights = hf_sparsemixer(np.array([row]), eps)
    np.testing.assert_array_equal(ids, hf_ids)
    np.testing.assert_allclose(weights, hf_weights, rtol=1e-6)
    assert ids[0].tolist() == want_ids
    if want_weights is None:  # every logit kept in both rounds: full softmaxes
        s = np.array(row)
        first = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        rest = np.exp(s[1:] - s[1]) / np.exp(s[1:] - s[1]).sum()
        want_weights = [first[0], rest[0]]
    np.testing.assert_allclose(weights[0], want_weights, rtol=1e-6)


def test_renormalisation_and_scale_apply_after_the_mixer():
    row = [[1.0, 0.9, 0.2, -1.0]]
    _, raw = logits_route(row, 0.1)
    assert not np.allclose(raw.sum(), 1.0)
    _, scaled = route(np.asarray(row, np.float32), np.eye(4, dtype=np.float32), top_k=2, scoring="sparsemixer",
                      jitter_eps=0.1, norm_topk_prob=True, routed_scale=2.0)
    np.testing.assert_allclose(scaled, 2.0 * raw / raw.sum(), rtol=1e-6)


# ---- the op against transformers' block ---------------------------------------------------

def weights(seed, router_scale=1.0):
    rng = np.random.default_rng(seed)

    def randn(*shape, s=1.0):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    w = dict.fromkeys(NAMES)
    w.update(x=randn(B, T, D), router=randn(E, D, s=router_scale * D ** -0.5), w_gate=randn(E, F, D, s=0.5),
             w_up=randn(E, F, D, s=0.5), w_down=randn(E, D, F, s=0.5))
    return w


def irc_moe(w, attrs):
    (out,) = run_op("moe", [w[name] for name in NAMES], attrs)
    return out


def hf_block(w, eps):
    from transformers.models.phimoe.modeling_phimoe import PhimoeSparseMoeBlock

    config = transformers.PhimoeConfig(hidden_size=D, intermediate_size=F, num_local_experts=E,
                                       num_experts_per_tok=2, router_jitter_noise=eps)
    block = PhimoeSparseMoeBlock(config).eval()
    with torch.no_grad():
        block.router.weight.copy_(torch.from_numpy(w["router"]))
        block.experts.gate_up_proj.copy_(torch.from_numpy(np.concatenate([w["w_gate"], w["w_up"]], axis=1)))
        block.experts.down_proj.copy_(torch.from_numpy(w["w_down"]))
        return block(torch.from_numpy(w["x"])).numpy()


def relative(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("eps, router_scale", [(0.01, 1.0), (0.3, 1.0), (0.05, 0.1)])
def test_the_op_equals_transformers_sparse_moe_block(eps, router_scale):
    w = weights(0, router_scale)
    attrs = {**MIXER, "jitter_eps": eps}
    want = hf_block(w, eps)
    assert relative(irc_moe(w, attrs), want) <= 1e-5
    args = [w[name] for name in NAMES]
    routing = {"top_k": 2, "scoring": "sparsemixer", "norm_topk_prob": False, "jitter_eps": eps}
    assert relative(moe_per_token(*args, **routing), want) <= 1e-5
    assert relative(moe_dense(*args, **routing), want) <= 1e-5


@pytest.mark.parametrize("top_k", [1, 3])
def test_transformers_routes_two_experts_whatever_num_experts_per_tok_says(top_k):
    """Why the HF frontend refuses num_experts_per_tok != 2: transformers' router ignores it."""
    from transformers.models.phimoe.modeling_phimoe import PhimoeTopKRouter

    config = transformers.PhimoeConfig(hidden_size=D, num_local_experts=E, num_experts_per_tok=top_k)
    with torch.no_grad():
        _, weights, chosen = PhimoeTopKRouter(config).eval()(torch.randn(6, D))
    assert tuple(chosen.shape) == tuple(weights.shape) == (6, 2)


def test_sparsemixer_is_not_softmax_top_2():
    """The same weights routed by softmax top-2 (either normalisation) give other numbers."""
    w = weights(1, 0.3)
    mixed = irc_moe(w, {**MIXER, "jitter_eps": 0.3})
    for norm in (True, False):
        plain = irc_moe(w, {"experts": E, "top_k": 2, "norm_topk_prob": norm})
        assert relative(plain, mixed) > 1e-2


# ---- refusals, cost, printing ----------------------------------------------------------------

def _value(name, shape):
    return Value(name, DType.f32, shape)


def _operands(bias=False):
    values = [_value("x", (2, 3, D)), _value("r", (E, D)), _value("g", (E, F, D)), _value("u", (E, F, D)),
              _value("d", (E, D, F))]
    return values + ([_value("b", (E,))] if bias else [])


@pytest.mark.parametrize("change, message", [
    ({"top_k": 3}, "sparsemixer routes exactly 2 experts, got top_k 3"),
    ({"top_k": 1}, "sparsemixer routes exactly 2 experts, got top_k 1"),
    ({"n_group": 2, "topk_group": 1}, "sparsemixer has no expert groups"),
    ({"jitter_eps": -0.1}, "jitter_eps must be a non-negative number"),
    ({"jitter_eps": float("nan")}, "jitter_eps must be a non-negative number"),
    ({"scoring": "sparse"}, "scoring must be one of softmax, sigmoid, sparsemixer"),
])
def test_inference_refuses_bad_attributes(change, message):
    with pytest.raises(ShapeError, match=message):
        ops.infer("moe", _operands(), ops.get_op("moe").normalize_attrs({**MIXER, **change}))


def test_a_selection_bias_is_refused_by_moe_and_moe_route():
    with pytest.raises(ShapeError, match="sparsemixer routing takes no router_bias"):
        ops.infer("moe", _operands(bias=True), ops.get_op("moe").normalize_attrs(MIXER))
    with pytest.raises(ShapeError, match="sparsemixer routing takes no router_bias"):
        ops.infer("moe_route", [_value("x", (6, D)), _value("r", (E, D)), _value("b", (E,))],
                  ops.get_op("moe_route").normalize_attrs(MIXER))


def test_cost_counts_the_two_rounds():
    types = [TensorType(DType.f32, s) for s in [(1, 3, D), (E, D), (E, F, D), (E, F, D), (E, D, F)]]
    out = [TensorType(DType.f32, (1, 3, D))]
    softmax = ops.get_op("moe").cost(types, out, ops.get_op("moe").normalize_attrs({"experts": E, "top_k": 2}))
    mixer = ops.get_op("moe").cost(types, out, ops.get_op("moe").normalize_attrs(MIXER))
    assert mixer.flops == softmax.flops and mixer.bytes_read == softmax.bytes_read
    assert mixer.other_flops - softmax.other_flops == 3 * 11 * E
    route_types, route_out = types[:2], [TensorType(DType.i64, (3, 2)), TensorType(DType.f32, (3, 2))]
    route_cost = ops.get_op("moe_route").cost(route_types, route_out, ops.get_op("moe_route").normalize_attrs(MIXER))
    assert route_cost.other_flops == 3 * 16 * E


def moe_graph(w, attrs) -> Graph:
    g = Graph("moe_sparsemixer")
    x = g.add_input("x", DType.f32, ("B", "T", w["router"].shape[1]))
    inputs = [x] + [g.add_param(f"moe.{name}", DType.f32, w[name].shape, w[name])
                    for name in ("router", "w_gate", "w_up", "w_down")]
    g.outputs = [emit1(g, "moe", inputs, attrs, "out")]
    return g


def test_the_printed_form_round_trips_the_threshold():
    from irc.parser import parse_graph
    from irc.printer import print_graph

    graph = moe_graph(weights(2), {**MIXER, "jitter_eps": 0.3})
    text = print_graph(graph)
    assert 'jitter_eps=0.3' in text and 'scoring="sparsemixer"' in text
    assert print_graph(parse_graph(text)) == text
    assert "jitter_eps" not in print_graph(moe_graph(weights(2), MIXER))  # the default is left out


# ---- ONNX and moe-sort ------------------------------------------------------------------------

def tie_weights(seed):
    """Token rows whose logits are the HAND rows exactly (router = [I | 0]), then random ones."""
    w = weights(seed)
    rows = np.array([row for row, *_ in HAND], np.float32)
    x = np.random.default_rng(seed).standard_normal((1, len(rows) + 5, D)).astype(np.float32)
    x[0, :len(rows), :E], x[0, :len(rows), E:] = rows, 0.0
    router = np.zeros((E, D), np.float32)
    router[:, :E] = np.eye(E)
    router[:, E:] = np.random.default_rng(seed + 1).standard_normal((E, D - E)) * 0.5
    w.update(x=x, router=router)
    return w


@pytest.mark.parametrize("sort", [False, True], ids=["moe", "moe-sorted"])
@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("eps", [0.125, 1.0])
def test_onnx_lowerings_equal_the_reference_ties_included(tmp_path, target, eps, sort):
    """The dense moe lowering and moe-sort's moe_route lowering, both targets."""
    ort = pytest.importorskip("onnxruntime")
    import onnx

    from backends.onnx.emit import emit_model
    from irc.testing import apply_pass
    from passes.moe_sort import MoeSort

    w = tie_weights(3)
    attrs = {**MIXER, "jitter_eps": eps}
    path = str(tmp_path / "moe.onnx")
    graph = moe_graph(w, attrs)
    emit_model(apply_pass(MoeSort(), graph)[0] if sort else graph, path, target=target, genai=False)
    kinds = [node.op_type for node in onnx.load(path).graph.node]
    assert "MoE" not in kinds and kinds.count("ArgMax") == 2
    (got,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": w["x"]})
    np.testing.assert_allclose(got, irc_moe(w, attrs), rtol=1e-5, atol=1e-5 * np.abs(got).max())


def test_ort_moe_ignores_use_sparse_mixer():
    """Why onnx-ort does not use com.microsoft.MoE here: ORT 1.32's CPU MoE with
    ``use_sparse_mixer=1`` computes softmax top-2 without renormalisation, not sparsemixer."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    from backends.onnx.moe import interleave_gate_up

    w = weights(4, router_scale=0.3)
    x = w["x"].reshape(-1, D)
    logits = x @ w["router"].T
    node = helper.make_node("MoE", ["x", "logits", "fc1", "", "fc2"], ["y"], domain="com.microsoft", k=2,
                            activation_type="swiglu", swiglu_fusion=1, activation_alpha=1.0, activation_beta=0.0,
                            use_sparse_mixer=1, normalize_routing_weights=0)
    graph = helper.make_graph(
        [node], "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)),
                          helper.make_tensor_value_info("logits", TensorProto.FLOAT, list(logits.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))],
        [numpy_helper.from_array(interleave_gate_up(w["w_gate"], w["w_up"]), "fc1"),
         numpy_helper.from_array(w["w_down"], "fc2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"x": x, "logits": logits})
    routing = {"top_k": 2, "norm_topk_prob": False}
    args = [w[name] for name in NAMES]
    softmax_top2 = moe_dense(*args, **routing).reshape(x.shape)
    mixed = moe_dense(*args, **routing, scoring="sparsemixer", jitter_eps=0.01).reshape(x.shape)
    assert relative(got, softmax_top2) <= 1e-5 and relative(got, mixed) > 1e-2


def test_moe_sort_routes_with_the_mixer_and_equals_the_reference():
    from irc.check import compare_outputs
    from irc.interpreter import random_feeds
    from irc.testing import apply_pass
    from passes.moe_sort import MoeSort

    graph = moe_graph(tie_weights(5), {**MIXER, "jitter_eps": 0.3})
    after, changed = apply_pass(MoeSort(), graph)
    assert changed
    (node,) = [n for n in after.nodes if n.op == "moe_route"]
    assert node.attrs["scoring"] == "sparsemixer" and node.attrs["jitter_eps"] == 0.3
    assert compare_outputs(graph, after, {"x": tie_weights(5)["x"]}) <= 1e-5
    assert compare_outputs(graph, after, random_feeds(graph, batch=3, tokens=7, seed=1)) <= 1e-5
    again, changed_again = apply_pass(MoeSort(), after)
    assert not changed_again and [n.op for n in again.nodes] == [n.op for n in after.nodes]


@pytest.mark.parametrize("sort", [False, True])
def test_the_emitted_numpy_module_routes_the_same(sort):
    """The references are emit-friendly: the standalone NumPy module (the moe op, or moe-sort's
    moe_route) gives the reference's output, ties included."""
    import io
    import types

    from backends.numpy.emit import module_source, weights_npz
    from irc.check import run_reference
    from irc.testing import apply_pass
    from passes.moe_sort import MoeSort

    w = tie_weights(6)
    graph = moe_graph(w, {**MIXER, "jitter_eps": 1.0})
    if sort:
        graph, _ = apply_pass(MoeSort(), graph)
    module = types.ModuleType("sparsemixer_np")
    exec(compile(module_source(graph), "sparsemixer_np", "exec"), module.__dict__)
    outputs = module.forward(dict(np.load(io.BytesIO(weights_npz(graph)))), x=w["x"])
    (expected,) = run_reference(graph, {"x": w["x"]})
    assert np.array_equal(outputs["out"], expected)
