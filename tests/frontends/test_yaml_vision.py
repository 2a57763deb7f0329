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
from frontends.hf import load_hf
from frontends.yaml_spec import loads
from irc.analysis import analyze
from irc.errors import SpecError
from irc.interpreter import run
from irc.parser import parse_graph
from irc.printer import print_graph
from irc.verify import verify

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


def without_meta(graph) -> str:
    return "\n".join(line for line in print_graph(graph).splitlines() if not line.lstrip().startswith("meta "))


def from_yaml(name: str):
    text = TWINS[name][0]
    return load_spec(EXAMPLES / f"{name}.yaml") if text is None else loads(text, f"{name}.yaml")


@pytest.mark.parametrize("name", sorted(TWINS))
def test_the_hf_frontend_builds_the_same_graph(name, tmp_path):
    graph = from_yaml(name)
    folder = tmp_path / graph.name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TWINS[name][1]))
    assert without_meta(load_hf(folder, weights=False)) == without_meta(graph)
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
