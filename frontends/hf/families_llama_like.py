"""Llama-shaped decoders beyond the first families (``frontends.hf.families`` registers them):
the shared decoder of ``frontends.hf.build`` with a table of settings each.

=================  ==========================================================================
gemma              Gemma 1: (1 + w) RMS norms, GeGLU (``hidden_act``: gelu_pytorch_tanh or
                   gelu), the embedding times √d, softmax scale head_dim^-0.5, tied
granite            Llama with µP multipliers: the embedding times ``embedding_multiplier``,
                   softmax scale ``attention_multiplier``, each branch times
                   ``residual_multiplier`` as it joins the residual, logits divided by
                   ``logits_scaling``
granitemoe         Granite with a MoE on every layer: the top-k router logits softmaxed
                   (the renormalised softmax top-k), experts fused as
                   ``block_sparse_moe.input_linear`` [E, 2F, d] (gate | up) and
                   ``output_linear`` [E, d, F]
smollm3            Llama with NoPE layers: layer i has RoPE iff ``no_rope_layers[i]`` (default:
                   every ``no_rope_layer_interval``-th layer has none); a window on the
                   ``layer_types`` "sliding_attention" layers when ``use_sliding_window``
ministral          Mistral with a window per layer (``layer_types``; default every layer
                   sliding when ``sliding_window`` is set)
ministral3         Mistral with YaRN and Llama-4's query scale after RoPE, 1 + beta·log(1 +
                   floor(position / original)) (``rope_parameters.llama_4_scaling_beta``,
                   ``original_max_position_embeddings``), a window on every layer when set
=================  ==========================================================================

Refused, naming config.json and the key: biases (``attention_bias``, ``mlp_bias``), an
activation other than the family's, a ``no_rope_layers`` or ``layer_types`` list whose
length is not ``num_hidden_layers``.
"""
from __future__ import annotations

from typing import Optional

from frontends.hf.config import Arch, Attention, Config, LayerSpec, int_list, read_rope, rope_dict
from frontends.hf.families_common import (FULL, SLIDING, _arch, _dims, _layer_types, _no, _rope, _silu, _swiglu,
                                          _windows)
from irc.yamlloc import boolean, positive_int, positive_number
from frontends.hf.weights import FusedExperts

_LLAMA = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu", "max_position_embeddings": 2048,
          "attention_bias": False, "mlp_bias": False}
_GRANITE = {**_LLAMA, "embedding_multiplier": 1.0, "logits_scaling": 1.0, "residual_multiplier": 1.0,
            "attention_multiplier": 1.0}
DEFAULTS = {  # transformers 5.24's config classes
    "gemma": {**_LLAMA, "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "head_dim": 256,
              "tie_word_embeddings": True, "num_key_value_heads": 16},
    "granite": dict(_GRANITE),
    "granitemoe": {**_GRANITE, "num_local_experts": 8, "num_experts_per_tok": 2},
    "smollm3": {**_LLAMA, "max_position_embeddings": 32768, "tie_word_embeddings": True, "num_key_value_heads": 4,
                "use_sliding_window": False, "sliding_window": None, "no_rope_layer_interval": 4},
    "ministral": {**_LLAMA, "max_position_embeddings": 131072, "num_key_value_heads": 8, "sliding_window": 4096},
    "ministral3": {**_LLAMA, "rms_norm_eps": 1e-5, "max_position_embeddings": 262144, "num_key_value_heads": 8,
                   "head_dim": 128, "sliding_window": None},
}
GELU = {"gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu": "none"}


def _multiplier(cfg: Config, key: str) -> Optional[float]:
    """A positive multiplier, None when it is 1 (nothing to multiply)."""
    value = cfg.get(key, positive_number)
    return None if value == 1.0 else value


def _gemma(cfg: Config, name: str, model_type: str) -> Arch:
    """Gemma 1."""
    dims = _dims(cfg)
    _no(cfg, "attention_bias")
    activation = cfg.raw("hidden_act")
    if activation not in GELU:
        raise cfg.unsupported("hidden_act", activation, hint="Gemma's MLP is GeGLU: gelu_pytorch_tanh or gelu")
    rope = _rope(cfg, dims["head_dim"])
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"])
    mlp = {"kind": "geglu", "d_ff": cfg.get("intermediate_size", positive_int), "approximate": GELU[activation]}
    return _arch(cfg, name, model_type, dims, attention, [LayerSpec(None, rope)] * dims["layers"], mlp,
                 norm_offset=1.0, embedding_scale=dims["d"] ** 0.5, checkpoint="llama")


