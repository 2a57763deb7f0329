"""moe with GPT-OSS's additions (router logit bias, expert biases, the clamped ``swiglu_oai``
GLU): the reference against transformers' GptOssMLP and a hand-written NumPy expert loop,
the ONNX lowerings (standard ops and com.microsoft.MoE) against the reference, inference
refusals, cost, and moe-sort's sorted form of them."""
import numpy as np
import pytest

from irc import ops
from irc.build import emit1
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Graph, Value
from irc.ops.moe import OPERANDS, glu, moe_dense, moe_per_token
from irc.ops.registry import TensorType
from irc.testing import run_op

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

D, F, E, K = 16, 8, 4, 2
B, T = 2, 5
NAMES = [spec.rstrip("?") for spec in OPERANDS]
OAI = {"experts": E, "top_k": K, "activation": "swiglu_oai", "swiglu_alpha": 1.702, "swiglu_limit": 7.0}


def weights(seed, biases=True, scale=1.0):
    """GPT-OSS-shaped arrays; ``scale`` large enough that the clamps at 7 bite."""
    rng = np.random.default_rng(seed)

    def randn(*shape, s=1.0):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    w = dict.fromkeys(NAMES)
    w.update(x=randn(B, T, D), router=randn(E, D), w_gate=randn(E, F, D, s=scale), w_up=randn(E, F, D, s=scale),
             w_down=randn(E, D, F, s=0.3))
    if biases:
        w.update(router_logit_bias=randn(E), b_gate=randn(E, F), b_up=randn(E, F), b_down=randn(E, D))
    return w


def irc_moe(w, attrs):
    (out,) = run_op("moe", [w[name] for name in NAMES], attrs)
    return out


