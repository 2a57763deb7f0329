"""The DeepSeek-V2/V3 HF twins after ``mla-absorb``, both forms (absorbed at run time, the
default, and folded), against transformers within 1e-4: the reference interpreter's logits
on a left-padded batch of two uneven prompts, and through ONNX Runtime (both ONNX targets)
and the emitted Triton module (Triton's interpreter on CPU) the prefill logits and 16 greedy
decode steps of that batch, each runtime feeding its own latent caches back."""
import numpy as np
import pytest

import passes  # noqa: F401  (registers the passes)
from frontends import load_spec
from irc.passmanager import PassManager, parse_pipeline
from test_hf_ssm_onnx import emitted_eos
from test_hf_models import (CASES, NEW_TOKENS, TOLERANCE, assert_logits_match, hf_batch_greedy, hf_logits,  # noqa: F401
                            models, prompts, relative_error)

torch = pytest.importorskip("torch")

MLA_CASES = sorted(name for name in CASES if name.startswith(("deepseek-v2", "deepseek-v3")))  # V4: no MLA
FORMS = {"runtime": ("mla-absorb", "mla_latent_attention"),
         "folded": ("mla-absorb{fold_weights=true}", "mla_absorbed_attention")}


def absorbed(folder, form: str):
    graph = load_spec(folder)
    pipeline, op = FORMS[form]
    PassManager(parse_pipeline(pipeline)).run(graph)
    assert {n.op for n in graph.nodes if n.op.startswith("mla")} == {op}
    return graph


def assert_greedy_matches(engine, graph, model, name, hf_batch_greedy) -> None:
    from backends.onnx import runtime

    ids, mask, positions = prompts()
    long, short = ids[0].tolist(), ids[1][mask[1] == 1].tolist()
    result = runtime.greedy(engine, graph, [long, short], NEW_TOKENS)
    real = mask.astype(bool)
    want = hf_logits(model, ids, mask, positions)
    assert relative_error(np.asarray(result["prefill"]["logits"])[real], want[real]) <= TOLERANCE
    np.testing.assert_array_equal(result["tokens"], hf_batch_greedy(name))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", MLA_CASES)
def test_absorbed_twins_match_transformers_in_the_interpreter_and_onnx_runtime(models, hf_batch_greedy, tmp_path,
                                                                                name, form):
    from backends.onnx import emit, runtime

    model, folder = models(name)
    graph = absorbed(folder, form)
    assert_logits_match(graph, model)
    for target in ("onnx", "onnx-ort"):
        path = str(tmp_path / f"model.{target}.onnx")
        emit.emit_model(graph, path, target=target, genai=False)
        assert_greedy_matches(runtime.ort_engine(path), graph, model, name, hf_batch_greedy)


# One twin through Triton (about 30 s of Triton's interpreter here): V3 with a direct query and
# rotate-half RoPE, absorbed at run time. tests/backends/test_triton_models.py runs the tiny
# DeepSeek-V2 and V3 specs the same way against the reference interpreter, and
# test_triton_kernels.py both absorbed ops alone.
@pytest.mark.parametrize("name,form", [("deepseek-v3-direct-q-half-rope", "runtime")])
def test_absorbed_twins_match_transformers_through_triton(models, hf_batch_greedy, tmp_path, name, form):
    from backends.triton.interpreter import use_interpreter
    use_interpreter()  # before triton is imported: kernels run on CPU tensors
    pytest.importorskip("triton")
    from backends.triton.emit import emit_module, load_module

    model, folder = models(name)
    graph = absorbed(folder, form)
    PassManager(parse_pipeline("moe-sort")).run(graph)  # the triton target's pipeline after mla-absorb
    path = tmp_path / f"{name.replace('-', '_')}_{form}_tt.py"
    emit_module(graph, str(path), source=name)
    module = load_module(str(path))
    weights = module.load_weights()

    def engine(feeds):
        out = module.forward(weights, **feeds)
        return {k: v.cpu().float().numpy() if v.is_floating_point() else v.cpu().numpy() for k, v in out.items()}

    assert_greedy_matches(engine, graph, model, name, hf_batch_greedy)


@pytest.mark.parametrize("name", ["deepseek-v2-q-lora-yarn", "deepseek-v3-q-lora-yarn"])
def test_absorbed_twins_generate_transformers_tokens_in_onnxruntime_genai(models, hf_batch_greedy, tmp_path, name):
    """With the latent cache halved (``mla-absorb{cache=halves}``), onnxruntime-genai runs the
    model from its genai_config.json; on the batch of two uneven prompts (genai pads on the
    right and masks) it generates transformers' 16 tokens, each row through its first eos."""
    og = pytest.importorskip("onnxruntime_genai")
    from backends.onnx.emit import emit_model

    model, folder = models(name)
    graph = load_spec(folder)
    PassManager(parse_pipeline("mla-absorb{cache=halves}")).run(graph)
    emitted = emit_model(graph, str(tmp_path / "model.onnx"), target="onnx-ort", context=64)
    assert emitted.genai_config is not None, emitted.genai_note
    ids, mask, _ = prompts()
    rows = [ids[0].tolist(), ids[1][mask[1] == 1].tolist()]
    right_padded = np.zeros((2, ids.shape[1]), np.int32)
    for row, prompt in enumerate(rows):
        right_padded[row, :len(prompt)] = prompt
    genai_model = og.Model(str(tmp_path))
    params = og.GeneratorParams(genai_model)
    params.set_search_options(max_length=ids.shape[1] + NEW_TOKENS, do_sample=False, batch_size=2)
    generator = og.Generator(genai_model, params)
    generator.append_tokens(right_padded)
    while not generator.is_done():
        generator.generate_next_token()
    eos = emitted_eos(tmp_path)
    for row, want in enumerate(hf_batch_greedy(name).tolist()):  # a row ends at its eos, then pads
        got = list(generator.get_sequence(row))[ids.shape[1]:]
        end = next((i + 1 for i, t in enumerate(want) if t in eos), len(want))
        assert got[:end] == want[:end]
