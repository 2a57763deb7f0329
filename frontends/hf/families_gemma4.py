"""Gemma-4's text decoder (``model_type`` gemma4_text, ``Gemma4ForCausalLM``; and the text
model of the multimodal ``gemma4``, ``text_config``, weights under ``model.language_model.``,
the vision and audio towers left aside), built by its own loop through the DSL
(``Arch.expand``, pieces in ``frontends.dsl_gemma4`` and ``frontends.dsl_gemma_shared``);
``frontends.hf.families`` registers it.
``gemma4_unified_text`` (and the multimodal ``gemma4_unified``) is the same decoder without
per-layer embeddings and MoE (transformers' ``Gemma4UnifiedTextConfig`` has neither).

What it has beyond Gemma 3 (transformers 5.24's ``modeling_gemma4``):

- every RMS norm has a plain weight (x · w, not Gemma's (1 + w)); attention scale 1 (no
  ``query_pre_attn_scalar``), no attention soft-cap; an RMS norm without weight on v;
- per-layer attention shapes: full layers use ``global_head_dim`` (default 512) and, with
  ``attention_k_eq_v``, ``num_global_key_value_heads`` — or, as transformers 5.24 saves
  them, ``per_layer_config`` ({layer: {head_dim, num_key_value_heads}}; it then ignores the
  two global keys, and so does irc); with ``attention_k_eq_v`` full layers have no v
  projection: the values are the key projection, v-normed;
- RoPE per layer type (``rope_parameters``: sliding default base 1e4; full
  ``proportional``, ``partial_rotary_factor`` 0.25, base 1e6): proportional RoPE rotates
  pairs (j, j + D/2) of the whole head with frequencies base^(-2j/D) for
  j < int(p·D // 2) and leaves the rest (``irc.ops.rope``);
- KV sharing: the last ``num_kv_shared_layers`` layers compute no keys or values and
  attend over those of the last earlier layer of their type (that layer's cache; they
  have none); ``use_double_wide_mlp`` doubles their MLP width;
- per-layer embeddings (``hidden_size_per_layer_input`` P, default 256; 0 turns them off;
  table ``vocab_size_per_layer_input``): a per-layer input for every layer
  (``frontends.dsl_gemma_shared``), joined after the MLP block;
- ``layer_scalar``: each layer's output times a learned scalar (a checkpoint buffer).

The layer: x + post_attn_norm(attention(attn_norm(x))), then x + post_mlp_norm(geglu(
mlp_norm(x))), then the PLE block, then times layer_scalar; logits from norm(x), tied by
default, soft-capped by ``final_logit_softcapping`` (default none). Embeddings times
sqrt(hidden_size). ``layer_types`` defaults to five sliding layers to one full; as
transformers does, the last layer is made full whatever the list says.

With ``enable_moe_block`` (26B-A4B) every layer has a MoE beside its MLP: the router
(softmax over ``num_experts``, top ``top_k_experts``, renormalised, times a per-expert scale)
reads RMS-normed x times a learned scale and d^-0.5, the GeGLU experts
(``moe_intermediate_size``) pre_feedforward_layernorm_2(x); the two branches, each normed
(post_feedforward_layernorm_1 / _2), add before post_feedforward_layernorm. irc's ``moe``
op reads one input, the weightless norm of x: the router scale, the norm weight and the
per-expert scale fold into the router, gate/up and down weights as they are read
(``Folded``; in float32, then rounded once to the checkpoint's dtype: exact for float32
checkpoints, one more rounding of those weights for bfloat16 ones).

Refused, naming config.json and the key: ``use_bidirectional_attention: "all"`` (irc builds
causal decoders; "vision" is causal for text), ``attention_bias``, an activation other than
GELU, a RoPE type other than default / proportional (or a ``partial_rotary_factor`` on a
default one, which transformers ignores), layer types transformers cannot share a cache
between (``num_kv_shared_layers``), ``per_layer_config`` entries other than head_dim /
num_key_value_heads or differing within a layer type, ``layer_types`` of the wrong length
or kind, a MoE without its sizes or with ``top_k_experts`` above ``num_experts``. A
checkpoint's k/v projections and k norms of KV-shared layers are set aside, as transformers
sets them aside.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from frontends.hf.config import Arch, Attention, Config, LayerSpec, RopeSpec, _show, dsl_rope
from frontends.hf.families_common import FULL, SLIDING, _layer_types
from frontends.hf.families_gemma_shared import TOWERS, gelu_approximate, kv_sources, text_model
from frontends.hf.weights import Checkpoint, Tensor
from irc.errors import SpecError
from irc.yamlloc import Bad, boolean, layer_count, non_negative_int, positive_int, positive_number, size

TEXT = "gemma4_text"
DEFAULTS = {  # transformers 5.24's Gemma4TextConfig
    TEXT: {"vocab_size": 262144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
           "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "global_head_dim": 512,
           "num_global_key_value_heads": None, "hidden_activation": "gelu_pytorch_tanh",
           "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
           "attention_bias": False, "sliding_window": 512, "final_logit_softcapping": None,
           "use_bidirectional_attention": None, "vocab_size_per_layer_input": 262144,
           "hidden_size_per_layer_input": 256, "attention_k_eq_v": False, "num_kv_shared_layers": 0,
           "enable_moe_block": False, "use_double_wide_mlp": False, "num_experts": None, "top_k_experts": None,
           "moe_intermediate_size": None},
    "gemma4": {"tie_word_embeddings": True},
    "gemma4_unified": {"tie_word_embeddings": True},
}
UNIFIED = "gemma4_unified_text"  # Gemma4UnifiedTextConfig: the same decoder, no PLE and no MoE
DEFAULTS[UNIFIED] = {**{k: v for k, v in DEFAULTS[TEXT].items() if k not in (
    "vocab_size_per_layer_input", "hidden_size_per_layer_input", "enable_moe_block", "num_experts", "top_k_experts",
    "moe_intermediate_size")}, "max_position_embeddings": 262144, "sliding_window": 1024,
    "use_bidirectional_attention": "vision"}
MULTIMODAL = {"gemma4": TEXT, "gemma4_unified": UNIFIED}  # -> the text model inside
ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
        FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}
ROPE_KEYS = ("rope_type", "rope_theta", "factor", "partial_rotary_factor")


@dataclass
class Gemma4Layer:
    """One layer as Gemma-4 builds it: its type, attention shape, the layer whose cache it
    shares (None: its own), its MLP width, window and RoPE."""
    kind: str
    kv_heads: int
    head_dim: int
    k_eq_v: bool
    shares: Optional[int]
    d_ff: int
    window: Optional[int]
    rope: RopeSpec


@dataclass
class Gemma4Arch(Arch):
    """``Arch`` plus the per-layer shapes and the per-layer-embedding sizes (width 0: none)."""
    gemma4_layers: list = field(default_factory=list)
    ple_width: int = 0
    ple_vocab: int = 0
    approximate: str = "tanh"


def _gemma4(cfg: Config, name: str, model_type: str) -> Arch:
    outer, checkpoint = cfg, "gemma4"
    if model_type in MULTIMODAL:
        text = MULTIMODAL[model_type]
        cfg = text_model(outer, model_type, DEFAULTS[text], text, "Gemma-4")
        model_type, checkpoint = text, "gemma4_multimodal"
    cfg.check("attention_bias", lambda v: not v, hint="Gemma-4's projections have no bias")
    cfg.check("use_bidirectional_attention", lambda v: v in (None, "vision"),
              hint="irc builds causal decoders (\"vision\" is causal for text tokens)")
    approximate = gelu_approximate(cfg, "Gemma-4")
    d = cfg.get("hidden_size", size)
    heads = cfg.get("num_attention_heads", size)
    n = cfg.get("num_hidden_layers", layer_count)
    types = _layer_types(cfg, n, lambda i: SLIDING if (i + 1) % 6 else FULL)
    types = types[:-1] + [FULL]  # transformers forces the last layer full
    shapes = _shapes(cfg, types, heads)
    ropes = {kind: _rope(cfg, kind, shapes[kind][1]) for kind in sorted(set(types))}
    shares = kv_sources(cfg, types)
    d_ff = cfg.get("intermediate_size", positive_int)
    wide = cfg.get("use_double_wide_mlp", boolean)
    k_eq_v = cfg.get("attention_k_eq_v", boolean)
    window = cfg.get("sliding_window", positive_int) if SLIDING in types else None
    layers = [Gemma4Layer(kind, shapes[kind][0], shapes[kind][1], k_eq_v and kind == FULL, source,
                          d_ff * (2 if wide and source is not None else 1), window if kind == SLIDING else None,
                          ropes[kind]) for kind, source in zip(types, shares)]
    plain = model_type == UNIFIED  # no per-layer embeddings, no MoE: their keys are not read
    width = 0 if plain else cfg.get("hidden_size_per_layer_input", non_negative_int) or 0
    first = layers[0]
    moe = None if plain else _moe(cfg, approximate)
    return Gemma4Arch(
        name=name, model_type=model_type, dtype=outer.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
        d_model=d, n_layers=n, norm_eps=cfg.get("rms_norm_eps", positive_number),
        attention=Attention("gqa", heads, first.kv_heads, first.head_dim, qk_norm=True, scale=1.0),
        layers=[LayerSpec(g.window, g.rope, moe is not None) for g in layers], moe=moe,
        mlp={"kind": "geglu", "d_ff": d_ff, "approximate": approximate}, sandwich=True,
        tied=outer.get("tie_word_embeddings", boolean),
        final_softcap=cfg.get("final_logit_softcapping", positive_number, None), embedding_scale=d ** 0.5,
        checkpoint=checkpoint, expand=decoder, gemma4_layers=layers, ple_width=width,
        ple_vocab=cfg.get("vocab_size_per_layer_input", positive_int) if width else 0, approximate=approximate)


def _moe(cfg: Config, approximate: str) -> Optional[dict]:
    """``Layer.moe``'s arguments where ``enable_moe_block`` (every layer then has the MoE
    beside its MLP), else None."""
    if not cfg.get("enable_moe_block", boolean):
        return None
    sizes = {}
    for key in ("num_experts", "top_k_experts", "moe_intermediate_size"):
        sizes[key] = cfg.get(key, positive_int)
        if sizes[key] is None:  # transformers' default
            raise cfg.error(key, "missing: enable_moe_block needs it")
    experts, top_k = sizes["num_experts"], sizes["top_k_experts"]
    if top_k > experts:
        raise cfg.error("top_k_experts", f"top_k {top_k} exceeds {experts} experts (num_experts)")
    return {"experts": experts, "top_k": top_k, "d_ff": sizes["moe_intermediate_size"],
            "norm_topk_prob": True, "activation": "gelu_tanh" if approximate == "tanh" else "gelu"}


def _shapes(cfg: Config, types: list, heads: int) -> dict:
    """layer type -> (kv heads, head dim): the global keys, or ``per_layer_config``; one
    shape per type (transformers builds each type's RoPE from one of its layers)."""
    kv_heads, head_dim = cfg.get("num_key_value_heads", size), cfg.get("head_dim", size)
    per_layer = cfg.data.get("per_layer_config")
    if per_layer is None:
        full_kv = cfg.get("num_global_key_value_heads", size, None) if cfg.get("attention_k_eq_v", boolean) else None
        overrides = {i: {"head_dim": cfg.get("global_head_dim", size), **({"num_key_value_heads": full_kv}
                                                                        if full_kv else {})}
                     for i, kind in enumerate(types) if kind == FULL}
    else:
        overrides = _per_layer_config(cfg, per_layer, len(types))
    shapes: dict = {}
    for i, kind in enumerate(types):
        override = overrides.get(i, {})
        shape = (override.get("num_key_value_heads", kv_heads), override.get("head_dim", head_dim))
        if shapes.setdefault(kind, shape) != shape:
            raise cfg.error("per_layer_config", f"layer {i} ({kind}) has {shape[0]} kv heads of {shape[1]} dims, "
                                                f"another {kind} layer {shapes[kind][0]} of {shapes[kind][1]}",
                            hint="transformers' Gemma-4 needs one attention shape per layer type")
        if heads % shape[0]:
            key = "num_key_value_heads" if "num_key_value_heads" not in override else \
                "per_layer_config" if per_layer is not None else "num_global_key_value_heads"
            raise cfg.error(key, f"{heads} heads are not divisible by {shape[0]} kv heads (layer {i})")
    return shapes


def _per_layer_config(cfg: Config, per_layer, n: int) -> dict:
    if not isinstance(per_layer, dict):
        raise cfg.error("per_layer_config", f"expected an object, got {_show(per_layer)}")
    overrides = {}
    for key, entry in per_layer.items():
        where = f"per_layer_config.{key}"
        if not key.isdigit() or int(key) >= n:
            raise cfg.error(where, f"expected a layer index below {n} (num_hidden_layers)")
        if not isinstance(entry, dict):
            raise cfg.error(where, f"expected an object, got {_show(entry)}")
        for attr, value in entry.items():
            if attr not in ("head_dim", "num_key_value_heads"):
                raise cfg.error(f"{where}.{attr}", "is not supported",
                                hint="irc reads head_dim and num_key_value_heads per layer")
            try:
                entry = {**entry, attr: size(value)}
            except Bad as err:
                raise cfg.error(f"{where}.{attr}", str(err)) from None
        overrides[int(key)] = entry
    return overrides


def _rope(cfg: Config, kind: str, head_dim: int) -> RopeSpec:
    """A layer type's RoPE from ``rope_parameters.<type>`` (transformers' defaults when the
    config gives none)."""
    params = cfg.data.get("rope_parameters")
    if params is None:
        params = ROPE
    if not isinstance(params, dict) or not isinstance(params.get(kind), dict):
        raise cfg.error(f"rope_parameters.{kind}" if isinstance(params, dict) else "rope_parameters",
                        "missing: Gemma-4 gives RoPE per layer type (an object under each type)")
    key, params = f"rope_parameters.{kind}", params[kind]
    for name in params:
        if name not in ROPE_KEYS:
            raise cfg.error(f"{key}.{name}", "unknown RoPE setting", hint=f"irc reads {', '.join(ROPE_KEYS)}")
    rope_type = params.get("rope_type", "default")
    if rope_type not in ("default", "proportional"):
        raise cfg.unsupported(f"{key}.rope_type", rope_type, hint="Gemma-4 RoPE types irc implements: default, "
                                                                  "proportional")
    values = {}
    for name, default in (("rope_theta", 10000.0), ("factor", 1.0), ("partial_rotary_factor", 1.0)):
        try:
            values[name] = positive_number(params.get(name, default))
        except Bad as err:
            raise cfg.error(f"{key}.{name}", str(err)) from None
    if values["partial_rotary_factor"] > 1:
        raise cfg.error(f"{key}.partial_rotary_factor", f"expected a number in (0, 1], got "
                                                        f"{_show(params['partial_rotary_factor'])}")
    if rope_type == "default":
        for name in ("factor", "partial_rotary_factor"):
            if name in params and values[name] != 1.0:
                raise cfg.unsupported(f"{key}.{name}", params[name], hint="transformers' Gemma-4 ignores it for "
                                                                          "rope_type default; irc refuses to guess")
        return RopeSpec(values["rope_theta"], "half")
    return RopeSpec(values["rope_theta"], "half", {"kind": "proportional", "factor": values["factor"],
                                                   "partial_rotary_factor": values["partial_rotary_factor"]})


def decoder(arch: Gemma4Arch, origin: str):
    """The decoder (module docstring) through the DSL."""
    from frontends import dsl_gemma4
    from frontends.dsl import Model
    from frontends.dsl_gemma_shared import KVSharing, attention, per_layer_inputs, plain_rms_norm

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps, a = arch.norm_eps, arch.attention
    sharing = KVSharing([spec.shares for spec in arch.gemma4_layers])
    with m.at(origin):
        ids = m.input_ids()
        x = m.embed(ids, scale=arch.embedding_scale)
        ple = None
        if arch.ple_width:
            ple = per_layer_inputs(m, ids, x, arch.n_layers, arch.ple_width, arch.ple_vocab, eps)
        for layer, spec in zip(m.layers(arch.n_layers), arch.gemma4_layers):
            rope = dsl_rope(spec.rope)
            h = attention(layer, layer.rms_norm(x, "attn_norm", eps), a.heads, spec.kv_heads, spec.head_dim, rope,
                          spec.window, eps, sharing, k_eq_v=spec.k_eq_v)
            x = x + layer.rms_norm(h, "post_attn_norm", eps)
            h = layer.geglu(layer.rms_norm(x, "mlp_norm", eps), d_ff=spec.d_ff, approximate=arch.approximate)
            if arch.moe is not None:  # beside the MLP, on the residual (norm weights folded: MOE_FOLDS)
                routed = layer.moe(plain_rms_norm(m, x, f"{layer.prefix}moe_norm", eps), **arch.moe)
                h = m.add(layer.rms_norm(h, "post_mlp_norm_1", eps), layer.rms_norm(routed, "post_moe_norm", eps),
                          f"{layer.prefix}ffn_sum")
            x = x + layer.rms_norm(h, "post_mlp_norm", eps)
            if ple is not None:
                x = dsl_gemma4.per_layer_block(layer, x, ple, arch.ple_width, eps, arch.approximate)
            x = dsl_gemma4.layer_scalar(layer, x)
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied, softcap=arch.final_softcap)
    return m.graph


