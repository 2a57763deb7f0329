"""LayerNorm-era and NVIDIA / Google decoders beside the families irc has
(``frontends.hf.families`` registers them): StableLM and Persimmon's LayerNorm layers,
GLM-4-9B's ``glm``, Nemotron-4's LayerNorm1P, VaultGemma and Granite with attention sinks.

=================  ==========================================================================
stablelm           StableLM (2, 3B-4E1T): LayerNorms with bias (``layer_norm_eps``), SwiGLU,
                   rotate-half RoPE on ``partial_rotary_factor`` of each head (default 0.25),
                   q/k/v biases with ``use_qkv_bias``; ``qk_layernorm``: q and k LayerNorm-ed
                   per head without bias, a weight per head (``q_layernorm.norms.{h}``:
                   Cohere's form, ``qk_norm="layer"``); ``use_parallel_residual``: x + attn(h)
                   + mlp(h) of one norm, else two sequential residual adds
persimmon          Persimmon: LayerNorms with bias, the fused ``query_key_value`` (per head
                   q | k | v) and ``dense`` with biases; ``qk_layernorm`` (default true): one
                   LayerNorm with bias over head_dim that every head of q (of k) shares, before
                   RoPE; partial rotary (default 0.5); squared-ReLU MLP with biases
                   (``dense_h_to_4h``, ``dense_4h_to_h``); ``final_layernorm``; multi-head
                   (``num_key_value_heads`` unread, as transformers leaves it)
glm                GLM-4-9B-chat-hf (``GlmForCausalLM``): ``glm4``'s attention (q/k/v biases
                   with ``attention_bias``, interleaved RoPE on ``partial_rotary_factor``,
                   default 0.5) and fused ``gate_up_proj``, without its norms after attention
                   and MLP: Llama's two RMS norms a layer
nemotron           Nemotron-4 / Minitron: LayerNorm1P, LayerNorm(x) · (1 + w) + b (``norm_eps``,
                   as primitives), q/k/v/o biases with ``attention_bias``, rotate-half RoPE on
                   ``partial_rotary_factor`` (default 0.5), the ungated squared-ReLU MLP
                   (``up_proj``, ``down_proj``; biases with ``mlp_bias``); head_dim may differ
                   from hidden_size / heads
vaultgemma         VaultGemma: Gemma 2 (``families``: (1 + w) RMS norms, √d embedding scale,
                   GeGLU, ``query_pre_attn_scalar``, both softcaps, ``layer_types`` windows)
                   without the norms after attention and MLP: ``pre_feedforward_layernorm``
                   before the MLP; ``use_bidirectional_attention`` ignored, as its config
                   class drops it and its attention is causal
granite_swa        Granite (``families_llama_like``: µP multipliers) with a learned sink logit
                   per head (``self_attn.sinks``, Layer.attention's ``sinks``: transformers'
                   sigmoid(logsumexp - sink) output scale is the extra softmax denominator
                   term), a window (``sliding_window``) on the ``layer_types``
                   "sliding_attention" layers (default: all but every 4th, from layer 0) and a
                   RoPE base per layer (``layer_rope_theta``; 0: no RoPE on that layer)
granitemoe_swa     Granite-MoE with that attention, its experts as transformers writes them
                   (``block_sparse_moe.router.weight``, ``experts.gate_up_proj`` [E, 2F, d] gate |
                   up, ``experts.down_proj`` [E, d, F]) and, with ``shared_intermediate_size``,
                   a shared SwiGLU MLP (``shared_mlp.input_linear`` gate | up, ``output_linear``)
=================  ==========================================================================

A partial rotary factor the file leaves out (neither in ``rope_parameters`` / ``rope_scaling``
nor at the top level) is the config class's default, as transformers sets it.

``apertus`` (xIELU, its learned scalars read from the checkpoint) is ``families_act_2026``.

Refused, naming config.json and the key: an activation other than the family's (SiLU for
StableLM and GLM, relu2 for Persimmon and Nemotron), a ``head_dim`` other than hidden_size /
heads where transformers' attention uses that (StableLM, Persimmon), Granite-SWA's
``partial_rotary_factor`` (its default RoPE rotates the whole head) and a ``layer_rope_theta``
that is not one number >= 0 a layer, and what the reused families refuse.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Optional

from frontends.hf import families_llama_like
from frontends.hf import families_base
from frontends.hf.config import (Arch, Attention, Config, LayerSpec, RopeSpec, attention_dims, dsl_rope, read_rope,
                                 rope_dict)
from frontends.hf.families_classic import _neox_rows
from frontends.hf.families_cohere import _gate_up
from frontends.hf.families_common import FULL, SLIDING, _arch, _dims, _layer_types, _rope, _silu, _swiglu, _windows
from frontends.hf.families_ssm import Half
from frontends.hf.weights import Stack, Tensor
from irc.yamlloc import boolean, layer_count, non_negative_int, positive_int, positive_number, size

_GRANITE = {"hidden_act": "silu", "attention_bias": False, "embedding_multiplier": 1.0, "logits_scaling": 1.0,
            "residual_multiplier": 1.0, "attention_multiplier": 1.0, "sliding_window": 128}
DEFAULTS = {  # transformers 5.25's config classes
    "stablelm": {"vocab_size": 50304, "intermediate_size": 6912, "hidden_size": 2560, "num_hidden_layers": 32,
                 "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu",
                 "max_position_embeddings": 4096, "layer_norm_eps": 1e-5, "tie_word_embeddings": False,
                 "use_qkv_bias": False, "qk_layernorm": False, "use_parallel_residual": False},
    "persimmon": {"vocab_size": 262144, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 36,
                  "num_attention_heads": 64, "hidden_act": "relu2", "max_position_embeddings": 16384,
                  "layer_norm_eps": 1e-5, "tie_word_embeddings": False, "qk_layernorm": True},
    "glm": {"vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40,
            "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "hidden_act": "silu",
            "max_position_embeddings": 131072, "rms_norm_eps": 1.5625e-7, "tie_word_embeddings": False,
            "attention_bias": True},
    "nemotron": {"vocab_size": 256000, "hidden_size": 6144, "intermediate_size": 24576, "num_hidden_layers": 32,
                 "num_attention_heads": 48, "head_dim": None, "hidden_act": "relu2", "max_position_embeddings": 4096,
                 "norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False},
    "vaultgemma": {"vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                   "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                   "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
                   "tie_word_embeddings": True, "attention_bias": False, "query_pre_attn_scalar": 256,
                   "sliding_window": 4096, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
    "granite_swa": {**_GRANITE, "vocab_size": 100352, "hidden_size": 2560, "intermediate_size": 8192,
                    "num_hidden_layers": 24, "num_attention_heads": 20, "num_key_value_heads": 4,
                    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
                    "mlp_bias": False},
    "granitemoe_swa": {**_GRANITE, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                       "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 2048,
                       "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "num_local_experts": 8,
                       "num_experts_per_tok": 2, "shared_intermediate_size": 0},
}
PARTIAL_ROTARY = {"stablelm": 0.25, "persimmon": 0.5, "glm": 0.5, "nemotron": 0.5}  # kwargs.setdefault's
GRANITE_FULL_EVERY = 4  # GraniteSWAConfig's default layer_types: layer i full iff i % 4 == 0


def _partial_rope(cfg: Config, head_dim: int, model_type: str, convention: str = "half") -> RopeSpec:
    """The RoPE, over the config class's partial rotary factor when the file gives none."""
    params, _ = rope_dict(cfg)
    if params.get("partial_rotary_factor") is None and cfg.data.get("partial_rotary_factor") is None:
        cfg = Config({**cfg.data, "partial_rotary_factor": PARTIAL_ROTARY[model_type]}, cfg.path, cfg.text,
                     cfg.defaults)
    return _rope(cfg, head_dim, convention=convention)


