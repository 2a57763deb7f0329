"""The hybrid families: state-space mixers beside attention layers (``frontends.hf.families_ssm``
registers them; their checkpoint layouts are there).

=================  ==========================================================================
jamba              Mamba-1 mixers with weighted RMS norms on dt, B and C; GQA attention
                   (no RoPE) where i % attn_layer_period == attn_layer_offset; a softmax
                   top-k MoE (not renormalised) where i % expert_layer_period ==
                   expert_layer_offset, else a SwiGLU MLP; every layer both blocks
bamba              Mamba-2 mixers; GQA attention at ``attn_layer_indices`` with RoPE on half
                   of each head (``partial_rotary_factor`` 0.5 unless ``rope_parameters``
                   sets it); a SwiGLU MLP on every layer
granitemoehybrid   Granite-4.0-H: Bamba's layers by ``layer_types``; softmax top-k MoE
                   (renormalised) plus a shared SwiGLU MLP (the MLP alone with
                   ``num_local_experts`` 0); ``embedding_multiplier``, ``attention_multiplier``
                   as the attention scale, ``residual_multiplier`` on both branches, logits
                   divided by ``logits_scaling``; RoPE only with ``position_embedding_type``
                   "rope" (none: NoPE)
nemotron_h         one block per layer, each x + block(norm(x)), by ``layers_block_type`` (or
                   ``hybrid_override_pattern``: M Mamba-2, * attention (no RoPE), -
                   squared-ReLU MLP); Δ clamped to ``time_step_limit``
=================  ==========================================================================

Layer kinds accept transformers' legacy names ("mamba", "attention"). Keys a config.json
leaves out take transformers 5.24's defaults (``DEFAULTS``; Nemotron-H also reads its
legacy ``mamba_*`` names, which win, as in transformers). Refused, each with the key and
the value: attention or MLP biases irc's ops lack, activations other than SiLU (squared
ReLU in Nemotron-H's MLP), Granite's ``partial_rotary_factor`` (its RoPE ignores it),
Bamba's ``layer_types`` (transformers cannot set it), a ``num_hidden_layers`` that
disagrees with a Nemotron-H layer list (transformers warns and follows the list),
Nemotron-H's ``sliding_window`` (transformers ignores it) and its MoE's ``moe_latent_size``
(the latent projections around the experts).

Nemotron-H's MoE layers ("E": Nemotron-3 Nano's) are ``moe`` with ungated squared-ReLU
experts and shared expert (``activation="relu2"``), the experts' ``mixer.experts.{e}.up_proj``
and ``down_proj`` stacked into [E, F, d] and [E, d, F], DeepSeek-V3's sigmoid
router with ``e_score_correction_bias``, groups, renormalisation and scale.

transformers clamps Δ to ``time_step_limit`` in prefill only, not in its one-token step (as
mamba_ssm does: ``mamba_chunk_scan_combined`` takes ``dt_limit``, ``selective_state_update``
none); irc clamps in both, the same with the default (0, inf). Nemotron-H's clamp changed in
transformers 5.25: 5.24 clamped below at ``time_step_min`` (and ignored ``time_step_limit``),
5.25 clamps to ``time_step_limit`` as NVIDIA's own modeling code always did, ``time_step_min``
being only where ``dt_bias`` is initialised. irc follows 5.25 and NVIDIA: a checkpoint's
``time_step_min`` (0.001 in NVIDIA's configs) changes nothing at inference, and its
``time_step_limit`` ([0, inf] there) is the clamp. No config key selects 5.24's reading.
"""
from __future__ import annotations

from typing import Optional

from frontends.hf.config import (MAMBA2_KEYS, MAMBA_KEYS, Arch, Attention, Config, LayerSpec, RopeSpec,
                                 attention_dims, int_list, mamba2_config, mamba_config, read_rope, rope_dict,
                                 string_list)
from irc.yamlloc import Bad, boolean, layer_count, non_negative_int, positive_int, positive_number, string

MAMBA, ATTENTION = "linear_attention", "full_attention"
LEGACY_KINDS = {"mamba": MAMBA, "attention": ATTENTION}  # transformers' _LEGACY_LAYER_TYPE_REMAP
INF = float("inf")
_HYBRID = {"tie_word_embeddings": False, "hidden_act": "silu", "num_attention_heads": 32, "hidden_size": 4096,
           "num_hidden_layers": 32, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_conv_bias": True,
           "mamba_proj_bias": False}
