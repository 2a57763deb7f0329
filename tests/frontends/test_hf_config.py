"""The HF frontend without transformers: config.json -> Arch (RoPE in both config forms,
per-layer Gemma 3 RoPE, windows, MoE layers), structure-only folders through the CLI, the
full-size examples against their YAML twins, and a SpecError naming config.json:line and
the key for every setting irc does not implement."""
import json
from pathlib import Path

import pytest

from frontends import load_spec
from frontends.hf import load_hf, read_arch
from irc.analysis import analyze
from irc_cli import main
from irc.errors import SpecError
from irc.verify import verify

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VLM_EXAMPLES = ("gemma-3-4b", "llava-1.5-7b", "llava-v1.6-mistral-7b", "mistral-small-3.1-24b", "paligemma-3b-224",
                "qwen2.5-vl-7b", "smolvlm-256m", "llama-3.2-11b-vision")  # two graphs, no YAML form: tests/frontends/test_hf_vlm.py
NO_YAML = ("llama-4-scout-17b-16e",  # forms YAML does not declare (chunks, MoE input weights): test_hf_llama4.py
           "deepseek-v3.2",  # the lightning indexer's top-k mask: test_hf_deepseek_v32.py
           "rwkv-4-7b",  # RWKV-4's token shifts and WKV recurrence (no YAML form): test_hf_rwkv.py
           "llama3-70b", "qwen3-235b-a22b")  # benchmarks/shard.py's models: tests/passes/test_shard.py
HF_EXAMPLES = sorted(p.name for p in (EXAMPLES / "hf").iterdir()
                     if (p / "config.json").exists() and p.name not in VLM_EXAMPLES + NO_YAML)

LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "max_position_embeddings": 128,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "tie_word_embeddings": False}
DEEPSEEK = {**LLAMA, "model_type": "deepseek_v2", "q_lora_rank": None, "kv_lora_rank": 12, "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 4, "v_head_dim": 6, "n_routed_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 16, "first_k_dense_replace": 1, "n_shared_experts": 1, "num_key_value_heads": 4}
GEMMA3 = {**LLAMA, "model_type": "gemma3_text", "head_dim": 8, "num_hidden_layers": 4, "sliding_window": 4,
          "sliding_window_pattern": 2, "rope_parameters": {
              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
              "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}}}


def folder_with(tmp_path, config: dict, name: str = "model") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def arch_of(tmp_path, config: dict, name: str = "model"):
    return read_arch(folder_with(tmp_path, config, name))[0]


def drop(config: dict, *keys: str) -> dict:
    return {k: v for k, v in config.items() if k not in keys}


def summary(graph) -> dict:
    return {k: v for k, v in analyze(graph).items() if k != "name"}


# ---- structure-only folders ------------------------------------------------------------

@pytest.mark.parametrize("name", HF_EXAMPLES)
def test_full_size_examples_match_their_yaml_twins(name):
    graph = load_spec(EXAMPLES / "hf" / name)
    verify(graph)
    assert graph.name == name
    assert all(p.data is None for p in graph.params.values())
    assert summary(graph) == summary(load_spec(EXAMPLES / f"{name}.yaml"))


def test_cli_show_compile_and_run_take_a_folder(tmp_path, capsys):
    folder = folder_with(tmp_path, LLAMA, "tiny-llama")
    assert main(["show", str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "tiny-llama"
    assert main(["compile", str(folder), "--target", "ir", "--passes", "dce,cse", "--check"]) == 0
    assert capsys.readouterr().out.startswith("graph tiny-llama(")
    assert main(["run", str(folder), "--prompt-ids", "1,2,3", "--max-new-tokens", "3", "--json", "--weights",
                 "seeded"]) == 0
    assert len(json.loads(capsys.readouterr().out)["tokens"]) == 3


def test_cli_reports_config_errors_in_one_line(tmp_path, capsys):
    folder = folder_with(tmp_path, {**LLAMA, "model_type": "no_such_model"})
    assert main(["show", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "config.json:" in err and 'model_type: "no_such_model" is not supported' in err


def test_a_folder_without_config_json(tmp_path):
    with pytest.raises(SpecError, match="no config.json"):
        load_hf(tmp_path)


# ---- RoPE in both config forms ---------------------------------------------------------

LLAMA3_NEW = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
YARN_OLD = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
            "mscale": 0.707, "mscale_all_dim": 0.707}


@pytest.mark.parametrize("new, old, scaling", [
    (LLAMA3_NEW, {"rope_theta": 500000.0, "rope_scaling": {**LLAMA3_NEW, "rope_theta": None}},
     {"kind": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position": 8192}),
    ({"rope_type": "linear", "rope_theta": 1e4, "factor": 2}, {"rope_scaling": {"type": "linear", "factor": 2}},
     {"kind": "linear", "factor": 2.0}),
    ({"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2}, {"rope_scaling": {"type": "dynamic", "factor": 2}},
     {"kind": "dynamic", "factor": 2.0, "original_max_position": 128}),
    ({"rope_type": "yarn", "rope_theta": 1e4, "factor": 4, "original_max_position_embeddings": 32},
     {"rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32, "mscale": 0}},
     {"kind": "yarn", "factor": 4.0, "original_max_position": 32}),
    ({"rope_type": "default", "rope_theta": 1e4}, {"rope_scaling": None}, None),
])
def test_rope_parameters_and_the_older_rope_scaling_agree(tmp_path, new, old, scaling):
    current = {**LLAMA, "rope_parameters": new}
    older = {k: v for k, v in LLAMA.items() if k != "rope_parameters"}
    older.update(old)
    if older.get("rope_scaling"):
        older["rope_scaling"] = {k: v for k, v in older["rope_scaling"].items() if v is not None}
    rope = arch_of(tmp_path, current, "new").layers[0].rope
    assert rope == arch_of(tmp_path, older, "old").layers[0].rope
    assert rope.scaling == scaling


def test_deepseek_yarn_in_the_old_form(tmp_path):
    config = {k: v for k, v in DEEPSEEK.items() if k != "rope_parameters"}
    arch = arch_of(tmp_path, {**config, "rope_scaling": YARN_OLD, "rope_theta": 10000})
    rope = arch.layers[0].rope
    assert rope.convention == "interleaved" and rope.base == 10000.0
    assert rope.scaling == {"kind": "yarn", "factor": 40.0, "original_max_position": 4096, "beta_fast": 32.0,
                            "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}


def test_yarn_factor_defaults_to_the_ratio_of_lengths(tmp_path):
    arch = arch_of(tmp_path, {**LLAMA, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4,
                                                           "original_max_position_embeddings": 32}})
    assert arch.layers[0].rope.scaling["factor"] == 4.0  # 128 / 32


def test_gemma3_rope_per_layer_type_in_both_forms(tmp_path):
    arch = arch_of(tmp_path, GEMMA3, "new")
    windows = [layer.window for layer in arch.layers]
    assert windows == [4, None, 4, None]  # sliding_window_pattern 2: every second layer global
    local, global_ = arch.layers[0].rope, arch.layers[1].rope
    assert (local.base, local.scaling) == (10000.0, None)
    assert (global_.base, global_.scaling) == (1e6, {"kind": "linear", "factor": 8.0})
    older = {k: v for k, v in GEMMA3.items() if k != "rope_parameters"}
    older.update(rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0})
    assert [layer.rope for layer in arch_of(tmp_path, older, "old").layers] == [layer.rope for layer in arch.layers]


def test_partial_rotary_and_gemma_settings(tmp_path):
    phi3 = arch_of(tmp_path, {**LLAMA, "model_type": "phi3", "partial_rotary_factor": 0.5}, "phi3")
    assert phi3.layers[0].rope.rotary_dim == 4 and phi3.checkpoint == "phi3"
    gemma2 = arch_of(tmp_path, {**LLAMA, "model_type": "gemma2", "head_dim": 8, "sliding_window": 16,
                                "query_pre_attn_scalar": 64}, "gemma2")
    assert [layer.window for layer in gemma2.layers] == [16, None]
    assert gemma2.norm_offset == 1.0 and gemma2.sandwich and gemma2.tied is False
    assert gemma2.attention.scale == 0.125 and gemma2.attention.softcap == 50.0 and gemma2.final_softcap == 30.0
    assert gemma2.embedding_scale == pytest.approx(32 ** 0.5)


def test_moe_layers_follow_the_config(tmp_path):
    arch = arch_of(tmp_path, DEEPSEEK, "deepseek")
    assert [layer.moe for layer in arch.layers] == [False, True] and arch.mlp["d_ff"] == 48
    qwen = arch_of(tmp_path, {**LLAMA, "model_type": "qwen2_moe", "num_hidden_layers": 4, "num_experts": 4,
                              "num_experts_per_tok": 2, "moe_intermediate_size": 8,
                              "shared_expert_intermediate_size": 16, "decoder_sparse_step": 2,
                              "mlp_only_layers": [3]}, "qwen")
    assert [layer.moe for layer in qwen.layers] == [False, True, False, False]
    assert qwen.moe["shared_expert_gate"] and qwen.moe["shared_d_ff"] == 16 and qwen.attention.qkv_bias


def test_null_means_none_and_a_left_out_key_means_the_family_default(tmp_path):
    mistral = {**LLAMA, "model_type": "mistral"}
    assert [layer.window for layer in arch_of(tmp_path, mistral, "absent").layers] == [4096, 4096]
    nulled = arch_of(tmp_path, {**mistral, "sliding_window": None}, "null")
    assert [layer.window for layer in nulled.layers] == [None, None]
    gemma2 = {**drop(LLAMA, "tie_word_embeddings"), "model_type": "gemma2", "head_dim": 8,
              "attn_logit_softcapping": None, "final_logit_softcapping": None}
    arch = arch_of(tmp_path, gemma2, "gemma2")
    assert arch.attention.softcap is None and arch.final_softcap is None and arch.tied  # Gemma ties by default
    with pytest.raises(SpecError, match="rms_norm_eps: expected a value, got null"):
        arch_of(tmp_path, {**LLAMA, "rms_norm_eps": None}, "eps")


# ---- refusals --------------------------------------------------------------------------

ERRORS = {  # name: (config, the key the error names, message pattern)
    "unknown model type": ({**LLAMA, "model_type": "no_such_model"}, "model_type",
                           'model_type: "no_such_model" is not supported'),
    "llama attention bias": ({**LLAMA, "attention_bias": True}, "attention_bias", "attention_bias: true is not"),
    "llama mlp bias": ({**LLAMA, "mlp_bias": True}, "mlp_bias", "mlp_bias: true is not supported"),
    "activation": ({**LLAMA, "hidden_act": "gelu"}, "hidden_act", 'hidden_act: "gelu" is not supported'),
    "longrope factors of the wrong length": ({**LLAMA, "rope_parameters": {
        "rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1], "long_factor": [1, 2, 3, 4]}},
        "short_factor", "rope_parameters.short_factor: has 1 entries; a rotary dim of 8 needs 4"),
    "old su rope": ({**drop(LLAMA, "rope_parameters"), "rope_scaling": {"type": "su", "factor": 2}}, "type",
                    'rope_scaling.type: "su" is not supported'),
    "unknown rope key": ({**LLAMA, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                       "mrope_section": [2, 2]}}, "mrope_section",
                         "rope_parameters.mrope_section: unknown RoPE setting"),
    "llama3 without factors": ({**LLAMA, "rope_parameters": {"rope_type": "llama3", "factor": 8}}, "rope_parameters",
                               "low_freq_factor: llama3 RoPE needs it"),
    "missing key": (drop(LLAMA, "vocab_size"), None, "vocab_size: missing required key"),
    "bad value": ({**LLAMA, "num_hidden_layers": 0}, "num_hidden_layers",
                  "num_hidden_layers: expected a positive integer, got 0"),
    "heads do not divide d": ({**LLAMA, "num_attention_heads": 5, "num_key_value_heads": 5}, "num_attention_heads",
                              "hidden_size 32 is not divisible by 5 heads"),
    "kv heads do not divide heads": ({**LLAMA, "num_key_value_heads": 3}, "num_key_value_heads",
                                     "4 heads are not divisible by 3 kv heads"),
    "dtype": ({**LLAMA, "torch_dtype": "float8_e4m3fn"}, "torch_dtype", 'torch_dtype: "float8_e4m3fn" is not'),
    "odd rotary width": ({**LLAMA, "model_type": "phi3", "partial_rotary_factor": 0.625}, "partial_rotary_factor",
                         "partial_rotary_factor: rotates 5 of 8 dims, an odd number"),
    "layer types length": ({**LLAMA, "model_type": "gemma2", "head_dim": 8, "layer_types": ["full_attention"]},
                           "layer_types", "layer_types: has 1 entries for 2 layers"),
    "layer type": ({**LLAMA, "model_type": "gemma2", "head_dim": 8,
                    "layer_types": ["full_attention", "chunked_attention"]}, "layer_types",
                   'layer_types: "chunked_attention" is not supported'),
    "bidirectional gemma2": ({**LLAMA, "model_type": "gemma2", "head_dim": 8, "use_bidirectional_attention": True},
                             "use_bidirectional_attention", "use_bidirectional_attention: true is not supported"),
    "v2 norm_topk_prob": ({**DEEPSEEK, "norm_topk_prob": True}, "norm_topk_prob", "norm_topk_prob: true is not"),
    "moe_layer_freq": ({**DEEPSEEK, "moe_layer_freq": 2}, "moe_layer_freq", "moe_layer_freq: 2 is not supported"),
    "v2 sigmoid": ({**DEEPSEEK, "scoring_func": "sigmoid"}, "scoring_func", 'scoring_func: "sigmoid" is not'),
    "v3 greedy": ({**DEEPSEEK, "model_type": "deepseek_v3", "topk_method": "greedy"}, "topk_method",
                  'topk_method: "greedy" is not supported'),
    "top_k above experts": ({**DEEPSEEK, "num_experts_per_tok": 5}, "num_experts_per_tok",
                            "num_experts_per_tok: top_k 5 exceeds 4 experts"),
    # a multimodal Gemma 3 holds its text model under text_config (frontends.hf.vlm)
    "multimodal gemma3": ({**GEMMA3, "model_type": "gemma3"}, None,
                          "text_config: expected the text model's settings"),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_unsupported_settings_name_config_json_the_key_and_the_value(tmp_path, name):
    config, key, pattern = ERRORS[name]
    folder = folder_with(tmp_path, config)
    with pytest.raises(SpecError, match=pattern.replace("(", r"\(")) as info:
        load_spec(folder)
    location = info.value.location
    assert location.startswith(str(folder / "config.json"))
    if key is not None:  # the line the key is on
        line = int(location.rsplit(":", 1)[1])
        assert f'"{key}"' in (folder / "config.json").read_text().splitlines()[line - 1]


def test_invalid_json_names_line_and_column(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text('{\n  "model_type": "llama",\n  "vocab_size": ,\n}\n')
    with pytest.raises(SpecError, match="invalid JSON") as info:
        load_spec(folder)
    assert info.value.location.endswith("config.json:3:17")
