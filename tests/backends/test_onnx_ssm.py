"""State-space models through both ONNX targets in ONNX Runtime and through the NumPy emitter,
held against the reference interpreter: tiny Mamba-1, Mamba-2 (groups > 1, a Δ clamp, a
grouped gated norm) and a hybrid (Mamba-2 layers around an attention layer with RoPE and a
SwiGLU MLP). A left-padded prefill from zero states, then greedy decode steps fed with each
engine's own present states and caches; a prefill of several tokens over random (non-zero)
states with padded new tokens; the chunked ssd (``scan-chunk``, in the default pipelines) on
prefills that are and are not a multiple of the chunk, and either form of the portable
``If`` forced at every length; checker, strict shape inference, determinism and the ops
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


def compiled(model: str, target: str, tmp_path, opset: int = 23, name: str = "model.onnx", pipeline=None,
             context: int = 64):
    graph = MODELS[model]().graph
    PassManager(parse_pipeline(pipeline or TARGETS[target].pipeline(opset))).run(graph)
    path = tmp_path / name
    emit_model(graph, str(path), target=target, opset=opset, context=context, genai=False)
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
    """Default pipelines (scan-chunk{size=64}): the portable ssd is an If between the chunked
    form (a Scan over chunks among matmuls) and the token Scan; onnx-ort's LinearAttention
    gets chunk_size. Without the pass the portable ssd is the token Scan alone."""
    portable = op_counts(compiled("hybrid", "onnx", tmp_path, name="p.onnx")[1])
    assert portable["If"] == 2 and portable["Scan"] == 0 and portable["Conv"] == 2
    assert not any(":" in op for op in portable)
    (chunked, tokens) = branch_ops(tmp_path / "p.onnx")
    assert chunked["Scan"] == 1 and chunked["MatMul"] == 4 and chunked["CumSum"] == 1 and tokens["Scan"] == 1
    ort_path = compiled("hybrid", "onnx-ort", tmp_path, name="o.onnx")[1]
    ort = op_counts(ort_path)
    assert ort["com.microsoft:LinearAttention"] == 2 and ort["com.microsoft:CausalConvWithState"] == 2
    assert "Scan" not in ort and "Conv" not in ort
    assert chunk_sizes(ort_path) == [64, 64]
    mamba1 = op_counts(compiled("mamba", "onnx-ort", tmp_path, name="m.onnx")[1])
    assert mamba1["Scan"] == 2 and mamba1["com.microsoft:CausalConvWithState"] == 2  # see backends.onnx.ssm
    for target in TARGET_NAMES:
        path = compiled("hybrid", target, tmp_path, name=f"{target}-plain.onnx", pipeline="dce,cse")[1]
        plain = op_counts(path)
        assert plain["If"] == 0 and plain["Scan"] == (2 if target == "onnx" else 0) and chunk_sizes(path) == []


def branch_ops(path) -> tuple[Counter, Counter]:
    """Op counts of the first If's then (chunked) and else (token Scan) branches."""
    node = next(n for n in onnx.load(str(path)).graph.node if n.op_type == "If")
    graphs = {a.name: a.g for a in node.attribute}
    return tuple(Counter(n.op_type for n in graphs[key].node) for key in ("then_branch", "else_branch"))


def chunk_sizes(path) -> list:
    return [a.i for n in onnx.load(str(path)).graph.node if n.op_type == "LinearAttention"
            for a in n.attribute if a.name == "chunk_size"]


@pytest.mark.parametrize("tokens, chunk", [(16, 16), (37, 16), (64, 64), (70, 64), (130, 64)])
@pytest.mark.parametrize("target", TARGET_NAMES)
@pytest.mark.parametrize("model", ["mamba2", "hybrid"])
def test_chunked_prefill_over_nonzero_states(model, target, tokens, chunk, tmp_path):
    """Whole chunks and a rest, over random states (P = 4), row 0 left-padded past its
    cache; against the interpreter on the graph without the pass (the recurrence)."""
    graph, path = compiled(model, target, tmp_path, pipeline=f"dce,cse,scan-chunk{{size={chunk}}}", context=256)
    feeds = random_feeds(graph, batch=2, tokens=tokens, past=4, seed=tokens)
    feeds["attention_mask"][0, :4 + tokens // 3] = 0
    want, got = interpreter_engine(MODELS[model]().graph)(feeds), ort_engine(path)(feeds)
    for name in want:
        assert_close(got[name], want[name], name)


@pytest.mark.parametrize("form, threshold", [("chunked", 1), ("token Scan", 10 ** 6)])
@pytest.mark.parametrize("tokens", [1, 5, 21])
def test_either_portable_form_at_every_length(monkeypatch, form, threshold, tokens, tmp_path):
    """The If's threshold moved so that one form runs every length: the chunked form on one
    token (a chunk of 63 frozen steps) and on 5, the token Scan on 21 (chunks of 8)."""
    from backends.onnx import delta

    monkeypatch.setattr(delta, "SSD_CHUNKED_FROM", threshold)
    graph, path = compiled("mamba2", "onnx", tmp_path, pipeline="dce,cse,scan-chunk{size=8}")
    feeds = random_feeds(graph, batch=2, tokens=tokens, past=4, seed=tokens)
    feeds["attention_mask"][1, :5] = 0
    want, got = interpreter_engine(MODELS["mamba2"]().graph)(feeds), ort_engine(path)(feeds)
    for name in want:
        assert_close(got[name], want[name], f"{form}: {name}")


@pytest.mark.parametrize("pipeline", ["", "scan-chunk{size=4}"])  # the chunked references copied in too
@pytest.mark.parametrize("model", ["mamba", "hybrid"])
def test_numpy_emitter(model, pipeline, tmp_path):
    graph = MODELS[model]().graph
    if pipeline:
        PassManager(parse_pipeline(pipeline)).run(graph)
    assert_matches_interpreter(graph, padded_feeds(graph), tmp_path)
