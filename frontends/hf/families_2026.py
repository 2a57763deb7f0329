"""Lesser-known decoder types of transformers 5.25 built from families irc has
(``frontends.hf.families`` registers them): the shared decoder (``frontends.hf.build``) or
this module's copy of it (``_expand``: output gates, sinks, LayerNorms, no pre-norm, a norm
after the MoE only, MLA's norms at eps 1e-6 as transformers builds them).

=================  ==========================================================================
hyperclovax        Granite's µP multipliers (logits *times* ``logits_scaling``; attention
                   scale default head_dim^-0.5), norms after the branches (``use_post_norm``)
granitemoeshared   Granite-MoE plus a shared SwiGLU expert (``shared_intermediate_size``)
mellum             Qwen3-MoE, windows and RoPE by ``layer_types``, dense ``mlp_layer_types``
solar_open         GQA (q/k/v biases), DeepSeek-V3's MoE on every layer
param2moe          GLM-4-MoE (q/k/v biases, q/k norms, partial RoPE, DeepSeek-V3's MoE) under
                   Bailing's names (``attention.query_key_value`` q|k|v, ``word_embeddings``)
hy_v3              q/k norms, DeepSeek-V3's MoE without groups (``router_scaling_factor``)
aria_text          Llama attention, a softmax top-k MoE stored [E, in, out] (``fc1``, ``fc2``)
                   plus ``moe_num_shared_experts`` shared widths
youtu              DeepSeek-V3's MLA with a dense SwiGLU MLP on every layer
minicpm3           MLA with rotate-half RoPE, dense; ``scale_emb``, branches times
                   ``scale_depth`` / √layers, logits times ``dim_model_base`` / hidden_size
axk1               DeepSeek-V3 with a norm on each MoE output (``post_mlp_layernorm``)
minicpm5_moe       GQA whose ``q_proj`` holds per head query | gate (Qwen3-Next's output
                   gate), DeepSeek-V3's MoE
afmoe              q/k norms, output times sigmoid(``gate_proj``), NoPE full layers, norms
                   before and after each branch, sigmoid MoE (``expert_bias``), ``mup_enabled``
flint              Qwen3-MoE attention with sinks (``softmax_offset``), NoPE full layers,
                   sigmoid top-k routing, a shared expert, dense ``mlp_only_layers``
flex_olmo          OLMo-2's post-norm layers (full-width q/k norms) with OLMoE's MoE
jais2              Llama with LayerNorms (bias), q/k/v/o biases, a squared-ReLU MLP with biases
=================  ==========================================================================

Keys are read under transformers' ``attribute_map`` aliases (``Aliased``). Refused, naming the
key: another activation, MLP biases the family lacks, a partial rotary factor where transformers
rotates whole heads (it fails there), AFMoE's ``attention_bias`` (``gate_proj`` has none), Hy3's
``num_shared_experts`` 0 (then one of ``intermediate_size``), bad ``mlp_layer_types``.
"""
from __future__ import annotations

from functools import partial
from typing import Optional

import numpy as np

from frontends.hf import families_llama_like
from frontends.hf.families_llama_like import _multiplier
from frontends.hf import families_base
from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, int_list, read_rope, string_list
from frontends.hf.families_aliases import Aliased, _whole_head
from frontends.hf.families_common import FULL, SLIDING, _arch, _dims, _layer_types, _no, _rope, _silu, _swiglu, _windows
from frontends.hf.families_ssm import Half
from frontends.hf.weights import FusedExperts, Tensor, View
from irc.errors import SpecError
from irc.yamlloc import boolean, non_negative_int, positive_int, positive_number

_LLAMA = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
          "mlp_bias": False}
