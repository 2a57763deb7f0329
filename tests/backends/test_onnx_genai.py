"""onnxruntime-genai loads the emitted model through genai_config.json and its greedy
generate loop gives the reference interpreter's tokens: one prompt (Llama, and Mistral
with its window biting), and a batch of two uneven prompts for Llama. genai pads a batch
on the right and masks the padding, leaving holes in the cache; the graph takes any
attention_mask, so without a window the result equals the interpreter's left-padded run.
With a sliding window it does not: the window counts cache slots (as in irc and HF), and
the holes are slots."""
from pathlib import Path

import numpy as np
import pytest

from irc.interpreter import generate
from backends.onnx.emit import emit_model
from backends.onnx.runtime import greedy, interpreter_engine
from frontends import load_spec

og = pytest.importorskip("onnxruntime_genai")

SPECS = ["examples/tiny-llama3.yaml", "examples/tiny-mistral-7b.yaml"]
PROMPT = [5, 17, 42, 7]
PROMPTS = [[11, 5, 200, 7, 42], [3, 250, 17, 99, 64, 8, 31, 120, 77]]
NEW = 16


def genai_model(spec: str, target: str, directory: Path):
    emit_model(load_spec(spec), str(directory / "model.onnx"), target=target, context=64)
    return og.Model(str(directory))


def genai_greedy(model, batch: np.ndarray, new_tokens: int) -> list:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=batch.shape[1] + new_tokens, do_sample=False, batch_size=len(batch))
    generator = og.Generator(model, params)
    generator.append_tokens(batch.astype(np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [[int(t) for t in generator.get_sequence(row)][batch.shape[1]:] for row in range(len(batch))]


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("spec", SPECS, ids=[Path(s).stem for s in SPECS])
def test_genai_generates_the_reference_tokens(spec, target, tmp_path):
    model = genai_model(spec, target, tmp_path)
    expected, _ = generate(load_spec(spec), PROMPT, NEW)
    assert genai_greedy(model, np.array([PROMPT]), NEW) == [expected]


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_genai_batch_of_uneven_prompts(target, tmp_path):
    spec = "examples/tiny-llama3.yaml"
    model = genai_model(spec, target, tmp_path)
    width = max(len(p) for p in PROMPTS)
    right_padded = np.zeros((len(PROMPTS), width), np.int64)  # pad_token_id 0 in genai_config.json
    for row, prompt in enumerate(PROMPTS):
        right_padded[row, :len(prompt)] = prompt
    graph = load_spec(spec)
    reference = greedy(interpreter_engine(graph), graph, PROMPTS, NEW)["tokens"].tolist()
    assert genai_greedy(model, right_padded, NEW) == reference


def test_config_takes_token_ids_context_and_search_defaults_from_meta():
    from backends.onnx.genai import genai_config

    graph = load_spec("examples/tiny-llama3.yaml")
    plain = genai_config(graph, "model.onnx", context=64)
    assert plain["model"]["eos_token_id"] == [] and plain["model"]["pad_token_id"] == 0
    assert plain["model"]["context_length"] == 64 and plain["search"]["do_sample"] is False
    graph.meta.update(eos_token_id=[2, 7], bos_token_id=1, max_positions=48,
                      generation={"do_sample": True, "top_k": 50, "temperature": 0.6})
    config = genai_config(graph, "model.onnx", context=64)
    assert config["model"]["eos_token_id"] == [2, 7] and config["model"]["pad_token_id"] == 2  # the first eos
    assert config["model"]["context_length"] == 48 and config["search"]["max_length"] == 48  # capped by the model
    assert config["search"]["do_sample"] is True and config["search"]["temperature"] == 0.6
