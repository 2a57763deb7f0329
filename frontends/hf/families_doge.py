"""Doge (``model_type`` doge): dynamic-mask attention (DMA) and a SwiGLU MLP; its cross-domain
MoE (``is_moe``) is refused (below).

Layer i (transformers' ``DogeDecoderLayer``)::

    x = input_residual * x + attn(rms(x));   x = post_attention_residual * x + mlp(rms(x))

DMA (``DogeAttention``): q and k RMS-normed per head (weights [head_dim]), RoPE, and the
scores get a bias per key and kv head, dt = exp(A · softplus(dt_proj(v))) (v the key's value
vector, all kv heads' concatenated): scores = q·k / √hd + dt. dt depends on the key alone, so
irc carries it in the key cache: each key head gets one more channel, dt·√hd, and each query
head a 1 there; the attention op (head_dim hd + 1, scale hd^-1/2) then computes q·k / √hd +
dt exactly, and a cached key keeps its bias. The values get a zero channel too (one head size
for keys and values, the cache layout onnxruntime-genai allocates), dropped from the output. transformers keeps, past
``keep_window_size`` keys, only each query's keep_window_size keys of largest dt; irc reads
configs whose ``keep_window_size`` is at least ``max_position_embeddings`` (within the
model's context the selection keeps every key) and refuses the others, naming the key.

``is_moe`` (CDMoE, ``DogeCDMoE``) is refused: transformers views router_gate's output
[B, T, 2·nk] as [2, B·T, nk] (``router_logits = self.router_gate(hidden_states).view(2, bsz *
seq_len, -1)``), so row n of the x keys is token n // 2's x or y half (by parity) and of the y
keys token (B·T + n) // 2's: a token's experts are chosen from other tokens' router logits,
padded tokens' included. Its output on a padded batch then depends on the padded rows'
hidden states, which transformers' eager attention sets (a uniform average over masked keys)
and irc leaves undefined; one token at a time (decode) the keys are the token's own. Refused too, naming the key:
biases, activations other than SiLU, RoPE types other than default.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Optional

from frontends.dsl import Model
from frontends.dsl_rope import emit_rope
from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, read_rope, rope_dict
from irc.yamlloc import boolean, layer_count, positive_int, positive_number, size

DEFAULTS = {  # transformers 5.25's DogeConfig
    "doge": {
        "vocab_size": 32768, "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 32,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "max_position_embeddings": 2048,
        "num_attention_heads": 8, "num_key_value_heads": None, "attention_bias": False, "mlp_bias": False,
        "sliding_window": None, "keep_window_size": 2048, "is_moe": False, "num_experts": 16384,
        "num_experts_per_tok": 64, "norm_topk_prob": False},
}

LAYOUTS = {
    "doge": {"attn.dt_proj": "self_attn.dt_proj.weight", "attn.A": "self_attn.A",
             "input_residual": "input_residual", "post_attention_residual": "post_attention_residual"},
}


@dataclass
class Doge:
    rope: object
    d_ff: int
    window: Optional[int]


def _doge(cfg: Config, name: str, model_type: str) -> Arch:
    """Doge: DMA attention, a dense or CDMoE MLP."""
    cfg.check("hidden_act", lambda v: v == "silu", hint="irc reads Doge's SiLU MLPs")
    for key in ("attention_bias", "mlp_bias"):
        cfg.check(key, lambda v: not v, hint="irc's Doge layers have no such bias")
    d, n = cfg.get("hidden_size", size), cfg.get("num_hidden_layers", layer_count)
    heads = cfg.get("num_attention_heads", size)
    kv_heads = cfg.get("num_key_value_heads", size, None) or heads
    if heads % kv_heads:
        raise cfg.error("num_key_value_heads", f"{heads} heads are not divisible by {kv_heads} kv heads")
    head_dim = cfg.get("head_dim", positive_int, None) or d // heads
    context = cfg.get("max_position_embeddings", positive_int)
    cfg.check("keep_window_size", lambda v: isinstance(v, int) and v >= context,
              hint=f"past keep_window_size keys transformers keeps each query's top keys by dt; irc reads Doge "
                   f"where that never happens within max_position_embeddings ({context})")
    params, key = rope_dict(cfg)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise cfg.unsupported(f"{key}.rope_type", kind, hint="irc reads Doge's default RoPE only")
    rope = read_rope(cfg, head_dim, params, key)
    window = cfg.get("sliding_window", positive_int, None)
    cfg.check("is_moe", lambda v: not v, hint=(
        "transformers' DogeCDMoE views router_gate's output [B, T, 2 x nk] as [2, B x T, nk], so a token's "
        "experts are chosen by other tokens' router logits (padding included): a batch's output depends on its "
        "padded rows' values, which irc does not define as transformers' eager attention does"))
    settings = Doge(rope=rope, d_ff=cfg.get("intermediate_size", positive_int), window=window)
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=Attention("gqa", heads, kv_heads, head_dim, scale=head_dim ** -0.5),
                layers=[LayerSpec(window, rope) for _ in range(n)],
                mlp={"kind": "swiglu", "d_ff": settings.d_ff}, tied=cfg.get("tie_word_embeddings", boolean),
                checkpoint="doge", expand=partial(_doge_graph, settings))


def _per_head(m: Model, x, heads: int, width: int, name: str):
    return m.emit("reshape", [x], {"shape": [x.shape[0], x.shape[1], heads, width]}, name)[0]


def dynamic_mask_attention(layer, h, a: Attention, s: Doge, eps: float):
    """DMA (module docstring): output [B, T, d]."""
    m, p, i = layer.model, layer.prefix, layer.index
    d, hd, kv = m._features(h), a.head_dim, a.kv_heads
    mask, positions = m._context()
    projected = {}
    for which, count in (("q", a.heads), ("k", kv)):
        t = m.emit("linear", [h, m.param(f"{p}attn.w{which}", (count * hd, d)), None], None, f"{p}{which}")[0]
        t = m.emit("rms_norm", [_per_head(m, t, count, hd, f"{p}{which}_heads"),
                                m.param(f"{p}attn.{which}_norm", (hd,))], {"eps": float(eps), "offset": 0.0},
                   f"{p}{which}_normed")[0]
        t = m.emit("reshape", [t], {"shape": [h.shape[0], h.shape[1], count * hd]}, f"{p}{which}_flat")[0]
        projected[which] = emit_rope(m, t, positions, dsl_rope(s.rope), count, hd, f"{p}{which}_rope")
    v = m.emit("linear", [h, m.param(f"{p}attn.wv", (kv * hd, d)), None], None, f"{p}v")[0]
    dt = m.emit("linear", [v, m.param(f"{p}attn.dt_proj", (kv, kv * hd)), None], None, f"{p}dt_in")[0]
    dt = m.emit("softplus", [dt], None, f"{p}dt_softplus")[0]
    dt = m.emit("exp", [m.emit("mul", [dt, m.param(f"{p}attn.A", (kv,))], None, f"{p}dt_scaled")[0]], None,
                f"{p}dt")[0]
    bias = m.emit("mul", [dt, m.emit("constant", [], {"value": float(hd ** 0.5)}, f"{p}dt_unscale")[0]], None,
                  f"{p}dt_key")[0]
    bias = m.emit("reshape", [bias], {"shape": [h.shape[0], h.shape[1], kv, 1]}, f"{p}dt_key_heads")[0]
    key = m.emit("concat", [_per_head(m, projected["k"], kv, hd, f"{p}k_heads"), bias], {"axis": -1},
                 f"{p}k_biased")[0]
    q = _per_head(m, projected["q"], a.heads, hd, f"{p}q_heads")
    one = m.emit("constant", [], {"value": 1.0}, f"{p}q_one")[0]
    ones = m.emit("expand", [one], {"shape": list(q.shape[:-1]) + [1]}, f"{p}q_ones")[0]
    q = m.emit("concat", [q, ones], {"axis": -1}, f"{p}q_biased")[0]
    q = m.emit("reshape", [q], {"shape": [h.shape[0], h.shape[1], a.heads * (hd + 1)]}, f"{p}q_ext")[0]
    key = m.emit("reshape", [key], {"shape": [h.shape[0], h.shape[1], kv * (hd + 1)]}, f"{p}k_ext")[0]
    value = m.emit("concat", [_per_head(m, v, kv, hd, f"{p}v_heads"), m.emit(
        "expand", [m.emit("constant", [], {"value": 0.0}, f"{p}v_zero")[0]], {"shape": list(bias.shape)},
        f"{p}v_zeros")[0]], {"axis": -1}, f"{p}v_padded")[0]
    value = m.emit("reshape", [value], {"shape": [h.shape[0], h.shape[1], kv * (hd + 1)]}, f"{p}v_ext")[0]
    past_key, past_value = m._past(i, kv, hd + 1, hd + 1)
    attrs = {"heads": a.heads, "kv_heads": kv, "head_dim": hd + 1, "v_head_dim": None, "causal": True,
             "window": s.window, "softcap": None, "scale": a.scale}
    out, present_key, present_value = m.emit("attention", [q, key, value, mask, past_key, past_value], attrs,
                                             [f"{p}attn_padded", f"present.{i}.key", f"present.{i}.value"])
    m._presents += [present_key.value, present_value.value]
    layer._note_attention("mha" if kv == a.heads else "gqa", a.heads, kv, hd + 1, hd + 1, s.window, None, a.scale,
                          dsl_rope(s.rope))
    out = m.emit("slice", [_per_head(m, out, a.heads, hd + 1, f"{p}attn_heads")], {"axis": -1, "start": 0,
                                                                                   "end": hd}, f"{p}attn_unpadded")[0]
    out = m.emit("reshape", [out], {"shape": [h.shape[0], h.shape[1], a.heads * hd]}, f"{p}attn")[0]
    return m.emit("linear", [out, m.param(f"{p}attn.wo", (d, a.heads * hd)), None], None, f"{p}attn_out")[0]


def _doge_graph(s: Doge, arch: Arch, origin: str):
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps, d = arch.norm_eps, arch.d_model
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer in m.layers(arch.n_layers):
            p = layer.prefix
            a = dynamic_mask_attention(layer, layer.rms_norm(x, "attn_norm", eps), arch.attention, s, eps)
            x = m.add(m.mul(x, m.param(f"{p}input_residual", (d,)), f"{p}attn_residual_scaled"), a,
                      f"{p}attn_residual")
            h = layer.rms_norm(x, "mlp_norm", eps)
            f = layer.swiglu(h, s.d_ff)
            x = m.add(m.mul(x, m.param(f"{p}post_attention_residual", (d,)), f"{p}mlp_residual_scaled"), f,
                      f"{p}mlp_residual")
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


FAMILIES = {"doge": _doge}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS", "dynamic_mask_attention"]