_V3 = {"n_shared_experts": 1, "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0}
_MLA = {"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "rope_interleave": True}


def _size(vocab, d, d_ff, n, heads, kv=None, head_dim=None, positions=2048) -> dict:
    """A config class's sizes (kv heads and head_dim left out: heads and hidden_size / heads)."""
    return {"vocab_size": vocab, "hidden_size": d, "intermediate_size": d_ff, "num_hidden_layers": n,
            "num_attention_heads": heads, **({"num_key_value_heads": kv} if kv else {}),
            **({"head_dim": head_dim} if head_dim else {}), "max_position_embeddings": positions}


DEFAULTS = {  # transformers 5.25's config classes
    "hyperclovax": {**families_llama_like.DEFAULTS["granite"], **_size(32000, 4096, 11008, 32, 32),
                    "attention_multiplier": None, "use_post_norm": True},
    "granitemoeshared": {**families_llama_like.DEFAULTS["granitemoe"], "shared_intermediate_size": 0},
    "mellum": {**_LLAMA, **_size(98304, 2304, 7168, 28, 32, 4, 128, 131072), "sliding_window": 1024,
               "num_local_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 896, "norm_topk_prob": True},
    "solar_open": {**_LLAMA, **_V3, **_size(196608, 4096, None, 48, 64, 8, 128, 131072), "rms_norm_eps": 1e-5,
                   "moe_intermediate_size": 1280, "num_experts_per_tok": 8, "n_routed_experts": 128, "rope_theta": 1e6},
    "param2moe": {**_LLAMA, **_V3, **_size(128000, 2048, 9216, 21, 32, 8, 64, 32768), "n_routed_experts": 64,
                  "moe_intermediate_size": 2048, "num_experts_per_tok": 6, "n_shared_experts": 2, "use_qk_norm": True,
                  "routed_scaling_factor": 2.5, "first_k_dense_replace": 1, "rope_theta": 5e5,
                  "tie_word_embeddings": True},
    "hy_v3": {**_LLAMA, **_size(120832, 4096, 13312, 80, 64, 8, 128, 131072), "rms_norm_eps": 1e-5, "num_experts": 192,
              "num_experts_per_tok": 8, "num_shared_experts": 1, "moe_intermediate_size": 1536,
              "router_scaling_factor": 2.826, "rope_theta": 11158840.0},
    "aria_text": {**_LLAMA, **_size(32000, 4096, 4096, 32, 32), "moe_num_experts": 8, "moe_topk": 2,
                  "moe_num_shared_experts": 2},
    "youtu": {**_LLAMA, **_MLA, **_size(128256, 2048, 6144, 32, 16, 16, None, 131072), "tie_word_embeddings": True},
    "minicpm3": {**_LLAMA, **_MLA, **_size(73448, 2560, 6400, 62, 40, 40, None, 32768), "rms_norm_eps": 1e-5,
                 "tie_word_embeddings": True, "kv_lora_rank": 256, "q_lora_rank": 768, "qk_nope_head_dim": 64,
                 "qk_rope_head_dim": 32, "v_head_dim": None, "scale_emb": 12, "scale_depth": 1.4,
                 "dim_model_base": 256},
    "axk1": {**_LLAMA, **_MLA, **_V3, **_size(163840, 7168, 18432, 61, 64, 64, None, 32768), "n_group": 8,
             "moe_intermediate_size": 2048, "n_routed_experts": 192, "routed_scaling_factor": 2.5, "topk_group": 4,
             "num_experts_per_tok": 8, "first_k_dense_replace": 1, "moe_layer_freq": 1, "scoring_func": "sigmoid",
             "topk_method": "noaux_tc"},
    "minicpm5_moe": {**_LLAMA, **_V3, **_size(130560, 2048, 8192, 28, 32, 2, 128, 524288), "n_routed_experts": 160,
                     "routed_scaling_factor": 3.66, "num_experts_per_tok": 16, "moe_intermediate_size": 512,
                     "rope_theta": 5e6},
    "afmoe": {**_LLAMA, **_size(200192, 2048, 6144, 32, 16, None, 128, 16384), "rms_norm_eps": 1e-5,
              "moe_intermediate_size": 1408, "num_dense_layers": 1, "num_experts": 64, "num_experts_per_tok": 6,
              "num_shared_experts": 2, "route_scale": 1.0, "global_attn_every_n_layers": 4, "sliding_window": 1024,
              "mup_enabled": False},
    "flint": {**_LLAMA, **_size(150144, 2048, 6144, 49, 32, 4, 128, 262144), "sliding_window": 513,
              "decoder_sparse_step": 1, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 1024,
              "num_experts_per_tok": 6, "num_experts": 256, "norm_topk_prob": True, "mlp_only_layers": [0, 1]},
    "flex_olmo": {**_LLAMA, **_size(100352, 4096, 11008, 32, 32, None, None, 4096), "num_experts_per_tok": 5,
                  "num_experts": 7, "norm_topk_prob": False, "rope_theta": 5e5},
    "jais2": {**_LLAMA, **_size(150272, 3328, 26624, 32, 26, None, None, 8192), "hidden_act": "relu2",
              "layer_norm_eps": 1e-5, "attention_bias": True, "mlp_bias": True},
}
MELLUM_ROPE = {FULL: {"rope_type": "default", "rope_theta": 5e5}, SLIDING: {"rope_type": "default", "rope_theta": 1e4}}


def _expand(arch: Arch, origin: str, form: dict):
    """The shared decoder (``frontends.hf.build``) with ``form``'s extras: ``norm`` "rms" or
    "layer" (LayerNorms with bias); ``pre`` false: no norm before a branch; ``post_moe``: a
    norm on each MoE output (``post_mlp_norm``); ``attention``: ``Layer.attention`` arguments."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    pre, eps, rms = form.get("pre", True), arch.norm_eps, form.get("norm", "rms") == "rms"

    def norm(owner, x, name: str):  # the layer's or the model's
        return owner.rms_norm(x, name, eps) if rms else owner.layer_norm(x, name, eps)
    with m.at(origin):
        x = m.embed(m.input_ids(), scale=arch.embedding_scale)
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            a = _mixer(arch, form, layer, spec, norm(layer, x, "attn_norm") if pre else x)
            if arch.sandwich:
                a = norm(layer, a, "post_attn_norm")
            x = x + (a if arch.residual_scale is None else a * arch.residual_scale)
            f = _ffn(arch, layer, spec, norm(layer, x, "mlp_norm") if pre else x)
            if arch.sandwich or (spec.moe and form.get("post_moe")):
                f = norm(layer, f, "post_mlp_norm")
            x = x + (f if arch.residual_scale is None else f * arch.residual_scale)
        m.logits(norm(m, x, "norm"), tied=arch.tied, softcap=arch.final_softcap, scale=arch.logits_scale)
    return m.graph


def _mixer(arch: Arch, form: dict, layer, spec: LayerSpec, h):
    """The layer's attention: GQA (with ``form``'s extras) or MLA."""
    a, rope = arch.attention, dsl_rope(spec.rope)
    if a.kind == "mla":  # transformers' q_a / kv_a norms: DeepseekV3RMSNorm's default eps
        return layer.mla_attention(h, a.heads, rope=rope, eps=1e-6, scale=a.scale, **a.mla)
    return layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=rope, window=spec.window,
                           softcap=a.softcap, scale=a.scale, qkv_bias=a.qkv_bias, qk_norm=a.qk_norm,
                           qk_norm_eps=arch.norm_eps, out_bias=a.out_bias, clip_qkv=a.clip_qkv,
                           **form.get("attention", {}))


def _ffn(arch: Arch, layer, spec: LayerSpec, h):
    """The layer's MoE, SwiGLU or squared-ReLU MLP."""
    if spec.moe:
        return layer.moe(h, **arch.moe)
    if arch.mlp["kind"] == "relu2":
        return layer.relu2_mlp(h, d_ff=arch.mlp["d_ff"], bias=arch.mlp["bias"])
    return layer.swiglu(h, d_ff=arch.mlp["d_ff"])


def _with(arch: Arch, model_type: str, checkpoint: Optional[str] = None, **form) -> Arch:
    """``arch`` as ``model_type``, built by ``_expand`` with ``form`` (and ``checkpoint``'s names)."""
    arch.model_type, arch.expand = model_type, partial(_expand, form=form)
    arch.checkpoint = checkpoint or arch.checkpoint
    return arch


def _sparse(cfg: Config, n: int, derive) -> list[bool]:
    """Which layers have a MoE: ``mlp_layer_types`` ("dense" | "sparse"), else ``derive(i)``."""
    kinds = cfg.get("mlp_layer_types", string_list) if cfg.has("mlp_layer_types") else [derive(i) for i in range(n)]
    for kind in kinds:
        if kind not in ("dense", "sparse"):
            raise cfg.unsupported("mlp_layer_types", kind, hint="MLP kinds: dense, sparse")
    if len(kinds) != n:
        raise cfg.error("mlp_layer_types", f"has {len(kinds)} entries for {n} layers (num_hidden_layers)")
    return [kind == "sparse" for kind in kinds]


def _v3_moe(cfg: Config, experts: int, shared_key: str = "n_shared_experts", scale_key: str = "routed_scaling_factor",
            renormalise=None, groups: bool = True) -> dict:
    """DeepSeek-V3's MoE: sigmoid, top-k on score + correction bias (in ``topk_group`` of ``n_group``
    groups), the unbiased scores renormalised, times the scale; shared experts of the same width."""
    moe = {"experts": experts, "top_k": cfg.get("num_experts_per_tok", positive_int),
           "d_ff": cfg.get("moe_intermediate_size", positive_int), "scoring": "sigmoid", "router_bias": True,
           "norm_topk_prob": cfg.get("norm_topk_prob", boolean) if renormalise is None else renormalise,
           "routed_scale": cfg.get(scale_key, positive_number),
           "shared_experts": cfg.get(shared_key, non_negative_int, 0) or 0}
    if groups and cfg.get("n_group", positive_int, 1) > 1:
        moe.update(groups=cfg.get("n_group", positive_int), top_groups=cfg.get("topk_group", positive_int),
                   group_score="top2_sum")
    return moe


def _gqa(cfg: Config, dims: dict, bias: str = "qkv", **extra) -> Attention:
    """GQA; ``bias`` "qkv" puts ``attention_bias`` on q, k and v, "qkvo" on o as well (Llama's)."""
    on = cfg.get("attention_bias", boolean)
    return Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qkv_bias=on,
                     out_bias=on and bias == "qkvo", **extra)


def _typed_rope(cfg: Config, head_dim: int, kind: str, default: dict):
    """The RoPE of layer type ``kind`` from a per-type ``rope_parameters``, or the config
    class's ``default`` when the file gives none; whole heads only."""
    params = cfg.data.get("rope_parameters")
    if params is not None and not (isinstance(params, dict) and isinstance(params.get(kind), dict)):
        raise cfg.error(f"rope_parameters.{kind}", "missing: this model gives RoPE per layer type",
                        hint=f"rope_parameters: {{{', '.join(default)}: {{rope_type, rope_theta}}}}")
    return _whole_head(cfg, read_rope(cfg, head_dim, dict(default[kind]), "rope_parameters") if params is None
                       else _rope(cfg, head_dim, kind))


def _base(cfg: Config) -> tuple[dict, object]:
    """The sizes, SiLU, one RoPE over whole heads."""
    dims = _dims(cfg)
    _silu(cfg)
    return dims, _whole_head(cfg, _rope(cfg, dims["head_dim"]))


def _hyperclovax(cfg: Config, name: str, model_type: str) -> Arch:
    """HyperCLOVA X: Granite with post-branch norms and logits times logits_scaling."""
    dims, rope = _base(cfg)
    _no(cfg, "mlp_bias")
    scale = cfg.get("attention_multiplier", positive_number, None) or dims["head_dim"] ** -0.5
    post = cfg.get("use_post_norm", boolean)
    return _arch(cfg, name, model_type, dims, _gqa(cfg, dims, "qkvo", scale=scale),
                 [LayerSpec(None, rope)] * dims["layers"], _swiglu(cfg), sandwich=post,
                 embedding_scale=_multiplier(cfg, "embedding_multiplier"),
                 residual_scale=_multiplier(cfg, "residual_multiplier"),
                 logits_scale=_multiplier(cfg, "logits_scaling"), checkpoint="hyperclovax" if post else "llama")


def _granitemoeshared(cfg: Config, name: str, model_type: str) -> Arch:
    """Granite-MoE plus a shared SwiGLU expert."""
    arch = families_llama_like.FAMILIES["granitemoe"](cfg, name, "granitemoe")
    shared = cfg.get("shared_intermediate_size", non_negative_int)
    if shared:
        arch.moe.update(shared_experts=1, shared_d_ff=shared)
    arch.model_type, arch.checkpoint = model_type, "granitemoeshared" if shared else arch.checkpoint
    return arch


def _mellum(cfg: Config, name: str, model_type: str) -> Arch:
    """Mellum: Qwen3-MoE with windows and RoPE by layer type, dense layers by mlp_layer_types."""
    cfg = Aliased(cfg, {"num_local_experts": ("num_experts",)})
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    types = _layer_types(cfg, n, lambda i: FULL)
    ropes = {kind: _typed_rope(cfg, dims["head_dim"], kind, MELLUM_ROPE) for kind in set(types)}
    sparse = _sparse(cfg, n, lambda i: "sparse")
    layers = [LayerSpec(window, ropes[kind], moe) for window, kind, moe in zip(_windows(cfg, types), types, sparse)]
    moe = {"experts": cfg.get("num_local_experts", positive_int), "top_k": cfg.get("num_experts_per_tok", positive_int),
           "d_ff": cfg.get("moe_intermediate_size", positive_int), "norm_topk_prob": cfg.get("norm_topk_prob", boolean)}
    return _arch(cfg, name, model_type, dims, _gqa(cfg, dims, "qkvo", qk_norm=True), layers,
                 None if all(sparse) else _swiglu(cfg), moe=moe, checkpoint="mellum")


def _solar_open(cfg: Config, name: str, model_type: str) -> Arch:
    """Solar Open: GQA (q/k/v biases) and DeepSeek-V3's MoE on every layer."""
    cfg = Aliased(cfg, {"n_routed_experts": ("num_local_experts",)})
    dims, rope = _base(cfg)
    return _arch(cfg, name, model_type, dims, _gqa(cfg, dims), [LayerSpec(None, rope, True)] * dims["layers"], None,
                 moe=_v3_moe(cfg, cfg.get("n_routed_experts", positive_int)), checkpoint="deepseek")


def _param2moe(cfg: Config, name: str, model_type: str) -> Arch:
    """Param2-MoE: transformers' GLM-4-MoE (partial rotate-half RoPE) under Bailing's names."""
    cfg = Aliased(cfg, {"n_routed_experts": ("num_local_experts", "num_experts"),
                        "n_shared_experts": ("num_shared_experts",), "attention_bias": ("use_qkv_bias",)})
    dims = _dims(cfg)
    _silu(cfg)
    rope, dense = _rope(cfg, dims["head_dim"]), cfg.get("first_k_dense_replace", non_negative_int)
    return _arch(cfg, name, model_type, dims, _gqa(cfg, dims, qk_norm=cfg.get("use_qk_norm", boolean)),
                 [LayerSpec(None, rope, i >= dense) for i in range(dims["layers"])], _swiglu(cfg) if dense else None,
                 moe=_v3_moe(cfg, cfg.get("n_routed_experts", positive_int)), checkpoint="param2moe")


def _hy_v3(cfg: Config, name: str, model_type: str) -> Arch:
    """Hy3: per-head q/k norms, DeepSeek-V3's MoE without groups, dense layers by type."""
    cfg = Aliased(cfg, {"num_experts": ("num_local_experts",)})
    dims, rope = _base(cfg)
    _no(cfg, "mlp_bias")
    if not cfg.get("num_shared_experts", non_negative_int):
        raise cfg.unsupported("num_shared_experts", 0, hint="transformers' Hy3 then builds a shared expert of "
                                                            "intermediate_size; irc refuses to guess")
    sparse = _sparse(cfg, dims["layers"], lambda i: "sparse" if i else "dense")
    moe = _v3_moe(cfg, cfg.get("num_experts", positive_int), "num_shared_experts", "router_scaling_factor",
                  renormalise=True, groups=False)
    return _arch(cfg, name, model_type, dims, _gqa(cfg, dims, "qkvo", qk_norm=True),
                 [LayerSpec(None, rope, moe_) for moe_ in sparse], None if all(sparse) else _swiglu(cfg), moe=moe,
                 checkpoint="hy_v3")


def _aria_text(cfg: Config, name: str, model_type: str) -> Arch:
    """Aria (text): Llama attention, a renormalised softmax top-k MoE plus shared experts."""
    cfg.check("hidden_act", lambda v: v == "silu", hint="Aria's routed experts are SiLU-gated and its shared "
                                                        "experts follow hidden_act: irc's MoE has one activation")
    dims, rope = _base(cfg)
    _no(cfg, "mlp_bias")
    moe = {"experts": cfg.get("moe_num_experts", positive_int), "top_k": cfg.get("moe_topk", positive_int),
           "d_ff": cfg.get("intermediate_size", positive_int), "norm_topk_prob": True,
           "shared_experts": cfg.get("moe_num_shared_experts", positive_int)}
    return _arch(cfg, name, model_type, dims, _gqa(cfg, dims, "qkvo"), [LayerSpec(None, rope, True)] * dims["layers"],
                 None, moe=moe, checkpoint="aria_text")


def _deepseek_v3(cfg: Config, name: str, **data):
    """transformers' DeepSeek-V3 family (``frontends.hf.families``) on the file's keys
    overridden by ``data`` (None: left out)."""
    merged = {k: v for k, v in {**cfg.data, **data}.items() if k not in data or data[k] is not None}
    return families_base.FAMILIES["deepseek_v3"](Aliased(cfg, {"n_routed_experts": ("num_local_experts",)}, merged), name,
                                   "deepseek_v3")


def _youtu(cfg: Config, name: str, model_type: str) -> Arch:
    """Youtu-LLM: DeepSeek-V3's MLA, a dense SwiGLU MLP on every layer."""
    return _with(_deepseek_v3(cfg, name, n_routed_experts=None), model_type)


def _minicpm3(cfg: Config, name: str, model_type: str) -> Arch:
    """MiniCPM3: MLA with rotate-half RoPE, dense, µP scales."""
    v_head_dim = cfg.get("v_head_dim", positive_int, None) or cfg.get("hidden_size", positive_int) // cfg.get(
        "num_attention_heads", positive_int)
    arch = _deepseek_v3(cfg, name, n_routed_experts=None, rope_interleave=False, v_head_dim=v_head_dim)
    n, depth = arch.n_layers, cfg.get("scale_depth", positive_number, None)
    base = cfg.get("dim_model_base", positive_int, None) or arch.d_model
    arch.embedding_scale = _multiplier(cfg, "scale_emb")
    arch.residual_scale = None if depth is None or depth == n ** 0.5 else depth / n ** 0.5
    arch.logits_scale = None if base == arch.d_model else base / arch.d_model
    return _with(arch, model_type)


