"""The emitted ONNX file itself: checker and strict shape inference, the signature and its
dim names, which ops each target and opset uses, determinism, external data, shape-only
compiles, and one BackendError (nothing written) for what a target cannot express."""
import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

import passes  # noqa: F401
from backends.onnx.emit import emit_model
from backends.onnx.runtime import empty_caches, interpreter_engine, left_padded, ort_engine
from backends.onnx.targets import TARGETS
from frontends import load_spec
from irc.analysis import analyze
from irc.build import emit1
from irc.dtypes import DType
from irc.errors import BackendError
from irc.graph import Graph
from irc.passmanager import PassManager, parse_pipeline
from irc.check import relative_error

EXAMPLES = sorted(str(p) for p in Path("examples").glob("tiny-*.yaml"))
LLAMA = "examples/tiny-llama3.yaml"


def compiled(spec, tmp_path, target="onnx", opset=23, name="model.onnx", **options):
    graph = load_spec(spec)
    PassManager(parse_pipeline(TARGETS[target].pipeline(opset))).run(graph)
    path = tmp_path / name
    result = emit_model(graph, str(path), target=target, opset=opset, context=64, **options)
    return graph, path, result


def op_counts(path) -> Counter:
    model = onnx.load(str(path), load_external_data=False)
    return Counter((f"{n.domain}:" if n.domain else "") + n.op_type for n in model.graph.node)


@pytest.mark.parametrize("opset", [23, 21])
@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("spec", EXAMPLES, ids=[Path(e).stem for e in EXAMPLES])
def test_checker_and_strict_shape_inference(spec, target, opset, tmp_path):
    _, path, _ = compiled(spec, tmp_path, target, opset)
    onnx.checker.check_model(str(path), full_check=True)
    onnx.shape_inference.infer_shapes(onnx.load(str(path)), strict_mode=True)


def test_signature_uses_genai_dim_names(tmp_path):
    _, path, _ = compiled(LLAMA, tmp_path)
    model = onnx.load(str(path))

    def dims(values):
        return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}

    inputs, outputs = dims(model.graph.input), dims(model.graph.output)
    assert inputs["input_ids"] == ["batch_size", "sequence_length"]
    assert inputs["attention_mask"] == ["batch_size", "total_sequence_length"]
    assert inputs["position_ids"] == ["batch_size", "sequence_length"]
    assert inputs["past_key_values.1.value"] == ["batch_size", 2, "past_sequence_length", 16]
    assert outputs["logits"] == ["batch_size", "sequence_length", 256]
    assert outputs["present.0.key"] == ["batch_size", 2, "total_sequence_length", 16]


def test_portable_opset_23_keeps_the_structure(tmp_path):
    counts = op_counts(compiled(LLAMA, tmp_path)[1])
    assert counts["Attention"] == 2 and counts["RotaryEmbedding"] == 4 and counts["RMSNormalization"] == 5
    assert not any(":" in op for op in counts)


def test_portable_opset_21_uses_primitives_without_repeating_kv(tmp_path):
    counts = op_counts(compiled(LLAMA, tmp_path, opset=21)[1])
    assert not {"Attention", "RotaryEmbedding", "RMSNormalization"} & set(counts)
    assert not {"Tile", "Repeat"} & set(counts) and not any(":" in op for op in counts)


def test_ort_flavour_uses_contrib_ops_and_no_matmulnbits(tmp_path):
    counts = op_counts(compiled(LLAMA, tmp_path, "onnx-ort")[1])
    assert counts["com.microsoft:GroupQueryAttention"] == 2
    assert "com.microsoft:RotaryEmbedding" not in counts  # inside GQA (do_rotary), with q|k|v packed
    assert counts["com.microsoft:FusedMatMul"] == 2 * 5 + 1 and "MatMul" not in counts  # weights as stored
    assert counts["com.microsoft:SkipSimplifiedLayerNormalization"] == 4
    assert not any("MatMulNBits" in op for op in counts)
    separate = op_counts(compiled(LLAMA, tmp_path, "onnx-ort", name="u.onnx", unfused={"gqa-rope"})[1])
    assert separate["com.microsoft:RotaryEmbedding"] == 4 and separate["com.microsoft:FusedMatMul"] == 2 * 7 + 1


