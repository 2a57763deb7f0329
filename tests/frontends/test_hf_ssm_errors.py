"""Bad or unsupported config.json settings of the state-space and hybrid families: each is one
SpecError whose message names config.json (with the key's line where the key is written)
and the key, before anything is built. No transformers needed."""
import json

import pytest

from frontends import load_spec
from frontends.hf import read_arch
from tests.frontends.refusals import pointed_line, refused

SMALL = {"vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 48, "max_position_embeddings": 64}
MAMBA2_MIXER = {"mamba_n_heads": 8, "mamba_d_state": 8, "mamba_n_groups": 2, "mamba_d_conv": 4}
BASES = {
    "mamba": {"model_type": "mamba", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "state_size": 8},
    "mamba2": {"model_type": "mamba2", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_heads": 8,
               "head_dim": 8, "state_size": 8, "n_groups": 2},
    "jamba": {**SMALL, "model_type": "jamba", "num_hidden_layers": 4, "attn_layer_period": 2, "attn_layer_offset": 1,
              "num_experts": 4, "mamba_d_state": 8},
    "bamba": {**SMALL, **MAMBA2_MIXER, "model_type": "bamba", "num_hidden_layers": 4, "attn_layer_indices": [1]},
    "granitemoehybrid": {**SMALL, **MAMBA2_MIXER, "model_type": "granitemoehybrid", "num_hidden_layers": 4,
                         "layer_types": ["mamba", "attention", "mamba", "mamba"], "num_local_experts": 4,
                         "shared_intermediate_size": 40, "position_embedding_type": "rope"},
    "nemotron_h": {**SMALL, "model_type": "nemotron_h", "hybrid_override_pattern": "M*-M", "num_hidden_layers": 4,
                   "head_dim": 8, "ssm_state_size": 8, "mamba_num_heads": 8, "mamba_head_dim": 8, "n_groups": 2},
}
CASES = {  # name: (base, changes (None removes a key), the key the message names, a fragment of it)
    "mamba2-heads-x-head-dim": ("mamba2", {"head_dim": 6}, "num_heads", "is not expand x hidden_size = 64"),
    "bamba-heads-x-head-dim": ("bamba", {"mamba_d_head": 6}, "mamba_n_heads", "is not mamba_expand x hidden_size"),
    "granite-heads-not-dividing-auto": ("granitemoehybrid", {"mamba_n_heads": 7}, "mamba_n_heads",
                                        "7 heads x 9 head_dim"),
    "bamba-groups": ("bamba", {"mamba_n_groups": 3}, "mamba_n_groups", "3 groups do not divide 8 heads"),
    "nemotron-groups": ("nemotron_h", {"n_groups": 3}, "n_groups", "3 groups do not divide 8 heads"),
    "nemotron-legacy-groups": ("nemotron_h", {"mamba_n_groups": 5}, "mamba_n_groups", "5 groups do not divide"),
    "mamba2-groups": ("mamba2", {"n_groups": 3}, "n_groups", "do not divide"),
    "mamba-conv-kernel-0": ("mamba", {"conv_kernel": 0}, "conv_kernel", "expected a positive integer"),
    "jamba-conv-kernel-0": ("jamba", {"mamba_d_conv": 0}, "mamba_d_conv", "expected a positive integer"),
    "bamba-conv-kernel-negative": ("bamba", {"mamba_d_conv": -1}, "mamba_d_conv", "expected a positive integer"),
    "nemotron-conv-kernel-0": ("nemotron_h", {"conv_kernel": 0}, "conv_kernel", "expected a positive integer"),
    "nemotron-pattern-unknown-kind": ("nemotron_h", {"hybrid_override_pattern": "M*X-"}, "hybrid_override_pattern",
                                      "'X' is not a layer kind"),
    "nemotron-pattern-length": ("nemotron_h", {"num_hidden_layers": 5}, "num_hidden_layers",
                                "but hybrid_override_pattern gives 4"),
    "nemotron-pattern-empty": ("nemotron_h", {"hybrid_override_pattern": "", "num_hidden_layers": None},
                               "hybrid_override_pattern", "expected a non-empty string"),
    "nemotron-list-unknown-kind": ("nemotron_h", {"layers_block_type": ["linear_attention", "rnn"]},
                                   "layers_block_type", '"rnn" is not supported'),
    "nemotron-moe-latent": ("nemotron_h", {"hybrid_override_pattern": "ME*-", "moe_latent_size": 16},
                            "moe_latent_size", "16 is not supported"),
    "nemotron-moe-routing": ("nemotron_h", {"hybrid_override_pattern": "ME*-", "n_routed_experts": 4, "n_group": 2,
                                            "topk_group": 1, "num_experts_per_tok": 3}, "num_experts_per_tok",
                             "cannot be routed"),
    "granite-unknown-kind": ("granitemoehybrid", {"layer_types": ["mamba", "rnn", "mamba", "mamba"]}, "layer_types",
                             '"rnn" is not supported'),
    "granite-kinds-length": ("granitemoehybrid", {"layer_types": ["mamba", "attention", "mamba"]}, "layer_types",
                             "has 3 entries for 4 layers"),
    "bamba-attention-index-outside": ("bamba", {"attn_layer_indices": [1, 4]}, "attn_layer_indices",
                                      "layer 4 is not one of the 4 layers"),
    "bamba-layer-types": ("bamba", {"layer_types": ["mamba", "attention", "mamba", "mamba"]}, "layer_types",
                          "is not supported"),
    "jamba-attention-offset": ("jamba", {"attn_layer_offset": 2}, "attn_layer_offset", "2 is not below"),
    "jamba-expert-offset": ("jamba", {"expert_layer_period": 2, "expert_layer_offset": 3}, "expert_layer_offset",
                            "3 is not below"),
    "jamba-top-k-above-experts": ("jamba", {"num_experts_per_tok": 5}, "num_experts_per_tok", "exceeds 4 experts"),
    "granite-top-k-above-experts": ("granitemoehybrid", {"num_experts_per_tok": 5}, "num_experts_per_tok",
                                    "exceeds 4 experts"),
    "jamba-gelu": ("jamba", {"hidden_act": "gelu"}, "hidden_act", '"gelu" is not supported'),
    "bamba-mlp-bias": ("bamba", {"mlp_bias": True}, "mlp_bias", "true is not supported"),
    "granite-attention-bias": ("granitemoehybrid", {"attention_bias": True}, "attention_bias", "is not supported"),
    "granite-position-embedding": ("granitemoehybrid", {"position_embedding_type": "alibi"},
                                   "position_embedding_type", '"alibi" is not supported'),
    "granite-partial-rotary": ("granitemoehybrid", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                                        "partial_rotary_factor": 0.5}},
                               "rope_parameters.partial_rotary_factor", "0.5 is not supported"),
    "granite-residual-multiplier": ("granitemoehybrid", {"residual_multiplier": 0}, "residual_multiplier",
                                    "expected a positive number"),
    "nemotron-mlp-act": ("nemotron_h", {"mlp_hidden_act": "silu"}, "mlp_hidden_act", '"silu" is not supported'),
    "nemotron-time-step-limit": ("nemotron_h", {"time_step_limit": [0.1, 0.01]}, "time_step_limit",
                                 "expected 0 <= low <= high"),
    "nemotron-sliding-window": ("nemotron_h", {"sliding_window": 4}, "sliding_window", "4 is not supported"),
}


