"""The YAML architecture form's layer stack (part of ``frontends.yaml_spec``, whose docstring
documents the keys): the ``layers`` pattern, the ``mamba`` / ``mamba2`` / ``short_conv`` / ``gated_delta`` /
``kimi_delta`` / ``lightning`` sections read into the arguments of ``Layer.mamba`` /
``Layer.mamba2`` / ``Layer.short_conv`` / ``Layer.gated_delta`` / ``Layer.kimi_delta`` /
``Layer.lightning_attention``
(as ``frontends.hf`` reads a config.json into them, so the two build the same graph), and
which layers ``moe.layers`` / ``moe.dense_layers`` make MoE. Every mistake is a
``SpecError`` at the offending key."""
from __future__ import annotations

import math
from typing import Optional

from irc import yamlloc
from irc.errors import SpecError
from irc.graph import plain_copy
from irc.yamlloc import Bad, Fields, boolean, choice, non_negative_int, optional, positive_int, positive_number, size

LAYERS_KEYS = ("pattern", "feed_forward", "parallel")
MAMBA_KEYS = ("d_inner", "expand", "state_size", "conv_kernel", "dt_rank", "conv_bias", "proj_bias", "bcdt_norm",
              "norm_eps")
MAMBA2_KEYS = ("n_heads", "head_dim", "expand", "state_size", "n_groups", "conv_kernel", "conv_bias", "proj_bias",
               "time_step_limit", "norm_eps", "norm_before_gate")
SHORT_CONV_KEYS = ("conv_kernel", "bias")
GATED_DELTA_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                    "linear_conv_kernel_dim", "projections", "conv_bias", "norm_eps")
GATED_DELTA_ARGS = {"key_heads": "linear_num_key_heads", "value_heads": "linear_num_value_heads",
                    "key_dim": "linear_key_head_dim", "value_dim": "linear_value_head_dim",
                    "conv_kernel": "linear_conv_kernel_dim"}  # Layer.gated_delta argument -> its YAML key
KIMI_DELTA_KEYS = ("heads", "head_dim", "conv_kernel", "norm_eps")
LIGHTNING_KEYS = ("heads", "head_dim", "norm_eps")
MIXERS = ("attention", "mamba", "mamba2", "conv", "gated_delta", "kimi_delta", "lightning", "mamba+attention",
          "mamba2+attention")
FEED_FORWARD = ("mlp", "moe")
LETTERS = {"M": "mamba2", "*": "attention", "-": "mlp", "E": "moe"}  # Nemotron-H's hybrid_override_pattern
MAMBA2_ARGS = {"heads": "n_heads", "groups": "n_groups", "norm_group_size": "n_groups", "dt_min": "time_step_limit",
               "dt_max": "time_step_limit"}  # Layer.mamba2 argument -> its YAML key


