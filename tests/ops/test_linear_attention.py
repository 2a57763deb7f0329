"""gated_delta_rule's two other forms: the decay per key channel (Kimi Delta Attention, held
against transformers' ``recurrent_kimi_delta_attention`` and ``chunk_kimi_delta_attention``)
and the gated rule with a constant per-head decay (MiniMax's lightning attention, held against
the recurrence written out); their chunked forms; inference refusals; cost; and every form
through both ONNX targets against the reference interpreter over non-zero states with padded
new tokens."""
import numpy as np
import pytest

from irc import build, ops
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Graph, Value
from irc.ops.delta import chunked_gated_delta_rule, gated_delta_rule

B, H, DK, DV = 2, 3, 8, 5
F32 = DType.f32


def relative(got, want) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def kimi_inputs(seq, seed=0):
    rng = np.random.default_rng(seed)

    def randn(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return {"q": randn(B, seq, H * DK), "k": randn(B, seq, H * DK), "v": randn(B, seq, H * DV),
            "a": randn(B, seq, H * DK), "b": randn(B, seq, H), "A_log": randn(H, scale=0.5),
            "dt_bias": randn(H * DK), "past_state": randn(B, H, DK, DV)}


KIMI = {"key_heads": H, "value_heads": H, "key_dim": DK, "value_dim": DV, "decay": "channel"}
LIGHTNING = {"key_heads": H, "value_heads": H, "key_dim": DK, "value_dim": DV, "update_rule": "gated",
             "l2_norm": False, "scale": 1.0}


@pytest.mark.parametrize("seq", [1, 7, 70])
@pytest.mark.parametrize("form", ["recurrent", "chunk"])
def test_per_channel_decay_matches_kimi_delta_attention(seq, form):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.kimi_linear import modeling_kimi_linear as kimi

    w = kimi_inputs(seq, seed=seq)
    t = {k: torch.from_numpy(v) for k, v in w.items()}
    g = -t["A_log"].exp().view(1, 1, H, 1) * torch.nn.functional.softplus((t["a"] + t["dt_bias"]).view(B, seq, H, DK))
    fn = kimi.recurrent_kimi_delta_attention if form == "recurrent" else kimi.chunk_kimi_delta_attention
    want_out, want_state = fn(*(t[n].view(B, seq, H, -1) for n in "qkv"), g=g, beta=t["b"].sigmoid(),
                              initial_state=t["past_state"].clone(), output_final_state=True,
                              use_qk_l2norm_in_kernel=True)
    out, state = gated_delta_rule(**w, **KIMI)
    assert relative(out, want_out.reshape(B, seq, -1).numpy()) < 1e-5
    assert relative(state, want_state.numpy()) < 1e-5


def lightning_by_hand(q, k, v, A_log, past_state):
    """MiniMax's recurrence: S = exp(-slope)·S + kᵀv, o = q·S (float64)."""
    seq = q.shape[1]
    decay = np.exp(-np.exp(A_log.astype(np.float64)))[None, :, None, None]
    S = past_state.astype(np.float64)
    qs, ks, vs = (x.reshape(B, seq, H, -1).astype(np.float64) for x in (q, k, v))
    out = []
    for t in range(seq):
        S = decay * S + np.einsum("bhk,bhv->bhkv", ks[:, t], vs[:, t])
        out.append(np.einsum("bhk,bhkv->bhv", qs[:, t], S))
    return np.stack(out, 1).reshape(B, seq, -1), S


@pytest.mark.parametrize("seq", [1, 9, 70])
def test_gated_rule_with_constant_decay_is_lightning_attention(seq):
    w = kimi_inputs(seq, seed=seq)
    q, k, v = w["q"] * 0.3, w["k"] * 0.3, w["v"]
    A_log = np.log(np.array([0.9, 0.2, 0.01], np.float32))  # slopes: fast, medium, slow decay
    want_out, want_state = lightning_by_hand(q, k, v, A_log, w["past_state"])
    out, state = gated_delta_rule(q, k, v, None, None, A_log, None, w["past_state"], **LIGHTNING)
    assert relative(out, want_out) < 1e-5 and relative(state, want_state) < 1e-5
    chunked_out, chunked_state = chunked_gated_delta_rule(q, k, v, None, None, A_log, None, w["past_state"],
                                                          chunk=16, **LIGHTNING)
    assert relative(chunked_out, want_out) < 1e-5 and relative(chunked_state, want_state) < 1e-5


def test_per_channel_chunked_form_and_padding():
    w = kimi_inputs(40, seed=3)
    mask = np.ones((B, 2 + 40), np.int64)
    mask[1, :2 + 15] = 0  # row 1: its past and its first 15 new tokens padded
    out, state = gated_delta_rule(**w, attention_mask=mask, **KIMI)
    chunked_out, chunked_state = chunked_gated_delta_rule(**w, attention_mask=mask, chunk=16, **KIMI)
    assert relative(chunked_out, out) < 1e-5 and relative(chunked_state, state) < 1e-5
    assert not out[1, :15].any()  # padded tokens output 0
    alone = {k: (v[1:, 15:] if v.ndim == 3 else v[1:]) if k != "A_log" and k != "dt_bias" else v for k, v in w.items()}
    alone_out, alone_state = gated_delta_rule(**alone, **{**KIMI})
    assert relative(out[1:, 15:], alone_out) < 1e-5 and relative(state[1:], alone_state) < 1e-5


def operand_values(decay="head", rule="gated_delta", a=True, dt_width=None):
    width = H * DK if decay == "channel" else H
    return [Value("q", F32, ("B", "T", H * DK)), Value("k", F32, ("B", "T", H * DK)),
            Value("v", F32, ("B", "T", H * DV)), Value("a", F32, ("B", "T", width)) if a else None,
            Value("b", F32, ("B", "T", H)) if rule == "gated_delta" else None, Value("A_log", F32, (H,)),
            Value("dt_bias", F32, (dt_width or width,)) if a else None]


def infer(vals, **attrs):
    base = {"key_heads": H, "value_heads": H, "key_dim": DK, "value_dim": DV}
    return ops.infer("gated_delta_rule", vals, ops.get_op("gated_delta_rule").normalize_attrs({**base, **attrs}))


def test_inference_and_refusals():
    out = [ops.registry.TensorType(F32, ("B", "T", H * DV))]
    assert infer(operand_values("channel"), decay="channel") == out
    assert infer(operand_values(rule="gated", a=False), update_rule="gated") == out
    with pytest.raises(ShapeError, match=r"a \[B,T,3\] should be \[B,T,24\]"):
        infer(operand_values("head"), decay="channel")
    with pytest.raises(ShapeError, match=r"dt_bias \[3\] should be \[24\]"):
        infer(operand_values("channel", dt_width=H), decay="channel")
    with pytest.raises(ShapeError, match="leave 'b' out"):
        infer(operand_values(), update_rule="gated")
    with pytest.raises(ShapeError, match="'b' is required"):
        infer(operand_values(rule="gated"))
    with pytest.raises(ShapeError, match="constant per head"):
        infer(operand_values(rule="gated", a=False), update_rule="gated", decay="channel")
    with pytest.raises(ShapeError, match="update_rule must be one of gated_delta, gated"):
        infer(operand_values(), update_rule="delta")
    with pytest.raises(ShapeError, match="decay must be one of head, channel"):
        infer(operand_values(), decay="token")


def test_cost_by_hand():
    opdef = ops.get_op("gated_delta_rule")
    types = [ops.registry.TensorType(F32, (1, 3, H * DK))]
    attrs = opdef.normalize_attrs({**LIGHTNING})
    cost = opdef.cost(types, [types[0]], attrs)
    assert cost.flops == 4 * 3 * H * DK * DV  # no read of Sᵀk in the gated rule
    assert cost.other_flops == 3 * (H * DK * DV + 8 * H + 6 * H * DK)
    attrs = opdef.normalize_attrs({**KIMI})
    cost = opdef.cost(types, [types[0]], attrs)
    assert cost.flops == 6 * 3 * H * DK * DV
    assert cost.other_flops == 3 * (H * DK * DV + 6 * H * DK + 2 * H + 6 * H * DK)


# ---- every form through both ONNX targets --------------------------------------------------------

FORMS = {"kimi": ("gated_delta", "channel", False), "lightning": ("gated", "head", True),
         "gated": ("gated", "head", False), "gated-channel": ("gated", "channel", False)}


def one_op_graph(rule: str, decay: str, constant: bool) -> Graph:
    g = Graph("linear-attention")
    width = H * DK if decay == "channel" else H
    q, k = (g.add_input(n, F32, ("B", "T", H * DK)) for n in "qk")
    v = g.add_input("v", F32, ("B", "T", H * DV))
    a = None if constant else g.add_input("a", F32, ("B", "T", width))
    b = g.add_input("b", F32, ("B", "T", H)) if rule == "gated_delta" else None
    rng = np.random.default_rng(1)
    A_log = g.add_param("A_log", F32, (H,), rng.uniform(-2, 0, H).astype(np.float32))
    dt_bias = None if constant else g.add_param("dt_bias", F32, (width,), rng.standard_normal(width).astype(np.float32))
    past = g.add_input("past", F32, ("B", H, DK, DV))
    mask = g.add_input("attention_mask", DType.i64, ("B", "P+T"))
    attrs = {"key_heads": H, "value_heads": H, "key_dim": DK, "value_dim": DV, "update_rule": rule, "decay": decay,
             "l2_norm": rule == "gated_delta"}
    g.outputs = list(build.emit(g, "gated_delta_rule", [q, k, v, a, b, A_log, dt_bias, past, mask], attrs,
                                ["y", "present"]))
    return g


@pytest.mark.parametrize("tokens", [1, 5, 70])  # the token Scan; the chunked form past one chunk
@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("form", list(FORMS))
def test_onnx_matches_the_interpreter(tmp_path, form, target, tokens):
    from backends.onnx.emit import emit_model
    from backends.onnx.runtime import interpreter_engine, ort_engine

    graph = one_op_graph(*FORMS[form])
    path = str(tmp_path / "model.onnx")
    emit_model(graph, path, target=target, genai=False)
    rng = np.random.default_rng(tokens)
    feeds = {v.name: (rng.standard_normal([2 if d == "B" else tokens if d == "T" else d for d in v.shape]) * 0.5
                      ).astype(np.float32) for v in graph.inputs if v.name != "attention_mask"}
    feeds["attention_mask"] = np.ones((2, 2 + tokens), np.int64)
    feeds["attention_mask"][1, :2 + tokens // 2] = 0
    want, got = interpreter_engine(graph)(feeds), ort_engine(path)(feeds)
    for name in want:
        assert relative(got[name], want[name]) <= 1e-5, name
