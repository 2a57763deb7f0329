"""Beam and LongCat-Flash (``frontends.hf.families`` registers them; their kin are
``families_moe_2026c``'s).

=================  ==========================================================================
beam               Beam-1.0: Qwen-3-MoE attention (per-head q/k RMS norms before RoPE, biases
                   on q, k, v and o with ``attention_bias``) with an output gate of its own
                   (``gate_proj`` plus one ``gate_bias`` per head: out x sigmoid(gate));
                   ``layer_types`` (default: every 6th layer and the last full, the others
                   sliding with ``sliding_window``); RoPE per layer type from a per-type
                   ``rope_parameters`` (default: RoPE on the sliding layers, none on the full
                   ones), and where a type has none its queries are scaled by
                   (1 + (position + 1) / 2048) ** 0.1 (computed at every position:
                   exp(0.1·log(...)) with the ``log`` primitive); Gemma-2's four norms with depth-scaled residual adds (the
                   k-th add, k = 2, 3, ... in order: x = branch / sqrt(k) + x·sqrt((k - 1) / k));
                   dense SwiGLU layers by ``mlp_layer_types`` (default the first three), the
                   others DeepSeek-V3's sigmoid MoE (``num_experts``, ``n_group`` /
                   ``topk_group``, renormalised with ``norm_topk_prob``, times
                   ``routed_scaling_factor``) without shared experts; logits soft-capped by
                   ``final_logit_softcapping``
longcat_flash      LongCat-Flash: ``num_layers`` layers of two sublayers each (transformers'
                   cache layers 2l and 2l + 1): DeepSeek's MLA (q LoRA always, interleaved
                   RoPE, YaRN mscale) with q times sqrt(hidden_size / q_lora_rank) and the
                   normed kv latent times sqrt(hidden_size / kv_lora_rank) (both read into
                   the q_a / kv_a norm weights), a dense SwiGLU of ``ffn_hidden_size`` after
                   each; the first sublayer's MLP input also feeds a shortcut MoE, added after
                   the second sublayer: softmax over ``n_routed_experts`` + ``zero_expert_num``
                   router rows, top ``moe_topk`` by score + ``e_score_correction_bias``, the
                   scores times ``routed_scaling_factor`` (no renormalisation); a zero expert
                   returns its input (``irc.ops.moe``'s ``identity_experts``)
=================  ==========================================================================

Refused, naming config.json and the key: LongCat's ``attention_bias`` and ``router_bias``
(biases irc's MLA and router have no place for), a ``head_dim`` other than
``qk_rope_head_dim`` (transformers' rotary table is head_dim wide), a ``qk_head_dim`` other than
nope + rope, a ``num_hidden_layers`` other than twice ``num_layers``; Beam's ``rope_parameters`` not given per layer type
(transformers' Beam reads it by layer type), a partial rotary factor, sliding layers without a
``sliding_window``, a null ``n_group`` / ``topk_group``, an activation other than SiLU.
"""
from __future__ import annotations

import math
from functools import partial

import numpy as np

from frontends.hf.families_common import MLA_NORM_EPS
from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, read_rope, rope_dict
from frontends.hf.families_2026 import _deepseek_v3, _sparse
from frontends.hf.families_aliases import _whole_head
from frontends.hf.families_common import FULL, SLIDING, _arch, _dims, _layer_types, _silu, _swiglu
from frontends.hf.weights import Checkpoint, Stack, Tensor, View
from irc.yamlloc import boolean, non_negative_int, positive_int, positive_number

DEFAULTS = {  # transformers 5.25's BeamConfig (over Qwen3MoeConfig)
    "beam": {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
             "vocab_size": 151936, "hidden_size": 5120, "intermediate_size": 20480, "num_hidden_layers": 52,
             "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 8192,
             "sliding_window": 512, "moe_intermediate_size": 2560, "num_experts": 256, "num_experts_per_tok": 8,
             "norm_topk_prob": True, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
             "final_logit_softcapping": 30.0},
    "longcat_flash": {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu",
                      "attention_bias": False, "vocab_size": 131072, "hidden_size": 6144, "num_layers": 28,
                      "num_attention_heads": 64, "max_position_embeddings": 131072, "ffn_hidden_size": 12288,
                      "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                      "v_head_dim": 128, "moe_topk": 12, "n_routed_experts": 512, "zero_expert_num": 256,
                      "expert_ffn_hidden_size": 2048, "routed_scaling_factor": 6.0, "router_bias": False,
                      "rope_theta": 1e7},
}
BEAM_THETA = 10000.0  # BeamConfig's RoPE base on the sliding layers where the file gives no rope_parameters
BEAM_DENSE = 3  # its default dense layers
QUERY_SCALE_LENGTH, QUERY_SCALE_POWER = 2048, 0.1  # transformers' compute_attention_scaling


