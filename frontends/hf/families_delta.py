"""The gated-DeltaNet families: three linear-attention layers to one gated attention layer
(``frontends.hf.families`` registers them).

=================  ==========================================================================
qwen3_next         Qwen3-Next: by ``layer_types`` ("linear_attention" | "full_attention";
                   without it every ``full_attention_interval``-th layer attention) a gated
                   DeltaNet (``Layer.gated_delta``, fused ``in_proj_qkvz`` / ``in_proj_ba``)
                   or GQA attention with a sigmoid output gate, (1 + w) q/k norms and RoPE
                   on ``partial_rotary_factor`` (default 0.25) of each head; then a MoE
                   (softmax top-k, ``norm_topk_prob``, a shared expert behind a sigmoid
                   gate) where i is not in ``mlp_only_layers`` and (i + 1) %
                   ``decoder_sparse_step`` == 0, else a SwiGLU MLP
qwen3_5_text       Qwen3.5: the same layers with split projections (``in_proj_qkv``,
                   ``in_proj_z``, ``in_proj_b``, ``in_proj_a``); a SwiGLU MLP on every layer
qwen3_5_moe_text   Qwen3.5's layers, a MoE (renormalised top-k, gated shared expert) on every
                   layer
=================  ==========================================================================

The multimodal configs (``qwen3_5``, ``qwen3_5_moe``: Qwen3.5 as it ships, with its vision
tower) are VLMs (``frontends.hf.vlm_qwen``): their text model is this one, its RoPE reading
three position axes and its embeddings taking the image features.

Every RMS norm is (1 + w) (Qwen's zero-centred norm) except the gated norm after the
DeltaNet, norm(o)·w·silu(z) per value head. Qwen3.5's RoPE is multimodal (``mrope_section``,
``mrope_interleaved``): for text every section reads the same position, which is plain RoPE
over the rotary width, so those two settings are set aside here (a VLM reads them). Embeddings
are untied unless ``tie_word_embeddings``.

Refused, naming config.json and the key: a ``layer_types`` entry other than the two kinds or
a list whose length is not ``num_hidden_layers``, value heads that are not a multiple of
key heads (``linear_num_value_heads``), ``attention_bias``, an activation other than SiLU.
Checkpoint tensors irc does not build are left aside as transformers leaves them: ``mtp.*``
(the multi-token-prediction head).
"""
from __future__ import annotations

from typing import Optional

from frontends.hf.families_common import embedded_inputs
from frontends.hf.config import (Arch, Attention, Config, LayerSpec, attention_dims, int_list,
                                 layer_types, read_rope, rope_dict, dsl_rope)
from irc.yamlloc import boolean, layer_count, non_negative_int, positive_int, positive_number

DELTA, ATTENTION = "linear_attention", "full_attention"
KINDS = (DELTA, ATTENTION)
_QWEN = {"hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
         "attention_bias": False, "head_dim": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
         "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
         "full_attention_interval": 4, "rope_theta": 10000.0}
