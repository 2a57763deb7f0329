"""Families whose layers are more than one mixer, each building its own graph (``Arch.expand``):

=================  ==========================================================================
falcon_h1          every layer: attention ‖ Mamba-2 on one normed input, their outputs summed
                   into the residual, then a SwiGLU MLP; µP multipliers everywhere
zamba2             Mamba-2 layers; at the "hybrid" layers first a shared transformer block
                   (attention + GeGLU MLP, ``num_mem_blocks`` sets of weights used in turn)
                   over concat(x, embeddings), with per-use LoRA adapters, mapped back by the
                   layer's own linear and added to the Mamba-2 layer's input
=================  ==========================================================================

How each maps onto irc's graph (``frontends.dsl_hybrid`` has the pieces):

Falcon-H1, layer i (key, value, conv and recurrent state all ``past_key_values.{i}.*``)::

    h = attn_norm(x)
    y = mamba2(h * ssm_in_multiplier) * ssm_out_multiplier    in_proj output * the µP vector
    a = attention(h * attention_in_multiplier) * attention_out_multiplier
    x = x + (y + a)
    g = mlp_norm(x);  x = x + down(up(g) * silu(gate(g) * mlp_multipliers[0])) * mlp_multipliers[1]
    x0 = embed(ids) * embedding_multiplier;  logits = lm_head(norm(x) * lm_head_multiplier)

Every multiplier is a ``mul`` by a ``constant`` (none where it is 1); the µP vector (z | x |
B | C | dt factors of ``ssm_multipliers``) is built from five scalar constants. Two are
attributes instead, both exact: ``embedding_multiplier`` is the embedding op's ``scale``,
and ``key_multiplier`` folds into the attention scale (q·(m k) s = q·k (m s)); irc's key
cache therefore holds k without the multiplier. ``lm_head_multiplier`` scales the head's
input rather than its output (``Model.logits(scale=)``; the head is linear). Without
``mamba_rms_norm`` the scan is gated by silu(z) alone; with it, the grouped gated RMS norm
(``mamba_norm_before_gate``).

Zamba2, a hybrid layer i, the j-th hybrid layer, block b = j % num_mem_blocks::

    s = shared_b(concat(x, e)),  e = embed(ids)   (attention, then MLP, no residual inside)
    x = x + mamba2(ssm_norm(x + linear_i(s)))

Block b's weights are params named under the first layer that uses it,
``layers.{hybrid_ids[b]}.shared.*`` (where save_pretrained keeps them), and every use reads
the same ``Param``; use j's adapters are ``layers.{hybrid_ids[b]}.shared.adapter.{j}.*``
(``linear_{q,k,v}_adapter_list.{j}`` and ``gate_up_proj_adapter_list.{j}``), each added to
its projection as up(down(h)) (``AdapterLayout`` names them). The shared attention's cache is the using layer's
(``past_key_values.{i}.key/.value``, beside its Mamba-2 states). Attention: q, k and v read
2·hidden_size features, head_dim = 2·hidden_size / heads, scale (head_dim / 2)^-1/2, RoPE
only with ``use_mem_rope``. The MLP's gate|up projection stays fused (one param, its output
sliced in halves).

transformers clamps Δ below at ``time_step_limit`` (Falcon-H1) / ``time_step_min`` (Zamba2)
in prefill only, not in its one-token step; irc clamps in both. Zamba2's convolution always
has a bias and its gated norm's eps is 1e-5, whatever ``use_conv_bias`` and
``rms_norm_eps`` say (as in transformers). Refused, naming the key and the value: Falcon-H1's
``attention_bias`` and ``mlp_bias``, a ``partial_rotary_factor``, activations other than
SiLU (Zamba2's MLP: gelu, gelu_pytorch_tanh, gelu_new or silu), Zamba2's RoPE types other
than default, adapters with fewer kv heads than heads, and a ``num_hidden_layers`` that
disagrees with ``layers_block_type`` (transformers follows the list). Untied Zamba2
(``tie_word_embeddings`` false) with a block used more than once is refused too:
transformers 5.24 ties the shared blocks only together with the embeddings, so untied
every hybrid layer keeps a copy of its own.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from typing import Optional

from frontends.dsl import Model
from frontends.dsl_hybrid import glu, low_rank, norm_with, scaled, scope, shared_attention
from frontends.hf.config import (Arch, Attention, Config, LayerSpec, RopeSpec, read_rope, rope_dict, string_list,
                                 time_step_limit, dsl_rope)
from frontends.hf.families_ssm import ssm_names
from irc.yamlloc import Bad, boolean, layer_count, number, positive_int, positive_number, size

HYBRID, MAMBA = "hybrid", "linear_attention"
INF = float("inf")
# Zamba2Config's layers_block_type when config.json has none (54 layers)
ZAMBA2_LAYERS = ([MAMBA] + ([MAMBA] * 5 + [HYBRID]) * 7 + [MAMBA] * 4 + [HYBRID] + [MAMBA] * 3 + [HYBRID]
                 + [MAMBA] * 2)
ZAMBA2_GATES = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "silu": "silu"}
ZAMBA2_NORM_EPS = 1e-5  # Zamba2RMSNormGated's, fixed in transformers

DEFAULTS = {  # transformers 5.24's config classes
    "falcon_h1": {
        "vocab_size": 128000, "tie_word_embeddings": False, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "mamba_d_ssm": 1024, "mamba_n_heads": 128,
        "mamba_d_head": "auto", "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2,
        "mamba_conv_bias": True, "mamba_proj_bias": False, "mamba_norm_before_gate": True,
        "mamba_rms_norm": False, "time_step_limit": [0.0, INF], "projectors_bias": False,
        "lm_head_multiplier": 1.0, "embedding_multiplier": 1.0, "mlp_multipliers": None, "key_multiplier": 1.0,
        "attention_out_multiplier": 1.0, "attention_in_multiplier": 1.0, "ssm_multipliers": None,
        "ssm_in_multiplier": 1.0, "ssm_out_multiplier": 1.0, "attention_bias": False, "mlp_bias": False},
    "zamba2": {
        "vocab_size": 32000, "max_position_embeddings": 4096, "hidden_size": 2560, "num_hidden_layers": 54,
        "layers_block_type": None, "mamba_d_state": 64, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_ngroups": 1,
        "time_step_min": 0.001, "n_mamba_heads": 8, "add_bias_linear": False, "intermediate_size": None,
        "hidden_act": "gelu", "num_attention_heads": 32, "num_key_value_heads": None, "num_mem_blocks": 1,
        "use_shared_attention_adapter": False, "adapter_rank": 128, "use_mem_rope": False, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True},
}

TOP = {"embed": "model.embed_tokens.weight", "norm": "model.final_layernorm.weight", "lm_head": "lm_head.weight"}
SHARED = "shared_transformer."


class AdapterLayout(dict):
    """Zamba2's layout: fixed names, plus the adapters, whose names carry their use index
    (``shared.adapter.{j}.q_down`` -> ``shared_transformer.self_attn.linear_q_adapter_list.{j}.0.weight``)."""

    ADAPTER = re.compile(r"shared\.adapter\.(\d+)\.(q|k|v|mlp)_(down|up)")

    def get(self, key, default=None):
        match = self.ADAPTER.fullmatch(key) if isinstance(key, str) else None
        if match is None:
            return super().get(key, default)
        use, which, part = match.groups()
        index = 0 if part == "down" else 1
        if which == "mlp":
            return f"{SHARED}feed_forward.gate_up_proj_adapter_list.{use}.{index}.weight"
        return f"{SHARED}self_attn.linear_{which}_adapter_list.{use}.{index}.weight"


LAYOUTS = {
    "falcon_h1": {"attn_norm": "input_layernorm.weight", "mlp_norm": "pre_ff_layernorm.weight",
                  **ssm_names("mamba"),
                  **{f"mlp.w_{x}": f"feed_forward.{x}_proj.weight" for x in ("gate", "up", "down")},
                  "_top": TOP},
    "zamba2": AdapterLayout({
        "ssm_norm": "input_layernorm.weight", **ssm_names("mamba"),
        "mamba_decoder.ssm_norm": "mamba_decoder.input_layernorm.weight",
        **{f"mamba_decoder.{k}": f"mamba_decoder.{v}" for k, v in ssm_names("mamba").items()},
        "shared_out": "linear.weight",
        "shared.attn_norm": f"{SHARED}input_layernorm.weight",
        **{f"shared.attn.w{x}": f"{SHARED}self_attn.{x}_proj.weight" for x in "qkvo"},
        "shared.mlp_norm": f"{SHARED}pre_ff_layernorm.weight",
        "shared.mlp.w_gate_up": f"{SHARED}feed_forward.gate_up_proj.weight",
        "shared.mlp.b_gate_up": f"{SHARED}feed_forward.gate_up_proj.bias",
        "shared.mlp.w_down": f"{SHARED}feed_forward.down_proj.weight",
        "shared.mlp.b_down": f"{SHARED}feed_forward.down_proj.bias",
        "_top": TOP}),
}


# ---- readers ---------------------------------------------------------------------------------

def _multiplier(cfg: Config, key: str) -> Optional[float]:
    """A positive multiplier; None when it is 1 (nothing to multiply)."""
    value = cfg.get(key, positive_number)
    return None if value == 1.0 else value


def _multipliers(cfg: Config, key: str, count: int) -> list[float]:
    """A list of ``count`` positive multipliers; null or missing: all 1 (transformers' default)."""
    value = cfg.raw(key)
    if value is None:
        return [1.0] * count
    if not isinstance(value, list) or len(value) != count:
        raise cfg.error(key, f"expected a list of {count} numbers, got {value!r}")
    try:
        return [positive_number(v) for v in value]
    except Bad as err:
        raise cfg.error(key, str(err)) from None


def _no(cfg: Config, *keys: str) -> None:
    for key in keys:
        cfg.check(key, lambda v: not v, hint="irc's attention and MLP here have no such bias")


def _full_rope(cfg: Config, head_dim: int) -> RopeSpec:
    params, key = rope_dict(cfg)
    rope = read_rope(cfg, head_dim, params, key, original_max=cfg.get("max_position_embeddings", positive_int))
    if rope.rotary_dim is not None:
        raise cfg.unsupported(f"{key}.partial_rotary_factor" if "partial_rotary_factor" in params
                              else "partial_rotary_factor", params.get("partial_rotary_factor",
                                                                       cfg.raw("partial_rotary_factor")),
                              hint="this family's default RoPE rotates the whole head (transformers ignores the "
                                   "factor)")
    return rope


def _heads(cfg: Config) -> tuple[int, int]:
    heads = cfg.get("num_attention_heads", size)
    kv_heads = cfg.get("num_key_value_heads", size, None) or heads
    if heads % kv_heads:
        raise cfg.error("num_key_value_heads", f"{heads} heads are not divisible by {kv_heads} kv heads")
    return heads, kv_heads


def _non_negative_number(value) -> float:
    value = number(value)
    if value < 0:
        raise Bad(f"expected a non-negative number, got {value!r}")
    return float(value)


# ---- Falcon-H1 -------------------------------------------------------------------------------

@dataclass
class FalconH1:
    """What the graph needs beyond ``Arch``: the multipliers (None where 1) and the mixer's
    norm (None: gated by silu(z) alone)."""
    ssm_in: Optional[float]
    ssm_out: Optional[float]
    ssm_multipliers: list
    attention_in: Optional[float]
    attention_out: Optional[float]
    gate: Optional[float]
    down: Optional[float]
    lm_head: Optional[float]
    embedding: Optional[float]
    ssm_norm: Optional[dict]
    out_bias: bool


def _falcon_h1(cfg: Config, name: str, model_type: str) -> Arch:
    """Falcon-H1: parallel attention and Mamba-2 on every layer, then a SwiGLU MLP."""
    cfg.check("hidden_act", lambda v: v == "silu", hint="Falcon-H1's convolution and MLP use SiLU")
    _no(cfg, "attention_bias", "mlp_bias")
    d = cfg.get("hidden_size", size)
    n = cfg.get("num_hidden_layers", layer_count)
    heads, kv_heads = _heads(cfg)
    head_dim = cfg.get("head_dim", size, None) or d // heads
    if not head_dim:
        raise cfg.error("num_attention_heads", f"{heads} heads leave hidden_size {d} no head_dim", hint="give head_dim")
    eps = cfg.get("rms_norm_eps", positive_number)
    d_ssm = cfg.get("mamba_d_ssm", positive_int, None) or cfg.get("mamba_expand", positive_int) * d
    ssm_heads = cfg.get("mamba_n_heads", positive_int)
    if d_ssm % ssm_heads:
        raise cfg.error("mamba_n_heads", f"{ssm_heads} heads do not divide the Mamba width {d_ssm}",
                        hint="the width is mamba_d_ssm, or mamba_expand x hidden_size when it is null")
    ssm_head_dim = d_ssm // ssm_heads if cfg.raw("mamba_d_head") == "auto" else cfg.get("mamba_d_head", positive_int)
    if ssm_head_dim * ssm_heads != d_ssm:
        raise cfg.error("mamba_d_head", f"{ssm_heads} heads x {ssm_head_dim} is not the Mamba width {d_ssm}")
    groups = cfg.get("mamba_n_groups", positive_int)
    if ssm_heads % groups:
        raise cfg.error("mamba_n_groups", f"{groups} groups do not divide {ssm_heads} heads (mamba_n_heads)")
    dt_min, dt_max = time_step_limit(cfg)
    ssm = {"kind": "mamba2", "heads": ssm_heads, "head_dim": ssm_head_dim,
           "state_size": cfg.get("mamba_d_state", positive_int), "groups": groups,
           "conv_kernel": cfg.get("mamba_d_conv", positive_int), "conv_bias": cfg.get("mamba_conv_bias", boolean),
           "proj_bias": cfg.get("mamba_proj_bias", boolean), "dt_min": dt_min, "dt_max": dt_max}
    norm = None
    if cfg.get("mamba_rms_norm", boolean):
        norm = {"eps": eps, "group_size": d_ssm // groups,
                "norm_before_gate": cfg.get("mamba_norm_before_gate", boolean)}
    gate, down = _multipliers(cfg, "mlp_multipliers", 2)
    settings = FalconH1(
        ssm_in=_multiplier(cfg, "ssm_in_multiplier"), ssm_out=_multiplier(cfg, "ssm_out_multiplier"),
        ssm_multipliers=_multipliers(cfg, "ssm_multipliers", 5),
        attention_in=_multiplier(cfg, "attention_in_multiplier"),
        attention_out=_multiplier(cfg, "attention_out_multiplier"),
        gate=None if gate == 1.0 else gate, down=None if down == 1.0 else down,
        lm_head=_multiplier(cfg, "lm_head_multiplier"), embedding=_multiplier(cfg, "embedding_multiplier"),
        ssm_norm=norm, out_bias=cfg.get("projectors_bias", boolean))
    key_multiplier = cfg.get("key_multiplier", positive_number)
    attention = Attention("gqa", heads, kv_heads, head_dim,
                          scale=None if key_multiplier == 1.0 else key_multiplier * head_dim ** -0.5)
    rope = _full_rope(cfg, head_dim)
    layers = [LayerSpec(None, rope, mixer="attention+mamba2") for _ in range(n)]
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=eps, attention=attention, layers=layers,
                mlp={"kind": "swiglu", "d_ff": cfg.get("intermediate_size", positive_int)},
                tied=cfg.get("tie_word_embeddings", boolean), checkpoint="falcon_h1", ssm=ssm,
                embedding_scale=settings.embedding, expand=partial(falcon_h1_graph, settings))