def test_ort_moe_where_it_fits_and_standard_ops_where_not(tmp_path):
    assert op_counts(compiled("examples/tiny-mixtral-8x7b.yaml", tmp_path, "onnx-ort")[1])["com.microsoft:MoE"] == 2
    deepseek = op_counts(compiled("examples/tiny-deepseek-v3.yaml", tmp_path, "onnx-ort", name="ds.onnx")[1])
    assert "com.microsoft:MoE" not in deepseek and deepseek["TopK"] > 0  # sigmoid, bias, groups: standard ops


def test_compiling_twice_gives_the_same_bytes(tmp_path):
    for target in ("onnx", "onnx-ort"):
        first = compiled(LLAMA, tmp_path, target, name="a.onnx", external_threshold=0)[1]
        second = compiled(LLAMA, tmp_path, target, name="b.onnx", external_threshold=0)[1]
        assert first.read_bytes().replace(b"a.onnx.data", b"b.onnx.data") == second.read_bytes()
        assert Path(f"{first}.data").read_bytes() == Path(f"{second}.data").read_bytes()
        third = compiled(LLAMA, tmp_path, target, name="a.onnx")[1]
        assert third.read_bytes() == compiled(LLAMA, tmp_path, target, name="a.onnx")[1].read_bytes()


def prefill_logits(engine, graph):
    feeds = {**left_padded([[1, 2, 3], [4, 5, 6, 7, 8]]), **empty_caches(graph, 2)}
    return engine(feeds)["logits"][:, -1]


def test_external_data_above_the_threshold(tmp_path):
    graph, path, result = compiled(LLAMA, tmp_path, external_threshold=100_000)
    assert result.data_path == f"{path}.data" and Path(result.data_path).stat().st_size > 0.9 * result.weight_bytes
    assert path.stat().st_size < 100_000
    onnx.checker.check_model(str(path), full_check=True)
    expected = prefill_logits(interpreter_engine(graph), graph)
    error = relative_error(prefill_logits(ort_engine(str(path)), graph), expected)
    assert error <= 1e-5


def test_small_models_stay_in_one_file(tmp_path):
    _, path, result = compiled(LLAMA, tmp_path)
    assert result.data_path is None and not Path(f"{path}.data").exists()


def test_shape_only_tiny_model_loads_once_its_data_file_exists(tmp_path):
    graph, path, result = compiled(LLAMA, tmp_path, "onnx-ort", weights="none")
    assert not result.weights_written and not Path(result.data_path).exists()
    model = onnx.load(str(path), load_external_data=False)
    ends = [int(dict((e.key, e.value) for e in t.external_data)["offset"]) +
            int(dict((e.key, e.value) for e in t.external_data)["length"])
            for t in model.graph.initializer if t.external_data]
    with open(result.data_path, "wb") as f:
        f.truncate(max(ends))  # zeros where the weights will go
    onnx.checker.check_model(str(path), full_check=True)
    assert np.isfinite(prefill_logits(ort_engine(str(path)), graph)).all()
    assert all(p.data is None for p in graph.params.values())  # nothing was seeded


def test_shape_only_compile_of_a_full_size_spec(tmp_path):
    """Llama 3 8B: no weight is allocated; the references add up to the model's weights."""
    graph = load_spec("examples/llama3-8b.yaml")
    path = tmp_path / "llama3-8b.onnx"
    result = emit_model(graph, str(path), target="onnx", weights="none")
    model = onnx.load(str(path), load_external_data=False)
    lengths = [int(dict((e.key, e.value) for e in t.external_data)["length"])
               for t in model.graph.initializer if t.external_data]
    assert sum(lengths) == result.weight_bytes == analyze(graph)["param_bytes"]
    assert path.stat().st_size < 1 << 20 and not Path(result.data_path).exists()
    onnx.shape_inference.infer_shapes(model, strict_mode=True)


