"""The state-space families irc reads from config.json (``frontends.hf.families`` dispatches
here for these model types):

=================  ==========================================================================
mamba              Mamba-1: every layer x + mixer(norm(x)); selective scan, per-channel A
falcon_mamba       Mamba-1 with weightless RMS norms on dt, B and C (``mixer_rms_eps``)
mamba2             Mamba-2: SSD with n_groups of B and C, dt_bias, ``time_step_limit``,
                   the gated RMS norm grouped by n_groups
=================  ==========================================================================

Sizes follow transformers' config classes: ``intermediate_size`` = expand · hidden_size,
``time_step_rank`` "auto" = ceil(hidden_size / 16); Mamba-2 checks num_heads · head_dim
== expand · hidden_size (as ``validate_architecture`` does). Norms read
``layer_norm_epsilon``. transformers clamps Mamba-2's Δ to ``time_step_limit`` in prefill
but not in its one-token step; irc clamps in both (the same with the default (0, inf)).

Checkpoint names: ``backbone.embeddings.weight``, ``backbone.layers.{i}.norm.weight``,
``backbone.layers.{i}.mixer.*``, ``backbone.norm_f.weight``, ``lm_head.weight`` (left out
when tied).
"""
from __future__ import annotations

import math
from typing import Optional

from frontends.hf.config import Arch, Config, LayerSpec
from irc.yamlloc import boolean, layer_count, positive_int, positive_number, size

_MAMBA = {"layer_norm_epsilon": 1e-5, "expand": 2, "conv_kernel": 4, "use_bias": False, "use_conv_bias": True,
          "hidden_act": "silu", "time_step_rank": "auto", "tie_word_embeddings": True, "state_size": 16,
          "residual_in_fp32": True}
DEFAULTS = {
    "mamba": dict(_MAMBA),
    "falcon_mamba": {**_MAMBA, "mixer_rms_eps": 1e-6},
    "mamba2": {**_MAMBA, "num_heads": 128, "head_dim": 64, "state_size": 128, "n_groups": 8,
               "time_step_limit": [0.0, float("inf")], "tie_word_embeddings": False},
}


def ssm_names(mixer: str) -> dict:
    """irc's ``ssm.*`` params -> the checkpoint's names under ``{layer}.{mixer}.`` (the
    Mamba mixers of every family name their tensors alike)."""
    return {
        "ssm.in_proj": f"{mixer}.in_proj.weight", "ssm.in_proj_bias": f"{mixer}.in_proj.bias",
        "ssm.conv": f"{mixer}.conv1d.weight", "ssm.conv_bias": f"{mixer}.conv1d.bias",
        "ssm.x_proj": f"{mixer}.x_proj.weight", "ssm.dt_proj": f"{mixer}.dt_proj.weight",
        "ssm.dt_proj_bias": f"{mixer}.dt_proj.bias", "ssm.A_log": f"{mixer}.A_log", "ssm.D": f"{mixer}.D",
        "ssm.dt_bias": f"{mixer}.dt_bias", "ssm.norm": f"{mixer}.norm.weight",
        "ssm.out_proj": f"{mixer}.out_proj.weight", "ssm.out_proj_bias": f"{mixer}.out_proj.bias",
        "ssm.dt_norm": f"{mixer}.dt_layernorm.weight", "ssm.B_norm": f"{mixer}.b_layernorm.weight",
        "ssm.C_norm": f"{mixer}.c_layernorm.weight",
    }


BACKBONE = {"embed": "backbone.embeddings.weight", "norm": "backbone.norm_f.weight", "lm_head": "lm_head.weight"}
LAYOUTS = {  # a family layout: layer names, and where it departs from model.layers.{i} / model.*
    "mamba": {"ssm_norm": "norm.weight", **ssm_names("mixer"), "_prefix": "backbone.layers.", "_top": BACKBONE},
}


def _time_step_rank(cfg: Config, d: int) -> int:
    rank = cfg.raw("time_step_rank")
    if rank == "auto":
        return math.ceil(d / 16)
    return cfg.get("time_step_rank", positive_int)


def _common(cfg: Config) -> tuple[int, int]:
    """(hidden_size, num_hidden_layers), with the settings every Mamba mixer shares checked."""
    cfg.check("hidden_act", lambda v: v == "silu", hint="the Mamba mixers irc builds use SiLU")
    return cfg.get("hidden_size", size), cfg.get("num_hidden_layers", layer_count)