def _beam_ropes(cfg: Config, head_dim: int, kinds: set) -> dict:
    """Each layer type's RoPE (None: the type runs without, its queries scaled)."""
    if not cfg.has("rope_parameters"):
        return {kind: read_rope(cfg, head_dim, {"rope_theta": BEAM_THETA}, "rope_parameters") if kind == SLIDING
                else None for kind in kinds}
    params = cfg.raw("rope_parameters")
    ropes = {}
    for kind in sorted(kinds):
        if not isinstance(params, dict) or kind not in params:
            raise cfg.error("rope_parameters", f"has no {kind} entry",
                            hint="Beam gives RoPE per layer type (null: none)")
        ropes[kind] = None if params[kind] is None else _whole_head(cfg, read_rope(
            cfg, head_dim, *rope_dict(cfg, kind), default_base=BEAM_THETA,
            original_max=cfg.get("max_position_embeddings", positive_int)))
    return ropes


def _beam(cfg: Config, name: str, model_type: str) -> Arch:
    """Beam: gated, normed GQA with NoPE query scaling; sandwich norms, depth-scaled residuals."""
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    types = _layer_types(cfg, n, lambda i: FULL if i == n - 1 or not (i + 1) % 6 else SLIDING)
    window = cfg.get("sliding_window", positive_int) if SLIDING in types else None
    ropes = _beam_ropes(cfg, dims["head_dim"], set(types))
    sparse = _sparse(cfg, n, lambda i: "dense" if i < min(BEAM_DENSE, n) else "sparse")
    layers = [LayerSpec(window if kind == SLIDING else None, ropes[kind], moe) for kind, moe in zip(types, sparse)]
    experts = cfg.get("num_experts", positive_int)
    top_k = cfg.get("num_experts_per_tok", positive_int)
    if top_k > experts:
        raise cfg.error("num_experts_per_tok", f"top_k {top_k} exceeds {experts} experts (num_experts)")
    moe = {"experts": experts, "top_k": top_k, "d_ff": cfg.get("moe_intermediate_size", positive_int),
           "routed_scale": cfg.get("routed_scaling_factor", positive_number), "scoring": "sigmoid",
           "router_bias": True, "norm_topk_prob": cfg.get("norm_topk_prob", boolean)}
    groups, top_groups = cfg.get("n_group", positive_int), cfg.get("topk_group", positive_int)
    if (groups, top_groups) != (1, 1):
        moe.update(groups=groups, top_groups=top_groups, group_score="top2_sum")
    bias = cfg.get("attention_bias", boolean)
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qkv_bias=bias, out_bias=bias)
    arch = _arch(cfg, name, model_type, dims, attention, layers, None if all(sparse) else _swiglu(cfg),
                 moe=moe if any(sparse) else None, final_softcap=cfg.get("final_logit_softcapping", positive_number,
                                                                         None), checkpoint="beam")
    arch.expand = partial(_beam_expand, positions=cfg.get("max_position_embeddings", positive_int))
    return arch


def _beam_expand(arch: Arch, origin: str, positions: int):
    """Beam's decoder through the DSL (the module docstring's form)."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps = arch.norm_eps
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            k = 2 * (layer.index + 1)
            a = _beam_attention(arch, layer, layer.rms_norm(x, "attn_norm", eps), spec, positions)
            x = _depth_add(m, layer.rms_norm(a, "post_attn_norm", eps), x, k, f"{layer.prefix}attn_residual")
            h = layer.rms_norm(x, "mlp_norm", eps)
            h = layer.moe(h, **arch.moe) if spec.moe else layer.swiglu(h, d_ff=arch.mlp["d_ff"])
            x = _depth_add(m, layer.rms_norm(h, "post_mlp_norm", eps), x, k + 1, f"{layer.prefix}mlp_residual")
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied, softcap=arch.final_softcap)
    return m.graph


def _depth_add(m, branch, residual, k: int, name: str):
    """branch / sqrt(k) + residual·sqrt((k - 1) / k), transformers' depth_scaled_residual_add."""
    return m.add(m.scale(branch, 1.0 / math.sqrt(k), f"{name}_branch"),
                 m.scale(residual, math.sqrt((k - 1) / k), f"{name}_skip"), name)


