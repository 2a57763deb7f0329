"""LFM2 and LFM2-MoE (short convolutions beside attention layers) against transformers: tiny
random twins saved with save_pretrained give the same logits on a left-padded batch of two
(each row held against the row run alone) and the same 16 greedy tokens through the
reference interpreter, both ONNX targets in ONNX Runtime, and onnxruntime-genai 0.18
running irc's folder; bad config.json settings are one error naming the key; the YAML
example builds the graph the HF frontend builds."""
import json
from pathlib import Path

import numpy as np
import pytest

from frontends import load_spec, yaml_spec
from frontends.hf import load_hf, read_arch
from irc.errors import SpecError
from irc.interpreter import generate
from irc.printer import print_graph
from tests.frontends.refusals import pointed_line, refused
from tests.frontends.test_hf_models import NEW_TOKENS, TOLERANCE, built_once, irc_logits, prompts, randomize, \
    relative_error
from tests.frontends.test_hf_ssm import unpadded_logits
from tests.frontends.test_hf_ssm_onnx import (assert_genai_generates, emit_genai_folder,  # noqa: F401 (hf_greedy: a fixture)
                                              hf_greedy)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=128, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             pad_token_id=0, bos_token_id=0, eos_token_id=0)
CASES = {  # name: (config class, overrides of SMALL)
    # conv, attention, conv, attention; MLP width 2/3 of 96 = 64, a multiple of 16
    "lfm2-alternating-tied": ("Lfm2Config", dict(num_hidden_layers=4, intermediate_size=96, block_multiple_of=16,
                                                 layer_types=["conv", "full_attention", "conv", "full_attention"])),
    # on disk as LiquidAI writes it (full_attn_idxs, block_ff_dim, tie_embedding); a 4-tap conv with
    # biases; MQA of head_dim 16; MLP int(1.5 * 2/3 * 72) = 72 rounded up to 80
    "lfm2-biased-l4-mqa-untied": ("Lfm2Config", dict(num_hidden_layers=3, intermediate_size=72, block_multiple_of=16,
                                                     block_ffn_dim_multiplier=1.5, conv_L_cache=4, conv_bias=True,
                                                     num_key_value_heads=1, head_dim=16, tie_word_embeddings=False,
                                                     layer_types=["conv", "conv", "full_attention"],
                                                     rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
    # dense conv layer, then attention + MoE and conv + MoE; top-2 of 4 on sigmoid + expert_bias
    "lfm2-moe-expert-bias": ("Lfm2MoeConfig", dict(num_hidden_layers=3, intermediate_size=40,
                                                   moe_intermediate_size=16, num_dense_layers=1, num_experts=4,
                                                   num_experts_per_tok=2,
                                                   layer_types=["conv", "full_attention", "conv"])),
    # every layer MoE, top-3 of 6, no bias, no renormalisation, scaled; a 2-tap conv
    "lfm2-moe-unnormalised-scaled": ("Lfm2MoeConfig", dict(num_hidden_layers=3, moe_intermediate_size=24,
                                                           num_dense_layers=0, num_experts=6, num_experts_per_tok=3,
                                                           use_expert_bias=False, norm_topk_prob=False,
                                                           routed_scaling_factor=2.5, conv_L_cache=2,
                                                           layer_types=["full_attention", "conv", "conv"])),
}


def as_liquidai_writes_it(folder) -> None:
    """The older config.json keys, which win in transformers: full_attn_idxs for layer_types,
    block_ff_dim over a (here wrong) intermediate_size, tie_embedding."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    kinds = config.pop("layer_types")
    config["full_attn_idxs"] = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
    config["block_ff_dim"], config["intermediate_size"] = config["intermediate_size"], 12288
    config["tie_embedding"] = config.pop("tie_word_embeddings")
    path.write_text(json.dumps(config, indent=2))


ON_DISK = {"lfm2-biased-l4-mqa-untied": as_liquidai_writes_it}


def build_case(name: str, folder):
    class_name, overrides = CASES[name]
    config = getattr(transformers, class_name)(**{**SMALL, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    seed = sorted(CASES).index(name)
    randomize(model, seed=seed, norm_centre=1.0)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for buffer_name, buffer in model.named_buffers():
            if buffer_name.endswith("expert_bias"):  # large enough to change which experts are chosen
                buffer.copy_(0.5 * torch.randn(buffer.shape, generator=generator))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder)
    if name in ON_DISK:
        ON_DISK[name](folder)
    return model, folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return built_once(build_case, tmp_path_factory)


# ---- the reference interpreter --------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_on_a_left_padded_batch(models, name):
    model, folder = models(name)
    ids, mask, positions = prompts()
    got, want = irc_logits(load_spec(folder), ids, mask, positions), unpadded_logits(model, ids, mask)
    real = mask.astype(bool)
    assert relative_error(got[real], want[real]) <= TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_generation_matches(models, hf_greedy, name):  # noqa: F811
    _, folder = models(name)
    tokens, _ = generate(load_spec(folder), prompts()[0][0].tolist(), NEW_TOKENS)
    assert tokens == hf_greedy(name)[0].tolist()


def test_the_families_map_as_transformers_builds_them(models):
    arch, _ = read_arch(models("lfm2-biased-l4-mqa-untied")[1])
    assert [spec.mixer for spec in arch.layers] == ["short_conv", "short_conv", "attention"]
    assert (arch.mlp["d_ff"], arch.tied, arch.ssm) == (80, False, {"kind": "short_conv", "conv_kernel": 4,
                                                                   "bias": True})
    arch, _ = read_arch(models("lfm2-moe-expert-bias")[1])
    assert [spec.moe for spec in arch.layers] == [False, True, True] and arch.mlp["d_ff"] == 40
    assert {k: arch.moe[k] for k in ("scoring", "router_bias", "norm_topk_prob", "routed_scale")} == {
        "scoring": "sigmoid", "router_bias": True, "norm_topk_prob": True, "routed_scale": 1.0}


# ---- ONNX Runtime and onnxruntime-genai ------------------------------------------------------

@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_runtime_matches_transformers(models, hf_greedy, tmp_path, name, target):  # noqa: F811
    from backends.onnx import emit, runtime

    model, folder = models(name)
    graph = load_spec(folder)
    path = str(tmp_path / "model.onnx")
    emit.emit_model(graph, path, target=target, genai=False)
    ids, mask, _ = prompts()
    result = runtime.greedy(runtime.ort_engine(path), graph, [ids[0].tolist(), ids[1][mask[1] == 1].tolist()],
                            NEW_TOKENS)
    real = mask.astype(bool)
    assert relative_error(result["prefill"]["logits"][real], unpadded_logits(model, ids, mask)[real]) <= TOLERANCE
    np.testing.assert_array_equal(result["tokens"], hf_greedy(name))


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_genai_generates_transformers_tokens(models, hf_greedy, tmp_path, name, target):  # noqa: F811
    """genai finds the conv-only layers through ``decoder.layer_types`` (its LFM2 cache: conv
    states and KV caches) and generates transformers' greedy tokens from irc's folder."""
    _, folder = models(name)
    graph = load_spec(folder)
    emit_genai_folder(graph, tmp_path, target)
    config = json.loads((tmp_path / "genai_config.json").read_text())["model"]
    kinds = ["conv" if kind == "short_conv" else "full_attention" for kind in graph.meta["layer_kinds"]]
    assert (config["type"], config["decoder"]["layer_types"]) == ("lfm2", kinds)
    assert_genai_generates(tmp_path, hf_greedy(name)[0].tolist())


# ---- bad input ------------------------------------------------------------------------------

BASE = {"model_type": "lfm2", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 96, "block_multiple_of": 16,
        "layer_types": ["conv", "full_attention", "conv"]}
MOE = {**BASE, "model_type": "lfm2_moe", "moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2,
       "num_dense_layers": 1}
BAD = {  # name: (base, changes (None removes a key), the key the message names, a fragment of it)
    "unknown-layer-kind": (BASE, {"layer_types": ["conv", "sliding_attention", "conv"]}, "layer_types",
                           '"sliding_attention" is not supported'),
    "layer-types-too-short": (BASE, {"layer_types": ["conv", "full_attention"]}, "layer_types",
                              "has 2 entries for 3 layers"),
    "layer-types-too-long": (MOE, {"layer_types": ["conv"] * 4}, "layer_types", "has 4 entries for 3 layers"),
    "moe-unknown-layer-kind": (MOE, {"layer_types": ["conv", "mamba", "conv"]}, "layer_types",
                               '"mamba" is not supported'),
    "layer-types-not-a-list": (BASE, {"layer_types": "conv"}, "layer_types", "expected a list of strings"),
    "conv-cache-0": (BASE, {"conv_L_cache": 0}, "conv_L_cache", "expected a positive integer, got 0"),
    "moe-conv-cache-negative": (MOE, {"conv_L_cache": -2}, "conv_L_cache", "expected a positive integer"),
    "attention-index-outside": (BASE, {"layer_types": None, "full_attn_idxs": [1, 3]}, "full_attn_idxs",
                                "layer 3 is not one of the 3 layers"),
    "partial-rotary": (BASE, {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                                  "partial_rotary_factor": 0.5}},
                       "rope_parameters.partial_rotary_factor", "0.5 is not supported"),
    "no-mlp-left": (BASE, {"block_ffn_dim_multiplier": 0}, "block_ffn_dim_multiplier", "expected a positive number"),
    "top-k-above-experts": (MOE, {"num_experts_per_tok": 5}, "num_experts_per_tok", "exceeds 4 experts"),
    "kv-heads-not-dividing": (BASE, {"num_key_value_heads": 3}, "num_key_value_heads", "not divisible by 3"),
}


def folder_with(tmp_path, config: dict):
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    return tmp_path


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_setting_is_one_error_naming_config_json_and_the_key(tmp_path, name):
    base, changes, key, fragment = BAD[name]
    config = {k: v for k, v in {**base, **changes}.items() if v is not None}
    assert f'"{key.split(".")[-1]}"' in pointed_line(tmp_path, refused(tmp_path, key, fragment, config))


def test_lfm2_moe_without_layer_types_is_refused(tmp_path):
    config = {k: v for k, v in MOE.items() if k != "layer_types"}
    with pytest.raises(SpecError, match=r"config.json: layer_types: missing required key"):
        load_spec(folder_with(tmp_path, config))


def test_the_cli_refuses_with_exit_2_and_writes_nothing(tmp_path, capsys):
    from irc_cli.commands import main

    (tmp_path / "in").mkdir()
    folder = folder_with(tmp_path / "in", {**BASE, "conv_L_cache": 0})
    out = tmp_path / "out"
    assert main(["compile", str(folder), "--target", "onnx-ort", "-o", str(out / "model.onnx")]) == 2
    assert "conv_L_cache: expected a positive integer" in capsys.readouterr().err
    assert not out.exists()


# ---- the YAML architecture form -------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY_TWIN = dict(model_type="lfm2", vocab_size=256, hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, intermediate_size=192, block_multiple_of=64, norm_eps=1e-5,
                 layer_types=["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv",
                              "full_attention"])
MOE_YAML = """model:
  name: tiny-lfm2-moe
  vocab_size: 256
  d_model: 64
  n_layers: 3
  layers: {pattern: [conv, attention, conv]}
  norm: {kind: rms, eps: 1.0e-5}
  attention: {kind: gqa, n_heads: 4, n_kv_heads: 2, qk_norm: true, rope: {base: 1000000}}
  short_conv: {conv_kernel: 2}
  mlp: {kind: swiglu, d_ff: 96}
  moe: {experts: 4, top_k: 2, d_ff: 32, router: sigmoid, router_bias: true, routed_scale: 2.0, dense_layers: [0]}
  tied_embeddings: true
"""
MOE_TWIN = dict(model_type="lfm2_moe", vocab_size=256, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=96, moe_intermediate_size=32, num_experts=4,
                num_experts_per_tok=2, num_dense_layers=1, routed_scaling_factor=2.0, conv_L_cache=2,
                layer_types=["conv", "full_attention", "conv"])


def without_meta(graph) -> str:
    return "\n".join(line for line in print_graph(graph).splitlines() if not line.lstrip().startswith("meta "))


@pytest.mark.parametrize("spec, config", [("tiny-lfm2-1.2b.yaml", TINY_TWIN), (MOE_YAML, MOE_TWIN)])
def test_the_yaml_form_builds_the_hf_frontends_graph(tmp_path, spec, config):
    from_yaml = load_spec(EXAMPLES / spec) if spec.endswith(".yaml") else yaml_spec.loads(spec, "moe.yaml")
    folder = tmp_path / from_yaml.name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    assert without_meta(load_hf(folder, weights=False)) == without_meta(from_yaml)


def test_the_full_size_example_has_lfm2_1_2b_s_shapes():
    graph = load_spec(EXAMPLES / "lfm2-1.2b.yaml")
    assert sum(p.numel for p in graph.params.values()) == 1_170_340_608
    assert [i for i, kind in enumerate(graph.meta["layer_kinds"]) if kind == "attention"] == [2, 5, 8, 10, 12, 14]
    assert graph.params["layers.0.ssm.in_proj"].shape == (3 * 2048, 2048)
    assert [v.shape for v in graph.inputs if v.name == "past_key_values.0.conv_state"] == [("B", 2048, 2)]
    assert "lm_head" not in graph.params and "layers.0.ssm.conv_bias" not in graph.params


@pytest.mark.parametrize("old, new, key, words", [
    ("conv_kernel: 3", "conv_kernel: 0", "model.short_conv.conv_kernel", "expected a positive integer"),
    ("conv_kernel: 3", "bias: 1", "model.short_conv.bias", "expected true or false"),
    ("conv_kernel: 3", "taps: 3", "model.short_conv.taps", "unknown key"),
    ("  short_conv:\n    conv_kernel: 3\n", "", "model.short_conv", "missing required key"),
    ("pattern: [conv, conv, attention, conv, conv, attention, conv, attention]", "pattern: [attention]",
     "model.short_conv", "no layer is conv"),
])
def test_yaml_mistakes_name_the_key(tmp_path, old, new, key, words):
    text = (EXAMPLES / "tiny-lfm2-1.2b.yaml").read_text()
    assert old in text
    with pytest.raises(SpecError) as caught:
        yaml_spec.loads(text.replace(old, new), "tiny.yaml")
    assert str(caught.value).startswith("tiny.yaml:") and f"{key}: {words}" in str(caught.value), str(caught.value)


MIXED = """model:
  name: mixed
  vocab_size: 64
  d_model: 32
  n_layers: 4
  layers: {pattern: PATTERN, feed_forward: false}
  attention: {kind: gqa, n_heads: 4, n_kv_heads: 2}
  short_conv: {conv_kernel: 3}
  mamba2: {n_heads: 2, head_dim: 8, state_size: 8, conv_kernel: CONV}
  mlp: {kind: swiglu, d_ff: 64}
"""


@pytest.mark.parametrize("pattern, conv, types, reason", [
    ("[conv, attention, mamba2, conv]", 3, ["conv", "full_attention", "linear_attention", "conv"], ""),
    ("[conv, mlp, attention, mamba2]", 3, None, "layer 1 has neither a KV cache nor a state"),
    ("[conv, attention, mamba2, conv]", 4, None, "conv states of 2 shapes"),
])
def test_genai_layer_types_or_why_not(pattern, conv, types, reason):
    """Beside conv-only layers genai 0.18 binds a conv state, of one shape, to every layer
    that is not full_attention; a graph it cannot bind that way gets no config, and says why."""
    from backends.onnx.genai import decoder_layers, genai_config

    text = MIXED.replace("PATTERN", pattern).replace("CONV", str(conv))
    if "mlp" not in pattern:
        text = text.replace("feed_forward: false", "feed_forward: true")
    graph = yaml_spec.loads(text, "mixed.yaml")
    assert reason in decoder_layers(graph)[3] and bool(reason) == bool(decoder_layers(graph)[3])
    if types is not None:
        model = genai_config(graph, "model.onnx", 64)["model"]
        assert (model["type"], model["decoder"]["layer_types"]) == ("llama", types)


LFM2_1_2B = {  # LiquidAI/LFM2-1.2B's config.json as published (its older keys included)
    "architectures": ["Lfm2ForCausalLM"], "block_auto_adjust_ff_dim": True, "block_dim": 2048, "block_ff_dim": 12288,
    "block_ffn_dim_multiplier": 1.0, "block_mlp_init_scale": 1.0, "block_multiple_of": 256, "block_norm_eps": 1e-05,
    "block_out_init_scale": 1.0, "block_use_swiglu": True, "block_use_xavier_init": True, "bos_token_id": 1,
    "conv_L_cache": 3, "conv_bias": False, "conv_dim": 2048, "conv_dim_out": 2048, "conv_use_xavier_init": True,
    "eos_token_id": 7, "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 12288,
    "layer_types": ["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv",
                    "full_attention", "conv", "full_attention", "conv", "full_attention", "conv", "full_attention",
                    "conv"],
    "max_position_embeddings": 128000, "model_type": "lfm2", "norm_eps": 1e-05, "num_attention_heads": 32,
    "num_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pad_token_id": 0, "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16", "use_cache": True, "use_pos_enc": True, "vocab_size": 65536}


def test_the_published_config_builds_the_full_size_examples_graph(tmp_path):
    folder = tmp_path / "lfm2-1.2b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LFM2_1_2B))
    assert without_meta(load_hf(folder, weights=False)) == without_meta(load_spec(EXAMPLES / "lfm2-1.2b.yaml"))