def _axk1(cfg: Config, name: str, model_type: str) -> Arch:
    """A.X-K1: DeepSeek-V3 with a norm after each MoE, dense layers by mlp_layer_types."""
    arch = _deepseek_v3(cfg, name)
    first = cfg.get("first_k_dense_replace", non_negative_int)
    sparse = _sparse(cfg, arch.n_layers, lambda i: "sparse" if i >= first else "dense")
    arch.layers = [LayerSpec(None, spec.rope, moe) for spec, moe in zip(arch.layers, sparse)]
    arch.mlp = None if all(sparse) else _swiglu(cfg)
    return _with(arch, model_type, "axk1", post_moe=True)


def _minicpm5_moe(cfg: Config, name: str, model_type: str) -> Arch:
    """MiniCPM5-MoE: GQA with an output gate from q_proj, DeepSeek-V3's MoE."""
    cfg = Aliased(cfg, {"n_routed_experts": ("num_local_experts",)})
    dims, rope = _base(cfg)
    sparse = _sparse(cfg, dims["layers"], lambda i: "sparse" if i else "dense")
    arch = _arch(cfg, name, model_type, dims, _gqa(cfg, dims, "qkvo"), [LayerSpec(None, rope, moe) for moe in sparse],
                 None if all(sparse) else _swiglu(cfg), moe=_v3_moe(cfg, cfg.get("n_routed_experts", positive_int)),
                 checkpoint="deepseek")
    return _with(arch, model_type, attention={"output_gate": True})


