"""onnxruntime-genai 0.18 runs the folders irc writes for the families of
``frontends.hf.families_llama_like``, ``families_olmo``, ``families_classic`` and ``families_cohere`` (their tiny twins are cases of ``test_hf_models``, which
holds them against transformers through the interpreter and both ONNX targets) and
generates transformers' greedy tokens; and their config.json mistakes are one SpecError
naming the key."""
import json

import pytest

from frontends import load_spec
from tests.frontends.refusals import pointed_line, refused
from tests.frontends.test_hf_models import NEW_TOKENS, hf_batch_greedy, models, prompts  # noqa: F401 (fixtures)
from tests.frontends.test_hf_ssm_onnx import assert_genai_generates, emit_genai_folder

torch = pytest.importorskip("torch")
FAMILIES = ["gemma-geglu-tied", "granite-multipliers", "granitemoe-top2", "smollm3-nope-list-window",
            "ministral-windows", "olmo2-post-norms", "olmo3-windows", "olmoe-top2", "starcoder2-biases-window",
            "gpt2-learned-positions", "gpt-neox-parallel", "phi-parallel-head-bias", "cohere-parallel-logit-scale",
            "cohere-qk-norm", "cohere2-nope-global", "glm4-sandwich-partial-rotary", "falcon-7b-multi-query",
            "falcon-40b-new-arch-biases", "olmo-plain-norms-clip", "ministral3-llama4-scale-yarn", "opt-relu-tied",
            "bloom-alibi-6-heads", "mpt-alibi-clip-scale", "falcon-alibi-sequential",
            "llama4-chunked-moe", "llama4-top2-full-no-qk-norm", "nanochat-gqa-softcap",
            # issue 40: aliases
            "exaone-original-names", "internlm3-head-dim-128", "iquestcoder-mqa", "helium-interleaved-qkv-bias",
            "seed-oss-qkv-out-bias", "arcee-relu2-mlp-bias", "ernie4-5-interleaved-tied", "cwm-windows-llama3",
            # families_gpt_kin
            "gpt-bigcode-multi-query", "gpt-bigcode-mha-unscaled-exact-gelu", "gptj-interleaved-partial-rotary",
            "gptj-tied-whole-head-rotary", "codegen-qkv-groups", "gpt-neo-local-window", "openai-gpt-post-norm",
            "openai-gpt-relu", "biogpt-scaled-embedding",
            # families_ln_kin
            "stablelm-qk-layernorm-qkv-bias", "stablelm-tied-parallel-half-rotary", "persimmon-shared-qk-layernorm",
            "persimmon-tied-no-qk-norm", "glm-partial-interleaved-rotary", "nemotron-layernorm1p",
            "nemotron-biases-wide-heads", "vaultgemma-softcaps-window", "granite-swa-sinks-nope-layer",
            "granitemoe-swa-shared-mlp",
            # families_moe_2026
            "glm4-moe-groups-qkv-bias-partial", "glm4-moe-qk-norm-all-moe", "minimax-m2-full-qk-norm-rotary-dim",
            "ernie4-5-moe-shared-interleaved", "ernie4-5-moe-every-2nd-no-shared", "dots1-windows-v3-moe",
            "exaone4-post-norms-nope-global", "exaone4-no-window-rope-everywhere",
            # families_2026 (its MLA twins, youtu, minicpm3 and axk1, are not: genai allocates one head size)
            "hyperclovax-post-norms-mup", "granitemoeshared-shared-expert", "mellum-windows-typed-rope",
            "solar-open-groups-qkv-bias", "param2moe-bailing-partial-rotary", "hy-v3-qk-norm-shared",
            "aria-text-shared-experts", "minicpm5-moe-gated-attention", "afmoe-gate-nope-mup",
            "flint-sinks-sigmoid-shared", "flex-olmo-post-norms-moe", "jais2-layernorm-relu2-biases",
            # families_hunyuan
            "hunyuan-dense-alpha-rope-biases", "hunyuan-moe-topk-list-shared-mlp",
            # families_2026b
            "cohere-compass-nope-full-rope-sliding", "cohere-compass-linear-rope-untied",
            "cohere2-moe-dense-prefix-average", "cohere2-moe-sigmoid-rms-sum", "dbrx-clip-qkv-top2-renorm",
            "dbrx-mqa-unnormalised",
            # families_moe_2026c / 2026d (not glm4-moe-lite-*'s MLA nor mimo-v2-flash-*'s value heads of their own
            # width and per-layer kv heads: genai allocates one head size)
            "sarvam-moe-qkv-bias-groups", "exaone-moe-nope-global-groups", "exaone-moe-types-window-3-two-shared-tied",
            "beam-gate-nope-scale-depth-residuals", "beam-biases-linear-rope-default-types",
            # families_xglm
            "xglm-gelu-tied-scaled", "xglm-relu-untied-pad-row",
            # families_classic2
            "bitnet-sub-norms-gqa", "bitnet-biases-mha-tied", "ctrl-sinusoidal-head-bias", "ctrl-untied-final-eps",
            "gpt-neox-japanese-half-rotary", "gpt-neox-japanese-untied-gelu-new", "modernbert-decoder-windows-tied",
            "modernbert-decoder-biases-untied-types",
            # families_act_2026
            "apertus-xielu-llama3-rope", "apertus1p5-text-pruned-head", "laguna-head-gates-windows-moe",
            "kolibri1-sandwich-nope-full-window",  # not DiffLlama: its values are 2x the keys' width, genai has one
            # families_zamba (genai's RecurrentState carries the Mamba states beside the shared block's caches)
            "zamba-two-heads-gqa-tied", "zamba-one-head-untied-silu",
            # families_loops (one KV cache per unrolled layer invocation)
            "hrm-text-two-cycles", "hrm-text-two-layer-stacks-tied",
            # families_moa
            "jetmoe-moa-top2-gqa", "jetmoe-mqa-all-experts-untied",
            # families_doge
            "doge-dma-gqa", "doge-dma-mqa-window-tied",
            # families_ergo
            "ergo-dense-then-moe-scaled-full", "ergo-top1-all-moe-types-listed"]