def falcon_h1_graph(s: FalconH1, arch: Arch, origin: str):
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps, d_ff = arch.attention, arch.norm_eps, arch.mlp["d_ff"]
    ssm = {k: v for k, v in arch.ssm.items() if k != "kind"}
    with m.at(origin):
        x = m.embed(m.input_ids(), scale=s.embedding)
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            p = layer.prefix
            h = layer.rms_norm(x, "attn_norm", eps)
            norm = ({"gated_norm": False} if s.ssm_norm is None else
                    {"norm_eps": s.ssm_norm["eps"], "norm_group_size": s.ssm_norm.get("group_size"),
                     "norm_before_gate": bool(s.ssm_norm.get("norm_before_gate", False))})
            y = layer.mamba2(scaled(m, h, s.ssm_in, f"{p}ssm_in_scaled"), **ssm, out_bias=s.out_bias,
                             in_scale=s.ssm_multipliers, **norm)
            y = scaled(m, y, s.ssm_out, f"{p}ssm_out_scaled")
            att = layer.attention(scaled(m, h, s.attention_in, f"{p}attn_in_scaled"), a.heads, kv_heads=a.kv_heads,
                                  head_dim=a.head_dim, rope=dsl_rope(spec.rope), scale=a.scale)
            att = scaled(m, att, s.attention_out, f"{p}attn_out_scaled")
            x = x + m.add(y, att, f"{p}mixers_out")
            h = layer.rms_norm(x, "mlp_norm", eps)
            if s.gate is None:
                f = scaled(m, layer.swiglu(h, d_ff), s.down, f"{p}mlp_scaled")
            else:
                w_gate, w_up = (m.param(f"{p}mlp.w_{part}", (d_ff, arch.d_model)) for part in ("gate", "up"))
                w_down = m.param(f"{p}mlp.w_down", (arch.d_model, d_ff))
                g = m.emit("linear", [h, w_gate, None], None, f"{p}mlp_gate")[0]
                u = m.emit("linear", [h, w_up, None], None, f"{p}mlp_up")[0]
                f = glu(layer, g, u, w_down, gate="silu", gate_scale=s.gate, out_scale=s.down)
            x = x + f
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied, scale=s.lm_head)
    return m.graph


