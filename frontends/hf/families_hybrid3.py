"""More 2026 hybrids of mixers irc has (``frontends.hf.families`` registers them).

=================  ==========================================================================
lara_mini          Lara-Mini: by ``layer_types`` ("linear_attention" | "sliding_attention" |
                   "full_attention"; default the pattern delta, sliding, delta, full, sliding)
                   Qwen3.5's gated DeltaNet (split projections; the checkpoint's fused
                   ``in_proj`` rows q | k | v | z | b | a read as the four) or Qwen-3 attention
                   (per-head q/k norms, no output gate) with RoPE and a window on the sliding
                   layers only (the full ones NoPE); every layer then a MoE: softmax top-k
                   (renormalised where ``norm_topk_prob``) plus a shared SwiGLU expert added
                   whole, without a gate
bailing_hybrid     Ling 3 (BailingHybrid): every ``layer_group_size``-th layer (or by
                   ``layer_types``) DeepSeek-V3's MLA (direct or low-rank q, interleaved RoPE)
                   with each head's output times sigmoid(``g_proj`` · x), the others Kimi Delta
                   Attention (``bailing_delta``: one ``f_proj`` forget gate per channel, the
                   gated norm with sigmoid); a SwiGLU on the ``mlp_layer_types`` "dense" layers
                   (default the first ``first_k_dense_replace``), else DeepSeek-V3's MoE
                   (sigmoid scores, selection bias, groups scored by their top two, shared
                   experts, ``routed_scaling_factor``)
=================  ==========================================================================

Every RMS norm is plain w·x (Helium's), the gated norm after the DeltaNet norm(o)·w·silu(z)
per value head. RoPE of type default rotates the whole head (Lara-Mini's rotary ignores
``partial_rotary_factor``). Refused, naming config.json and the key: a ``layer_types`` entry
other than the three kinds, value heads that are not a multiple of key heads,
``attention_bias``, an activation other than SiLU, ``num_experts`` 0.

Ling's safe forget gate (``kda_safe_gate``, default) decays by lower·sigmoid(exp(A_log)·(f +
dt_bias)) per channel; the ``gated_delta_rule`` op decays by -exp(A')·softplus(a), so the graph
gives it A' = log(-lower) and a = the inverse softplus of the sigmoid, log(exp(s) - 1) (the
``log`` op; exp(s) - 1 floored at 1e-30: the log decay off by about |lower|·1e-7 at most, the
rounding of exp(s) - 1 near s = 0). Without the safe
gate the op takes f, A_log and dt_bias as they are. ``tie_word_embeddings`` is ignored, as
transformers' BailingHybridForCausalLM ties nothing (``_tied_weights_keys`` empty): the head is
``lm_head.weight``. onnxruntime-genai cannot allocate the MLA layers' caches (keys nope + rope
wide, values v: two widths). Refused besides: nonzero SwiGLU clipping limits
(``expert_swiglu_limit_list``, ``share_expert_swiglu_limit_list``), ``num_key_value_heads``
other than the heads, a ``kda_lower_bound`` that is not negative, experts that do not split into
``num_expert_group`` groups.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Optional

from frontends.hf.config import (Arch, Attention, Config, LayerSpec, attention_dims, dsl_rope, layer_types,
                                 read_rope, rope_dict, string_list)
from frontends.hf.families_delta import delta_config
from frontends.hf.families_kimi import Joined
from frontends.hf.weights import FusedExperts, Rows, Source, Stack, Tensor
from irc.ops.attention import mla_softmax_scale
from irc.yamlloc import boolean, layer_count, non_negative_int, number, positive_int, positive_number

DELTA, SLIDING, FULL = "linear_attention", "sliding_attention", "full_attention"
DEFAULTS = {  # transformers 5.25's config classes
    "lara_mini": {"vocab_size": 151936, "hidden_size": 1024, "num_hidden_layers": 34, "num_attention_heads": 16,
                  "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
                  "hidden_act": "silu", "tie_word_embeddings": True, "attention_bias": False, "sliding_window": 512,
                  "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                  "linear_num_key_heads": 8, "linear_num_value_heads": 16, "num_experts_per_tok": 4,
                  "num_experts": 128, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                  "norm_topk_prob": True, "rope_theta": 10000.0},
    "bailing_hybrid": {"vocab_size": 157184, "hidden_size": 2560, "intermediate_size": 6144,
                       "moe_intermediate_size": 768, "num_hidden_layers": 42, "num_attention_heads": 32,
                       "num_experts": 512, "num_experts_per_token": 8, "num_shared_experts": 1, "num_expert_group": 8,
                       "topk_group": 4, "routed_scaling_factor": 2.5, "moe_renormalize": True,
                       "first_k_dense_replace": 2, "hidden_act": "silu", "rms_norm_eps": 1e-6,
                       "tie_word_embeddings": False, "attention_bias": False, "kv_lora_rank": 512, "q_lora_rank": None,
                       "num_key_value_heads": 32,
                       "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "rope_theta": 6e6,
                       "head_dim": 128, "short_conv_kernel_size": 4, "layer_group_size": 6, "kda_safe_gate": True,
                       "kda_lower_bound": -5.0},
}
LARA_PATTERN = (DELTA, SLIDING, DELTA, FULL, SLIDING)


def _lara(cfg: Config, name: str, model_type: str) -> Arch:
    cfg.check("hidden_act", lambda v: v == "silu", hint="Lara-Mini's experts and convolution use SiLU")
    cfg.check("attention_bias", lambda v: not v, hint="irc's Lara-Mini attention has no bias")
    d, heads, kv_heads, head_dim = attention_dims(cfg)
    n = cfg.get("num_hidden_layers", layer_count)
    kinds = (layer_types(cfg, n, (DELTA, SLIDING, FULL), "Lara-Mini's") if cfg.has("layer_types")
             else [LARA_PATTERN[i % len(LARA_PATTERN)] for i in range(n)])
    params, key = rope_dict(cfg)
    if params.get("rope_type", params.get("type", "default")) == "default":
        params["partial_rotary_factor"] = 1.0  # the default rotary reads head_dim alone
    rope = read_rope(cfg, head_dim, params, key) if SLIDING in kinds else None
    if rope is not None and rope.rotary_dim is not None:
        raise cfg.unsupported(f"{key}.partial_rotary_factor", params.get("partial_rotary_factor"),
                              hint="Lara-Mini's attention rotates the whole head")
    window = cfg.get("sliding_window", positive_int) if SLIDING in kinds else None
    mixers = {DELTA: "gated_delta", SLIDING: "attention", FULL: "attention"}
    layers = [LayerSpec(window if kind == SLIDING else None, rope if kind == SLIDING else None, True,
                        mixer=mixers[kind]) for kind in kinds]
    experts = cfg.get("num_experts", positive_int)
    top_k = cfg.get("num_experts_per_tok", positive_int)
    if top_k > experts:
        raise cfg.error("num_experts_per_tok", f"top_k {top_k} exceeds {experts} experts (num_experts)")
    moe = {"experts": experts, "top_k": top_k, "d_ff": cfg.get("moe_intermediate_size", positive_int),
           "norm_topk_prob": cfg.get("norm_topk_prob", boolean), "shared_experts": 1,
           "shared_d_ff": cfg.get("shared_expert_intermediate_size", positive_int)}
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=Attention("gqa", heads, kv_heads, head_dim, qk_norm=True), layers=layers, mlp=None, moe=moe,
                tied=cfg.get("tie_word_embeddings", boolean), checkpoint=model_type,
                ssm=delta_config(cfg, fused=False), expand=_lara_expand)


def _lara_expand(arch: Arch, origin: str):
    """x + mixer(input_layernorm(x)), x + moe(post_attention_layernorm(x))."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps, a = arch.norm_eps, arch.attention
    delta = {k: v for k, v in arch.ssm.items() if k != "kind"}
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            if spec.mixer == "attention":
                h = layer.attention(layer.rms_norm(x, "attn_norm", eps), a.heads, kv_heads=a.kv_heads,
                                    head_dim=a.head_dim, rope=dsl_rope(spec.rope), window=spec.window, qk_norm=True,
                                    qk_norm_eps=eps)
            else:
                h = layer.gated_delta(layer.rms_norm(x, "ssm_norm", eps), **delta)
            x = x + h
            x = x + layer.moe(layer.rms_norm(x, "mlp_norm", eps), **arch.moe)
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