def _afmoe(cfg: Config, name: str, model_type: str) -> Arch:
    """AFMoE: gated attention, NoPE full layers, norms around each branch, sigmoid MoE."""
    dims, rope = _base(cfg)
    _no(cfg, "attention_bias")
    every, dense = cfg.get("global_attn_every_n_layers", positive_int), cfg.get("num_dense_layers", non_negative_int)
    types = _layer_types(cfg, dims["layers"], lambda i: SLIDING if (i + 1) % every else FULL)
    layers = [LayerSpec(window, rope if kind == SLIDING else None, i >= dense)
              for i, (window, kind) in enumerate(zip(_windows(cfg, types), types))]
    moe = _v3_moe(cfg, cfg.get("num_experts", positive_int), "num_shared_experts", "route_scale", renormalise=True,
                  groups=False)
    arch = _arch(cfg, name, model_type, dims, _gqa(cfg, dims, qk_norm=True), layers, _swiglu(cfg) if dense else None,
                 moe=moe, sandwich=True, embedding_scale=dims["d"] ** 0.5 if cfg.get("mup_enabled", boolean) else None)
    return _with(arch, model_type, "afmoe", attention={"output_gate": True})


def _flint(cfg: Config, name: str, model_type: str) -> Arch:
    """Flint: Qwen3-MoE attention with sinks, NoPE full layers, sigmoid routing, a shared expert."""
    dims, rope = _base(cfg)
    n = dims["layers"]
    types = _layer_types(cfg, n, lambda i: FULL if i < 2 or i % 4 == 1 or i == n - 1 else SLIDING)
    dense, step = set(cfg.get("mlp_only_layers", int_list)), cfg.get("decoder_sparse_step", positive_int)
    sparse = [i not in dense and (i + 1) % step == 0 for i in range(n)]
    layers = [LayerSpec(window, rope if kind == SLIDING else None, moe)
              for window, kind, moe in zip(_windows(cfg, types), types, sparse)]
    moe = {"experts": cfg.get("num_experts", positive_int), "top_k": cfg.get("num_experts_per_tok", positive_int),
           "d_ff": cfg.get("moe_intermediate_size", positive_int), "scoring": "sigmoid",
           "norm_topk_prob": cfg.get("norm_topk_prob", boolean), "shared_experts": 1,
           "shared_d_ff": cfg.get("shared_expert_intermediate_size", positive_int)}
    arch = _arch(cfg, name, model_type, dims, _gqa(cfg, dims, "qkvo", qk_norm=True), layers,
                 None if all(sparse) else _swiglu(cfg), moe=moe)
    return _with(arch, model_type, "flint", attention={"sinks": True})