def _whole_heads(cfg: Config) -> tuple[int, int, int]:
    """(hidden_size, heads, head_dim = hidden_size / heads): the attention of StableLM and
    Persimmon reads no head_dim."""
    d, heads = cfg.get("hidden_size", size), cfg.get("num_attention_heads", size)
    if d % heads:
        raise cfg.error("num_attention_heads", f"hidden_size {d} is not divisible by {heads} heads")
    head_dim = cfg.get("head_dim", size, None)
    if head_dim not in (None, d // heads):
        raise cfg.error("head_dim", f"{head_dim} is not hidden_size / heads ({d // heads})",
                        hint="transformers' attention here splits hidden_size across the heads")
    return d, heads, d // heads


def _ln_arch(cfg: Config, name: str, model_type: str, d: int, attention: Attention, rope: RopeSpec, mlp: dict,
             form: dict, eps_key: str) -> Arch:
    n = cfg.get("num_hidden_layers", layer_count)
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get(eps_key, positive_number), attention=attention,
                layers=[LayerSpec(None, rope)] * n, mlp=mlp, tied=cfg.get("tie_word_embeddings", boolean),
                checkpoint=model_type)
    arch.expand = partial(_expand, form)
    return arch


def _relu2(cfg: Config, family: str) -> None:
    cfg.check("hidden_act", lambda v: v == "relu2", hint=f"{family}'s MLP here is squared ReLU (relu2)")


