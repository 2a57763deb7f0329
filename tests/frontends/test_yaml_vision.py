"""The image encoders' YAML form (``frontends.yaml_vision``) and DSL form
(``frontends.dsl_vision``): the same graph as the Hugging Face folder of each family's
config.json, the full-size example's transformers parameter count, the printed form round-trips,
and mistakes are one SpecError naming the key."""
import json
from pathlib import Path

import numpy as np
import pytest

from frontends import load_spec
from frontends.dsl import Model
from frontends.dsl_vision import VisionSpec, build_vit
from frontends.yaml_spec import loads
from irc.analysis import analyze
from irc.errors import SpecError
from irc.interpreter import run
from irc.parser import parse_graph
from irc.printer import print_graph
from irc.verify import verify
from tests.frontends.yaml_checks import assert_hf_builds, without_meta

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=28, patch_size=7)
TWINS = {  # name: (YAML model section, the same model's config.json)
    "tiny-clip-vit-large-patch14-336": (None, dict(SMALL, model_type="clip_vision_model", intermediate_size=64)),
    "tiny-dinov2-registers": ("""
model:
  name: tiny-dinov2-registers
  d_model: 32
  n_layers: 2
  vision: {image_size: 28, patch_size: 7, registers: 2, layer_scale: true}
  norm: {kind: layer, eps: 1.0e-6}
  attention: {kind: mha, n_heads: 4, qkv_bias: true, out_bias: true}
  mlp: {kind: gelu, d_ff: 128, bias: true}
""", dict(SMALL, model_type="dinov2_with_registers", num_register_tokens=2, mlp_ratio=4)),
    "tiny-siglip": ("""
model:
  name: tiny-siglip
  d_model: 32
  n_layers: 2
  vision: {image_size: 30, patch_size: 7, class_token: false, pooler: attention}
  norm: {eps: 1.0e-6}
  attention: {kind: mha, n_heads: 4}
  mlp: {kind: gelu, approximate: tanh, d_ff: 48}
""", dict(SMALL, model_type="siglip_vision_model", image_size=30, intermediate_size=48)),
    "tiny-vit": ("""
model:
  name: tiny-vit
  d_model: 32
  n_layers: 2
  vision: {image_size: 28, patch_size: 7, pooler: dense_tanh}
  norm: {eps: 1.0e-12}
  attention: {kind: mha, n_heads: 4}
  mlp: {kind: gelu, d_ff: 48}
""", dict(SMALL, model_type="vit", intermediate_size=48)),
}


def from_yaml(name: str):
    text = TWINS[name][0]
    return load_spec(EXAMPLES / f"{name}.yaml") if text is None else loads(text, f"{name}.yaml")


@pytest.mark.parametrize("name", sorted(TWINS))
def test_the_hf_frontend_builds_the_same_graph(name, tmp_path):
    graph = from_yaml(name)
    assert_hf_builds(tmp_path, TWINS[name][1], graph)
    verify(graph)
    outputs = run(graph, {"pixel_values": np.ones((2, 3) + (graph.meta["vision"]["image_size"][0],) * 2,
                                                  np.float32)})
    tokens = graph.meta["vision"]["tokens"]
    assert outputs["last_hidden_state"].shape == (2, tokens, 32) and outputs["pooler_output"].shape == (2, 32)
    assert parse_graph(print_graph(graph)) is not None and print_graph(parse_graph(print_graph(graph))) == \
        print_graph(graph)


def test_the_full_size_example_is_the_hf_example():
    yaml_graph = load_spec(EXAMPLES / "clip-vit-large-patch14-336.yaml")
    hf_graph = load_spec(EXAMPLES / "hf" / "clip-vit-large-patch14-336")
    assert without_meta(yaml_graph) == without_meta(hf_graph)
    assert analyze(yaml_graph)["params_total"] == 303_507_456  # transformers' CLIPVisionModel, meta device


