"""LiquidAI's LFM2 and LFM2-MoE: gated short convolutions between attention layers
(``frontends.hf.families`` registers them).

=================  ==========================================================================
lfm2               by ``layer_types`` ("conv" | "full_attention"; without it
                   ``full_attn_idxs``, default every layer attention): the short conv
                   (``Layer.short_conv``: in_proj -> B, C, x; B·x -> causal conv of
                   ``conv_L_cache`` taps, no activation -> C· -> out_proj) or GQA attention
                   with per-head RMS norms of q and k and RoPE (default base 1e6); every layer
                   then a SwiGLU MLP
lfm2_moe           LFM2's layers; the first ``num_dense_layers`` a SwiGLU MLP of
                   ``intermediate_size``, the others a MoE: sigmoid scores, top-k selected on
                   score + ``expert_bias`` (``use_expert_bias``), weights the unbiased scores,
                   renormalised (``norm_topk_prob``), times ``routed_scaling_factor``
=================  ==========================================================================

Each layer is x + mixer(operator_norm(x)), then x + ffn(ffn_norm(x)); the final norm is
``model.embedding_norm`` (applied after the last layer, despite its name), eps ``norm_eps``
everywhere. Embeddings are tied unless ``tie_word_embeddings`` (or the older
``tie_embedding``, which wins as in transformers) is false.

LFM2's MLP width is not ``intermediate_size`` (nor the older ``block_ff_dim``, which wins):
with ``block_auto_adjust_ff_dim`` it is int(2·size / 3), and with a
``block_ffn_dim_multiplier`` (not null) int(multiplier·that) rounded up to a multiple of
``block_multiple_of`` (LFM2-1.2B: 12288 -> 8192). LFM2-MoE's dense MLP is
``intermediate_size`` as it stands.

The conv state is [B, hidden_size, conv_L_cache - 1] (``past_key_values.{i}.conv_state``).
transformers zeroes a padded token before in_proj; irc zeroes it at the convolution's input,
the same unless ``conv_bias`` gives in_proj a bias (then transformers' padded positions feed
bias·bias into the conv state, and irc's do not).

One difference from transformers that stays: LFM2-MoE renormalises its top-k weights by
sum + 1e-6, irc's ``moe`` op by sum + 1e-20 (a relative difference of 1e-6 / sum, under
1e-6 once the chosen scores sum past 1).

Refused, naming config.json and the key: a ``layer_types`` entry other than the two kinds or
a list whose length is not ``num_hidden_layers``, ``full_attn_idxs`` outside the layers,
LFM2-MoE without ``layer_types`` (transformers' model cannot be built without it),
``conv_L_cache`` < 1, a ``partial_rotary_factor`` (LFM2's default RoPE rotates the whole
head), and a ``block_ffn_dim_multiplier`` that leaves no MLP.
"""
from __future__ import annotations

from typing import Callable

from frontends.hf.config import (Arch, Attention, Config, LayerSpec, attention_dims, int_list, layer_types, read_rope,
                                 rope_dict)
from irc.yamlloc import boolean, layer_count, non_negative_int, positive_int, positive_number, size

