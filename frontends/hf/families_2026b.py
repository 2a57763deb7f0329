"""Cohere's 2026 decoders and DBRX (``frontends.hf.families`` registers them): Cohere's parallel
block (``families_cohere``) with RoPE per layer type or a MoE, and DBRX's fused-QKV MoE decoder.

=================  ==========================================================================
cohere_compass     North (CohereCompass) text decoder: Cohere's parallel layers, x + attn(h) +
_text              mlp(h), h = LayerNorm(x) without bias (``families_cohere``'s loop);
                   ``layer_types`` (default: all full) with ``sliding_window`` on the sliding
                   ones; RoPE per layer type from ``rope_parameters.<type>`` (rotate-half; a
                   null entry: NoPE), its multi-axis ``mrope_section`` plain RoPE on text
                   positions; logits times ``logit_scale`` (null: 1); tied
cohere2_moe        Command-A MoE: Cohere-2's parallel layers (interleaved RoPE on the sliding
                   layers and, with ``prefix_dense_sliding_window_pattern`` 1, on the dense
                   prefix; NoPE on the other full layers), LayerNorm without bias or, with
                   ``rms_norm_eps``, RMSNorm; ``mlp_layer_types`` (default: the first
                   ``first_k_dense_replace`` dense, of ``prefix_dense_intermediate_size``)
                   else a top-k MoE of ``intermediate_size`` experts: softmax over the top-k
                   logits (renormalised) or sigmoid (renormalised with ``norm_topk_prob``), plus
                   ``num_shared_experts`` x ``intermediate_size`` shared, summed or averaged
                   (``shared_expert_combination_strategy``: the MoE output times 0.5)
dbrx               DBRX: LayerNorms without bias (eps 1e-5) before attention and MoE, fused
                   ``Wqkv`` (q | k | v, ``attn_config.kv_n_heads``) clamped to
                   ±``attn_config.clip_qkv``, rotate-half RoPE; every layer a softmax top-k MoE
                   (``ffn_config``) whose weights are divided by their p-norm,
                   ``moe_normalize_expert_weights`` 1 (renormalised) or null (as they are);
                   experts stored ``w1`` / ``v1`` / ``w2`` [E·F, d] (``w2`` per expert
                   [F, d], read transposed); untied
=================  ==========================================================================

Refused, naming config.json and the key: biases (``attention_bias``), an activation other
than SiLU (``hidden_act``, ``ffn_config.ffn_act_fn``), a partial rotary width (the default
rotary embeddings span the head), unknown ``mlp_layer_types``, ``expert_selection_fn`` or
``shared_expert_combination_strategy``, a tied DBRX (its config class refuses it), a
``moe_normalize_expert_weights`` other than 1 or null (a p-norm irc's MoE op has no form for).
Where transformers 5.25 reads a setting otherwise than the model's own code would: CohereCompass
needs each used layer type in ``rope_parameters`` with its ``rope_theta`` (transformers fails
without them); Cohere2-MoE reads ``rope_theta`` inside ``rope_parameters`` only and ignores
``rope_scaling`` (refused); DBRX's rotary embedding reads the top-level ``rope_parameters`` /
``rope_theta`` (default 10000), not ``attn_config.rope_theta`` (500000 in the released
config.json): a differing ``attn_config.rope_theta`` is refused, irc refuses to guess. DBRX's
``clip_qkv`` null leaves q, k and v unclamped, as DBRX's code does (transformers 5.25's clamp fails
there). CohereCompassTextConfig fills ``layer_types`` before it would read ``sliding_window_pattern``:
without ``layer_types`` every layer is full, as here.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from frontends.hf.config import Arch, Attention, Config, LayerSpec, NestedConfig, RopeSpec, dsl_rope, read_rope
from frontends.hf.families_2026 import _sparse
from frontends.hf.families_aliases import Aliased, _whole_head
from frontends.hf.families_cohere import _expand as _cohere_expand
from frontends.hf.families_common import FULL, SLIDING, _dims, _layer_types, _no, _rope, _silu, _windows
from frontends.hf.families_moe_2026 import _fused_experts
from frontends.hf.weights import Checkpoint, Rows, Tensor
from irc.errors import SpecError
from irc.yamlloc import boolean, layer_count, non_negative_int, positive_int, positive_number

_COHERE = {"vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528, "num_hidden_layers": 40,
           "num_attention_heads": 64, "hidden_act": "silu", "max_position_embeddings": 8192, "layer_norm_eps": 1e-5,
           "tie_word_embeddings": True, "attention_bias": False, "sliding_window": 4096}
DEFAULTS = {  # transformers 5.25's config classes
    "cohere_compass_text": {**_COHERE, "logit_scale": None},
    "cohere2_moe": {**_COHERE, "logit_scale": 0.0625, "head_dim": 128, "rope_theta": 10000.0, "num_experts": 8,
                    "num_experts_per_tok": 2, "num_shared_experts": 0, "shared_expert_combination_strategy": "average",
                    "expert_selection_fn": "softmax", "prefix_dense_sliding_window_pattern": 1, "norm_topk_prob": True,
                    "prefix_dense_intermediate_size": None, "rms_norm_eps": None, "sliding_window_pattern": 4},
    "dbrx": {"d_model": 2048, "n_heads": 16, "n_layers": 24, "max_position_embeddings": 2048, "vocab_size": 32000,
             "attn_config": None, "ffn_config": None, "tie_word_embeddings": False},
}
DBRX_ATTENTION = {"clip_qkv": None, "kv_n_heads": 1}  # DbrxAttentionConfig
DBRX_FFN = {"ffn_act_fn": None, "ffn_hidden_size": 3584, "moe_num_experts": 4, "moe_top_k": 1,  # DbrxFFNConfig
            "moe_normalize_expert_weights": 1.0}
DBRX_ALIASES = {"n_heads": ("num_attention_heads",), "n_layers": ("num_hidden_layers",),  # DbrxConfig's
                "max_position_embeddings": ("max_seq_len",)}  # attribute_map, the other way (hidden_size: _dbrx)
MROPE_KEYS = ("mrope_section", "mrope_interleaved")  # multi-axis RoPE: on text positions, plain RoPE
AVERAGE, SUM = "average", "sum"


# ---- cohere_compass_text ------------------------------------------------------------------

def _compass_rope(cfg: Config, head_dim: int, kind: str):
    """The RoPE of one layer type: ``rope_parameters.<kind>`` (null: none), as
    CohereCompassRotaryEmbedding builds it."""
    params = cfg.data.get("rope_parameters")
    key = f"rope_parameters.{kind}"
    if not isinstance(params, dict) or kind not in params:
        raise cfg.error("rope_parameters", f"has no {kind} entry: CohereCompass gives RoPE per layer type (null "
                        "for none)", hint="transformers' CohereCompassRotaryEmbedding fails without it")
    entry = params[kind]
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise cfg.error(key, "expected an object or null")
    if "rope_theta" not in entry:
        raise cfg.error(key, "has no rope_theta: transformers reads the base from the layer type's entry only")
    if "partial_rotary_factor" in entry or cfg.has("partial_rotary_factor"):
        where = f"{key}.partial_rotary_factor" if "partial_rotary_factor" in entry else "partial_rotary_factor"
        raise cfg.error(where, "a partial rotary width is not supported for this model",
                        hint="transformers' CohereCompass rotates the whole head")
    flat = {k: v for k, v in entry.items() if k not in MROPE_KEYS}
    return read_rope(cfg, head_dim, flat, key, original_max=cfg.get("max_position_embeddings", positive_int, None))


def _compass(cfg: Config, name: str, model_type: str) -> Arch:
    """North's text decoder: Cohere's parallel layers, RoPE per layer type."""
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    _no(cfg, "attention_bias")
    types = _layer_types(cfg, n, lambda i: FULL)
    ropes = {kind: _compass_rope(cfg, dims["head_dim"], kind) for kind in dict.fromkeys(types)}
    layers = [LayerSpec(window, ropes[kind]) for window, kind in zip(_windows(cfg, types), types)]
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=dims["d"], n_layers=n, norm_eps=cfg.get("layer_norm_eps", positive_number),
                attention=Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"]), layers=layers,
                mlp={"kind": "swiglu", "d_ff": cfg.get("intermediate_size", positive_int)},
                tied=cfg.get("tie_word_embeddings", boolean),
                logits_scale=cfg.get("logit_scale", positive_number, None))
    arch.expand = partial(_cohere_expand, qk_norm=False)
    return arch


# ---- cohere2_moe --------------------------------------------------------------------------

def _cohere2_moe_rope(cfg: Config, head_dim: int) -> RopeSpec:
    """Cohere-2's interleaved RoPE as Cohere2MoeConfig reads it: ``rope_parameters`` as
    written (its ``rope_theta`` inside), else ``rope_theta``; ``rope_scaling`` is ignored."""
    params = cfg.data.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" not in params:
        raise cfg.error("rope_parameters", "has no rope_theta: Cohere2MoeConfig keeps rope_parameters as written",
                        hint="transformers' rotary embedding fails without it; give rope_theta inside")
    if params is None and cfg.has("rope_scaling"):
        raise cfg.unsupported("rope_scaling", cfg.raw("rope_scaling"),
                              hint="Cohere2MoeConfig ignores rope_scaling; irc refuses to guess (give rope_parameters)")
    return _whole_head(cfg, _rope(cfg, head_dim, convention="interleaved"))


def _cohere2_moe_types(cfg: Config, n: int) -> tuple[list, list]:
    """(attention types, MoE per layer), derived as Cohere2MoeConfig does where the file leaves
    them out: the first ``first_k_dense_replace`` layers dense, windows every layer but each
    ``prefix_dense_sliding_window_pattern``-th of them and each ``sliding_window_pattern``-th after."""
    first = cfg.get("first_k_dense_replace", non_negative_int, 0)
    prefix, pattern = cfg.get("prefix_dense_sliding_window_pattern", positive_int), \
        cfg.get("sliding_window_pattern", positive_int)
    types = _layer_types(cfg, n, lambda i: SLIDING if ((i + 1) % prefix if i < first else (i - first + 1) % pattern)
                         else FULL)
    return types, _sparse(cfg, n, lambda i: "dense" if i < first else "sparse")


def _cohere2_moe(cfg: Config, name: str, model_type: str) -> Arch:
    """Command-A MoE: Cohere-2's parallel layers with a dense prefix and a top-k MoE."""
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    _no(cfg, "attention_bias")
    rope = _cohere2_moe_rope(cfg, dims["head_dim"])
    types, sparse = _cohere2_moe_types(cfg, n)
    forced = cfg.get("prefix_dense_sliding_window_pattern", positive_int) == 1  # RoPE on every dense layer
    layers = [LayerSpec(window, rope if window is not None or (forced and not moe) else None, moe)
              for window, moe in zip(_windows(cfg, types), sparse)]
    selection = cfg.raw("expert_selection_fn")
    if selection not in ("softmax", "sigmoid"):
        raise cfg.unsupported("expert_selection_fn", selection, hint="Cohere2-MoE routes by softmax or sigmoid")
    combine = cfg.raw("shared_expert_combination_strategy")
    if combine not in (AVERAGE, SUM):
        raise cfg.unsupported("shared_expert_combination_strategy", combine, hint="average or sum")
    experts, d_ff = cfg.get("num_experts", positive_int), cfg.get("intermediate_size", positive_int)
    top_k = cfg.get("num_experts_per_tok", positive_int)
    if top_k > experts:
        raise cfg.error("num_experts_per_tok", f"top_k {top_k} exceeds {experts} experts (num_experts)")
    shared = cfg.get("num_shared_experts", non_negative_int)
    moe = {"experts": experts, "top_k": top_k, "d_ff": d_ff, "shared_experts": shared, "scoring": selection,
           # a softmax over the top-k logits is the renormalised top-k of a softmax over all
           "norm_topk_prob": selection == "softmax" or cfg.get("norm_topk_prob", boolean)}
    rms = cfg.raw("rms_norm_eps") is not None
    eps = cfg.get("rms_norm_eps" if rms else "layer_norm_eps", positive_number)
    dense = cfg.get("prefix_dense_intermediate_size", positive_int, None) or d_ff
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=dims["d"], n_layers=n, norm_eps=eps,
                attention=Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"]), layers=layers,
                mlp={"kind": "swiglu", "d_ff": dense} if not all(sparse) else None,
                moe=moe if any(sparse) else None, tied=cfg.get("tie_word_embeddings", boolean),
                checkpoint="cohere2_moe", logits_scale=cfg.get("logit_scale", positive_number, None))
    arch.expand = partial(_expand, rms=rms, parallel=True, moe_scale=0.5 if shared and combine == AVERAGE else None)
    return arch