def read_pattern(layers: Optional[Fields], n_layers: int) -> tuple[list, bool]:
    """(each layer's kind, whether a mixer layer is followed by the mlp/moe block)."""
    if layers is None or "pattern" not in layers.data:  # every layer attention (layers: {parallel: ...})
        return ["attention"] * n_layers, True if layers is None else layers.get("feed_forward", boolean, True)
    if isinstance(layers.data.get("pattern"), str):
        pattern = layers.get("pattern", _letters)
    else:
        pattern = layers.items("pattern", choice(*MIXERS, *FEED_FORWARD), required=True)
    if not pattern:
        raise layers.error("pattern", "expected at least one layer kind")
    if n_layers % len(pattern):
        raise layers.error("pattern", f"{len(pattern)} kinds do not divide n_layers {n_layers}",
                           hint="give one kind per layer, or a pattern whose length divides n_layers")
    feed_forward = layers.get("feed_forward", boolean, not any(k in FEED_FORWARD for k in pattern))
    return pattern * (n_layers // len(pattern)), feed_forward


def _letters(text: str) -> list:
    """Nemotron-H's hybrid_override_pattern: one letter a layer."""
    for i, letter in enumerate(text):
        if letter not in LETTERS:
            raise Bad(f"letter {i} {letter!r} is not a layer letter ("
                      + ", ".join(f"{k} {v}" for k, v in LETTERS.items()) + ")")
    return [LETTERS[letter] for letter in text]


def read_mamba(s: Optional[Fields], d_model: int, norm_eps: float) -> Optional[dict]:
    """``Layer.mamba`` arguments (as the HF frontend's ``mamba_config`` gives them)."""
    if s is None:
        return None
    if s.has("d_inner") and s.has("expand"):
        raise s.error("d_inner", "give d_inner or expand, not both")
    expand = s.get("expand", positive_int, 2)
    config = {"d_inner": s.get("d_inner", size, expand * d_model), "state_size": s.get("state_size", size, 16),
              "conv_kernel": s.get("conv_kernel", positive_int, 4),
              "dt_rank": s.get("dt_rank", size, math.ceil(d_model / 16)),
              "conv_bias": s.get("conv_bias", boolean, True), "proj_bias": s.get("proj_bias", boolean, False),
              "bcdt_norm": s.get("bcdt_norm", optional(choice("weighted", "plain")), None)}
    if config["bcdt_norm"] is not None:
        config["norm_eps"] = s.get("norm_eps", positive_number, norm_eps)
    elif s.has("norm_eps"):
        raise s.error("norm_eps", "applies with bcdt_norm only")
    return config


def read_mamba2(s: Optional[Fields], d_model: int, norm_eps: float) -> Optional[dict]:
    """``Layer.mamba2`` arguments (as the HF frontend's ``mamba2_config`` gives them): the
    gated norm over d_inner / n_groups features at a time."""
    if s is None:
        return None
    head_dim = s.get("head_dim", size, 64)
    expand = s.get("expand", positive_int, None)
    heads = s.get("n_heads", size, None)
    if heads is None:
        inner = (expand or 2) * d_model
        if inner % head_dim:
            raise s.error("head_dim", f"expand x d_model = {inner} is not divisible by head_dim {head_dim}",
                          hint="give n_heads")
        heads = inner // head_dim
    elif expand is not None and heads * head_dim != expand * d_model:
        raise s.error("n_heads", f"{heads} heads x head_dim {head_dim} = {heads * head_dim} is not expand x "
                                 f"d_model = {expand} x {d_model} = {expand * d_model}")
    groups = s.get("n_groups", positive_int, 1)
    if heads % groups:
        raise s.error("n_groups", f"{groups} groups do not divide {heads} heads")
    dt_min, dt_max = s.get("time_step_limit", _time_step_limit, (0.0, None))
    return {"heads": heads, "head_dim": head_dim, "state_size": s.get("state_size", size, 128), "groups": groups,
            "conv_kernel": s.get("conv_kernel", positive_int, 4), "conv_bias": s.get("conv_bias", boolean, True),
            "proj_bias": s.get("proj_bias", boolean, False), "dt_min": dt_min, "dt_max": dt_max,
            "norm_eps": s.get("norm_eps", positive_number, norm_eps), "norm_group_size": heads * head_dim // groups,
            "norm_before_gate": s.get("norm_before_gate", boolean, False)}


def read_short_conv(s: Optional[Fields]) -> Optional[dict]:
    """``Layer.short_conv`` arguments (LFM2's conv_L_cache and conv_bias)."""
    if s is None:
        return None
    return {"conv_kernel": s.get("conv_kernel", size, 3), "bias": s.get("bias", boolean, False)}


def read_gated_delta(s: Optional[Fields], norm_eps: float) -> Optional[dict]:
    """``Layer.gated_delta`` arguments from Qwen3-Next's config names (its defaults)."""
    if s is None:
        return None
    key_heads = s.get("linear_num_key_heads", size, 16)
    value_heads = s.get("linear_num_value_heads", size, 32)
    if value_heads % key_heads:
        raise s.error("linear_num_value_heads", f"{value_heads} value heads are not a multiple of {key_heads} "
                                                f"key heads", hint="each key head serves a whole group of value heads")
    return {"key_heads": key_heads, "value_heads": value_heads, "key_dim": s.get("linear_key_head_dim", size, 128),
            "value_dim": s.get("linear_value_head_dim", size, 128),
            "conv_kernel": s.get("linear_conv_kernel_dim", size, 4),
            "projections": s.get("projections", choice("split", "fused"), "split"),
            "conv_bias": s.get("conv_bias", boolean, False), "norm_eps": s.get("norm_eps", positive_number, norm_eps)}


def read_kimi_delta(s: Optional[Fields], norm_eps: float) -> Optional[dict]:
    """``Layer.kimi_delta`` arguments (Kimi-Linear's linear_attn_config; its defaults)."""
    if s is None:
        return None
    return {"heads": s.get("heads", size, 32), "head_dim": s.get("head_dim", size, 128),
            "conv_kernel": s.get("conv_kernel", size, 4), "norm_eps": s.get("norm_eps", positive_number, norm_eps)}


def read_lightning(s: Optional[Fields]) -> Optional[dict]:
    """``Layer.lightning_attention`` arguments but the per-layer slopes (MiniMax's formula,
    ``frontends.dsl_lightning.lightning_slopes``); the norm's eps [1e-6, as MiniMax's]."""
    if s is None:
        return None
    return {"heads": s.get("heads", size), "head_dim": s.get("head_dim", size),
            "norm_eps": s.get("norm_eps", positive_number, 1e-6)}


def _time_step_limit(value) -> tuple[float, Optional[float]]:
    """(dt_min, dt_max) from [low, high]; high .inf or null: no upper limit (None)."""
    numbers = isinstance(value, list) and len(value) == 2 and all(
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in value)
    low, high = value if numbers else (None, None)
    high = None if high is None or high == math.inf else high
    if low is None or not math.isfinite(low) or low < 0 or (high is not None and not low <= high):
        raise Bad(f"expected [low, high] with 0 <= low <= high (high .inf: no limit), got {plain_copy(value)!r}")
    return float(low), None if high is None else float(high)


def moe_layers(moe: Fields, n_layers: int, feed_forward: bool) -> set:
    """The mixer layers whose feed-forward block is MoE: ``layers`` (a list, or
    ``{period, offset}``), or all but ``dense_layers``, or all."""
    everything = set(range(n_layers))
    keys = [key for key in ("layers", "dense_layers") if moe.data.get(key) is not None]
    if len(keys) == 2:
        raise moe.error("layers", "give layers or dense_layers, not both")
    if keys and not feed_forward:
        raise moe.error(keys[0], "chooses among mixer layers' feed-forward blocks, and they have none",
                        hint="the pattern's mlp and moe layers choose; or set model.layers.feed_forward")
    if not keys:
        return everything
    value = moe.data[keys[0]]
    if keys[0] == "layers" and isinstance(value, dict):
        every = Fields(value, moe.key_path("layers"), ("period", "offset"), parent_loc=moe.where("layers"))
        period, offset = every.get("period", positive_int), every.get("offset", non_negative_int, 0)
        if offset >= period:
            raise every.error("offset", f"offset {offset} is not below period {period}")
        return {i for i in everything if i % period == offset}
    chosen = moe.items(keys[0], non_negative_int)
    for i, layer in enumerate(chosen):
        if layer >= n_layers:
            raise SpecError(f"{moe.key_path(keys[0])}[{i}]: layer {layer} is beyond n_layers {n_layers}",
                            location=str(yamlloc.where(value, i)))
    return set(chosen) if keys[0] == "layers" else everything - set(chosen)