CONV, ATTENTION = "conv", "full_attention"
KINDS = (CONV, ATTENTION)
_LFM2 = {"vocab_size": 65536, "num_attention_heads": 32, "num_key_value_heads": 8,
         "max_position_embeddings": 128000, "norm_eps": 1e-5, "tie_word_embeddings": True, "conv_bias": False,
         "conv_L_cache": 3, "rope_theta": 1e6, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
DEFAULTS = {  # transformers 5.24's Lfm2Config and Lfm2MoeConfig
    "lfm2": {**_LFM2, "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 32,
             "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True},
    "lfm2_moe": {**_LFM2, "hidden_size": 2048, "intermediate_size": 7168, "moe_intermediate_size": 1792,
                 "num_hidden_layers": 32, "num_dense_layers": 2, "num_experts_per_tok": 4, "num_experts": 32,
                 "use_expert_bias": True, "routed_scaling_factor": 1.0, "norm_topk_prob": True},
}


def layer_kinds(cfg: Config, n: int, model_type: str) -> list[str]:
    """Each layer's kind, "conv" or "full_attention": ``layer_types``, else (LFM2 only)
    attention at ``full_attn_idxs`` (default: every layer) and conv elsewhere."""
    if not cfg.has("layer_types"):
        if model_type == "lfm2_moe":
            raise cfg.error("layer_types", "missing required key",
                            hint="LFM2-MoE lists its layers' kinds: \"conv\" or \"full_attention\", one per layer")
        attention = cfg.get("full_attn_idxs", int_list, None)
        attention = set(range(n) if attention is None else attention)
        outside = sorted(i for i in attention if not 0 <= i < n)
        if outside:
            raise cfg.error("full_attn_idxs", f"layer {outside[0]} is not one of the {n} layers (0 to {n - 1})")
        return [ATTENTION if i in attention else CONV for i in range(n)]
    return layer_types(cfg, n, KINDS, "LFM2's")


def mlp_width(cfg: Config) -> int:
    """LFM2's SwiGLU width from ``intermediate_size`` (``block_ff_dim`` wins) as Lfm2MLP
    computes it (see the module docstring)."""
    key = "block_ff_dim" if cfg.has("block_ff_dim") else "intermediate_size"
    width = cfg.get(key, size)
    if not cfg.get("block_auto_adjust_ff_dim", boolean):
        return width
    width = int(2 * width / 3)
    multiplier = cfg.get("block_ffn_dim_multiplier", positive_number, None)
    if multiplier is not None:
        multiple = cfg.get("block_multiple_of", positive_int)
        width = multiple * ((int(multiplier * width) + multiple - 1) // multiple)
    if width < 1:
        raise cfg.error("block_ffn_dim_multiplier" if multiplier is not None else key,
                        f"leaves an MLP of {width} features", hint="int(2 * intermediate_size / 3) must be positive")
    return size(width)


def _lfm2(cfg: Config, name: str, model_type: str) -> Arch:
    """LFM2 and LFM2-MoE: short conv or attention, then an MLP or MoE, on every layer."""
    d, heads, kv_heads, head_dim = attention_dims(cfg)
    n = cfg.get("num_hidden_layers", layer_count)
    kinds = layer_kinds(cfg, n, model_type)
    params, key = rope_dict(cfg)
    rope = read_rope(cfg, head_dim, params, key, default_base=cfg.defaults["rope_theta"],
                     original_max=cfg.get("max_position_embeddings", positive_int, None))
    if rope.rotary_dim is not None:
        where = f"{key}.partial_rotary_factor" if "partial_rotary_factor" in params else "partial_rotary_factor"
        raise cfg.unsupported(where, params.get("partial_rotary_factor", cfg.raw("partial_rotary_factor")),
                              hint="LFM2's default RoPE rotates the whole head")
    conv = {"kind": "short_conv", "conv_kernel": cfg.get("conv_L_cache", size),
            "bias": cfg.get("conv_bias", boolean)}
    moe = None
    if model_type == "lfm2_moe":
        dense = cfg.get("num_dense_layers", non_negative_int)
        moe_layers = [i >= dense for i in range(n)]
        mlp = {"kind": "swiglu", "d_ff": cfg.get("intermediate_size", size)} if dense else None
        if any(moe_layers):
            moe = {"experts": cfg.get("num_experts", positive_int),
                   "top_k": cfg.get("num_experts_per_tok", positive_int),
                   "d_ff": cfg.get("moe_intermediate_size", size), "scoring": "sigmoid",
                   "router_bias": cfg.get("use_expert_bias", boolean),
                   "norm_topk_prob": cfg.get("norm_topk_prob", boolean),
                   "routed_scale": cfg.get("routed_scaling_factor", positive_number)}
    else:
        moe_layers, mlp = [False] * n, {"kind": "swiglu", "d_ff": mlp_width(cfg)}
    layers = [LayerSpec(None, rope, is_moe) if kind == ATTENTION else LayerSpec(None, None, is_moe, mixer="short_conv")
              for kind, is_moe in zip(kinds, moe_layers)]
    tied_key = "tie_embedding" if "tie_embedding" in cfg.data else "tie_word_embeddings"
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("norm_eps", positive_number),
                attention=Attention("gqa", heads, kv_heads, head_dim, qk_norm=True), layers=layers, mlp=mlp,
                moe=moe, tied=cfg.get(tied_key, boolean), checkpoint="lfm2", ssm=conv)


FAMILIES = {"lfm2": _lfm2, "lfm2_moe": _lfm2}

_TOP = {"embed": "model.embed_tokens.weight", "norm": "model.embedding_norm.weight", "lm_head": "lm_head.weight"}
_EXPERTS = {"gate": "w1", "up": "w3", "down": "w2"}


def layouts(experts: Callable[[str], object]) -> dict:
    """The checkpoint layout (irc name under layers.{i}. -> the name under
    model.layers.{i}.); ``experts(template)`` makes the entry of per-expert tensors stacked
    into one param (``families.Experts``, passed in: that module imports this one)."""
    return {"lfm2": {
        **{norm: "operator_norm.weight" for norm in ("attn_norm", "ssm_norm")}, "mlp_norm": "ffn_norm.weight",
        **{f"attn.w{x}": f"self_attn.{x}_proj.weight" for x in "qkv"}, "attn.wo": "self_attn.out_proj.weight",
        "attn.q_norm": "self_attn.q_layernorm.weight", "attn.k_norm": "self_attn.k_layernorm.weight",
        **{f"ssm.{p}": f"conv.{p}.weight" for p in ("in_proj", "out_proj")}, "ssm.conv": "conv.conv.weight",
        **{f"ssm.{p}_bias": f"conv.{p}.bias" for p in ("in_proj", "out_proj")}, "ssm.conv_bias": "conv.conv.bias",
        **{f"mlp.w_{x}": f"feed_forward.{w}.weight" for x, w in _EXPERTS.items()},
        "moe.router": "feed_forward.gate.weight", "moe.router_bias": "feed_forward.expert_bias",
        **{f"moe.w_{x}": experts(f"feed_forward.experts.{{e}}.{w}.weight") for x, w in _EXPERTS.items()},
        "_top": _TOP}}


__all__ = ["DEFAULTS", "FAMILIES", "layouts", "layer_kinds", "mlp_width"]