@pytest.mark.parametrize("name", FAMILIES)
def test_genai_generates_transformers_tokens(models, hf_batch_greedy, tmp_path, name):  # noqa: F811
    _, folder = models(name)
    emit_genai_folder(load_spec(folder), tmp_path, "onnx-ort")
    assert_genai_generates(tmp_path, hf_batch_greedy(name)[0].tolist())


SMALL = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}
BAD = [  # (config.json, the key named, a fragment of the message)
    ({"model_type": "smollm3", **SMALL, "no_rope_layers": [1, 1, 0]}, "no_rope_layers", "expected 2 entries"),
    ({"model_type": "smollm3", **SMALL, "no_rope_layers": [1, 2]}, "no_rope_layers", "of 0 (NoPE) or 1"),
    ({"model_type": "ministral", **SMALL, "layer_types": ["sliding_attention"]}, "layer_types", "1 entries for 2"),
    ({"model_type": "gemma", **SMALL, "hidden_act": "relu"}, "hidden_act", '"relu" is not supported'),
    ({"model_type": "granite", **SMALL, "mlp_bias": True}, "mlp_bias", "no such bias"),
    ({"model_type": "granitemoe", **SMALL, "num_local_experts": 2, "num_experts_per_tok": 3},
     "num_experts_per_tok", "top_k 3 exceeds 2 experts"),
    ({"model_type": "granite", **SMALL, "logits_scaling": 0}, "logits_scaling", "positive"),
    ({"model_type": "olmo2", **SMALL, "clip_qkv": 8.0}, "clip_qkv", "do not clamp"),
    ({"model_type": "olmo3", **SMALL, "layer_types": ["sliding_attention", "global"]}, "layer_types", "global"),
    ({"model_type": "starcoder2", **SMALL, "hidden_act": "silu"}, "hidden_act", '"silu" is not supported'),
    ({"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 5}, "n_head", "not divisible by 5 heads"),
    ({"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "scale_attn_by_inverse_layer_idx": True},
     "scale_attn_by_inverse_layer_idx", "irc scales every layer alike"),
    ({"model_type": "phi", **SMALL, "qk_layernorm": True}, "qk_layernorm", "not supported"),
    ({"model_type": "gpt_neox", **SMALL, "hidden_act": "relu"}, "hidden_act", '"relu" is not supported'),
    ({"model_type": "bloom", "hidden_size": 32, "n_layer": 2, "n_head": 4,
      "apply_residual_connection_post_layernorm": True}, "apply_residual_connection_post_layernorm", "true is not"),
    ({"model_type": "mpt", "d_model": 32, "n_layers": 2, "n_heads": 4, "attn_config": {"alibi_bias_max": 16}},
     "attn_config.alibi_bias_max", "16 is not supported"),
    ({"model_type": "mpt", "d_model": 32, "n_layers": 2, "n_heads": 4,
      "attn_config": {"attn_type": "multiquery_attention"}}, "attn_config.attn_type", "multi-head"),
    ({"model_type": "mpt", "d_model": 32, "n_layers": 2, "n_heads": 4, "attn_config": 3}, "attn_config",
     "an object"),
    ({"model_type": "mpt", "d_model": 32, "n_layers": 2, "n_heads": 4, "expansion_ratio": 3}, "expansion_ratio",
     "4·d"),
    ({"model_type": "nanochat", **SMALL, "hidden_act": "silu"}, "hidden_act", '"silu" is not supported'),
    # refused on purpose (frontends.hf.refused): the message says why
    ({"model_type": "gemma4_assistant", **SMALL}, "model_type", "speculative-decoding drafter"),
    ({"model_type": "blt", **SMALL}, "model_type", "entropy model"),
    ({"model_type": "falcon", **SMALL, "new_decoder_architecture": True, "num_kv_heads": 3}, "num_kv_heads",
     "not divisible by 3 kv heads"),
    ({"model_type": "opt", **SMALL, "do_layer_norm_before": False}, "do_layer_norm_before", "OPT-350m"),
    ({"model_type": "opt", **SMALL, "word_embed_proj_dim": 16}, "word_embed_proj_dim", "project_in"),
    ({"model_type": "opt", **SMALL, "layer_norm_elementwise_affine": False}, "layer_norm_elementwise_affine",
     "false is not supported"),
    ({"model_type": "opt", **SMALL, "_remove_final_layer_norm": True}, "_remove_final_layer_norm",
     "true is not supported"),
    ({"model_type": "opt", **SMALL, "activation_function": "silu"}, "activation_function", '"silu" is not supported'),
    ({"model_type": "cohere", **SMALL, "attention_bias": True}, "attention_bias", "no such bias"),
    ({"model_type": "cohere2", **SMALL, "layer_types": ["sliding_attention"] * 3}, "layer_types", "3 entries for 2"),
    # issue 40: aliases
    ({"model_type": "exaone", **SMALL, "activation_function": "gelu"}, "activation_function",
     '"gelu" is not supported'),
    ({"model_type": "exaone", **SMALL, "num_layers": 3, "num_hidden_layers": 2, "mlp_bias": True},
     "mlp_bias", "no such bias"),
    ({"model_type": "internlm3", **SMALL, "qkv_bias": True, "bias": True}, "bias", "no such bias"),
    ({"model_type": "iquestcoder", **SMALL, "use_sliding_window": True}, "use_sliding_window", "no sliding window"),
    ({"model_type": "iquestcoder", **SMALL, "clip_qkv": 8.0}, "clip_qkv", "does not clamp"),
    ({"model_type": "gpt-sw3", "n_embd": 32, "n_layer": 2, "n_head": 5}, "n_head", "not divisible by 5 heads"),
    ({"model_type": "sarvam_mla", **SMALL, "num_key_value_heads": 4, "num_experts": 4, "num_local_experts": 6},
     "num_local_experts", "disagrees with num_experts"),
    ({"model_type": "sarvam_mla", **SMALL, "num_key_value_heads": 4, "scoring_func": "softmax"}, "scoring_func",
     '"softmax" is not supported'),
    ({"model_type": "helium", **SMALL, "head_dim": 16}, "head_dim", "4 heads x head_dim 16 is not hidden_size 32"),
    ({"model_type": "helium", **SMALL, "head_dim": 8, "partial_rotary_factor": 0.5}, "partial_rotary_factor",
     "partial rotary width"),
    ({"model_type": "arcee", **SMALL, "hidden_act": "silu"}, "hidden_act", '"silu" is not supported'),
    ({"model_type": "ernie4_5", **SMALL, "use_bias": True}, "use_bias", "no such bias"),
    ({"model_type": "cwm", **SMALL, "layer_types": ["sliding_attention"] * 3}, "layer_types", "3 entries for 2"),
    # families_gpt_kin
    ({"model_type": "gpt_bigcode", "n_embd": 32, "n_layer": 2, "n_head": 4, "multi_query": False,
      "add_cross_attention": True}, "add_cross_attention", "without cross-attention"),
    ({"model_type": "gpt_bigcode", "n_embd": 32, "n_layer": 2, "n_head": 4, "activation_function": "relu"},
     "activation_function", '"relu" is not supported'),
    ({"model_type": "gptj", "n_embd": 32, "n_layer": 2, "n_head": 4, "rotary_dim": 16}, "rotary_dim",
     "16 exceeds head_dim 8"),
    ({"model_type": "gptj", "n_embd": 32, "n_layer": 2, "n_head": 4, "rotary_dim": 3}, "rotary_dim", "even dimension"),
    ({"model_type": "codegen", "n_embd": 30, "n_layer": 2, "n_head": 6, "rotary_dim": 4}, "n_embd",
     "30 is not divisible by 4"),
    ({"model_type": "gpt_neo", "hidden_size": 32, "num_layers": 2, "num_heads": 4,
      "attention_types": [[["global", "local"], 2]]}, "attention_types", "gives 4 layers for 2"),
    ({"model_type": "gpt_neo", "hidden_size": 32, "num_layers": 2, "num_heads": 4,
      "attention_types": [[["global", "sparse"], 1]]}, "attention_types", '"sparse" is not supported'),
    ({"model_type": "gpt_neo", "hidden_size": 32, "num_layers": 2, "num_heads": 4,
      "attention_types": [["global", 2]]}, "attention_types", "expected [kinds, repeats]"),
    ({"model_type": "openai-gpt", "n_embd": 32, "n_layer": 2, "n_head": 4, "afn": "silu"}, "afn",
     '"silu" is not supported'),
    ({"model_type": "biogpt", **SMALL, "hidden_act": "silu"}, "hidden_act", '"silu" is not supported'),
    # families_ln_kin
    ({"model_type": "stablelm", **SMALL, "hidden_act": "gelu"}, "hidden_act", '"gelu" is not supported'),
    ({"model_type": "stablelm", **SMALL, "head_dim": 16}, "head_dim", "16 is not hidden_size / heads (8)"),
    ({"model_type": "persimmon", **SMALL, "hidden_act": "gelu"}, "hidden_act", '"gelu" is not supported'),
    ({"model_type": "glm", **SMALL, "hidden_act": "gelu"}, "hidden_act", '"gelu" is not supported'),
    ({"model_type": "nemotron", **SMALL, "hidden_act": "silu"}, "hidden_act", '"silu" is not supported'),
    ({"model_type": "nemotron", **SMALL, "head_dim": 6, "partial_rotary_factor": 0.5}, "partial_rotary_factor",
     "rotates 3 of 6 dims"),
    ({"model_type": "granite_swa", **SMALL, "partial_rotary_factor": 0.5}, "partial_rotary_factor",
     "0.5 is not supported"),
    ({"model_type": "granite_swa", **SMALL, "layer_rope_theta": [10000.0, -1]}, "layer_rope_theta",
     "expected 2 numbers >= 0"),
    ({"model_type": "granite_swa", **SMALL, "layer_types": ["sliding_attention"] * 3}, "layer_types",
     "3 entries for 2"),
    ({"model_type": "granitemoe_swa", **SMALL, "num_local_experts": 2, "num_experts_per_tok": 3},
     "num_experts_per_tok", "top_k 3 exceeds 2 experts"),
    # families_moe_2026
    *[({"model_type": model_type, **SMALL, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "moe_intermediate_size": 16, **setting}, key, fragment) for model_type, setting, key, fragment in (
        ("glm4_moe", {"num_experts_per_tok": 5}, "num_experts_per_tok", "top_k 5 exceeds 4 experts (n_routed_experts)"),
        ("glm4_moe", {"hidden_act": "gelu"}, "hidden_act", '"gelu" is not supported'),
        ("glm4_moe", {"n_group": 3, "topk_group": 1}, "n_group", "do not split into 3 groups"),
        ("dots1", {"attention_bias": True}, "attention_bias", "o_proj as well"))],
    *[({"model_type": "minimax_m2", **SMALL, "num_local_experts": 4, "num_experts_per_tok": 2, key: value}, key,
       "refuses to guess") for key, value in (("use_qk_norm", False), ("qk_norm_type", "per_head"),
                                              ("scoring_func", "softmax"), ("use_routing_bias", False),
                                              ("shared_intermediate_size", 64), ("attn_type_list", [0, 1]))],
    ({"model_type": "minimax_m2", **SMALL, "head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2,
      "rotary_dim": 3}, "rotary_dim", "rotates 3 of 8 dims"),
    ({"model_type": "ernie4_5_moe", **SMALL, "moe_num_experts": 4, "moe_k": 2, "use_bias": True}, "use_bias",
     "no such bias"),
    ({"model_type": "ernie4_5_moe", **SMALL, "moe_num_experts": 4, "moe_k": 2, "partial_rotary_factor": 0.5},
     "partial_rotary_factor", "rotates the whole head"),
    ({"model_type": "ernie4_5_moe", **SMALL, "moe_num_experts": 4, "moe_k": 2, "moe_norm_min": 0.9}, "moe_norm_min",
     "top_k / experts = 0.5"),
    ({"model_type": "ernie4_5_moe", **SMALL, "moe_num_experts": 4, "moe_k": 2, "num_nextn_predict_layers": 2},
     "num_nextn_predict_layers", "one MTP layer"),
    ({"model_type": "ernie4_5_moe", **SMALL, "moe_num_experts": 4, "moe_k": 2, "moe_use_aux_free": False},
     "moe_use_aux_free", "refuses to guess"),
    ({"model_type": "ernie4_5_moe", **SMALL, "num_experts": 4, "moe_k": 6}, "moe_k",
     "top_k 6 exceeds 4 experts (moe_num_experts)"),
    ({"model_type": "ernie4_5_moe", **SMALL, "moe_num_experts": [4, 4], "moe_k": 2}, "moe_num_experts",
     "expected a positive integer"),
    ({"model_type": "exaone4", **SMALL, "sliding_window": None}, "sliding_window", "cannot derive the layer types"),
    ({"model_type": "exaone4", **SMALL, "sliding_window_pattern": "LLLG"}, "sliding_window_pattern",
     '"LLLG" is not supported'),
    ({"model_type": "exaone4", **SMALL, "sliding_window": None,
      "layer_types": ["sliding_attention", "full_attention"]}, "sliding_window", "has sliding_attention layers"),
    # families_2026
    ({"model_type": "hyperclovax", **SMALL, "mlp_bias": True}, "mlp_bias", "no such bias"),
    ({"model_type": "mellum", **SMALL, "mlp_layer_types": ["sparse"]}, "mlp_layer_types", "1 entries for 2"),
    ({"model_type": "solar_open", **SMALL, "partial_rotary_factor": 0.5}, "partial_rotary_factor",
     "partial rotary width"),
    ({"model_type": "hy_v3", **SMALL, "num_shared_experts": 0}, "num_shared_experts", "refuses to guess"),
    ({"model_type": "aria_text", **SMALL, "hidden_act": "gelu"}, "hidden_act", '"gelu" is not supported'),
    ({"model_type": "axk1", **SMALL, "num_key_value_heads": 4, "mlp_layer_types": ["dense", "moe"]},
     "mlp_layer_types", '"moe" is not supported'),
    ({"model_type": "minicpm5_moe", **SMALL, "hidden_act": "gelu"}, "hidden_act", '"gelu" is not supported'),
    ({"model_type": "afmoe", **SMALL, "attention_bias": True}, "attention_bias", "no such bias"),
    ({"model_type": "flint", **SMALL, "hidden_act": "relu"}, "hidden_act", '"relu" is not supported'),
    ({"model_type": "jais2", **SMALL, "hidden_act": "silu"}, "hidden_act", '"silu" is not supported'),
    # families_hunyuan
    *[({"model_type": "hunyuan_v1_dense", **SMALL, "head_dim": 8, **setting}, key, fragment)
      for setting, key, fragment in (
        ({"head_dim": None}, "head_dim", "missing or null"),
        ({"hidden_act": "gelu"}, "hidden_act", '"gelu" is not supported'),
        ({"rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "partial_rotary_factor": 0.5}},
         "rope_scaling.partial_rotary_factor", "partial rotary width"),
        ({"rope_scaling": {"type": "dynamic", "alpha": -2.0, "factor": 1.0}}, "rope_scaling.alpha",
         "expected a positive number"),
        ({"head_dim": 2, "rope_scaling": {"type": "dynamic", "alpha": 1000.0, "factor": 1.0}}, "head_dim",
         "head_dim / (head_dim - 2)"),
        ({"use_qk_norm": False}, "use_qk_norm", "refuses to guess"),
        ({"use_cla": True}, "use_cla", "refuses to guess"),
        ({"use_mla": True}, "use_mla", "refuses to guess"))],
    *[({"model_type": "hunyuan_v1_moe", **SMALL, "head_dim": 8, "num_experts": 4, "moe_topk": 2, **setting}, key,
       fragment) for setting, key, fragment in (
        ({"moe_topk": [2, 1]}, "moe_topk", "varies over the layers ([2, 1])"),
        ({"moe_topk": [2]}, "moe_topk", "1 entries for 2 layers"),
        ({"num_experts": [4, 4]}, "num_experts", "expected a positive integer"),
        ({"num_experts_per_tok": 5}, "num_experts_per_tok", "top_k 5 exceeds 4 experts (num_experts)"),
        ({"use_mixed_mlp_moe": False}, "use_mixed_mlp_moe", "refuses to guess"),
        ({"num_shared_expert": [2, 2]}, "num_shared_expert", "refuses to guess"))],
    # families_2026b
    *[({"model_type": "cohere_compass_text", **SMALL, **setting}, key, fragment) for setting, key, fragment in (
        ({"rope_parameters": {"sliding_attention": None}}, "rope_parameters", "has no full_attention entry"),
        ({"rope_parameters": {"full_attention": 3}}, "rope_parameters.full_attention", "an object or null"),
        ({"rope_parameters": {"full_attention": {"rope_type": "default"}}}, "rope_parameters.full_attention",
         "from the layer type's entry only"),
        ({"rope_parameters": {"full_attention": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}}},
         "rope_parameters.full_attention.partial_rotary_factor", "partial rotary width"),
        ({"rope_parameters": {"full_attention": None}, "attention_bias": True}, "attention_bias", "no such bias"))],
    *[({"model_type": "cohere2_moe", **SMALL, "head_dim": 8, **setting}, key, fragment)
      for setting, key, fragment in (
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling", "ignores rope_scaling"),
        ({"rope_parameters": {"rope_type": "default"}}, "rope_parameters", "has no rope_theta"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor", "partial rotary width"),
        ({"expert_selection_fn": "relu"}, "expert_selection_fn", '"relu" is not supported'),
        ({"shared_expert_combination_strategy": "max"}, "shared_expert_combination_strategy", '"max" is not'),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok", "top_k 9 exceeds 8 experts"),
        ({"mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types", '"moe" is not supported'),
        ({"hidden_act": "gelu"}, "hidden_act", '"gelu" is not supported'))],
    *[({"model_type": "dbrx", "vocab_size": 64, "d_model": 32, "n_heads": 4, "n_layers": 2, **setting}, key, fragment)
      for setting, key, fragment in (
        ({"attn_config": {"rope_theta": 500000}}, "attn_config.rope_theta", "refuses to guess"),
        ({"attn_config": {"kv_n_heads": 3}}, "attn_config.kv_n_heads", "not divisible by 3 kv heads"),
        ({"ffn_config": {"moe_normalize_expert_weights": 2.0}}, "ffn_config.moe_normalize_expert_weights",
         "2.0 is not supported"),
        ({"ffn_config": {"ffn_act_fn": {"name": "gelu"}}}, "ffn_config.ffn_act_fn", "SwiGLU"),
        ({"ffn_config": {"moe_top_k": 5}}, "ffn_config.moe_top_k", "top_k 5 exceeds 4 experts"),
        ({"tie_word_embeddings": True}, "tie_word_embeddings", "DbrxConfig refuses"),
        ({"hidden_size": 64}, "hidden_size", "give d_model"),
        ({"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}},
         "rope_parameters.partial_rotary_factor", "partial rotary width"))],
    # families_act_2026
    ({"model_type": "apertus", **SMALL, "hidden_act": "silu"}, "hidden_act", "Apertus' MLP here"),
    ({"model_type": "apertus1p5_text", **SMALL, "output_vocab_size": 32, "tie_word_embeddings": True},
     "tie_word_embeddings", "pruned LM head"),
    ({"model_type": "apertus1p5_text", **SMALL, "output_vocab_size": 65}, "output_vocab_size", "more than vocab_size"),
    ({"model_type": "laguna", **SMALL, "moe_router_logit_softcapping": 30.0}, "moe_router_logit_softcapping",
     "no logit soft-cap"),
    ({"model_type": "laguna", **SMALL, "num_attention_heads_per_layer": [4, 3]}, "num_attention_heads_per_layer",
     "do not group"),
    ({"model_type": "kolibri1", **SMALL, "hidden_act": "gelu"}, "hidden_act", "Kolibri-1's experts"),
    # families_kolibri
    ({"model_type": "kolibri1_1", **SMALL, "head_dim": 8}, "head_dim", "NVFP4 rounds blocks of 16"),
    # families_diff
    ({"model_type": "diffllama", **SMALL, "num_key_value_heads": 1}, "num_key_value_heads", "is odd"),
    # families_moe_2026c / 2026d
    ({"model_type": "glm4_moe_lite", **SMALL, "num_key_value_heads": 4, "attention_bias": True}, "attention_bias",
     "no such bias"),
    ({"model_type": "glm4_moe_lite", **SMALL, "mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types",
     '"moe" is not supported'),
    ({"model_type": "exaone_moe", **SMALL, "num_experts": 2, "num_experts_per_tok": 3}, "num_experts_per_tok",
     "top_k 3 exceeds 2 experts"),
    ({"model_type": "exaone_moe", **SMALL, "sliding_window_pattern": "LLG"}, "sliding_window_pattern",
     "give layer_types"),
    ({"model_type": "mimo_v2_flash", **SMALL, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
     "rope_parameters", "per layer type"),
    ({"model_type": "mimo_v2_flash", **SMALL, "head_dim": 9}, "head_dim", "an odd number"),
    ({"model_type": "beam", **SMALL, "hidden_act": "gelu"}, "hidden_act", "SwiGLU"),
    ({"model_type": "beam", **SMALL, "rope_parameters": {"sliding_attention": None}}, "rope_parameters",
     "has no full_attention entry"),
    ({"model_type": "longcat_flash", **SMALL, "num_layers": 1, "head_dim": 32}, "head_dim", "not qk_rope_head_dim"),
    ({"model_type": "longcat_flash", **SMALL, "num_layers": 1, "router_bias": True}, "router_bias",
     "no bias of its own"),
    ({"model_type": "longcat_flash", **SMALL, "num_hidden_layers": 3}, "num_hidden_layers", "not twice num_layers"),
    # families_xglm
    ({"model_type": "xglm", **SMALL, "add_cross_attention": True}, "add_cross_attention", "cross-attention"),
    ({"model_type": "xglm", **SMALL, "pad_token_id": -1}, "pad_token_id", "non-negative row index"),
    ({"model_type": "xglm", **SMALL, "activation_function": "silu"}, "activation_function", "XGLM's MLP here"),
    ({"model_type": "xglm", **SMALL, "num_attention_heads": 5}, "num_attention_heads", "not divisible by 5"),
    # families_classic2
    ({"model_type": "bitnet", **SMALL, "hidden_act": "silu"}, "hidden_act", "squared ReLU"),
    ({"model_type": "bitnet", **SMALL, "partial_rotary_factor": 0.5}, "partial_rotary_factor", "whole head"),
    ({"model_type": "ctrl", "vocab_size": 64, "n_embd": 33, "n_head": 3, "n_layer": 2}, "n_embd", "even size"),
    ({"model_type": "ctrl", "vocab_size": 64, "hidden_size": 32, "num_attention_heads": 5, "num_hidden_layers": 2},
     "num_attention_heads", "not divisible by 5"),
    ({"model_type": "gpt_neox_japanese", **SMALL, "hidden_act": "silu"}, "hidden_act", "GELU's forms"),
    ({"model_type": "modernbert-decoder", **SMALL, "mlp_bias": True}, "mlp_bias", "no biases"),
    ({"model_type": "modernbert-decoder", **SMALL, "num_hidden_layers": 3, "local_attention": 1}, "local_attention",
     "at least 2"),
    ({"model_type": "modernbert-decoder", **SMALL, "head_dim": 16}, "head_dim", "8 wide"),
    # families_zamba
    ({"model_type": "zamba", **SMALL, "hidden_mamba_act": "gelu"}, "hidden_mamba_act", '"gelu" is not supported'),
    ({"model_type": "zamba", **SMALL, "attention_hidden_size": 32}, "attention_hidden_size", "2 x hidden_size"),
    # families_moa
    ({"model_type": "jetmoe", **SMALL, "activation_function": "gelu"}, "activation_function", '"gelu" is not supported'),
    ({"model_type": "jetmoe", **SMALL, "num_local_experts": 2, "num_experts_per_tok": 3}, "num_experts_per_tok",
     "top_k 3 exceeds 2 experts"),
    # families_doge (its CDMoE reads other tokens' router logits: see the module)
    ({"model_type": "doge", **SMALL, "is_moe": True}, "is_moe", "true is not supported"),
    ({"model_type": "doge", **SMALL, "max_position_embeddings": 4096, "keep_window_size": 2048}, "keep_window_size",
     "2048 is not supported"),
    # families_dsa
    ({"model_type": "glm_moe_dsa", **SMALL, "num_key_value_heads": 4, "indexer_types": ["shared", "full"]},
     "indexer_types", "first layer must be \"full\""),
    ({"model_type": "axk2", **SMALL, "num_key_value_heads": 4, "n_group": 2, "topk_group": 1}, "n_group",
     "ungrouped router"),
    ({"model_type": "dots3_note_text", **SMALL, "per_layer_config": {"1": {"rms_norm_eps": 1e-6}}},
     "per_layer_config.1", "overrides of"),
    ({"model_type": "minimax_m3_vl_text", **SMALL, "head_dim": 8, "index_local_blocks": 3, "index_topk_blocks": 2},
     "index_local_blocks", "at most index_topk_blocks"),
    # families_hyper
    ({"model_type": "hy_v4", **SMALL, "n_routed_experts": 4, "num_experts_per_tok": 2,
      "indexer_types": ["shared", "full"]}, "indexer_types", "the first must be \"full\""),
    ({"model_type": "hy_v4", **SMALL, "n_routed_experts": 4, "num_experts_per_tok": 2, "swiglu_limit": 0},
     "swiglu_limit", "expected a positive number"),
    # families_deepseek_v4
    ({"model_type": "deepseek_v4", **SMALL, "head_dim": 16, "o_groups": 3}, "o_groups", "3 groups do not split"),
    ({"model_type": "deepseek_v4", **SMALL, "scoring_func": "sigmoid_logits"}, "scoring_func",
     "irc scores by sqrtsoftplus"),
    # families_qwen4
    ({"model_type": "qwen4_exp_text", **SMALL, "ple_layer_ids": [3], "eos_token_id": 2}, "ple_layer_ids",
     "one-indexed linear_attention layers of 2"),
    ({"model_type": "qwen4_exp", "text_config": {"model_type": "qwen4_exp_text", **SMALL, "num_hidden_layers": 4,
                                                 "indexer_n_heads": 2, "indexer_kv_heads": 2, "indexer_budget": 4,
                                                 "indexer_head_dim": 256, "indexer_compress_ratio": 2}},
     "text_config.indexer_kv_heads", "QSA has one key head"),
    # families_xlstm
    ({"model_type": "xlstm", "vocab_size": 64, "hidden_size": 64, "num_heads": 3, "qk_dim_factor": 0.5},
     "qk_dim_factor", "not a multiple of num_heads 3"),
    ({"model_type": "xlstm", **SMALL, "weight_mode": "fused"}, "weight_mode", '"fused" is not supported'),
    # families_ergo
    ({"model_type": "ergo", **SMALL, "mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types", "each \"dense\""),
    ({"model_type": "ergo", **SMALL, "rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}},
     "rope_parameters.rope_type", "Ergo's default RoPE"),
    # families_zaya
    ({"model_type": "zaya", **SMALL, "head_dim": 8, "num_experts_per_tok": 2}, "num_experts_per_tok", "one expert"),
    ({"model_type": "zaya", **SMALL, "head_dim": 8, "attention_bias": True}, "attention_bias", "without biases"),
    # families_inkling
    ({"model_type": "inkling_text", **SMALL, "n_shared_experts": 0}, "n_shared_experts", "expected a positive integer"),
    ({"model_type": "inkling_text", **SMALL, "layer_types": ["hybrid"]}, "layer_types", "has 1 entries for 2 layers"),
    ({"model_type": "inkling_text", **SMALL, "mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types",
     "Inkling's kinds: dense, sparse"),
    # families_inkling2, families_inkling2_loop
    ({"model_type": "inkling2_text", **SMALL, "scoring_func": "softmax"}, "scoring_func", "sigmoids"),
    ({"model_type": "inkling2_text", **SMALL, "layer_types": ["hybrid", "full_attention"]}, "layer_types",
     "Inkling-2's kinds"),
    ({"model_type": "inkling2_loop_text", **SMALL, "num_hidden_layers": 4, "n_layers_per_attn_res_block": 2,
      "loop_layer_index_start": 1, "loop_layer_index_end": 2}, "loop_layer_index_start", "not a multiple"),
    ({"model_type": "inkling2_loop_text", **SMALL, "num_hidden_layers": 4, "n_layers_per_attn_res_block": 1,
      "loop_config": {"core_start": 1, "core_end": 6}}, "loop_config.core_end", "at most num_hidden_layers 4"),
]


def test_gpt2_reads_the_base_models_names(models, tmp_path):  # noqa: F811
    """openai-community/gpt2's safetensors name the base model's tensors (``h.0.attn.c_attn.weight``,
    ``wte.weight``) and keep the causal-mask buffers (``h.0.attn.bias``): the same graph."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    model, folder = models("gpt2-learned-positions")
    tensors = {name.removeprefix("transformer."): value for name, value in load_file(folder / "model.safetensors").items()}
    tensors.update({f"h.{i}.attn.bias": np.tril(np.ones((1, 1, 64, 64), np.float32)) for i in range(2)})
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    want, got = load_spec(folder), load_spec(tmp_path)
    for name, param in want.params.items():
        np.testing.assert_array_equal(got.params[name].array(), param.array(), err_msg=name)


@pytest.mark.parametrize("name, prefix", [("opt-relu-tied", "model."), ("bloom-alibi", "transformer.")])
def test_the_base_models_names_read_alike(models, tmp_path, name, prefix):  # noqa: F811
    """facebook/opt-* checkpoints, saved from ``OPTModel``, name their tensors without
    ``model.`` (``decoder.layers.0.fc1.weight``), bigscience/bloom-* without ``transformer.``
    (``h.0.self_attention.query_key_value.weight``): the same graph."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    _, folder = models(name)
    tensors = load_file(folder / "model.safetensors")
    assert all(name.startswith(prefix) for name in tensors)
    save_file({name.removeprefix(prefix): value for name, value in tensors.items()}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    want, got = load_spec(folder), load_spec(tmp_path)
    for name, param in want.params.items():
        np.testing.assert_array_equal(got.params[name].array(), param.array(), err_msg=name)


@pytest.mark.parametrize("config, key, fragment", BAD)
def test_bad_configs_name_the_key(tmp_path, config, key, fragment):
    message = refused(tmp_path, key, fragment, config)
    assert f'"{key.split(".")[-1]}"' in pointed_line(tmp_path, message)  # a nested key: its last part
def test_pythias_legacy_rotary_keys_read_as_transformers_reads_them(models, tmp_path):  # noqa: F811
    """EleutherAI's Pythia configs give ``rotary_pct`` and ``rotary_emb_base`` (GPTNeoXConfig
    reads both), and a config without them takes the class's 0.25: the twin re-saved in
    each form gives transformers' logits."""
    import numpy as np
    from tests.frontends.test_hf_models import TOLERANCE, hf_logits, irc_logits, prompts, relative_error

    model, folder = models("gpt-neox-parallel")
    config = json.loads((folder / "config.json").read_text())
    rope = config.pop("rope_parameters")
    ids, mask, positions = prompts()
    want = hf_logits(model, ids, mask, positions)
    for extra in ({"rotary_pct": rope["partial_rotary_factor"], "rotary_emb_base": rope["rope_theta"]}, {}):
        if not extra:
            assert rope["partial_rotary_factor"] == 0.25 and rope["rope_theta"] == 10000  # the class defaults
        (tmp_path / "config.json").write_text(json.dumps({**config, **extra}))
        (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
        got = irc_logits(load_spec(tmp_path), ids, mask, positions)
        assert relative_error(got[mask == 1], want[mask == 1]) <= TOLERANCE
    assert np.isfinite(got).all()