def _granite(cfg: Config, name: str, model_type: str) -> Arch:
    """Granite and Granite-MoE."""
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    _no(cfg, "attention_bias", *(("mlp_bias",) if model_type == "granite" else ()))
    rope = _rope(cfg, dims["head_dim"])
    moe, mlp = None, _swiglu(cfg)
    if model_type == "granitemoe":
        experts = cfg.get("num_local_experts", positive_int)
        top_k = cfg.get("num_experts_per_tok", positive_int)
        if top_k > experts:
            raise cfg.error("num_experts_per_tok", f"top_k {top_k} exceeds {experts} experts (num_local_experts)")
        moe, mlp = {"experts": experts, "top_k": top_k, "d_ff": cfg.get("intermediate_size", positive_int),
                    "norm_topk_prob": True}, None
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"],
                          scale=cfg.get("attention_multiplier", positive_number))
    logits_scaling = _multiplier(cfg, "logits_scaling")
    return _arch(cfg, name, model_type, dims, attention, [LayerSpec(None, rope, moe is not None)] * n, mlp, moe=moe,
                 embedding_scale=_multiplier(cfg, "embedding_multiplier"),
                 residual_scale=_multiplier(cfg, "residual_multiplier"),
                 logits_scale=None if logits_scaling is None else 1.0 / logits_scaling,
                 checkpoint="granitemoe" if moe else "llama")


def _smollm3(cfg: Config, name: str, model_type: str) -> Arch:
    """SmolLM3: Llama with NoPE layers."""
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    _no(cfg, "attention_bias", "mlp_bias")
    if cfg.has("no_rope_layers"):
        uses_rope = cfg.get("no_rope_layers", int_list)
        if len(uses_rope) != n or any(v not in (0, 1) for v in uses_rope):
            raise cfg.error("no_rope_layers", f"expected {n} entries of 0 (NoPE) or 1 (RoPE), one a layer; got "
                                              f"{uses_rope!r}")
    else:
        interval = cfg.get("no_rope_layer_interval", positive_int)
        uses_rope = [int((i + 1) % interval != 0) for i in range(n)]
    windowed = cfg.get("use_sliding_window", boolean) and cfg.raw("sliding_window") is not None
    types = _layer_types(cfg, n, lambda i: SLIDING if windowed and not uses_rope[i] else FULL)
    windows = _windows(cfg, types) if windowed else [None] * n
    rope = _rope(cfg, dims["head_dim"])
    layers = [LayerSpec(window, rope if has_rope else None) for window, has_rope in zip(windows, uses_rope)]
    return _arch(cfg, name, model_type, dims, Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"]),
                 layers, _swiglu(cfg), checkpoint="llama")


def _ministral(cfg: Config, name: str, model_type: str) -> Arch:
    """Ministral: Mistral with per-layer windows."""
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    windowed = cfg.raw("sliding_window") is not None
    types = _layer_types(cfg, n, lambda i: SLIDING if windowed else FULL)
    rope = _rope(cfg, dims["head_dim"])
    layers = [LayerSpec(window, rope) for window in _windows(cfg, types)]
    return _arch(cfg, name, model_type, dims, Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"]),
                 layers, _swiglu(cfg), checkpoint="llama")


def _ministral3(cfg: Config, name: str, model_type: str) -> Arch:
    """Ministral-3: Mistral with YaRN and Llama-4's position-dependent query scale."""
    dims = _dims(cfg)
    _silu(cfg)
    params = cfg.data.get("rope_parameters") if isinstance(cfg.data.get("rope_parameters"), dict) else {}
    beta = params.get("llama_4_scaling_beta")
    query_scale = None
    if beta:
        original = params.get("original_max_position_embeddings")
        if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
            raise cfg.error("rope_parameters.original_max_position_embeddings",
                            f"expected a positive integer for Llama-4's query scale, got {original!r}")
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0 < beta < 1e6:
            raise cfg.error("rope_parameters.llama_4_scaling_beta", f"expected a positive number, got {beta!r}")
        query_scale = (float(beta), original, cfg.get("max_position_embeddings", positive_int))
    rope_params, key = rope_dict(cfg)
    for extra in ("llama_4_scaling_beta", "max_position_embeddings"):  # the query scale's, read above
        rope_params.pop(extra, None)
    rope = read_rope(cfg, dims["head_dim"], rope_params, key, default_base=1e6,
                     original_max=cfg.get("max_position_embeddings", positive_int))
    window = cfg.get("sliding_window", positive_int, None)
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], query_scale=query_scale)
    return _arch(cfg, name, model_type, dims, attention, [LayerSpec(window, rope)] * dims["layers"], _swiglu(cfg),
                 checkpoint="llama")


FAMILIES = {"gemma": _gemma, "granite": _granite, "granitemoe": _granite, "smollm3": _smollm3,
            "ministral": _ministral, "ministral3": _ministral3}
def _fused(part: str):
    def source(arch: Arch, prefix: str) -> FusedExperts:
        name = "mlp.experts.down_proj" if part == "down" else "mlp.experts.gate_up_proj"
        return FusedExperts(prefix + name, part, arch.moe["d_ff"], arch.d_model)
    return source


LAYOUTS = {"qwen3_vl_moe": {f"moe.w_{part}": _fused(part) for part in ("gate", "up", "down")},  # Qwen3-VL-MoE's text
           "mllama": {**{f"cross.w{x}": f"cross_attn.{x}_proj.weight" for x in "qkvo"},  # Llama-3.2-Vision's text
                      **{f"cross.{x}_norm": f"cross_attn.{x}_norm.weight" for x in "qk"},
                      "cross.attn_gate": "cross_attn_attn_gate", "cross.mlp_gate": "cross_attn_mlp_gate"},
           "granitemoe": {"moe.router": "block_sparse_moe.router.layer.weight",
                          "moe.w_down": "block_sparse_moe.output_linear.weight"}}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
