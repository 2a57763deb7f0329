"""The YAML forms of the attention families beyond Llama's: Granite's multipliers
(``embedding_scale``, ``attention.scale``, ``residual_scale``, ``logits_scale``), SmolLM3's
NoPE layers (``attention.nope_layers``), OLMo-2's norms after the branches
(``norm.placement: post``, ``attention.qk_norm: full``), GPT-2's learned positions and biases
(``learned_positions``, ``attention.out_bias``), Phi-2's parallel block and head bias
(``layers.parallel``, ``head_bias``), GPT-OSS's sinks and biased, clamped experts
(``attention.sinks``, ``moe.activation: swiglu_oai``, ``router_logit_bias``, ``expert_bias``),
Gemma-3n's AltUp / LAuReL / per-layer inputs / KV sharing / sparsity (``model.gemma3n``),
BLOOM's and MPT's ALiBi (``attention.alibi``, ``embedding_norm``). Each tiny example
builds the graph the HF frontend builds from the matching config.json, runs and generates;
the full-size examples' parameter counts are the checkpoints'; mistakes are SpecErrors at
the key."""
from pathlib import Path

import pytest

from frontends import load_spec, yaml_spec
from irc.analysis import analyze
from irc.errors import SpecError
from irc.interpreter import generate
from tests.frontends.yaml_checks import (assert_hf_builds, assert_refused_and_not_compiled, assert_tiny_example,
                                         without_meta)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIGS = {  # tiny example -> the config.json of the same model
    "tiny-granite-3.3-8b.yaml": {"model_type": "granite", "vocab_size": 256, "hidden_size": 64,
                                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                 "intermediate_size": 160, "rms_norm_eps": 1e-5, "rope_theta": 1e7,
                                 "tie_word_embeddings": True, "embedding_multiplier": 12.0,
                                 "attention_multiplier": 0.0625, "residual_multiplier": 0.22,
                                 "logits_scaling": 16.0},
    "tiny-smollm3-3b.yaml": {"model_type": "smollm3", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 4,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 160,
                             "rms_norm_eps": 1e-6, "rope_theta": 5e6, "tie_word_embeddings": True,
                             "no_rope_layer_interval": 4},
    "tiny-olmo-2-7b.yaml": {"model_type": "olmo2", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 160,
                            "rms_norm_eps": 1e-6, "rope_theta": 5e5},
    "tiny-gpt2.yaml": {"model_type": "gpt2", "vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4,
                       "n_positions": 128, "n_inner": 256, "layer_norm_epsilon": 1e-5,
                       "activation_function": "gelu_new"},
    "tiny-phi-2.yaml": {"model_type": "phi", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "intermediate_size": 256, "layer_norm_eps": 1e-5,
                        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                            "partial_rotary_factor": 0.5}},
    "tiny-gpt-oss-20b.yaml": {"model_type": "gpt_oss", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
                              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                              "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
                              "sliding_window": 8, "max_position_embeddings": 256},
    "tiny-bloom-7b1.yaml": {"model_type": "bloom", "vocab_size": 256, "hidden_size": 64, "n_layer": 2, "n_head": 4},
    "tiny-mpt-7b.yaml": {"model_type": "mpt", "vocab_size": 256, "d_model": 64, "n_layers": 2, "n_heads": 4},
    "tiny-gemma-3n-e4b.yaml": {"model_type": "gemma3n_text", "vocab_size": 256, "hidden_size": 64,
                               "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
                               "head_dim": 16, "intermediate_size": [128, 96, 128, 64, 128, 128], "laurel_rank": 8,
                               "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": 200,
                               "altup_num_inputs": 3, "altup_active_idx": 1, "num_kv_shared_layers": 2,
                               "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"] * 3,
                               "activation_sparsity_pattern": [0.95, 0.5, 0.0, 0.0, 0.9, 0.0],
                               "rope_parameters": {
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                   "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0}}},
}
# parameters of the released checkpoints as their model pages give them (billions, rounded);
# gpt-oss-20b's is transformers' count of its config (tests/frontends/test_hf_gpt_oss.py)
PARAMS = {"granite-3.3-8b.yaml": 8.17, "smollm3-3b.yaml": 3.08, "olmo-2-7b.yaml": 7.3, "gpt-oss-20b.yaml": 20.91,
          "gemma-3n-e4b.yaml": 6.84, "bloom-7b1.yaml": 7.07, "mpt-7b.yaml": 6.65}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_tiny_example_is_the_hf_graph_and_generates(tmp_path, name):
    assert_tiny_example(tmp_path, EXAMPLES / name, CONFIGS[name])


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_the_full_size_examples_count_the_checkpoints_parameters(name):
    assert round(analyze(load_spec(EXAMPLES / name))["params_total"] / 1e9, 2) == PARAMS[name]


