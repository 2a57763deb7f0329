"""Decoders of 2025-26 that compose mechanisms irc already has (``frontends.hf.families``
registers them): GQA attention with partial RoPE, q/k biases and q/k norms, beside DeepSeek-V3's
sigmoid router or Qwen-MoE's softmax one.

=================  ==========================================================================
glm4_moe           GLM-4.5 / 4.6 / 4.7: GQA, q/k/v biases (``attention_bias``; none on o_proj),
                   per-head q/k RMS norms before RoPE with ``use_qk_norm``, half-convention
                   RoPE on the first ``partial_rotary_factor`` of each head (default 0.5, as
                   Glm4MoeConfig sets it); layers past ``first_k_dense_replace`` a
                   DeepSeek-V3 MoE (sigmoid scores, ``e_score_correction_bias`` for the
                   choice, ``n_group`` / ``topk_group`` by the top-two sum, renormalised with
                   ``norm_topk_prob``, times ``routed_scaling_factor``) plus ``n_shared_experts``
                   shared experts of ``moe_intermediate_size`` each
minimax_m2         MiniMax-M2: GQA, q and k RMS-normed over their full width (``q_norm`` [H·D],
                   ``k_norm`` [K·D]) before RoPE on ``rotary_dim`` of each head (the released
                   key; ``partial_rotary_factor`` wins), RoPE base 5e6; every layer a sigmoid
                   MoE with ``e_score_correction_bias``, top-k renormalised, experts of
                   ``intermediate_size``, no shared expert (Mixtral's tensor names)
ernie4_5_moe       ERNIE-4.5 MoE: interleaved RoPE on the whole head (base 500000), tied; the
                   layers i with (i + 1) % ``moe_layer_interval`` == 0 between
                   ``moe_layer_start_index`` and ``moe_layer_end_index`` (-1: the last) a softmax
                   MoE whose choice adds ``moe_statics.e_score_correction_bias`` ([1, E] on disk),
                   weights renormalised, plus ``moe_num_shared_experts`` x
                   ``moe_intermediate_size`` shared; ``moe_num_experts`` / ``moe_k`` (or
                   ``num_experts`` / ``num_experts_per_tok``)
dots1              dots.llm1: Qwen-3 attention (per-head q/k norms before RoPE, windows on the
                   ``layer_types`` "sliding_attention" layers, default those from
                   ``max_window_layers`` on) with DeepSeek-V3's MoE past ``first_k_dense_replace``
exaone4            EXAONE-4.0: OLMo-2's layers (no norm before the branches; each branch's output
                   RMS-normed before its residual add) with per-head q/k norms before RoPE;
                   ``layer_types`` (default: every ``sliding_window_pattern``-th layer full) with
                   a ``sliding_window`` on the sliding ones, RoPE there only (the full layers are
                   NoPE) unless ``sliding_window`` is null (then RoPE everywhere)
=================  ==========================================================================

Experts are read per expert (``mlp.experts.{e}.gate_proj``..., MiniMax's
``block_sparse_moe.experts.{e}.w1|w2|w3``), as transformers 5.25's save_pretrained writes them
and as the released checkpoints hold them; GLM-4.5, dots1 and ERNIE checkpoints whose experts
are stored fused as transformers holds them in memory (``mlp.experts.gate_up_proj`` [E, 2F, d],
``mlp.experts.down_proj`` [E, d, F]) are read too. Multi-token-prediction weights are left
aside as transformers' causal LM leaves them (its ``generate(use_mtp=True)`` drafts with them;
irc's graph is the model alone): GLM-4.5's extra layer ``model.layers.{num_hidden_layers}``
(``num_nextn_predict_layers``), ERNIE's ``model.mtp_*``.

Refused, naming config.json and the key: biases where irc's decoder has no place for them
(dots1's ``attention_bias``, which transformers puts on o_proj too; ERNIE's ``use_bias``), an
activation other than SiLU, a partial rotary factor on ERNIE, dots1 and EXAONE-4 (their rotary
embeddings span the head), an odd rotary width, a top_k above the expert count, an ERNIE
``moe_norm_min`` above top_k / experts (the clamp would change weights irc renormalises
plainly), per-layer lists where transformers reads one number (ERNIE's ``moe_num_experts``),
more than one ERNIE MTP layer (as transformers does), and settings the original code reads but
transformers ignores, where the two would differ: ERNIE's ``moe_use_aux_free`` false,
MiniMax-M2's ``use_qk_norm`` false, ``qk_norm_type`` other than per_layer, ``scoring_func``
other than sigmoid, ``use_routing_bias`` false, ``shared_intermediate_size`` > 0, an
``attn_type_list`` with lightning layers (irc refuses to guess). EXAONE-4's ``layer_types``
must be given where its config class cannot derive them (``sliding_window`` null, or a string
``sliding_window_pattern``), and its sliding layers need a ``sliding_window``.

Hunyuan (q/k norms after RoPE) is ``families_hunyuan``'s.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, read_rope, rope_dict
from frontends.hf.families_aliases import Aliased, _whole_head
from frontends.hf.families_common import FULL, SLIDING, _arch, _dims, _layer_types, _no, _silu, _swiglu, _windows
from frontends.hf.weights import Checkpoint, FusedExperts, Source, Stack, Tensor
from irc.yamlloc import boolean, non_negative_int, positive_int, positive_number

_BASE = {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False}
DEFAULTS = {  # transformers 5.25's config classes (keys without a default there are required)
    "glm4_moe": {**_BASE, "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 10944,
                 "num_hidden_layers": 46, "num_attention_heads": 96, "num_key_value_heads": 8,
                 "max_position_embeddings": 131072, "moe_intermediate_size": 1408, "num_experts_per_tok": 8,
                 "n_shared_experts": 1, "n_routed_experts": 128, "routed_scaling_factor": 1.0, "n_group": 1,
                 "topk_group": 1, "first_k_dense_replace": 1, "norm_topk_prob": True, "use_qk_norm": False},
    "minimax_m2": {**_BASE, "rms_norm_eps": 1e-6, "vocab_size": 200064, "hidden_size": 3072,
                   "intermediate_size": 1536, "num_hidden_layers": 62, "num_attention_heads": 48,
                   "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 196608,
                   "num_experts_per_tok": 8, "num_local_experts": 256, "rope_theta": 5e6},
    "ernie4_5_moe": {**_BASE, "tie_word_embeddings": True, "vocab_size": 103424, "hidden_size": 2560,
                     "intermediate_size": 12288, "num_hidden_layers": 28, "num_attention_heads": 20,
                     "num_key_value_heads": 4, "max_position_embeddings": 131072, "use_bias": False,
                     "moe_intermediate_size": 1536, "moe_k": 6, "moe_num_experts": 64, "moe_num_shared_experts": 2,
                     "moe_layer_start_index": 1, "moe_layer_end_index": -1, "moe_layer_interval": 1,
                     "moe_norm_min": 1e-12, "rope_theta": 500000.0},
    "dots1": {**_BASE, "rms_norm_eps": 1e-6, "vocab_size": 152064, "hidden_size": 4608, "intermediate_size": 10944,
              "moe_intermediate_size": 1408, "num_hidden_layers": 62, "num_attention_heads": 32,
              "num_key_value_heads": 32, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 0,
              "norm_topk_prob": False, "max_position_embeddings": 2048, "routed_scaling_factor": 1.0,
              "sliding_window": 4096, "max_window_layers": 62},
    "exaone4": {**_BASE, "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 16384,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
                "max_position_embeddings": 2048, "sliding_window": 4096, "sliding_window_pattern": 4},
}
ALIASES = {  # transformers' attribute_map: the alias the file may write instead
    "glm4_moe": {"n_routed_experts": ("num_local_experts",)},
    "dots1": {"n_routed_experts": ("num_local_experts",)},
    "minimax_m2": {"num_local_experts": ("num_experts",)},
    "ernie4_5_moe": {"moe_num_experts": ("num_experts",), "moe_k": ("num_experts_per_tok",)},
}
GLM_PARTIAL = 0.5  # Glm4MoeConfig's partial_rotary_factor where the file gives none
MINIMAX_ORIGINAL = (  # MiniMax-M2's original switches transformers ignores: (key, what transformers does)
    ("use_qk_norm", lambda v: v is None or v is True, "transformers always norms q and k"),
    ("qk_norm_type", lambda v: v in (None, "per_layer"), "transformers norms q and k over their full width"),
    ("scoring_func", lambda v: v in (None, "sigmoid"), "transformers routes on sigmoid scores"),
    ("use_routing_bias", lambda v: v is None or v is True, "transformers always adds e_score_correction_bias"),
    ("shared_intermediate_size", lambda v: not v, "transformers' MiniMax-M2 has no shared expert"),
    ("attn_type_list", lambda v: v is None or (isinstance(v, list) and all(t == 1 for t in v)),
     "transformers' MiniMax-M2 has softmax attention (type 1) on every layer"),
)


def _partial_rope(cfg: Config, head_dim: int, fallback: Optional[float], convention: str = "half",
                  blame: str = "head_dim"):
    """RoPE with ``partial_rotary_factor`` as transformers resolves it: in the RoPE settings,
    else at the top level, else ``fallback`` (the config class's default, or what ``blame``
    gives: MiniMax-M2's ``rotary_dim``)."""
    params, key = rope_dict(cfg)
    if fallback is not None and "partial_rotary_factor" not in params and "partial_rotary_factor" not in cfg.data:
        rotary = int(head_dim * fallback)
        if rotary % 2 or rotary > head_dim:
            raise cfg.error(blame, f"rotates {rotary} of {head_dim} dims",
                            hint="irc rotates pairs within a head: an even width up to head_dim")
        params["partial_rotary_factor"] = fallback
    return read_rope(cfg, head_dim, params, key, default_base=cfg.defaults.get("rope_theta", 10000.0),
                     convention=convention, original_max=cfg.get("max_position_embeddings", positive_int, None))


def _top_k(cfg: Config, experts: int, key: str, experts_key: str) -> int:
    top_k = cfg.get(key, positive_int)
    if top_k > experts:
        raise cfg.error(key, f"top_k {top_k} exceeds {experts} experts ({experts_key})")
    return top_k


def _v3_moe(cfg: Config) -> dict:
    """DeepSeek-V3's MoE as GLM-4.5 and dots1 configure it (one expert group: no groups)."""
    experts = cfg.get("n_routed_experts", positive_int)
    moe = {"experts": experts, "top_k": _top_k(cfg, experts, "num_experts_per_tok", "n_routed_experts"),
           "d_ff": cfg.get("moe_intermediate_size", positive_int),
           "shared_experts": cfg.get("n_shared_experts", non_negative_int),
           "routed_scale": cfg.get("routed_scaling_factor", positive_number), "scoring": "sigmoid",
           "router_bias": True, "norm_topk_prob": cfg.get("norm_topk_prob", boolean)}
    groups, top_groups = cfg.get("n_group", positive_int), cfg.get("topk_group", positive_int)
    if (groups, top_groups) != (1, 1):  # one group of all the experts chooses as no groups do
        moe.update(groups=groups, top_groups=top_groups, group_score="top2_sum")
    return moe


def _glm4_moe(cfg: Config, name: str, model_type: str) -> Arch:
    """GLM-4.5: partial RoPE, q/k/v biases, optional q/k norms, DeepSeek-V3's MoE."""
    cfg = Aliased(cfg, ALIASES[model_type])
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    rope = _partial_rope(cfg, dims["head_dim"], GLM_PARTIAL)
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"],
                          qkv_bias=cfg.get("attention_bias", boolean), qk_norm=cfg.get("use_qk_norm", boolean))
    first_dense = cfg.get("first_k_dense_replace", non_negative_int)
    moe_layers = [i >= first_dense for i in range(n)]
    layers = [LayerSpec(None, rope, is_moe) for is_moe in moe_layers]
    mlp = _swiglu(cfg) if not all(moe_layers) else None
    return _arch(cfg, name, model_type, dims, attention, layers, mlp, moe=_v3_moe(cfg) if any(moe_layers) else None,
                 checkpoint="glm4_moe")