# ---- Bailing-Hybrid (Ling 3) -----------------------------------------------------------------

def _bailing_key(cfg: Config, *names: str) -> str:
    """The first of a setting's names config.json holds (transformers' attribute_map aliases),
    else the first that has a default."""
    return next((n for n in names if cfg.has(n)), next((n for n in names if n in cfg.defaults), names[0]))


def _bailing_moe(cfg: Config) -> dict:
    """``Layer.moe``'s arguments: DeepSeek-V3's router under Ling's key names (or their aliases)."""
    experts_key = _bailing_key(cfg, "num_experts", "num_local_experts")
    experts = cfg.get(experts_key, positive_int)
    top_k = cfg.get(_bailing_key(cfg, "num_experts_per_token", "num_experts_per_tok"), positive_int)
    groups = cfg.get(_bailing_key(cfg, "num_expert_group", "n_group"), positive_int)
    if top_k > experts:
        raise cfg.error(experts_key, f"{experts} experts are fewer than top_k {top_k}")
    if experts % groups:
        raise cfg.error(experts_key, f"{experts} experts do not split into {groups} groups (num_expert_group)")
    moe = {"experts": experts, "top_k": top_k, "d_ff": cfg.get("moe_intermediate_size", positive_int),
           "shared_experts": cfg.get(_bailing_key(cfg, "num_shared_experts", "n_shared_experts"), non_negative_int),
           "routed_scale": cfg.get("routed_scaling_factor", positive_number), "scoring": "sigmoid",
           "router_bias": True, "norm_topk_prob": cfg.get(_bailing_key(cfg, "moe_renormalize", "norm_topk_prob"),
                                                          boolean),
           "groups": groups, "top_groups": cfg.get("topk_group", positive_int), "group_score": "top2_sum"}
    return moe


