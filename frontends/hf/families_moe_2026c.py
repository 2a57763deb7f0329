"""More 2026 MoE decoders composing mechanisms irc already has (``frontends.hf.families``
registers them).

=================  ==========================================================================
glm4_moe_lite      GLM-4.7-Flash: DeepSeek-V3's MLA (q_lora or direct q, ``rope_interleave``,
                   YaRN mscale) in GLM-4-MoE's frame: the dense layers by ``mlp_layer_types``
                   (default: the first), the others DeepSeek-V3's sigmoid MoE plus
                   ``n_shared_experts`` shared experts; ``head_dim`` is transformers' alias of
                   ``qk_rope_head_dim``
sarvam_moe         Sarvam-30B: transformers' GLM-4-MoE (GQA, q/k norms with ``use_qk_norm``,
                   q/k/v biases with ``attention_bias`` / ``use_qkv_bias``, RoPE over the whole
                   head unless ``partial_rotary_factor``, base 8e6; DeepSeek-V3's MoE past
                   ``first_k_dense_replace``) under Sarvam's tensor names (``word_embeddings``,
                   fused ``attention.query_key_value``, ``attention.dense``,
                   ``query_layernorm`` / ``key_layernorm``, ``mlp.gate.expert_bias``), as
                   ``param2moe`` (``families_2026``)
exaone_moe         K-EXAONE: EXAONE-4's attention (per-head q/k norms before RoPE, windows on
                   the ``layer_types`` sliding layers, RoPE there only unless
                   ``sliding_window`` is null) in a pre-norm Llama layer; dense layers by
                   ``mlp_layer_types`` (default the first ``first_k_dense_replace``), the
                   others DeepSeek-V3's sigmoid MoE (``num_experts``, groups, renormalised,
                   ``routed_scaling_factor``) plus ``num_shared_experts`` shared experts;
                   the correction bias on disk as ``mlp.e_score_correction_bias``
mimo_v2_flash      MiMo-V2-Flash: Qwen-2 attention (q/k/v biases with ``attention_bias``) with
                   values of ``v_head_dim`` times ``attention_value_scale``; ``layer_types``
                   (default: layer 0 and every 6th full) give the sliding layers a window
                   (``sliding_window``, or ``sliding_window_size`` + 1 as transformers reads
                   it), twice the kv heads and a learned sink logit per head
                   (``attention_sink_bias``); rotate-half RoPE per layer type on the first
                   int(head_dim x ``partial_rotary_factor``) dims (default 0.334; bases 5e6
                   full, 1e4 sliding); dense layers by ``mlp_layer_types`` (default the
                   first), the others DeepSeek-V3's sigmoid MoE without shared experts
=================  ==========================================================================

Refused, naming config.json and the key: GLM-4.7-Flash's ``attention_bias`` (biases on
q_a / kv_a / o that irc's MLA has no place for), a partial rotary factor on its MLA (MLA
rotates exactly qk_rope_head_dim), bad ``mlp_layer_types``; EXAONE-MoE's partial rotary
factor, and the layer-type settings EXAONE-4 refuses (``families_moe_2026``); MiMo's RoPE
other than "default" per layer type (transformers' other RoPE kinds read another partial
factor default), or not given per layer type, and an odd rotary width. Multi-token
prediction weights (GLM-4.7-Flash's extra layer, K-EXAONE's ``mtp.*``) are left aside, as
transformers' causal LM leaves them.
"""
from __future__ import annotations

from functools import partial

from frontends.hf import families_2026
from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, read_rope, rope_dict
from frontends.hf.families_2026 import _deepseek_v3, _sparse
from frontends.hf.families_aliases import Aliased
from frontends.hf.families_common import FULL, SLIDING, _arch, _dims, _layer_types, _silu, _swiglu
from frontends.hf.families_moe_2026 import exaone4_layers
from irc.yamlloc import boolean, non_negative_int, positive_int, positive_number