def mamba_config(cfg: Config, d: int, plain_norms: bool = False, weighted_norms: bool = False,
                 eps: Optional[float] = None) -> dict:
    """``Layer.mamba`` arguments from a Mamba-1 mixer's keys."""
    expand = cfg.get("expand", positive_int)
    d_inner = cfg.get("intermediate_size", positive_int) if cfg.has("intermediate_size") else expand * d
    norm = "plain" if plain_norms else "weighted" if weighted_norms else None
    config = {"kind": "mamba", "d_inner": d_inner, "state_size": cfg.get("state_size", positive_int),
              "conv_kernel": cfg.get("conv_kernel", positive_int), "dt_rank": _time_step_rank(cfg, d),
              "conv_bias": cfg.get("use_conv_bias", boolean), "proj_bias": cfg.get("use_bias", boolean),
              "bcdt_norm": norm}
    if norm is not None:
        config["norm_eps"] = eps
    return config


def _special_float(value):
    """transformers 5 writes an infinite float as ``{"__float__": "Infinity"}``."""
    if isinstance(value, dict) and set(value) == {"__float__"} and value["__float__"] in ("Infinity", "-Infinity"):
        return float(value["__float__"].replace("Infinity", "inf"))
    return value


def time_step_limit(cfg: Config, key: str = "time_step_limit") -> tuple[float, Optional[float]]:
    """(dt_min, dt_max) from a [low, high] pair (high infinite: None)."""
    value = cfg.raw(key)
    if isinstance(value, (list, tuple)):
        value = [_special_float(v) for v in value]
    if not isinstance(value, (list, tuple)) or len(value) != 2 or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
        raise cfg.error(key, f"expected [low, high], got {value!r}")
    low, high = float(value[0]), float(value[1])
    if low < 0 or high < low:
        raise cfg.error(key, f"expected 0 <= low <= high, got {value!r}")
    return low, None if math.isinf(high) else high


def mamba2_config(cfg: Config, d: int, heads_key: str = "num_heads", head_dim_key: str = "head_dim",
                  state_key: str = "state_size", groups_key: str = "n_groups", kernel_key: str = "conv_kernel",
                  expand_key: Optional[str] = "expand", eps: Optional[float] = None,
                  group_norm: bool = True) -> dict:
    """``Layer.mamba2`` arguments from a Mamba-2 mixer's keys (named as the family names
    them); the checks of transformers' ``validate_architecture``."""
    heads = cfg.get(heads_key, positive_int)
    head_dim = cfg.get(head_dim_key, positive_int)
    groups = cfg.get(groups_key, positive_int)
    if expand_key is not None:
        expand = cfg.get(expand_key, positive_int)
        if heads * head_dim != expand * d:
            raise cfg.error(heads_key, f"{heads} heads x {head_dim} head_dim = {heads * head_dim} is not "
                                       f"{expand_key} x hidden_size = {expand * d}")
    if heads % groups:
        raise cfg.error(groups_key, f"{groups} groups do not divide {heads} heads")
    dt_min, dt_max = time_step_limit(cfg)
    d_inner = heads * head_dim
    return {"kind": "mamba2", "heads": heads, "head_dim": head_dim, "state_size": cfg.get(state_key, positive_int),
            "groups": groups, "conv_kernel": cfg.get(kernel_key, positive_int),
            "conv_bias": cfg.get("use_conv_bias", boolean), "proj_bias": cfg.get("use_bias", boolean),
            "dt_min": dt_min, "dt_max": dt_max,
            "norm_eps": eps if eps is not None else cfg.get("layer_norm_epsilon", positive_number),
            "norm_group_size": d_inner // groups if group_norm else None}


def _mamba(cfg: Config, name: str, model_type: str) -> Arch:
    """Mamba-1, Falcon-Mamba and Mamba-2: pure state-space decoders."""
    d, n = _common(cfg)
    eps = cfg.get("layer_norm_epsilon", positive_number)
    if model_type == "mamba2":
        ssm = mamba2_config(cfg, d)
    else:
        ssm = mamba_config(cfg, d, plain_norms=model_type == "falcon_mamba",
                           eps=cfg.get("mixer_rms_eps", positive_number, None) if model_type == "falcon_mamba"
                           else None)
    layers = [LayerSpec(None, None, mixer=ssm["kind"], ffn=False) for _ in range(n)]
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=eps, attention=None, layers=layers, mlp=None,
                tied=cfg.get("tie_word_embeddings", boolean), checkpoint="mamba", ssm=ssm)


FAMILIES = {"mamba": _mamba, "falcon_mamba": _mamba, "mamba2": _mamba}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS", "ssm_names", "mamba_config", "mamba2_config", "time_step_limit"]
