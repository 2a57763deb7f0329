"""What the Hugging Face families share: their sizes, the Arch they make, the switches they
refuse, RoPE, per-layer types and windows, the expert count, the decoder's embedded inputs
(``embedded_inputs``: ``frontends.hf.build`` and the families' own expands) and MLA's norm eps
(``frontends.hf.families`` and the family modules beside it use these)."""
from __future__ import annotations

from typing import Callable, Optional

from frontends.hf.config import (Arch, Attention, Config, LayerSpec, RopeSpec, attention_dims, read_rope, rope_dict,
                                 string_list)
from irc.yamlloc import boolean, layer_count, positive_int, positive_number
from frontends.dsl import Model

FULL, SLIDING = "full_attention", "sliding_attention"


def _dims(cfg: Config) -> dict:
    """Sizes every family has; head_dim defaults to hidden_size / num_attention_heads."""
    d, heads, kv_heads, head_dim = attention_dims(cfg)
    return {"d": d, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "layers": cfg.get("num_hidden_layers", layer_count)}  # sizes within irc.limits


def _arch(cfg: Config, name: str, model_type: str, dims: dict, attention: Attention, layers: list[LayerSpec],
          mlp: Optional[dict], **extra) -> Arch:
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=dims["d"], n_layers=dims["layers"], norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=attention, layers=layers, mlp=mlp, tied=cfg.get("tie_word_embeddings", boolean), **extra)


def _no(cfg: Config, *keys: str) -> None:
    """Refuse switches (biases) that add weights irc's ops do not have."""
    for key in keys:
        cfg.check(key, lambda v: not v, hint="irc's attention and MLPs have no such bias")


def _silu(cfg: Config, key: str = "hidden_act") -> None:
    cfg.check(key, lambda v: v == "silu", hint="this family's gated MLP is SwiGLU (silu)")


def _swiglu(cfg: Config, key: str = "intermediate_size") -> dict:
    return {"kind": "swiglu", "d_ff": cfg.get(key, positive_int)}


def _rope(cfg: Config, head_dim: int, layer_type: Optional[str] = None, convention: str = "half",
          default_base: Optional[float] = None) -> RopeSpec:
    params, key = rope_dict(cfg, layer_type)
    base = default_base if default_base is not None else cfg.defaults.get("rope_theta", 10000.0)
    return read_rope(cfg, head_dim, params, key, default_base=base, convention=convention,
                     original_max=cfg.get("max_position_embeddings", positive_int, None))


def _layer_types(cfg: Config, n_layers: int, derive: Callable[[int], str], kinds: tuple = (FULL, SLIDING)) -> list[str]:
    """``layer_types`` from the config (each one of ``kinds``), or derived per layer as the
    family's config class does."""
    if not cfg.has("layer_types"):
        return [derive(i) for i in range(n_layers)]
    types = cfg.get("layer_types", string_list)
    if len(types) != n_layers:
        raise cfg.error("layer_types", f"has {len(types)} entries for {n_layers} layers")
    for kind in types:
        if kind not in kinds:
            raise cfg.unsupported("layer_types", kind, hint=f"layer types: {', '.join(kinds)}")
    return types


def _windows(cfg: Config, types: list[str]) -> list[Optional[int]]:
    window = cfg.get("sliding_window", positive_int, None) if SLIDING in types else None
    return [window if kind == SLIDING else None for kind in types]


def _every_layer_window(cfg: Config, n_layers: int) -> list[Optional[int]]:
    return [cfg.get("sliding_window", positive_int, None)] * n_layers


def _qwen_windows(cfg: Config, n_layers: int, derive: Callable[[int], str]) -> list[Optional[int]]:
    """Qwen: no window unless ``use_sliding_window``; then per ``layer_types``."""
    if not cfg.get("use_sliding_window", boolean):
        return [None] * n_layers
    return _windows(cfg, _layer_types(cfg, n_layers, derive))


def _experts(cfg: Config, *keys: str) -> int:
    """The expert count under whichever of its names the config uses (transformers maps
    num_experts and num_local_experts onto each other)."""
    for key in keys:
        if cfg.has(key):
            return cfg.get(key, positive_int)
    return cfg.get(keys[0], positive_int)


MLA_NORM_EPS = 1e-6  # transformers builds the q_a / kv_a RMS norms with their default eps, whatever rms_norm_eps says


def embedded_inputs(m: Model, arch: Arch):
    """The token embeddings (``position_ids`` of as many axes as a multimodal RoPE reads), a
    VLM's image features merged in (``Arch.image_token``: ``frontends.hf.vlm``)."""
    if arch.mtp is not None and arch.mtp.draft:  # an MTP head's graph: embedding and h projected (hf.mtp)
        return arch.mtp.draft(m, arch)
    axes = {len(spec.rope.mrope["sections"]) for spec in arch.layers if spec.rope and spec.rope.mrope}
    x = m.embed(m.input_ids(position_axes=max(axes) if axes else None), scale=arch.embedding_scale)
    if arch.image_token is not None:
        x = m.merge_image_features(x, arch.image_token, arch.image_blocks, deepstack=arch.deepstack)
    return x