def _dots1(cfg: Config, name: str, model_type: str) -> Arch:
    """dots.llm1: Qwen-3 attention with windows, DeepSeek-V3's MoE."""
    cfg = Aliased(cfg, ALIASES[model_type])
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    cfg.check("attention_bias", lambda v: not v, hint="dots1 puts it on o_proj as well, which irc's shared "
                                                       "decoder has no place for")
    windowed = cfg.raw("sliding_window") is not None
    start = cfg.get("max_window_layers", non_negative_int)
    types = _layer_types(cfg, n, lambda i: SLIDING if windowed and i >= start else FULL)
    rope = _whole_head(cfg, _partial_rope(cfg, dims["head_dim"], None))
    first_dense = cfg.get("first_k_dense_replace", non_negative_int)
    layers = [LayerSpec(window, rope, i >= first_dense) for i, window in enumerate(_windows(cfg, types))]
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qk_norm=True)
    mlp = _swiglu(cfg) if first_dense else None
    return _arch(cfg, name, model_type, dims, attention, layers, mlp, moe=_v3_moe(cfg) if first_dense < n else None,
                 checkpoint="dots1")


def _minimax_m2(cfg: Config, name: str, model_type: str) -> Arch:
    """MiniMax-M2: full-width q/k norms, partial RoPE, a sigmoid MoE on every layer."""
    cfg = Aliased(cfg, ALIASES[model_type])
    for key, allowed, hint in MINIMAX_ORIGINAL:
        cfg.check(key, allowed, hint=f"{hint}; MiniMax's own code reads it: irc refuses to guess")
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    rotary_dim = cfg.get("rotary_dim", positive_int, None)
    rope = _partial_rope(cfg, dims["head_dim"], None if rotary_dim is None else rotary_dim / dims["head_dim"],
                         blame="rotary_dim")
    experts = cfg.get("num_local_experts", positive_int)
    moe = {"experts": experts, "top_k": _top_k(cfg, experts, "num_experts_per_tok", "num_local_experts"),
           "d_ff": cfg.get("intermediate_size", positive_int), "scoring": "sigmoid", "router_bias": True,
           "norm_topk_prob": True}
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qk_norm="full")
    return _arch(cfg, name, model_type, dims, attention, [LayerSpec(None, rope, True)] * n, None, moe=moe,
                 checkpoint="minimax_m2")


