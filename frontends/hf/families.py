"""The decoder families irc reads from config.json, and where their weights live.

``describe(cfg, name)`` dispatches on ``model_type``:

=================  ==========================================================================
llama              Llama 1-3.x: GQA, SwiGLU, RoPE (linear, dynamic, yarn or llama3 scaling)
mistral            + a sliding window on every layer (``sliding_window``)
mixtral            Mistral attention, every layer a softmax top-k MoE (renormalised)
qwen2              + q/k/v biases; windows only with ``use_sliding_window``
qwen3              + per-head RMS norm of q and k
qwen2_moe          Qwen2 attention, MoE with a shared expert behind a sigmoid gate
qwen3_moe          Qwen3 attention, MoE without shared expert
deepseek_v2        MLA (q_lora or direct q, interleaved decoupled RoPE key, YaRN mscale),
                   softmax router, greedy or group_limited_greedy (group score: max),
                   shared experts, routed_scaling_factor, first_k_dense_replace
deepseek_v3        MLA (``rope_interleave``), sigmoid router with e_score_correction_bias,
                   noaux_tc groups (group score: sum of the top two), renormalised
gemma2             (1 + w) RMS norms in a sandwich, sqrt(d) embedding scale, tanh-GELU
                   GeGLU, query_pre_attn_scalar, attention and final softcaps, local /
                   global layers (``layer_types``; default: even layers local)
gemma3_text        Gemma 2 + (1 + w) q/k norms, per-layer-type RoPE (local base vs global
                   base and scaling), ``layer_types`` or ``sliding_window_pattern``;
                   ``use_bidirectional_attention``: an encoder (``frontends.hf.encoder``);
                   ``attn_logit_softcapping`` ignored, as transformers' Gemma3Attention does
phi3               fused ``qkv_proj`` and ``gate_up_proj`` (split on load), partial rotary
=================  ==========================================================================

The types of this table are defined in ``frontends.hf.families_base``; this module is the
registry that merges it and the family modules' tables. Every other type is a row of a
family module of ``MODULES`` (a DEFAULTS / FAMILIES / LAYOUTS table each, whose docstring
says what it reads and what it refuses): ``frontends.hf.index`` lists them, a module a line
with its types and its docstring's first sentence, and ``python benchmarks/breadth.py
--census`` names each type's module.

Keys a config.json leaves out take the defaults of transformers' config class for that
family (``DEFAULTS``). A setting irc does not implement (attention or MLP biases where the
family has none, another activation, longrope, a quantized checkpoint's dequantization...)
is a ``SpecError`` naming config.json, the key and the value.

Two places where transformers and DeepSeek's own modeling code disagree are refused
rather than guessed: DeepSeek-V2 with ``norm_topk_prob: true`` (transformers ignores it)
and ``moe_layer_freq`` other than 1 (transformers ignores it).

``checkpoint_source(arch, param)`` names the checkpoint tensor(s) behind an irc param:
one tensor, rows of a fused one (Phi-3), or per-expert tensors stacked into the fused
[E, ...] param (transformers writes MoE experts per expert on disk).
"""
from __future__ import annotations

import re

from frontends.hf.config import Arch, Config
from irc.yamlloc import string
from frontends.hf import refused
from frontends.hf import (families_2026, families_2026b, families_aliases, families_alibi, families_classic,
                          families_cohere, families_composite, families_deepseek_v32, families_delta,
                          families_gemma3n, families_gemma4, families_gpt_kin, families_gpt_oss, families_hunyuan,
                          families_kimi, families_lfm2, families_llama4, families_llama_like, families_ln_kin,
                          families_minimax, families_moe_2026, families_nanochat, families_olmo, families_phimoe,
                          families_recurrent_gemma, families_rwkv, families_ssm, families_xglm, families_classic2)
from frontends.hf import families_doge, families_loops, families_moa, families_zamba
from frontends.hf import families_hybrid2, families_hybrid3, families_deepseek_v4
from frontends.hf import families_moe_2026c, families_moe_2026d
from frontends.hf import families_act_2026, families_diff, families_inkling, families_inkling2, families_inkling2_loop
from frontends.hf import families_dsa, families_dsa2, families_kolibri
from frontends.hf import families_hyper, families_xlstm, families_ergo, families_qwen4, families_zaya
from frontends.hf import families_base
from frontends.hf.layouts import LAYER_PREFIX, LAYOUTS, TOP_NAMES, Experts, checkpoint_source  # noqa: F401 (callers')