def test_nope_layers_need_rope_and_real_layers():
    base = ("model: {name: t, vocab_size: 16, d_model: 16, n_layers: 2, mlp: {kind: swiglu, d_ff: 32},\n"
            "  attention: {kind: gqa, n_heads: 2, n_kv_heads: 1, %s}}\n")
    with pytest.raises(SpecError, match=r"<string>:2:.*model\.attention\.nope_layers: layer 2 is past the last"):
        yaml_spec.loads(base % "rope: {base: 10000}, nope_layers: [2]")
    with pytest.raises(SpecError, match=r"nope_layers: NoPE layers need a rope"):
        yaml_spec.loads(base % "nope_layers: [0]")
    graph = yaml_spec.loads(base % "rope: {base: 10000}, nope_layers: [1]")
    assert [n.outputs[0].name for n in graph.nodes if n.op == "rope"] == ["layers.0.q_rope", "layers.0.k_rope"]


def test_cohere_per_head_layer_norms_in_yaml_are_the_dsl_graph(tmp_path):
    """``attention.qk_norm: layer`` (Cohere's q/k LayerNorm per head, a weight per head) builds
    the graph ``Layer.attention(qk_norm="layer")`` builds: the tiny Llama-3 with it on."""
    text = (EXAMPLES / "tiny-llama3.yaml").read_text()
    text = text.replace("    head_dim: 16\n", "    head_dim: 16\n    qk_norm: layer\n")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(text)
    from_yaml = load_spec(spec)
    assert from_yaml.params["layers.0.attn.q_norm"].shape == (4, 16)
    assert from_yaml.params["layers.1.attn.k_norm"].shape == (2, 16)
    source = (EXAMPLES / "tiny_llama3_dsl.py").read_text()
    assert "head_dim=16," in source
    program = tmp_path / "tiny_dsl.py"
    program.write_text(source.replace("head_dim=16,", "head_dim=16, qk_norm=\"layer\", qk_norm_eps=1e-5,"))
    assert without_meta(load_spec(program)) == without_meta(from_yaml)
    tokens, _ = generate(from_yaml, [1, 2, 3], 4)
    assert len(tokens) == 4


def test_gpt_oss_expert_keys_belong_to_the_clamped_swiglu():
    text = (EXAMPLES / "tiny-gpt-oss-20b.yaml").read_text()
    with pytest.raises(SpecError, match=r"model.moe.swiglu_alpha: applies to activation swiglu_oai only"):
        yaml_spec.loads(text.replace("activation: swiglu_oai", "activation: silu"))
    with pytest.raises(SpecError, match=r"activation"):
        yaml_spec.loads(text.replace("activation: swiglu_oai", "activation: relu"))
    graph = yaml_spec.loads(text.replace("sinks: true", "sinks: false"))
    assert "layers.0.attn.sinks" not in graph.params


def test_gemma_3n_e4b_is_transformers_default_config_exactly(tmp_path):
    """transformers' Gemma3nTextConfig defaults are E4B's text model: the YAML builds the
    graph the HF frontend builds from them, 6,835,235,568 params (transformers' meta count,
    tests/frontends/test_hf_gemma3n.py), 20 of 35 layers holding a cache."""
    transformers = pytest.importorskip("transformers")
    graph = load_spec(EXAMPLES / "gemma-3n-e4b.yaml")
    config = {**transformers.Gemma3nTextConfig().to_dict(), "dtype": "bfloat16"}
    assert_hf_builds(tmp_path, config, graph)
    assert analyze(graph)["params_total"] == 6_835_235_568
    assert len([v for v in graph.inputs if v.name.startswith("past_key_values.")]) == 2 * 20