_V3 = {"n_group": 1, "topk_group": 1, "norm_topk_prob": True}
DEFAULTS = {  # transformers 5.25's config classes
    "glm4_moe_lite": {**_V3, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu",
                      "attention_bias": False, "mlp_bias": False, "vocab_size": 154880, "hidden_size": 2048,
                      "intermediate_size": 10240, "moe_intermediate_size": 1536, "num_hidden_layers": 47,
                      "num_attention_heads": 20, "num_key_value_heads": 20, "n_shared_experts": 1,
                      "n_routed_experts": 64, "routed_scaling_factor": 1.8, "kv_lora_rank": 512, "q_lora_rank": 768,
                      "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192, "num_experts_per_tok": 4,
                      "max_position_embeddings": 202752, "rope_interleave": True},
    "sarvam_moe": {**_V3, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu",
                   "attention_bias": False, "mlp_bias": False, "vocab_size": 262144, "hidden_size": 4096,
                   "intermediate_size": 8192, "num_hidden_layers": 19, "num_attention_heads": 64,
                   "num_key_value_heads": 4, "head_dim": 64, "max_position_embeddings": 131072,
                   "moe_intermediate_size": 1024, "num_experts_per_tok": 6, "n_shared_experts": 1,
                   "n_routed_experts": 128, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
                   "use_qk_norm": True, "rope_theta": 8e6},
    "exaone_moe": {**_V3, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu",
                   "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 2048,
                   "sliding_window": 4096, "sliding_window_pattern": 4, "first_k_dense_replace": 1,
                   "moe_intermediate_size": 1024, "num_experts": 64, "num_experts_per_tok": 8,
                   "num_shared_experts": 1, "routed_scaling_factor": 2.5},
    "mimo_v2_flash": {**_V3, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu",
                      "attention_bias": False, "vocab_size": 152576, "hidden_size": 4096, "intermediate_size": 16384,
                      "moe_intermediate_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 64,
                      "num_key_value_heads": 4, "n_routed_experts": 256, "num_experts_per_tok": 8, "head_dim": 192,
                      "v_head_dim": 128, "sliding_window": 129, "attention_value_scale": 0.707,
                      "max_position_embeddings": 131072, "routed_scaling_factor": 1.0},
}
MIMO_ROPE = {FULL: 5e6, SLIDING: 1e4}  # MiMoV2FlashConfig's bases where the file gives no rope_parameters
MIMO_PARTIAL = 0.334  # its rotary embedding's partial_rotary_factor default
DEEPSEEK_FIXED = {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1,
                  "first_k_dense_replace": 0}  # what transformers' DeepseekV3 code does, the keys unread here


def _glm4_moe_lite(cfg: Config, name: str, model_type: str) -> Arch:
    """GLM-4.7-Flash: DeepSeek-V3's MLA and MoE, dense layers by mlp_layer_types."""
    cfg = Aliased(cfg, {"n_routed_experts": ("num_local_experts",), "qk_rope_head_dim": ("head_dim",)})
    arch = _deepseek_v3(cfg, name, **DEEPSEEK_FIXED, head_dim=None,
                        qk_rope_head_dim=cfg.get("qk_rope_head_dim", positive_int))
    sparse = _sparse(cfg, arch.n_layers, lambda i: "sparse" if i else "dense")
    arch.layers = [LayerSpec(None, spec.rope, moe) for spec, moe in zip(arch.layers, sparse)]
    arch.mlp = None if all(sparse) else _swiglu(cfg)
    arch.moe = arch.moe if any(sparse) else None
    arch.model_type = model_type
    return arch