def _bailing(cfg: Config, name: str, model_type: str) -> Arch:
    cfg.check("hidden_act", lambda v: v == "silu", hint="Ling's MLPs and convolution use SiLU")
    cfg.check("attention_bias", lambda v: not v, hint="irc's Ling attention has no bias")
    for key in ("expert_swiglu_limit_list", "share_expert_swiglu_limit_list"):
        cfg.check(key, lambda v: v is None or (isinstance(v, list) and not any(v)),
                  hint="irc builds Ling's experts without SwiGLU clipping")
    d, heads, n = cfg.get("hidden_size", positive_int), cfg.get("num_attention_heads", positive_int), \
        cfg.get("num_hidden_layers", layer_count)
    cfg.check("num_key_value_heads", lambda v: v is None or v == heads,
              hint="MLA expands its latent to every head (transformers' repeat_kv needs as many kv heads as heads)")
    group = cfg.get("layer_group_size", positive_int)
    kinds = (layer_types(cfg, n, (DELTA, FULL), "Ling's") if cfg.has("layer_types")
             else [FULL if (i + 1) % group == 0 else DELTA for i in range(n)])
    first = cfg.get("first_k_dense_replace", non_negative_int)
    ffn = cfg.get("mlp_layer_types", string_list, None) or ["dense" if i < first else "sparse" for i in range(n)]
    if len(ffn) != n or not set(ffn) <= {"dense", "sparse"}:
        raise cfg.error("mlp_layer_types", f"expected {n} entries, each \"dense\" or \"sparse\"")
    mla = {"q_lora_rank": cfg.get("q_lora_rank", positive_int, None),
           **{k: cfg.get(k, positive_int) for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                                     "v_head_dim")}}
    params, key = rope_dict(cfg)
    rope = read_rope(cfg, mla["qk_rope_head_dim"], params, key, default_base=6e6, convention="interleaved")
    if rope.rotary_dim is not None:
        raise cfg.unsupported(f"{key}.partial_rotary_factor", params.get("partial_rotary_factor"),
                              hint="MLA rotates exactly qk_rope_head_dim")
    moe = _bailing_moe(cfg)
    layers = [LayerSpec(None, rope if kind == FULL else None, f == "sparse",
                        mixer="attention" if kind == FULL else "kimi_delta") for kind, f in zip(kinds, ffn)]
    safe = cfg.get("kda_safe_gate", boolean)
    lower = cfg.get("kda_lower_bound", number) if safe else None
    if safe and not lower < 0:
        raise cfg.error("kda_lower_bound", f"{lower} is not negative", hint="the safe forget gate's log decay "
                                                                           "lies in (kda_lower_bound, 0)")
    ssm = {"kind": "kimi_delta",  # the linear_* keys a saved config holds win, as transformers' kwargs do
           "heads": cfg.get(_bailing_key(cfg, "linear_num_heads", "num_attention_heads"), positive_int),
           "head_dim": cfg.get(_bailing_key(cfg, "linear_head_dim", "head_dim"), positive_int),
           "conv_kernel": cfg.get(_bailing_key(cfg, "linear_conv_kernel_dim", "short_conv_kernel_size"), positive_int),
           "lower_bound": lower}
    qk = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=Attention("mla", heads, heads, qk, mla=mla), layers=layers,
                mlp={"kind": "swiglu", "d_ff": cfg.get("intermediate_size", positive_int)} if "dense" in ffn else None,
                moe=moe if "sparse" in ffn else None, tied=False,  # transformers ties nothing here
                checkpoint=model_type, ssm=ssm, expand=_bailing_expand)


