"""Hybrid decoders of 2026 that recombine mixers irc has (``frontends.hf.families`` registers them).

=================  ==========================================================================
olmo_hybrid        OLMo-Hybrid: by ``layer_types`` ("linear_attention" | "full_attention";
                   default every fourth layer attention, the last one where none would be)
                   a pre-norm gated DeltaNet layer (``olmo_delta``: separate q / k / v / a / b
                   / g projections, a bias-free causal conv + SiLU over q | k | v, β =
                   2·sigmoid(b) where ``linear_allow_neg_eigval`` (default), the gated RMS norm
                   norm(o)·w·silu(g) per value head with eps 1e-5 whatever the config says)
                   then a SwiGLU MLP, or OLMo-3's post-norm attention layer (q and k RMS-normed
                   over their full width, RoPE, x + norm(attention(x)), x + norm(mlp(x))).
                   ``rope_parameters.rope_theta`` null: no RoPE (NoPE), as transformers does
lfm3               LFM3: by ``layer_types`` ("conv" | "full_attention" | "sliding_attention";
                   default Lfm3Config's pattern) LFM2's gated short conv or Qwen-3 attention
                   (per-head q/k norms) whose heads are each scaled by sigmoid(``g_proj`` · x)
                   (``use_attention_gate``), RoPE per attention type
                   (``rope_parameters.<type>``: default, or Gemma-4's proportional RoPE), a
                   window on the sliding layers; then a SwiGLU (w1, w3, w2); with
                   ``use_sandwich_norm`` each branch's output RMS-normed before its residual
                   add; the final norm ``embedding_norm``
=================  ==========================================================================

β = 2·sigmoid(b) is the op's rule ``S = S' + β'·k'(v' − S'ᵀk')`` with β' = sigmoid(b),
k' = √2·k̂ and v' = √2·v: the state it keeps and every output are those of the doubled write
strength. k̂ = l2norm(k) is then made in the graph (an RMS norm per key head without weight
and eps 1e-6 / d_k, divided by √d_k: x / sqrt(Σx² + 1e-6)), q̂ the same, and the op runs with
``l2_norm`` false and scale d_k^-0.5 on the normalised q.

Every RMS norm is plain w·x (OLMo's, LFM's). Checkpoints are read in the names transformers
saves (OLMo-Hybrid's OLMo-core names: ``attention_layer_norm``, ``feedforward_layer_norm``,
the q / k / v ``*_conv1d`` joined; LFM3's ``gate_proj``) or its module names. Refused, naming
config.json and the key: a ``layer_types`` entry other than the family's kinds (or of another
length), value heads that are not a multiple of key heads, ``attention_bias``, an activation
other than SiLU (OLMo-Hybrid), a RoPE type other than default / proportional (LFM3).

LFM3 with ``conv_bias`` pads as LFM2 does (``families_lfm2``): transformers zeroes a padded
token before in_proj, irc at the convolution's input, so a left-padded row differs from
transformers' padded row (not from the row run alone) where in_proj has a bias.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Optional

from frontends.hf.config import (Arch, Attention, Config, LayerSpec, RopeSpec, attention_dims, dsl_rope,
                                 layer_types, read_rope, rope_dict)
from frontends.hf.families_kimi import Joined
from frontends.hf.weights import Source, Tensor
from irc.yamlloc import Bad, boolean, layer_count, positive_int, positive_number

DELTA, ATTENTION = "linear_attention", "full_attention"
DEFAULTS = {  # transformers 5.25's config classes
    "olmo_hybrid": {"vocab_size": 100352, "hidden_size": 3840, "intermediate_size": 11008, "num_hidden_layers": 32,
                    "num_attention_heads": 30, "max_position_embeddings": 65536, "rms_norm_eps": 1e-6,
                    "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
                    "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": True},
    "lfm3": {"vocab_size": 128000, "hidden_size": 2048, "intermediate_size": 7680, "num_hidden_layers": 24,
             "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 128000,
             "norm_eps": 1e-5, "tie_word_embeddings": True, "conv_bias": False, "conv_L_cache": 7,
             "sliding_window": 256, "use_sandwich_norm": True, "use_attention_gate": True, "attention_bias": False},
}
OLMO_DELTA_EPS = 1e-5  # OlmoHybridGatedDeltaNet's o_norm: FLA's FusedRMSNormGated default


def _olmo_kinds(cfg: Config, n: int) -> list[str]:
    """``layer_types`` checked, else every fourth layer attention (the last where none is)."""
    if cfg.has("layer_types"):
        return layer_types(cfg, n, (DELTA, ATTENTION))
    kinds = [ATTENTION if i % 4 == 3 else DELTA for i in range(n)]
    if ATTENTION not in kinds:
        kinds[-1] = ATTENTION
    return kinds


def _olmo_delta_config(cfg: Config, d: int, heads: int) -> dict:
    """``olmo_delta``'s arguments, with OlmoHybridConfig's derived defaults (key and value heads:
    the attention heads; d_k = int(0.75·hidden / key heads), d_v = 2·d_k)."""
    key_heads = cfg.get("linear_num_key_heads", positive_int, heads)
    value_heads = cfg.get("linear_num_value_heads", positive_int, heads)
    if value_heads % key_heads:
        raise cfg.error("linear_num_value_heads", f"{value_heads} value heads are not a multiple of {key_heads} key "
                                                  "heads (linear_num_key_heads)")
    key_dim = cfg.get("linear_key_head_dim", positive_int, None) or int(0.75 * d / key_heads)
    if key_dim < 1:
        raise cfg.error("linear_key_head_dim", f"derives as {key_dim} from hidden_size {d}", hint="give it")
    return {"key_heads": key_heads, "value_heads": value_heads, "key_dim": key_dim,
            "value_dim": cfg.get("linear_value_head_dim", positive_int, None) or 2 * key_dim,
            "conv_kernel": cfg.get("linear_conv_kernel_dim", positive_int),
            "double_beta": cfg.get("linear_allow_neg_eigval", boolean)}


def _olmo_hybrid(cfg: Config, name: str, model_type: str) -> Arch:
    cfg.check("hidden_act", lambda v: v == "silu", hint="OLMo-Hybrid's MLP and convolution use SiLU")
    cfg.check("attention_bias", lambda v: not v, hint="irc's OLMo-Hybrid attention has no bias")
    d, heads, kv_heads, head_dim = attention_dims(cfg)
    n = cfg.get("num_hidden_layers", layer_count)
    kinds = _olmo_kinds(cfg, n)
    params, key = rope_dict(cfg)
    nope = "rope_theta" in params and params["rope_theta"] is None
    rope = None if nope else read_rope(cfg, head_dim, params, key)
    layers = [LayerSpec(None, rope, mixer="attention" if kind == ATTENTION else "gated_delta") for kind in kinds]
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=Attention("gqa", heads, kv_heads, head_dim, qk_norm=True), layers=layers,
                mlp={"kind": "swiglu", "d_ff": cfg.get("intermediate_size", positive_int)},
                tied=cfg.get("tie_word_embeddings", boolean), checkpoint=model_type,
                ssm={"kind": "gated_delta", **_olmo_delta_config(cfg, d, heads)}, expand=_olmo_expand)


def _l2_scaled(layer, t, heads: int, width: int, factor: float, name: str):
    """Each head of ``t`` [B, T, heads·width] as factor · x / sqrt(Σx² + 1e-6)."""
    m, p = layer.model, layer.prefix
    lead = tuple(t.shape[:-1])
    split = m.emit("reshape", [t], {"shape": list(lead + (heads, width))}, f"{p}{name}_heads")[0]
    normed = m.plain_rms_norm(split, f"{p}{name}_l2", 1e-6 / width)
    scaled = m.scale(normed, factor / math.sqrt(width), f"{p}{name}_l2_scaled")
    return m.emit("reshape", [scaled], {"shape": list(lead + (heads * width,))}, f"{p}{name}_l2_flat")[0]


def olmo_delta(layer, x, key_heads: int, value_heads: int, key_dim: int, value_dim: int, conv_kernel: int,
               double_beta: bool):
    """OLMo-Hybrid's gated DeltaNet (weights ``layers.{i}.ssm.{q,k,v,a,b,g,o}_proj``, ``conv``
    [2·H_k·d_k + H_v·d_v, 1, K], ``A_log``, ``dt_bias`` [H_v], ``o_norm`` [d_v]); state as
    ``Layer.gated_delta``'s."""
    m, p, i = layer.model, layer.prefix, layer.index
    key_width, value_width = key_heads * key_dim, value_heads * value_dim
    q, k, v = (layer._linear(x, f"{n}_proj", w, False, f"ssm_{n}_in")
               for n, w in (("q", key_width), ("k", key_width), ("v", value_width)))
    qkv = layer._conv(m.emit("concat", [q, k, v], {"axis": -1}, f"{p}ssm_qkv")[0], 2 * key_width + value_width,
                      conv_kernel, False)
    q, k, v = layer._split(qkv, [key_width, key_width, value_width], ["ssm_q", "ssm_k", "ssm_v"])
    a = layer._linear(x, "a_proj", value_heads, False, "ssm_a")
    b = layer._linear(x, "b_proj", value_heads, False, "ssm_b")
    gain = math.sqrt(2.0) if double_beta else 1.0
    q = _l2_scaled(layer, q, key_heads, key_dim, 1.0, "ssm_q")
    k = _l2_scaled(layer, k, key_heads, key_dim, gain, "ssm_k")
    if double_beta:
        v = m.scale(v, gain, f"{p}ssm_v_scaled")
    A_log, dt_bias = (m.param(f"{p}ssm.{n}", (value_heads,)) for n in ("A_log", "dt_bias"))
    past = m._state(i, "recurrent_state", (value_heads, key_dim, value_dim))
    mask, _ = m._context()
    attrs = {"key_heads": key_heads, "value_heads": value_heads, "key_dim": key_dim, "value_dim": value_dim,
             "l2_norm": False}
    y, present = m.emit("gated_delta_rule", [q, k, v, a, b, A_log, dt_bias, past, mask], attrs,
                        [f"{p}ssm_y", f"present.{i}.recurrent_state"])
    m._presents.append(present.value)
    z = layer._linear(x, "g_proj", value_width, False, "ssm_z")
    norm = m.param(f"{p}ssm.o_norm", (value_dim,))
    heads_norm = m.emit("reshape", [m.emit("expand", [norm], {"shape": [value_heads, value_dim]},
                                           f"{p}ssm_norm_heads")[0]], {"shape": [value_width]},
                        f"{p}ssm_norm_weight")[0]
    y = m.emit("gated_rms_norm", [y, z, heads_norm], {"eps": OLMO_DELTA_EPS, "group_size": value_dim,
                                                      "norm_before_gate": True}, f"{p}ssm_normed")[0]
    layer._note_ssm("gated_delta", key_heads=key_heads, value_heads=value_heads, key_dim=key_dim,
                    value_dim=value_dim, conv_kernel=conv_kernel)
    return layer._linear(y, "o_proj", m._features(x), False, "ssm_out")


