"""Microsoft's Phi-3.5-MoE (``model_type`` phimoe), built by its own loop through the DSL
(``Arch.expand``); ``frontends.hf.families`` registers it.

- Pre-norm decoder with LayerNorms that have a bias (``input_layernorm``,
  ``post_attention_layernorm``, the final ``norm``; eps ``rms_norm_eps``), GQA with biases on
  q, k, v and o when ``attention_bias``, rotate-half RoPE, a window on every layer
  (``sliding_window``), an LM head with a bias when ``lm_head_bias``.
- MoE on every layer, routed by transformers' ``sparsemixer`` at inference (``irc.ops.moe``,
  scoring ``sparsemixer``): two argmax rounds, each weight a softmax over the router logits
  within 2 * ``router_jitter_noise`` (relative) of that round's maximum, not renormalised;
  SwiGLU experts. ``input_jitter_noise`` (and the router's jitter) is training-time noise:
  inference ignores it, and so does irc.
- RoPE through the shared reader (``frontends.hf.config.read_rope``) with Phi-MoE's own
  reading of a scaled RoPE: transformers' ``PhimoeRotaryEmbedding`` recomputes its
  frequencies on every call without the sequence length, so it always rotates by the short
  factors, and it multiplies cos and sin by ``short_mscale`` (``long_mscale`` past
  ``original_max_position_embeddings``). irc reads longrope with the long factors replaced
  by the short ones and ``attention_factor`` = the mscale (``_rope``).

Weights as ``save_pretrained`` writes them (transformers converts back to the released
names): ``block_sparse_moe.gate.weight`` and per-expert ``block_sparse_moe.experts.{e}.w1``
(gate), ``w3`` (up), ``w2`` (down), stacked into irc's [E, ...] params.

Refused, naming config.json and the key: ``num_experts_per_tok`` other than 2 (transformers'
sparsemixer routes 2 experts whatever it says), fewer than 2 experts, a negative
``router_jitter_noise``, an activation other than silu, a partial rotary factor (Phi-MoE's
default RoPE rotates the whole head), a RoPE type other than default and longrope, and
``short_mscale`` != ``long_mscale`` (a cos/sin scale that changes with the sequence length).
"""
from __future__ import annotations

from functools import partial
from typing import Callable

from frontends.hf.config import Arch, Attention, Config, LayerSpec, RopeSpec, read_rope, rope_dict, dsl_rope
from frontends.hf.families_common import _arch, _dims, _every_layer_window, _experts, _silu
from irc.yamlloc import boolean, number, positive_int

DEFAULTS = {"phimoe": {  # transformers 5.24's PhimoeConfig
    "vocab_size": 32064, "hidden_size": 4096, "intermediate_size": 6400, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "rope_theta": 1e6, "sliding_window": None,
    "num_experts_per_tok": 2, "num_local_experts": 16, "router_jitter_noise": 0.01, "input_jitter_noise": 0.0,
    "attention_bias": False, "lm_head_bias": False}}
MSCALES = ("short_mscale", "long_mscale")


def _phimoe(cfg: Config, name: str, model_type: str) -> Arch:
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    experts = _experts(cfg, "num_local_experts", "num_experts")
    if experts < 2:
        raise cfg.error("num_local_experts", f"sparsemixer routes 2 experts; {experts} is too few")
    top_k = cfg.get("num_experts_per_tok", positive_int)
    if top_k != 2:
        raise cfg.unsupported("num_experts_per_tok", top_k, hint="transformers' Phi-MoE sparsemixer always routes "
                                                                 "2 experts, whatever num_experts_per_tok says")
    jitter = cfg.get("router_jitter_noise", number)
    if jitter < 0:
        raise cfg.error("router_jitter_noise", f"expected a non-negative number, got {jitter!r}")
    moe = {"experts": experts, "top_k": 2, "d_ff": cfg.get("intermediate_size", positive_int),
           "scoring": "sparsemixer", "jitter_eps": jitter, "norm_topk_prob": False}
    rope = _rope(cfg, dims["head_dim"])
    layers = [LayerSpec(window, rope, moe=True) for window in _every_layer_window(cfg, n)]
    bias = cfg.get("attention_bias", boolean)
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qkv_bias=bias)
    arch = _arch(cfg, name, model_type, dims, attention, layers, None, moe=moe, checkpoint="phimoe")
    arch.expand = partial(_expand, cfg.get("lm_head_bias", boolean))
    return arch