_MOE = {"moe_intermediate_size": 512, "shared_expert_intermediate_size": 512}
DEFAULTS = {  # transformers 5.24's config classes
    "qwen3_next": {**_QWEN, **_MOE, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
                   "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
                   "decoder_sparse_step": 1, "num_experts_per_tok": 10, "num_experts": 512, "norm_topk_prob": True,
                   "mlp_only_layers": []},
    "qwen3_5_text": {**_QWEN, "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288,
                     "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4},
    "qwen3_5_moe_text": {**_QWEN, **_MOE, "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40,
                         "num_attention_heads": 16, "num_key_value_heads": 2, "num_experts_per_tok": 8,
                         "num_experts": 256},
}


def layer_kinds(cfg: Config, n: int) -> list[str]:
    """``layer_types`` checked (the two kinds, one per layer), else every
    ``full_attention_interval``-th layer attention, as the config class derives it."""
    if not cfg.has("layer_types"):
        interval = cfg.get("full_attention_interval", positive_int)
        return [ATTENTION if (i + 1) % interval == 0 else DELTA for i in range(n)]
    return layer_types(cfg, n, KINDS)


def delta_config(cfg: Config, fused: bool) -> dict:
    """``Layer.gated_delta``'s arguments."""
    key_heads = cfg.get("linear_num_key_heads", positive_int)
    value_heads = cfg.get("linear_num_value_heads", positive_int)
    if value_heads % key_heads:
        raise cfg.error("linear_num_value_heads", f"{value_heads} value heads are not a multiple of {key_heads} key "
                                                  "heads (linear_num_key_heads)")
    return {"kind": "gated_delta", "key_heads": key_heads, "value_heads": value_heads,
            "key_dim": cfg.get("linear_key_head_dim", positive_int),
            "value_dim": cfg.get("linear_value_head_dim", positive_int),
            "conv_kernel": cfg.get("linear_conv_kernel_dim", positive_int),
            "projections": "fused" if fused else "split", "norm_eps": cfg.get("rms_norm_eps", positive_number)}


def _rope(cfg: Config, head_dim: int):
    params, key = rope_dict(cfg)
    for name in ("mrope_section", "mrope_interleaved"):  # text positions: every section alike
        params.pop(name, None)
    params.setdefault("partial_rotary_factor", cfg.data.get("partial_rotary_factor", 0.25))
    return read_rope(cfg, head_dim, params, key, original_max=cfg.get("max_position_embeddings", positive_int))


def _moe(cfg: Config, n: int, model_type: str) -> tuple[Optional[dict], list[bool]]:
    """(``Layer.moe``'s arguments or None, which layers are MoE)."""
    if model_type == "qwen3_5_text":
        return None, [False] * n
    experts = cfg.get("num_experts", non_negative_int)
    if model_type == "qwen3_next":
        step = cfg.get("decoder_sparse_step", positive_int)
        dense = set(cfg.get("mlp_only_layers", int_list, []) or [])
        layers = [experts > 0 and i not in dense and (i + 1) % step == 0 for i in range(n)]
        normalise = cfg.get("norm_topk_prob", boolean)
    else:
        if not experts:
            raise cfg.error("num_experts", "Qwen3.5-MoE needs experts on every layer")
        layers, normalise = [True] * n, True
    if not any(layers):
        return None, layers
    top_k = cfg.get("num_experts_per_tok", positive_int)
    if top_k > experts:
        raise cfg.error("num_experts_per_tok", f"top_k {top_k} exceeds {experts} experts (num_experts)")
    return {"experts": experts, "top_k": top_k,
            "d_ff": cfg.get("moe_intermediate_size", positive_int), "norm_topk_prob": normalise,
            "shared_experts": 1, "shared_d_ff": cfg.get("shared_expert_intermediate_size", positive_int),
            "shared_expert_gate": True}, layers


def _qwen_delta(cfg: Config, name: str, model_type: str) -> Arch:
    """Qwen3-Next and Qwen3.5 (text; also a Qwen3.5 VLM's text model)."""
    cfg.check("hidden_act", lambda v: v == "silu", hint="the gated MLPs and the convolution use SiLU")
    cfg.check("attention_bias", lambda v: not v, hint="irc's gated attention here has no bias")
    d, heads, kv_heads, head_dim = attention_dims(cfg)
    n = cfg.get("num_hidden_layers", layer_count)
    kinds = layer_kinds(cfg, n)
    ssm = delta_config(cfg, fused=model_type == "qwen3_next")
    rope = _rope(cfg, head_dim)
    moe, moe_layers = _moe(cfg, n, model_type)
    layers = [LayerSpec(None, rope if kind == ATTENTION else None, is_moe,
                        mixer="attention" if kind == ATTENTION else "gated_delta")
              for kind, is_moe in zip(kinds, moe_layers)]
    mlp = None if all(moe_layers) else {"kind": "swiglu", "d_ff": cfg.get("intermediate_size", positive_int)}
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=Attention("gqa", heads, kv_heads, head_dim, qk_norm=True), layers=layers, mlp=mlp, moe=moe,
                norm_offset=1.0, tied=cfg.get("tie_word_embeddings", boolean), checkpoint=model_type, ssm=ssm,
                expand=expand)


def expand(arch: Arch, origin: str):
    """The decoder: x + mixer(input_layernorm(x)), then x + mlp or moe(post_attention_layernorm(x)),
    the mixer a gated DeltaNet or the gated attention."""
    from frontends.dsl import Model
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps, offset, a = arch.norm_eps, arch.norm_offset, arch.attention
    delta = {k: v for k, v in arch.ssm.items() if k != "kind"}
    with m.at(origin):
        x = embedded_inputs(m, arch)  # a VLM's image features merged in (frontends.hf.vlm_qwen)
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            if spec.mixer == "attention":
                rope = dsl_rope(spec.rope)
                h = layer.attention(layer.rms_norm(x, "attn_norm", eps, offset), a.heads, kv_heads=a.kv_heads,
                                    head_dim=a.head_dim, rope=rope, qk_norm=True, qk_norm_eps=eps,
                                    qk_norm_offset=offset, output_gate=True)
            else:
                h = layer.gated_delta(layer.rms_norm(x, "ssm_norm", eps, offset), **delta)
            x = x + h
            h = layer.rms_norm(x, "mlp_norm", eps, offset)
            x = x + (layer.moe(h, **arch.moe) if spec.moe else layer.swiglu(h, d_ff=arch.mlp["d_ff"]))
        m.logits(m.rms_norm(x, "norm", eps, offset), tied=arch.tied)
    return m.graph


FAMILIES = {model_type: _qwen_delta for model_type in DEFAULTS}


def _layout() -> dict:
    return {"ssm_norm": "input_layernorm.weight",
             **{f"ssm.{n}": f"linear_attn.{n}.weight" for n in ("in_proj_qkvz", "in_proj_ba", "in_proj_qkv",
                                                                "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")},
             "ssm.conv": "linear_attn.conv1d.weight", "ssm.conv_bias": "linear_attn.conv1d.bias",
             "ssm.A_log": "linear_attn.A_log", "ssm.dt_bias": "linear_attn.dt_bias",
             "ssm.norm": "linear_attn.norm.weight",
             **{f"moe.shared_{x}": f"mlp.shared_expert.{x}_proj.weight" for x in ("gate", "up", "down")},
             "moe.shared_expert_gate": "mlp.shared_expert_gate.weight",
             "_spare": ("mtp.",)}  # what transformers does not load either


LAYOUTS = {"qwen3_next": _layout(), "qwen3_5_text": _layout(), "qwen3_5_moe_text": _layout()}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS", "layer_kinds", "delta_config"]