def _ernie_moe(cfg: Config, name: str, model_type: str) -> Arch:
    """ERNIE-4.5 MoE: interleaved RoPE, softmax routing with a selection bias, shared experts."""
    cfg = Aliased(cfg, ALIASES[model_type])
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    _no(cfg, "use_bias")
    cfg.check("num_nextn_predict_layers", lambda v: v is None or v <= 1,
              hint="transformers' ERNIE-4.5 MoE supports one MTP layer")
    cfg.check("moe_use_aux_free", lambda v: v is None or v is True,
              hint="transformers always adds moe_statics.e_score_correction_bias to the choice, ERNIE's own code "
                   "only with aux-free routing: irc refuses to guess")
    rope = _whole_head(cfg, _partial_rope(cfg, dims["head_dim"], None, convention="interleaved"))
    experts = cfg.get("moe_num_experts", positive_int)
    top_k = _top_k(cfg, experts, "moe_k", "moe_num_experts")
    norm_min = cfg.get("moe_norm_min", positive_number)
    if norm_min > top_k / experts:  # the top-k softmax weights sum to at least top_k / experts
        raise cfg.unsupported("moe_norm_min", norm_min, hint=f"a clamp above top_k / experts = {top_k / experts:g} "
                                                             "can change the routing weights; irc renormalises plainly")
    start, interval = cfg.get("moe_layer_start_index", non_negative_int), cfg.get("moe_layer_interval", positive_int)
    end = cfg.raw("moe_layer_end_index")
    end = n - 1 if end == -1 else cfg.get("moe_layer_end_index", non_negative_int)
    moe_layers = [(i + 1) % interval == 0 and start <= i <= end for i in range(n)]
    moe = {"experts": experts, "top_k": top_k, "d_ff": cfg.get("moe_intermediate_size", positive_int),
           "shared_experts": cfg.get("moe_num_shared_experts", non_negative_int), "scoring": "softmax",
           "router_bias": True, "norm_topk_prob": True}
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"])
    layers = [LayerSpec(None, rope, is_moe) for is_moe in moe_layers]
    mlp = _swiglu(cfg) if not all(moe_layers) else None
    return _arch(cfg, name, model_type, dims, attention, layers, mlp, moe=moe if any(moe_layers) else None,
                 checkpoint="ernie4_5_moe")