def _rope(cfg: Config, head_dim: int) -> RopeSpec:
    """The shared reader on Phi-MoE's settings (the module docstring): default RoPE, or
    longrope rotating by the short factors with cos/sin times the (single) mscale."""
    params, key = rope_dict(cfg)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        kind_key = f"{key}.rope_type" if "rope_type" in params else f"{key}.type"
        if kind != "longrope":
            raise cfg.unsupported(kind_key, kind, hint="Phi-MoE scales RoPE by short_mscale / long_mscale; irc "
                                                       "reads them for longrope only")
        scales = []
        for name in MSCALES:
            value = params.pop(name, None)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise cfg.error(f"{key}.{name}", f"expected a positive number, got {value!r}",
                                hint="transformers' Phi-MoE requires it for a scaled RoPE")
            scales.append(float(value))
        if scales[0] != scales[1]:
            raise cfg.unsupported(f"{key}.long_mscale", scales[1], hint="transformers scales cos/sin by "
                                  "short_mscale up to original_max_position_embeddings and by long_mscale past it; "
                                  "irc has one scale per RoPE (make them equal)")
        params["attention_factor"] = scales[0]
        if "short_factor" in params:
            params["long_factor"] = params["short_factor"]  # transformers' Phi-MoE never switches to them
    rope = read_rope(cfg, head_dim, params, key, default_base=cfg.defaults["rope_theta"],
                     original_max=cfg.get("max_position_embeddings", positive_int, None))
    if rope.rotary_dim is not None:
        where = f"{key}.partial_rotary_factor" if "partial_rotary_factor" in params else "partial_rotary_factor"
        raise cfg.unsupported(where, params.get("partial_rotary_factor", cfg.raw("partial_rotary_factor")),
                              hint="Phi-MoE's RoPE rotates the whole head")
    return rope


def _expand(lm_head_bias: bool, arch: Arch, origin: str):
    """x + attention(layer_norm(x)), x + moe(layer_norm(x)); LayerNorms with bias, the head's
    bias with ``lm_head_bias``."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps = arch.attention, arch.norm_eps
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            rope = dsl_rope(spec.rope)
            h = layer.layer_norm(x, "attn_norm", eps)
            x = x + layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=rope,
                                    window=spec.window, qkv_bias=a.qkv_bias, out_bias=a.qkv_bias)
            x = x + layer.moe(layer.layer_norm(x, "mlp_norm", eps), **arch.moe)
        m.logits(m.layer_norm(x, "norm", eps), tied=arch.tied, bias=lm_head_bias)
    return m.graph


FAMILIES = {"phimoe": _phimoe}
_EXPERTS = {"gate": "w1", "up": "w3", "down": "w2"}


def layouts(experts: Callable[[str], object]) -> dict:
    """The checkpoint layout; ``experts(template)`` makes the entry of per-expert tensors
    stacked into one param (``families.Experts``, passed in: that module imports this one)."""
    return {"phimoe": {
        "attn.bo": "self_attn.o_proj.bias",
        "attn_norm.bias": "input_layernorm.bias", "mlp_norm.bias": "post_attention_layernorm.bias",
        "moe.router": "block_sparse_moe.gate.weight",
        **{f"moe.w_{x}": experts(f"block_sparse_moe.experts.{{e}}.{w}.weight") for x, w in _EXPERTS.items()},
        "_top": {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "norm.bias": "model.norm.bias",
                 "lm_head": "lm_head.weight", "lm_head.bias": "lm_head.bias"}}}


__all__ = ["DEFAULTS", "FAMILIES", "layouts"]
