"""Llama-4's text model (``llama4_text``; ``frontends.hf.families`` registers it), built by its
own loop through the DSL (``expand``):

- layers with RoPE (``no_rope_layers[i]`` 1; default every fourth layer has none) rotate q
  and k in adjacent pairs (transformers' complex multiply: irc's interleaved convention),
  RMS-normalise each head of q and k without a weight (``use_qk_norm``; RoPE keeps a head's
  norm, so before or after is the same), and attend in chunks of ``attention_chunk_size``
  tokens (``layer_types`` "chunked_attention": a query sees only its chunk's keys, chunks
  counted from the row's first real token, ``irc.ops.attention``);
- NoPE layers attend to everything, their queries times 1 + attn_scale·log(1 +
  floor((position + 1) / floor_scale)) (``attn_temperature_tuning``);
- ``moe_layers`` (default every ``interleave_moe_layer_step``-th) hold a MoE: the router's
  top-k logits through a sigmoid (not renormalised) scale each chosen expert's *input*
  (``moe`` with ``weight_inputs``), plus a shared SwiGLU expert of ``intermediate_size``; the
  experts fused as ``feed_forward.experts.gate_up_proj`` [E, d, 2F] and ``down_proj`` [E, F,
  d]; the other layers a SwiGLU MLP of ``intermediate_size_mlp``.

The attention temperature reads each token's position (``position_ids``); transformers reads its
cache index instead, which a left-padded row offsets by its padding, so a padded row differs
there once (position + 1) / floor_scale reaches 1 (8,192 tokens by default).

Refused, naming config.json and the key: ``attention_bias``, an activation other than SiLU,
a partial rotary factor, ``no_rope_layers`` / ``layer_types`` / ``moe_layers`` entries that do
not fit the layers, a chunked layer without RoPE.

``llama4`` (the multimodal checkpoint, Llama-4-Scout's and Maverick's own config.json) is read
as its text model: the settings of ``text_config``, the weights under ``language_model.``
(``model.layers.*``, ``lm_head``), the vision model and its projector left aside, as
transformers' ``Llama4ForConditionalGeneration`` runs a prompt without images.
"""
from __future__ import annotations

from functools import partial

from frontends.hf.families_common import embedded_inputs
from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, int_list
from frontends.hf.families_common import _arch, _dims, _layer_types, _no, _rope, _silu
from frontends.hf.families_gemma_shared import text_model
from frontends.hf.weights import FusedExperts
from irc.yamlloc import boolean, positive_int, positive_number

DEFAULTS = {  # transformers 5.25's Llama4TextConfig
    "llama4_text": {"vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
                    "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                    "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
                    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
                    "num_experts_per_tok": 1, "num_local_experts": 16, "interleave_moe_layer_step": 1,
                    "use_qk_norm": True, "no_rope_layer_interval": 4, "attention_chunk_size": 8192,
                    "attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1,
                    "attention_bias": False, "rope_theta": 500000.0},
    "llama4": {},  # Llama4Config: its text_config holds the decoder's settings
}
CHUNKED, FULL = "chunked_attention", "full_attention"


def _uses_rope(cfg: Config, n: int) -> list[bool]:
    """``no_rope_layers`` (1: the layer has RoPE), or every ``no_rope_layer_interval``-th layer
    without, as Llama4TextConfig derives it."""
    if cfg.has("no_rope_layers"):
        flags = cfg.get("no_rope_layers", int_list)
        if len(flags) != n or any(v not in (0, 1) for v in flags):
            raise cfg.error("no_rope_layers", f"expected {n} entries of 0 (NoPE) or 1 (RoPE), got {flags!r}")
        return [bool(v) for v in flags]
    interval = cfg.get("no_rope_layer_interval", positive_int)
    return [(i + 1) % interval != 0 for i in range(n)]


def _moe_layers(cfg: Config, n: int) -> set:
    if cfg.has("moe_layers"):
        layers = cfg.get("moe_layers", int_list)
        if any(not 0 <= i < n for i in layers):
            raise cfg.error("moe_layers", f"expected layer indices in 0..{n - 1}, got {layers!r}")
        return set(layers)
    step = cfg.get("interleave_moe_layer_step", positive_int)
    return set(range(step - 1, n, step))


