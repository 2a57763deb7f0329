"""gated_delta_rule: the reference (and its chunked form) against transformers' Qwen3-Next
``torch_recurrent_gated_delta_rule`` and ``torch_chunk_gated_delta_rule``, in one prefill and
token by token, from a zero and a non-zero state, key heads shared GQA-style; the padding
rule; the ``chunk`` attribute (the form the reference computes a prefill in); inference
refusals; cost; both ONNX targets with and without ``chunk``."""
import numpy as np
import pytest

from irc import ops
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Value
from irc.ops.delta import chunked_gated_delta_rule, gated_delta_rule
from irc.ops.registry import TensorType
from irc.testing import run_op

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from transformers.models.qwen3_next.modeling_qwen3_next import (  # noqa: E402
    torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule)

B, HK, HV, DK, DV = 2, 2, 4, 8, 6
ATTRS = {"key_heads": HK, "value_heads": HV, "key_dim": DK, "value_dim": DV}
TOLERANCE = 1e-5  # relative to the largest value


def inputs(seq, seed=0, state=True, key_heads=HK, value_heads=HV):
    rng = np.random.default_rng(seed)

    def randn(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return {"q": randn(B, seq, key_heads * DK), "k": randn(B, seq, key_heads * DK), "v": randn(B, seq, value_heads * DV),
            "a": randn(B, seq, value_heads), "b": randn(B, seq, value_heads),
            "A_log": rng.uniform(-1, 1, value_heads).astype(np.float32), "dt_bias": randn(value_heads, scale=0.5),
            "past_state": randn(B, value_heads, DK, DV) if state else None}


def transformers_rule(fn, w, key_heads=HK, value_heads=HV):
    """(o [B, T, H_v·d_v], state) of one of transformers' functions, g and β as Qwen3-Next
    computes them."""
    t = {k: None if v is None else torch.from_numpy(v) for k, v in w.items()}
    seq = w["q"].shape[1]
    g = -t["A_log"].exp() * torch.nn.functional.softplus(t["a"] + t["dt_bias"])
    out, state = fn(t["q"].view(B, seq, key_heads, DK), t["k"].view(B, seq, key_heads, DK),
                    t["v"].view(B, seq, value_heads, DV), g=g, beta=t["b"].sigmoid(),
                    initial_state=None if t["past_state"] is None else t["past_state"].clone(),
                    output_final_state=True, use_qk_l2norm_in_kernel=True)
    return out.reshape(B, seq, -1).numpy(), state.numpy()


def relative(got, want) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("seq", [1, 7, 70])  # one token, within a chunk, past the 64-token chunk
@pytest.mark.parametrize("state", [False, True])
@pytest.mark.parametrize("fn", [torch_recurrent_gated_delta_rule, torch_chunk_gated_delta_rule])
def test_reference_matches_transformers(seq, state, fn):
    w = inputs(seq, seed=seq, state=state)
    want_out, want_state = transformers_rule(fn, w)
    order = ("q", "k", "v", "a", "b", "A_log", "dt_bias", "past_state")
    outs = run_op("gated_delta_rule", [w[name] for name in order], ATTRS)
    assert relative(outs[0], want_out) <= TOLERANCE
    if state:
        assert relative(outs[1], want_state) <= TOLERANCE
    else:  # without a past state the op returns none; the function gives the final one
        assert len(outs) == 1
        assert relative(gated_delta_rule(**w, **ATTRS)[1], want_state) <= TOLERANCE
    chunked_out, chunked_state = chunked_gated_delta_rule(**w, **ATTRS, chunk=16)
    assert relative(chunked_out, want_out) <= TOLERANCE and relative(chunked_state, want_state) <= TOLERANCE


def test_token_by_token_equals_one_prefill():
    w = inputs(12, seed=3)
    whole, final = gated_delta_rule(**w, **ATTRS)
    state, outs = w["past_state"], []
    for t in range(12):
        step = {k: v[:, t:t + 1] if k in ("q", "k", "v", "a", "b") else v for k, v in w.items()}
        out, state = gated_delta_rule(**{**step, "past_state": state}, **ATTRS)
        outs.append(out)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), whole, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state, final, rtol=1e-5, atol=1e-6)


def test_one_key_head_per_value_head_and_an_explicit_scale():
    w = inputs(5, seed=4, key_heads=HV, value_heads=HV)
    attrs = {**ATTRS, "key_heads": HV}
    want_out, want_state = transformers_rule(torch_recurrent_gated_delta_rule, w, HV, HV)
    out, state = gated_delta_rule(**w, **attrs)
    assert relative(out, want_out) <= TOLERANCE and relative(state, want_state) <= TOLERANCE
    halved, _ = gated_delta_rule(**w, **attrs, scale=0.5 * DK ** -0.5)  # the output is linear in q
    np.testing.assert_allclose(halved, 0.5 * out, rtol=1e-5, atol=1e-6)


