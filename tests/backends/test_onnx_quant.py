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
    "llama-int4-g32-sym": (LLAMA, "quantize{bits=4,group=32,accuracy_level=0}"),
    # d_ff 160 in blocks of 64: the down projection's last block is half padding (ort and rtn pad it)
    "llama-int4-g64-padded-last-block": (LLAMA, "quantize{bits=4,group=64,accuracy_level=0}"),
    "llama-int4-g64-padded-asym-rtn": (LLAMA, "quantize{bits=4,group=64,symmetric=false,method=rtn,"
                                              "accuracy_level=0}"),
    "llama-int4-g32-asym-kv8": (LLAMA, "quantize{bits=4,group=32,symmetric=false,kv_cache=true,accuracy_level=0}"),
    "llama-int8-channel": (LLAMA, "quantize{bits=8,group=channel,symmetric=false,accuracy_level=0}"),
    "llama-int4-embeddings": (LLAMA, "lower-mlp,quantize{bits=4,group=32,embeddings=true,accuracy_level=0}"),
    "llama-int4-lm-head": (LLAMA, "lower-mlp,quantize{bits=4,group=32,lm_head=true,accuracy_level=0}"),
    "gemma2-tied-int4-embeddings": ("examples/tiny-gemma2-9b.yaml",
                                    "quantize{bits=4,group=32,embeddings=true,accuracy_level=0}"),
    "llama-int4-embeddings-asym-rtn": (LLAMA, "lower-mlp,quantize{bits=4,group=16,embeddings=true,symmetric=false,"
                                              "method=rtn,accuracy_level=0}"),
    "gemma2-tied-int8-embeddings": ("examples/tiny-gemma2-9b.yaml",
                                    "quantize{bits=8,group=32,embeddings=true,symmetric=false,accuracy_level=0}"),
    "mixtral-dense-int4": (MIXTRAL, "quantize{bits=4,group=16,accuracy_level=0}"),
    "mixtral-sorted-int8": (MIXTRAL, "moe-sort,quantize{bits=8,group=32,kv_cache=true,accuracy_level=0}"),
    "deepseek-v3-absorbed-int4": ("examples/tiny-deepseek-v3.yaml",
                                  "mla-absorb,moe-sort,quantize{bits=4,group=16,accuracy_level=0}"),
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


def initializer_readers(path) -> dict:
    """initializer name -> op types of the nodes reading it (through one Reshape)."""
    graph = onnx.load(path).graph
    names = {i.name for i in graph.initializer}
    reshaped = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Reshape" and n.input[0] in names}
    readers: dict = {}
    for node in graph.node:
        for name in node.input:
            source = reshaped.get(name, name)
            if source in names and node.op_type != "Reshape":
                readers.setdefault(source, set()).add(node.op_type)
    return readers


def test_tied_table_is_stored_once_and_gathered_by_rows(tmp_path):
    _, path = compile_quantized("examples/tiny-gemma2-9b.yaml", "quantize{bits=4,group=32,embeddings=true}",
                                "onnx-ort", tmp_path)
    readers = initializer_readers(path)
    assert readers["embed.qweight"] == {"GatherBlockQuantized", "MatMulNBits"}
    assert readers["embed.scales"] == {"GatherBlockQuantized", "MatMulNBits"}
    assert "DequantizeLinear" not in op_types(path)
    _, portable = compile_quantized("examples/tiny-gemma2-9b.yaml", "quantize{bits=4,group=32,embeddings=true}",
                                    "onnx", tmp_path)
    model = onnx.load(portable)
    gathered = {n.output[0] for n in model.graph.node if n.op_type == "Gather" and n.input[0] == "embed.qweight"}
    assert gathered  # the packed rows, then DequantizeLinear of those rows only
    table = {i.name: list(i.dims) for i in model.graph.initializer}
    assert table["embed.qweight"] == [256, 2, 16]


