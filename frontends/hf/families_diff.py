"""DiffLlama's differential attention (``frontends.hf.families`` registers it), built by its own
loop through the DSL from attention ops irc has.

=================  ==========================================================================
diffllama          DiffLlama (transformers' ``DiffLlamaForCausalLM``): Llama layers whose
                   attention is differential: (softmax(Q₁K₁ᵀ) − λ·softmax(Q₂K₂ᵀ))·V per head
                   pair, as transformers 5.25 computes it
=================  ==========================================================================

How transformers computes it, and how irc does the same with one ``attention`` op:
transformers runs two attentions with the same q and k (H heads over K kv heads, RoPE), the
first over values V₁ = the first K/2 kv heads of v repeated twice, the second over V₂ = the
last K/2 repeated twice, and concatenates the two outputs per head: [B, T, H, 2D]. The softmax
maps of the two calls are the same, so irc makes one attention whose values are V₁ | V₂ per kv
head (``v_head_dim`` 2D; the cache holds those values, a per-token rearrangement of v). Then,
as transformers does, the heads split into two halves: out = first − λ·second ([B, T, H/2, 2D]),
with λ = exp(Σ λ_q1·λ_k1) − exp(Σ λ_q2·λ_k2) + λ_init (λ_init = 0.8 − 0.6·exp(−0.3·layer),
float32), an RMS norm without weight over the 2D features (eps ``rms_norm_eps``), times
(1 − λ_init), flattened to H·D for ``o_proj``. q/k/v/o biases with ``attention_bias``.

Refused, naming config.json and the key: an odd ``num_key_value_heads`` or
``num_attention_heads`` (the two halves), ``attention_dropout`` > 0 (transformers raises), an
activation other than SiLU.
"""
from __future__ import annotations

import math

from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope
from frontends.hf.families_common import _arch, _dims, _rope
from irc.yamlloc import positive_int

DEFAULTS = {  # transformers 5.25's DiffLlamaConfig
    "diffllama": {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                  "num_attention_heads": 32, "hidden_act": "silu", "max_position_embeddings": 2048,
                  "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
                  "attention_dropout": 0.0},
}


def lambda_init(layer: int) -> float:
    """transformers' ``lambda_init_fn``."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


def _diffllama(cfg: Config, name: str, model_type: str) -> Arch:
    dims = _dims(cfg)
    cfg.check("hidden_act", lambda v: v == "silu", hint="DiffLlama's MLP is SwiGLU (silu)")
    cfg.check("attention_dropout", lambda v: not v, hint="transformers' DiffLlama refuses attention dropout")
    for key, count in (("num_key_value_heads", dims["kv_heads"]), ("num_attention_heads", dims["heads"])):
        if count % 2:
            raise cfg.error(key, f"{count} is odd: differential attention pairs the two halves of the heads")
    bias = bool(cfg.raw("attention_bias"))
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qkv_bias=bias, out_bias=bias)
    layers = [LayerSpec(None, _rope(cfg, dims["head_dim"]))] * dims["layers"]
    mlp = {"kind": "swiglu", "d_ff": cfg.get("intermediate_size", positive_int)}
    arch = _arch(cfg, name, model_type, dims, attention, layers, mlp, checkpoint="diffllama")
    arch.expand = expand
    return arch


def _paired_values(m, v, kv_heads: int, head_dim: int, p: str):
    """v [B, T, K·D] -> [B, T, K·2D]: kv head j holds v's head j mod K/2 then head K/2 + j mod K/2."""
    lead = tuple(v.shape[:-1])
    half = kv_heads // 2
    split = m.emit("reshape", [v], {"shape": list(lead + (2, half, head_dim))}, f"{p}v_halves")[0]
    first = m.emit("slice", [split], {"axis": -3, "start": 0, "end": 1}, f"{p}v_first")[0]
    second = m.emit("slice", [split], {"axis": -3, "start": 1, "end": 2}, f"{p}v_second")[0]
    pair = m.emit("concat", [first, second], {"axis": -1}, f"{p}v_pair")[0]
    both = m.emit("concat", [pair, pair], {"axis": -3}, f"{p}v_repeated")[0]
    return m.emit("reshape", [both], {"shape": list(lead + (kv_heads * 2 * head_dim,))}, f"{p}v_paired")[0]