_MAMBA2 = {**_HYBRID, "mamba_n_heads": 128, "mamba_d_head": "auto", "mamba_n_groups": 1, "mamba_d_state": 256,
           "time_step_limit": [0.0, INF], "attention_bias": False}
DEFAULTS = {
    "jamba": {**_HYBRID, "vocab_size": 65536, "intermediate_size": 14336, "num_key_value_heads": 8,
              "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "num_experts_per_tok": 2, "num_experts": 16,
              "expert_layer_period": 2, "expert_layer_offset": 1, "attn_layer_period": 8, "attn_layer_offset": 4,
              "mamba_d_state": 16, "mamba_dt_rank": "auto"},
    "bamba": {**_MAMBA2, "vocab_size": 128000, "intermediate_size": 14336, "num_key_value_heads": 8,
              "rms_norm_eps": 1e-5, "max_position_embeddings": 262144, "mlp_bias": False},
    "granitemoehybrid": {**_MAMBA2, "vocab_size": 32000, "intermediate_size": 11008, "rms_norm_eps": 1e-6,
                         "max_position_embeddings": 2048, "embedding_multiplier": 1.0, "logits_scaling": 1.0,
                         "residual_multiplier": 1.0, "attention_multiplier": 1.0, "num_local_experts": 8,
                         "num_experts_per_tok": 2, "shared_intermediate_size": 1024},
    "nemotron_h": {"vocab_size": 131072, "hidden_size": 4096, "tie_word_embeddings": False,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                   "max_position_embeddings": 4096, "attention_bias": False, "intermediate_size": 21504,
                   "mlp_hidden_act": "relu2", "mlp_bias": False, "ssm_state_size": 128, "mamba_num_heads": 128,
                   "mamba_head_dim": 64, "mamba_hidden_act": "silu", "n_groups": 8, "conv_kernel": 4,
                   "time_step_limit": [0.0, INF], "use_conv_bias": True, "use_bias": False,
                   "layer_norm_epsilon": 1e-5, "n_routed_experts": 8, "moe_intermediate_size": 7688,
                   "moe_shared_expert_intermediate_size": 7688, "moe_latent_size": None, "num_experts_per_tok": 2,
                   "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1, "norm_topk_prob": True},
}
JAMBA_MAMBA = {**MAMBA_KEYS, "expand": "mamba_expand", "d_inner": None, "state_size": "mamba_d_state",
               "conv_kernel": "mamba_d_conv", "dt_rank": "mamba_dt_rank", "conv_bias": "mamba_conv_bias",
               "proj_bias": "mamba_proj_bias"}
HYBRID_MAMBA2 = {**MAMBA2_KEYS, "heads": "mamba_n_heads", "head_dim": "mamba_d_head", "state_size": "mamba_d_state",
                 "groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv", "expand": "mamba_expand",
                 "conv_bias": "mamba_conv_bias", "proj_bias": "mamba_proj_bias"}
NEMOTRON_PATTERN = {"M": MAMBA, "*": ATTENTION, "-": "mlp", "E": "moe"}
NEMOTRON_DEFAULT_LAYERS = [MAMBA, "moe", ATTENTION, "mlp"]  # NemotronHConfig without either key
NEMOTRON_LEGACY = {"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv", "time_step_limit": "mamba_dt_limit",
                   "use_conv_bias": "mamba_conv_bias"}


# ---- shared readers ---------------------------------------------------------------------------

def _no(cfg: Config, *keys: str) -> None:
    """Refuse switches (biases) that add weights irc's ops do not have."""
    for key in keys:
        cfg.check(key, lambda v: not v, hint="irc's attention and MLPs here have no such bias")


def _silu(cfg: Config, key: str = "hidden_act") -> None:
    cfg.check(key, lambda v: v == "silu", hint="this family's mixers and gated MLPs use SiLU")


def _multiplier(cfg: Config, key: str) -> Optional[float]:
    """A positive multiplier, None when it is 1 (nothing to multiply)."""
    value = cfg.get(key, positive_number)
    return None if value == 1.0 else value


def _expert_count(cfg: Config, *keys: str) -> int:
    """The expert count under whichever of its names the config uses."""
    key = next((k for k in keys if cfg.has(k)), keys[0])
    return cfg.get(key, non_negative_int)


def _layer_kinds(cfg: Config, key: str, allowed: tuple, n: Optional[int] = None) -> list[str]:
    """The list of layer kinds under ``key`` (legacy names mapped), each one of ``allowed``,
    ``n`` of them when ``n`` is given."""
    kinds = [LEGACY_KINDS.get(kind, kind) for kind in cfg.get(key, string_list)]
    for kind in kinds:
        if kind not in allowed:
            raise cfg.unsupported(key, kind, hint=f"layer kinds: {', '.join(allowed)}")
    if n is not None and len(kinds) != n:
        raise cfg.error(key, f"has {len(kinds)} entries for {n} layers (num_hidden_layers)")
    return kinds


def _period(cfg: Config, period_key: str, offset_key: str) -> tuple[int, int]:
    period, offset = cfg.get(period_key, positive_int), cfg.get(offset_key, non_negative_int)
    if offset >= period:
        raise cfg.error(offset_key, f"{offset} is not below {period_key} {period}")
    return period, offset


def _arch(cfg: Config, name: str, model_type: str, d: int, layers: list[LayerSpec], attention: Attention,
          mlp: Optional[dict], eps_key: str = "rms_norm_eps", checkpoint: Optional[str] = None, **extra) -> Arch:
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=len(layers), norm_eps=cfg.get(eps_key, positive_number), attention=attention,
                layers=layers, mlp=mlp, tied=cfg.get("tie_word_embeddings", boolean),
                checkpoint=checkpoint or model_type, **extra)