def _stablelm(cfg: Config, name: str, model_type: str) -> Arch:
    """StableLM: LayerNorms, SwiGLU, partial RoPE, optional per-head q/k LayerNorms."""
    d, heads, head_dim = _whole_heads(cfg)
    kv_heads = attention_dims(cfg)[2]
    _silu(cfg)
    attention = Attention("gqa", heads, kv_heads, head_dim, qkv_bias=cfg.get("use_qkv_bias", boolean),
                          qk_norm="layer" if cfg.get("qk_layernorm", boolean) else False)
    form = {"norm": "layer", "parallel": cfg.get("use_parallel_residual", boolean), "out_bias": False}
    return _ln_arch(cfg, name, model_type, d, attention, _partial_rope(cfg, head_dim, model_type), _swiglu(cfg),
                    form, "layer_norm_eps")


def _persimmon(cfg: Config, name: str, model_type: str) -> Arch:
    """Persimmon: fused q|k|v per head, shared q/k LayerNorms, squared-ReLU MLP, biases."""
    d, heads, head_dim = _whole_heads(cfg)  # multi-head: query_key_value holds 3·hidden_size rows
    _relu2(cfg, "Persimmon")
    attention = Attention("gqa", heads, heads, head_dim, qkv_bias=True, qk_norm=cfg.get("qk_layernorm", boolean))
    mlp = {"kind": "relu2", "d_ff": cfg.get("intermediate_size", positive_int), "bias": True}
    form = {"norm": "layer", "parallel": False, "out_bias": True, "attention": "persimmon"}
    return _ln_arch(cfg, name, model_type, d, attention, _partial_rope(cfg, head_dim, model_type), mlp, form,
                    "layer_norm_eps")


def _nemotron(cfg: Config, name: str, model_type: str) -> Arch:
    """Nemotron: LayerNorm1P, biases with attention_bias / mlp_bias, squared-ReLU MLP."""
    d, heads, kv_heads, head_dim = attention_dims(cfg)
    _relu2(cfg, "Nemotron")
    bias = cfg.get("attention_bias", boolean)
    attention = Attention("gqa", heads, kv_heads, head_dim, qkv_bias=bias)
    mlp = {"kind": "relu2", "d_ff": cfg.get("intermediate_size", positive_int), "bias": cfg.get("mlp_bias", boolean)}
    form = {"norm": "1p", "parallel": False, "out_bias": bias}
    return _ln_arch(cfg, name, model_type, d, attention, _partial_rope(cfg, head_dim, model_type), mlp, form,
                    "norm_eps")


def _glm(cfg: Config, name: str, model_type: str) -> Arch:
    """GLM-4-9B: Llama's layer with GLM-4's attention and fused gate|up."""
    dims = _dims(cfg)
    _silu(cfg)
    rope = _partial_rope(cfg, dims["head_dim"], model_type, convention="interleaved")
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"],
                          qkv_bias=cfg.get("attention_bias", boolean))
    return _arch(cfg, name, model_type, dims, attention, [LayerSpec(None, rope)] * dims["layers"], _swiglu(cfg),
                 checkpoint="glm")


