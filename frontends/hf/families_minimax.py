"""MiniMax-Text-01 (``minimax``; ``frontends.hf.families`` registers it): lightning attention
beside softmax attention, a Mixtral MoE on every layer, its own decoder (``Arch.expand``).

Layer i, of kind ``layer_types[i]`` (default: ``full_attention`` when (i + 1) % 2, else
``linear_attention``, as transformers' ``MiniMaxConfig.__post_init__``)::

    h = input_layernorm(x);          x = α·h + β·mixer(h)
    h = post_attention_layernorm(x); x = α'·h + β'·moe(h)

The residual is the *normed* h (transformers' order). α, β are
``{linear,full}_attn_{alpha,beta}_factor`` by kind, α', β' ``mlp_{alpha,beta}_factor``;
each is a ``mul`` by a constant where it is not 1. The mixer is GQA attention with RoPE over
head_dim (``rope_parameters`` / ``rope_theta``, default 1e6; ``sliding_window`` on every
attention layer, as transformers' mask does), no biases; or ``Layer.lightning_attention``
(``frontends.dsl_lightning``) over the same heads and head_dim, its RMS norm's eps 1e-6
(``MiniMaxRMSNorm``'s default: transformers does not pass rms_norm_eps there). The MoE is
softmax top-k, renormalised, SiLU experts (``num_local_experts``, alias ``num_experts``).

The slopes. transformers derives each lightning layer's per-head decay rate from the head
and layer index (``dsl_lightning.lightning_slopes``) and keeps it, with the decays made from
it, as persistent buffers (``self_attn.slope_rate`` [H, 1, 1], ``query_decay``,
``key_decay``, ``diagonal_decay``): a checkpoint saved by transformers carries them, and
loading one overwrites the derived values with the stored ones; a checkpoint without them
(they are not weights) gets the derived values. irc does the same: where the folder's
checkpoint holds a layer's ``slope_rate``, its values become that layer's slopes (read when
the config is described), else the formula's. The buffers are then left aside as spare
tensors: ``slope_rate`` is read here, the decays are transformers' chunking tables of it
(``block_size``), which irc's recurrence does not need. (A checkpoint whose stored decays do
not agree with its stored ``slope_rate`` would make transformers' prefill and decode
disagree; irc follows ``slope_rate``.)

Checkpoint names (``layouts``): Mixtral's experts as transformers 5.24 saves and loads them
(``block_sparse_moe.experts.{e}.w1|w3|w2`` gate | up | down, ``block_sparse_moe.gate``),
attention ``self_attn.{q,k,v,o}_proj``, lightning ``self_attn.{qkv_proj, output_gate, norm,
out_proj}``. The fused form transformers builds in memory (``mlp.experts.gate_up_proj``
[E, 2F, d]) is refused, naming the tensor: a layout entry for half of a 3-D tensor is not
one this module can give (``families_ssm.FUSED`` holds those).

Refused, naming config.json and the key: a ``layer_types`` entry other than the two kinds or
a list whose length is not ``num_hidden_layers``, heads that do not divide hidden_size
without ``head_dim``, kv heads that do not divide heads, an activation other than SiLU, a
residual factor that is not a positive number. ``router_jitter_noise`` and ``block_size``
change nothing at inference and are not read.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import partial

from frontends.dsl import Model
from frontends.dsl_hybrid import scaled
from frontends.dsl_lightning import lightning_slopes
from frontends.hf.config import Arch, Attention, Config, LayerSpec, attention_dims, layer_types, read_rope, rope_dict, dsl_rope
from frontends.hf.weights import Checkpoint
from irc.errors import SpecError
from irc.weights import convert
from irc.dtypes import DType
from irc.yamlloc import boolean, layer_count, positive_int, positive_number

FULL, LINEAR = "full_attention", "linear_attention"
KINDS = (FULL, LINEAR)
MIXERS = {FULL: "attention", LINEAR: "lightning_attention"}
FACTORS = {FULL: ("full_attn_alpha_factor", "full_attn_beta_factor"),
           LINEAR: ("linear_attn_alpha_factor", "linear_attn_beta_factor"),
           "mlp": ("mlp_alpha_factor", "mlp_beta_factor")}
LIGHTNING_NORM_EPS = 1e-6  # MiniMaxRMSNorm's default; the lightning norm is built without rms_norm_eps
BUFFERS = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")
DEFAULTS = {"minimax": {  # transformers 5.24's MiniMaxConfig
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "sliding_window": None, "num_experts_per_tok": 2, "num_local_experts": 8, "rope_theta": 1e6,
    **{key: 1.0 for pair in FACTORS.values() for key in pair}}}


@dataclass
class MiniMax:
    """What the graph needs beyond ``Arch``."""
    slopes: dict      # lightning layer index -> its per-head slopes
    factors: dict     # FULL, LINEAR, "mlp" -> (alpha, beta)


def layer_kinds(cfg: Config, n: int) -> list[str]:
    """``layer_types`` checked (the two kinds, one per layer), else alternating from
    full attention, as the config class derives them."""
    if not cfg.has("layer_types"):
        return [FULL if (i + 1) % 2 else LINEAR for i in range(n)]
    return layer_types(cfg, n, KINDS, "MiniMax")


def checkpoint_slopes(cfg: Config, kinds: list[str], heads: int) -> dict:
    """Lightning layer -> its slopes: the checkpoint's ``self_attn.slope_rate`` where the
    folder has one (what transformers loads over the derived value), else the formula."""
    folder = os.path.dirname(cfg.path)
    checkpoint = Checkpoint.find(folder) if os.path.isdir(folder) else None
    slopes = {}
    for i, kind in enumerate(kinds):
        if kind != LINEAR:
            continue
        name = f"model.layers.{i}.self_attn.slope_rate"
        if checkpoint is None or name not in checkpoint.files:
            slopes[i] = lightning_slopes(heads, i, len(kinds))
            continue
        shape = checkpoint.info(name)[1]
        if shape != [heads, 1, 1]:
            raise SpecError(f"tensor {name} has shape {shape}; config.json describes {heads} heads, so [{heads}, 1, 1]",
                            location=checkpoint.file(name))
        values = [float(v) for v in convert(checkpoint.read(name), DType.f32).reshape(-1)]
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise SpecError(f"tensor {name} holds a slope that is not a positive number: {values}",
                            location=checkpoint.file(name), hint="each decay rate exp(-slope) needs slope > 0")
        slopes[i] = values
    return slopes


def _refuse_fused_experts(cfg: Config, n: int) -> None:
    """The in-memory fused expert form is not a layout irc reads (see the module docstring)."""
    folder = os.path.dirname(cfg.path)
    checkpoint = Checkpoint.find(folder) if os.path.isdir(folder) else None
    fused = [f"model.layers.{i}.mlp.experts.gate_up_proj" for i in range(n)]
    found = next((name for name in fused if checkpoint is not None and name in checkpoint.files), None)
    if found:
        raise SpecError(f"tensor {found} holds the experts fused ([E, 2F, d]), a layout irc does not read for "
                        "minimax", location=checkpoint.file(found),
                        hint="irc reads the per-expert block_sparse_moe.experts.{e}.w1|w2|w3 tensors that "
                             "transformers' save_pretrained writes")


def _factors(cfg: Config) -> dict:
    return {kind: tuple(cfg.get(key, positive_number) for key in keys) for kind, keys in FACTORS.items()}


def _experts(cfg: Config) -> dict:
    key = "num_experts" if cfg.has("num_experts") and not cfg.has("num_local_experts") else "num_local_experts"
    return {"experts": cfg.get(key, positive_int), "top_k": cfg.get("num_experts_per_tok", positive_int),
            "d_ff": cfg.get("intermediate_size", positive_int)}


def _minimax(cfg: Config, name: str, model_type: str) -> Arch:
    """MiniMax-Text-01: lightning and softmax attention layers, a MoE on each."""
    cfg.check("hidden_act", lambda v: v == "silu", hint="MiniMax's lightning attention and experts use SiLU")
    d, heads, kv_heads, head_dim = attention_dims(cfg)
    n = cfg.get("num_hidden_layers", layer_count)
    kinds = layer_kinds(cfg, n)
    params, key = rope_dict(cfg)
    rope = read_rope(cfg, head_dim, params, key, default_base=cfg.defaults["rope_theta"],
                     original_max=cfg.get("max_position_embeddings", positive_int))
    window = cfg.get("sliding_window", positive_int, None)
    settings = MiniMax(slopes=checkpoint_slopes(cfg, kinds, heads), factors=_factors(cfg))
    _refuse_fused_experts(cfg, n)
    layers = [LayerSpec(window if kind == FULL else None, rope if kind == FULL else None, True, mixer=MIXERS[kind])
              for kind in kinds]
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=Attention("gqa", heads, kv_heads, head_dim), layers=layers, mlp=None, moe=_experts(cfg),
                tied=cfg.get("tie_word_embeddings", boolean), checkpoint="minimax",
                ssm={"kind": "lightning_attention", "heads": heads, "head_dim": head_dim},
                expand=partial(minimax_graph, settings))


def minimax_graph(s: MiniMax, arch: Arch, origin: str):
    """The decoder of the module docstring through the DSL."""
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps = arch.attention, arch.norm_eps
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            p = layer.prefix
            if spec.mixer == "attention":
                kind, h = FULL, layer.rms_norm(x, "attn_norm", eps)
                rope = dsl_rope(spec.rope)
                y = layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=rope,
                                    window=spec.window)
            else:
                kind, h = LINEAR, layer.rms_norm(x, "ssm_norm", eps)
                y = layer.lightning_attention(h, a.heads, a.head_dim, s.slopes[layer.index], LIGHTNING_NORM_EPS)
            x = _residual(m, h, y, s.factors[kind], f"{p}mixer")
            h = layer.rms_norm(x, "mlp_norm", eps)
            x = _residual(m, h, layer.moe(h, **arch.moe), s.factors["mlp"], f"{p}moe")
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


def _residual(m: Model, h, y, factors: tuple, name: str):
    """α·h + β·y (a ``mul`` only where a factor is not 1)."""
    alpha, beta = factors
    return m.add(scaled(m, h, alpha, f"{name}_residual_scaled"), scaled(m, y, beta, f"{name}_out_scaled"))


FAMILIES = {"minimax": _minimax}

_EXPERTS = {"gate": "w1", "up": "w3", "down": "w2"}  # Mixtral's names, as transformers saves MiniMax's experts


def layouts(experts) -> dict:
    """MiniMax's checkpoint names (irc name under layers.{i}. -> the name under
    model.layers.{i}.); ``experts(template)`` makes the entry of per-expert tensors stacked
    into one param (``families.Experts``, passed in: that module imports this one). The
    decay buffers transformers saves per layer are spare (``_spare_suffixes``): irc reads
    the slopes itself (``checkpoint_slopes``)."""
    return {"minimax": {
        "ssm_norm": "input_layernorm.weight",
        **{f"ssm.{n}": f"self_attn.{n}.weight" for n in ("qkv_proj", "output_gate", "norm", "out_proj")},
        "moe.router": "block_sparse_moe.gate.weight",
        **{f"moe.w_{x}": experts(f"block_sparse_moe.experts.{{e}}.{w}.weight") for x, w in _EXPERTS.items()},
        "_spare_suffixes": tuple(f".self_attn.{b}" for b in BUFFERS)}}


__all__ = ["DEFAULTS", "FAMILIES", "layouts", "MiniMax", "minimax_graph", "layer_kinds", "checkpoint_slopes"]
