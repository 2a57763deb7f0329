"""onnx-npu against a real NPU compiler: onnxruntime-qnn's HTP backend compiles every tiny
decoder example's graphs (the hybrids with recurrent layers too, Jamba's Mamba-1 scan and Kimi's
per-channel decay among them, fp16 and w8a16; RWKV-4 and RecurrentGemma from configs) for soc_model 60 and 69 with CPU fallback disabled and
every node on the HTP (the exception decides, not the _ctx.onnx file; the chunk graph for
one SoC and the decode graph for the other here, all four pairs in benchmarks/npu_onnx.py); a 2-layer slice of
the real SmolLM2 compiles the same way; the compiled context run in the x86 emulator
matches the CPU provider. Runs where the ``npu`` extra (onnxruntime-qnn) is installed."""
import dataclasses
import json

import numpy as np
import onnx
import onnx.utils
import pytest
from onnx import TensorProto, helper

pytest.importorskip("onnxruntime_qnn")

from backends.onnx_npu import host, qnn  # noqa: E402
from backends.onnx_npu.emit import emit_folder  # noqa: E402
from frontends.gguf import GGUFFile  # noqa: E402
from frontends.gguf.families import describe  # noqa: E402
from frontends.gguf.quantized import attach_weights  # noqa: E402
from frontends.hf.build import expand  # noqa: E402
from irc.check import relative_error  # noqa: E402
from irc.passmanager import PassManager, parse_pipeline  # noqa: E402
from irc_cli.commands import main  # noqa: E402
from test_onnx_npu import DECODERS as EXAMPLES  # noqa: E402  (the tiny examples without recurrent layers)
from test_onnx_npu_recurrent import HF_RECURRENT, HYBRIDS, hf_recurrent_folder  # noqa: E402
PROMPT = [3, 17, 42, 99, 5, 7, 250, 11, 60, 61, 62]


def compile_folder(spec, folder, context=32, chunk=4):
    assert main(["compile", spec, "--target", "onnx-npu", "-o", str(folder), "--context", str(context),
                 "--chunk", str(chunk), "--quiet"]) == 0
    return folder


def assert_all_on_htp(result: qnn.Compiled, model_path: str):
    assert result.ok, f"{model_path} on soc {result.soc}: {result.error} {result.refusals[:3]}"
    nodes = {n.name for n in onnx.load(model_path, load_external_data=False).graph.node}
    assert result.on_cpu == 0 and result.on_npu > 0
    assert len(set(result.placements) & nodes) > len(nodes) // 2  # names as ORT's fusions leave them
    assert result.context_bytes > 0


@pytest.mark.parametrize("spec", EXAMPLES)
def test_every_tiny_example_compiles_entirely_on_the_htp(spec, tmp_path):
    """One compile per example, cycling through (chunk, 60), (decode, 69), (chunk, 69),
    (decode, 60) so the set covers every pair (benchmarks/npu_onnx.py compiles all four
    pairs of every example)."""
    folder = compile_folder(spec, tmp_path / "m")
    graph, soc = [("chunk", 60), ("decode", 69), ("chunk", 69), ("decode", 60)][EXAMPLES.index(spec) % 4]
    path = str(folder / f"{graph}.onnx")
    assert_all_on_htp(qnn.compile_htp(path, soc, out=str(tmp_path / f"{graph}_ctx.onnx")), path)


@pytest.mark.parametrize("spec", HYBRIDS)
def test_every_hybrid_compiles_entirely_on_the_htp(spec, tmp_path):
    """fp16: both graphs for both SoCs; w8a16 (QDQ linear layers, the recurrences at fp16
    between them): the chunk graph for one SoC and the decode graph for the other."""
    folder = compile_folder(spec, tmp_path / "fp16")
    text = tmp_path / "calibration.txt"
    text.write_text(" ".join(str(t) for t in np.random.default_rng(3).integers(0, 256, 64)))
    quantized = tmp_path / "w8a16"
    assert main(["compile", spec, "--target", "onnx-npu", "-o", str(quantized), "--context", "32", "--chunk", "4",
                 "--precision", "w8a16", "--calibration", str(text), "--quiet"]) == 0
    first = HYBRIDS.index(spec) % 2
    pairs = [(folder, g, soc) for g in ("chunk", "decode") for soc in (60, 69)] + \
        [(quantized, "chunk", (60, 69)[first]), (quantized, "decode", (69, 60)[first])]
    for where, graph, soc in pairs:
        path = str(where / f"{graph}.onnx")
        out = str(tmp_path / f"{where.name}_{graph}_{soc}_ctx.onnx")
        assert_all_on_htp(qnn.compile_htp(path, soc, out=out), path)