def _emit(m, p: str, op: str, inputs, attrs, name: str):
    return m.emit(op, inputs, attrs, p + name)[0]


def _view(m, p: str, x, shape, name: str):
    return _emit(m, p, "reshape", [x], {"shape": list(shape)}, name)


def _cols(m, p: str, x, start: int, end, name: str):
    return _emit(m, p, "slice", [x], {"axis": -1, "start": start, "end": end}, name)


def _linear(m, p: str, x, weight: str, rows: int, name: str):
    return _emit(m, p, "linear", [x, m.param(p + weight, (rows, m._features(x)))], None, name)


def _head_gated(m, p: str, out, x, heads: int, width: int, weight: str):
    """out [B, T, H·width] with head h times sigmoid(``weight`` [H, d] · x)_h."""
    batch, seq = x.shape[:2]
    gate = _emit(m, p, "sigmoid", [_linear(m, p, x, weight, heads, "head_gate")], None, "head_gate_sigmoid")
    gated = _emit(m, p, "mul", [_view(m, p, out, (batch, seq, heads, width), "attn_heads"),
                                _view(m, p, gate, (batch, seq, heads, 1), "head_gate4")], None, "attn_heads_gated")
    return _view(m, p, gated, (batch, seq, heads * width), "attn_gated")


def gated_mla(layer, x, arch: Arch, rope):
    """DeepSeek-V3's MLA (direct or low-rank q, the KV latent, the interleaved RoPE key shared by
    the heads) through the ``attention`` op over per-head caches, each head's output times
    sigmoid(``attn.g_proj`` · x) before ``attn.wo`` (Ling's BailingHybridAttention)."""
    m, p, i = layer.model, layer.prefix, layer.index
    mla, heads = arch.attention.mla, arch.attention.heads
    nope, rdim, vdim, rank = mla["qk_nope_head_dim"], mla["qk_rope_head_dim"], mla["v_head_dim"], mla["kv_lora_rank"]
    qk, (batch, seq) = nope + rdim, x.shape[:2]
    _, positions = m._context()
    if mla["q_lora_rank"] is None:
        q = _linear(m, p, x, "attn.wq", heads * qk, "q")
    else:
        latent = m.norm(_linear(m, p, x, "attn.q_a", mla["q_lora_rank"], "q_a_out"), f"{p}attn.q_a_norm", "rms", 1e-6)
        q = _linear(m, p, latent, "attn.q_b", heads * qk, "q")
    q = _view(m, p, q, (batch, seq, heads, qk), "q_heads")
    q_pe = _view(m, p, _cols(m, p, q, nope, qk, "q_pe"), (batch, seq, heads * rdim), "q_pe_flat")
    q_pe = _emit(m, p, "rope", [q_pe, positions], rope.attrs(rdim), "q_pe_rope")
    q = _emit(m, p, "concat", [_cols(m, p, q, 0, nope, "q_nope"), _view(m, p, q_pe, (batch, seq, heads, rdim),
                                                                         "q_pe_heads")], {"axis": -1}, "q_full")
    kv_a = _linear(m, p, x, "attn.kv_a", rank + rdim, "kv_a_out")
    latent = m.norm(_cols(m, p, kv_a, 0, rank, "kv_latent"), f"{p}attn.kv_a_norm", "rms", 1e-6)
    kv = _view(m, p, _linear(m, p, latent, "attn.kv_b", heads * (nope + vdim), "kv"), (batch, seq, heads, nope + vdim),
               "kv_heads")
    k_pe = _emit(m, p, "rope", [_cols(m, p, kv_a, rank, None, "k_pe"), positions], rope.attrs(rdim), "k_pe_rope")
    k_pe = _emit(m, p, "expand", [_view(m, p, k_pe, (batch, seq, 1, rdim), "k_pe_head")],
                 {"shape": [batch, seq, heads, rdim]}, "k_pe_heads")
    key = _emit(m, p, "concat", [_cols(m, p, kv, 0, nope, "k_nope"), k_pe], {"axis": -1}, "k_full")
    flat = [_view(m, p, t, (batch, seq, heads * t.shape[-1]), f"{n}_flat")
            for t, n in ((q, "q"), (key, "k"), (_cols(m, p, kv, nope, None, "v_heads"), "v"))]
    scale = mla_softmax_scale(nope, rdim, rope.mla_attrs(), None)
    attrs = {"heads": heads, "kv_heads": heads, "head_dim": qk, "v_head_dim": vdim, "causal": True, "window": None,
             "softcap": None, "scale": scale}
    out, *presents = m.emit("attention", [*flat, m._context()[0], *m._past(i, heads, qk, vdim)], attrs,
                            [f"{p}attn", f"present.{i}.key", f"present.{i}.value"])
    m._presents += [t.value for t in presents]
    layer._note_attention("mla", heads, heads, qk, vdim, None, None, None, rope, mla=dict(mla))
    out = _head_gated(m, p, out, x, heads, vdim, "attn.g_proj")
    return _linear(m, p, out, "attn.wo", arch.d_model, "attn_out")