def _exaone4_types(cfg: Config, n: int) -> list[str]:
    """EXAONE-4's layer types: ``layer_types``, else every ``sliding_window_pattern``-th full."""
    if cfg.has("layer_types"):
        return _layer_types(cfg, n, None)
    if cfg.raw("sliding_window") is None:
        raise cfg.error("sliding_window", "null without layer_types: Exaone4Config cannot derive the layer types",
                        hint="give layer_types (all full_attention for a model without windows)")
    pattern = cfg.raw("sliding_window_pattern")
    if isinstance(pattern, str):
        raise cfg.unsupported("sliding_window_pattern", pattern, hint="Exaone4Config derives layer types from a "
                                                                      "number only; give layer_types")
    pattern = cfg.get("sliding_window_pattern", positive_int)
    return [SLIDING if (i + 1) % pattern else FULL for i in range(n)]


def exaone4_layers(cfg: Config, dims: dict, sparse: Optional[list] = None) -> list[LayerSpec]:
    """EXAONE-4's layers (and K-EXAONE's, whose ``sparse`` flags say which hold the MoE): the
    windows of ``layer_types``, RoPE on every layer without a window and only on the sliding
    ones with one (the full layers NoPE)."""
    n = dims["layers"]
    types = _exaone4_types(cfg, n)
    windowed = cfg.raw("sliding_window") is not None
    if not windowed and SLIDING in types:
        raise cfg.error("sliding_window", "null, yet layer_types has sliding_attention layers",
                        hint="give the window of the sliding layers")
    rope = _whole_head(cfg, _partial_rope(cfg, dims["head_dim"], None))
    return [LayerSpec(window, rope if not windowed or kind == SLIDING else None, moe)
            for window, kind, moe in zip(_windows(cfg, types), types, sparse or [False] * n)]