def test_gemma3n_section_changes_the_graph_where_it_says():
    text = (EXAMPLES / "tiny-gemma-3n-e4b.yaml").read_text()
    graph = yaml_spec.loads(text)
    assert [v.name for v in graph.inputs if v.name.endswith(".key")] == [f"past_key_values.{i}.key" for i in range(4)]
    assert graph.params["altup_projections.1"].shape == (64, 64) and "altup_projections.2" not in graph.params
    assert graph.params["layers.3.mlp.w_gate"].shape == (64, 64)
    assert graph.params["embed_per_layer"].shape == (200, 6 * 16)
    unshared = yaml_spec.loads(text.replace("kv_shared_layers: 2", "kv_shared_layers: 0"))
    assert len([v for v in unshared.inputs if v.name.endswith(".key")]) == 6
    dense = yaml_spec.loads(text.replace("[0.95, 0.5, 0.0, 0.0, 0.9, 0.0]", "[0.0, 0.0, 0.0, 0.0, 0.0, 0.0]"))
    assert not any(n.outputs[0].name.endswith("mlp_gate_sparse") for n in dense.nodes)
    assert sum(n.outputs[0].name.endswith("mlp_gate_sparse") for n in graph.nodes) == 3
    unscaled = yaml_spec.loads(text.replace("correct_scale: true", "correct_scale: false"))
    assert not any(name.endswith("correct_output_scale") for name in unscaled.params)


GEMMA3N_MISTAKES = [  # (replace, with, the message's start)
    ("active_idx: 1", "active_idx: 3", r"model\.gemma3n\.altup\.active_idx: 3 is not one of the 3 streams"),
    ("kv_shared_layers: 2", "kv_shared_layers: 6", r"model\.gemma3n\.kv_shared_layers: 6 shared layers of 6"),
    ("window_pattern: [local, global]", "window_pattern: [local, local, local, local, local, global]",
     r"model\.gemma3n\.kv_shared_layers: layer 5 \(global\) reuses the K/V of an earlier global"),
    ("0.9, 0.0]", "0.9]", r"model\.gemma3n\.activation_sparsity: 5 entries for 6 layers"),
    ("0.9, 0.0]", "1.0, 0.0]", r"model\.gemma3n\.activation_sparsity\[4\]: sparsity 1.0 is outside \[0, 1\)"),
    ("d_ff: [128, 96,", "d_ff: [96,", r"model\.gemma3n\.d_ff: 5 entries for 6 layers"),
    ("laurel_rank: 8", "laurel_rank: 0", r"model\.gemma3n\.laurel_rank: "),
    ("laurel_rank: 8", "laurel_rnk: 8", r"model\.gemma3n\.laurel_rnk: unknown key"),
    ("    per_layer_input: {hidden_size: 16, vocab_size: 200}\n", "", r"model\.gemma3n\.per_layer_input: missing"),
    ("qk_norm: true", "qk_norm: false", r"model\.attention\.qk_norm: Gemma-3n norms q, k and v per head"),
    ("    window_pattern: [local, global]\n", "", r"model\.attention\.window_pattern: Gemma-3n layers are local or"),
    ("scale: 1.0", "scale: 0.25", r"model\.attention\.scale: Gemma-3n attention is unscaled"),
    ("sandwich: true", "sandwich: false", r"model\.norm\.sandwich: Gemma-3n norms each branch"),
    ("eps: 1.0e-6,", "eps: 1.0e-6, offset: 1.0,", r"model\.norm\.offset: Gemma-3n norm weights are plain"),
    ("kind: geglu,", "kind: gelu,", r"model\.mlp\.kind: Gemma-3n MLP is GeGLU"),
    ("    qk_norm: true\n", "    qk_norm: true\n    softcap: 50.0\n", r"model\.attention\.softcap: does not apply"),
    ("  tied_embeddings: true\n", "  tied_embeddings: true\n  residual_scale: 0.5\n",
     r"model\.residual_scale: does not apply beside model\.gemma3n"),
]


@pytest.mark.parametrize("old, new, message", GEMMA3N_MISTAKES)
def test_gemma3n_mistakes_are_spec_errors_at_the_key(tmp_path, capsys, old, new, message):
    """One SpecError at the key's file:line; ``irc compile`` exits 2 and writes nothing."""
    text = (EXAMPLES / "tiny-gemma-3n-e4b.yaml").read_text()
    assert text.count(old) == 1
    assert_refused_and_not_compiled(tmp_path, text.replace(old, new), message)