def _olmo_expand(arch: Arch, origin: str):
    """Delta layers: x + delta(input_layernorm(x)), x + mlp(post_attention_layernorm(x));
    attention layers: x + post_attention_layernorm(attn(x)), x + post_feedforward_layernorm(mlp(x))."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps, a = arch.norm_eps, arch.attention
    delta = {k: v for k, v in arch.ssm.items() if k != "kind"}
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            if spec.mixer == "attention":
                y = layer.attention(x, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=dsl_rope(spec.rope),
                                    qk_norm="full", qk_norm_eps=eps)
                x = x + layer.rms_norm(y, "post_attn_norm", eps)
                x = x + layer.rms_norm(layer.swiglu(x, d_ff=arch.mlp["d_ff"]), "post_mlp_norm", eps)
            else:
                x = x + olmo_delta(layer, layer.rms_norm(x, "ssm_norm", eps), **delta)
                x = x + layer.swiglu(layer.rms_norm(x, "mlp_norm", eps), d_ff=arch.mlp["d_ff"])
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


# ---- LFM3 ----------------------------------------------------------------------------------

CONV, FULL, SLIDING = "conv", "full_attention", "sliding_attention"
LFM3_ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
             FULL: {"rope_type": "proportional", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5}}


def _lfm3_kinds(cfg: Config, n: int) -> list[str]:
    """``layer_types`` checked, else Lfm3Config's: attention at i % 4 == 2, sliding attention
    at i % 4 == 0 past the first layer, the short conv elsewhere."""
    if cfg.has("layer_types"):
        return layer_types(cfg, n, (CONV, FULL, SLIDING), "LFM3's")
    return [FULL if i % 4 == 2 else SLIDING if i % 4 == 0 and i > 0 else CONV for i in range(n)]


def _lfm3_rope(cfg: Config, kind: str, head_dim: int) -> RopeSpec:
    """``rope_parameters.<kind>`` (Lfm3Config's when absent): default or proportional RoPE."""
    params = cfg.data.get("rope_parameters")
    params = LFM3_ROPE if params is None else params
    if not isinstance(params, dict) or not isinstance(params.get(kind), dict):
        raise cfg.error(f"rope_parameters.{kind}" if isinstance(params, dict) else "rope_parameters",
                        "missing: LFM3 gives RoPE per layer type (an object under each attention type)")
    key, params = f"rope_parameters.{kind}", params[kind]
    rope_type = params.get("rope_type", "default")
    if rope_type not in ("default", "proportional"):
        raise cfg.unsupported(f"{key}.rope_type", rope_type, hint="LFM3 RoPE types irc implements: default, "
                                                                  "proportional")
    values = {}
    for name, default in (("rope_theta", 10000.0), ("factor", 1.0), ("partial_rotary_factor", 1.0)):
        try:
            values[name] = positive_number(params.get(name, default))
        except Bad as err:
            raise cfg.error(f"{key}.{name}", str(err)) from None
    if rope_type == "default":
        for name in ("factor", "partial_rotary_factor"):
            if name in params and values[name] != 1.0:
                raise cfg.unsupported(f"{key}.{name}", params[name], hint="irc reads it for proportional RoPE only")
        return RopeSpec(values["rope_theta"], "half")
    if values["partial_rotary_factor"] > 1:
        raise cfg.error(f"{key}.partial_rotary_factor", "expected a number in (0, 1]")
    return RopeSpec(values["rope_theta"], "half", {"kind": "proportional", "factor": values["factor"],
                                                   "partial_rotary_factor": values["partial_rotary_factor"]})


def _lfm3(cfg: Config, name: str, model_type: str) -> Arch:
    cfg.check("attention_bias", lambda v: not v, hint="irc's LFM3 attention has no bias")
    d, heads, kv_heads, head_dim = attention_dims(cfg)
    n = cfg.get("num_hidden_layers", layer_count)
    kinds = _lfm3_kinds(cfg, n)
    ropes = {kind: _lfm3_rope(cfg, kind, head_dim) for kind in set(kinds) - {CONV}}
    window = cfg.get("sliding_window", positive_int) if SLIDING in kinds else None
    layers = [LayerSpec(None, None, mixer="short_conv") if kind == CONV else
              LayerSpec(window if kind == SLIDING else None, ropes[kind]) for kind in kinds]
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("norm_eps", positive_number),
                attention=Attention("gqa", heads, kv_heads, head_dim, qk_norm=True), layers=layers,
                mlp={"kind": "swiglu", "d_ff": cfg.get("intermediate_size", positive_int)},
                sandwich=cfg.get("use_sandwich_norm", boolean), tied=cfg.get("tie_word_embeddings", boolean),
                checkpoint=model_type, ssm={"kind": "short_conv", "conv_kernel": cfg.get("conv_L_cache", positive_int),
                                            "bias": cfg.get("conv_bias", boolean)},
                expand=partial(_lfm3_expand, cfg.get("use_attention_gate", boolean)))