def _query_scale(m, positions: int):
    """[B, T, 1]: each token's NoPE query scale at ``position_ids``, exp(0.1 · log(1 + (p + 1) /
    2048)) = (1 + (p + 1) / 2048) ** 0.1 (transformers' compute_attention_scaling), computed for
    any position (built once a graph)."""
    key = "beam_query_scale"
    if key not in m._rope_tables:
        _, position_ids = m._context()
        p = m.emit("cast", [position_ids], {"to": "f32"}, "query_scale_positions")[0]
        column = m.emit("reshape", [p], {"shape": list(position_ids.shape) + [1]}, "query_scale_column")[0]
        shifted = m.emit("add", [column, m.emit("constant", [], {"value": 1.0 + QUERY_SCALE_LENGTH},
                                                "query_scale_offset")[0]], None, "query_scale_shifted")[0]
        ratio = m.emit("mul", [shifted, m.emit("constant", [], {"value": 1.0 / QUERY_SCALE_LENGTH},
                                               "query_scale_unit")[0]], None, "query_scale_ratio")[0]
        power = m.emit("mul", [m.emit("log", [ratio], None, "query_scale_log")[0],
                               m.emit("constant", [], {"value": QUERY_SCALE_POWER}, "query_scale_power")[0]], None,
                       "query_scale_scaled_log")[0]
        m._rope_tables[key] = m.emit("exp", [power], None, "query_scale")[0]
    return m._rope_tables[key]


def _beam_attention(arch: Arch, layer, x, spec: LayerSpec, positions: int):
    """Beam's attention: q/k/v (biases), per-head q/k norms, RoPE or the NoPE query scale, the
    attention op over the layer's cache, out x sigmoid(``attn.w_gate`` x + ``attn.b_gate``), o."""
    m, p, i, a = layer.model, layer.prefix, layer.index, arch.attention
    rope = dsl_rope(spec.rope)
    d, kv_heads, head_dim = layer._heads(x, a.heads, a.kv_heads, a.head_dim)
    layer._check_rope(rope, head_dim, "head_dim")
    sizes = (a.heads, kv_heads, head_dim)

    def project(which: str, rows: int, inputs: int, bias: bool, source):
        weight = m.param(f"{p}attn.w{which}", (rows, inputs))
        return m.emit("linear", [source, weight, m.param(f"{p}attn.b{which}", (rows,)) if bias else None], None,
                      f"{p}{which}")[0]

    heads = {"q": a.heads, "k": kv_heads, "v": kv_heads}
    q, k, v = (project(which, n * head_dim, d, a.qkv_bias, x) for which, n in heads.items())
    q, k = layer._qk_norms(q, k, "head", sizes, arch.norm_eps, 0.0)
    q, k = layer._rotate(q, k, rope, sizes)
    if rope is None:
        q = m.emit("mul", [q, _query_scale(m, positions)], None, f"{p}q_scaled")[0]
    mask, _ = m._context()
    past_key, past_value = m._past(i, kv_heads, head_dim, head_dim)
    attrs = {"heads": a.heads, "kv_heads": kv_heads, "head_dim": head_dim, "v_head_dim": None, "causal": True,
             "window": spec.window, "softcap": None, "scale": None}
    out, *presents = m.emit("attention", [q, k, v, mask, past_key, past_value, None, None, None], attrs,
                            [f"{p}attn", f"present.{i}.key", f"present.{i}.value"])
    m._presents += [present.value for present in presents]
    gate = project("_gate", a.heads * head_dim, d, True, x)
    sig = m.emit("sigmoid", [gate], None, f"{p}attn_gate_sigmoid")[0]
    out = m.emit("mul", [out, sig], None, f"{p}attn_gated")[0]
    layer._note_attention("gqa", a.heads, kv_heads, head_dim, head_dim, spec.window, None, None, rope,
                          qkv_bias=a.qkv_bias, qk_norm=True)
    return project("o", d, a.heads * head_dim, a.out_bias, out)