def test_default_accuracy_level_is_int8_activations(tmp_path):
    """onnx-ort writes ORT_ACCURACY_LEVEL (4) unless the pass sets a level; level 4 moves
    the logits a little (int8 activations) but keeps the greedy tokens here."""
    from backends.onnx.quant import ORT_ACCURACY_LEVEL

    graph, path = compile_quantized(LLAMA, "lower-mlp,quantize{bits=4,group=32,embeddings=true}", "onnx-ort", tmp_path)
    levels = {next((a.i for a in n.attribute if a.name == "accuracy_level"), 0)
              for n in onnx.load(path).graph.node if n.op_type == "MatMulNBits"}
    assert levels == {ORT_ACCURACY_LEVEL} == {4}
    ours = greedy(ort_engine(path), graph, PROMPTS, NEW_TOKENS)
    ref = greedy(interpreter_engine(graph), graph, PROMPTS, NEW_TOKENS)
    error = relative_error(real_rows(ours["prefill"]["logits"], ref["feeds"]["attention_mask"]),
                           real_rows(ref["prefill"]["logits"], ref["feeds"]["attention_mask"]))
    assert RTOL < error < 0.05


def test_padded_single_block_table(tmp_path):
    """K = 24 in one 32-block: GatherBlockQuantized and the portable rows are sliced to K."""
    from irc.build import emit1
    from irc.dtypes import DType
    from irc.graph import Graph

    results = {}
    for target in ("onnx", "onnx-ort"):
        g = Graph("lookup")
        ids = g.add_input("input_ids", DType.i64, ("B", "T"))
        table = g.add_param("embed", DType.f32, (40, 24))
        seed_absent(g)
        g.outputs = [emit1(g, "embedding", [ids, table], {"scale": 2.0}, "rows")]
        PassManager(parse_pipeline("quantize{embeddings=true,symmetric=false}")).run(g)
        path = str(tmp_path / f"lookup.{target}.onnx")
        emit_model(g, path, target=target, opset=23, context=16)
        feeds = {"input_ids": np.array([[0, 39, 5], [7, 7, 1]], np.int64)}
        results[target] = ort_engine(path)(feeds)["rows"]
        np.testing.assert_array_equal(results[target], interpreter_engine(g)(feeds)["rows"])
    assert "GatherBlockQuantized" in op_types(str(tmp_path / "lookup.onnx-ort.onnx"))


def test_projections_of_one_activation_share_a_matmul_nbits(tmp_path):
    """q, k, v (and gate, up after lower-mlp) read one activation: one MatMulNBits over their
    stacked codes, computing what the interpreter computes (accuracy level 0); gate|up is
    Split, q|k|v goes whole into GroupQueryAttention's packed query (pack-qkv)."""
    graph, path = compile_quantized(LLAMA, "lower-mlp,quantize{bits=4,group=32,accuracy_level=0,embeddings=false}",
                                    "onnx-ort", tmp_path)
    model = onnx.load(path)
    packed = [n for n in model.graph.node if n.op_type == "MatMulNBits" and "+" in n.name]
    assert sorted(n.name for n in packed) == ["layers.0.attn.wq+wk+wv/packed", "layers.0.mlp.w_gate+w_up/packed",
                                              "layers.1.attn.wq+wk+wv/packed", "layers.1.mlp.w_gate+w_up/packed"]
    assert op_types(path)["MatMulNBits"] == 2 * 4 and op_types(path)["Split"] == 2  # the head stays float
    sizes = {i.name: list(i.dims) for i in model.graph.initializer}
    assert sizes["layers.0.attn.wq+wk+wv.qweight"] == [64 + 32 + 32, 2, 16]
    assert not any(name.startswith("layers.0.attn.wk") for name in sizes)
    ours = greedy(ort_engine(path), graph, PROMPTS, NEW_TOKENS)
    assert_close(ours, greedy(interpreter_engine(graph), graph, PROMPTS, NEW_TOKENS), RTOL)