FAMILIES = {model_type: _gemma4 for model_type in DEFAULTS}


class Folded(Tensor):
    """A stored tensor as irc's param, times factors folded into it: ``half`` 0 or 1 takes
    the first or second half of axis 1 (gate or up of a fused [E, 2F, d] ``gate_up_proj``),
    ``columns`` a [in] tensor scaling the last axis, ``experts`` an [E] tensor scaling each
    expert's block, ``constant`` a number; the product in float32."""

    def __init__(self, name: str, half: Optional[int] = None, columns: Optional[str] = None,
                 experts: Optional[str] = None, constant: float = 1.0):
        super().__init__(name)
        self.half, self.columns, self.experts, self.constant = half, columns, experts, constant

    def names(self) -> list[str]:
        return [self.name] + [n for n in (self.columns, self.experts) if n is not None]

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        stored = list(checkpoint.info(self.name)[1])
        if self.half is not None and (len(stored) != 3 or stored[1] % 2):
            raise SpecError(f"tensor {self.name} {stored} is not an [E, 2F, d] expert tensor",
                            location=checkpoint.file(self.name))
        for factor, size_ in ((self.columns, stored[-1]), (self.experts, stored[0])):
            if factor is not None and list(checkpoint.info(factor)[1]) != [size_]:
                raise SpecError(f"tensor {factor} {checkpoint.info(factor)[1]} does not scale {self.name} "
                                f"{stored}", location=checkpoint.file(factor))
        return stored[:1] + [stored[1] // 2] + stored[2:] if self.half is not None else stored

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        shape = self.shape(checkpoint)
        data = checkpoint.read(self.name, start, stop).astype(np.float32)
        if self.half is not None:
            data = data[:, self.half * shape[1]:(self.half + 1) * shape[1]]
        if self.columns is not None:
            data = data * checkpoint.read(self.columns).astype(np.float32)
        if self.experts is not None:
            scale = checkpoint.read(self.experts, start, stop).astype(np.float32)
            data = data * scale.reshape((-1,) + (1,) * (data.ndim - 1))
        return np.ascontiguousarray(data * np.float32(self.constant))

    def __repr__(self) -> str:
        parts = [{None: "", 0: "gate half", 1: "up half"}[self.half]] + [
            f"x {n}" for n in (self.columns, self.experts) if n is not None]
        return f"{self.name}[{', '.join(p for p in parts if p)}]"


def _router(arch: Arch, prefix: str) -> Folded:
    return Folded(prefix + "router.proj.weight", columns=prefix + "router.scale", constant=arch.d_model ** -0.5)


def _gate(arch: Arch, prefix: str) -> Folded:
    return Folded(prefix + "experts.gate_up_proj", 0, columns=prefix + "pre_feedforward_layernorm_2.weight")


def _up(arch: Arch, prefix: str) -> Folded:
    return Folded(prefix + "experts.gate_up_proj", 1, columns=prefix + "pre_feedforward_layernorm_2.weight")


def _down(arch: Arch, prefix: str) -> Folded:
    return Folded(prefix + "experts.down_proj", experts=prefix + "router.per_expert_scale")


# Gemma-4's MoE as irc's ``moe`` op: the router reads norm(x) · scale · d^-0.5 and the
# experts pre_feedforward_layernorm_2(x) = norm(x) · w, then each expert's output is scaled by
# per_expert_scale; with ``norm`` the RMS norm without weight, the factors fold into the
# weights (router columns, gate/up columns, down blocks) and both read norm(x)
MOE_FOLDS = {"moe.router": _router, "moe.w_gate": _gate, "moe.w_up": _up, "moe.w_down": _down,
             "post_mlp_norm_1": "post_feedforward_layernorm_1.weight",
             "post_moe_norm": "post_feedforward_layernorm_2.weight"}


def _layout() -> dict:
    return {"mlp_norm": "pre_feedforward_layernorm.weight", "post_attn_norm": "post_attention_layernorm.weight",
            "post_mlp_norm": "post_feedforward_layernorm.weight", "ple_gate": "per_layer_input_gate.weight",
            "ple_proj": "per_layer_projection.weight", "ple_norm": "post_per_layer_input_norm.weight",
            "layer_scalar": "layer_scalar", **MOE_FOLDS,
            # a KV-shared layer's own k/v weights, which transformers does not load either
            "_spare_suffixes": tuple(f"self_attn.{x}.weight" for x in ("k_proj", "v_proj", "k_norm"))}


def _top(prefix: str) -> dict:
    return {"embed": f"{prefix}embed_tokens.weight", "norm": f"{prefix}norm.weight", "lm_head": "lm_head.weight",
            "embed_per_layer": f"{prefix}embed_tokens_per_layer.weight",
            "per_layer_projection": f"{prefix}per_layer_model_projection.weight",
            "per_layer_projection_norm": f"{prefix}per_layer_projection_norm.weight"}


LAYOUTS = {"gemma4": {**_layout(), "_top": _top("model.")},
           "gemma4_multimodal": {**_layout(), "_top": _top("model.language_model."),
                                 "_prefix": "model.language_model.layers.",
                                 "_spare": TOWERS}}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
