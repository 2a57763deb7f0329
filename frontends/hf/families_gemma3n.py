"""Gemma-3n (``frontends.hf.families`` registers it): transformers 5.24's Gemma3nForCausalLM,
and the text model of a multimodal Gemma3nForConditionalGeneration checkpoint.

=================  ==========================================================================
gemma3n_text       the text model: Gemma-3's sandwich norms (plain weights here, not 1 + w),
                   sqrt(d) embedding scale, GeGLU, per-layer-type windows and RoPE, final
                   softcap; plus AltUp (``altup_num_inputs`` streams, ``altup_active_idx``,
                   ``altup_correct_scale``), LAuReL (``laurel_rank``), per-layer embeddings
                   (``vocab_size_per_layer_input``, ``hidden_size_per_layer_input``),
                   KV-sharing layers (``num_kv_shared_layers``), activation sparsity
                   (``activation_sparsity_pattern``), per-layer ``intermediate_size``
gemma3n            the multimodal config: the text model inside (``text_config``); weights
                   under ``model.language_model.``, the vision and audio towers' left aside
=================  ==========================================================================

What the graph computes is ``frontends.dsl_gemma3n``'s docstring. Read as transformers reads
it: q, k and v are RMS-normed per head (v without a weight), attention is unscaled (1.0; no
``query_pre_attn_scalar``) and not soft-capped; ``layer_types`` defaults to every fifth layer
full attention; local layers rotate with base 1e4 (``rope_local_base_freq`` or
``rope_parameters.sliding_attention``), global ones with 1e6 and any scaling; an absent or
null ``activation_sparsity_pattern`` is 0.95 on the first ten layers of a model deeper than
ten, else none; sparsity p becomes the multiplier icdf(p) of the standard normal, computed
in double precision when the config is read (transformers computes it in float32: the
multipliers agree within 5e-7, so the cutoffs within 5e-7 of the gate's standard deviation).

KV sharing: the last ``num_kv_shared_layers`` layers compute no K/V; each reads those of the
last earlier layer of its own type. Only the other layers have a cache, so the graph has
``past_key_values.{i}`` / ``present.{i}`` for i below L - num_kv_shared_layers and the KV
bytes ``irc show`` reports are those of the layers that store one. The checkpoint's
k/v projections and norms of shared layers, where a checkpoint keeps them, are left aside
as transformers leaves them; so is ``altup.correct_output_scale`` with
``altup_correct_scale: false``.

Refused, naming config.json and the key: ``attention_bias``, an activation other than GELU,
``layer_types`` of other kinds or length, a ``num_kv_shared_layers`` that leaves a shared
layer type without an earlier layer of that type, an ``altup_active_idx`` outside the streams,
an ``intermediate_size`` or ``activation_sparsity_pattern`` list of the wrong length or a
sparsity outside [0, 1), a multimodal config without a ``text_config`` object or with
another text model inside.
"""
from __future__ import annotations

from functools import partial
from statistics import NormalDist
from typing import Optional

from frontends.dsl_gemma3n import Gemma3nSpec, gemma3n_graph
from frontends.hf.families_base import _gemma3_rope
from frontends.hf.config import Arch, Attention, Config, LayerSpec
from frontends.hf.families_common import FULL, SLIDING, _dims, _layer_types, _windows
from frontends.hf.families_gemma_shared import TOWERS, gelu_approximate, kv_sources, text_model
from frontends.hf.weights import Tensor
from irc.yamlloc import Bad, boolean, non_negative_int, number, positive_int, positive_number

TEXT = {  # transformers 5.24's Gemma3nTextConfig (the E4B shapes)
    "vocab_size": 262400, "hidden_size": 2048, "intermediate_size": 16384, "num_hidden_layers": 35,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": False,
    "sliding_window": 512, "final_logit_softcapping": 30.0, "vocab_size_per_layer_input": 262144,
    "hidden_size_per_layer_input": 256, "altup_active_idx": 0, "altup_correct_scale": True, "altup_num_inputs": 4,
    "num_kv_shared_layers": 15, "laurel_rank": 64, "activation_sparsity_pattern": None,
}
DEFAULTS = {"gemma3n_text": TEXT, "gemma3n": {"tie_word_embeddings": True}}


def _per_layer(cfg: Config, key: str, n: int, kind) -> list:
    """A per-layer setting: one value for every layer, or a list of ``n``."""
    value = cfg.raw(key)
    if not isinstance(value, list):
        return [cfg.get(key, kind)] * n
    if len(value) != n:
        raise cfg.error(key, f"has {len(value)} entries for {n} layers (num_hidden_layers)")
    try:
        return [kind(v) for v in value]
    except Bad as err:
        raise cfg.error(key, str(err)) from None


def sparsity_multipliers(cfg: Config, n: int) -> list[Optional[float]]:
    """Per layer icdf(p) of ``activation_sparsity_pattern`` (None where p is 0)."""
    key = "activation_sparsity_pattern"
    if cfg.raw(key) is None:
        pattern = [0.95 if i < 10 and n > 10 else 0.0 for i in range(n)]
    elif not isinstance(cfg.raw(key), list):
        raise cfg.error(key, f"expected a list of {n} numbers, one per layer, got {cfg.raw(key)!r}")
    else:
        pattern = _per_layer(cfg, key, n, number)
    for p in pattern:
        if not 0 <= p < 1:
            raise cfg.error(key, f"sparsity {p} is outside [0, 1)", hint="the cutoff is mean + std * icdf(p)")
    return [NormalDist().inv_cdf(p) if p > 0 else None for p in pattern]


