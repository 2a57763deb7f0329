"""Decoders whose layer form departs from Llama's (``frontends.hf.families`` registers them),
each built by its own loop through the DSL (``Arch.expand``).

=================  ==========================================================================
olmo               OLMo-1: pre-norm with LayerNorms that have no weight and no bias (as
                   primitives), q/k/v clamped to ±``clip_qkv`` where set, SwiGLU
olmo2              OLMo-2: no norm before the branches; each branch's output RMS-normed
                   (``post_attention_layernorm``, ``post_feedforward_layernorm``) before its
                   residual add; q and k RMS-normed over their full width (``q_norm`` [H·D],
                   ``k_norm`` [K·D]) before RoPE; SwiGLU
olmo3              OLMo-2's layers with windows: ``layer_types`` (default every fourth layer
                   full, the others sliding ``sliding_window``), RoPE per layer type
                   (``rope_parameters.{sliding_attention, full_attention}``)
olmoe              OLMoE: pre-norm, q and k normed over their full width (then clamped to
                   ±``clip_qkv`` where set), a softmax top-k MoE on every layer (renormalised iff
                   ``norm_topk_prob``, default false)
starcoder2         StarCoder2: LayerNorms with bias (``norm_epsilon``), biases on q, k, v and o
                   and on the GELU MLP (``c_fc``, ``c_proj``) when ``use_bias``, a window on
                   every layer (``sliding_window``), tied by default
=================  ==========================================================================

Refused, naming config.json and the key: ``clip_qkv`` on OLMo-2/3 (transformers' OLMo-2 has no
clamp: a set value is a config irc will not guess at), ``attention_bias`` on OLMo, an
activation other than the family's.
"""
from __future__ import annotations

from functools import partial

from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope
from frontends.hf.families_common import FULL, SLIDING, _arch, _dims, _layer_types, _no, _rope, _silu, _windows
from irc.yamlloc import boolean, positive_int, positive_number

_OLMO = {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu", "max_position_embeddings": 2048,
         "attention_bias": False, "clip_qkv": None}
DEFAULTS = {  # transformers 5.24's config classes
    "olmo": dict(_OLMO),
    "olmo2": dict(_OLMO),
    "olmo3": {**_OLMO, "sliding_window": 4096},
    "olmoe": {**_OLMO, "max_position_embeddings": 4096, "num_experts": 64, "num_experts_per_tok": 8,
              "norm_topk_prob": False},
    "starcoder2": {"norm_epsilon": 1e-5, "tie_word_embeddings": True, "hidden_act": "gelu_pytorch_tanh",
                   "max_position_embeddings": 4096, "sliding_window": None, "use_bias": True,
                   "num_key_value_heads": 2},
}
GELU = {"gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu": "none"}


def _olmo(cfg: Config, name: str, model_type: str) -> Arch:
    """OLMo-2, OLMo-3 and OLMoE."""
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    _no(cfg, "attention_bias")
    clip = None
    if model_type in ("olmo", "olmoe"):
        clip = cfg.get("clip_qkv", positive_number, None)
    else:
        cfg.check("clip_qkv", lambda v: v is None, hint="transformers' OLMo-2 and OLMo-3 do not clamp q/k/v")
    if model_type == "olmo3":
        types = _layer_types(cfg, n, lambda i: FULL if (i + 1) % 4 == 0 else SLIDING)
        ropes = {kind: _rope(cfg, dims["head_dim"], kind) for kind in set(types)}
        layers = [LayerSpec(window, ropes[kind]) for window, kind in zip(_windows(cfg, types), types)]
    else:
        layers = [LayerSpec(None, _rope(cfg, dims["head_dim"]), model_type == "olmoe")] * n
    moe = mlp = None
    if model_type == "olmoe":
        experts, top_k = cfg.get("num_experts", positive_int), cfg.get("num_experts_per_tok", positive_int)
        if top_k > experts:
            raise cfg.error("num_experts_per_tok", f"top_k {top_k} exceeds {experts} experts (num_experts)")
        moe = {"experts": experts, "top_k": top_k, "d_ff": cfg.get("intermediate_size", positive_int),
               "norm_topk_prob": cfg.get("norm_topk_prob", boolean)}
    else:
        mlp = {"kind": "swiglu", "d_ff": cfg.get("intermediate_size", positive_int)}
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qk_norm=model_type != "olmo")
    arch = _arch(cfg, name, model_type, dims, attention, layers, mlp, moe=moe,
                 checkpoint={"olmo": "llama", "olmoe": "olmoe"}.get(model_type, "olmo2"))
    form = {"olmo": "plain", "olmoe": "pre"}.get(model_type, "post")
    if model_type == "olmo":
        arch.norm_eps = 1e-5  # OlmoLayerNorm's, whatever the config says
    arch.expand = partial(_expand, form, clip)
    return arch