def test_a_padded_token_is_frozen_and_outputs_zero():
    """Left padding: the padded steps change no state and give 0; the real tokens give what
    the unpadded prompt gives, from the same state."""
    w = inputs(6, seed=5)
    mask = np.array([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], np.int64)
    out, state = gated_delta_rule(**w, attention_mask=mask, **ATTRS)
    assert np.all(out[1, :2] == 0)
    short = {k: v[1:, 2:] if k in ("q", "k", "v", "a", "b") else (v[1:] if k == "past_state" else v)
             for k, v in w.items()}
    alone, alone_state = gated_delta_rule(**short, **ATTRS)
    np.testing.assert_allclose(out[1:, 2:], alone, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state[1:], alone_state, rtol=1e-5, atol=1e-6)
    chunked, chunked_state = chunked_gated_delta_rule(**w, attention_mask=mask, **ATTRS, chunk=4)
    np.testing.assert_allclose(chunked, out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(chunked_state, state, rtol=1e-5, atol=1e-5)


ORDER = ("q", "k", "v", "a", "b", "A_log", "dt_bias", "past_state", "attention_mask")


@pytest.mark.parametrize("seq", [40, 70])  # a multiple of the chunk, and not
def test_the_chunk_attribute_computes_the_prefill_in_chunks(seq):
    """With ``chunk`` the op's reference is the chunked form (float64 inside: the last bits
    differ from the recurrence), the same numbers; one token is the step to the bit."""
    w = inputs(seq, seed=6)
    mask = np.ones((B, 2 + seq), np.int64)
    mask[1, :9] = 0  # row 1: its 2 past columns and 7 new tokens padded
    w["attention_mask"] = mask
    sequential = run_op("gated_delta_rule", [w[n] for n in ORDER], ATTRS)
    chunked = run_op("gated_delta_rule", [w[n] for n in ORDER], {**ATTRS, "chunk": 8})
    assert any(not np.array_equal(a, b) for a, b in zip(sequential, chunked))
    for got, want in zip(chunked, sequential):
        assert relative(got, want) <= TOLERANCE
    step = {**inputs(1, seed=7), "attention_mask": np.ones((B, 3), np.int64)}
    for got, want in zip(run_op("gated_delta_rule", [step[n] for n in ORDER], {**ATTRS, "chunk": 8}),
                         run_op("gated_delta_rule", [step[n] for n in ORDER], ATTRS)):
        np.testing.assert_array_equal(got, want)


def values(key_heads=HK, value_heads=HV, state=True):
    f32 = DType.f32
    v = [Value("q", f32, ("B", "T", key_heads * DK)), Value("k", f32, ("B", "T", key_heads * DK)),
         Value("v", f32, ("B", "T", value_heads * DV)), Value("a", f32, ("B", "T", value_heads)),
         Value("b", f32, ("B", "T", value_heads)), Value("A_log", f32, (value_heads,)),
         Value("dt_bias", f32, (value_heads,))]
    return v + ([Value("past", f32, ("B", value_heads, DK, DV))] if state else [])


def infer(vals, **attrs):
    return ops.infer("gated_delta_rule", vals, ops.get_op("gated_delta_rule").normalize_attrs({**ATTRS, **attrs}))


def test_inference_and_refusals():
    assert infer(values()) == [TensorType(DType.f32, ("B", "T", HV * DV)), TensorType(DType.f32, ("B", HV, DK, DV))]
    assert infer(values(state=False)) == [TensorType(DType.f32, ("B", "T", HV * DV))]
    with pytest.raises(ShapeError, match=r"value_heads \(3\) must be a multiple of key_heads \(2\)"):
        infer(values(value_heads=3), value_heads=3)
    with pytest.raises(ShapeError, match=r"q \[B,T,8\] should be \[B,T,16\]"):
        infer(values(key_heads=1))
    with pytest.raises(ShapeError, match="past_state"):
        bad = values()
        bad[-1] = Value("past", DType.f32, ("B", HV, DV, DK))  # transformers' transposed layout
        infer(bad)
    with pytest.raises(ShapeError, match="scale"):
        infer(values(), scale=-1.0)
    assert infer(values(), chunk=64) == infer(values())
    for chunk in (0, -64, True, 2.5, "64"):
        with pytest.raises(ShapeError, match="chunk must be None or a positive int"):
            infer(values(), chunk=chunk)


def test_cost_by_hand():
    opdef = ops.get_op("gated_delta_rule")
    shapes = [(1, 3, HK * DK), (1, 3, HK * DK), (1, 3, HV * DV), (1, 3, HV), (1, 3, HV), (HV,), (HV,)]
    types = [TensorType(DType.f32, s) for s in shapes]
    cost = opdef.cost(types, [types[2]], opdef.normalize_attrs(ATTRS))
    assert cost.flops == 6 * 3 * HV * DK * DV == 3456
    assert cost.other_flops == 3 * (HV * DK * DV + 8 * HV + 6 * HK * DK)


# ---- the ONNX lowerings of the op, against the reference interpreter ----------------------------

def delta_model(projections="split"):
    """One gated-DeltaNet layer (H_k 2, H_v 4) and a head, state in and out."""
    from frontends.dsl import Model

    m = Model("one-delta-layer", vocab=32, d_model=16)
    x = m.embed(m.input_ids())
    for layer in m.layers(1):
        x = x + layer.gated_delta(layer.rms_norm(x, "ssm_norm"), key_heads=HK, value_heads=HV, key_dim=DK,
                                  value_dim=DV, conv_kernel=3, projections=projections)
    m.logits(m.rms_norm(x, "norm"))
    return m.graph


@pytest.mark.parametrize("chunk", [None, 64, 16])  # the token Scan alone; an If between the two forms
@pytest.mark.parametrize("tokens", [1, 5, 20, 64, 130])  # the token Scan twice; chunks: padded, one, three
@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_onnx_matches_the_interpreter_over_nonzero_states(tmp_path, target, tokens, chunk):
    import onnx

    from backends.onnx.emit import emit_model
    from backends.onnx.runtime import interpreter_engine, ort_engine
    from irc.interpreter import random_feeds
    from irc.passmanager import PassManager, parse_pipeline

    import passes  # noqa: F401  (registers the passes)

    graph = delta_model("fused" if tokens % 2 else "split")
    if chunk:
        PassManager(parse_pipeline(f"scan-chunk{{size={chunk}}}")).run(graph)
    path = str(tmp_path / "model.onnx")
    emit_model(graph, path, target=target, genai=False)
    feeds = random_feeds(graph, batch=2, tokens=tokens, past=3, seed=tokens)
    feeds["attention_mask"][1, :3 + tokens // 2] = 0  # row 1: its past and the first half of the new tokens padded
    want, got = interpreter_engine(graph)(feeds), ort_engine(path)(feeds)
    assert list(got) == list(want)
    for name in want:
        assert relative(got[name], want[name]) <= 1e-4, name
    nodes = onnx.load(path).graph.node
    assert sum(n.op_type == "If" for n in nodes) == (1 if chunk and target == "onnx" else 0)
    chunk_sizes = [a.i for n in nodes if n.op_type == "LinearAttention" for a in n.attribute if a.name == "chunk_size"]
    assert chunk_sizes == ([chunk] if chunk and target == "onnx-ort" else [])
    if target == "onnx" and tokens == 130:
        onnx.checker.check_model(path, full_check=True)
        onnx.shape_inference.infer_shapes(onnx.load(path), strict_mode=True)


def test_the_portable_chunked_form_needs_a_power_of_two(tmp_path):
    from backends.onnx.emit import emit_model
    from irc.errors import BackendError

    graph = delta_model()
    for node in graph.nodes:
        if node.op == "gated_delta_rule":
            node.attrs["chunk"] = 48
    with pytest.raises(BackendError, match="chunk must be a power of two"):
        emit_model(graph, str(tmp_path / "model.onnx"), target="onnx", genai=False)
    emit_model(graph, str(tmp_path / "model.onnx"), target="onnx-ort", genai=False)  # LinearAttention takes any


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_a_per_channel_decay_with_chunk_runs_the_token_scan(tmp_path, target):
    """Kimi's decay per key channel: the interpreter's chunked form, the portable token Scan
    (no If), onnx-ort's LinearAttention with chunk_size; the same numbers on 40 tokens."""
    import onnx

    from backends.onnx.emit import emit_model
    from backends.onnx.runtime import interpreter_engine, ort_engine
    from tests.ops.test_linear_attention import FORMS, one_op_graph

    graph = one_op_graph(*FORMS["kimi"])
    for node in graph.nodes:
        node.attrs["chunk"] = 16
    path = str(tmp_path / "model.onnx")
    emit_model(graph, path, target=target, genai=False)
    assert not any(n.op_type == "If" for n in onnx.load(path).graph.node)
    rng = np.random.default_rng(8)
    feeds = {v.name: (rng.standard_normal([2 if d == "B" else 40 if d == "T" else d for d in v.shape]) * 0.5
                      ).astype(np.float32) for v in graph.inputs if v.name != "attention_mask"}
    feeds["attention_mask"] = np.ones((2, 42), np.int64)
    feeds["attention_mask"][1, :9] = 0
    want, got = interpreter_engine(graph)(feeds), ort_engine(path)(feeds)
    for name in want:
        assert relative(got[name], want[name]) <= 1e-5, name
