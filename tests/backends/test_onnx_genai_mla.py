"""DeepSeek in onnxruntime-genai (0.18). genai gives a layer's key and value caches one head
size (the config's ``head_size``, or per layer the key input's width, used for both), so the
latent [B, 1, P, d_c] and RoPE-key [B, 1, P, rope] caches of ``mla-absorb`` cannot be
allocated and irc writes no genai_config.json for them; ``mla-absorb{cache=halves}`` stores
[latent | RoPE key] as two equal halves instead (no padding: d_c + rope elements per token
per layer), which genai runs: its greedy tokens equal the reference interpreter's."""
import json

import numpy as np
import pytest

import passes  # noqa: F401  (registers the passes)
from backends.onnx.emit import emit_model
from backends.onnx.runtime import greedy, interpreter_engine
from frontends import load_spec
from irc.passmanager import PassManager, parse_pipeline
from irc.weights import seed_absent
from test_onnx_genai import NEW, PROMPT, PROMPTS, genai_greedy

og = pytest.importorskip("onnxruntime_genai")


def compiled(spec: str, pipeline: str, target: str, directory):
    graph = load_spec(spec)
    seed_absent(graph)
    PassManager(parse_pipeline(pipeline)).run(graph)
    emitted = emit_model(graph, str(directory / "model.onnx"), target=target, context=64)
    return graph, emitted


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("spec,pipeline", [
    ("examples/tiny-deepseek-v2.yaml", "mla-absorb{cache=halves}"),
    ("examples/tiny-deepseek-v3.yaml", "mla-absorb{cache=halves,fold_weights=true}"),
    ("examples/tiny-deepseek-v3.yaml", "mla-absorb{cache=halves},moe-sort")])
def test_genai_generates_deepseek_with_halved_latent_caches(spec, pipeline, target, tmp_path):
    graph, _ = compiled(spec, pipeline, target, tmp_path)
    config = json.loads((tmp_path / "genai_config.json").read_text())["model"]["decoder"]
    a = next(n.attrs for n in graph.nodes if n.op.startswith("mla"))
    assert config["head_size"] * 2 == a["kv_lora_rank"] + a["qk_rope_head_dim"] and config["num_key_value_heads"] == 1
    expected = greedy(interpreter_engine(graph), graph, [PROMPT], NEW)["tokens"].tolist()
    assert genai_greedy(og.Model(str(tmp_path)), np.array([PROMPT]), NEW) == expected


def test_genai_batch_of_uneven_prompts_with_halved_latent_caches(tmp_path):
    graph, _ = compiled("examples/tiny-deepseek-v2.yaml", "mla-absorb{cache=halves}", "onnx-ort", tmp_path)
    width = max(len(p) for p in PROMPTS)
    right_padded = np.zeros((len(PROMPTS), width), np.int64)
    for row, prompt in enumerate(PROMPTS):
        right_padded[row, :len(prompt)] = prompt
    reference = greedy(interpreter_engine(graph), graph, PROMPTS, NEW)["tokens"].tolist()
    assert genai_greedy(og.Model(str(tmp_path)), right_padded, NEW) == reference


def test_latent_caches_of_two_widths_get_no_config_and_say_why(tmp_path):
    _, emitted = compiled("examples/tiny-deepseek-v2.yaml", "mla-absorb", "onnx-ort", tmp_path)
    assert not (tmp_path / "genai_config.json").exists()
    assert emitted.genai_config is None
    assert "genai cannot allocate" in emitted.genai_note and "mla-absorb{cache=halves}" in emitted.genai_note