def folder_with(tmp_path, config: dict):
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    return tmp_path


def changed(base: str, changes: dict) -> dict:
    config = {**BASES[base], **changes}
    return {k: v for k, v in config.items() if v is not None}


@pytest.mark.parametrize("base", sorted(BASES))
def test_the_base_configs_build(tmp_path, base):
    graph = load_spec(folder_with(tmp_path, BASES[base]))
    assert graph.meta["n_layers"] == BASES[base]["num_hidden_layers"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_bad_setting_is_one_error_naming_config_json_and_the_key(tmp_path, name):
    base, changes, key, fragment = CASES[name]
    folder = folder_with(tmp_path, changed(base, changes))
    assert f'"{key.split(".")[-1]}"' in pointed_line(folder, refused(folder, key, fragment))  # the line of the key


def test_nemotron_h_without_a_layer_list_takes_transformers_default_with_its_moe(tmp_path):
    config = changed("nemotron_h", {"hybrid_override_pattern": None, "num_hidden_layers": None})
    arch, _ = read_arch(folder_with(tmp_path, config))
    assert [(spec.mixer, spec.moe) for spec in arch.layers] == [("mamba2", False), (None, True), ("attention", False),
                                                                (None, False)]
    assert arch.moe["activation"] == "relu2" and arch.moe["shared_d_ff"] == 7688


def test_legacy_layer_names_and_keys_are_read_as_transformers_reads_them(tmp_path):
    config = changed("nemotron_h", {"hybrid_override_pattern": None, "num_hidden_layers": None,
                                    "layers_block_type": ["mamba", "attention", "mlp"], "n_groups": 4,
                                    "mamba_n_groups": 2, "mamba_d_conv": 3, "mamba_dt_limit": [0.01, 0.1],
                                    "mamba_dt_min": 0.5})  # only initialises dt_bias (transformers 5.25)
    arch, _ = read_arch(folder_with(tmp_path, config))
    assert [spec.mixer for spec in arch.layers] == ["mamba2", "attention", None]
    assert (arch.ssm["groups"], arch.ssm["conv_kernel"], arch.ssm["dt_min"], arch.ssm["dt_max"]) == (2, 3, 0.01, 0.1)