def _vaultgemma(cfg: Config, name: str, model_type: str) -> Arch:
    """VaultGemma: Gemma 2 without the sandwich's second norms."""
    data = {k: v for k, v in cfg.data.items() if k != "use_bidirectional_attention"}  # VaultGemma drops it
    arch = families_base.FAMILIES["gemma2"](Config(data, cfg.path, cfg.text, cfg.defaults), name, model_type)
    arch.sandwich, arch.checkpoint = False, "vaultgemma"
    return arch


def _layer_ropes(cfg: Config, head_dim: int, n: int) -> list[Optional[RopeSpec]]:
    """Granite-SWA's RoPE per layer: ``layer_rope_theta`` (0: none) over the shared settings."""
    params, key = rope_dict(cfg)
    for where, value in ((f"{key}.partial_rotary_factor", params.get("partial_rotary_factor")),
                         ("partial_rotary_factor", cfg.data.get("partial_rotary_factor"))):
        if value is not None:
            raise cfg.unsupported(where, value, hint="Granite rotates the whole head (its default RoPE ignores "
                                                     "the factor)")
    original = cfg.get("max_position_embeddings", positive_int, None)
    if not cfg.has("layer_rope_theta"):
        return [read_rope(cfg, head_dim, params, key, original_max=original)] * n
    thetas = cfg.raw("layer_rope_theta")
    if not isinstance(thetas, list) or len(thetas) != n or not all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0 for t in thetas):
        raise cfg.error("layer_rope_theta", f"expected {n} numbers >= 0, one a layer (0: no RoPE); got {thetas!r}")
    return [read_rope(cfg, head_dim, {**params, "rope_theta": theta}, key, original_max=original) if theta else None
            for theta in thetas]


def _granite_swa(cfg: Config, name: str, model_type: str) -> Arch:
    """Granite(-MoE) with attention sinks, per-layer windows and per-layer RoPE bases."""
    moe = model_type == "granitemoe_swa"
    arch = families_llama_like.FAMILIES["granite"](cfg, name, "granitemoe" if moe else "granite")
    n = arch.n_layers
    types = _layer_types(cfg, n, lambda i: SLIDING if i % GRANITE_FULL_EVERY else FULL)
    ropes = _layer_ropes(cfg, arch.attention.head_dim, n)
    arch.layers = [LayerSpec(window, rope, moe) for window, rope in zip(_windows(cfg, types), ropes)]
    shared = cfg.get("shared_intermediate_size", non_negative_int) if moe else 0
    if shared:
        arch.moe.update(shared_experts=1, shared_d_ff=shared)
    arch.model_type, arch.checkpoint, arch.expand = model_type, model_type, _expand_sinks
    return arch


# ---- the decoders through the DSL ----------------------------------------------------------

def _as(m, t, like, name: str):
    """``t`` in ``like``'s float type (a bfloat16 checkpoint's weight beside f32 activations)."""
    return t if t.dtype == like.dtype else m.emit("cast", [t], {"to": str(like.dtype)}, name)[0]


def _norm_1p(m, x, pname: str, eps: float):
    """Nemotron's LayerNorm1P as primitives: LayerNorm(x) · (1 + ``@pname``) + ``@pname.bias``."""
    d = m._features(x)
    normed = m.plain_layer_norm(x, f"{pname}_plain", eps)
    weight = _as(m, m.param(pname, (d,)), normed, f"{pname}_f32")
    bias = _as(m, m.param(f"{pname}.bias", (d,)), normed, f"{pname}.bias_f32")
    one = m.emit("constant", [], {"value": 1.0}, f"{pname}_one")[0]
    scale = m.emit("add", [weight, one], None, f"{pname}_scale")[0]
    return m.add(m.mul(normed, scale, f"{pname}_scaled"), bias, f"{pname}_out")