@pytest.mark.parametrize("name", sorted(HF_RECURRENT))
def test_hf_config_recurrences_compile_entirely_on_the_htp(name, tmp_path):
    """RWKV-4, RecurrentGemma and Ling's hybrid (seeded weights), fp16: the chunk graph for one
    SoC and the decode graph for the other."""
    folder = tmp_path / "fp16"
    assert main(["compile", hf_recurrent_folder(name, tmp_path), "--weights", "seeded", "--target", "onnx-npu", "-o",
                 str(folder), "--context", "32", "--chunk", "4", "--quiet"]) == 0
    for graph, soc in (("chunk", 60), ("decode", 69)):
        path = str(folder / f"{graph}.onnx")
        assert_all_on_htp(qnn.compile_htp(path, soc, out=str(tmp_path / f"{graph}_{soc}_ctx.onnx")), path)


def test_emulated_hybrid_matches_the_cpu_provider(tmp_path):
    """tiny-qwen3-next (gated DeltaNet, attention, MoE): the compiled chunk and decode
    contexts in the HTP emulator carry the states through the host loop: the same greedy
    tokens, logits within 1e-1 relative of the CPU provider. Looser than the attention
    models' 1e-2: the HTP runs the layers' f32 math at fp16 (the CPU provider in f32), and
    the error grows along a chunk's decay products (measured at 9 prompt positions: up to
    8e-2 on tiny-qwen3-next, 5e-2 on tiny-mamba2, 2e-2 on tiny-lfm2)."""
    folder = compile_folder("examples/tiny-qwen3-next-80b-a3b.yaml", tmp_path / "m")
    engines = {}
    for role in ("chunk", "decode"):
        compiled = qnn.compile_htp(str(folder / f"{role}.onnx"), 69, out=str(tmp_path / f"{role}_ctx.onnx"))
        assert compiled.ok, compiled.error
        engines[role] = host.session_engine(qnn.emulated_session(compiled.context_path, 69))
    cpu, emulated = [], []
    tokens = host.generate(str(folder), PROMPT[:9], 2, logits=cpu)
    assert host.generate(str(folder), PROMPT[:9], 2, engines=engines, logits=emulated) == tokens
    for a, b in zip(cpu, emulated):
        assert relative_error(b.astype(np.float32), a.astype(np.float32)) < 1e-1


