"""The state-space families' tiny twins (``tests.frontends.test_hf_ssm.CASES``) through both
ONNX targets in ONNX Runtime against transformers: prefill logits on a left-padded batch of
two (each row held against transformers running it alone, unpadded), then 16 greedy tokens
per row with the conv and recurrent states (and the attention layers' KV caches) fed back,
equal to transformers' greedy continuation of each prompt."""
from pathlib import Path

import numpy as np
import pytest

from frontends import load_spec
from tests.frontends.test_hf_models import NEW_TOKENS, assert_ort_run_matches, prompts
from tests.frontends.test_hf_ssm import CASES, models, unpadded_logits  # noqa: F401 (models: a fixture)

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def hf_greedy(models):  # noqa: F811
    """name -> transformers' 16 greedy tokens for each prompt run alone [2, 16]; once each."""
    done = {}

    def get(name):
        if name not in done:
            model, _ = models(name)
            ids, mask, _ = prompts()
            rows = []
            for row in range(len(ids)):
                prompt = torch.from_numpy(ids[row][mask[row] == 1][None, :])
                with torch.no_grad():
                    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                                         do_sample=False)
                rows.append(out[0, prompt.shape[1]:].numpy())
            done[name] = np.stack(rows)
        return done[name]

    return get


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_runtime_matches_transformers(models, hf_greedy, tmp_path, name, target):  # noqa: F811
    from backends.onnx import emit

    model, folder = models(name)
    graph = load_spec(folder)
    path = str(tmp_path / "model.onnx")
    emit.emit_model(graph, path, target=target, genai=False)
    assert_ort_run_matches(path, graph, unpadded_logits(model, *prompts()[:2]), hf_greedy(name))


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_genai_generates_transformers_tokens(models, hf_greedy, tmp_path, name, target):  # noqa: F811
    """onnxruntime-genai 0.18 runs the folder irc writes (its RecurrentState finds each
    layer's conv and recurrent state by name beside the attention layers' KV caches) and
    generates transformers' greedy tokens."""
    model, folder = models(name)
    emit_genai_folder(load_spec(folder), tmp_path, target)
    assert_genai_generates(tmp_path, hf_greedy(name)[0].tolist())


def genai_greedy(og, folder, prompt, new_tokens: int) -> list:
    """onnxruntime-genai's greedy continuation of ``prompt`` from the folder (it stops at eos)."""
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(prompt)[None, :].astype(np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)][len(prompt):]


def until_eos(tokens: list, folder) -> list:
    """``tokens`` up to the folder's first eos (genai stops before it)."""
    eos = emitted_eos(folder)
    return tokens[:next((i for i, t in enumerate(tokens) if t in eos), len(tokens))]


def emit_genai_folder(graph, folder, target: str = "onnx-ort"):
    """``graph`` emitted for ``target`` (context 64) into ``folder``, its genai_config
    written (asserted); the emit result. Skips where onnxruntime-genai is missing."""
    pytest.importorskip("onnxruntime_genai")
    from backends.onnx import emit

    emitted = emit.emit_model(graph, str(Path(folder) / "model.onnx"), target=target, context=64)
    assert emitted.genai_config, emitted.genai_note
    return emitted


def assert_genai_generates(folder, want_tokens) -> None:
    """onnxruntime-genai's greedy continuation of the first prompt (``prompts``) from
    ``folder`` equals ``want_tokens`` up to the folder's first eos."""
    og = pytest.importorskip("onnxruntime_genai")
    assert genai_greedy(og, folder, prompts()[0][0], NEW_TOKENS) == until_eos(list(want_tokens), folder)


def emitted_eos(folder) -> set:
    """The ids genai stops at: the folder's eos, or its pad_token_id where it names no eos
    (onnxruntime-genai 0.18 stops there then: seen on a twin without an eos)."""
    import json

    model = json.loads((Path(folder) / "genai_config.json").read_text())["model"]
    eos = model["eos_token_id"]
    eos = set(eos if isinstance(eos, list) else [eos])
    return eos or {model.get("pad_token_id")}
