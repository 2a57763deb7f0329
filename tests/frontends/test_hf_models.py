"""The HF frontend against transformers: tiny random models of every family, saved with
save_pretrained and loaded with load_spec(folder), give the same logits on a left-padded
batch of two uneven prompts and the same 16-token greedy continuation (KV cache), through
the reference interpreter and, where the ONNX backend is present, through ONNX Runtime for
both ONNX targets (there the greedy decode runs on the left-padded batch)."""
import zlib

import numpy as np
import pytest

from irc.interpreter import Interpreter, generate, past_inputs
from frontends import load_spec
from irc import dims
from irc.errors import BackendError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4  # max|irc - hf| / max|hf| over real-token rows
NEW_TOKENS = 16
SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
MLA = dict(num_key_value_heads=4, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
           moe_intermediate_size=16, first_k_dense_replace=1)  # transformers' MLA needs kv heads == heads
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8,
        "beta_fast": 32.0, "beta_slow": 1.0}

CASES = {  # name: (config class, overrides of SMALL)
    "llama-gqa-llama3-rope": ("LlamaConfig", dict(hidden_size=64, head_dim=16, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16})),
    "llama-mqa-odd-head-dim-tied-linear": ("LlamaConfig", dict(hidden_size=48, head_dim=8, num_key_value_heads=1,
                                                              tie_word_embeddings=True, rope_parameters={
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})),
    "llama-dynamic-rope": ("LlamaConfig", dict(max_position_embeddings=8, rope_parameters={
        "rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})),
    "mistral-window-4": ("MistralConfig", dict(sliding_window=4, head_dim=8)),
    "mistral-mqa-window-3": ("MistralConfig", dict(sliding_window=3, num_key_value_heads=1, head_dim=12)),
    "qwen2-bias": ("Qwen2Config", {}),
    "qwen2-bias-window-layer-1": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=4, max_window_layers=1,
                                                      num_key_value_heads=4)),
    "qwen3-qk-norm": ("Qwen3Config", dict(head_dim=16, num_key_value_heads=1)),
    "mixtral-top2": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "mixtral-top1-window": ("MixtralConfig", dict(num_local_experts=3, num_experts_per_tok=1, sliding_window=5,
                                                  head_dim=16)),
    "qwen2-moe-shared-gate-sparse-step": ("Qwen2MoeConfig", dict(num_experts=4, num_experts_per_tok=2,
                                                                  moe_intermediate_size=16,
                                                                  shared_expert_intermediate_size=24,
                                                                  decoder_sparse_step=2)),
    "qwen2-moe-norm-topk": ("Qwen2MoeConfig", dict(num_experts=6, num_experts_per_tok=3, moe_intermediate_size=16,
                                                   shared_expert_intermediate_size=8, norm_topk_prob=True,
                                                   num_key_value_heads=1)),
    "qwen3-moe": ("Qwen3MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                         norm_topk_prob=True, head_dim=16)),
    "qwen3-moe-dense-first": ("Qwen3MoeConfig", dict(num_experts=4, num_experts_per_tok=1, moe_intermediate_size=16,
                                                     mlp_only_layers=[0])),
    "deepseek-v2-q-lora-yarn": ("DeepseekV2Config", dict(MLA, q_lora_rank=16, n_routed_experts=4,
                                                         num_experts_per_tok=2, n_shared_experts=1,
                                                         routed_scaling_factor=1.5, rope_parameters={
        **YARN, "mscale": 0.707, "mscale_all_dim": 0.707})),
    "deepseek-v2-lite-groups": ("DeepseekV2Config", dict(MLA, q_lora_rank=None, n_routed_experts=6,
                                                         num_experts_per_tok=3, n_shared_experts=2,
                                                         topk_method="group_limited_greedy", n_group=3,
                                                         topk_group=2)),
    "deepseek-v3-q-lora-yarn": ("DeepseekV3Config", dict(MLA, q_lora_rank=16, n_routed_experts=8,
                                                         num_experts_per_tok=3, n_group=4, topk_group=2,
                                                         n_shared_experts=1, routed_scaling_factor=2.5,
                                                         rope_parameters={**YARN, "mscale": 1.0,
                                                                          "mscale_all_dim": 0.8})),
    "deepseek-v3-direct-q-half-rope": ("DeepseekV3Config", dict(MLA, q_lora_rank=None, rope_interleave=False,
                                                                n_routed_experts=4, num_experts_per_tok=2, n_group=2,
                                                                topk_group=1, n_shared_experts=2,
                                                                first_k_dense_replace=0)),
    "gemma2-softcaps-window": ("Gemma2Config", dict(head_dim=16, sliding_window=4, attn_logit_softcapping=5.0,
                                                    final_logit_softcapping=3.0, query_pre_attn_scalar=24)),
    "gemma2-mqa-untied": ("Gemma2Config", dict(head_dim=8, num_key_value_heads=1, sliding_window=3,
                                               tie_word_embeddings=False, layer_types=["full_attention",
                                                                                       "sliding_attention"])),
    "gemma3-local-global-rope": ("Gemma3TextConfig", dict(num_hidden_layers=3, head_dim=16, sliding_window=4,
                                                          sliding_window_pattern=2, rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}})),
    "gemma3-mqa-softcap": ("Gemma3TextConfig", dict(head_dim=8, num_key_value_heads=1, sliding_window=3,
                                                    final_logit_softcapping=4.0, query_pre_attn_scalar=8,
                                                    layer_types=["sliding_attention", "full_attention"])),
    "phi3-partial-rotary-window": ("Phi3Config", dict(pad_token_id=0, sliding_window=5,
                                                      partial_rotary_factor=0.5)),
    "phi3-mha": ("Phi3Config", dict(pad_token_id=0, num_key_value_heads=4)),
    # families_llama_like
    "gemma-geglu-tied": ("GemmaConfig", dict(head_dim=16)),
    "gemma-mqa-exact-gelu": ("GemmaConfig", dict(head_dim=8, num_key_value_heads=1, hidden_act="gelu")),
    "granite-multipliers": ("GraniteConfig", dict(embedding_multiplier=4.0, attention_multiplier=0.2,
                                                  residual_multiplier=0.5, logits_scaling=3.0)),
    "granitemoe-top2": ("GraniteMoeConfig", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=16,
                                                 embedding_multiplier=2.0, residual_multiplier=0.7,
                                                 logits_scaling=2.0, attention_multiplier=0.3)),
    "smollm3-nope-every-2nd": ("SmolLM3Config", dict(num_hidden_layers=4, no_rope_layer_interval=2,
                                                     pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "smollm3-nope-list-window": ("SmolLM3Config", dict(num_hidden_layers=3, no_rope_layers=[1, 0, 1], pad_token_id=0,
                                                       bos_token_id=1, eos_token_id=2, use_sliding_window=True,
                                                       sliding_window=4)),
    # families_classic
    "gpt2-learned-positions": ("GPT2Config", dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1,
                                                  eos_token_id=2)),
    "gpt2-unscaled-exact-gelu": ("GPT2Config", dict(n_embd=48, n_layer=2, n_head=4, n_positions=64, n_inner=80,
                                                    scale_attn_weights=False, activation_function="gelu",
                                                    bos_token_id=1, eos_token_id=2)),
    "gpt-neox-parallel": ("GPTNeoXConfig", dict(bos_token_id=1, eos_token_id=2)),
    "gpt-neox-sequential-half-rotary": ("GPTNeoXConfig", dict(use_parallel_residual=False, bos_token_id=1,
                                                              eos_token_id=2, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
    "falcon-7b-multi-query": ("FalconConfig", dict(bos_token_id=1, eos_token_id=2)),
    "falcon-40b-new-arch-biases": ("FalconConfig", dict(new_decoder_architecture=True, num_kv_heads=2, bias=True,
                                                        bos_token_id=1, eos_token_id=2)),
    "falcon-new-arch-one-norm-untied": ("FalconConfig", dict(new_decoder_architecture=True, num_kv_heads=1,
                                                             num_ln_in_parallel_attn=1, tie_word_embeddings=False,
                                                             bos_token_id=1, eos_token_id=2)),
    "falcon-sequential-mha": ("FalconConfig", dict(multi_query=False, parallel_attn=False, bos_token_id=1,
                                                   eos_token_id=2)),
    "phi-parallel-head-bias": ("PhiConfig", dict(num_key_value_heads=4, bos_token_id=1, eos_token_id=2)),
    # OPT: its position table starts 2 rows in; for padding, transformers' own positions pick row 1
    "opt-relu-tied": ("OPTConfig", dict(ffn_dim=48, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "opt-untied-no-bias-gelu": ("OPTConfig", dict(hidden_size=48, ffn_dim=40, enable_bias=False,
                                                  activation_function="gelu", tie_word_embeddings=False,
                                                  pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # families_alibi (and Falcon's alibi): 6 heads take the slopes' non-power-of-two rules
    "bloom-alibi": ("BloomConfig", dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "bloom-alibi-6-heads": ("BloomConfig", dict(hidden_size=48, num_attention_heads=6, pad_token_id=0,
                                                bos_token_id=1, eos_token_id=2)),
    "mpt-alibi-clip-scale": ("MptConfig", dict(max_seq_len=64, attn_config={"clip_qkv": 6.0, "softmax_scale": 0.3},
                                               pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "mpt-alibi-6-heads": ("MptConfig", dict(hidden_size=48, num_attention_heads=6, max_seq_len=64, pad_token_id=0,
                                            bos_token_id=1, eos_token_id=2)),
    "falcon-alibi-sequential": ("FalconConfig", dict(alibi=True, multi_query=False, parallel_attn=False, bias=True,
                                                     pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # families_llama4: chunks of 4 (the prompts cross them), NoPE layer 3, MoE layers 1 and 3
    "llama4-chunked-moe": ("Llama4TextConfig", dict(num_hidden_layers=4, head_dim=8, intermediate_size=24,
                                                    intermediate_size_mlp=40, num_local_experts=4,
                                                    interleave_moe_layer_step=2, attention_chunk_size=4)),
    "llama4-top2-full-no-qk-norm": ("Llama4TextConfig", dict(num_hidden_layers=4, head_dim=8, intermediate_size=24,
                                                             intermediate_size_mlp=40, num_local_experts=4,
                                                             num_experts_per_tok=2, use_qk_norm=False,
                                                             attention_chunk_size=None, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
        "original_max_position_embeddings": 16})),  # Scout's low = high: no band between
    # families_nanochat: its RoPE turns the other way, the q/k norms after it have no weight
    "nanochat-gqa-softcap": ("NanoChatConfig", dict(num_attention_heads=4, num_key_value_heads=2,
                                                    final_logit_softcapping=3.0, bos_token_id=1, eos_token_id=2)),
    # families_cohere
    "cohere-parallel-logit-scale": ("CohereConfig", dict(logit_scale=0.5, bos_token_id=1, eos_token_id=2)),
    "cohere-qk-norm": ("CohereConfig", dict(use_qk_norm=True, logit_scale=0.5, bos_token_id=1, eos_token_id=2)),
    "cohere2-nope-global": ("Cohere2Config", dict(num_hidden_layers=4, sliding_window=4, logit_scale=0.25,
                                                  bos_token_id=1, eos_token_id=2)),
    "glm4-sandwich-partial-rotary": ("Glm4Config", dict(head_dim=16, pad_token_id=0, eos_token_id=2)),
    # families_olmo
    "olmo-plain-norms-clip": ("OlmoConfig", dict(clip_qkv=0.5, pad_token_id=0, eos_token_id=2)),
    "olmo-mha-no-clip": ("OlmoConfig", dict(num_key_value_heads=4, pad_token_id=0, eos_token_id=2)),
    "olmoe-clip": ("OlmoeConfig", dict(num_experts=4, num_experts_per_tok=2, intermediate_size=16, clip_qkv=0.8,
                                       pad_token_id=0, eos_token_id=2)),
    "olmo2-post-norms": ("Olmo2Config", dict(num_key_value_heads=4, pad_token_id=0, eos_token_id=2)),
    "olmo2-gqa-tied": ("Olmo2Config", dict(head_dim=8, tie_word_embeddings=True, pad_token_id=0, eos_token_id=2)),
    "olmo3-windows": ("Olmo3Config", dict(num_hidden_layers=4, sliding_window=4, pad_token_id=0, eos_token_id=2,
                                          rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 500000.0, "factor": 2.0}})),
    "olmoe-top2": ("OlmoeConfig", dict(num_experts=4, num_experts_per_tok=2, intermediate_size=16, pad_token_id=0,
                                       eos_token_id=2)),
    "olmoe-renormalised": ("OlmoeConfig", dict(num_experts=6, num_experts_per_tok=3, intermediate_size=16,
                                               norm_topk_prob=True, num_key_value_heads=4, pad_token_id=0,
                                               eos_token_id=2)),
    "starcoder2-biases-window": ("Starcoder2Config", dict(sliding_window=4, bos_token_id=1, eos_token_id=2)),
    "starcoder2-no-bias-untied": ("Starcoder2Config", dict(use_bias=False, tie_word_embeddings=False,
                                                           hidden_act="gelu", num_key_value_heads=1,
                                                           bos_token_id=1, eos_token_id=2)),
    # original_max_position_embeddings 4 so that the 11-token prompts and 16 steps reach the scale's steps
    "ministral3-llama4-scale-yarn": ("Ministral3Config", dict(head_dim=8, max_position_embeddings=64, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 4,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1,
        "max_position_embeddings": 64})),
    "ministral-windows": ("MinistralConfig", dict(num_hidden_layers=3, sliding_window=4, head_dim=8,
                                                  layer_types=["sliding_attention", "full_attention",
                                                               "sliding_attention"])),
    # issue 40: aliases
    "exaone-original-names": ("ExaoneConfig", dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "internlm3-head-dim-128": ("InternLM3Config", dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "iquestcoder-mqa": ("IQuestCoderConfig", dict(head_dim=16, num_key_value_heads=1, bos_token_id=1,
                                                  eos_token_id=2)),
    "sarvam-mla-one-group": ("SarvamMLAConfig", dict(MLA, n_routed_experts=4, num_experts_per_tok=2, bos_token_id=1,
                                                     eos_token_id=2)),
    "helium-interleaved-qkv-bias": ("HeliumConfig", dict(head_dim=8, attention_bias=True, pad_token_id=0)),
    "seed-oss-qkv-out-bias": ("SeedOssConfig", dict(head_dim=16, attention_out_bias=True, pad_token_id=0)),
    "arcee-relu2-mlp-bias": ("ArceeConfig", dict(mlp_bias=True, attention_bias=True, bos_token_id=1,
                                                 eos_token_id=2)),
    "ernie4-5-interleaved-tied": ("Ernie4_5Config", dict(pad_token_id=0)),
    "cwm-windows-llama3": ("CwmConfig", dict(num_hidden_layers=3, sliding_window=4, head_dim=8, bos_token_id=1,
                                             eos_token_id=2)),
    # families_gpt_kin
    "gpt-bigcode-multi-query": ("GPTBigCodeConfig", dict(n_inner=48, bos_token_id=1, eos_token_id=2)),
    "gpt-bigcode-mha-unscaled-exact-gelu": ("GPTBigCodeConfig", dict(multi_query=False, scale_attn_weights=False,
                                                                     activation_function="gelu", bos_token_id=1,
                                                                     eos_token_id=2)),
    "gptj-interleaved-partial-rotary": ("GPTJConfig", dict(rotary_dim=4, n_inner=48, bos_token_id=1, eos_token_id=2)),
    "gptj-tied-whole-head-rotary": ("GPTJConfig", dict(rotary_dim=8, tie_word_embeddings=True,
                                                       activation_function="gelu", bos_token_id=1, eos_token_id=2)),
    # 2 heads of 24 over qkv_proj's 4 groups of 12 rows: each head's q, k and v from two groups
    "codegen-qkv-groups": ("CodeGenConfig", dict(hidden_size=48, num_attention_heads=2, rotary_dim=8, n_inner=64,
                                                 bos_token_id=1, eos_token_id=2)),
    "gpt-neo-local-window": ("GPTNeoConfig", dict(attention_types=[[["global", "local"], 1]], window_size=4,
                                                  bos_token_id=1, eos_token_id=2)),
    "openai-gpt-post-norm": ("OpenAIGPTConfig", {}),
    "openai-gpt-relu": ("OpenAIGPTConfig", dict(afn="relu")),
    # BioGPT's LayerNorms take nn.LayerNorm's eps 1e-5 whatever layer_norm_eps says
    "biogpt-scaled-embedding": ("BioGptConfig", dict(layer_norm_eps=0.5, pad_token_id=0, bos_token_id=1,
                                                     eos_token_id=2)),
    # families_ln_kin
    "stablelm-qk-layernorm-qkv-bias": ("StableLmConfig", dict(qk_layernorm=True, use_qkv_bias=True, bos_token_id=1,
                                                              eos_token_id=2)),
    "stablelm-tied-parallel-half-rotary": ("StableLmConfig", dict(use_parallel_residual=True, partial_rotary_factor=0.5,
                                                                  num_key_value_heads=4, tie_word_embeddings=True,
                                                                  bos_token_id=1, eos_token_id=2)),
    "persimmon-shared-qk-layernorm": ("PersimmonConfig", dict(bos_token_id=1, eos_token_id=2)),
    "persimmon-tied-no-qk-norm": ("PersimmonConfig", dict(qk_layernorm=False, tie_word_embeddings=True,
                                                          bos_token_id=1, eos_token_id=2)),
    "glm-partial-interleaved-rotary": ("GlmConfig", dict(head_dim=16, pad_token_id=0, eos_token_id=2)),
    "nemotron-layernorm1p": ("NemotronConfig", dict(bos_token_id=1, eos_token_id=2)),
    "nemotron-biases-wide-heads": ("NemotronConfig", dict(head_dim=16, attention_bias=True, mlp_bias=True,
                                                          partial_rotary_factor=0.25, bos_token_id=1,
                                                          eos_token_id=2)),
    "vaultgemma-softcaps-window": ("VaultGemmaConfig", dict(head_dim=16, sliding_window=4, attn_logit_softcapping=5.0,
                                                            final_logit_softcapping=3.0, query_pre_attn_scalar=24)),
    "granite-swa-sinks-nope-layer": ("GraniteSWAConfig", dict(num_hidden_layers=4, sliding_window=4,
                                                              layer_rope_theta=[10000.0, 0, 500000.0, 10000.0],
                                                              embedding_multiplier=4.0, attention_multiplier=0.2,
                                                              residual_multiplier=0.5, logits_scaling=3.0,
                                                              bos_token_id=1, eos_token_id=2)),
    "granitemoe-swa-shared-mlp": ("GraniteMoeSWAConfig", dict(num_local_experts=4, num_experts_per_tok=2,
                                                              intermediate_size=16, shared_intermediate_size=24,
                                                              sliding_window=4, embedding_multiplier=2.0,
                                                              residual_multiplier=0.7, logits_scaling=2.0,
                                                              attention_multiplier=0.3, bos_token_id=1,
                                                              eos_token_id=2)),
    # families_moe_2026
    "glm4-moe-groups-qkv-bias-partial": ("Glm4MoeConfig", dict(n_routed_experts=8, num_experts_per_tok=3, n_group=4,
                                                               topk_group=2, moe_intermediate_size=16, head_dim=16,
                                                               routed_scaling_factor=1.5, pad_token_id=0)),
    "glm4-moe-qk-norm-all-moe": ("Glm4MoeConfig", dict(n_routed_experts=4, num_experts_per_tok=2,
                                                       moe_intermediate_size=16, head_dim=8, use_qk_norm=True,
                                                       attention_bias=False, norm_topk_prob=False,
                                                       first_k_dense_replace=0, n_shared_experts=2,
                                                       num_key_value_heads=1, pad_token_id=0)),
    "minimax-m2-full-qk-norm-rotary-dim": ("MiniMaxM2Config", dict(num_local_experts=4, num_experts_per_tok=2,
                                                                   intermediate_size=16, head_dim=16, rotary_dim=8,
                                                                   bos_token_id=1, eos_token_id=2)),
    "ernie4-5-moe-shared-interleaved": ("Ernie4_5_MoeConfig", dict(num_hidden_layers=3, moe_num_experts=4, moe_k=2,
                                                                   moe_intermediate_size=16, moe_num_shared_experts=1,
                                                                   pad_token_id=0)),
    "ernie4-5-moe-every-2nd-no-shared": ("Ernie4_5_MoeConfig", dict(num_hidden_layers=4, moe_num_experts=6, moe_k=3,
                                                                    moe_intermediate_size=16, moe_num_shared_experts=0,
                                                                    moe_layer_start_index=0, moe_layer_interval=2,
                                                                    tie_word_embeddings=False, pad_token_id=0)),
    "dots1-windows-v3-moe": ("Dots1Config", dict(num_hidden_layers=3, n_routed_experts=4, num_experts_per_tok=2,
                                                 n_shared_experts=1, moe_intermediate_size=16, first_k_dense_replace=1,
                                                 head_dim=16, norm_topk_prob=True, routed_scaling_factor=2.0,
                                                 sliding_window=4, max_window_layers=1)),
    "exaone4-post-norms-nope-global": ("Exaone4Config", dict(num_hidden_layers=4, sliding_window=4,
                                                             sliding_window_pattern=2, head_dim=16, pad_token_id=0)),
    "exaone4-no-window-rope-everywhere": ("Exaone4Config", dict(sliding_window=None, layer_types=["full_attention"] * 2,
                                                                head_dim=8, tie_word_embeddings=True, pad_token_id=0)),
    # families_2026
    "hyperclovax-post-norms-mup": ("HyperCLOVAXConfig", dict(embedding_multiplier=2.0, residual_multiplier=0.5,
                                                             logits_scaling=0.5, attention_multiplier=0.2,
                                                             attention_bias=True, pad_token_id=0, eos_token_id=2)),
    "granitemoeshared-shared-expert": ("GraniteMoeSharedConfig", dict(
        num_local_experts=4, num_experts_per_tok=2, intermediate_size=16, shared_intermediate_size=24,
        embedding_multiplier=2.0, residual_multiplier=0.7, logits_scaling=2.0, attention_multiplier=0.3,
        bos_token_id=1, eos_token_id=2)),
    "mellum-windows-typed-rope": ("MellumConfig", dict(
        num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"], sliding_window=4,
        head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        mlp_layer_types=["dense", "sparse", "sparse"], pad_token_id=0, eos_token_id=2, rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
            "sliding_attention": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}})),
    "solar-open-groups-qkv-bias": ("SolarOpenConfig", dict(n_routed_experts=4, num_experts_per_tok=2,
                                                           moe_intermediate_size=16, head_dim=8, n_group=2, topk_group=1,
                                                           routed_scaling_factor=1.5, attention_bias=True,
                                                           pad_token_id=0, eos_token_id=2)),
    "param2moe-bailing-partial-rotary": ("Param2MoeConfig", dict(
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, head_dim=8, n_shared_experts=1,
        attention_bias=True, pad_token_id=0, eos_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
    "hy-v3-qk-norm-shared": ("HYV3Config", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                                head_dim=8, attention_bias=True, pad_token_id=0, eos_token_id=2)),
    "aria-text-shared-experts": ("AriaTextConfig", dict(moe_num_experts=4, moe_topk=2, moe_num_shared_experts=1,
                                                        intermediate_size=24, pad_token_id=0, eos_token_id=2)),
    "youtu-mla-dense": ("YoutuConfig", dict(num_key_value_heads=4, kv_lora_rank=12, qk_nope_head_dim=8,
                                            qk_rope_head_dim=4, v_head_dim=6, q_lora_rank=16, pad_token_id=0,
                                            bos_token_id=1, eos_token_id=2)),
    # rms_norm_eps 1e-5, MLA's own norms 1e-6
    "minicpm3-mla-half-rope-scales": ("MiniCPM3Config", dict(num_key_value_heads=4, kv_lora_rank=12,
                                                             qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                                                             q_lora_rank=None, scale_emb=4.0, scale_depth=1.2,
                                                             dim_model_base=16, pad_token_id=0, eos_token_id=2)),
    "axk1-post-moe-norm": ("AXK1Config", dict(MLA, q_lora_rank=16, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
                                              topk_group=1, mlp_layer_types=["dense", "sparse"], pad_token_id=0,
                                              bos_token_id=1, eos_token_id=2)),
    "minicpm5-moe-gated-attention": ("MiniCPM5MoeConfig", dict(n_routed_experts=4, num_experts_per_tok=2,
                                                               moe_intermediate_size=16, head_dim=8, n_group=2,
                                                               topk_group=1, pad_token_id=0, bos_token_id=1,
                                                               eos_token_id=2)),
    "afmoe-gate-nope-mup": ("AfmoeConfig", dict(num_hidden_layers=3, num_experts=4, num_experts_per_tok=2,
                                                moe_intermediate_size=16, head_dim=8, global_attn_every_n_layers=2,
                                                sliding_window=4, num_shared_experts=1, route_scale=1.5,
                                                mup_enabled=True, pad_token_id=0, eos_token_id=2)),
    "flint-sinks-sigmoid-shared": ("FlintConfig", dict(
        num_hidden_layers=3, mlp_only_layers=[0], layer_types=["sliding_attention", "full_attention",
                                                               "sliding_attention"], sliding_window=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24, head_dim=8,
        pad_token_id=0, eos_token_id=2)),
    "flex-olmo-post-norms-moe": ("FlexOlmoConfig", dict(num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                                                        pad_token_id=0, eos_token_id=2)),
    "jais2-layernorm-relu2-biases": ("Jais2Config", dict(head_dim=8, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # families_hunyuan: the released alpha-NTK RoPE settings (extras ignored), head_dim wider than hidden / heads
    "hunyuan-dense-alpha-rope-biases": ("HunYuanDenseV1Config", dict(
        head_dim=16, attention_bias=True, pad_token_id=0, eos_token_id=2, rope_parameters={
            "type": "dynamic", "rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0})),
    "hunyuan-moe-topk-list-shared-mlp": ("HunYuanMoEV1Config", dict(head_dim=8, num_experts=4, moe_topk=[2, 2],
                                                                    tie_word_embeddings=True, pad_token_id=0,
                                                                    eos_token_id=2)),
    # families_2026b (DBRX: d_model given, as DbrxConfig sizes the experts by it; clip_qkv set: transformers
    # 5.25's clamp fails without one)
    "cohere-compass-nope-full-rope-sliding": ("CohereCompassTextConfig", dict(
        num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"], sliding_window=4,
        logit_scale=0.5, rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                                                "mrope_section": [2, 1, 1]}, "full_attention": None},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "cohere-compass-linear-rope-untied": ("CohereCompassTextConfig", dict(
        tie_word_embeddings=False, rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                        "rope_theta": 50000.0}},
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "cohere2-moe-dense-prefix-average": ("Cohere2MoeConfig", dict(
        num_hidden_layers=3, head_dim=8, num_experts=4, num_experts_per_tok=2, num_shared_experts=1,
        intermediate_size=16, first_k_dense_replace=1, prefix_dense_intermediate_size=24, sliding_window=4,
        sliding_window_pattern=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "cohere2-moe-sigmoid-rms-sum": ("Cohere2MoeConfig", dict(
        head_dim=8, num_experts=4, num_experts_per_tok=2, num_shared_experts=2, intermediate_size=16,
        shared_expert_combination_strategy="sum", expert_selection_fn="sigmoid", norm_topk_prob=False,
        rms_norm_eps=1e-6, layer_types=["sliding_attention", "full_attention"], sliding_window=4,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "dbrx-clip-qkv-top2-renorm": ("DbrxConfig", dict(
        d_model=32, attn_config={"clip_qkv": 1.0, "kv_n_heads": 2, "rope_theta": 500000.0},
        ffn_config={"ffn_hidden_size": 16, "moe_num_experts": 4, "moe_top_k": 2},
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    "dbrx-mqa-unnormalised": ("DbrxConfig", dict(
        d_model=32, attn_config={"clip_qkv": 8.0, "kv_n_heads": 1, "rope_theta": 10000.0},
        ffn_config={"ffn_hidden_size": 16, "moe_num_experts": 3, "moe_top_k": 2, "moe_normalize_expert_weights": None})),
    # families_xglm: sinusoidal positions (row = position + 2); pad_token_id 5 zeros row 5, a real position (3)
    "xglm-gelu-tied-scaled": ("XGLMConfig", dict(ffn_dim=48, bos_token_id=0, eos_token_id=2)),
    "xglm-relu-untied-pad-row": ("XGLMConfig", dict(hidden_size=48, ffn_dim=40, activation_function="relu",
                                                    scale_embedding=False, tie_word_embeddings=False,
                                                    pad_token_id=5, bos_token_id=0, eos_token_id=2)),
    # families_classic2: BitNet's sub-norms and relu2 GLU; CTRL's sinusoidal positions and head bias; GPT-NeoX-Japanese
    "bitnet-sub-norms-gqa": ("BitNetConfig", dict(bos_token_id=1, eos_token_id=2)),
    "bitnet-biases-mha-tied": ("BitNetConfig", dict(attention_bias=True, num_key_value_heads=4,
                                                    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)),
    "ctrl-sinusoidal-head-bias": ("CTRLConfig", dict(dff=48)),
    "ctrl-untied-final-eps": ("CTRLConfig", dict(hidden_size=48, dff=40, tie_word_embeddings=False,
                                                 layer_norm_epsilon=1e-5)),
    "gpt-neox-japanese-half-rotary": ("GPTNeoXJapaneseConfig", dict(intermediate_multiple_size=2, bos_token_id=1,
                                                                    eos_token_id=2, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
    "gpt-neox-japanese-untied-gelu-new": ("GPTNeoXJapaneseConfig", dict(hidden_act="gelu_new", num_hidden_layers=3,
                                                                        tie_word_embeddings=False, bos_token_id=1,
                                                                        eos_token_id=2)),
    # families_classic2: ModernBERT-decoder's global / sliding layers (window local_attention // 2), embedding norm, head
    "modernbert-decoder-windows-tied": ("ModernBertDecoderConfig", dict(num_hidden_layers=3, local_attention=8,
                                                                        pad_token_id=0, bos_token_id=1,
                                                                        eos_token_id=2)),
    "modernbert-decoder-biases-untied-types": ("ModernBertDecoderConfig", dict(
        local_attention=6, layer_types=["sliding_attention", "full_attention"], attention_bias=True, norm_bias=True,
        classifier_bias=True, decoder_bias=False, hidden_activation="gelu_pytorch_tanh", classifier_activation="gelu_new",
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2, rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 50000.0},
            "sliding_attention": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}})),
    # families_moe_2026c
    "glm4-moe-lite-mla-groups-yarn": ("Glm4MoeLiteConfig", dict(
        num_key_value_heads=4, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, q_lora_rank=16,
        moe_intermediate_size=16, n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
        pad_token_id=0, rope_parameters={**YARN, "mscale": 1.0, "mscale_all_dim": 0.8})),
    "glm4-moe-lite-direct-q-half-rope-types": ("Glm4MoeLiteConfig", dict(
        num_hidden_layers=3, num_key_value_heads=4, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=6, q_lora_rank=None, rope_interleave=False, moe_intermediate_size=16, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=2, norm_topk_prob=False, mlp_layer_types=["sparse", "dense", "sparse"],
        pad_token_id=0)),
    "sarvam-moe-qkv-bias-groups": ("SarvamMoEConfig", dict(n_routed_experts=4, num_experts_per_tok=2,
                                                          moe_intermediate_size=16, head_dim=8, n_group=2, topk_group=1,
                                                          attention_bias=True, pad_token_id=0, eos_token_id=2)),
    "exaone-moe-nope-global-groups": ("ExaoneMoeConfig", dict(num_hidden_layers=4, sliding_window=4,
                                                              sliding_window_pattern=2, head_dim=16, num_experts=8,
                                                              num_experts_per_tok=3, n_group=4, topk_group=2,
                                                              moe_intermediate_size=16, eos_token_id=2)),
    "exaone-moe-types-window-3-two-shared-tied": ("ExaoneMoeConfig", dict(
        num_hidden_layers=3, sliding_window=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        num_key_value_heads=1, head_dim=8,
        mlp_layer_types=["sparse", "dense", "sparse"], num_experts=4, num_experts_per_tok=2, num_shared_experts=2,
        norm_topk_prob=False, moe_intermediate_size=16, tie_word_embeddings=True, eos_token_id=2)),
    # MiMo: head_dim 24 rotates int(24 x 0.334) = 8 dims; layer 0 full, 1-2 sliding (2 kv heads, sinks)
    "mimo-v2-flash-sinks-v-head-dim": ("MiMoV2FlashConfig", dict(
        num_hidden_layers=3, head_dim=24, v_head_dim=8, num_key_value_heads=1, sliding_window=4, n_routed_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, pad_token_id=0, eos_token_id=2)),
    "mimo-v2-flash-bias-groups-window-size": ("MiMoV2FlashConfig", dict(
        num_hidden_layers=3, head_dim=12, v_head_dim=16, attention_bias=True, sliding_window_size=3,
        attention_value_scale=None, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        mlp_layer_types=["sparse", "sparse", "dense"], n_routed_experts=8, num_experts_per_tok=3, n_group=4,
        topk_group=2, routed_scaling_factor=1.5, moe_intermediate_size=16, pad_token_id=0, eos_token_id=2,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 0.5}})),
    # families_moe_2026d: layer 1 full (NoPE, scaled queries), 0 and 2 sliding with RoPE
    "beam-gate-nope-scale-depth-residuals": ("BeamConfig", dict(
        num_hidden_layers=3, head_dim=8, sliding_window=4, num_experts=8, num_experts_per_tok=2, n_group=4,
        topk_group=2, moe_intermediate_size=16, mlp_layer_types=["dense", "sparse", "sparse"],
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], final_logit_softcapping=5.0,
        pad_token_id=0, eos_token_id=2)),
    "beam-biases-linear-rope-default-types": ("BeamConfig", dict(
        num_hidden_layers=3, head_dim=16, sliding_window=3, num_key_value_heads=1, attention_bias=True, num_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, norm_topk_prob=False, moe_intermediate_size=16,
        mlp_layer_types=["sparse", "dense", "sparse"], tie_word_embeddings=True, pad_token_id=0, eos_token_id=2,
        rope_parameters={"sliding_attention": {"rope_type": "linear", "rope_theta": 50000.0, "factor": 2.0},
                         "full_attention": None})),
    # LongCat: num_hidden_layers 2 (SMALL) is one layer of two sublayers; 4 MLP + 2 zero experts, top 3
    "longcat-flash-zero-experts-shortcut": ("LongcatFlashConfig", dict(
        num_key_value_heads=4, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, head_dim=4, v_head_dim=6,
        q_lora_rank=16, ffn_hidden_size=48, n_routed_experts=4, zero_expert_num=2, moe_topk=3,
        expert_ffn_hidden_size=16, routed_scaling_factor=2.0, pad_token_id=0, eos_token_id=2)),
    "longcat-flash-two-layers-yarn-one-zero-expert": ("LongcatFlashConfig", dict(
        num_hidden_layers=4, num_key_value_heads=4, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=6, q_lora_rank=16, ffn_hidden_size=40, n_routed_experts=5, zero_expert_num=1, moe_topk=2,
        expert_ffn_hidden_size=16, head_dim=4, pad_token_id=0, eos_token_id=2,
        rope_parameters={**YARN, "mscale": 1.0, "mscale_all_dim": 0.8})),
    # families_zamba: multi-head Mamba-1 layers, the shared block tied (one set of weights) or untied (one per use)
    "zamba-two-heads-gqa-tied": ("ZambaConfig", dict(num_hidden_layers=4, n_mamba_heads=2, mamba_d_state=8,
                                                     layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
                                                     pad_token_id=0, bos_token_id=0, eos_token_id=0)),
    "zamba-one-head-untied-silu": ("ZambaConfig", dict(num_hidden_layers=3, num_attention_heads=2,
                                                       num_key_value_heads=2, n_mamba_heads=1, mamba_d_state=4,
                                                       mamba_d_conv=3, mamba_conv_bias=False, mamba_dt_rank=5,
                                                       hidden_act="silu", tie_word_embeddings=False,
                                                       layers_block_type=["hybrid", "mamba", "hybrid"],
                                                       pad_token_id=0, bos_token_id=0, eos_token_id=0)),
    # families_loops: HRM's L and H stacks unrolled (2 x (2 + 1) passes of a 1-layer stack; 1 x 2 of a 2-layer one)
    "hrm-text-two-cycles": ("HrmTextConfig", dict(num_hidden_layers=1, head_dim=8, H_cycles=2, L_cycles=2,
                                                  pad_token_id=0, eos_token_id=2)),
    "hrm-text-two-layer-stacks-tied": ("HrmTextConfig", dict(head_dim=16, H_cycles=1, L_cycles=1,
                                                             tie_word_embeddings=True, embedding_scale=2.0,
                                                             pad_token_id=0, eos_token_id=2)),
    # families_moa: JetMoE's mixture of attention heads (top_k x kv heads of queries) and of SwiGLU experts
    "jetmoe-moa-top2-gqa": ("JetMoeConfig", dict(num_key_value_heads=2, kv_channels=8, num_local_experts=4,
                                                 num_experts_per_tok=2, intermediate_size=16, pad_token_id=0,
                                                 eos_token_id=2)),
    "jetmoe-mqa-all-experts-untied": ("JetMoeConfig", dict(num_key_value_heads=1, kv_channels=16,
                                                           num_local_experts=3, num_experts_per_tok=3,
                                                           intermediate_size=24, tie_word_embeddings=False,
                                                           rms_norm_eps=1e-5, pad_token_id=0, eos_token_id=2)),
    # families_doge: dynamic-mask attention (the dt bias a channel of the key cache), learned residual scales
    "doge-dma-gqa": ("DogeConfig", dict(num_key_value_heads=2, keep_window_size=64, pad_token_id=0, eos_token_id=2)),
    "doge-dma-mqa-window-tied": ("DogeConfig", dict(num_key_value_heads=1, head_dim=16, keep_window_size=100,
                                                    sliding_window=4, tie_word_embeddings=True, pad_token_id=0,
                                                    eos_token_id=2)),
    # families_act_2026: xIELU (irc.ops.activations) with learned alpha_p/alpha_n per layer, q/k RMS norms
    "apertus-xielu-llama3-rope": ("ApertusConfig", dict(rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16})),
    "apertus-xielu-biases-mqa": ("ApertusConfig", dict(attention_bias=True, num_key_value_heads=1, head_dim=16,
                                                       rope_parameters={"rope_type": "default",
                                                                        "rope_theta": 10000.0})),
    "apertus1p5-text-pruned-head": ("Apertus1p5TextConfig", dict(output_vocab_size=100, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0})),
    # families_act_2026: Laguna's softplus output gates (irc.ops.activations), per-layer heads, sigmoid MoE
    "laguna-head-gates-windows-moe": ("LagunaConfig", dict(
        head_dim=8, num_hidden_layers=3, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        sliding_window=4, num_attention_heads_per_layer=[4, 2, 6], moe_routed_scaling_factor=2.5)),
    "laguna-element-gates-biases-top1": ("LagunaConfig", dict(
        head_dim=8, num_experts=4, num_experts_per_tok=1, moe_intermediate_size=16, gating="per-element",
        shared_expert_intermediate_size=16, mlp_layer_types=["sparse", "dense"], attention_bias=True)),
    # families_act_2026: Kolibri-1's router (top-k of logits + bias, sigmoid weights: scoring="sigmoid_logits")
    "kolibri1-sandwich-nope-full-window": ("Kolibri1Config", dict(
        head_dim=8, num_hidden_layers=3, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        sliding_window=4)),
    "kolibri1-mqa-renormalised-top3": ("Kolibri1Config", dict(
        head_dim=16, num_experts=4, num_experts_per_tok=3, moe_intermediate_size=16, norm_topk_prob=True,
        sliding_window=3, shared_expert_intermediate_size=16, num_key_value_heads=1)),
    # families_diff: differential attention (one attention over paired values, λ per layer, the head-pair RMS norm)
    "diffllama-gqa-three-layers": ("DiffLlamaConfig", dict(num_hidden_layers=3)),
    "diffllama-mha-biases-wide-heads": ("DiffLlamaConfig", dict(num_key_value_heads=4, head_dim=16,
                                                                attention_bias=True)),
    # families_ergo: Ergo's residual gates, interleaved RoPE on sliding layers, NoPE full layers (scaled logits),
    # routed experts each RMS-normed with its own weight (sorted-MoE ops), the normed shared expert
    "ergo-dense-then-moe-scaled-full": ("ErgoConfig", dict(
        num_hidden_layers=3, first_dense_intermediate_size=48, moe_intermediate_size=16, shared_intermediate_size=24,
        num_experts=4, num_experts_per_tok=2, sliding_window=4, global_attention_every_n_layers=2,
        global_attention_scale=1.5, moe_routed_scaling_factor=2.0)),
    "ergo-top1-all-moe-types-listed": ("ErgoConfig", dict(
        num_dense_blocks=0, moe_intermediate_size=16, shared_intermediate_size=16, num_experts=3, num_experts_per_tok=1,
        sliding_window=3, layer_types=["full_attention", "sliding_attention"], rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}, "full_attention": None})),
    # families_zaya: ZAYA1's CCA projection (causal convolutions over q|k, the delayed value half: states as graph
    # I/O), L2 q/k norms, residual scaling, the router MLP chained from layer to layer, top-1 of E + a skip class
    "zaya-cca-two-taps-tied": ("ZayaConfig", dict(
        head_dim=8, moe_intermediate_size=12, num_experts=3, router_hidden_size=16, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    "zaya-three-taps-windows-mqa-head-bias": ("ZayaConfig", dict(
        head_dim=8, num_key_value_heads=1, moe_intermediate_size=12, num_experts=4, router_hidden_size=8,
        cca_time0=3, cca_time1=3, num_hidden_layers=3, layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding"],
        sliding_window=4, tie_word_embeddings=False, lm_head_bias=True, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    # families_hyper: Hunyuan-V4's hyper-connected streams; index_topk below the prompts' 11 tokens (16 index
    # heads: ReLU'd index scores tie rarely), a "shared" third layer reusing layer 1's selection, clamped experts
    "hy-v4-three-streams-shared-indexer": ("HYV4Config", dict(
        num_hidden_layers=3, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, q_lora_rank=16,
        moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, index_topk=4, index_head_dim=8,
        index_n_heads=16, hc_mult=3, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    "hy-v4-two-streams-clamp-magnitude": ("HYV4Config", dict(
        kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, q_lora_rank=16,
        moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, index_topk=3, index_head_dim=4,
        index_n_heads=16, hc_mult=2, hc_magnitude=1.5, swiglu_limit=0.5, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)),
    # families_deepseek_v4: mHC streams, shared K=V MQA with sinks over a sliding window plus one compressed
    # entry per closed window (rate 4: two windows close in the prompt), hash-routed clamped experts (the default
    # layer types; tid2eid zero as transformers initialises it: test_hf_deepseek_v4 draws one, and builds CSA)
    "deepseek-v4-compressed-hash-routed": ("DeepseekV4Config", dict(
        head_dim=16, q_lora_rank=16, partial_rotary_factor=0.5, o_groups=2, o_lora_rank=8, n_routed_experts=4,
        num_experts_per_tok=2, sliding_window=4, hc_mult=2,
        compress_rates={"heavily_compressed_attention": 4, "compressed_sparse_attention": 4})),
    # families_inkling: short convs on k, v and both branches (states as graph I/O), the per-query relative
    # position bias (extent below the prompts' 11 tokens), log-scaled full layers, the shared-expert-sink MoE
    "inkling-sliding-dense-then-full-moe-log-scaled": ("InklingTextConfig", dict(
        head_dim=8, swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=8, sliding_window_size=4,
        d_rel=4, rel_extent=6, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=2, moe_intermediate_size=16,
        mlp_layer_types=["dense", "sparse"], layer_types=["hybrid_sliding", "hybrid"], log_scaling_n_floor=3,
        log_scaling_alpha=0.5, conv_kernel_size=3, logits_mup_width_multiplier=2.0)),
    "inkling-mqa-full-then-sliding-all-moe-top1": ("InklingTextConfig", dict(
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=2,
        swa_head_dim=8, sliding_window_size=5, local_layer_ids=[1], d_rel=4, rel_extent=8, n_routed_experts=4,
        num_experts_per_tok=1, n_shared_experts=1, moe_intermediate_size=16, route_scale=2.0, unpadded_vocab_size=120)),
    # families_inkling2: + L2 clips (thresholds low enough to clip), per-token sinks, gated output, dynamic k/v
    # convolutions on full layers, block attention residuals, softcapped experts, a head of unpadded_vocab_size rows
    "inkling2-sliding-full-sliding-blocks-of-2": ("Inkling2TextConfig", dict(
        unpadded_vocab_size=120, num_hidden_layers=3, head_dim=8, swa_num_attention_heads=4, swa_num_key_value_heads=2,
        swa_head_dim=8, sliding_window_size=4, d_rel=4, rel_extent=6, n_routed_experts=4, num_experts_per_tok=2,
        layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding"], n_layers_per_attn_res_block=2,
        log_scaling_n_floor=3, log_scaling_alpha=0.5, qk_l2_clip_threshold=1.0, rel_l2_clip_threshold=0.5,
        eos_token_id=2, conv_kernel_size=3, mlp_gate_softcap=0.5, mlp_up_softcap=1.0, final_logit_softcapping=5.0)),
    "inkling2-mqa-full-first-blocks-of-1-top1": ("Inkling2TextConfig", dict(
        unpadded_vocab_size=128, layer_types=["hybrid", "hybrid_sliding"], num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, swa_num_attention_heads=4, swa_num_key_value_heads=1, swa_head_dim=8, sliding_window_size=5,
        d_rel=4, rel_extent=6, n_routed_experts=4, num_experts_per_tok=1, n_layers_per_attn_res_block=1,
        log_scaling_n_floor=2, log_scaling_alpha=0.5, qk_l2_clip_threshold=1.0, rel_l2_clip_threshold=0.5,
        route_scale=2.0, eos_token_id=2, mlp_gate_softcap=0.5, mlp_up_softcap=1.0, final_logit_softcapping=5.0)),
    # families_inkling2_loop: Inkling-2 layers, the loop layers unrolled pass by pass (a cache per invocation),
    # the later passes' message gates over the previous pass's blocks
    "inkling2-loop-three-passes-blocks-of-1": ("Inkling2LoopTextConfig", dict(
        unpadded_vocab_size=120, num_hidden_layers=4, head_dim=8, swa_num_attention_heads=4, swa_num_key_value_heads=2,
        swa_head_dim=8, sliding_window_size=4, d_rel=4, rel_extent=6, n_routed_experts=4, num_experts_per_tok=2,
        layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"], n_layers_per_attn_res_block=1,
        log_scaling_n_floor=3, log_scaling_alpha=0.5, qk_l2_clip_threshold=1.0, rel_l2_clip_threshold=0.5,
        eos_token_id=2, conv_kernel_size=3, mlp_gate_softcap=0.5, mlp_up_softcap=1.0, final_logit_softcapping=5.0,
        loop_layer_index_start=1, loop_layer_index_end=3, loop_num_passes=3, loop_gate_rank=4)),
    "inkling2-loop-mqa-two-passes-post-loop-layer": ("Inkling2LoopTextConfig", dict(
        unpadded_vocab_size=128, num_hidden_layers=5, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=8, sliding_window_size=4, d_rel=4,
        rel_extent=6, n_routed_experts=4, num_experts_per_tok=2, n_layers_per_attn_res_block=2,
        layer_types=["hybrid", "hybrid_sliding", "hybrid_sliding", "hybrid", "hybrid_sliding"], log_scaling_n_floor=3,
        log_scaling_alpha=0.5, qk_l2_clip_threshold=1.0, rel_l2_clip_threshold=0.5, eos_token_id=2,
        conv_kernel_size=3, mlp_gate_softcap=0.5, mlp_up_softcap=1.0, final_logit_softcapping=5.0,
        loop_layer_index_start=2, loop_layer_index_end=4, loop_num_passes=2, loop_gate_rank=4)),
}


def randomize(model, seed: int, norm_centre: float) -> None:
    """Weights of unit-scale activations, norms near ``norm_centre`` and nonzero biases, so
    every mapping matters and greedy choices are not near-ties."""
    generator = torch.Generator().manual_seed(seed)

    def randn(shape):
        return torch.randn(shape, generator=generator)

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.copy_(norm_centre + 0.2 * randn(p.shape))
            elif p.ndim == 1:
                p.copy_(0.2 * randn(p.shape))
            else:
                p.copy_(randn(p.shape) * p.shape[-1] ** -0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * randn(b.shape))


def save_twin(model, folder):
    """Save a twin as the tests read it: generation never stops at an eos, pads with 0;
    returns (model, folder)."""
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder)
    return model, folder


def build_case(name: str, folder):
    class_name, overrides = CASES[name]
    config = getattr(transformers, class_name)(**{**SMALL, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=twin_seed(name), norm_centre=0.0 if "gemma" in name else 1.0)
    return save_twin(model, folder)


def twin_seed(name: str) -> int:
    """A twin's weight seed from its name alone, so a case added to CASES leaves every other
    twin's weights as they were (a seed from the sorted order shifted them all)."""
    return zlib.crc32(name.encode()) % 10_000


def built_once(build, tmp_path_factory):
    """name -> build(name, a fresh folder), each name built once."""
    built = {}

    def get(name):
        if name not in built:
            built[name] = build(name, tmp_path_factory.mktemp(name))
        return built[name]

    return get


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (transformers model, saved folder); each built once per module."""
    return built_once(build_case, tmp_path_factory)


def prompts(vocab: int = 128):
    """Two uneven prompts, the shorter left-padded; positions as HF generate makes them."""
    rng = np.random.default_rng(0)
    long, short = rng.integers(1, vocab, 11), rng.integers(1, vocab, 6)
    ids = np.zeros((2, len(long)), np.int64)
    mask = np.zeros_like(ids)
    ids[0], mask[0] = long, 1
    ids[1, -len(short):], mask[1, -len(short):] = short, 1
    positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
    return ids, mask, positions


def irc_logits(graph, ids, mask, positions) -> np.ndarray:
    """Prefill logits: empty caches, zero recurrent states (inputs the graph lacks, such as
    position_ids without RoPE, left out)."""
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    for value in past_inputs(graph):
        feeds[value.name] = np.zeros(dims.evaluate_shape(value.shape, {"B": len(ids), "P": 0}), np.float32)
    names = {v.name for v in graph.inputs}
    return Interpreter(graph).run({k: v for k, v in feeds.items() if k in names})["logits"]


def hf_logits(model, ids, mask, positions) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                    position_ids=torch.from_numpy(positions))
    return out.logits.float().numpy()


def relative_error(got, want) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def assert_logits_match(graph, model) -> None:
    """The reference interpreter's logits equal transformers' on the real tokens of a
    left-padded batch (``prompts``)."""
    ids, mask, positions = prompts()
    got, want = irc_logits(graph, ids, mask, positions), hf_logits(model, ids, mask, positions)
    real = mask.astype(bool)
    assert got.shape == want.shape
    assert relative_error(got[real], want[real]) <= TOLERANCE


def assert_rows_match(graph, model) -> None:
    """``assert_logits_match``, and each row's logits equal transformers' on that row run
    alone (no padding)."""
    ids, mask, positions = prompts()
    got, want = irc_logits(graph, ids, mask, positions), hf_logits(model, ids, mask, positions)
    real = mask.astype(bool)
    assert relative_error(got[real], want[real]) <= TOLERANCE
    for row in range(len(ids)):
        alone = ids[row:row + 1, real[row]]
        by_itself = hf_logits(model, alone, np.ones_like(alone), np.arange(alone.shape[1])[None])
        assert relative_error(got[row, real[row]], by_itself[0]) <= TOLERANCE


def hf_greedy_tokens(model, prompt: list, new_tokens: int = NEW_TOKENS) -> list:
    """transformers' greedy continuation of one unpadded ``prompt``: ``new_tokens`` ids."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=new_tokens, do_sample=False)
    return out[0, len(prompt):].tolist()


def hf_padded_greedy(model) -> np.ndarray:
    """transformers' greedy tokens [2, 16] for the left-padded batch of ``prompts``."""
    ids, mask, _ = prompts()
    with torch.no_grad():
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=NEW_TOKENS,
                             do_sample=False)
    return out[:, ids.shape[1]:].numpy()


def assert_greedy_matches(graph, model, prompt: list, new_tokens: int = NEW_TOKENS) -> None:
    """The reference interpreter's greedy continuation of ``prompt`` equals transformers'."""
    tokens, _ = generate(graph, prompt, new_tokens)
    assert tokens == hf_greedy_tokens(model, prompt, new_tokens)


def assert_ort_run_matches(path: str, graph, want_logits: np.ndarray, want_tokens) -> None:
    """The ONNX model at ``path`` in ONNX Runtime on the left-padded batch (``prompts``; the
    short row fed unpadded): prefill logits within ``TOLERANCE`` of ``want_logits`` on the
    real tokens, and ``NEW_TOKENS`` greedy tokens per row equal to ``want_tokens``."""
    from backends.onnx import runtime

    ids, mask, _ = prompts()
    long, short = ids[0].tolist(), ids[1][mask[1] == 1].tolist()
    result = runtime.greedy(runtime.ort_engine(path), graph, [long, short], NEW_TOKENS)
    real = mask.astype(bool)
    assert relative_error(result["prefill"]["logits"][real], want_logits[real]) <= TOLERANCE
    np.testing.assert_array_equal(result["tokens"], want_tokens)


def assert_onnx_target_matches(model, graph, tmp_path, target: str, tokens=None) -> None:
    """``graph`` emitted for ``target`` (no genai folder), run in ONNX Runtime on the left-padded
    batch: transformers' prefill logits and its greedy tokens (``tokens``, else
    ``hf_padded_greedy``'s)."""
    from backends.onnx import emit

    path = str(tmp_path / "model.onnx")
    emit.emit_model(graph, path, target=target, genai=False)
    want = hf_padded_greedy(model) if tokens is None else tokens
    assert_ort_run_matches(path, graph, hf_logits(model, *prompts()), want)


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_on_a_left_padded_batch(models, name):
    model, folder = models(name)
    assert_logits_match(load_spec(folder), model)


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_generation_matches(models, name):
    model, folder = models(name)
    graph = load_spec(folder)
    prompt = prompts()[0][0].tolist()
    assert_greedy_matches(graph, model, prompt, NEW_TOKENS)


# ---- through ONNX Runtime -----------------------------------------------------------------



@pytest.fixture(scope="module")
def hf_batch_greedy(models):
    """name -> transformers' greedy tokens [2, 16] for the left-padded batch; computed once."""
    done = {}

    def get(name):
        if name not in done:
            done[name] = hf_padded_greedy(models(name)[0])
        return done[name]

    return get


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_runtime_matches_transformers(models, hf_batch_greedy, tmp_path, name, target):
    from backends.onnx import emit

    model, folder = models(name)
    graph = load_spec(folder)
    path = str(tmp_path / "model.onnx")
    rope = graph.meta.get("rope") or {}
    if (rope.get("scaling") or {}).get("kind") == "dynamic":  # refused by design, with a message
        with pytest.raises(BackendError, match="dynamic NTK RoPE"):
            emit.emit_model(graph, path, target=target, genai=False)
        return
    emit.emit_model(graph, path, target=target, genai=False)
    assert_ort_run_matches(path, graph, hf_logits(model, *prompts()), hf_batch_greedy(name))
