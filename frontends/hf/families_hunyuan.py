"""Tencent's Hunyuan decoders as transformers 5.25 builds them (``frontends.hf.families``
registers them): the shared decoder with per-head q/k RMS norms *after* RoPE.

=================  ==========================================================================
hunyuan_v1_dense   Hunyuan-7B (and 0.5B to 4B): GQA with ``head_dim`` (required: transformers'
                   attention reads it), q, k and v rotated (half convention, whole head), then
                   q and k RMS-normed per head with weights [head_dim] (``query_layernorm`` /
                   ``key_layernorm``, eps ``rms_norm_eps``; ``qk_norm="head_after_rope"``);
                   ``attention_bias`` on q, k, v *and* o_proj; a SwiGLU MLP
hunyuan_v1_moe     Hunyuan-A13B: the same attention; every layer a softmax top-``moe_topk``
                   MoE (router ``mlp.gate.wg``, computed in float32 as transformers keeps it;
                   the top-k weights renormalised) of ``num_experts`` SwiGLU experts of
                   ``intermediate_size``, plus one shared SwiGLU MLP of ``intermediate_size``
                   (``mlp.shared_mlp``), ungated
=================  ==========================================================================

RoPE: a ``dynamic`` type with a nonzero ``alpha`` (the released configs' "DynamicNTKAlpha") is
transformers' "ntk_alpha": fixed frequencies of base ``rope_theta`` * alpha ^ (D / (D - 2)),
D = head_dim, whatever ``factor``, ``beta_*`` and ``mscale*`` say; other types as Llama's
(``alpha`` ignored, as transformers ignores it there). Keys under transformers'
``attribute_map`` as well: ``num_experts_per_tok`` (``moe_topk``), ``num_local_experts``
(``num_experts``). Experts read per expert (``mlp.experts.{e}.gate_proj``..., what
save_pretrained writes) or fused (``mlp.experts.gate_up_proj`` / ``down_proj``).

Refused, naming config.json and the key: ``head_dim`` missing or null (transformers then
fails), 2 with alpha RoPE (D - 2 divides), an activation other than SiLU, a partial rotary
factor (transformers' default and alpha RoPE ignore it, its linear and dynamic ones do not),
``moe_topk`` lists that vary over the layers or are shorter than them, a ``num_experts`` list
(HunYuanMoEV1Config takes one count), a top-k above the expert count, and switches of
Tencent's own code that transformers ignores, where the two would differ (irc refuses to
guess): ``use_qk_norm`` false, ``use_cla`` or ``use_mla`` true, ``use_mixed_mlp_moe`` false,
``num_shared_expert`` other than 1.
"""
from __future__ import annotations

from frontends.hf.config import Arch, Attention, Config, LayerSpec, RopeSpec, int_list, read_rope, rope_dict
from frontends.hf.families_aliases import Aliased
from frontends.hf.families_common import _arch, _dims, _silu, _swiglu
from frontends.hf.families_moe_2026 import _fused_experts
from irc.yamlloc import Bad, boolean, positive_int, positive_number

_BASE = {"vocab_size": 290943, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
         "num_attention_heads": 32, "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
         "tie_word_embeddings": False, "attention_bias": False}  # num_key_value_heads: num_attention_heads
DEFAULTS = {  # transformers 5.25's HunYuanDenseV1Config / HunYuanMoEV1Config (head_dim None: required)
    "hunyuan_v1_dense": dict(_BASE),
    "hunyuan_v1_moe": {**_BASE, "num_experts": 1, "moe_topk": 1},
}
ALIASES = {"moe_topk": ("num_experts_per_tok",), "num_experts": ("num_local_experts",)}  # HunYuanMoEV1Config's
ORIGINAL = (  # Tencent's own switches transformers ignores: (key, allowed, what transformers does, MoE only)
    ("use_qk_norm", lambda v: v is None or v is True, "transformers always norms q and k after RoPE", False),
    ("use_cla", lambda v: not v, "transformers' Hunyuan gives every layer its own k and v", False),
    ("use_mla", lambda v: not v, "transformers' Hunyuan has GQA attention", False),
    ("use_mixed_mlp_moe", lambda v: v is None or v is True, "transformers always adds the shared MLP", True),
    ("num_shared_expert", lambda v: v is None or v == 1 or (isinstance(v, list) and all(x == 1 for x in v)),
     "transformers' shared MLP is one of intermediate_size", True),
)