def test_ort_positions_past_the_context_fail_loudly(tmp_path):
    graph, path, _ = compiled(LLAMA, tmp_path, "onnx-ort")  # context 64
    feeds = {**left_padded([list(range(1, 70))]), **empty_caches(graph, 1)}
    with pytest.raises(Exception, match="cos_cache"):
        ort_engine(str(path))(feeds)


def test_genai_config(tmp_path):
    _, _, result = compiled(LLAMA, tmp_path, "onnx-ort")
    config = json.loads(Path(result.genai_config).read_text())
    decoder = config["model"]["decoder"]
    assert decoder["filename"] == "model.onnx" and decoder["num_hidden_layers"] == 2
    assert decoder["num_key_value_heads"] == 2 and decoder["head_size"] == 16
    assert decoder["inputs"]["position_ids"] == "position_ids"
    assert config["search"]["past_present_share_buffer"] is True and config["model"]["context_length"] == 64
    _, _, portable = compiled(LLAMA, tmp_path, "onnx", name="portable.onnx")
    assert json.loads(Path(portable.genai_config).read_text())["search"]["past_present_share_buffer"] is False


def test_no_genai_config_for_mla_caches(tmp_path):
    _, _, result = compiled("examples/tiny-deepseek-v2.yaml", tmp_path)
    assert result.genai_config is None and "cache layouts" in result.genai_note
    assert not (tmp_path / "genai_config.json").exists()


# ---- what a target cannot express ------------------------------------------------------

def test_rms_norm_at_opset_21_without_lower_norms(tmp_path):
    graph = load_spec(LLAMA)
    with pytest.raises(BackendError, match="rms_norm needs RMSNormalization") as err:
        emit_model(graph, str(tmp_path / "m.onnx"), opset=21)
    assert "lower-norms" in str(err.value) and "node %layers.0.attn_norm_out" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_a_symbol_no_input_carries(tmp_path):
    g = Graph("unbound")
    x = g.add_input("x", DType.f32, ("B", "S*S"))
    g.outputs = [emit1(g, "reshape", [x], {"shape": ["B", "S", "S"]}, "y")]
    with pytest.raises(BackendError, match="symbol 'S' cannot be derived"):
        emit_model(g, str(tmp_path / "m.onnx"))
    assert list(tmp_path.iterdir()) == []


def test_a_symbol_times_a_coefficient_is_read_off(tmp_path):
    """x [B, 2*S] -> [B, S, 2]: S = x's width // 2 (Qwen-VL's patches, 4 per visual token)."""
    from backends.onnx.runtime import ort_engine

    g = Graph("halves")
    x = g.add_input("x", DType.f32, ("B", "2*S"))
    g.outputs = [emit1(g, "reshape", [x], {"shape": ["B", "S", 2]}, "y")]
    emit_model(g, str(tmp_path / "m.onnx"))
    fed = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(ort_engine(str(tmp_path / "m.onnx"))({"x": fed})["y"], fed.reshape(2, 3, 2))


@pytest.mark.parametrize("options, message", [({"opset": 20}, "--opset 20"), ({"opset": 29}, "--opset 29"),
                                              ({"weights": "random"}, "--weights"),
                                              ({"target": "onnx-cuda"}, "unknown ONNX target"),
                                              ({"context": 0}, "context")])
def test_bad_options(options, message, tmp_path):
    with pytest.raises(BackendError, match=message):
        emit_model(load_spec(LLAMA), str(tmp_path / "m.onnx"), **options)
    assert list(tmp_path.iterdir()) == []


def test_dynamic_rope_scaling_is_refused(tmp_path):
    graph = load_spec(LLAMA)
    for node in graph.nodes:
        if node.op == "rope":
            node.attrs["scaling"] = {"kind": "dynamic", "factor": 2.0, "original_max_position": 32}
    with pytest.raises(BackendError, match="dynamic NTK"):
        emit_model(graph, str(tmp_path / "m.onnx"))
    assert list(tmp_path.iterdir()) == []