def _starcoder2(cfg: Config, name: str, model_type: str) -> Arch:
    """StarCoder2."""
    dims = _dims(cfg)
    n = dims["layers"]
    activation = cfg.raw("hidden_act")
    if activation not in GELU:
        raise cfg.unsupported("hidden_act", activation, hint="StarCoder2's MLP is GELU: gelu_pytorch_tanh or gelu")
    bias = cfg.get("use_bias", boolean)
    rope = _rope(cfg, dims["head_dim"])
    window = cfg.get("sliding_window", positive_int, None)
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qkv_bias=bias)
    mlp = {"kind": "gelu", "d_ff": cfg.get("intermediate_size", positive_int), "approximate": GELU[activation],
           "bias": bias}
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=dims["d"], n_layers=n, norm_eps=cfg.get("norm_epsilon", positive_number), attention=attention,
                layers=[LayerSpec(window, rope)] * n, mlp=mlp, tied=cfg.get("tie_word_embeddings", boolean),
                checkpoint="starcoder2")
    arch.expand = partial(_expand, "layer", None)
    return arch


def _expand(form: str, clip, arch: Arch, origin: str):
    """The decoder through the DSL: ``post`` (OLMo-2/3: x + norm(branch(x))), ``pre``
    (OLMoE: x + branch(norm(x))) with full-width q/k norms, ``plain`` (OLMo-1: pre
    LayerNorms without weights), or ``layer`` (StarCoder2: pre LayerNorms with bias, biases
    on the attention output and the MLP); q/k/v clamped to ±``clip`` where set."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps = arch.attention, arch.norm_eps
    kind = "layer" if form == "layer" else "rms"
    qk_norm = "full" if a.qk_norm else False

    def norm(t, name):
        if form == "plain":
            return m.plain_layer_norm(t, name, eps)
        return m.norm(t, name, kind, eps, bias=True)

    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            rope = dsl_rope(spec.rope)
            h = x if form == "post" else norm(x, f"{layer.prefix}attn_norm")
            y = layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=rope, window=spec.window,
                                qkv_bias=a.qkv_bias, out_bias=a.qkv_bias, qk_norm=qk_norm, qk_norm_eps=eps,
                                clip_qkv=clip)
            x = x + (layer.rms_norm(y, "post_attn_norm", eps) if form == "post" else y)
            h = x if form == "post" else norm(x, f"{layer.prefix}mlp_norm")
            if spec.moe:
                y = layer.moe(h, **arch.moe)
            elif arch.mlp["kind"] == "gelu":
                y = layer.gelu_mlp(h, d_ff=arch.mlp["d_ff"], bias=arch.mlp["bias"],
                                   approximate=arch.mlp["approximate"])
            else:
                y = layer.swiglu(h, d_ff=arch.mlp["d_ff"])
            x = x + (layer.rms_norm(y, "post_mlp_norm", eps) if form == "post" else y)
        m.logits(norm(x, "norm"), tied=arch.tied)
    return m.graph


FAMILIES = {"olmo": _olmo, "olmo2": _olmo, "olmo3": _olmo, "olmoe": _olmo, "starcoder2": _starcoder2}
_NORM_BIASES = {"attn_norm.bias": "input_layernorm.bias", "mlp_norm.bias": "post_attention_layernorm.bias"}
LAYOUTS = {
    "olmo2": {"post_attn_norm": "post_attention_layernorm.weight",
              "post_mlp_norm": "post_feedforward_layernorm.weight"},
    "olmoe": {"moe.router": "mlp.gate.weight"},
    "starcoder2": {"attn.bo": "self_attn.o_proj.bias", **_NORM_BIASES,
                   "mlp.w_up": "mlp.c_fc.weight", "mlp.b_up": "mlp.c_fc.bias",
                   "mlp.w_down": "mlp.c_proj.weight", "mlp.b_down": "mlp.c_proj.bias",
                   "_top": {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight",
                            "norm.bias": "model.norm.bias", "lm_head": "lm_head.weight"}},
}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
