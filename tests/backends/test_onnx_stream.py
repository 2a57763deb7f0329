"""Streaming weights: the writer's pieces give the bytes whole arrays would, read only their
rows, and every checkpoint dtype compiles to every output (and runs where ORT's CPU provider
can run it, matching the reference interpreter)."""
import json

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from safetensors.numpy import save_file

import passes  # noqa: F401
from backends.onnx import emit, writer
from backends.onnx.emit import build, emit_model
from backends.onnx.runtime import ort_engine
from frontends import load_spec
from frontends.hf import load_hf, read_arch
from frontends.hf import weights as hf_weights
from frontends.hf.families import checkpoint_source
from irc.check import relative_error, run_reference
from irc.interpreter import random_feeds
from irc.passmanager import PassManager, parse_pipeline
from irc_cli import main

CONFIG = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
          "tie_word_embeddings": False, "max_position_embeddings": 64}
STORED = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
OUTPUTS = {"f32": ("f32", ""), "f16": ("f16", ""), "bf16": ("bf16", ""),
           "int8": ("auto", "quantize{bits=8,accuracy_level=0}"),  # exact float math in MatMulNBits
           "int4": ("auto", "lower-mlp,quantize{bits=4,group=32,accuracy_level=0}")}


def hf_folder(path, dtype: str = "bf16"):
    """A config.json and model.safetensors of random weights in ``dtype`` that fit it, with
    a tokenizer.json beside them (contents are never read by the compiler)."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps(CONFIG))
    (path / "tokenizer.json").write_text('{"model": "a stand-in"}')
    arch, _ = read_arch(path)
    rng = np.random.default_rng(0)
    tensors = {}
    for param in load_hf(path, weights=False).params.values():
        (name,) = checkpoint_source(arch, param.name).names()
        scale = 1.0 if param.rank == 1 else 1 / np.sqrt(param.shape[-1])
        tensors[name] = (rng.standard_normal(param.shape) * scale).astype(STORED[dtype])
    save_file(tensors, str(path / "model.safetensors"))
    return path


def compiled_graph(folder, dtype: str, passes: str):
    graph = load_spec(folder)
    PassManager(parse_pipeline(",".join(p for p in (f"retype{{dtype={dtype}}}", passes) if p))).run(graph)
    return graph


def initializers(path) -> dict:
    model = onnx.load(str(path))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("target, dtype, passes", [
    ("onnx-ort", "f32", ""), ("onnx-ort", "f16", ""), ("onnx", "bf16", ""),
    ("onnx-ort", "f32", "lower-mlp,quantize{bits=4,group=32,method=rtn}"),
    ("onnx", "f16", "quantize{bits=8,symmetric=false,method=rtn}"), ("onnx", "f32", "quantize{bits=4,group=32,method=rtn}"),
])
def test_pieces_write_the_bytes_of_whole_arrays(tmp_path, monkeypatch, target, dtype, passes):
    folder = hf_folder(tmp_path / "hf")
    graph = compiled_graph(folder, dtype, passes)
    expected = {init.name: init.array() for init in build(graph, target=target).weights}
    monkeypatch.setattr(emit, "SMALL_TENSOR", 0)  # every weight to the data file, however small
    emit_model(graph, str(tmp_path / "whole" / "model.onnx"), target=target, external_threshold=0, workers=1)
    monkeypatch.setattr(writer, "PIECE_ELEMENTS", 96)  # rows of 32 -> 3 per piece; transposes in segments
    monkeypatch.setattr(writer, "WHOLE_BYTES", 0)
    monkeypatch.setattr(writer, "SEGMENT_BYTES", 8)
    tasks = writer.pieces(writer.plan(build(graph, target=target).weights, "model.onnx.data", small=0))
    assert sum(len(task) for task in tasks) > len(expected) + 10  # really cut
    if "quantize" in passes:  # the parts of one quantized weight, block by block, in one task
        shared = [task for task in tasks if len({piece.init.name for piece in task}) > 1]
        assert shared and all(len({(p.start, p.stop) for p in task}) * len({p.init.name for p in task}) == len(task)
                              for task in shared)
    emit_model(graph, str(tmp_path / "cut" / "model.onnx"), target=target, external_threshold=0, workers=2)
    for name in ("model.onnx", "model.onnx.data"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    written = initializers(tmp_path / "cut" / "model.onnx")
    assert set(expected) <= set(written)
    for name, array in expected.items():
        assert written[name].tobytes() == array.tobytes(), name


def test_stacked_codes_stream_each_weight_by_rows(tmp_path, monkeypatch):
    """q|k|v and gate|up packed into one MatMulNBits (``quant_pack``'s ``"stacked"`` codes,
    scales): the writer streams each stacked weight by rows at its place, with the other
    parts of its quantized weight, so no weight is ever quantized whole; the bytes are the
    stacked arrays'."""
    from passes.quantize_methods import QuantizedPart

    folder = hf_folder(tmp_path / "hf")
    graph = compiled_graph(folder, "f32", "lower-mlp,quantize{bits=4,group=32}")
    weights = build(graph, target="onnx-ort").weights
    stacked = [w for w in weights if w.chunking == "stacked"]
    assert {len(w.params) for w in stacked} >= {2, 3}  # gate|up and q|k|v
    expected = {w.name: w.array() for w in stacked}
    monkeypatch.setattr(emit, "SMALL_TENSOR", 0)
    monkeypatch.setattr(writer, "PIECE_ELEMENTS", 96)
    tasks = writer.pieces(writer.plan(weights, "model.onnx.data", small=0))
    segments = [piece for task in tasks for piece in task if "[" in piece.init.name]
    assert segments and not any(piece.whole for piece in segments)
    assert {piece.init.name.split("[")[0] for piece in segments} == set(expected)
    monkeypatch.setattr(QuantizedPart, "__call__", lambda self: pytest.fail(f"{self.weight.source.name} whole"))
    emit_model(graph, str(tmp_path / "out" / "model.onnx"), target="onnx-ort", external_threshold=0, workers=2)
    written = initializers(tmp_path / "out" / "model.onnx")
    for name, array in expected.items():
        assert written[name].tobytes() == array.tobytes(), name