def _flex_olmo(cfg: Config, name: str, model_type: str) -> Arch:
    """FlexOlmo: OLMo-2's post-norm layers, OLMoE's MoE."""
    cfg = Aliased(cfg, {"num_experts": ("num_local_experts",)})
    dims, rope = _base(cfg)
    moe = {"experts": cfg.get("num_experts", positive_int), "top_k": cfg.get("num_experts_per_tok", positive_int),
           "d_ff": cfg.get("intermediate_size", positive_int), "norm_topk_prob": cfg.get("norm_topk_prob", boolean)}
    arch = _arch(cfg, name, model_type, dims, _gqa(cfg, dims, "qkvo", qk_norm="full"),
                 [LayerSpec(None, rope, True)] * dims["layers"], None, moe=moe, sandwich=True)
    return _with(arch, model_type, "flex_olmo", pre=False)


def _jais2(cfg: Config, name: str, model_type: str) -> Arch:
    """Jais-2: Llama with LayerNorms (``layer_norm_eps``), biases and a squared-ReLU MLP."""
    cfg.check("hidden_act", lambda v: v == "relu2", hint="Jais-2's ungated MLP here: relu2 (squared ReLU)")
    dims = _dims(cfg)
    rope = _whole_head(cfg, _rope(cfg, dims["head_dim"]))
    mlp = {"kind": "relu2", "d_ff": cfg.get("intermediate_size", positive_int), "bias": cfg.get("mlp_bias", boolean)}
    arch = _arch(cfg, name, model_type, dims, _gqa(cfg, dims, "qkvo"), [LayerSpec(None, rope)] * dims["layers"], mlp)
    arch.norm_eps = cfg.get("layer_norm_eps", positive_number)  # Jais2Config has no rms_norm_eps
    return _with(arch, model_type, "jais2", norm="layer")