# ---- the families -----------------------------------------------------------------------------

def _jamba(cfg: Config, name: str, model_type: str) -> Arch:
    """Jamba: Mamba-1 or attention, then MoE or MLP, on every layer."""
    _silu(cfg)
    d, heads, kv_heads, head_dim = attention_dims(cfg)
    n = cfg.get("num_hidden_layers", layer_count)
    attn_period, attn_offset = _period(cfg, "attn_layer_period", "attn_layer_offset")
    moe_period, moe_offset = _period(cfg, "expert_layer_period", "expert_layer_offset")
    experts = _expert_count(cfg, "num_experts", "num_local_experts")
    d_ff = cfg.get("intermediate_size", positive_int)
    eps = cfg.get("rms_norm_eps", positive_number)
    moe_layers = [experts > 1 and i % moe_period == moe_offset for i in range(n)]  # JambaMLP where 1 expert
    layers = [LayerSpec(None, None, moe=is_moe, mixer="attention" if i % attn_period == attn_offset else "mamba")
              for i, is_moe in enumerate(moe_layers)]
    moe = {"experts": experts, "top_k": cfg.get("num_experts_per_tok", positive_int), "d_ff": d_ff,
           "norm_topk_prob": False} if any(moe_layers) else None
    mlp = None if all(moe_layers) else {"kind": "swiglu", "d_ff": d_ff}
    return _arch(cfg, name, model_type, d, layers, Attention("gqa", heads, kv_heads, head_dim), mlp, moe=moe,
                 ssm=mamba_config(cfg, d, JAMBA_MAMBA, bcdt_norm="weighted", eps=eps))


def _bamba(cfg: Config, name: str, model_type: str) -> Arch:
    """Bamba: Mamba-2 or partial-RoPE attention, then a SwiGLU MLP, on every layer."""
    _silu(cfg)
    _no(cfg, "attention_bias", "mlp_bias")
    for key in ("layer_types", "layers_block_type"):
        if key in cfg.data:
            raise cfg.unsupported(key, cfg.data[key], hint="Bamba places its attention layers by attn_layer_indices")
    d, heads, kv_heads, head_dim = attention_dims(cfg)
    n = cfg.get("num_hidden_layers", layer_count)
    indices = set(cfg.get("attn_layer_indices", int_list, None) or [])
    outside = sorted(i for i in indices if not 0 <= i < n)
    if outside:
        raise cfg.error("attn_layer_indices", f"layer {outside[0]} is not one of the {n} layers (0 to {n - 1})")
    params, key = rope_dict(cfg)
    params.setdefault("partial_rotary_factor", 0.5)  # BambaConfig's, unless rope_parameters sets one
    rope = read_rope(cfg, head_dim, params, key, original_max=cfg.get("max_position_embeddings", positive_int))
    layers = [LayerSpec(None, rope, mixer="attention") if i in indices else LayerSpec(None, None, mixer="mamba2")
              for i in range(n)]
    return _arch(cfg, name, model_type, d, layers, Attention("gqa", heads, kv_heads, head_dim),
                 {"kind": "swiglu", "d_ff": cfg.get("intermediate_size", positive_int)}, checkpoint="jamba",
                 ssm=mamba2_config(cfg, d, HYBRID_MAMBA2, eps=cfg.get("rms_norm_eps", positive_number)))