def hf_gpt_oss_mlp(w):
    """transformers' GptOssMLP with the same weights (gate_up_proj [E, d, 2F], gate and up
    interleaved in its last axis), on x."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    config = transformers.GptOssConfig(hidden_size=D, intermediate_size=F, num_local_experts=E,
                                       num_experts_per_tok=K)
    mlp = GptOssMLP(config).eval()
    gate_up = np.empty((E, D, 2 * F), np.float32)
    gate_up[..., 0::2], gate_up[..., 1::2] = w["w_gate"].transpose(0, 2, 1), w["w_up"].transpose(0, 2, 1)
    bias = np.empty((E, 2 * F), np.float32)
    bias[:, 0::2], bias[:, 1::2] = w["b_gate"], w["b_up"]
    with torch.no_grad():
        mlp.router.weight.copy_(torch.from_numpy(w["router"]))
        mlp.router.bias.copy_(torch.from_numpy(w["router_logit_bias"]))
        mlp.experts.gate_up_proj.copy_(torch.from_numpy(gate_up))
        mlp.experts.gate_up_proj_bias.copy_(torch.from_numpy(bias))
        mlp.experts.down_proj.copy_(torch.from_numpy(np.ascontiguousarray(w["w_down"].transpose(0, 2, 1))))
        mlp.experts.down_proj_bias.copy_(torch.from_numpy(w["b_down"]))
        out, _ = mlp(torch.from_numpy(w["x"]))
    return out.numpy()


def relative(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("scale", [0.3, 3.0])
def test_reference_equals_transformers_gpt_oss_mlp(scale):
    w = weights(0, scale=scale)
    assert relative(irc_moe(w, OAI), hf_gpt_oss_mlp(w)) <= 1e-5


def test_the_clamps_are_reached_at_scale_3():
    w = weights(0, scale=3.0)
    gate = np.einsum("btd,efd->btef", w["x"], w["w_gate"]) + w["b_gate"]
    up = np.einsum("btd,efd->btef", w["x"], w["w_up"]) + w["b_up"]
    assert (gate > 7).any() and (np.abs(up) > 7).any()


def test_glu_by_hand():
    gate = np.array([-9.0, -1.0, 0.5, 7.5, 20.0], np.float32)
    up = np.array([-8.0, 0.0, 2.0, 9.0, -3.0], np.float32)
    g = np.minimum(gate, 7.0)
    want = (np.clip(up, -7, 7) + 1) * g / (1 + np.exp(-1.702 * g))
    np.testing.assert_allclose(glu(gate, up, "swiglu_oai"), want, rtol=1e-6)
    np.testing.assert_allclose(glu(gate, up, "silu"), gate / (1 + np.exp(-gate)) * up, rtol=1e-6)


def hand_written(w, activation="swiglu_oai"):
    """Token by token: logits + bias, top-k, softmax over the k, biased experts."""
    x = w["x"].reshape(-1, D)
    out = np.zeros_like(x)
    for n, token in enumerate(x):
        logits = w["router"] @ token + w["router_logit_bias"]
        chosen = np.argsort(-logits, kind="stable")[:K]
        gates = np.exp(logits[chosen] - logits[chosen].max())
        for e, g in zip(chosen, gates / gates.sum()):
            hidden = glu(w["w_gate"][e] @ token + w["b_gate"][e], w["w_up"][e] @ token + w["b_up"][e], activation)
            out[n] += g * (w["w_down"][e] @ hidden + w["b_down"][e])
    return out.reshape(w["x"].shape)


@pytest.mark.parametrize("activation", ["swiglu_oai", "silu"])
def test_dense_per_token_and_hand_written_agree(activation):
    w = weights(1, scale=2.0)
    attrs = {**OAI, "activation": activation}
    want = hand_written(w, activation)
    assert relative(irc_moe(w, attrs), want) <= 1e-5
    routing = {"top_k": K}
    args = [w[name] for name in NAMES]
    assert relative(moe_per_token(*args, activation=activation, **routing), want) <= 1e-5
    assert relative(moe_dense(*args, activation=activation, **routing), want) <= 1e-5


def _value(name, shape):
    return Value(name, DType.f32, shape)


@pytest.mark.parametrize("change, message", [
    ({"router_logit_bias": (E + 1,)}, "router_logit_bias"),
    ({"b_gate": (E, F + 1)}, "b_gate"),
    ({"b_up": None}, "b_gate and b_up must be given together"),
    ({"b_down": (E, F)}, "b_down"),
])
def test_inference_refuses_bad_biases(change, message):
    shapes = {"x": ("B", "T", D), "router": (E, D), "w_gate": (E, F, D), "w_up": (E, F, D), "w_down": (E, D, F),
              "router_logit_bias": (E,), "b_gate": (E, F), "b_up": (E, F), "b_down": (E, D)}
    shapes.update(change)
    values = [None if shapes.get(n) is None else _value(n, shapes[n]) for n in NAMES]
    with pytest.raises(ShapeError, match=message):
        ops.infer("moe", values, ops.get_op("moe").normalize_attrs(OAI))


@pytest.mark.parametrize("attr, value", [("swiglu_limit", 0.0), ("swiglu_alpha", -1.0), ("activation", "relu")])
def test_inference_refuses_bad_attributes(attr, value):
    values = [_value("x", (2, 3, D)), _value("r", (E, D)), _value("g", (E, F, D)), _value("u", (E, F, D)),
              _value("d", (E, D, F))]
    with pytest.raises(ShapeError, match=attr):
        ops.infer("moe", values, ops.get_op("moe").normalize_attrs({**OAI, attr: value}))


def test_cost_counts_the_clamped_glu_and_the_bias_rows():
    def cost(activation, biases):
        types = [TensorType(DType.f32, s) if s else None for s in
                 [(1, 3, D), (E, D), (E, F, D), (E, F, D), (E, D, F)] + [None] * 5
                 + ([(E,), (E, F), (E, F), (E, D)] if biases else [])]
        return ops.get_op("moe").cost(types, [TensorType(DType.f32, (1, 3, D))], {**OAI, "activation": activation})
    plain, oai, biased = cost("silu", False), cost("swiglu_oai", False), cost("swiglu_oai", True)
    assert plain.flops == oai.flops == biased.flops  # no matmul work added
    assert oai.other_flops - plain.other_flops == 3 * 4 * K * F
    assert biased.other_flops - oai.other_flops == 3 * K * (F + F + D)
    assert biased.bytes_read - oai.bytes_read == 4 * (E + 2 * E * F + E * D)


# ---- the graph: ONNX lowerings and moe-sort ---------------------------------------------------

def moe_graph(w, attrs) -> Graph:
    g = Graph("moe_oai")
    x = g.add_input("x", DType.f32, ("B", "T", D))
    inputs = [x]
    for name in NAMES[1:]:
        if w[name] is None:
            inputs.append(None)
            continue
        inputs.append(g.add_param(f"moe.{name}", DType.f32, w[name].shape, w[name]))
    while inputs[-1] is None:
        inputs.pop()
    g.outputs = [emit1(g, "moe", inputs, attrs, "out")]
    return g


@pytest.mark.parametrize("target, contrib", [("onnx", False), ("onnx-ort", True)])
@pytest.mark.parametrize("activation", ["swiglu_oai", "silu"])
def test_onnx_lowerings_equal_the_reference(tmp_path, target, contrib, activation):
    ort = pytest.importorskip("onnxruntime")
    import onnx

    from backends.onnx.emit import emit_model

    w = weights(2, scale=2.5)
    attrs = {**OAI, "activation": activation}
    graph = moe_graph(w, attrs)
    path = str(tmp_path / "moe.onnx")
    emit_model(graph, path, target=target, genai=False)
    kinds = {node.op_type for node in onnx.load(path).graph.node}
    assert ("MoE" in kinds) == contrib
    (got,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": w["x"]})
    assert relative(got, irc_moe(w, attrs)) <= 1e-5


@pytest.mark.parametrize("biases", [True, False], ids=["biases", "no-biases"])
def test_moe_sort_lowers_gpt_oss_experts_to_primitives(biases, tmp_path):
    """The sorted form takes the router logit bias (moe_route), the expert biases (rows
    gathered by each sorted row's expert) and the clamps (neg/maximum): equal to the
    reference with the clamps biting, through the interpreter and ONNX Runtime; the golden
    dump, the changed flag and idempotence as every pass test (``assert_pass``)."""
    ort = pytest.importorskip("onnxruntime")
    from backends.onnx.emit import emit_model
    from irc.interpreter import run
    from irc.testing import apply_pass, assert_pass
    from passes.moe_sort import MoeSort

    w = weights(3, biases=biases, scale=3.0)
    graph = moe_graph(w, OAI)
    feeds = {"x": w["x"]}
    assert assert_pass(MoeSort(), graph, golden="moe-sort-gpt-oss" if biases else None, feeds=feeds)
    result, _ = apply_pass(MoeSort(), graph)
    assert {"moe_route", "grouped_gemm", "maximum", "neg"} <= {n.op for n in result.nodes} and \
        "moe" not in {n.op for n in result.nodes}
    want = irc_moe(w, OAI)
    assert relative(run(result, feeds)["out"], want) <= 1e-5
    path = str(tmp_path / "sorted.onnx")
    emit_model(result, path, target="onnx", genai=False)
    (got,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert relative(got, want) <= 1e-5


def test_moe_sort_with_a_capacity_leaves_down_biases_with_a_note():
    """A dropped pair would still add its down bias: with capacity_factor the node stays a
    moe op, and moe-sort says why; without down biases it is sorted."""
    from irc.testing import apply_pass
    from passes.moe_sort import MoeSort

    sort = MoeSort(capacity_factor=1.0)
    result, changed = apply_pass(sort, moe_graph(weights(3), OAI))
    assert not changed and [n.op for n in result.nodes] == ["moe"]
    assert len(sort.notes) == 1 and "capacity_factor with expert down biases (b_down)" in sort.notes[0]
    assert apply_pass(MoeSort(capacity_factor=1.0), moe_graph(weights(3, biases=False), OAI))[1]