class QueryGate(Tensor):
    """AFMoE's ``q_proj`` and ``gate_proj`` [H·D, d] as irc's gated query [H·2D, d] (``Layer.
    attention(output_gate=True)``): per head its query rows, then its gate rows."""

    def __init__(self, query: str, gate: str, head_dim: int):
        super().__init__(query)
        self.gate, self.head_dim = gate, head_dim

    def names(self) -> list[str]:
        return [self.name, self.gate]

    def shape(self, checkpoint) -> list[int]:
        shapes = [list(checkpoint.info(name)[1]) for name in self.names()]
        if len(shapes[0]) != 2 or shapes[1] != shapes[0]:
            raise SpecError(f"tensors {self.name} {shapes[0]} and {self.gate} {shapes[1]} are not two equal 2-D "
                            "weights", location=checkpoint.file(self.gate))
        return [2 * shapes[0][0], shapes[0][1]]

    def rows(self, checkpoint, start: int, stop: int) -> np.ndarray:
        query, gate = (checkpoint.read(name) for name in self.names())
        both = np.concatenate([t.reshape(-1, self.head_dim, t.shape[-1]) for t in (query, gate)], axis=1)
        return np.ascontiguousarray(both.reshape(-1, query.shape[-1])[start:stop])


class HubExperts(FusedExperts):
    """Aria's experts, always stored [E, in, out] (``fc1`` [E, d, 2F] gate | up, ``fc2`` [E, F, d]),
    as irc's [E, out, in]; never guessed from the shape (d may be 2F)."""

    def _form(self, checkpoint):
        stored = list(checkpoint.info(self.name)[1])
        want = [self.d_model, 2 * self.d_ff] if self.part != "down" else [self.d_ff, self.d_model]
        if len(stored) != 3 or stored[1:] != want:
            raise SpecError(f"tensor {self.name} {stored} is not [E, {want[0]}, {want[1]}]",
                            location=checkpoint.file(self.name))
        return stored, True