def _persimmon_attention(layer, x, a: Attention, rope, eps: float):
    """Persimmon's multi-head attention: q, k, v with biases; q and k each LayerNorm-ed over
    head_dim by one LayerNorm with bias the heads share (``attn.q_norm``, ``attn.k_norm``
    [D] and their biases) before RoPE; ``attn.wo`` with bias ``attn.bo``."""
    from frontends.dsl_rope import emit_rope

    m, p, i = layer.model, layer.prefix, layer.index
    d, heads, dim = m._features(x), a.heads, a.head_dim
    lead = list(x.shape[:-1])
    layer._check_rope(rope, dim, "head_dim")

    def projected(which: str):
        weight, bias = m.param(f"{p}attn.w{which}", (heads * dim, d)), m.param(f"{p}attn.b{which}", (heads * dim,))
        t = m.emit("linear", [x, weight, bias], None, f"{p}{which}")[0]
        if which == "v" or not a.qk_norm:
            return t
        split = m.emit("reshape", [t], {"shape": lead + [heads, dim]}, f"{p}{which}_heads")[0]
        normed = m.norm(split, f"{p}attn.{which}_norm", "layer", eps)
        return m.emit("reshape", [normed], {"shape": lead + [heads * dim]}, f"{p}{which}_normed")[0]

    mask, positions = m._context()
    q = emit_rope(m, projected("q"), positions, rope, heads, dim, f"{p}q_rope")
    k = emit_rope(m, projected("k"), positions, rope, heads, dim, f"{p}k_rope")
    v = projected("v")
    past_key, past_value = m._past(i, heads, dim, dim)
    attrs = {"heads": heads, "kv_heads": heads, "head_dim": dim, "v_head_dim": None, "causal": True, "window": None,
             "softcap": None, "scale": None}
    out, present_key, present_value = m.emit("attention", [q, k, v, mask, past_key, past_value], attrs,
                                             [f"{p}attn", f"present.{i}.key", f"present.{i}.value"])
    m._presents += [present_key.value, present_value.value]
    layer._note_attention("mha", heads, heads, dim, dim, None, None, None, rope, qkv_bias=True,
                          qk_norm="layer" if a.qk_norm else False)
    wo, bo = m.param(f"{p}attn.wo", (d, heads * dim)), m.param(f"{p}attn.bo", (d,))
    return m.emit("linear", [out, wo, bo], None, f"{p}attn_out")[0]


def _mlp(layer, h, mlp: dict):
    if mlp["kind"] == "relu2":
        return layer.relu2_mlp(h, d_ff=mlp["d_ff"], bias=mlp["bias"])
    return layer.swiglu(h, d_ff=mlp["d_ff"])


def _expand(form: dict, arch: Arch, origin: str):
    """StableLM, Persimmon and Nemotron through the DSL: pre-norm layers of LayerNorms with
    bias (``form["norm"]`` "layer") or LayerNorm1P ("1p"); sequential residual adds, or with
    ``form["parallel"]`` x + attn(h) + mlp(h) of one norm; Persimmon's attention where
    ``form["attention"]`` says so; the output projection's bias with ``form["out_bias"]``."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps = arch.attention, arch.norm_eps

    def norm(t, name: str):
        return _norm_1p(m, t, name, eps) if form["norm"] == "1p" else m.layer_norm(t, name, eps)

    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            rope = dsl_rope(spec.rope)
            h = norm(x, f"{layer.prefix}attn_norm")
            if form.get("attention") == "persimmon":
                y = _persimmon_attention(layer, h, a, rope, eps)
            else:
                y = layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=rope,
                                    qkv_bias=a.qkv_bias, out_bias=form["out_bias"], qk_norm=a.qk_norm,
                                    qk_norm_eps=eps)
            if form["parallel"]:
                x = x + m.add(y, _mlp(layer, h, arch.mlp), f"{layer.prefix}branches")
                continue
            x = x + y
            x = x + _mlp(layer, norm(x, f"{layer.prefix}mlp_norm"), arch.mlp)
        m.logits(norm(x, "norm"), tied=arch.tied)
    return m.graph


def _expand_sinks(arch: Arch, origin: str):
    """Granite-SWA through the DSL: the shared decoder (µP multipliers, per-layer windows and
    RoPE, MoE with a shared MLP) with a sink logit per head in every attention."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps = arch.attention, arch.norm_eps

    def residual(t):
        return t if arch.residual_scale is None else t * arch.residual_scale

    with m.at(origin):
        x = m.embed(m.input_ids(), scale=arch.embedding_scale)
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            h = layer.rms_norm(x, "attn_norm", eps)
            x = x + residual(layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim,
                                             rope=dsl_rope(spec.rope), window=spec.window, scale=a.scale, sinks=True))
            h = layer.rms_norm(x, "mlp_norm", eps)
            x = x + residual(layer.moe(h, **arch.moe) if spec.moe else layer.swiglu(h, d_ff=arch.mlp["d_ff"]))
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied, scale=arch.logits_scale)
    return m.graph