def test_a_refused_node_fails_the_compile_and_is_named(tmp_path):
    nodes = [helper.make_node("Shrink", ["x"], ["y"], name="bad_shrink", lambd=0.5),
             helper.make_node("Relu", ["y"], ["z"], name="fine_relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    path = str(tmp_path / "shrink.onnx")
    onnx.save(model, path)
    result = qnn.compile_htp(path, 60)
    assert not result.ok and "fallback" in result.error
    assert result.placements == {"bad_shrink": "CPUExecutionProvider", "fine_relu": qnn.EP}
    assert any("Shrink" in reason for reason in result.refusals)


def test_emulated_context_matches_the_cpu_provider(tmp_path):
    """The compiled chunk and decode contexts, run by the HTP emulator inside the host loop:
    the same tokens, logits within 1e-2 of ONNX Runtime's CPU provider (fp16)."""
    folder = compile_folder("examples/tiny-llama3.yaml", tmp_path / "m")
    engines = {}
    for role in ("chunk", "decode"):
        compiled = qnn.compile_htp(str(folder / f"{role}.onnx"), 60, out=str(tmp_path / f"{role}_ctx.onnx"))
        assert compiled.ok, compiled.error
        engines[role] = host.session_engine(qnn.emulated_session(compiled.context_path, 60))
    cpu, emulated = [], []
    tokens = host.generate(str(folder), PROMPT, 3, logits=cpu)
    assert host.generate(str(folder), PROMPT, 3, engines=engines, logits=emulated) == tokens
    for a, b in zip(cpu, emulated):
        assert relative_error(b.astype(np.float32), a.astype(np.float32)) < 1e-2


def test_smollm2_two_layer_slice_compiles_on_the_htp(smollm2_gguf, tmp_path):
    """SmolLM2-135M's first two layers (Q4_1 weights dequantized to float, tied head) at
    chunk 32 and a 256-slot cache: the chunk graph for soc 69 (benchmarks/npu_onnx.py
    compiles both graphs for both SoCs)."""
    gguf = GGUFFile.open(smollm2_gguf)
    gguf.tensors = {name: t for name, t in gguf.tensors.items()  # the slice: blocks 0 and 1 only
                    if not name.startswith("blk.") or int(name.split(".")[1]) < 2}
    arch = describe(gguf, "smollm2-2l")
    arch = dataclasses.replace(arch, n_layers=2, layers=arch.layers[:2])
    graph = expand(arch, gguf.path)
    attach_weights(graph, arch, gguf, weights="float")
    PassManager(parse_pipeline("retype{dtype=f16},lower-norms,lower-mlp,lower-softcap,fold,dce,cse")).run(graph)
    emit_folder(graph, str(tmp_path / "smol"), chunk=32, context=256)
    for soc, role in ((69, "chunk"),):
        path = str(tmp_path / "smol" / f"{role}.onnx")
        assert_all_on_htp(qnn.compile_htp(path, soc, out=str(tmp_path / f"{role}_ctx.onnx")), path)


def test_qdq_units_compile_quantized_and_the_emulator_agrees(tmp_path):
    """W8A16 and W4A16 compile with every node on the HTP (the linear layers as quantized
    FullyConnected units, per the log). One QDQ linear unit cut from the W8A16 graph: the
    CPU provider computes exactly the QDQ arithmetic, the emulated context within 2 steps
    of the output's uint16 scale (measured 2.0: the HTP's requantization rounds its own
    way). The whole W8A16 model: the same top token at every position, logits within 1e-2
    relative (measured 2.3e-3; the HTP runs the unquantized ops, norms, RoPE and attention,
    at fp16 where the CPU runs f32, so whole-model logits differ by far more than a step)."""
    text = tmp_path / "calibration.txt"
    text.write_text(" ".join(str(t) for t in np.random.default_rng(3).integers(0, 256, 64)))
    for precision, soc in (("w8a16", 60), ("w4a16", 69)):
        folder = tmp_path / precision
        assert main(["compile", "examples/tiny-llama3.yaml", "--target", "onnx-npu", "-o", str(folder), "--context",
                     "32", "--chunk", "4", "--precision", precision, "--calibration", str(text), "--quiet"]) == 0
        path = str(folder / "chunk.onnx")
        result = qnn.compile_htp(path, soc, out=str(tmp_path / f"{precision}_ctx.onnx"), log_dir=str(tmp_path))
        assert_all_on_htp(result, path)
        log = (tmp_path / f"qnn_{soc}.log").read_text()
        assert "QNN_op_type: FullyConnected" in log and "UFIXED_POINT_16" in log
    folder = tmp_path / "w8a16"   # a prefill runs the chunk graph only: its w8a16 context from above
    engines = {"chunk": host.session_engine(qnn.emulated_session(str(tmp_path / "w8a16_ctx.onnx"), 60))}
    cpu = host.prefill_logits(str(folder), PROMPT)
    emulated = host.prefill_logits(str(folder), PROMPT, engines=engines)
    assert (cpu.argmax(-1) == emulated.argmax(-1)).all()
    assert relative_error(emulated.astype(np.float32), cpu.astype(np.float32)) < 1e-2
    check_one_unit(str(folder / "chunk.onnx"), tmp_path)


def check_one_unit(path: str, tmp_path) -> None:
    """The first query projection's QDQ unit alone, on the CPU provider and the emulator."""
    model = onnx.shape_inference.infer_shapes(onnx.load(path))
    unit = onnx.utils.Extractor(model).extract_model(["layers.0.attn_norm_out"], ["layers.0.q"])
    assert [n.op_type for n in unit.graph.node] == ["QuantizeLinear", "DequantizeLinear", "DequantizeLinear",
                                                    "MatMul", "QuantizeLinear", "DequantizeLinear"]
    unit_path = str(tmp_path / "unit.onnx")
    onnx.save(unit, unit_path)
    compiled = qnn.compile_htp(unit_path, 60, out=str(tmp_path / "unit_ctx.onnx"))
    assert compiled.ok, compiled.error
    x = np.random.default_rng(0).standard_normal((1, 4, 64)).astype(np.float32) * 0.5
    cpu = host.session_engine(host.cpu_session(unit_path))({"layers.0.attn_norm_out": x})["layers.0.q"]
    emulated = qnn.emulated_session(compiled.context_path, 60).run(None, {"layers.0.attn_norm_out": x})[0]
    init = {t.name: onnx.numpy_helper.to_array(t) for t in unit.graph.initializer}
    s_in, z_in = float(init["layers.0.attn_norm_out/act/scale"]), int(init["layers.0.attn_norm_out/act/zero_point"])
    s_out, z_out = float(init["layers.0.q/act/scale"]), int(init["layers.0.q/act/zero_point"])
    x_dq = (np.clip(np.rint(x / s_in) + z_in, 0, 65535) - z_in) * s_in
    weight = init["layers.0.attn.wq.q8"].astype(np.float32) * init["layers.0.attn.wq.scale"]
    expected = (np.clip(np.rint(x_dq @ weight / s_out) + z_out, 0, 65535) - z_out) * s_out
    assert np.abs(cpu - expected).max() <= 1e-6 + s_out * 1e-3
    assert np.abs(emulated - cpu).max() <= 2.01 * s_out


def test_report_shows_the_placement_per_layer(tmp_path, capsys):
    """--report compiles both graphs for both SoCs and puts the per-layer placement in the
    terminal lines, placement.json and the HTML report."""
    out, page = tmp_path / "m", tmp_path / "report.html"
    assert main(["compile", "examples/tiny-llama3.yaml", "--target", "onnx-npu", "-o", str(out), "--context", "16",
                 "--chunk", "4", "--report", str(page)]) == 0
    err = capsys.readouterr().err
    assert "chunk graph, soc 60: compiled" in err and "decode graph, soc 69: compiled" in err
    report = json.loads((out / "placement.json").read_text())
    assert {(c["graph"], c["soc"]) for c in report["compiles"] if c["ok"] and c["refused"] == 0} == \
        {("chunk", 60), ("chunk", 69), ("decode", 60), ("decode", 69)}
    layers = {r["layer"] for r in report["rows"]}
    assert {"layer 0", "layer 1", "model"} <= layers
    assert 'id="npu-placement"' in page.read_text()


def test_chunk_and_decode_share_one_context_binary(tmp_path):
    """QNN weight sharing: both graphs compiled into one context, one _qnn.bin that both
    EPContext nodes name, about the size of one graph's context (the weights once)."""
    folder = compile_folder("examples/tiny-llama3.yaml", tmp_path / "m")
    written = qnn.compile_shared({role: str(folder / f"{role}.onnx") for role in ("chunk", "decode")}, 69,
                                 str(tmp_path))
    bins = set()
    for path in written.values():
        (node,) = onnx.load(path).graph.node
        attrs = {a.name: a for a in node.attribute}
        assert node.op_type == "EPContext" and attrs["embed_mode"].i == 0
        bins.add(attrs["ep_cache_context"].s.decode())
    assert bins == {"chunk_ctx_qnn.bin"}
    alone = qnn.compile_htp(str(folder / "chunk.onnx"), 69, out=str(tmp_path / "alone_ctx.onnx"))
    assert (tmp_path / "chunk_ctx_qnn.bin").stat().st_size < 1.3 * alone.context_bytes