def _gate_bias(arch: Arch, prefix: str) -> View:
    """``self_attn.gate_bias`` [H], each head's entry repeated over its head_dim: [H·D]."""
    a = arch.attention
    return View(prefix + "self_attn.gate_bias", rows=tuple(h for h in range(a.heads) for _ in range(a.head_dim)))


def _longcat_layers(cfg: Config) -> int:
    """``num_layers``, or half of ``num_hidden_layers`` (LongcatFlashConfig's property: two
    sublayers a layer) where the file gives only that."""
    if not cfg.has("num_hidden_layers"):
        return cfg.get("num_layers", positive_int)
    sublayers = cfg.get("num_hidden_layers", positive_int)
    if sublayers % 2 or (cfg.has("num_layers") and sublayers != 2 * cfg.get("num_layers", positive_int)):
        raise cfg.error("num_hidden_layers", f"{sublayers} is not twice num_layers",
                        hint="LongCat's layers hold two sublayers each: num_hidden_layers = 2 x num_layers")
    return sublayers // 2


def _longcat(cfg: Config, name: str, model_type: str) -> Arch:
    """LongCat-Flash: paired MLA sublayers with dense MLPs, a shortcut MoE with zero experts."""
    cfg.check("router_bias", lambda v: not v, hint="irc's router has no bias of its own")
    layers = _longcat_layers(cfg)
    rope_dim = cfg.get("qk_rope_head_dim", positive_int)
    if cfg.has("head_dim") and cfg.get("head_dim", positive_int) != rope_dim:
        raise cfg.error("head_dim", f"{cfg.raw('head_dim')} is not qk_rope_head_dim {rope_dim}",
                        hint="transformers' LongCat builds its rotary table head_dim wide and rotates "
                             "qk_rope_head_dim")
    qk = cfg.get("qk_nope_head_dim", positive_int) + rope_dim
    if cfg.raw("qk_head_dim") is not None and cfg.get("qk_head_dim", positive_int) != qk:
        raise cfg.error("qk_head_dim", f"is not qk_nope_head_dim + qk_rope_head_dim = {qk}")
    cfg.get("q_lora_rank", positive_int)  # LongCat always projects q through its LoRA
    dense = Config(cfg.data, cfg.path, cfg.text, {k: v for k, v in cfg.defaults.items() if k != "n_routed_experts"})
    arch = _deepseek_v3(dense, name, num_hidden_layers=2 * layers, intermediate_size=cfg.get("ffn_hidden_size",
                        positive_int), n_routed_experts=None, head_dim=None, rope_interleave=True)
    experts, top_k = cfg.get("n_routed_experts", positive_int), cfg.get("moe_topk", positive_int)
    zero = cfg.get("zero_expert_num", non_negative_int, None) or 0
    if top_k > experts + zero:
        raise cfg.error("moe_topk", f"top_k {top_k} exceeds {experts} + {zero} experts")
    arch.moe = {"experts": experts, "identity": zero, "top_k": top_k,
                "d_ff": cfg.get("expert_ffn_hidden_size", positive_int),
                "routed_scale": cfg.get("routed_scaling_factor", positive_number)}
    arch.model_type, arch.checkpoint, arch.expand = model_type, "longcat_flash", _longcat_expand
    return arch


def _longcat_expand(arch: Arch, origin: str):
    """LongCat-Flash's decoder through the DSL: each layer two DSL layers (the module docstring)."""
    from frontends.dsl import Model
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps, a, d_ff = arch.norm_eps, arch.attention, arch.mlp["d_ff"]
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer in m.layers(arch.n_layers):  # sublayer layer.index % 2 of layer layer.index // 2
            h = layer.rms_norm(x, "attn_norm", eps)
            x = x + layer.mla_attention(h, a.heads, rope=dsl_rope(arch.layers[layer.index].rope), eps=MLA_NORM_EPS,
                                        scale=a.scale, **a.mla)
            h = layer.rms_norm(x, "mlp_norm", eps)
            if layer.index % 2 == 0:
                shortcut = _zero_expert_moe(layer, h, **arch.moe)
                x = x + layer.swiglu(h, d_ff=d_ff)
            else:
                x = x + layer.swiglu(h, d_ff=d_ff) + shortcut
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