def _exaone4(cfg: Config, name: str, model_type: str) -> Arch:
    """EXAONE-4.0: OLMo-2's post-norm layers, per-head q/k norms, NoPE full layers."""
    dims = _dims(cfg)
    _silu(cfg)
    layers = exaone4_layers(cfg, dims)
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qk_norm=True)
    arch = _arch(cfg, name, model_type, dims, attention, layers, _swiglu(cfg), checkpoint="olmo2")
    arch.expand = _post_norm_expand
    return arch


def _post_norm_expand(arch: Arch, origin: str):
    """EXAONE-4's decoder through the DSL: x + norm(attn(x)), x + norm(mlp(x))."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps = arch.attention, arch.norm_eps
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            y = layer.attention(x, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=dsl_rope(spec.rope),
                                window=spec.window, qk_norm=True, qk_norm_eps=eps)
            x = x + layer.rms_norm(y, "post_attn_norm", eps)
            x = x + layer.rms_norm(layer.swiglu(x, d_ff=arch.mlp["d_ff"]), "post_mlp_norm", eps)
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


# ---- checkpoint names -------------------------------------------------------------------

class Flat(Tensor):
    """A [1, n] tensor as an [n] param (ERNIE's ``moe_statics.e_score_correction_bias``)."""

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        stored = list(checkpoint.info(self.name)[1])
        return stored[1:] if len(stored) == 2 and stored[0] == 1 else stored

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        data = checkpoint.read(self.name)
        return np.ascontiguousarray(data.reshape(data.shape[-1:] if data.ndim == 2 else data.shape)[start:stop])


def _fused_experts(arch: Arch, param: str, checkpoint: Checkpoint) -> Optional[Source]:
    """Experts stored fused (``mlp.experts.gate_up_proj`` / ``down_proj``, as transformers
    holds them) where the checkpoint has them; None: the layout's per-expert names."""
    layer, _, suffix = param.partition(".")[2].partition(".")
    part = suffix[len("moe.w_"):] if suffix.startswith("moe.w_") else None
    if not param.startswith("layers.") or part not in ("gate", "up", "down"):
        return None
    name = f"model.layers.{layer}.mlp.experts.{'down_proj' if part == 'down' else 'gate_up_proj'}"
    return FusedExperts(name, part, arch.moe["d_ff"], arch.d_model) if name in checkpoint.files else None


def _per_expert(template: str):
    """Per-expert tensors ``template.format(e=...)`` under a layer, stacked into [E, ...]."""
    def source(arch: Arch, prefix: str) -> Stack:
        return Stack([Tensor(prefix + template.format(e=e)) for e in range(arch.moe["experts"])])
    return source


def _flat(name: str):
    def source(arch: Arch, prefix: str) -> Flat:
        return Flat(prefix + name)
    return source


FAMILIES = {"glm4_moe": _glm4_moe, "minimax_m2": _minimax_m2, "ernie4_5_moe": _ernie_moe, "dots1": _dots1,
            "exaone4": _exaone4}
LAYOUTS = {
    "glm4_moe": {"_resolve": _fused_experts},
    "dots1": {"_resolve": _fused_experts},
    "ernie4_5_moe": {"moe.router_bias": _flat("mlp.moe_statics.e_score_correction_bias"),
                     "_spare": ("model.mtp_",), "_resolve": _fused_experts},
    "minimax_m2": {"moe.router": "block_sparse_moe.gate.weight",
                   "moe.router_bias": "block_sparse_moe.e_score_correction_bias",
                   **{f"moe.w_{x}": _per_expert(f"block_sparse_moe.experts.{{e}}.{w}.weight")
                      for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))}},
}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