def _granite_rope(cfg: Config, head_dim: int) -> Optional[RopeSpec]:
    kind = cfg.raw("position_embedding_type")
    if kind not in (None, "nope", "rope"):
        raise cfg.unsupported("position_embedding_type", kind, hint="Granite's attention: rope, or none (NoPE)")
    if kind != "rope":
        return None
    params, key = rope_dict(cfg)
    rope = read_rope(cfg, head_dim, params, key, original_max=cfg.get("max_position_embeddings", positive_int))
    if rope.rotary_dim is not None:
        raise cfg.unsupported(f"{key}.partial_rotary_factor", params.get("partial_rotary_factor"),
                              hint="Granite rotates the whole head (its default RoPE ignores the factor)")
    return rope


def _granite(cfg: Config, name: str, model_type: str) -> Arch:
    """Granite-4.0-H: Bamba's layers, MoE plus a shared MLP, µP multipliers."""
    _silu(cfg)
    _no(cfg, "attention_bias")
    d, heads, kv_heads, head_dim = attention_dims(cfg)
    n = cfg.get("num_hidden_layers", layer_count)
    key = "layers_block_type" if "layers_block_type" in cfg.data and "layer_types" not in cfg.data else "layer_types"
    kinds = _layer_kinds(cfg, key, (MAMBA, ATTENTION), n) if cfg.has(key) else [MAMBA] * n
    rope = _granite_rope(cfg, head_dim)
    experts = _expert_count(cfg, "num_local_experts")
    layers = [LayerSpec(None, rope, bool(experts), mixer="attention") if kind == ATTENTION
              else LayerSpec(None, None, bool(experts), mixer="mamba2") for kind in kinds]
    shared = cfg.get("shared_intermediate_size", positive_int)
    moe = mlp = None
    if experts:
        moe = {"experts": experts, "top_k": cfg.get("num_experts_per_tok", positive_int),
               "d_ff": cfg.get("intermediate_size", positive_int), "norm_topk_prob": True, "shared_experts": 1,
               "shared_d_ff": shared}
    else:
        mlp = {"kind": "swiglu", "d_ff": shared}
    attention = Attention("gqa", heads, kv_heads, head_dim, scale=cfg.get("attention_multiplier", positive_number))
    logits_scaling = _multiplier(cfg, "logits_scaling")
    return _arch(cfg, name, model_type, d, layers, attention, mlp, moe=moe,
                 ssm=mamba2_config(cfg, d, HYBRID_MAMBA2, eps=cfg.get("rms_norm_eps", positive_number)),
                 embedding_scale=_multiplier(cfg, "embedding_multiplier"),
                 residual_scale=_multiplier(cfg, "residual_multiplier"),
                 logits_scale=None if logits_scaling is None else 1.0 / logits_scaling)


def _nemotron_kinds(cfg: Config) -> tuple[list[str], str]:
    """(the layer kinds, the key they came from): ``layers_block_type`` (or ``layer_types``),
    else ``hybrid_override_pattern``, else NemotronHConfig's default."""
    for key in ("layers_block_type", "layer_types"):
        if cfg.has(key):
            return _layer_kinds(cfg, key, (MAMBA, ATTENTION, "mlp", "moe")), key
    key = "hybrid_override_pattern"
    if not cfg.has(key):
        return list(NEMOTRON_DEFAULT_LAYERS), "layers_block_type"
    pattern = cfg.get(key, string)
    for char in pattern:
        if char not in NEMOTRON_PATTERN:
            raise cfg.error(key, f"{char!r} is not a layer kind",
                            hint="M Mamba-2, * attention, - MLP, E MoE (one character a layer)")
    return [NEMOTRON_PATTERN[char] for char in pattern], key