def _rope(cfg: Config, head_dim: int) -> RopeSpec:
    """Hunyuan's RoPE as its rotary embedding reads it: alpha-NTK as a base change."""
    params, key = rope_dict(cfg)
    if "partial_rotary_factor" in params or cfg.has("partial_rotary_factor"):
        where = f"{key}.partial_rotary_factor" if "partial_rotary_factor" in params else "partial_rotary_factor"
        raise cfg.error(where, "a partial rotary width is not supported for this model",
                        hint="transformers' Hunyuan ignores it for default and alpha RoPE but not for linear or "
                             "dynamic: irc refuses to guess")
    kind, alpha = params.get("rope_type", params.get("type")), params.pop("alpha", None)
    original_max = cfg.get("max_position_embeddings", positive_int, None)
    if kind != "dynamic" or not alpha:  # transformers reads alpha only on a dynamic RoPE, and only nonzero
        return read_rope(cfg, head_dim, params, key, original_max=original_max)
    if "factor" not in params:
        raise cfg.error(f"{key}.factor", "dynamic RoPE needs a factor", hint="transformers requires one, even "
                                                                             "with alpha (which ignores it)")
    try:
        alpha = positive_number(alpha)
    except Bad as err:
        raise cfg.error(f"{key}.alpha", str(err)) from None
    if head_dim == 2:
        raise cfg.error("head_dim", "2: alpha RoPE raises alpha to head_dim / (head_dim - 2)")
    theta = {"rope_theta": params["rope_theta"]} if "rope_theta" in params else {}
    base = read_rope(cfg, head_dim, theta, key).base  # rope_theta, checked and blamed where the file gives it
    return read_rope(cfg, head_dim, {"rope_theta": base * alpha ** (head_dim / (head_dim - 2))}, key)


def _top_k(cfg: Aliased, n: int, experts: int) -> int:
    """``moe_topk``: one number, or one per layer (transformers reads the first n), all alike."""
    key = cfg.name("moe_topk")
    if isinstance(cfg.raw("moe_topk"), list):
        values = cfg.get("moe_topk", int_list)
        if len(values) < n:
            raise cfg.error(key, f"has {len(values)} entries for {n} layers")
        if len(set(values[:n])) > 1:
            raise cfg.error(key, f"varies over the layers ({values[:n]})", hint="irc's MoE takes one top_k for every "
                                                                                "layer")
        try:
            top_k = positive_int(values[0])
        except Bad as err:
            raise cfg.error(key, str(err)) from None
    else:
        top_k = cfg.get("moe_topk", positive_int)
    if top_k > experts:
        raise cfg.error(key, f"top_k {top_k} exceeds {experts} experts ({cfg.name('num_experts')})")
    return top_k


def _hunyuan(cfg: Config, name: str, model_type: str) -> Arch:
    """Hunyuan dense and MoE: q/k norms after RoPE, biases on q, k, v and o; the MoE's
    renormalised softmax experts plus a shared MLP."""
    moe_model = model_type == "hunyuan_v1_moe"
    cfg = Aliased(cfg, ALIASES if moe_model else {})
    for key, allowed, hint, moe_only in ORIGINAL:
        if moe_model or not moe_only:
            cfg.check(key, allowed, hint=f"{hint}; Tencent's own code reads it: irc refuses to guess")
    if cfg.raw("head_dim") is None:
        raise cfg.error("head_dim", "missing or null", hint="transformers' Hunyuan attention reads head_dim (and fails "
                                                            "without it)")
    dims = _dims(cfg)
    _silu(cfg)
    rope, bias = _rope(cfg, dims["head_dim"]), cfg.get("attention_bias", boolean)
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qkv_bias=bias, out_bias=bias,
                          qk_norm="head_after_rope")
    n = dims["layers"]
    if not moe_model:
        return _arch(cfg, name, model_type, dims, attention, [LayerSpec(None, rope)] * n, _swiglu(cfg),
                     checkpoint="hunyuan")
    experts = cfg.get("num_experts", positive_int)
    width = cfg.get("intermediate_size", positive_int)
    moe = {"experts": experts, "top_k": _top_k(cfg, n, experts), "d_ff": width, "shared_experts": 1,
           "shared_d_ff": width, "scoring": "softmax", "norm_topk_prob": True}
    return _arch(cfg, name, model_type, dims, attention, [LayerSpec(None, rope, True)] * n, None, moe=moe,
                 checkpoint="hunyuan")


FAMILIES = {"hunyuan_v1_dense": _hunyuan, "hunyuan_v1_moe": _hunyuan}
LAYOUTS = {
    "hunyuan": {"attn.q_norm": "self_attn.query_layernorm.weight", "attn.k_norm": "self_attn.key_layernorm.weight",
                "moe.router": "mlp.gate.wg.weight",
                **{f"moe.shared_{x}": f"mlp.shared_mlp.{x}_proj.weight" for x in ("gate", "up", "down")},
                "_resolve": _fused_experts},
}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