def _bailing_qkv(part: int, kind: str = "weight"):
    """Bailing's fused ``attention.query_key_value`` rows q | k | v: part 0, 1 or 2."""
    def source(arch: Arch, prefix: str) -> View:
        a = arch.attention
        sizes = [a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim]
        return View(f"{prefix}attention.query_key_value.{kind}", range(sum(sizes[:part]), sum(sizes[:part + 1])))
    return source


def _halves(tensor: str, param: str) -> dict:
    """The gate and up halves of a fused [..., 2F, d] ``tensor`` as ``param``_gate / _up."""
    return {f"{param}_{x}": (lambda arch, prefix, second=second: Half(prefix + tensor, second))
            for x, second in (("gate", False), ("up", True))}


FAMILIES = {"hyperclovax": _hyperclovax, "granitemoeshared": _granitemoeshared, "mellum": _mellum,
            "solar_open": _solar_open, "param2moe": _param2moe, "hy_v3": _hy_v3, "aria_text": _aria_text,
            "youtu": _youtu, "minicpm3": _minicpm3, "axk1": _axk1, "minicpm5_moe": _minicpm5_moe, "afmoe": _afmoe,
            "flint": _flint, "flex_olmo": _flex_olmo, "jais2": _jais2}
LAYOUTS = {
    "hyperclovax": {"post_attn_norm": "post_norm1.weight", "post_mlp_norm": "post_norm2.weight"},
    "granitemoeshared": {
        **families_llama_like.LAYOUTS["granitemoe"],
        **_halves("block_sparse_moe.input_linear.weight", "moe.w"),
        **_halves("shared_mlp.input_linear.weight", "moe.shared"),
        "moe.shared_down": "shared_mlp.output_linear.weight"},
    "mellum": {"_spare": ("mtp.",)},
    "param2moe": {**{f"attn.w{x}": _bailing_qkv(i) for i, x in enumerate("qkv")},
                  **{f"attn.b{x}": _bailing_qkv(i, "bias") for i, x in enumerate("qkv")},
                  "attn.wo": "attention.dense.weight", "attn.q_norm": "attention.query_layernorm.weight",
                  "attn.k_norm": "attention.key_layernorm.weight", "moe.router_bias": "mlp.gate.expert_bias",
                  "_top": {"embed": "model.word_embeddings.weight", "norm": "model.norm.weight",
                           "lm_head": "lm_head.weight"}},
    "hy_v3": {"moe.router": "mlp.router.gate.weight", "moe.router_bias": "mlp.expert_bias",
              **{f"moe.shared_{x}": f"mlp.shared_mlp.{x}_proj.weight" for x in ("gate", "up", "down")}},
    "aria_text": {"moe.router": "mlp.router.weight",
                  **{f"moe.w_{x}": (lambda arch, prefix, x=x: HubExperts(
                      prefix + ("mlp.experts.fc2.weight" if x == "down" else "mlp.experts.fc1.weight"), x,
                      arch.moe["d_ff"], arch.d_model)) for x in ("gate", "up", "down")}},
    "axk1": {"post_mlp_norm": "post_mlp_layernorm.weight", "_spare_suffixes": ("post_mlp_layernorm.weight",)},
    "afmoe": {"attn.wq": (lambda arch, prefix: QueryGate(prefix + "self_attn.q_proj.weight", prefix +
                                                         "self_attn.gate_proj.weight", arch.attention.head_dim)),
              "post_attn_norm": "post_attention_layernorm.weight", "mlp_norm": "pre_mlp_layernorm.weight",
              "post_mlp_norm": "post_mlp_layernorm.weight", "moe.router": "mlp.router.gate.weight",
              "moe.router_bias": "mlp.expert_bias"},
    "flint": {"attn.sinks": "self_attn.softmax_offset",
              **{f"moe.shared_{x}": f"mlp.shared_expert.{x}_proj.weight" for x in ("gate", "up", "down")}},
    "flex_olmo": {"post_attn_norm": "post_attention_layernorm.weight",
                  "post_mlp_norm": "post_feedforward_layernorm.weight"},
    "jais2": {"attn_norm.bias": "input_layernorm.bias", "mlp_norm.bias": "post_attention_layernorm.bias",
              "mlp.b_up": "mlp.up_proj.bias", "mlp.b_down": "mlp.down_proj.bias",
              "_top": {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight",
                       "norm.bias": "model.norm.bias", "lm_head": "lm_head.weight"}},
}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
