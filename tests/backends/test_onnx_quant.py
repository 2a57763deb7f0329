"""Quantized models (``quantize``) through both ONNX targets in ONNX Runtime, held against
the reference interpreter's quantized outputs: a left-padded prefill and a few greedy
decode steps, within 1e-4 relative; MatMulNBits where ORT takes it, blocked
DequantizeLinear elsewhere, and the checker's full check."""
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

import passes  # noqa: F401  (registers the passes)
from backends.onnx.emit import emit_model
from backends.onnx.runtime import greedy, interpreter_engine, ort_engine
from backends.onnx.targets import TARGETS
from frontends import load_spec
from irc.passmanager import PassManager, parse_pipeline
from irc.check import relative_error
from irc.weights import seed_absent
from test_onnx_models import PROMPTS, real_rows

NEW_TOKENS = 4
RTOL = 1e-4
LLAMA = "examples/tiny-llama3.yaml"
MIXTRAL = "examples/tiny-mixtral-8x7b.yaml"
CASES = {
    "llama-int4-g32-sym": (LLAMA, "quantize{bits=4,group=32}"),
    "llama-int4-g32-asym-kv8": (LLAMA, "quantize{bits=4,group=32,symmetric=false,kv_cache=true}"),
    "llama-int8-channel": (LLAMA, "quantize{bits=8,group=channel,symmetric=false}"),
    "llama-int4-embeddings": (LLAMA, "lower-mlp,quantize{bits=4,group=32,embeddings=true}"),
    "llama-int4-lm-head": (LLAMA, "lower-mlp,quantize{bits=4,group=32,lm_head=true}"),
    "gemma2-tied-int4-embeddings": ("examples/tiny-gemma2-9b.yaml", "quantize{bits=4,group=32,embeddings=true}"),
    "mixtral-dense-int4": (MIXTRAL, "quantize{bits=4,group=16}"),
    "mixtral-sorted-int8": (MIXTRAL, "moe-sort,quantize{bits=8,group=32,kv_cache=true}"),
    "deepseek-v3-absorbed-int4": ("examples/tiny-deepseek-v3.yaml", "mla-absorb,moe-sort,quantize{bits=4,group=16}"),
}


def compile_quantized(spec, pipeline, target, directory: Path):
    graph = load_spec(spec)
    seed_absent(graph, 0)  # before the passes: quantize derives its codes from the float weights
    PassManager(parse_pipeline(f"{pipeline},{TARGETS[target].pipeline(23)}")).run(graph)
    path = directory / f"model.{target}.onnx"
    emit_model(graph, str(path), target=target, opset=23, context=64)
    return graph, str(path)


def op_types(path) -> Counter:
    return Counter(n.op_type for n in onnx.load(path).graph.node)


def assert_close(ours: dict, ref: dict, rtol: float) -> None:
    """Prefill outputs on real tokens, greedy tokens, decode-step logits and final caches."""
    mask = ref["feeds"]["attention_mask"]
    for name, expected in ref["prefill"].items():
        got = ours["prefill"][name]
        if name.startswith("present."):  # [B, K, S, ...]: real positions only
            got, expected = np.moveaxis(got, 2, 1), np.moveaxis(expected, 2, 1)
        error = relative_error(real_rows(got, mask).astype(np.float32),
                               real_rows(expected, mask).astype(np.float32))
        assert error <= rtol, f"prefill {name} off by {error:.3g}"
    np.testing.assert_array_equal(ours["tokens"], ref["tokens"])
    for step, (got, expected) in enumerate(zip(ours["steps"], ref["steps"]), start=1):
        assert relative_error(got, expected) <= rtol, f"decode step {step}"
    final_mask = ref["mask"]
    for name, expected in ref["final"].items():
        if name.startswith("present."):
            got, expected = np.moveaxis(ours["final"][name], 2, 1), np.moveaxis(expected, 2, 1)
            error = relative_error(real_rows(got, final_mask).astype(np.float32),
                                   real_rows(expected, final_mask).astype(np.float32))
            assert error <= rtol, f"after decoding, {name} off by {error:.3g}"


@pytest.mark.parametrize("case", CASES)
def test_quantized_models_match_the_interpreter(case, tmp_path):
    spec, pipeline = CASES[case]
    results = {}
    for target in ("onnx", "onnx-ort"):
        graph, path = compile_quantized(spec, pipeline, target, tmp_path)
        onnx.checker.check_model(path, full_check=True)
        counts = op_types(path)
        assert counts["DequantizeLinear"] + counts["MatMulNBits"] > 0
        if target == "onnx":
            assert counts["MatMulNBits"] == 0
        else:
            assert counts["MatMulNBits"] > 0
        results[target] = (graph, counts, greedy(ort_engine(path), graph, PROMPTS, NEW_TOKENS))
    graph = results["onnx"][0]
    ref = greedy(interpreter_engine(graph), graph, PROMPTS, NEW_TOKENS)
    for target, (_, _, ours) in results.items():
        assert_close(ours, ref, RTOL)


def test_int8_kv_cache_is_int8_with_scales(tmp_path):
    graph, path = compile_quantized(LLAMA, "quantize{kv_cache=true}", "onnx", tmp_path)
    model = onnx.load(path)
    inputs = {v.name: v.type.tensor_type.elem_type for v in model.graph.input}
    assert inputs["past_key_values.0.key"] == onnx.TensorProto.INT8
    assert inputs["past_key_values.0.key_scale"] == onnx.TensorProto.FLOAT
    assert not (tmp_path / "genai_config.json").exists()  # genai allocates no scale caches