def test_the_dsl_declares_a_vit():
    m = Model("tiny-vit", vocab=None, d_model=32, encoder=True)
    build_vit(m, VisionSpec(image_size=28, patch=7, layers=2, heads=4, d_ff=48, eps=1e-12, pooler="dense_tanh"))
    assert without_meta(m.graph) == without_meta(from_yaml("tiny-vit"))


BASE = TWINS["tiny-vit"][0]


@pytest.mark.parametrize("change, key, message", [
    (("d_model: 32", "d_model: 32\n  vocab_size: 100"), "model.vocab_size", "does not apply to a vision encoder"),
    (("kind: mha", "kind: gqa"), "model.attention.kind", 'a vision encoder\'s kind is "mha" here'),
    (("n_heads: 4}", "n_heads: 4, qkv_bias: false}"), "model.attention.qkv_bias", "qkv_bias is true here"),
    (("n_heads: 4}", "n_heads: 5}"), "model.attention.n_heads", "d_model 32 is not divisible by 5 heads"),
    (("kind: gelu", "kind: swiglu"), "model.mlp.kind", "expected one of gelu, quick_gelu"),
    (("pooler: dense_tanh", "pooler: dense_tanh, class_token: false"), "model.vision.pooler",
     "reads the class token, and there is none"),
    (("pooler: dense_tanh", "pooler: class_token, pooler_width: 8"), "model.vision.pooler_width",
     "applies to pooler dense_tanh only"),
    (("patch_size: 7", "patch_size: 29"), "model.vision.patch_size", "patch 29 is larger than the image 28x28"),
])
def test_mistakes_are_spec_errors_naming_the_key(change, key, message):
    with pytest.raises(SpecError) as err:
        loads(BASE.replace(*change), "vit.yaml")
    assert key in str(err.value) and message in str(err.value) and "vit.yaml:" in str(err.value)


def test_the_seeds_llava_case_visual_tokens_outweigh_a_short_question(capsys):
    """LLaVA-1.5-7B: CLIP ViT-L/14-336's 576 patch tokens prepended to a Vicuna-7B (Llama-2-7B
    shapes: 32 layers of 32 heads of 128, bf16: 512 KiB of cache a token) take 288 MiB, 96.6% of
    the cache beside a 20-token question; merged 2x2 (pixel shuffle, Qwen's merger) 144 tokens."""
    from irc_cli import main

    assert main(["show", str(EXAMPLES / "clip-vit-large-patch14-336.yaml"), "--text-model",
                 str(EXAMPLES / "llama2-7b.yaml"), "--json"]) == 0
    costs = json.loads(capsys.readouterr().out)["visual_tokens"]
    assert (costs["image_tokens"], costs["kv_bytes_per_token"], costs["image_kv_bytes"]) == (576, 524_288,
                                                                                             301_989_888)
    question = costs["against_prompt"][0]
    assert (question["prompt_tokens"], question["prompt_kv_bytes"], question["image_share"]) == (20, 10_485_760,
                                                                                                 0.9664)
    assert [(row["merge"], row["tokens"]) for row in costs["compression"]] == [("2x2", 144), ("3x3", 64), ("4x4", 36)]
    assert main(["show", str(EXAMPLES / "clip-vit-large-patch14-336.yaml"), "--text-model",
                 str(EXAMPLES / "llama2-7b.yaml")]) == 0
    assert "288 MiB an image" in capsys.readouterr().out


@pytest.mark.parametrize("spec, text, message", [
    ("llama2-7b.yaml", "llama2-7b.yaml", "--text-model goes with an image encoder"),
    ("clip-vit-large-patch14-336.yaml", "dinov2-large.yaml", "--text-model must be a decoder with a KV cache"),
])
def test_text_model_mistakes(capsys, spec, text, message):
    from irc_cli import main

    assert main(["show", str(EXAMPLES / spec), "--text-model", str(EXAMPLES / text)]) == 2
    assert message in capsys.readouterr().err
