"""Every tiny example through both ONNX targets in ONNX Runtime, held against the reference
interpreter: a left-padded prefill of two uneven prompts (only real token rows and cache
positions compared), then 16 greedy decode steps fed with each engine's own present
caches, token for token and within 1e-5 relative (fp32); models with recurrent layers within
1e-4 (``RECURRENT_RTOL``)."""
from pathlib import Path

import numpy as np
import pytest

import passes  # noqa: F401  (registers the passes)
from irc.interpreter import random_feeds
from backends.onnx.emit import emit_model
from backends.onnx.runtime import greedy, interpreter_engine, ort_engine
from backends.onnx.targets import TARGETS
from frontends import load_spec
from irc.passmanager import PassManager, parse_pipeline
from irc.check import relative_error

# the decoders (the image encoders: tests/backends/test_vision_targets.py)
EXAMPLES = sorted(str(p) for p in Path("examples").glob("tiny-*.yaml") if "vision" not in load_spec(p).meta)
PROMPTS = [[11, 5, 200, 7, 42], [3, 250, 17, 99, 64, 8, 31, 120, 77]]  # rows of 5 and 9 tokens
NEW_TOKENS = 17  # the prefill's token, then 16 decode steps
RTOL = 1e-5
# a recurrence compounds float32 rounding token by token (ORT's Scan and LinearAttention sum in
# another order than NumPy): measured on seeded examples, the error grows with depth (4 layers
# 7e-6, 8 layers 1.8e-5, 16 layers 3.8e-5) while every token agrees; 1e-4 is the bound
RECURRENT_RTOL = 1e-4
_reference: dict = {}


def compile_example(spec: str, target: str, opset: int, directory: Path):
    graph = load_spec(spec)
    PassManager(parse_pipeline(TARGETS[target].pipeline(opset))).run(graph)
    path = directory / f"{Path(spec).stem}.{target}.{opset}.onnx"
    emit_model(graph, str(path), target=target, opset=opset, context=64)
    return graph, str(path)


def reference(spec: str) -> dict:
    """The interpreter's greedy run of the spec (shared by every target and opset)."""
    if spec not in _reference:
        graph = load_spec(spec)
        _reference[spec] = greedy(interpreter_engine(graph), graph, PROMPTS, NEW_TOKENS)
    return _reference[spec]


def real_rows(array, mask):
    """Rows [B, T, ...] of real tokens, where ``mask`` [B, T] (the prefill's) is 1."""
    return array[mask.astype(bool)]


def assert_presents(ours: dict, ref: dict, mask, when: str, rtol: float = RTOL) -> None:
    """KV caches [B, K, S, D] at real positions only; recurrent states (no S axis) whole."""
    for name, expected in ref.items():
        if not name.startswith("present."):
            continue
        if name.endswith((".conv_state", ".recurrent_state")):
            got, expected = ours[name], expected
        else:
            got = real_rows(np.moveaxis(ours[name], 2, 1), mask)
            expected = real_rows(np.moveaxis(expected, 2, 1), mask)
        error = relative_error(got, expected)
        assert error <= rtol, f"{when}, {name} off by {error:.3g}"


def assert_matches(ours: dict, ref: dict) -> None:
    mask = ref["feeds"]["attention_mask"]
    recurrent = any(name.endswith((".conv_state", ".recurrent_state")) for name in ref["prefill"])
    rtol = RECURRENT_RTOL if recurrent else RTOL
    error = relative_error(real_rows(ours["prefill"]["logits"], mask), real_rows(ref["prefill"]["logits"], mask))
    assert error <= rtol, f"prefill logits off by {error:.3g}"
    assert_presents(ours["prefill"], ref["prefill"], mask, "after the prefill", rtol)
    np.testing.assert_array_equal(ours["tokens"], ref["tokens"])
    for step, (got, expected) in enumerate(zip(ours["steps"], ref["steps"]), start=1):
        error = relative_error(got, expected)
        assert error <= rtol, f"decode step {step}: logits off by {error:.3g}"
    assert_presents(ours["final"], ref["final"], ref["mask"], "after decoding", rtol)


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("spec", EXAMPLES, ids=[Path(e).stem for e in EXAMPLES])
def test_prefill_and_decode_match_the_interpreter(spec, target, tmp_path):
    graph, path = compile_example(spec, target, 23, tmp_path)
    assert_matches(greedy(ort_engine(path, threads=2), graph, PROMPTS, NEW_TOKENS), reference(spec))


OTHER_OPSETS = [(21, "examples/tiny-llama3.yaml"), (21, "examples/tiny-gemma2-9b.yaml"),
                (21, "examples/tiny-mixtral-8x7b.yaml"), (21, "examples/tiny-deepseek-v2.yaml"),
                (21, "examples/tiny-mistral-7b.yaml"), (22, "examples/tiny-qwen2-7b.yaml"),
                (22, "examples/tiny-deepseek-v3.yaml"), (24, "examples/tiny-gemma2-9b.yaml")]


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("opset, spec", OTHER_OPSETS, ids=[f"{Path(e).stem}-{o}" for o, e in OTHER_OPSETS])
def test_other_opsets_match_the_interpreter(opset, spec, target, tmp_path):
    graph, path = compile_example(spec, target, opset, tmp_path)
    assert_matches(greedy(ort_engine(path, threads=2), graph, PROMPTS, NEW_TOKENS), reference(spec))


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_bf16_weights_with_f32_activations(target, tmp_path):
    """Full-size specs keep bf16 weights: the graph casts them (ORT folds the casts)."""
    spec = tmp_path / "tiny-bf16.yaml"
    text = Path("examples/tiny-llama3.yaml").read_text()
    spec.write_text(text.replace("name: tiny-llama3", "name: tiny-bf16\n  dtype: bf16"))
    graph, path = compile_example(str(spec), target, 23, tmp_path)
    assert any(p.dtype.text == "bf16" for p in graph.params.values())
    assert_matches(greedy(ort_engine(path, threads=2), graph, PROMPTS, NEW_TOKENS), reference(str(spec)))


CHUNKED = ["examples/tiny-llama3.yaml", "examples/tiny-gemma2-9b.yaml", "examples/tiny-deepseek-v3.yaml"]


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("spec", CHUNKED, ids=[Path(e).stem for e in CHUNKED])
def test_several_new_tokens_after_a_past(spec, target, tmp_path):
    """A second chunk of a prompt: T = 5 new tokens over P = 7 cached ones, batch 2."""
    graph, path = compile_example(spec, target, 23, tmp_path)
    feeds = random_feeds(graph, batch=2, tokens=5, past=7, seed=3)
    expected = interpreter_engine(graph)(feeds)
    got = ort_engine(path)(feeds)
    for name, value in expected.items():
        assert relative_error(got[name], value) <= RTOL, name


def test_sliding_window_bites():
    """The tiny Mistral's window (8) is shorter than the sequences above, so the decode
    steps exercise it: without the window the reference picks other tokens."""
    ref = reference("examples/tiny-mistral-7b.yaml")
    graph = load_spec("examples/tiny-mistral-7b.yaml")
    for node in graph.nodes:
        if node.op == "attention":
            node.attrs["window"] = None
    unwindowed = greedy(interpreter_engine(graph), graph, PROMPTS, NEW_TOKENS)
    assert not np.array_equal(unwindowed["tokens"], ref["tokens"])