# ---- checkpoint names -------------------------------------------------------------------

def _per_head(which: str):
    """StableLM's per-head q/k LayerNorm weights, ``{which}_layernorm.norms.{h}.weight``, stacked [H, D]."""
    def source(arch: Arch, prefix: str) -> Stack:
        heads = arch.attention.heads if which == "q" else arch.attention.kv_heads
        return Stack([Tensor(f"{prefix}self_attn.{which}_layernorm.norms.{h}.weight") for h in range(heads)])
    return source


def _half(name: str, second: bool):
    """Half of a fused gate | up tensor (``families_ssm.Half``: 2-D, or per expert [E, 2F, d])."""
    return lambda arch, prefix: Half(prefix + name, second)


_NORM_BIASES = {"attn_norm.bias": "input_layernorm.bias", "mlp_norm.bias": "post_attention_layernorm.bias"}
_TOP_BIAS = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "norm.bias": "model.norm.bias",
             "lm_head": "lm_head.weight"}
_SINKS = {"attn.sinks": "self_attn.sinks"}
LAYOUTS = {
    "stablelm": {**_NORM_BIASES, "attn.q_norm": _per_head("q"), "attn.k_norm": _per_head("k"), "_top": _TOP_BIAS},
    "persimmon": {**_NORM_BIASES,
                  **{f"attn.w{x}": _neox_rows(i, "self_attn.query_key_value")("weight") for i, x in enumerate("qkv")},
                  **{f"attn.b{x}": _neox_rows(i, "self_attn.query_key_value")("bias") for i, x in enumerate("qkv")},
                  **{f"attn.{x}_norm{s}": f"self_attn.{x}_layernorm.{w}" for x in "qk"
                     for s, w in (("", "weight"), (".bias", "bias"))},
                  "attn.wo": "self_attn.dense.weight", "attn.bo": "self_attn.dense.bias",
                  "mlp.w_up": "mlp.dense_h_to_4h.weight", "mlp.b_up": "mlp.dense_h_to_4h.bias",
                  "mlp.w_down": "mlp.dense_4h_to_h.weight", "mlp.b_down": "mlp.dense_4h_to_h.bias",
                  "_top": {**_TOP_BIAS, "norm": "model.final_layernorm.weight",
                           "norm.bias": "model.final_layernorm.bias"}},
    "glm": {"mlp.w_gate": _gate_up(0), "mlp.w_up": _gate_up(1)},
    "nemotron": {**_NORM_BIASES, "attn.bo": "self_attn.o_proj.bias", "mlp.b_up": "mlp.up_proj.bias",
                 "mlp.b_down": "mlp.down_proj.bias", "_top": _TOP_BIAS},
    "vaultgemma": {"mlp_norm": "pre_feedforward_layernorm.weight"},
    "granite_swa": dict(_SINKS),
    "granitemoe_swa": {**_SINKS, "moe.router": "block_sparse_moe.router.weight",
                       "moe.w_gate": _half("block_sparse_moe.experts.gate_up_proj", False),
                       "moe.w_up": _half("block_sparse_moe.experts.gate_up_proj", True),
                       "moe.w_down": "block_sparse_moe.experts.down_proj",
                       "moe.shared_gate": _half("shared_mlp.input_linear.weight", False),
                       "moe.shared_up": _half("shared_mlp.input_linear.weight", True),
                       "moe.shared_down": "shared_mlp.output_linear.weight"},
}
FAMILIES = {"stablelm": _stablelm, "persimmon": _persimmon, "glm": _glm, "nemotron": _nemotron,
            "vaultgemma": _vaultgemma, "granite_swa": _granite_swa, "granitemoe_swa": _granite_swa}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
