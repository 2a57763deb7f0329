"""The tiny GPT-OSS twins of test_hf_gpt_oss.py (sinks, alternating sliding / full layers,
YaRN, the biased clamped-SwiGLU MoE) on the targets whose attention is not ONNX's:

- ``--target triton`` (its default pipeline: moe-sort lowers the MoE's biases and clamps to
  primitives; the attention kernels take the sinks), run by Triton's interpreter on CPU: on
  the left-padded batch of two, the prefill logits equal the reference interpreter's and
  transformers' within 1e-4 and 16 greedy steps (each row feeding its own cache back) give
  transformers' tokens;
- ``--target onnx-npu`` on ONNX Runtime's CPU provider: f32 gives the reference
  interpreter's (and transformers') 16 greedy tokens, fp16 logits within 1e-2 relative
  (teacher-forced, as test_onnx_npu.py measures), and where onnxruntime-qnn is installed
  the HTP compiler places every node of both graphs (no CPU fallback)."""
import numpy as np
import pytest

from frontends import load_spec
from tests.frontends.test_hf_gpt_oss import CASES, build
from tests.frontends.test_hf_models import (NEW_TOKENS, TOLERANCE, built_once, hf_batch_greedy,  # noqa: F401
                                            hf_logits, irc_logits, prompts, relative_error)

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return built_once(build, tmp_path_factory)


# One twin through Triton's interpreter (about a minute here): alternating windows, GQA,
# YaRN, top-2; the kernels alone (MQA, split-KV decode) are in test_triton_sinks.py.
@pytest.mark.parametrize("name", ["gpt-oss-alternating-yarn"])
def test_triton_twin_matches_the_reference_and_transformers(models, hf_batch_greedy, tmp_path, name):
    from backends.triton.interpreter import use_interpreter
    use_interpreter()  # before triton is imported: kernels run on CPU tensors
    pytest.importorskip("triton")
    import passes  # noqa: F401  (registers the passes)
    from backends.onnx import runtime
    from backends.triton import DEFAULT_PIPELINE
    from backends.triton.emit import emit_module, load_module
    from irc.passmanager import PassManager, parse_pipeline

    model, folder = models(name)
    graph = load_spec(folder)
    PassManager(parse_pipeline(DEFAULT_PIPELINE)).run(graph)
    assert "moe" not in {n.op for n in graph.nodes}  # sorted, biases and clamps included
    path = tmp_path / f"{name.replace('-', '_')}_tt.py"
    emit_module(graph, str(path), source=name)
    text = path.read_text()
    assert "m_i = sink" in text and "m_i = tl.where(split == 0, sink, m_i)" in text
    module = load_module(str(path))
    weights = module.load_weights()

    def engine(feeds):
        out = module.forward(weights, **feeds)
        return {k: v.cpu().float().numpy() if v.is_floating_point() else v.cpu().numpy() for k, v in out.items()}

    ids, mask, positions = prompts()
    long, short = ids[0].tolist(), ids[1][mask[1] == 1].tolist()
    result = runtime.greedy(engine, graph, [long, short], NEW_TOKENS)
    real = mask.astype(bool)
    got = np.asarray(result["prefill"]["logits"])[real]
    assert relative_error(got, irc_logits(graph, ids, mask, positions)[real]) <= TOLERANCE
    assert relative_error(got, hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE
    np.testing.assert_array_equal(result["tokens"], hf_batch_greedy(name))


def compile_npu(folder, out, *extra):
    from irc_cli.commands import main

    assert main(["compile", str(folder), "--target", "onnx-npu", "-o", str(out), "--context", "32", "--chunk", "4",
                 "--quiet", *extra]) == 0
    return str(out)


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_npu_twin_matches_the_reference(models, hf_batch_greedy, tmp_path, name):
    from backends.onnx_npu.host import generate, prefill_logits
    from irc.evaluate import StreamingInterpreter
    from irc.evaluate import prefill_logits as reference_prefill
    from irc.interpreter import generate as reference_generate

    _, folder = models(name)
    graph = load_spec(folder)
    prompt = prompts()[0][0].tolist()   # the long row: no padding
    expected, _ = reference_generate(graph, prompt, NEW_TOKENS)
    assert expected == hf_batch_greedy(name)[0].tolist()
    assert generate(compile_npu(folder, tmp_path / "f32", "--precision", "f32"), prompt, NEW_TOKENS) == expected
    fp16 = compile_npu(folder, tmp_path / "fp16")
    ids = prompt + expected[:-1]
    want = reference_prefill(StreamingInterpreter(graph, 0), ids)[len(prompt) - 1:]
    got = prefill_logits(fp16, ids)[len(prompt) - 1:].astype(np.float32)
    for step in range(NEW_TOKENS):
        assert relative_error(got[step], want[step]) < 1e-2, step


def test_onnx_npu_twin_compiles_entirely_on_the_htp(models, tmp_path):
    """fp16, CPU fallback disabled (the check of test_onnx_npu_qnn.py): the chunk graph for
    soc_model 60 and the decode graph for 69, the sink columns and the MoE's clamps included."""
    pytest.importorskip("onnxruntime_qnn")
    import onnx

    from backends.onnx_npu import qnn

    _, folder = models("gpt-oss-alternating-yarn")
    out = compile_npu(folder, tmp_path / "fp16")
    for graph, soc in (("chunk", 60), ("decode", 69)):
        path = f"{out}/{graph}.onnx"
        kinds = {n.op_type for n in onnx.load(path, load_external_data=False).graph.node}
        assert {"Concat", "Slice", "Min", "Clip"} <= kinds
        result = qnn.compile_htp(path, soc, out=str(tmp_path / f"{graph}_ctx.onnx"))
        assert result.ok, f"{path} on soc {soc}: {result.error} {result.refusals[:3]}"
        assert result.on_cpu == 0 and result.on_npu > 0 and result.context_bytes > 0


def test_npu_tile_plans_the_twin_and_the_executor_reproduces_it(models):
    """npu-tile on the twin: every attention (sinks) and every expert GEMM planned, the biases
    and the clamped GLU in the epilogues; each record run tile by tile equals the untiled
    reference and moves the plan's bytes, stream by stream (test_npu_executor's check)."""
    from irc.npu.target import load_target
    from passes.npu_tile.plan import machine_of, plan_graph
    from tests.backends.test_npu_executor import check, mini

    _, folder = models("gpt-oss-alternating-yarn")
    graph = load_spec(folder)
    layers = sum(n.op == "attention" for n in graph.nodes)
    for target, dtype in ((mini(), "fp32"), (mini(), "int8"), (load_target("examples/targets/edge-npu.yaml"), "int8")):
        plan = plan_graph(graph, target, tokens=6, past=5, dtype=dtype)
        machine = machine_of(plan)
        attention = [r for r in plan["ops"] if r["kind"] == "attention"]
        assert len(attention) == 2 * layers and all(r["shape"]["sinks"] == 2 for r in attention)
        experts = [r for r in plan["ops"] if r["role"].startswith("experts.gate_up")]
        assert experts and all([s["op"] for s in r["epilogue"]] == ["bias", "bias", "glu"] for r in experts)
        assert all(r["epilogue"][-1]["limit"] == 7.0 for r in experts)
        for record in plan["ops"]:
            check(record, machine)