def head_gated_attention(layer, x, heads: int, kv_heads: int, head_dim: int, rope, window, eps: float, gate: bool):
    """Qwen-3 attention (per-head q/k RMS norms, RoPE) whose output heads are each scaled by
    sigmoid of ``attn.wg`` [H, d] applied to x before ``attn.wo`` (LFM3's ``g_proj``)."""
    m, p, i = layer.model, layer.prefix, layer.index
    d = m._features(x)
    sizes = (heads, kv_heads, head_dim)
    q, k, v = (m.emit("linear", [x, m.param(f"{p}attn.w{n}", (rows, d))], None, f"{p}{n}")[0]
               for n, rows in (("q", heads * head_dim), ("k", kv_heads * head_dim), ("v", kv_heads * head_dim)))
    q, k = layer._qk_norms(q, k, "head", sizes, eps, 0.0)
    q, k = layer._rotate(q, k, rope, sizes)
    mask, _ = m._context()
    past_key, past_value = m._past(i, kv_heads, head_dim, head_dim)
    attrs = {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "v_head_dim": None, "causal": True,
             "window": window, "softcap": None, "scale": None}
    out, *presents = m.emit("attention", [q, k, v, mask, past_key, past_value], attrs,
                            [f"{p}attn", f"present.{i}.key", f"present.{i}.value"])
    m._presents += [present.value for present in presents]
    if gate:
        lead = tuple(out.shape[:-1])
        weights = m.emit("sigmoid", [m.emit("linear", [x, m.param(f"{p}attn.wg", (heads, d))], None,
                                            f"{p}head_gate_in")[0]], None, f"{p}head_gate")[0]
        weights = m.emit("reshape", [weights], {"shape": list(lead + (heads, 1))}, f"{p}head_gate_column")[0]
        split = m.emit("reshape", [out], {"shape": list(lead + (heads, head_dim))}, f"{p}attn_heads")[0]
        gated = m.emit("mul", [split, weights], None, f"{p}attn_heads_gated")[0]
        out = m.emit("reshape", [gated], {"shape": list(lead + (heads * head_dim,))}, f"{p}attn_gated")[0]
    layer._note_attention("mha" if kv_heads == heads else "mqa" if kv_heads == 1 else "gqa", heads, kv_heads,
                          head_dim, head_dim, window, None, None, rope, qkv_bias=False, qk_norm=True)
    return m.emit("linear", [out, m.param(f"{p}attn.wo", (d, heads * head_dim))], None, f"{p}attn_out")[0]