def _exaone_moe(cfg: Config, name: str, model_type: str) -> Arch:
    """K-EXAONE: EXAONE-4's attention in pre-norm layers, DeepSeek-V3's MoE."""
    dims = _dims(cfg)
    _silu(cfg)
    first = cfg.get("first_k_dense_replace", non_negative_int)
    sparse = _sparse(cfg, dims["layers"], lambda i: "dense" if i < first else "sparse")
    layers = exaone4_layers(cfg, dims, sparse)
    experts = cfg.get("num_experts", positive_int)
    top_k = cfg.get("num_experts_per_tok", positive_int)
    if top_k > experts:
        raise cfg.error("num_experts_per_tok", f"top_k {top_k} exceeds {experts} experts (num_experts)")
    moe = {"experts": experts, "top_k": top_k, "d_ff": cfg.get("moe_intermediate_size", positive_int),
           "shared_experts": cfg.get("num_shared_experts", non_negative_int),
           "routed_scale": cfg.get("routed_scaling_factor", positive_number), "scoring": "sigmoid",
           "router_bias": True, "norm_topk_prob": cfg.get("norm_topk_prob", boolean)}
    groups, top_groups = cfg.get("n_group", positive_int), cfg.get("topk_group", positive_int)
    if (groups, top_groups) != (1, 1):  # one group of all the experts chooses as no groups do
        moe.update(groups=groups, top_groups=top_groups, group_score="top2_sum")
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qk_norm=True)
    return _arch(cfg, name, model_type, dims, attention, layers, None if all(sparse) else _swiglu(cfg),
                 moe=moe if any(sparse) else None, checkpoint="exaone_moe")


def _mimo_rope(cfg: Config, head_dim: int, kind: str):
    """MiMo's RoPE of one layer type: its entry of a per-type ``rope_parameters``."""
    if not cfg.has("rope_parameters"):
        if int(head_dim * MIMO_PARTIAL) % 2:
            raise cfg.error("head_dim", f"rotates int({head_dim} x {MIMO_PARTIAL}) = {int(head_dim * MIMO_PARTIAL)} "
                                        "dims, an odd number", hint="irc rotates pairs; the rotary width must be even")
        return read_rope(cfg, head_dim, {"rope_theta": MIMO_ROPE[kind], "partial_rotary_factor": MIMO_PARTIAL},
                         "rope_parameters")
    params = cfg.raw("rope_parameters")
    if not isinstance(params, dict) or not isinstance(params.get(kind), dict):
        raise cfg.error("rope_parameters", f"has no {kind} entry", hint="MiMo-V2-Flash gives RoPE per layer type")
    params, key = rope_dict(cfg, kind)
    if params.get("rope_type", params.get("type", "default")) != "default":
        raise cfg.unsupported(f"{key}.rope_type", params.get("rope_type", params.get("type")),
                              hint="transformers' MiMo computes other RoPE kinds with another partial factor "
                                   "default; irc reads default only")
    params.setdefault("partial_rotary_factor", MIMO_PARTIAL)
    return read_rope(cfg, head_dim, params, key, default_base=MIMO_ROPE[kind])


def _mimo_v2_flash(cfg: Config, name: str, model_type: str) -> Arch:
    """MiMo-V2-Flash: per-type windows, kv heads, sinks and RoPE; narrower scaled values; V3 MoE."""
    cfg = Aliased(cfg, {"n_routed_experts": ("num_local_experts",)})
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    types = _layer_types(cfg, n, lambda i: FULL if i == 0 or not (i + 1) % 6 else SLIDING)
    window = cfg.get("sliding_window_size", positive_int) + 1 if cfg.has("sliding_window_size") else \
        cfg.get("sliding_window", positive_int)
    ropes = {kind: _mimo_rope(cfg, dims["head_dim"], kind) for kind in set(types)}
    sparse = _sparse(cfg, n, lambda i: "sparse" if i else "dense")
    layers = [LayerSpec(window if kind == SLIDING else None, ropes[kind], moe) for kind, moe in zip(types, sparse)]
    experts = cfg.get("n_routed_experts", positive_int)
    top_k = cfg.get("num_experts_per_tok", positive_int)
    if top_k > experts:
        raise cfg.error("num_experts_per_tok", f"top_k {top_k} exceeds {experts} experts (n_routed_experts)")
    moe = {"experts": experts, "top_k": top_k, "d_ff": cfg.get("moe_intermediate_size", positive_int),
           "routed_scale": cfg.get("routed_scaling_factor", positive_number, None) or 1.0, "scoring": "sigmoid",
           "router_bias": True, "norm_topk_prob": cfg.get("norm_topk_prob", boolean)}
    groups, top_groups = cfg.get("n_group", positive_int), cfg.get("topk_group", positive_int)
    if (groups, top_groups) != (1, 1):
        moe.update(groups=groups, top_groups=top_groups, group_score="top2_sum")
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"],
                          qkv_bias=cfg.get("attention_bias", boolean))
    arch = _arch(cfg, name, model_type, dims, attention, layers, None if all(sparse) else _swiglu(cfg),
                 moe=moe if any(sparse) else None, checkpoint="mimo_v2_flash")
    arch.expand = partial(_mimo_expand, v_head_dim=cfg.get("v_head_dim", positive_int),
                          v_scale=cfg.get("attention_value_scale", positive_number, None) or 1.0)
    return arch