# ---- dbrx ---------------------------------------------------------------------------------

def _nested(cfg: Config, key: str, defaults: dict, what: str) -> Config:
    """``attn_config`` / ``ffn_config`` as a config of its own (the class's defaults when null)."""
    if cfg.raw(key) is None:
        return Config({}, cfg.path, cfg.text, defaults)
    return NestedConfig(cfg, key, defaults, what)


def _dbrx(cfg: Config, name: str, model_type: str) -> Arch:
    """DBRX: fused clamped QKV, LayerNorms without bias, a softmax top-k MoE on every layer."""
    cfg = Aliased(cfg, DBRX_ALIASES)
    cfg.check("hidden_size", lambda v: v is None or v == cfg.raw("d_model"), hint="DbrxConfig sizes its experts by "
              "d_model before hidden_size replaces it, and transformers' model does not run; give d_model")
    d, n = cfg.get("d_model", positive_int), cfg.get("n_layers", layer_count)
    heads = cfg.get("n_heads", positive_int)
    if d % heads:
        raise cfg.error("n_heads", f"d_model {d} is not divisible by {heads} heads")
    a = _nested(cfg, "attn_config", DBRX_ATTENTION, "DBRX's attention settings")
    f = _nested(cfg, "ffn_config", DBRX_FFN, "DBRX's expert settings")
    kv_heads = a.get("kv_n_heads", positive_int)
    if heads % kv_heads:
        raise a.error("kv_n_heads", f"{heads} heads are not divisible by {kv_heads} kv heads")
    cfg.check("tie_word_embeddings", lambda v: not v, hint="DbrxConfig refuses tied embeddings")
    act = f.raw("ffn_act_fn")
    if act is not None and (not isinstance(act, dict) or act.get("name", "silu") != "silu"):
        raise f.unsupported("ffn_act_fn", act, hint="DBRX's experts are SwiGLU: {\"name\": \"silu\"}")
    rope = _whole_head(cfg, _rope(cfg, d // heads))
    theta = a.raw("rope_theta")
    if theta is not None and theta != rope.base:
        raise a.unsupported("rope_theta", theta, hint=f"transformers' DBRX rotates with the top-level "
                                                      f"rope_theta ({rope.base:g}), DBRX's own code with this; irc "
                                                      "refuses to guess")
    p = f.raw("moe_normalize_expert_weights")
    if p is not None and p != 1:
        raise f.unsupported("moe_normalize_expert_weights", p,
                            hint="irc's MoE renormalises by the sum (p = 1) or not at all (null)")
    experts = f.get("moe_num_experts", positive_int)
    top_k = f.get("moe_top_k", positive_int)
    if top_k > experts:
        raise f.error("moe_top_k", f"top_k {top_k} exceeds {experts} experts (moe_num_experts)")
    moe = {"experts": experts, "top_k": top_k, "d_ff": f.get("ffn_hidden_size", positive_int),
           "norm_topk_prob": p is not None}
    attention = Attention("gqa", heads, kv_heads, d // heads, clip_qkv=a.get("clip_qkv", positive_number, None))
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=1e-5, attention=attention, layers=[LayerSpec(None, rope, True)] * n,
                mlp=None, moe=moe, tied=False, checkpoint="dbrx")
    arch.expand = partial(_expand, rms=False, parallel=False)
    return arch


def _expand(arch: Arch, origin: str, rms: bool, parallel: bool, moe_scale=None):
    """The decoder through the DSL, norms without bias (RMS or LayerNorm): Cohere's parallel
    x + attn(h) + ffn(h), or the sequential x + attn(norm(x)), then + ffn(norm(x)); a MoE's
    output times ``moe_scale`` where set (Cohere2-MoE's averaged shared experts)."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps = arch.attention, arch.norm_eps

    def norm(owner, x, name):
        return owner.rms_norm(x, name, eps) if rms else owner.layer_norm(x, name, eps, bias=False)

    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            h = norm(layer, x, "attn_norm")
            y = layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=dsl_rope(spec.rope),
                                window=spec.window, clip_qkv=a.clip_qkv)
            if not parallel:
                x = x + y
                h = norm(layer, x, "mlp_norm")
            ffn = layer.moe(h, **arch.moe) if spec.moe else layer.swiglu(h, d_ff=arch.mlp["d_ff"])
            ffn = ffn * moe_scale if spec.moe and moe_scale is not None else ffn
            x = x + (m.add(y, ffn, f"{layer.prefix}branches") if parallel else ffn)
        m.logits(norm(m, x, "norm"), tied=arch.tied, scale=arch.logits_scale)
    return m.graph


# ---- checkpoint names -------------------------------------------------------------------

class DbrxExperts(Tensor):
    """One projection of DBRX's experts, stored [E·F, d]: ``w1`` (gate) and ``v1`` (up) as
    irc's [E, F, d]; ``w2``, whose per-expert [F, d] block multiplies as x @ w2, transposed to
    [E, d, F]."""

    def __init__(self, name: str, experts: int, d_ff: int, down: bool):
        super().__init__(name)
        self.experts, self.d_ff, self.down = experts, d_ff, down

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        stored = list(checkpoint.info(self.name)[1])
        if len(stored) != 2 or stored[0] != self.experts * self.d_ff:
            raise SpecError(f"tensor {self.name} {stored} is not [{self.experts * self.d_ff}, d] ({self.experts} "
                            f"experts of ffn_hidden_size {self.d_ff})", location=checkpoint.file(self.name))
        e, f, d = self.experts, self.d_ff, stored[1]
        return [e, d, f] if self.down else [e, f, d]

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        data = checkpoint.read(self.name, start * self.d_ff, stop * self.d_ff).reshape(stop - start, self.d_ff, -1)
        return np.ascontiguousarray(data.transpose(0, 2, 1) if self.down else data)

    def __repr__(self) -> str:
        return f"{self.name}[experts{', transposed' if self.down else ''}]"


def _dbrx_experts(stored: str, down: bool = False):
    def source(arch: Arch, prefix: str) -> DbrxExperts:
        return DbrxExperts(f"{prefix}ffn.experts.mlp.{stored}", arch.moe["experts"], arch.moe["d_ff"], down)
    return source


def _dbrx_qkv(part: int):
    """Rows of q (0), k (1) or v (2) in ``Wqkv`` [(H + 2K)·D, d]: q | k | v."""
    def source(arch: Arch, prefix: str) -> Rows:
        at = arch.attention
        bounds = [0, at.heads * at.head_dim, (at.heads + at.kv_heads) * at.head_dim,
                  (at.heads + 2 * at.kv_heads) * at.head_dim]
        return Rows(f"{prefix}norm_attn_norm.attn.Wqkv.weight", bounds[part], bounds[part + 1])
    return source


FAMILIES = {"cohere_compass_text": _compass, "cohere2_moe": _cohere2_moe, "dbrx": _dbrx}
LAYOUTS = {
    "cohere2_moe": {"_resolve": _fused_experts},
    "dbrx": {"attn_norm": "norm_attn_norm.norm_1.weight", "mlp_norm": "norm_attn_norm.norm_2.weight",
             **{f"attn.w{x}": _dbrx_qkv(i) for i, x in enumerate("qkv")},
             "attn.wo": "norm_attn_norm.attn.out_proj.weight", "moe.router": "ffn.router.layer.weight",
             "moe.w_gate": _dbrx_experts("w1"), "moe.w_up": _dbrx_experts("v1"),
             "moe.w_down": _dbrx_experts("w2", down=True), "_prefix": "transformer.blocks.",
             "_top": {"embed": "transformer.wte.weight", "norm": "transformer.norm_f.weight",
                      "lm_head": "lm_head.weight"}},
}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