def _lfm3_expand(gate: bool, arch: Arch, origin: str):
    """x + post_operator_norm(mixer(operator_norm(x))), x + post_ffn_norm(mlp(ffn_norm(x)))
    (the post norms only with ``use_sandwich_norm``), the final norm ``embedding_norm``."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps, a, conv = arch.norm_eps, arch.attention, arch.ssm
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            if spec.mixer == "attention":
                y = head_gated_attention(layer, layer.rms_norm(x, "attn_norm", eps), a.heads, a.kv_heads, a.head_dim,
                                         dsl_rope(spec.rope), spec.window, eps, gate)
            else:
                y = layer.short_conv(layer.rms_norm(x, "ssm_norm", eps), conv_kernel=conv["conv_kernel"],
                                     bias=conv["bias"])
            x = x + (layer.rms_norm(y, "post_attn_norm", eps) if arch.sandwich else y)
            y = layer.swiglu(layer.rms_norm(x, "mlp_norm", eps), d_ff=arch.mlp["d_ff"])
            x = x + (layer.rms_norm(y, "post_mlp_norm", eps) if arch.sandwich else y)
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


# ---- the checkpoints -----------------------------------------------------------------------

FAMILIES = {"olmo_hybrid": _olmo_hybrid, "lfm3": _lfm3}


def _either(*names: str) -> list:
    return [lambda arch, p, n=n: Tensor(p + n) for n in names]


OLMO_CANDIDATES = {  # irc name under layers.{i}. -> what transformers would load: the saved (OLMo-core) name first
    "ssm_norm": _either("attention_layer_norm.weight", "input_layernorm.weight"),
    **{norm: _either("feedforward_layer_norm.weight", "post_attention_layernorm.weight")
       for norm in ("mlp_norm", "post_attn_norm")},
    "ssm.conv": [lambda arch, p: Joined([Tensor(f"{p}linear_attn.{x}_conv1d.weight") for x in "qkv"]),
                 lambda arch, p: Tensor(f"{p}linear_attn.conv1d.weight")],
}
LFM3_CANDIDATES = {"attn.wg": _either("self_attn.gate_proj.weight", "self_attn.g_proj.weight")}


def resolve(candidates: dict, arch: Arch, param: str, checkpoint) -> Optional[Source]:
    """The first of ``param``'s candidate sources the checkpoint holds whole (else the first,
    so the error names what is missing); None for a param with one name (``LAYOUTS``)."""
    layer, _, suffix = param.partition(".")[2].partition(".")
    if not param.startswith("layers.") or suffix not in candidates:
        return None
    sources = [make(arch, f"model.layers.{layer}.") for make in candidates[suffix]]
    return next((s for s in sources if all(n in checkpoint.files for n in s.names())), sources[0])


LAYOUTS = {
    "olmo_hybrid": {"post_mlp_norm": "post_feedforward_layernorm.weight",
                    **{f"ssm.{n}_proj": f"linear_attn.{n}_proj.weight" for n in "qkvabgo"},
                    "ssm.A_log": "linear_attn.A_log", "ssm.dt_bias": "linear_attn.dt_bias",
                    "ssm.o_norm": "linear_attn.o_norm.weight",
                    "_resolve": partial(resolve, OLMO_CANDIDATES)},
    "lfm3": {**{norm: "operator_norm.weight" for norm in ("attn_norm", "ssm_norm")}, "mlp_norm": "ffn_norm.weight",
             "post_attn_norm": "post_operator_norm.weight", "post_mlp_norm": "post_ffn_norm.weight",
             **{f"ssm.{n}": f"conv.{n}.weight" for n in ("in_proj", "out_proj")}, "ssm.conv": "conv.conv.weight",
             **{f"ssm.{n}_bias": f"conv.{n}.bias" for n in ("in_proj", "out_proj")}, "ssm.conv_bias": "conv.conv.bias",
             **{f"mlp.w_{x}": f"feed_forward.{w}.weight" for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))},
             "_resolve": partial(resolve, LFM3_CANDIDATES),
             "_top": {"embed": "model.embed_tokens.weight", "norm": "model.embedding_norm.weight",
                      "lm_head": "lm_head.weight"}},
}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS", "olmo_delta"]