def _mimo_expand(arch: Arch, origin: str, v_head_dim: int, v_scale: float):
    """MiMo-V2-Flash's decoder through the DSL: Llama's pre-norm layers around ``_mimo_attention``."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps = arch.norm_eps
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            x = x + _mimo_attention(arch, layer, layer.rms_norm(x, "attn_norm", eps), spec, v_head_dim, v_scale)
            h = layer.rms_norm(x, "mlp_norm", eps)
            x = x + (layer.moe(h, **arch.moe) if spec.moe else layer.swiglu(h, d_ff=arch.mlp["d_ff"]))
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


def _mimo_attention(arch: Arch, layer, x, spec: LayerSpec, v_head_dim: int, v_scale: float):
    """GQA with values of their own width, scaled; a sliding layer (``spec.window``) has twice
    the kv heads and a sink logit per head (``attn.sinks`` [H])."""
    m, p, i, a = layer.model, layer.prefix, layer.index, arch.attention
    sliding = spec.window is not None
    heads, kv_heads, head_dim = a.heads, a.kv_heads * (2 if sliding else 1), a.head_dim
    rope = dsl_rope(spec.rope)
    d, kv_heads, head_dim = layer._heads(x, heads, kv_heads, head_dim)
    layer._check_rope(rope, head_dim, "head_dim")
    shapes = {"q": heads * head_dim, "k": kv_heads * head_dim, "v": kv_heads * v_head_dim}
    projected = {}
    for which, rows in shapes.items():
        bias = m.param(f"{p}attn.b{which}", (rows,)) if a.qkv_bias else None
        projected[which] = m.emit("linear", [x, m.param(f"{p}attn.w{which}", (rows, d)), bias], None, f"{p}{which}")[0]
    v = projected["v"] if v_scale == 1.0 else m.scale(projected["v"], v_scale, f"{p}v_scaled")
    q, k = layer._rotate(projected["q"], projected["k"], rope, (heads, kv_heads, head_dim))
    mask, _ = m._context()
    past_key, past_value = m._past(i, kv_heads, head_dim, v_head_dim)
    attrs = {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
             "v_head_dim": None if v_head_dim == head_dim else v_head_dim, "causal": True, "window": spec.window,
             "softcap": None, "scale": None}
    sink = m.param(f"{p}attn.sinks", (heads,)) if sliding else None
    out, *presents = m.emit("attention", [q, k, v, mask, past_key, past_value, sink, None, None], attrs,
                            [f"{p}attn", f"present.{i}.key", f"present.{i}.value"])
    m._presents += [present.value for present in presents]
    layer._note_attention("gqa", heads, kv_heads, head_dim, v_head_dim, spec.window, None, None, rope,
                          qkv_bias=a.qkv_bias, qk_norm=False, **({"attn_sinks": True} if sliding else {}))
    return m.emit("linear", [out, m.param(f"{p}attn.wo", (d, heads * v_head_dim)), None], None, f"{p}attn_out")[0]


FAMILIES = {"glm4_moe_lite": _glm4_moe_lite, "sarvam_moe": families_2026.FAMILIES["param2moe"],
            "exaone_moe": _exaone_moe, "mimo_v2_flash": _mimo_v2_flash}
LAYOUTS = {
    "exaone_moe": {"moe.router_bias": "mlp.e_score_correction_bias", "_spare": ("mtp.",)},
    "mimo_v2_flash": {"attn.sinks": "self_attn.attention_sink_bias", "_spare": ("model.mtp.",)},
}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