def _safe_decay(m, p: str, f, A_log, dt_bias, heads: int, width: int, lower: float):
    """(raw, A_log'): the op's decay -exp(A_log')·softplus(raw) equal to Ling's safe gate
    lower·sigmoid(exp(A_log)·(f + dt_bias)): A_log' = log(-lower) per head, raw = the inverse
    softplus of the sigmoid, log(max(exp(s) - 1, 1e-30))."""
    rate = _view(m, p, _emit(m, p, "expand", [_view(m, p, _emit(m, p, "exp", [A_log], None, "ssm_rate"), (heads, 1),
                                                        "ssm_rate_col")], {"shape": [heads, width // heads]},
                               "ssm_rate_heads"), (width,), "ssm_rate_channels")
    s = _emit(m, p, "sigmoid", [_emit(m, p, "mul", [_emit(m, p, "add", [f, dt_bias], None, "ssm_gate_in"), rate],
                                      None, "ssm_gate_scaled")], None, "ssm_gate_sigmoid")
    grown = _emit(m, p, "sub", [_emit(m, p, "exp", [s], None, "ssm_gate_exp"),
                                _emit(m, p, "constant", [], {"value": 1.0}, "ssm_one")], None, "ssm_gate_expm1")
    grown = _emit(m, p, "maximum", [grown, _emit(m, p, "constant", [], {"value": 1e-30}, "ssm_tiny")], None,
                  "ssm_gate_expm1_floor")
    raw = _emit(m, p, "log", [grown], None, "ssm_gate_raw")
    return raw, _emit(m, p, "constant", [], {"value": [math.log(-lower)] * heads}, "ssm_safe_A_log")


def bailing_delta(layer, x, heads: int, head_dim: int, conv_kernel: int, lower_bound, eps: float):
    """Ling's KDA layer: q / k / v projections through one causal conv + SiLU, the delta rule
    with a per-channel decay from ``f_proj`` (the safe gate where ``lower_bound`` is set, else
    -exp(A_log)·softplus(f + dt_bias)), β = sigmoid(b_proj), each head's RMS norm times
    sigmoid(``g_proj`` · x), ``o_proj``; state as ``Layer.kimi_delta``'s."""
    m, p, i = layer.model, layer.prefix, layer.index
    width = heads * head_dim
    q, k, v = (layer._linear(x, f"{n}_proj", width, False, f"ssm_{n}_in") for n in "qkv")
    qkv = layer._conv(m.emit("concat", [q, k, v], {"axis": -1}, f"{p}ssm_qkv")[0], 3 * width, conv_kernel, False)
    q, k, v = layer._split(qkv, [width] * 3, ["ssm_q", "ssm_k", "ssm_v"])
    f = layer._linear(x, "f_proj", width, False, "ssm_f")
    A_log, dt_bias = m.param(f"{p}ssm.A_log", (heads,)), m.param(f"{p}ssm.dt_bias", (width,))
    if lower_bound is None:
        a, rate, bias = f, A_log, dt_bias
    else:
        (a, rate), bias = _safe_decay(m, p, f, A_log, dt_bias, heads, width, lower_bound), None
    b = layer._linear(x, "b_proj", heads, False, "ssm_b")
    past = m._state(i, "recurrent_state", (heads, head_dim, head_dim))
    mask, _ = m._context()
    attrs = {"key_heads": heads, "value_heads": heads, "key_dim": head_dim, "value_dim": head_dim, "decay": "channel"}
    y, present = m.emit("gated_delta_rule", [q, k, v, a, b, rate, bias, past, mask], attrs,
                        [f"{p}ssm_y", f"present.{i}.recurrent_state"])
    m._presents.append(present.value)
    batch, seq = x.shape[:2]
    normed = _view(m, p, m.norm(_view(m, p, y, (batch, seq, heads, head_dim), "ssm_y_heads"), f"{p}ssm.o_norm", "rms",
                                eps), (batch, seq, width), "ssm_normed")
    gate = _emit(m, p, "sigmoid", [layer._linear(x, "g_proj", width, False, "ssm_gate")], None, "ssm_gate_sigmoid")
    y = _emit(m, p, "mul", [normed, gate], None, "ssm_gated")
    layer._note_ssm("kimi_delta", heads=heads, head_dim=head_dim, conv_kernel=conv_kernel)
    return layer._linear(y, "o_proj", m._features(x), False, "ssm_out")


def _bailing_expand(arch: Arch, origin: str):
    """x + mixer(input_layernorm(x)), x + mlp or moe(post_attention_layernorm(x))."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps, kda = arch.norm_eps, {k: v for k, v in arch.ssm.items() if k != "kind"}
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            if spec.mixer == "attention":
                x = x + gated_mla(layer, layer.rms_norm(x, "attn_norm", eps), arch, dsl_rope(spec.rope))
            else:
                x = x + bailing_delta(layer, layer.rms_norm(x, "ssm_norm", eps), eps=eps, **kda)
            h = layer.rms_norm(x, "mlp_norm", eps)
            x = x + (layer.moe(h, **arch.moe) if spec.moe else layer.swiglu(h, d_ff=arch.mlp["d_ff"]))
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


FAMILIES = {"lara_mini": _lara, "bailing_hybrid": _bailing}


# ---- the checkpoints -----------------------------------------------------------------------

def _in_proj_rows(part: str):
    """Rows of Lara-Mini's fused ``linear_attn.in_proj`` [q | k | v | z | b | a]."""
    def source(arch: Arch, prefix: str) -> Source:
        s = arch.ssm
        key, value, heads = s["key_heads"] * s["key_dim"], s["value_heads"] * s["value_dim"], s["value_heads"]
        bounds = {"qkv": (0, 2 * key + value), "z": (2 * key + value, 2 * key + 2 * value),
                  "b": (2 * key + 2 * value, 2 * key + 2 * value + heads),
                  "a": (2 * key + 2 * value + heads, 2 * key + 2 * value + 2 * heads)}[part]
        return Rows(prefix + "linear_attn.in_proj.weight", *bounds)
    return source


def _experts(part: str) -> list:
    """Experts fused as transformers 5 saves them, then per expert."""
    fused = "down_proj" if part == "down" else "gate_up_proj"
    return [lambda arch, p: FusedExperts(f"{p}mlp.experts.{fused}", part, arch.moe["d_ff"], arch.d_model),
            lambda arch, p: Stack([Tensor(f"{p}mlp.experts.{e}.{part}_proj.weight")
                                   for e in range(arch.moe["experts"])])]


def _either(*names: str) -> list:
    return [lambda arch, p, n=n: Tensor(p + n) for n in names]


LARA_CANDIDATES = {  # irc name under layers.{i}. -> what transformers would load: the saved name first
    **{f"ssm.in_proj_{part}": [_in_proj_rows(part), lambda arch, p, part=part: Tensor(
        f"{p}linear_attn.in_proj_{part}.weight")] for part in ("qkv", "z", "b", "a")},
    "ssm.norm": _either("linear_attn.out_norm.weight", "linear_attn.norm.weight"),
    **{f"moe.w_{part}": _experts(part) for part in ("gate", "up", "down")},
}



def _attn(saved: str, module: str = "") -> list:
    """Under Ling's ``attention.`` (saved) or transformers' ``self_attn.``."""
    return _either(f"attention.{saved}", f"self_attn.{module or saved}")


BAILING_CANDIDATES = {
    "attn.wq": _attn("q_proj.weight"), "attn.q_a": _attn("q_a_proj.weight"),
    "attn.q_a_norm": _attn("q_a_layernorm.weight"), "attn.q_b": _attn("q_b_proj.weight"),
    "attn.kv_a": _attn("kv_a_proj_with_mqa.weight"), "attn.kv_a_norm": _attn("kv_a_layernorm.weight"),
    "attn.kv_b": _attn("kv_b_proj.weight"), "attn.wo": _attn("dense.weight", "o_proj.weight"),
    "attn.g_proj": _attn("g_proj.weight"),
    **{f"ssm.{n}_proj": _attn(f"{n}_proj.weight") for n in ("q", "k", "v", "b", "g")},
    "ssm.o_norm": _attn("o_norm.weight"), "ssm.o_proj": _attn("dense.weight", "o_proj.weight"),
    "ssm.f_proj": _attn("f_proj.weight", "forget_gate.f_proj.weight"),
    "ssm.A_log": _attn("A_log", "forget_gate.A_log"), "ssm.dt_bias": _attn("dt_bias", "forget_gate.dt_bias"),
    "ssm.conv": [lambda arch, p: Joined([Tensor(f"{p}attention.{x}_conv1d.weight") for x in "qkv"]),
                 lambda arch, p: Tensor(f"{p}self_attn.conv1d.weight")],
    "moe.router_bias": _either("mlp.gate.expert_bias", "mlp.gate.e_score_correction_bias"),
    "embed": _either("model.word_embeddings.weight", "model.embed_tokens.weight"),
    **{f"moe.w_{part}": _experts(part)[::-1] for part in ("gate", "up", "down")},
}


def resolve(candidates: dict, arch: Arch, param: str, checkpoint) -> Optional[Source]:
    """The first of ``param``'s candidate sources the checkpoint holds whole (else the first,
    so the error names what is missing); None for a param with one name (``LAYOUTS``)."""
    if not param.startswith("layers."):  # embed, norm, lm_head
        sources = [make(arch, "") for make in candidates.get(param, ())]
    else:
        layer, _, suffix = param.partition(".")[2].partition(".")
        sources = [make(arch, f"model.layers.{layer}.") for make in candidates.get(suffix, ())]
    if not sources:
        return None
    return next((s for s in sources if all(n in checkpoint.files for n in s.names())), sources[0])


LAYOUTS = {
    "lara_mini": {"ssm_norm": "input_layernorm.weight", "ssm.out_proj": "linear_attn.out_proj.weight",
                  "ssm.conv": "linear_attn.conv1d.weight", "ssm.A_log": "linear_attn.A_log",
                  "ssm.dt_bias": "linear_attn.dt_bias",
                  **{f"moe.shared_{x}": f"mlp.shared_expert.{x}_proj.weight" for x in ("gate", "up", "down")},
                  "_resolve": partial(resolve, LARA_CANDIDATES)},
    "bailing_hybrid": {"ssm_norm": "input_layernorm.weight", "_resolve": partial(resolve, BAILING_CANDIDATES)},
}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS", "resolve"]