# ---- Zamba2 ----------------------------------------------------------------------------------

@dataclass
class Zamba2:
    """What the graph needs beyond ``Arch``."""
    hybrid: list          # the layers with a shared block, in order
    blocks: int           # num_mem_blocks
    d_ff: int
    gate: str             # the MLP's activation (frontends.dsl_hybrid.GATES)
    bias: bool            # add_bias_linear: the MLP's and the Mamba-2 projections' biases
    adapter_rank: int
    attention_adapters: bool


def _zamba2_kinds(cfg: Config) -> list[str]:
    if not cfg.has("layers_block_type"):
        return list(ZAMBA2_LAYERS)
    kinds = [{"mamba": MAMBA}.get(k, k) for k in cfg.get("layers_block_type", string_list)]
    for kind in kinds:
        if kind not in (MAMBA, HYBRID):
            raise cfg.unsupported("layers_block_type", kind, hint=f"Zamba2's layer kinds: {MAMBA}, {HYBRID}")
    return kinds


def _zamba2(cfg: Config, name: str, model_type: str) -> Arch:
    """Zamba2: Mamba-2 layers, shared transformer blocks at the hybrid ones."""
    d = cfg.get("hidden_size", size)
    kinds = _zamba2_kinds(cfg)
    try:
        layer_count(len(kinds))
    except Bad as err:
        raise cfg.error("layers_block_type", f"{len(kinds)} layers: {err}") from None
    if cfg.get("num_hidden_layers", positive_int) != len(kinds):
        raise cfg.error("num_hidden_layers", f"{cfg.raw('num_hidden_layers')} layers, but layers_block_type gives "
                                             f"{len(kinds)}", hint="transformers follows the layer list")
    gate = ZAMBA2_GATES.get(cfg.raw("hidden_act"))
    if gate is None:
        raise cfg.unsupported("hidden_act", cfg.raw("hidden_act"), hint=f"Zamba2's MLP: {', '.join(ZAMBA2_GATES)}")
    heads, kv_heads = _heads(cfg)
    head_dim = 2 * d // heads  # Zamba2Config.attention_head_dim (attention reads concat(x, embeddings))
    if not head_dim:
        raise cfg.error("num_attention_heads", f"{heads} heads leave 2 x hidden_size {2 * d} no head_dim")
    adapters = cfg.get("use_shared_attention_adapter", boolean)
    if adapters and (kv_heads != heads or heads * head_dim != 2 * d):
        raise cfg.unsupported("use_shared_attention_adapter", True,
                              hint=f"the adapters add 2 x hidden_size = {2 * d} features to q, k and v: that needs "
                                   f"as many kv heads as heads and heads dividing {2 * d}")
    rope = None
    if cfg.get("use_mem_rope", boolean):
        params, key = rope_dict(cfg)
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            raise cfg.unsupported(f"{key}.rope_type", kind, hint="irc reads Zamba2's default RoPE only")
        rope = _full_rope(cfg, head_dim)
    d_inner = cfg.get("mamba_expand", positive_int) * d
    ssm_heads = cfg.get("n_mamba_heads", positive_int)
    if d_inner % ssm_heads:
        raise cfg.error("n_mamba_heads", f"{ssm_heads} heads do not divide mamba_expand x hidden_size = {d_inner}")
    groups = cfg.get("mamba_ngroups", positive_int)
    if ssm_heads % groups:
        raise cfg.error("mamba_ngroups", f"{groups} groups do not divide {ssm_heads} heads (n_mamba_heads)")
    bias = cfg.get("add_bias_linear", boolean)
    ssm = {"kind": "mamba2", "heads": ssm_heads, "head_dim": d_inner // ssm_heads,
           "state_size": cfg.get("mamba_d_state", positive_int), "groups": groups,
           "conv_kernel": cfg.get("mamba_d_conv", positive_int), "conv_bias": True, "proj_bias": bias,
           "dt_min": cfg.get("time_step_min", _non_negative_number), "dt_max": None, "norm_eps": ZAMBA2_NORM_EPS,
           "norm_group_size": d_inner // groups}
    d_ff = cfg.get("intermediate_size", positive_int, None) or 4 * d
    hybrid = [i for i, kind in enumerate(kinds) if kind == HYBRID]
    blocks = cfg.get("num_mem_blocks", positive_int)
    tied = cfg.get("tie_word_embeddings", boolean)
    if not tied and len(hybrid) > blocks:
        raise cfg.unsupported("tie_word_embeddings", False, hint=(
            f"{len(hybrid)} hybrid layers share {blocks} block(s) (num_mem_blocks), but transformers 5.24 ties "
            "Zamba2's shared blocks only with the embeddings: untied, each hybrid layer has its own copy and the "
            "checkpoint adapters it never reads; irc builds shared blocks only"))
    settings = Zamba2(hybrid=hybrid, blocks=blocks, d_ff=d_ff, gate=gate,
                      bias=bias, adapter_rank=cfg.get("adapter_rank", positive_int), attention_adapters=adapters)
    layers = [LayerSpec(None, rope, mixer="attention+mamba2" if kind == HYBRID else "mamba2") for kind in kinds]
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=len(kinds), norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=Attention("gqa", heads, kv_heads, head_dim, scale=(head_dim / 2) ** -0.5), layers=layers,
                mlp={"kind": "swiglu" if gate == "silu" else "geglu", "d_ff": d_ff},
                tied=tied, checkpoint="zamba2", ssm=ssm,
                expand=partial(_zamba2_graph, settings))