def _gemma3n(cfg: Config, name: str, model_type: str) -> Arch:
    """Gemma-3n's text model (see the module docstring)."""
    outer, checkpoint = cfg, "gemma3n"
    if model_type == "gemma3n":
        cfg, checkpoint = text_model(outer, model_type, TEXT, "gemma3n_text", "Gemma-3n"), "gemma3n_multimodal"
    cfg.check("attention_bias", lambda v: not v, hint="Gemma-3n's projections have no bias")
    approximate = gelu_approximate(cfg, "Gemma-3n")
    dims = _dims(cfg)
    n, d = dims["layers"], dims["d"]
    types = _layer_types(cfg, n, lambda i: FULL if (i + 1) % 5 == 0 else SLIDING)
    ropes = {kind: _gemma3_rope(cfg, dims["head_dim"], kind) for kind in sorted(set(types))}
    streams = cfg.get("altup_num_inputs", positive_int)
    active = cfg.get("altup_active_idx", non_negative_int)
    if active >= streams:
        raise cfg.error("altup_active_idx", f"{active} is not one of the {streams} streams (altup_num_inputs)")
    d_ff = _per_layer(cfg, "intermediate_size", n, positive_int)
    spec = Gemma3nSpec(streams=streams, active=active, correct_scale=cfg.get("altup_correct_scale", boolean),
                       laurel_rank=cfg.get("laurel_rank", positive_int),
                       per_layer_dim=cfg.get("hidden_size_per_layer_input", positive_int),
                       per_layer_vocab=cfg.get("vocab_size_per_layer_input", positive_int), d_ff=d_ff,
                       sparsity=sparsity_multipliers(cfg, n), kv_source=kv_sources(cfg, types),
                       approximate=approximate)
    layers = [LayerSpec(window, ropes[kind]) for window, kind in zip(_windows(cfg, types), types)]
    typed = outer if any(outer.has(key) for key in ("dtype", "torch_dtype")) else cfg  # the outer config's first
    return Arch(name=name, model_type="gemma3n_text", dtype=typed.dtype(),
                vocab_size=cfg.get("vocab_size", positive_int), d_model=d, n_layers=n,
                norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qk_norm=True, scale=1.0),
                layers=layers, mlp={"kind": "geglu", "d_ff": d_ff[0], "approximate": approximate}, sandwich=True,
                tied=outer.get("tie_word_embeddings", boolean),
                final_softcap=cfg.get("final_logit_softcapping", positive_number, None), embedding_scale=d ** 0.5,
                checkpoint=checkpoint, expand=partial(gemma3n_graph, spec))


FAMILIES = {"gemma3n_text": _gemma3n, "gemma3n": _gemma3n}

# irc name under layers.{i}. -> the name under the layers' prefix, where it departs from Llama's
_LAYER = {
    "mlp_norm": "pre_feedforward_layernorm.weight", "post_attn_norm": "post_attention_layernorm.weight",
    "post_mlp_norm": "post_feedforward_layernorm.weight",
    "altup.correct_output_scale": "altup.correct_output_scale",
    **{f"altup.{x}": f"altup.{x}.weight" for x in ("router_norm", "modality_router", "prediction_coefs",
                                                   "correction_coefs")},
    "laurel.left": "laurel.linear_left.weight", "laurel.right": "laurel.linear_right.weight",
    "laurel.norm": "laurel.post_laurel_norm.weight",
    "per_layer.gate": "per_layer_input_gate.weight", "per_layer.projection": "per_layer_projection.weight",
    "per_layer.norm": "post_per_layer_input_norm.weight",
    # a shared layer's K/V weights, where a checkpoint keeps them, and an unapplied output
    # scale are read by no param; every layer that computes K/V reads its own
    "_spare_suffixes": tuple(f".self_attn.{x}.weight" for x in ("k_proj", "v_proj", "k_norm", "v_norm")) +
                       (".altup.correct_output_scale",),
}
_TOP = {"embed": "embed_tokens.weight", "norm": "norm.weight", "embed_per_layer": "embed_tokens_per_layer.weight",
        "per_layer_projection": "per_layer_model_projection.weight",
        "per_layer_projection_norm": "per_layer_projection_norm.weight"}
STREAM_PROJECTIONS = ("altup_projections", "altup_unembed_projections")


def _resolver(base: str):
    def resolve(arch: Arch, param: str, checkpoint) -> Optional[Tensor]:
        """``altup_projections.{j}`` and ``altup_unembed_projections.{j}`` (one per extra stream)."""
        group, _, index = param.rpartition(".")
        return Tensor(f"{base}{group}.{index}.weight") if group in STREAM_PROJECTIONS and index.isdigit() else None
    return resolve


def _layout(base: str, **extra) -> dict:
    return {**_LAYER, "_prefix": f"{base}layers.", "_resolve": _resolver(base),
            "_top": {**{k: base + v for k, v in _TOP.items()}, "lm_head": "lm_head.weight"}, **extra}


LAYOUTS = {"gemma3n": _layout("model."),
           "gemma3n_multimodal": _layout("model.language_model.", _spare=TOWERS)}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS", "sparsity_multipliers"]
