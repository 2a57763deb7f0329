"""State-space models through both ONNX targets in ONNX Runtime and through the NumPy emitter,
held against the reference interpreter: tiny Mamba-1, Mamba-2 (groups > 1, a Δ clamp, a
grouped gated norm) and a hybrid (Mamba-2 layers around an attention layer with RoPE and a
SwiGLU MLP). A left-padded prefill from zero states, then greedy decode steps fed with each
engine's own present states and caches; a prefill of several tokens over random (non-zero)
states with padded new tokens; checker, strict shape inference, determinism and the ops
each target uses."""
from collections import Counter

import numpy as np
import onnx
import pytest

import passes  # noqa: F401  (registers the passes)
from backends.onnx.emit import emit_model
from backends.onnx.runtime import greedy, interpreter_engine, ort_engine
from backends.onnx.targets import TARGETS
from frontends.dsl import Model, Rope
from irc.check import relative_error
from irc.interpreter import random_feeds
from irc.passmanager import PassManager, parse_pipeline
from tests.backends.test_numpy_emit import assert_matches_interpreter

PROMPTS = [[11, 5, 60, 7, 42], [3, 50, 17, 9, 33, 8, 31, 20, 57, 1]]  # rows of 5 and 10 tokens
NEW_TOKENS = 9  # the prefill's token, then 8 decode steps
RTOL = 1e-4
TARGET_NAMES = ["onnx", "onnx-ort"]


def mamba() -> Model:
    m = Model("tiny-mamba", vocab=64, d_model=32)
    x = m.embed(m.input_ids())
    for layer in m.layers(2):
        x = x + layer.mamba(layer.rms_norm(x, "norm"), state_size=8, conv_kernel=4)
    m.logits(m.rms_norm(x, "norm"), tied=True)
    return m


def mamba2(dt_max=0.08) -> Model:
    m = Model("tiny-mamba2", vocab=64, d_model=32)
    x = m.embed(m.input_ids())
    for layer in m.layers(2):
        x = x + layer.mamba2(layer.rms_norm(x, "norm"), heads=4, head_dim=16, state_size=8, groups=2,
                             dt_min=0.01, dt_max=dt_max, norm_group_size=32)
    m.logits(m.rms_norm(x, "norm"))
    return m


def hybrid() -> Model:
    """[mamba2, attention + SwiGLU, mamba2]."""
    m = Model("tiny-hybrid", vocab=64, d_model=32)
    x = m.embed(m.input_ids())
    for layer in m.layers(3):
        h = layer.rms_norm(x, "norm")
        if layer.index == 1:
            x = x + layer.attention(h, heads=4, kv_heads=2, head_dim=8, rope=Rope(base=10000))
            x = x + layer.swiglu(layer.rms_norm(x, "mlp_norm"), d_ff=64)
        else:
            x = x + layer.mamba2(h, heads=4, head_dim=16, state_size=8, conv_kernel=3)
    m.logits(m.rms_norm(x, "norm"))
    return m


MODELS = {"mamba": mamba, "mamba2": mamba2, "hybrid": hybrid}
_reference: dict = {}


def compiled(model: str, target: str, tmp_path, opset: int = 23, name: str = "model.onnx"):
    graph = MODELS[model]().graph
    PassManager(parse_pipeline(TARGETS[target].pipeline(opset))).run(graph)
    path = tmp_path / name
    emit_model(graph, str(path), target=target, opset=opset, context=64, genai=False)
    return graph, str(path)


def reference(model: str) -> dict:
    if model not in _reference:
        graph = MODELS[model]().graph
        _reference[model] = greedy(interpreter_engine(graph), graph, PROMPTS, NEW_TOKENS)
    return _reference[model]


def assert_close(got, want, what: str) -> None:
    error = relative_error(got, want)
    assert error <= RTOL, f"{what} off by {error:.3g}"


def assert_presents(ours: dict, ref: dict, mask) -> None:
    """States compared whole; KV caches [B, K, S, D] at real positions only."""
    for name, want in ref.items():
        if name.endswith((".key", ".value")):
            real = mask.astype(bool)
            assert_close(np.moveaxis(ours[name], 2, 1)[real], np.moveaxis(want, 2, 1)[real], name)
        elif name.startswith("present."):
            assert_close(ours[name], want, name)