def _shared_block(m: Model, s: Zamba2, arch: Arch, owner: str) -> dict:
    """Block weights, made once under ``owner`` (``layers.{i}.shared.``)."""
    d, wide, a = arch.d_model, 2 * arch.d_model, arch.attention
    block = {"attn_norm": m.param(f"{owner}attn_norm", (wide,)),
             "wq": m.param(f"{owner}attn.wq", (a.heads * a.head_dim, wide)),
             "wk": m.param(f"{owner}attn.wk", (a.kv_heads * a.head_dim, wide)),
             "wv": m.param(f"{owner}attn.wv", (a.kv_heads * a.head_dim, wide)),
             "wo": m.param(f"{owner}attn.wo", (d, a.heads * a.head_dim)),
             "mlp_norm": m.param(f"{owner}mlp_norm", (d,)),
             "w_gate_up": m.param(f"{owner}mlp.w_gate_up", (2 * s.d_ff, d)),
             "w_down": m.param(f"{owner}mlp.w_down", (d, s.d_ff))}
    if s.bias:
        block["b_gate_up"] = m.param(f"{owner}mlp.b_gate_up", (2 * s.d_ff,))
        block["b_down"] = m.param(f"{owner}mlp.b_down", (d,))
    return block


def _adapters(m: Model, s: Zamba2, arch: Arch, owner: str, use: int) -> dict:
    """Use ``use``'s adapters (under its block's owner): (down, up) per projection."""
    r, wide = s.adapter_rank, 2 * arch.d_model
    names = {"mlp": (arch.d_model, 2 * s.d_ff)}
    if s.attention_adapters:
        names.update({x: (wide, wide) for x in "qkv"})
    return {x: (m.param(f"{owner}adapter.{use}.{x}_down", (r, n_in)),
                m.param(f"{owner}adapter.{use}.{x}_up", (n_out, r))) for x, (n_in, n_out) in names.items()}