def _nemotron_h(cfg: Config, name: str, model_type: str) -> Arch:
    """Nemotron-H: one pre-normed residual block per layer (Mamba-2, attention or MLP)."""
    kinds, kinds_key = _nemotron_kinds(cfg)
    try:
        layer_count(len(kinds))
    except Bad as err:
        raise cfg.error(kinds_key, f"{len(kinds)} layers: {err}") from None
    if cfg.has("num_hidden_layers") and cfg.get("num_hidden_layers", positive_int) != len(kinds):
        raise cfg.error("num_hidden_layers", f"{cfg.raw('num_hidden_layers')} layers, but {kinds_key} gives "
                                             f"{len(kinds)}", hint="transformers follows the layer list")
    keys = {key: old if old in cfg.data else key for key, old in NEMOTRON_LEGACY.items()}  # legacy names win
    _silu(cfg, "mamba_hidden_act")
    cfg.check("mlp_hidden_act", lambda v: v == "relu2", hint="Nemotron-H's MLP is squared ReLU (relu2)")
    _no(cfg, "attention_bias")
    cfg.check("sliding_window", lambda v: v is None, hint="transformers' Nemotron-H ignores it; irc refuses to guess")
    d, heads, kv_heads, head_dim = attention_dims(cfg)
    ssm = mamba2_config(cfg, d, {**MAMBA2_KEYS, "heads": "mamba_num_heads", "head_dim": "mamba_head_dim",
                                 "state_size": "ssm_state_size", "groups": keys["n_groups"],
                                 "conv_kernel": keys["conv_kernel"], "expand": None,
                                 "conv_bias": keys["use_conv_bias"], "time_step_limit": keys["time_step_limit"]})
    mixers = {MAMBA: "mamba2", ATTENTION: "attention", "mlp": None, "moe": None}
    layers = [LayerSpec(None, None, moe=kind == "moe", mixer=mixers[kind], ffn=kind in ("mlp", "moe"))
              for kind in kinds]
    mlp = {"kind": "relu2", "d_ff": cfg.get("intermediate_size", positive_int), "bias": cfg.get("mlp_bias", boolean)}
    return _arch(cfg, name, model_type, d, layers, Attention("gqa", heads, kv_heads, head_dim),
                 mlp if "mlp" in kinds else None, eps_key="layer_norm_epsilon", ssm=ssm,
                 moe=_nemotron_moe(cfg) if "moe" in kinds else None)


def _nemotron_moe(cfg: Config) -> dict:
    """Nemotron-H's MoE (Nemotron-3 Nano's) as ``Layer.moe``'s arguments: ungated squared-ReLU
    experts and shared expert (``relu2``), DeepSeek-V3's sigmoid router with its correction
    bias, groups (top-2 sums), renormalisation and scale."""
    cfg.check("moe_latent_size", lambda v: v is None,
              hint="the latent projections around the experts (fc1/fc2_latent_proj) are not supported")
    _no(cfg, "mlp_bias")
    experts, top_k = cfg.get("n_routed_experts", positive_int), cfg.get("num_experts_per_tok", positive_int)
    groups, top_groups = cfg.get("n_group", positive_int), cfg.get("topk_group", positive_int)
    if experts % groups or top_groups > groups or top_k > top_groups * (experts // groups):
        raise cfg.error("num_experts_per_tok", f"top_k {top_k} of {experts} experts in {top_groups} of {groups} "
                                               "groups (n_group, topk_group) cannot be routed")
    return {"experts": experts, "top_k": top_k, "d_ff": cfg.get("moe_intermediate_size", positive_int),
            "shared_experts": 1, "shared_d_ff": cfg.get("moe_shared_expert_intermediate_size", positive_int),
            "scoring": "sigmoid", "router_bias": True, "norm_topk_prob": cfg.get("norm_topk_prob", boolean),
            "routed_scale": cfg.get("routed_scaling_factor", positive_number), "groups": groups,
            "top_groups": top_groups, "group_score": "top2_sum", "activation": "relu2"}


FAMILIES = {"jamba": _jamba, "bamba": _bamba, "granitemoehybrid": _granite, "nemotron_h": _nemotron_h}

__all__ = ["DEFAULTS", "FAMILIES"]