def _zero_expert_moe(layer, x, experts: int, identity: int, top_k: int, d_ff: int, routed_scale: float):
    """LongCat's MoE: the ``moe`` op with ``identity_experts`` (router and selection bias of
    experts + identity rows), softmax scores, not renormalised."""
    m, p = layer.model, layer.prefix
    d = m._features(x)
    routed = experts + identity
    operands = [x, m.param(f"{p}moe.router", (routed, d)), m.param(f"{p}moe.w_gate", (experts, d_ff, d)),
                m.param(f"{p}moe.w_up", (experts, d_ff, d)), m.param(f"{p}moe.w_down", (experts, d, d_ff)),
                m.param(f"{p}moe.router_bias", (routed,))]
    attrs = {"experts": experts, "top_k": top_k, "scoring": "softmax", "norm_topk_prob": False,
             "routed_scale": routed_scale, "identity_experts": identity}
    out = m.emit("moe", operands, attrs, f"{p}moe_out")[0]
    if m.meta["moe"] is None:
        m.meta["moe"] = {"experts": experts, "identity_experts": identity, "top_k": top_k, "d_ff": d_ff,
                         "shared_experts": 0, "shared_d_ff": None, "scoring": "softmax", "router_bias": True,
                         "norm_topk_prob": False, "routed_scale": routed_scale, "groups": None, "top_groups": None,
                         "group_score": "max", "shared_expert_gate": False, "layers": []}
    m.meta["moe"]["layers"].append(layer.index)
    return out


class Scaled(Tensor):
    """One tensor times a constant (LongCat's LoRA scales, read into its MLA norm weights)."""

    def __init__(self, name: str, factor: float):
        super().__init__(name)
        self.factor = factor

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        data = checkpoint.read(self.name, start, stop)
        return (data.astype(np.float32) * np.float32(self.factor)).astype(data.dtype)

    def __repr__(self) -> str:
        return f"{self.name}[x {self.factor:g}]"


LONGCAT_NAMES = {"attn_norm": "input_layernorm.{i}.weight", "mlp_norm": "post_attention_layernorm.{i}.weight",
                 **{f"attn.{x}": f"self_attn.{{i}}.{n}.weight" for x, n in (
                     ("q_a", "q_a_proj"), ("q_b", "q_b_proj"), ("kv_a", "kv_a_proj_with_mqa"), ("kv_b", "kv_b_proj"),
                     ("wo", "o_proj"))},
                 **{f"mlp.w_{x}": f"mlps.{{i}}.{x}_proj.weight" for x in ("gate", "up", "down")},
                 "moe.router": "mlp.router.classifier.weight", "moe.router_bias": "mlp.router.e_score_correction_bias"}


def _longcat_resolve(arch: Arch, param: str, checkpoint: Checkpoint):
    """A LongCat param's tensor: DSL layer 2l + i is sublayer i of checkpoint layer l."""
    if not param.startswith("layers."):
        return None
    index, _, suffix = param[len("layers."):].partition(".")
    prefix, i = f"model.layers.{int(index) // 2}.", int(index) % 2
    if suffix in LONGCAT_NAMES:
        return Tensor(prefix + LONGCAT_NAMES[suffix].format(i=i))
    if suffix.startswith("moe.w_"):
        part = suffix[len("moe.w_"):]
        return Stack([Tensor(f"{prefix}mlp.experts.{e}.{part}_proj.weight") for e in range(arch.moe["experts"])])
    lora = {"attn.q_a_norm": ("q_a_layernorm", "q_lora_rank"), "attn.kv_a_norm": ("kv_a_layernorm", "kv_lora_rank")}
    if suffix in lora:
        norm, rank = lora[suffix]
        return Scaled(f"{prefix}self_attn.{i}.{norm}.weight", (arch.d_model / arch.attention.mla[rank]) ** 0.5)
    return None


FAMILIES = {"beam": _beam, "longcat_flash": _longcat}
LAYOUTS = {
    "beam": {"post_attn_norm": "post_attention_layernorm.weight", "mlp_norm": "pre_feedforward_layernorm.weight",
             "post_mlp_norm": "post_feedforward_layernorm.weight", "attn.w_gate": "self_attn.gate_proj.weight",
             "attn.b_gate": _gate_bias},
    "longcat_flash": {"_resolve": _longcat_resolve, "_spare": ("model.mtp",)},
}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
