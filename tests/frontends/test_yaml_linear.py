"""The YAML forms of Kimi-Linear and MiniMax-Text-01: the ``kimi_delta`` and ``lightning``
layer kinds and sections, MLA without RoPE (``rope: null``, ``attention.norm_eps``) and
MiniMax's ``normed_residual``. Each tiny example builds the graph the HF frontend builds from
the matching config.json, runs and generates; mistakes are SpecErrors at the key."""
from pathlib import Path

import pytest

from frontends import yaml_spec
from irc.errors import SpecError
from tests.frontends.yaml_checks import assert_tiny_example

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIGS = {  # tiny example -> the config.json of the same model
    "tiny-kimi-linear.yaml": {
        "model_type": "kimi_linear", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 128, "rms_norm_eps": 1e-5,
        "q_lora_rank": None, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3], "head_dim": 16, "num_heads": 4,
                               "short_conv_kernel_size": 4},
        "num_experts": 8, "num_experts_per_token": 2, "moe_intermediate_size": 32, "num_shared_experts": 1,
        "first_k_dense_replace": 1, "routed_scaling_factor": 2.446, "moe_renormalize": True,
        "num_expert_group": 1, "topk_group": 1, "tie_word_embeddings": False},
    "tiny-minimax-text-01.yaml": {
        "model_type": "minimax", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 48,
        "rms_norm_eps": 1e-5, "rope_theta": 1e7, "num_local_experts": 4, "num_experts_per_tok": 2,
        "layer_types": ["full_attention", "linear_attention"] * 2, "full_attn_alpha_factor": 1.5,
        "full_attn_beta_factor": 0.8, "linear_attn_alpha_factor": 1.2, "linear_attn_beta_factor": 0.9,
        "mlp_alpha_factor": 1.1, "mlp_beta_factor": 0.7, "tie_word_embeddings": False},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_tiny_example_is_the_hf_graph_and_generates(tmp_path, name):
    assert_tiny_example(tmp_path, EXAMPLES / name, CONFIGS[name])


BASE = ("model:\n  name: t\n  vocab_size: 16\n  d_model: 16\n  n_layers: 2\n  mlp: {kind: swiglu, d_ff: 32}\n"
        "  layers: {pattern: [lightning]}\n  lightning: {heads: 2, head_dim: 8}\n")


def test_mistakes_name_the_key():
    with pytest.raises(SpecError, match=r"model\.normed_residual\.mixer: expected \[alpha, beta\]"):
        yaml_spec.loads(BASE + "  normed_residual: {mixer: [1.0]}\n")
    with pytest.raises(SpecError, match=r"model\.residual_scale: give residual_scale or normed_residual"):
        yaml_spec.loads(BASE + "  residual_scale: 0.5\n  normed_residual: {mixer: [1.0, 1.0]}\n")
    with pytest.raises(SpecError, match=r"model\.lightning: missing required key"):
        yaml_spec.loads(BASE.replace("  lightning: {heads: 2, head_dim: 8}\n", ""))
    with pytest.raises(SpecError, match=r"model\.kimi_delta: no layer is kimi_delta"):
        yaml_spec.loads(BASE + "  kimi_delta: {heads: 2, head_dim: 8}\n")
