"""Gemma-4 in the YAML architecture form (``model.gemma4``, ``frontends.yaml_gemma``): a spec
with every Gemma-4 feature on (global layers with their own head width and one kv head whose
values are the keys, proportional RoPE over half the head, per-layer embeddings, the last two
layers sharing the caches of layers 2 and 3 with double-wide MLPs, a MoE beside every MLP)
builds the graph the HF frontend builds from the matching config.json (held against
transformers in tests/frontends/test_hf_gemma4.py), and generates; mistakes are SpecErrors at
the key."""

import pytest

from frontends import yaml_spec
from irc.interpreter import generate
from tests.frontends.yaml_checks import assert_refused_and_not_compiled, hf_graph, without_meta

SPEC = """model:
  name: tiny-gemma4
  vocab_size: 256
  d_model: 64
  n_layers: 6
  norm: {kind: rms, eps: 1.0e-6, sandwich: true}
  attention:
    kind: gqa
    n_heads: 4
    n_kv_heads: 2
    head_dim: 16
    qk_norm: true
    scale: 1.0
    rope: {base: 1000000, scaling: {kind: proportional, factor: 2, partial_rotary_factor: 0.5}}
    window: 8
    window_pattern: [local, global]
  mlp: {kind: geglu, d_ff: 96, approximate: tanh}
  tied_embeddings: true
  final_softcap: 30.0
  embedding_scale: sqrt_d_model
  gemma4:
    global_attention: {head_dim: 32, n_kv_heads: 1}
    k_eq_v: true
    per_layer_input: {hidden_size: 16}
    kv_shared_layers: 2
    double_wide_mlp: true
    moe: {experts: 4, top_k: 2, d_ff: 32}
    local_rope_base: 10000
"""
SLIDING, FULL = "sliding_attention", "full_attention"
CONFIG = {"model_type": "gemma4_text", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
          "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "global_head_dim": 32, "sliding_window": 8, "hidden_size_per_layer_input": 16,
          "vocab_size_per_layer_input": 256, "layer_types": [SLIDING, FULL] * 3, "num_kv_shared_layers": 2,
          "use_double_wide_mlp": True, "attention_k_eq_v": True, "num_global_key_value_heads": 1,
          "enable_moe_block": True, "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32,
          "final_logit_softcapping": 30.0,
          "rope_parameters": {SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
                              FULL: {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.5,
                                     "factor": 2.0}}}


def test_the_spec_is_the_hf_graph_and_generates(tmp_path):
    graph = yaml_spec.loads(SPEC)
    assert without_meta(hf_graph(tmp_path, CONFIG, graph.name)) == without_meta(graph)
    assert graph.params["layers.1.attn.wk"].shape == (32, 64) and "layers.1.attn.wv" not in graph.params
    assert graph.params["layers.4.mlp.w_gate"].shape == (192, 64)
    assert [v.name for v in graph.inputs if v.name.endswith(".key")] == [f"past_key_values.{i}.key" for i in range(4)]
    tokens, _ = generate(graph, [1, 2, 3], 4)
    assert len(tokens) == 4 and all(0 <= t < 256 for t in tokens)


def test_without_the_optional_parts_it_is_still_the_hf_graph(tmp_path):
    """No per-layer embeddings, no MoE, no sharing, one attention shape, k and v apart."""
    text = SPEC.split("  gemma4:\n")[0] + "  gemma4: {local_rope_base: 100}\n"
    graph = yaml_spec.loads(text)
    config = {k: v for k, v in CONFIG.items() if k not in ("num_global_key_value_heads", "moe_intermediate_size",
                                                           "num_experts", "top_k_experts")}
    config.update(hidden_size_per_layer_input=0, num_kv_shared_layers=0, use_double_wide_mlp=False,
                  attention_k_eq_v=False, enable_moe_block=False, global_head_dim=16)
    config["rope_parameters"] = {**CONFIG["rope_parameters"], SLIDING: {"rope_type": "default", "rope_theta": 100.0}}
    assert without_meta(hf_graph(tmp_path, config, graph.name)) == without_meta(graph)
    assert "embed_per_layer" not in graph.params and "layers.0.layer_scalar" in graph.params


MISTAKES = [  # (replace, with, the message's start)
    ("window_pattern: [local, global]", "window_pattern: [global, local]",
     r"model\.attention\.window_pattern: Gemma-4's last layer \(layer 5\) is global"),
    ("{head_dim: 32, n_kv_heads: 1}", "{head_dim: 32, n_kv_heads: 3}",
     r"model\.gemma4\.global_attention\.n_kv_heads: 4 heads are not divisible by 3"),
    ("top_k: 2", "top_k: 5", r"model\.gemma4\.moe\.top_k: top_k 5 exceeds 4 experts"),
    ("d_ff: 32}", "}", r"model\.gemma4\.moe\.d_ff: missing required key"),
    ("kv_shared_layers: 2", "kv_shared_layers: 5",
     r"model\.gemma4\.kv_shared_layers: layer 1 \(global\) reuses the K/V of an earlier global layer, and the "
     r"first 1 layers have none"),
    ("k_eq_v: true", "k_eq_v: 1", r"model\.gemma4\.k_eq_v: "),
    ("double_wide_mlp: true", "double_wide: true", r"model\.gemma4\.double_wide: unknown key"),
    ("partial_rotary_factor: 0.5}}", "partial_rotary_factor: 0.5}, rotary_dim: 8}",
     r"model\.attention\.rope\.rotary_dim: does not apply beside model\.gemma4"),
    ("scale: 1.0", "scale: 0.25", r"model\.attention\.scale: Gemma-4 attention is unscaled"),
    ("  tied_embeddings: true\n", "  tied_embeddings: true\n  gemma3n: {laurel_rank: 4}\n",
     r"model\.gemma4: give model\.gemma3n or model\.gemma4, not both"),
]


@pytest.mark.parametrize("old, new, message", MISTAKES)
def test_mistakes_are_spec_errors_at_the_key(tmp_path, old, new, message):
    """One SpecError at the key's file:line; ``irc compile`` exits 2 and writes nothing."""
    assert SPEC.count(old) == 1
    assert_refused_and_not_compiled(tmp_path, SPEC.replace(old, new), message)