def _llama4(cfg: Config, name: str, model_type: str) -> Arch:
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    _no(cfg, "attention_bias")
    uses_rope = _uses_rope(cfg, n)
    chunk = cfg.get("attention_chunk_size", positive_int, None)
    types = _layer_types(cfg, n, lambda i: CHUNKED if uses_rope[i] and chunk is not None else FULL, (CHUNKED, FULL))
    for i, kind in enumerate(types):
        if kind == CHUNKED and (chunk is None or not uses_rope[i]):
            raise cfg.error("layer_types", f"layer {i} is chunked but has "
                                           f"{'no attention_chunk_size' if chunk is None else 'no RoPE'}")
    rope = _rope(cfg, dims["head_dim"], convention="interleaved")
    if rope.rotary_dim is not None:
        raise cfg.unsupported("partial_rotary_factor", cfg.raw("partial_rotary_factor"),
                              hint="Llama-4 rotates the whole head")
    moe_layers = _moe_layers(cfg, n)
    moe = {"experts": cfg.get("num_local_experts", positive_int), "top_k": cfg.get("num_experts_per_tok", positive_int),
           "d_ff": cfg.get("intermediate_size", positive_int)} if moe_layers else None
    if moe and moe["top_k"] > moe["experts"]:
        raise cfg.error("num_experts_per_tok", f"top_k {moe['top_k']} exceeds {moe['experts']} experts")
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"],
                          qk_norm="plain" if cfg.get("use_qk_norm", boolean) else False)
    layers = [LayerSpec(None, rope if uses_rope[i] else None, i in moe_layers) for i in range(n)]
    mlp = {"kind": "swiglu", "d_ff": cfg.get("intermediate_size_mlp", positive_int)}
    arch = _arch(cfg, name, model_type, dims, attention, layers, mlp, moe=moe, checkpoint="llama4_text")
    temperature = None
    if cfg.get("attn_temperature_tuning", boolean):
        temperature = (cfg.get("attn_scale", positive_number), cfg.get("floor_scale", positive_int),
                       cfg.get("max_position_embeddings", positive_int), 1)
    arch.expand = partial(expand, [chunk if kind == CHUNKED else None for kind in types], temperature)
    return arch


def expand(chunks: list, temperature, arch: Arch, origin: str):
    """The decoder through the DSL: pre-norm layers, attention (RoPE layers chunked with plain
    q/k norms; NoPE layers full with the temperature), then the MoE or the dense MLP."""
    from frontends.dsl import Model
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps = arch.attention, arch.norm_eps
    with m.at(origin):
        x = embedded_inputs(m, arch)
        for layer, spec, chunk in zip(m.layers(arch.n_layers), arch.layers, chunks):
            h = layer.rms_norm(x, "attn_norm", eps)
            rope = dsl_rope(spec.rope)
            x = x + layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=rope, chunk=chunk,
                                    qk_norm=a.qk_norm if rope else False, qk_norm_eps=eps,
                                    query_scale=temperature if rope is None else None)
            h = layer.rms_norm(x, "mlp_norm", eps)
            if spec.moe:
                moe = arch.moe
                x = x + layer.moe(h, experts=moe["experts"], top_k=moe["top_k"], d_ff=moe["d_ff"], shared_experts=1,
                                  scoring="sigmoid", norm_topk_prob=False, weight_inputs=True)
            else:
                x = x + layer.swiglu(h, d_ff=arch.mlp["d_ff"])
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


def _fused(part: str):
    def source(arch: Arch, prefix: str) -> FusedExperts:
        name = "feed_forward.experts.down_proj" if part == "down" else "feed_forward.experts.gate_up_proj"
        return FusedExperts(prefix + name, part, arch.moe["d_ff"], arch.d_model)
    return source


LAYOUTS = {"llama4_text": {**{f"mlp.w_{x}": f"feed_forward.{x}_proj.weight" for x in ("gate", "up", "down")},
                           "moe.router": "feed_forward.router.weight",
                           **{f"moe.w_{x}": _fused(x) for x in ("gate", "up", "down")},
                           **{f"moe.shared_{x}": f"feed_forward.shared_expert.{x}_proj.weight"
                              for x in ("gate", "up", "down")}}}
LAYOUTS["llama4_multimodal"] = {**LAYOUTS["llama4_text"], "_prefix": "language_model.model.layers.",
                                "_top": {"embed": "language_model.model.embed_tokens.weight",
                                         "norm": "language_model.model.norm.weight",
                                         "lm_head": "language_model.lm_head.weight"},
                                "_spare": ("vision_model.", "multi_modal_projector.")}


def _llama4_multimodal(outer: Config, name: str, model_type: str) -> Arch:
    """The text model of a multimodal ``llama4`` config.json (the module docstring)."""
    cfg = text_model(outer, model_type, DEFAULTS["llama4_text"], "llama4_text", "Llama-4")
    arch = _llama4(cfg, name, "llama4_text")
    if any(outer.has(key) for key in ("dtype", "torch_dtype")):  # the outer config's first
        arch.dtype = outer.dtype()
    arch.checkpoint = "llama4_multimodal"
    return arch


FAMILIES = {"llama4_text": _llama4, "llama4": _llama4_multimodal}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