# the base families (families_base) and the family modules, each a DEFAULTS / FAMILIES / LAYOUTS table
# merged below (a new module is one entry)
MODULES = (families_ssm, families_composite, families_lfm2, families_delta, families_kimi, families_minimax,
           families_llama_like, families_olmo, families_classic, families_cohere, families_gpt_oss, families_gemma4,
           families_gemma3n, families_phimoe, families_aliases, families_alibi, families_llama4, families_gpt_kin,
           families_ln_kin, families_moe_2026, families_rwkv, families_2026, families_hunyuan, families_deepseek_v32,
           families_2026b, families_nanochat, families_xglm, families_recurrent_gemma, families_classic2)
MODULES += (families_zamba, families_loops, families_moa, families_doge)
MODULES += (families_hybrid2, families_hybrid3, families_deepseek_v4)
MODULES += (families_moe_2026c, families_moe_2026d)
MODULES += (families_act_2026, families_diff, families_inkling, families_inkling2, families_inkling2_loop)
MODULES += (families_dsa, families_dsa2, families_kolibri)
MODULES += (families_hyper, families_xlstm, families_ergo, families_qwen4, families_zaya)

# DSL argument -> the config.json key a refusal should name
DSL_ARGS = {"n": "num_hidden_layers", "vocab": "vocab_size", "d_model": "hidden_size", "heads": "num_attention_heads",
            "kv_heads": "num_key_value_heads", "head_dim": "head_dim", "d_ff": "intermediate_size",
            "experts": "num_experts", "top_k": "num_experts_per_tok", "groups": "n_group", "top_groups": "topk_group",
            "window": "sliding_window", "rope.rotary_dim": "partial_rotary_factor", "shared_d_ff":
            "shared_expert_intermediate_size", "kv_lora_rank": "kv_lora_rank", "q_lora_rank": "q_lora_rank",
            "qk_rope_head_dim": "qk_rope_head_dim", "qk_nope_head_dim": "qk_nope_head_dim",
            "v_head_dim": "v_head_dim", "routed_scale": "routed_scaling_factor"}


def describe(cfg: Config, name: str) -> Arch:
    """The architecture a config.json describes (see the module docstring)."""
    model_type = cfg.get("model_type", string)
    if model_type not in FAMILIES:
        hint = f"supported model types: {', '.join(sorted(FAMILIES))}"
        if model_type == "gemma3":
            hint = "a multimodal Gemma 3: give the text model's config (model_type gemma3_text)"
        hint = refused.WHY.get(model_type, hint)
        raise cfg.unsupported("model_type", model_type, hint=hint)
    cfg.defaults = DEFAULTS[model_type]
    arch = FAMILIES[model_type](cfg, name, model_type)
    arch.quantized = cfg.has("quantization_config")
    return arch




FAMILIES = {**families_base.FAMILIES,
            **{key: value for module in MODULES for key, value in module.FAMILIES.items()}}
DEFAULTS = {**families_base.DEFAULTS,
            **{key: value for module in MODULES for key, value in module.DEFAULTS.items()}}


def _layouts(module) -> dict:
    """A family module's layouts: its LAYOUTS, or those its ``layouts(Experts)`` makes."""
    return module.LAYOUTS if hasattr(module, "LAYOUTS") else module.layouts(Experts)


LAYOUTS.update({**families_base.LAYOUTS,  # the families' departures from LAYER_NAMES
                **{key: value for module in MODULES for key, value in _layouts(module).items()}})


def is_spare(arch: Arch, key: str) -> bool:
    """Checkpoint tensors the model does not use, as transformers does not: the LM head of
    a tied model, cached RoPE tables, extra layers past num_hidden_layers (DeepSeek-V3's
    multi-token-prediction layer), names under a layout's ``_spare`` prefixes or ending in
    its ``_spare_suffixes``."""
    if key == "lm_head.weight" and (arch.tied or arch.encoder is not None):  # an encoder has no head
        return True
    layout = LAYOUTS[arch.checkpoint]
    if key.endswith(("rotary_emb.inv_freq", *layout.get("_spare_suffixes", ()))) or \
            key.startswith(layout.get("_spare", ())):
        return True
    prefix = LAYOUTS[arch.checkpoint].get("_prefix", LAYER_PREFIX)
    match = re.match(re.escape(prefix) + r"(\d+)\.", key)
    return bool(match) and int(match.group(1)) >= arch.n_layers