def test_each_piece_reads_only_its_rows(tmp_path, monkeypatch):
    folder = hf_folder(tmp_path / "hf")
    graph = compiled_graph(folder, "f32", "")
    monkeypatch.setattr(writer, "PIECE_ELEMENTS", 64)
    monkeypatch.setattr(writer, "WHOLE_BYTES", 0)
    monkeypatch.setattr(writer, "SEGMENT_BYTES", 4)
    reads = []
    real = hf_weights.read_bytes
    monkeypatch.setattr(hf_weights, "read_bytes", lambda path, offset, size: reads.append(size) or
                        real(path, offset, size))
    emit_model(graph, str(tmp_path / "out" / "model.onnx"), target="onnx-ort", external_threshold=0)
    assert max(reads) == 2 * 32 * 2  # two bf16 rows of 32 (the embedding and lm_head are 64 x 32)
    assert sum(reads) == sum(p.numel for p in graph.params.values()) * 2  # each weight read once


@pytest.mark.parametrize("stored", sorted(STORED))
@pytest.mark.parametrize("output", sorted(OUTPUTS))
def test_every_checkpoint_dtype_compiles_to_every_output(tmp_path, capsys, stored, output):
    folder = hf_folder(tmp_path / "hf", stored)
    dtype, passes = OUTPUTS[output]
    out = tmp_path / "out"
    argv = ["compile", str(folder), "--target", "onnx-ort", "--dtype", dtype, "--logits", "all",
            "-o", str(out / "model.onnx")]
    assert main(argv + (["--passes", passes] if passes else [])) == 0
    assert (out / "tokenizer.json").read_text() == '{"model": "a stand-in"}'
    onnx.checker.check_model(str(out / "model.onnx"), full_check=True)
    graph = compiled_graph(folder, "f32" if dtype == "auto" else dtype, passes)
    if output == "bf16":  # ORT's CPU provider has no bf16 MatMul: compiled and checked, not run
        inputs = onnx.load(str(out / "model.onnx"), load_external_data=False).graph.input
        assert {i.type.tensor_type.elem_type for i in inputs if i.name.startswith("past_key_values")} == \
            {onnx.TensorProto.BFLOAT16}
        return
    feeds = random_feeds(graph, batch=2, tokens=4, past=2, seed=0)
    reference = run_reference(graph, feeds, 0)
    got = ort_engine(str(out / "model.onnx"))(feeds)
    error = max(relative_error(got[v.name].astype(np.float32), r.astype(np.float32))
                for v, r in zip(graph.outputs, reference))
    assert error < (2e-2 if output == "f16" else 1e-4), error
    scales = [p for name, p in graph.params.items() if name.endswith(".scales")]
    assert all(p.dtype.text == "f32" for p in scales)  # scales follow the f32 activations


def test_f16_models_cast_no_weight_per_step(tmp_path):
    """ORT folds every Cast of an initializer when it creates the session: the optimized
    model reads f32 weights directly, and casts only activations."""
    import onnxruntime as ort

    folder = hf_folder(tmp_path / "hf")
    assert main(["compile", str(folder), "--target", "onnx-ort", "--dtype", "f16", "-o",
                 str(tmp_path / "out" / "model.onnx")]) == 0
    model = onnx.load(str(tmp_path / "out" / "model.onnx"))
    weights = {t.name for t in model.graph.initializer}
    assert any(n.op_type == "Cast" and n.input[0] in weights for n in model.graph.node)  # f16 weights, f32 MatMul
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(tmp_path / "out" / "model.onnx"), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"))
    folded = {t.name for t in optimized.graph.initializer}
    assert not [n.name for n in optimized.graph.node if n.op_type == "Cast" and n.input[0] in folded]