def _zamba2_graph(s: Zamba2, arch: Arch, origin: str):
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps, d = arch.attention, arch.norm_eps, arch.d_model
    ssm = {k: v for k, v in arch.ssm.items() if k != "kind"}
    blocks: list[dict] = []
    with m.at(origin):
        x = m.embed(m.input_ids())
        embeddings = x
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            p = layer.prefix
            if layer.index not in s.hybrid:
                x = x + layer.mamba2(layer.rms_norm(x, "ssm_norm", eps), **ssm)
                continue
            use = s.hybrid.index(layer.index)
            owner = f"layers.{s.hybrid[use % s.blocks]}.shared."
            if use < s.blocks:
                blocks.append(_shared_block(m, s, arch, owner))
            block, adapters = blocks[use % s.blocks], _adapters(m, s, arch, owner, use)
            joined = m.emit("concat", [x, embeddings], {"axis": -1}, f"{p}shared_in")[0]
            h = norm_with(m, joined, block["attn_norm"], eps, f"{p}shared_attn_norm_out")
            h = shared_attention(layer, h, block, a.heads, a.kv_heads, a.head_dim, rope=dsl_rope(spec.rope),
                                 scale=a.scale, adapters={k: v for k, v in adapters.items() if k != "mlp"})
            h = norm_with(m, h, block["mlp_norm"], eps, f"{p}shared_mlp_norm_out")
            gate_up = m.emit("linear", [h, block["w_gate_up"], block.get("b_gate_up")], None, f"{p}mlp_gate_up")[0]
            gate_up = m.add(gate_up, low_rank(m, h, *adapters["mlp"], f"{p}mlp_adapter"), f"{p}mlp_gate_up_adapted")
            g, u = layer._split(gate_up, [s.d_ff, s.d_ff], ["mlp_gate", "mlp_up"])
            h = glu(layer, g, u, block["w_down"], block.get("b_down"), gate=s.gate)
            h = m.emit("linear", [h, m.param(f"{p}shared_out", (d, d)), None], None, f"{p}shared_out")[0]
            with scope(layer, "mamba_decoder"):
                y = layer.mamba2(layer.rms_norm(m.add(x, h, f"{p}mamba_in"), "ssm_norm", eps), **ssm)
            x = x + y
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


FAMILIES = {"falcon_h1": _falcon_h1, "zamba2": _zamba2}

__all__ = ["FalconH1", "falcon_h1_graph", "DEFAULTS", "FAMILIES", "LAYOUTS"]