@pytest.mark.parametrize("target", TARGET_NAMES)
@pytest.mark.parametrize("model", MODELS)
def test_prefill_and_decode_match_the_interpreter(model, target, tmp_path):
    graph, path = compiled(model, target, tmp_path)
    ours, ref = greedy(ort_engine(path), graph, PROMPTS, NEW_TOKENS), reference(model)
    real = ref["feeds"]["attention_mask"].astype(bool)
    assert_close(ours["prefill"]["logits"][real], ref["prefill"]["logits"][real], "prefill logits")
    assert_presents(ours["prefill"], ref["prefill"], ref["feeds"]["attention_mask"])
    np.testing.assert_array_equal(ours["tokens"], ref["tokens"])
    for step, (got, want) in enumerate(zip(ours["steps"], ref["steps"]), start=1):
        assert_close(got, want, f"decode step {step} logits")
    assert_presents(ours["final"], ref["final"], ref["mask"])


def padded_feeds(graph, seed=3):
    """T = 6 new tokens over random states (and P = 4 cached tokens), batch 2; row 0's
    first two new tokens are padding."""
    feeds = random_feeds(graph, batch=2, tokens=6, past=4, seed=seed)
    feeds["attention_mask"][0, 4:6] = 0
    return feeds


@pytest.mark.parametrize("target", TARGET_NAMES)
@pytest.mark.parametrize("model", MODELS)
def test_several_tokens_over_nonzero_states(model, target, tmp_path):
    graph, path = compiled(model, target, tmp_path)
    feeds = padded_feeds(graph)
    want, got = interpreter_engine(graph)(feeds), ort_engine(path)(feeds)
    assert list(got) == list(want)
    for name in want:
        assert_close(got[name], want[name], name)


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_opset_21(target, tmp_path):
    """lower-norms and gqa-broadcast first; the gated norm in primitives."""
    graph, path = compiled("hybrid", target, tmp_path, opset=21)
    assert "RMSNormalization" not in op_counts(path)
    feeds = padded_feeds(graph)
    want, got = interpreter_engine(graph)(feeds), ort_engine(path)(feeds)
    for name in want:
        assert_close(got[name], want[name], name)


def test_the_dt_clamp_bites():
    """Without dt_max the tiny Mamba-2 decodes other logits: the clamp is exercised."""
    graph, unclamped = mamba2().graph, mamba2(dt_max=None).graph
    feeds = padded_feeds(graph)
    assert relative_error(interpreter_engine(unclamped)(feeds)["logits"],
                          interpreter_engine(graph)(feeds)["logits"]) > 1e-2


def op_counts(path) -> Counter:
    model = onnx.load(path)
    return Counter((f"{n.domain}:" if n.domain else "") + n.op_type for n in model.graph.node)


@pytest.mark.parametrize("opset", [23, 21])
@pytest.mark.parametrize("target", TARGET_NAMES)
@pytest.mark.parametrize("model", MODELS)
def test_checker_strict_shape_inference_and_same_bytes(model, target, opset, tmp_path):
    _, first = compiled(model, target, tmp_path, opset, "a.onnx")
    onnx.checker.check_model(first, full_check=True)
    onnx.shape_inference.infer_shapes(onnx.load(first), strict_mode=True)
    _, second = compiled(model, target, tmp_path, opset, "a2.onnx")
    assert open(first, "rb").read() == open(second, "rb").read()


def test_ops_each_target_uses(tmp_path):
    portable = op_counts(compiled("hybrid", "onnx", tmp_path, name="p.onnx")[1])
    assert portable["Scan"] == 2 and portable["Conv"] == 2 and not any(":" in op for op in portable)
    ort = op_counts(compiled("hybrid", "onnx-ort", tmp_path, name="o.onnx")[1])
    assert ort["com.microsoft:LinearAttention"] == 2 and ort["com.microsoft:CausalConvWithState"] == 2
    assert "Scan" not in ort and "Conv" not in ort
    mamba1 = op_counts(compiled("mamba", "onnx-ort", tmp_path, name="m.onnx")[1])
    assert mamba1["Scan"] == 2 and mamba1["com.microsoft:CausalConvWithState"] == 2  # see backends.onnx.ssm


@pytest.mark.parametrize("model", ["mamba", "hybrid"])
def test_numpy_emitter(model, tmp_path):
    graph = MODELS[model]().graph
    assert_matches_interpreter(graph, padded_feeds(graph), tmp_path)