def _lambda(m, p: str, head_dim: int, init: float):
    """λ [1] = exp(Σ λ_q1·λ_k1) − exp(Σ λ_q2·λ_k2) + λ_init, from ``attn.lambda_*`` [D]."""
    terms = []
    for n in (1, 2):
        q, k = (m.param(f"{p}attn.lambda_{x}{n}", (head_dim,)) for x in "qk")
        product = m.emit("mul", [q, k], None, f"{p}lambda_{n}_product")[0]
        total = m.emit("reduce_sum", [product], {"axes": [-1], "keepdims": True}, f"{p}lambda_{n}_sum")[0]
        terms.append(m.emit("exp", [total], None, f"{p}lambda_{n}")[0])
    difference = m.emit("sub", terms, None, f"{p}lambda_difference")[0]
    return m.emit("add", [difference, m.emit("constant", [], {"value": init}, f"{p}lambda_init")[0]], None,
                  f"{p}lambda_full")[0]


def _differential_attention(m, layer, h, a: Attention, rope, eps: float):
    """The layer's attention (the module docstring) -> [B, T, d]."""
    p, i = layer.prefix, layer.index
    heads, kv_heads, head_dim = a.heads, a.kv_heads, a.head_dim
    d = m._features(h)
    projected = []
    for x, rows in (("q", heads * head_dim), ("k", kv_heads * head_dim), ("v", kv_heads * head_dim)):
        w = m.param(f"{p}attn.w{x}", (rows, d))
        b = m.param(f"{p}attn.b{x}", (rows,)) if a.qkv_bias else None
        projected.append(m.emit("linear", [h, w, b], None, f"{p}{x}")[0])
    q, k, v = projected
    q, k = layer._rotate(q, k, rope, (heads, kv_heads, head_dim))
    values = _paired_values(m, v, kv_heads, head_dim, p)
    mask, _ = m._context()
    past_key, past_value = m._past(i, kv_heads, head_dim, 2 * head_dim)
    attrs = {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "v_head_dim": 2 * head_dim, "causal": True,
             "window": None, "softcap": None, "scale": None}
    out, *presents = m.emit("attention", [q, k, values, mask, past_key, past_value, None, None, None], attrs,
                            [f"{p}attn", f"present.{i}.key", f"present.{i}.value"])
    m._presents += [present.value for present in presents]
    kind = "mha" if kv_heads == heads else "mqa" if kv_heads == 1 else "gqa"
    layer._note_attention(kind, heads, kv_heads, head_dim, 2 * head_dim, None, None, None, rope)
    lead = tuple(out.shape[:-1])
    halves = m.emit("reshape", [out], {"shape": list(lead + (2, heads // 2, 2 * head_dim))}, f"{p}attn_halves")[0]
    first, second = (m.emit("slice", [halves], {"axis": -3, "start": n, "end": n + 1}, f"{p}attn_half_{n}")[0]
                     for n in (0, 1))
    init = lambda_init(i)
    weighted = m.emit("mul", [second, _lambda(m, p, head_dim, init)], None, f"{p}attn_half_1_weighted")[0]
    diff = m.emit("sub", [first, weighted], None, f"{p}attn_differential")[0]
    normed = m.scale(m.plain_rms_norm(diff, f"{p}attn_group_norm", eps), 1.0 - init, f"{p}attn_group_scaled")
    flat = m.emit("reshape", [normed], {"shape": list(lead + (heads * head_dim,))}, f"{p}attn_flat")[0]
    wo = m.param(f"{p}attn.wo", (d, heads * head_dim))
    bo = m.param(f"{p}attn.bo", (d,)) if a.out_bias else None
    return m.emit("linear", [flat, wo, bo], None, f"{p}attn_out")[0]


def expand(arch: Arch, origin: str):
    """x = embed(ids); per layer x + diff_attn(rms(x)), x + swiglu(rms(x)); the final norm and head."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps = arch.norm_eps
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            h = layer.rms_norm(x, "attn_norm", eps)
            x = x + _differential_attention(m, layer, h, arch.attention, dsl_rope(spec.rope), eps)
            x = x + layer.swiglu(layer.rms_norm(x, "mlp_norm", eps), d_ff=arch.mlp["d_ff"])
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


LAYOUTS = {"diffllama": {f"attn.lambda_{x}{n}": f"self_attn.lambda_{x}{n}" for x in "qk" for n in (1, 2)}}
FAMILIES = {"diffllama": _diffllama}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
