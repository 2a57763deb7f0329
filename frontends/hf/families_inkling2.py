"""Thinking Machines' Inkling-2 text decoder (``inkling2_text``): Inkling's convolved,
relatively biased attention with L2-clipped heads, per-token attention sinks, a gated output,
dynamic key/value convolutions on the full layers, block attention residuals and softcapped
SwiGLU experts (``frontends.hf.families`` registers it).

Layer i (transformers' ``Inkling2SlidingDecoderLayer`` / ``Inkling2FullDecoderLayer``), with
B the block states (the inputs of the layers at multiples of ``n_layers_per_attn_res_block``,
the embedding first) and mix_q(B, x) = Σ_n softmax_n(q·ν(s_n) / √d) ν(s_n) over s = B, x
(ν an unweighted RMS norm, eps 1e-6; a learned query q per output)::

    a = attn(rms(mix(B, x)))          (layer 0: x; full layers: three mixes for q, k and v)
    a = (a + conv(a)) / √(K + 1)
    r = a at a block boundary (x joins B for this layer's MLP input), else x + a
    out = r + (f + conv(f)) / √(K + 1),   f = experts(rms(mix(B, r)))
    logits = softcap(lm_head(rms(mix(B_final, x))), ``final_logit_softcapping``)

Attention: q = clip(q(h) · q_scale) per head (and on full layers times tau), k = clip(conv(k(h)))
(no scale), v = ν_eps(conv(v(h))) with ``rms_norm_eps``; clip(x) = x · min(c / (|x| + 1e-6), 1)
with c ``qk_l2_clip_threshold``; relative states r = clip_rel(r(h) · rel_scale) (· tau on full
layers), the bias Inkling's (``families_inkling.rel_bias``); scores q·k / √hd + bias; one sink
logit per query and head (``sink_proj(h)``) joins the softmax with no value; out =
o(attn · sigmoid(gate(h))). tau = 1 + ``log_scaling_alpha`` · log(max((position + 1) /
``log_scaling_n_floor``, 1)) from ``position_ids`` (transformers' Inkling2LogScale). Sliding
layers see ``sliding_window_size`` keys, extent = the window; full layers every key, extent
``rel_extent``. Sliding layers' k/v convolutions are static (``causal_conv1d``); the full
layers' are dynamic: tap l of channel c weighs static_weight[l, c] + weight_proj(k or v
input)[head(c), l] (l tokens back), (x + Σ) / √(2K + 1); irc keeps its last K−1 inputs as the
state [B, C, K−1] and gathers the K shifted inputs from state | new tokens.

Experts (``Inkling2Experts``): softcap(g, ``mlp_gate_softcap``) · sigmoid(g) · softcap(u,
``mlp_up_softcap``), routed by sigmoid scores, top-k on score + ``e_score_correction_bias``,
renormalised, times ``route_scale``; no shared experts. irc writes them with the sorted-MoE
ops. The LM head has ``unpadded_vocab_size`` rows (the embedding ``vocab_size``).

Weights are read as transformers saves them, the released checkpoints' names (``model.llm.*``:
``unembed`` padded to ``vocab_size``, of which irc reads the first ``unpadded_vocab_size`` rows;
``mlp.experts.w13_weight`` with gate and up rows interleaved; ``attn_res.attn_queries.{i-1}`` /
``mlp_queries.{i}`` / ``output_query``); transformers' in-memory names are not a layout irc reads.

Refused, naming config.json and the key: a ``scoring_func`` other than sigmoid, layer kinds
other than "hybrid_sliding" / "hybrid", a list whose length is not ``num_hidden_layers``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Optional

import numpy as np

from frontends.dsl import Model
from frontends.hf.config import Arch, Attention, Config, LayerSpec, string_list
from frontends.hf.families_inkling import (FULL, MASKED, SLIDING, Heads, _const, _e, _heads, _key, _linear, _slots,
                                          _visible, rel_bias, short_conv)
from frontends.hf.weights import Checkpoint, Rows, Tensor
from irc import dims
from irc.errors import SpecError
from irc.yamlloc import layer_count, number, positive_int, positive_number, size

DEFAULTS = {  # transformers 5.25's Inkling2TextConfig
    "inkling2_text": {
        "vocab_size": 201024, "unpadded_vocab_size": 200058, "hidden_size": 4608, "num_hidden_layers": 48,
        "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "swa_num_attention_heads": 48,
        "swa_num_key_value_heads": 8, "swa_head_dim": 128, "sliding_window_size": 1024, "d_rel": 16,
        "rel_extent": 1024, "log_scaling_n_floor": 128000, "log_scaling_alpha": 0.1, "layer_types": None,
        "max_position_embeddings": 1048576, "rms_norm_eps": 1e-6, "conv_kernel_size": 4,
        "moe_intermediate_size": 2304, "n_routed_experts": 384, "num_experts_per_tok": 8, "route_scale": 8.0,
        "qk_l2_clip_threshold": 22.627416997969522, "rel_l2_clip_threshold": 8.0, "n_layers_per_attn_res_block": 6,
        "mlp_gate_softcap": 4.0, "mlp_up_softcap": 25.0, "final_logit_softcapping": 30.0, "scoring_func": "sigmoid",
        "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": 200006, "pad_token_id": None},
}
ALIASES = {"intermediate_size": "moe_intermediate_size", "routed_scaling_factor": "route_scale"}
MIX_EPS = 1e-6  # Inkling2BlockAttentionResidual's unweighted norm


@dataclass
class Inkling2:
    kinds: list
    heads: dict
    d_rel: int
    kernel: int
    experts: int
    top_k: int
    d_ff: int
    route_scale: float
    qk_clip: float
    rel_clip: float
    block: int
    gate_cap: float
    up_cap: float
    log_floor: float
    log_alpha: float
    final_cap: float
    vocab_rows: int


def _get(cfg: Config, key: str, kind):
    alias = next((a for a, k in ALIASES.items() if k == key), None)
    return cfg.get(alias if alias in cfg.data and key not in cfg.data else key, kind)


def _inkling2(cfg: Config, name: str, model_type: str) -> Arch:
    """Inkling-2's text decoder (see the module docstring)."""
    cfg.check("scoring_func", lambda v: v == "sigmoid", hint="Inkling-2's router scores are sigmoids")
    n = cfg.get("num_hidden_layers", layer_count)
    kinds = cfg.get("layer_types", string_list, None)
    kinds = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(n)] if kinds is None else kinds
    for kind in kinds:
        if kind not in (SLIDING, FULL):
            raise cfg.unsupported("layer_types", kind, hint=f"Inkling-2's kinds: {SLIDING}, {FULL}")
    if len(kinds) != n:
        raise cfg.error("layer_types", f"has {len(kinds)} entries for {n} layers (num_hidden_layers)")
    experts, top_k = cfg.get(_key(cfg, "n_routed_experts"), positive_int), cfg.get("num_experts_per_tok", positive_int)
    if top_k > experts:
        raise cfg.error("num_experts_per_tok", f"{top_k} exceeds the {experts} routed experts")
    s = Inkling2(kinds=kinds, heads={k: _heads(cfg, k == SLIDING) for k in set(kinds)}, d_rel=cfg.get("d_rel", size),
                 kernel=cfg.get(_key(cfg, "conv_kernel_size"), positive_int), experts=experts, top_k=top_k,
                 d_ff=_get(cfg, "moe_intermediate_size", size), route_scale=_get(cfg, "route_scale", number),
                 qk_clip=cfg.get("qk_l2_clip_threshold", positive_number),
                 rel_clip=cfg.get("rel_l2_clip_threshold", positive_number),
                 block=cfg.get("n_layers_per_attn_res_block", positive_int),
                 gate_cap=cfg.get("mlp_gate_softcap", positive_number),
                 up_cap=cfg.get("mlp_up_softcap", positive_number),
                 log_floor=cfg.get("log_scaling_n_floor", positive_number),
                 log_alpha=cfg.get("log_scaling_alpha", number),
                 final_cap=cfg.get("final_logit_softcapping", positive_number),
                 vocab_rows=cfg.get("vocab_size", positive_int))
    first = s.heads[kinds[0]]
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(),
                vocab_size=cfg.get("unpadded_vocab_size", positive_int), d_model=cfg.get("hidden_size", size),
                n_layers=n, norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=Attention("gqa", first.heads, first.kv_heads, first.head_dim, qk_norm=True),
                layers=[LayerSpec(s.heads[k].window, None, True) for k in kinds], mlp=None,
                moe={"experts": experts, "top_k": top_k, "d_ff": s.d_ff}, tied=False, checkpoint="inkling2_text",
                final_softcap=s.final_cap, expand=partial(_graph, s))


# ---- pieces ------------------------------------------------------------------------------------

def _heads4(m: Model, x, heads: int, width: int, name: str):
    return _e(m, "reshape", [x], name, {"shape": ["B", "T", heads, width]})


def _clip(m: Model, x, threshold: float, name: str):
    """x · min(threshold / (|x| + 1e-6), 1) over the last axis (``Inkling2L2Clip``)."""
    total = _e(m, "reduce_sum", [_e(m, "mul", [x, x], f"{name}_square")], f"{name}_sum_square",
               {"axes": [-1], "keepdims": True})
    norm = _e(m, "add", [_e(m, "sqrt", [total], f"{name}_norm"), _const(m, 1e-6, f"{name}_eps")], f"{name}_norm_eps")
    ratio = _e(m, "div", [_const(m, float(threshold), f"{name}_threshold"), norm], f"{name}_ratio")
    one = _const(m, 1.0, f"{name}_one")
    factor = _e(m, "where", [_e(m, "less", [ratio, one], f"{name}_shorter"), ratio, one], f"{name}_factor")
    return _e(m, "mul", [x, factor], name)


def _scaled_clip(m: Model, x, pname: str, shape: tuple, threshold: float, tau=None):
    """``Inkling2ScaledL2Clip`` (x · @pname, clipped), times tau [B, T, 1, 1] when given."""
    out = _clip(m, _e(m, "mul", [x, m.param(pname, shape)], f"{pname}_scaled"), threshold, f"{pname}_clipped")
    return out if tau is None else _e(m, "mul", [out, tau], f"{pname}_log_scaled")


def _tau(m: Model, s: Inkling2):
    """[B, T, 1, 1] f32: 1 + alpha · log(max((position_ids + 1) / floor, 1))."""
    _, positions = m._context()
    n = _e(m, "add", [_e(m, "cast", [positions], "tau_position", {"to": "f32"}), _const(m, 1.0, "tau_one")], "tau_n")
    ratio = _e(m, "maximum", [_e(m, "div", [n, _const(m, float(s.log_floor), "tau_floor")], "tau_ratio"),
                              _const(m, 1.0, "tau_min")], "tau_clamped")
    scaled = _e(m, "mul", [_e(m, "log", [ratio], "tau_log"), _const(m, float(s.log_alpha), "tau_alpha")], "tau_term")
    tau = _e(m, "add", [scaled, _const(m, 1.0, "tau_base")], "tau")
    return _e(m, "reshape", [tau], "tau_BT11", {"shape": ["B", "T", 1, 1]})


def mix(m: Model, pname: str, sources: list, partial_state, queries: int = 1, query=None) -> list:
    """``Inkling2BlockAttentionResidual``: ``queries`` softmax mixes of the normed sources, by
    the query param @pname ([d] or [queries, d]) or the given ``query`` [queries, d]."""
    d = m.d_model
    parts = [_e(m, "reshape", [x], f"{pname}_source{n}", {"shape": ["B", "T", 1, d]})
             for n, x in enumerate(sources + [partial_state])]
    stacked = parts[0] if len(parts) == 1 else _e(m, "concat", parts, f"{pname}_stacked", {"axis": 2})
    stacked = m.plain_rms_norm(stacked, f"{pname}_normed", MIX_EPS)
    query = m.param(pname, (d,) if queries == 1 else (queries, d)) if query is None else query
    query = _e(m, "reshape", [query], f"{pname}_d1", {"shape": [d, 1]}) if queries == 1 else \
        _e(m, "transpose", [query], f"{pname}_dq", {"perm": [1, 0]})
    scores = _e(m, "mul", [_e(m, "matmul", [stacked, query], f"{pname}_scores"),
                           _const(m, d ** -0.5, f"{pname}_scale")], f"{pname}_scores_scaled")
    weights = _e(m, "transpose", [_e(m, "softmax", [scores], f"{pname}_weights", {"axis": 2})],
                 f"{pname}_weights_BTQN", {"perm": [0, 1, 3, 2]})
    out = _e(m, "matmul", [weights, stacked], f"{pname}_out")  # [B, T, queries, d]
    return [_e(m, "reshape", [_e(m, "slice", [out], f"{pname}_out{i}", {"axis": 2, "start": i, "end": i + 1})],
               f"{pname}_mixed{i}", {"shape": ["B", "T", d]}) for i in range(queries)]


def _dynamic_conv(layer, x, source, kind: str, a: Heads, kernel: int, new_slots):
    """``Inkling2DynamicShortConvolution`` with its state ``past_key_values.{i}.{kind}_conv_state``."""
    m, p, i = layer.model, layer.prefix, layer.index
    mask, _ = m._context()
    channels = a.kv_heads * a.head_dim
    past = m._state(i, f"{kind}_conv_state", (channels, kernel - 1))
    real = _e(m, "cast", [_e(m, "gather", [mask, new_slots], f"{p}{kind}_new_mask", {"axis": 1})],
              f"{p}{kind}_new_real", {"to": "bool"})
    real = _e(m, "reshape", [real], f"{p}{kind}_new_real_BT1", {"shape": ["B", "T", 1]})
    masked = _e(m, "where", [real, x, _const(m, 0.0, f"{p}{kind}_pad_zero")], f"{p}{kind}_conv_in")
    context = _e(m, "concat", [past, _e(m, "transpose", [masked], f"{p}{kind}_conv_in_BCT", {"perm": [0, 2, 1]})],
                 f"{p}{kind}_context", {"axis": 2})
    steps = _e(m, "range_like", [x], f"{p}{kind}_steps", {"axis": 1})
    taps = _heads4(m, _linear(m, source, m.param(f"{p}{kind}_dyn", (a.kv_heads * kernel, m.d_model)),
                              f"{p}{kind}_taps"), a.kv_heads, kernel, f"{p}{kind}_taps_heads")
    static = m.param(f"{p}{kind}_static", (kernel, channels))
    total = None
    for lag in range(kernel):
        index = _e(m, "add", [steps, _const(m, kernel - 1 - lag, f"{p}{kind}_lag{lag}", "i64")], f"{p}{kind}_at{lag}")
        shifted = _e(m, "transpose", [_e(m, "gather", [context, index], f"{p}{kind}_back{lag}", {"axis": 2})],
                     f"{p}{kind}_back{lag}_BTC", {"perm": [0, 2, 1]})
        row = _e(m, "reshape", [_e(m, "slice", [static], f"{p}{kind}_static{lag}", {"axis": 0, "start": lag,
                                                                                   "end": lag + 1})],
                 f"{p}{kind}_static{lag}_heads", {"shape": [a.kv_heads, a.head_dim]})
        tap = _e(m, "slice", [taps], f"{p}{kind}_tap{lag}", {"axis": 3, "start": lag, "end": lag + 1})
        weight = _e(m, "reshape", [_e(m, "add", [row, tap], f"{p}{kind}_weight{lag}_heads")], f"{p}{kind}_weight{lag}",
                    {"shape": ["B", "T", channels]})
        term = _e(m, "mul", [shifted, weight], f"{p}{kind}_term{lag}")
        total = term if total is None else _e(m, "add", [total, term], f"{p}{kind}_sum{lag}")
    keep = _e(m, "add", [_const(m, list(range(kernel - 1)), f"{p}{kind}_keep", "i64"),
                         _e(m, "dim_size", [x], f"{p}{kind}_new_length", {"axis": 1})], f"{p}{kind}_keep_at")
    present = _e(m, "gather", [context, keep], f"present.{i}.{kind}_conv_state", {"axis": 2})
    m._presents.append(present.value)
    out = _e(m, "add", [total, x], f"{p}{kind}_conv_residual")
    return _e(m, "mul", [out, _const(m, (2 * kernel + 1) ** -0.5, f"{p}{kind}_conv_scale")], f"{p}{kind}_conv_out")


def _kv(layer, h, kind: str, a: Heads, s: Inkling2, full: bool, new_slots):
    """Keys (clipped) or values (unweighted RMS norm), [B, T, kv_heads, hd], after their conv."""
    m, p = layer.model, layer.prefix
    width = a.kv_heads * a.head_dim
    x = _linear(m, h, m.param(f"{p}attn.w{kind}", (width, m.d_model)), f"{p}{kind}")
    if full:
        x = _dynamic_conv(layer, x, h, kind, a, s.kernel, new_slots)
    else:
        x = short_conv(layer, x, kind, width, s.kernel, scale=(s.kernel + 1) ** -0.5)
    x = _heads4(m, x, a.kv_heads, a.head_dim, f"{p}{kind}_heads")
    if kind == "k":
        return _clip(m, x, s.qk_clip, f"{p}k_clipped")
    return m.plain_rms_norm(x, f"{p}v_normed", layer.eps)


def _attention(layer, hq, hk, hv, a: Heads, s: Inkling2, slots, tau):
    """One layer's attention (``Inkling2SlidingAttention`` / ``Inkling2FullAttention``)."""
    m, p, i, d = layer.model, layer.prefix, layer.index, layer.model.d_model
    queries, keys, distance, new_slots = slots
    total, group = m._context()[0].shape[1], a.heads // a.kv_heads
    q = _heads4(m, _linear(m, hq, m.param(f"{p}attn.wq", (a.heads * a.head_dim, d)), f"{p}q"), a.heads, a.head_dim,
                f"{p}q_heads")
    q = _scaled_clip(m, q, f"{p}attn.q_scale", (a.heads, a.head_dim), s.qk_clip, tau)
    k = _kv(layer, hk, "k", a, s, tau is not None, new_slots)
    v = _kv(layer, hv, "v", a, s, tau is not None, new_slots)
    rel = _heads4(m, _linear(m, hq, m.param(f"{p}attn.wr", (a.heads * s.d_rel, d)), f"{p}rel"), a.heads, s.d_rel,
                  f"{p}rel_heads")
    rel = _scaled_clip(m, rel, f"{p}attn.rel_scale", (a.heads, s.d_rel), s.rel_clip, tau)
    bias = _e(m, "reshape", [rel_bias(m, p, rel, a.heads, s.d_rel, a.extent, distance)], f"{p}rel_bias_BKGTS",
              {"shape": ["B", a.kv_heads, group, "T", total]})
    q = _e(m, "transpose", [_e(m, "reshape", [q], f"{p}q_groups", {"shape": ["B", "T", a.kv_heads, group,
                                                                            a.head_dim]})],
           f"{p}q_BKGTD", {"perm": [0, 2, 3, 1, 4]})
    past_key, past_value = m._past(i, a.kv_heads, a.head_dim, a.head_dim)
    key = _e(m, "concat", [past_key, _e(m, "transpose", [k], f"{p}k_BKTD", {"perm": [0, 2, 1, 3]})],
             f"present.{i}.key", {"axis": 2})
    value = _e(m, "concat", [past_value, _e(m, "transpose", [v], f"{p}v_BKTD", {"perm": [0, 2, 1, 3]})],
               f"present.{i}.value", {"axis": 2})
    m._presents += [key.value, value.value]
    layer._note_attention("mqa" if a.kv_heads == 1 else "gqa", a.heads, a.kv_heads, a.head_dim, a.head_dim,
                          a.window, None, a.head_dim ** -0.5, None)
    key_t = _e(m, "transpose", [_e(m, "reshape", [key], f"{p}key_BK1SD", {"shape": ["B", a.kv_heads, 1, total,
                                                                                     a.head_dim]})],
               f"{p}key_BK1DS", {"perm": [0, 1, 2, 4, 3]})
    scores = _e(m, "mul", [_e(m, "matmul", [q, key_t], f"{p}scores"), _const(m, a.head_dim ** -0.5, f"{p}scale")],
                f"{p}scores_scaled")
    scores = _e(m, "add", [scores, bias], f"{p}scores_biased")
    scores = _e(m, "where", [_visible(m, p, a, queries, keys), scores, _const(m, MASKED, f"{p}hidden")],
                f"{p}scores_masked")
    sinks = _e(m, "transpose", [_linear(m, hq, m.param(f"{p}attn.sinks", (a.heads, d)), f"{p}sinks")],
               f"{p}sinks_BHT", {"perm": [0, 2, 1]})
    sinks = _e(m, "reshape", [sinks], f"{p}sinks_BKGT1", {"shape": ["B", a.kv_heads, group, "T", 1]})
    peak = _e(m, "maximum", [_e(m, "reduce_max", [scores], f"{p}scores_max", {"axes": [-1], "keepdims": True}),
                             sinks], f"{p}peak")
    exps = _e(m, "exp", [_e(m, "sub", [scores, peak], f"{p}scores_shifted")], f"{p}scores_exp")
    denominator = _e(m, "add", [_e(m, "reduce_sum", [exps], f"{p}exp_sum", {"axes": [-1], "keepdims": True}),
                                _e(m, "exp", [_e(m, "sub", [sinks, peak], f"{p}sink_shifted")], f"{p}sink_exp")],
                     f"{p}denominator")
    weights = _e(m, "div", [exps, denominator], f"{p}weights")
    value = _e(m, "reshape", [value], f"{p}value_BK1SD", {"shape": ["B", a.kv_heads, 1, total, a.head_dim]})
    out = _e(m, "transpose", [_e(m, "matmul", [weights, value], f"{p}context")], f"{p}context_BTKGD",
             {"perm": [0, 3, 1, 2, 4]})
    out = _e(m, "reshape", [out], f"{p}merged", {"shape": ["B", "T", a.heads * a.head_dim]})
    gate = _e(m, "sigmoid", [_linear(m, hq, m.param(f"{p}attn.w_gate", (a.heads * a.head_dim, d)), f"{p}gate")],
              f"{p}gate_sigmoid")
    out = _e(m, "mul", [out, gate], f"{p}gated")
    return _linear(m, out, m.param(f"{p}attn.wo", (d, a.heads * a.head_dim)), f"{p}attn_out")


def _experts(layer, h, s: Inkling2):
    """The routed experts through the sorted-MoE ops, softcapped SwiGLU in between."""
    m, p, d, f, e = layer.model, layer.prefix, layer.model.d_model, s.d_ff, s.experts
    tokens = _e(m, "reshape", [h], f"{p}moe_tokens", {"shape": [dims.product(h.shape[:-1]), d]})
    attrs = {"experts": e, "top_k": s.top_k, "scoring": "sigmoid", "norm_topk_prob": True,
             "routed_scale": float(s.route_scale)}
    ids, weights = m.emit("moe_route", [tokens, m.param(f"{p}moe.router", (e, d)),
                                        m.param(f"{p}moe.router_bias", (e,))], attrs,
                          [f"{p}moe_expert_ids", f"{p}moe_weights"])
    token_index, slot_index, indptr = m.emit("moe_dispatch", [ids], {"experts": e},
                                             [f"{p}moe_token_index", f"{p}moe_slot_index", f"{p}moe_indptr"])
    gemm = {"experts": e, "top_k": s.top_k}
    rows = _e(m, "gather", [tokens, token_index], f"{p}moe_rows", {"axis": 0})
    gate = _e(m, "grouped_gemm", [rows, m.param(f"{p}moe.w_gate", (e, f, d)), indptr], f"{p}moe_gate", gemm)
    up = _e(m, "grouped_gemm", [rows, m.param(f"{p}moe.w_up", (e, f, d)), indptr], f"{p}moe_up", gemm)
    act = _e(m, "mul", [_e(m, "softcap", [gate], f"{p}moe_gate_capped", {"cap": float(s.gate_cap)}),
                        _e(m, "sigmoid", [gate], f"{p}moe_gate_sigmoid")], f"{p}moe_gate_act")
    act = _e(m, "mul", [act, _e(m, "softcap", [up], f"{p}moe_up_capped", {"cap": float(s.up_cap)})], f"{p}moe_act")
    out = _e(m, "grouped_gemm", [act, m.param(f"{p}moe.w_down", (e, d, f)), indptr], f"{p}moe_down", gemm)
    pairs = dims.product(ids.shape)
    row_weights = _e(m, "gather", [_e(m, "reshape", [weights], f"{p}moe_weights_flat", {"shape": [pairs]}),
                                   slot_index], f"{p}moe_row_weights", {"axis": 0})
    row_weights = _e(m, "reshape", [row_weights], f"{p}moe_row_weights_M1", {"shape": [out.shape[0], 1]})
    weighted = _e(m, "mul", [out, row_weights], f"{p}moe_weighted")
    base = _e(m, "expand", [_const(m, 0.0, f"{p}moe_zero")], f"{p}moe_base", {"shape": [tokens.shape[0], d]})
    routed = _e(m, "scatter_add", [base, token_index, weighted], f"{p}moe_combined")
    return _e(m, "reshape", [routed], f"{p}moe_out", {"shape": list(h.shape)})


def layer_block(layer, x, blocks: list, s: Inkling2, slots, tau, j: Optional[int] = None, gate=None):
    """Decoder layer ``j`` (default the layer's index) run as this layer: (its output, the block
    states its MLP input mixed). ``gate(which, h)`` (Inkling-2-Loop's message gates, "q", "k",
    "v", "mlp") transforms the attention and MLP inputs where given."""
    m, p, eps = layer.model, layer.prefix, layer.eps
    j = layer.index if j is None else j
    kind = s.kinds[j]
    if kind == SLIDING:
        h = x if j == 0 else mix(m, f"{p}attention_input.query", blocks, x)[0]
        hq, hk, hv = [layer.rms_norm(h, "attn_norm", eps)] * 3 if gate is None else \
            [layer.rms_norm(gate(w, h), "attn_norm", eps) for w in "qkv"]
        a = _attention(layer, hq, hk, hv, s.heads[kind], s, slots, None)
    else:
        inputs = [x] * 3 if j == 0 else mix(m, f"{p}attention_input.query", blocks, x, 3)
        inputs = inputs if gate is None else [gate(w, h) for h, w in zip(inputs, "qkv")]
        hq, hk, hv = (layer.rms_norm(h, f"{w}_in_norm", eps) for h, w in zip(inputs, "qkv"))
        a = _attention(layer, hq, hk, hv, s.heads[kind], s, slots, tau)
    a = short_conv(layer, a, "attn", m.d_model, s.kernel, scale=(s.kernel + 1) ** -0.5)
    boundary = j % s.block == 0
    local = blocks + [x] if boundary else blocks
    residual = a if boundary else m.add(x, a, f"{p}attn_residual")
    h = mix(m, f"{p}mlp_input.query", local, residual)[0]
    h = layer.rms_norm(h if gate is None else gate("mlp", h), "mlp_norm", eps)
    f = short_conv(layer, _experts(layer, h, s), "mlp", m.d_model, s.kernel, scale=(s.kernel + 1) ** -0.5)
    return m.add(residual, f, f"{p}mlp_residual"), local


def start(m: Model, s: Inkling2, arch: Arch) -> tuple:
    """(the normed embedding, the slots and tau every layer reads)."""
    ids = m.input_ids()
    x = m.norm(m.embed(ids, rows=s.vocab_rows), "embed_norm", "rms", arch.norm_eps)
    queries, keys, distance = _slots(m, ids)
    new_slots = _e(m, "reshape", [queries], "query_slot_T", {"shape": ["T"]})
    return x, (queries, keys, distance, new_slots), _tau(m, s) if FULL in s.kinds else None


def finish(m: Model, s: Inkling2, arch: Arch, x, blocks: list) -> None:
    x = mix(m, "final_input.query", blocks, x)[0]
    m.logits(m.rms_norm(x, "norm", arch.norm_eps), softcap=s.final_cap)


def _graph(s: Inkling2, arch: Arch, origin: str):
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    with m.at(origin):
        x, slots, tau = start(m, s, arch)
        blocks: list = []
        for layer in m.layers(arch.n_layers):
            layer.eps = arch.norm_eps
            x, blocks = layer_block(layer, x, blocks, s, slots, tau)
        finish(m, s, arch, x, blocks)
    return m.graph


class Interleaved(Tensor):
    """The gate (``half`` 0) or up (1) rows of ``w13_weight`` [E, 2F, d], stored interleaved
    (row 2j gate j, row 2j + 1 up j: transformers' ``Interleave(dim=1)`` undoes it), as [E, F, d]."""

    def __init__(self, name: str, half: int):
        super().__init__(name)
        self.half = half

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        full = list(checkpoint.info(self.name)[1])
        if len(full) != 3 or full[1] % 2:
            raise SpecError(f"tensor {self.name} {full} is not [E, 2F, d]", location=checkpoint.file(self.name))
        return [full[0], full[1] // 2, full[2]]

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        self.shape(checkpoint)
        return np.ascontiguousarray(checkpoint.read(self.name, start, stop)[:, self.half::2])

    def __repr__(self) -> str:
        return f"{self.name}[{('gate', 'up')[self.half]} rows]"


def _query(kind: str, offset: int):
    """Layer i's block-mix query: ``attn_res.{kind}.{i - offset}`` beside the layers."""
    def source(arch: Arch, prefix: str) -> Tensor:
        return Tensor(f"model.llm.attn_res.{kind}.{int(prefix.rstrip('.').rsplit('.', 1)[1]) - offset}")
    return source


def _resolve(arch: Arch, param: str, checkpoint) -> Optional[Rows]:
    """The LM head: the first ``unpadded_vocab_size`` rows of ``unembed`` (stored padded)."""
    return Rows("model.llm.unembed.weight", 0, arch.vocab_size) if param == "lm_head" else None


def _projections() -> dict:
    names = {}
    for x in "kv":
        names.update({f"attn.w{x}": f"attn.w{x}_dv.weight", f"{x}_conv": f"attn.{x}_sconv.weight",
                      f"{x}_static": f"attn.{x}_sconv.static_w", f"{x}_dyn": f"attn.{x}_sconv.weight_proj"})
    return names


FAMILIES = {"inkling2_text": _inkling2}
LAYOUTS = {"inkling2_text": {  # as transformers saves it (the released checkpoints' names)
    "attn_norm": "attn_norm.weight", "mlp_norm": "mlp_norm.weight",
    **{f"{x}_in_norm": f"{x}_input_norm.weight" for x in "qkv"},
    "attention_input.query": _query("attn_queries", 1), "mlp_input.query": _query("mlp_queries", 0),
    "attn.wq": "attn.wq_du.weight", "attn.q_scale": "attn.q_l2_clip.scale", **_projections(),
    "attn.w_gate": "attn.gate_attn.weight", "attn.wo": "attn.wo_ud.weight", "attn.sinks": "attn.attn_sink_proj.weight",
    "attn.rel_proj": "attn.rel_logits_proj.proj", "attn.wr": "attn.wr_du.weight",
    "attn.rel_scale": "attn.rel_l2_clip.scale", "attn_conv": "attn_sconv.weight", "mlp_conv": "mlp_sconv.weight",
    "moe.router": "mlp.gate.weight", "moe.router_bias": "mlp.gate.bias",
    "moe.w_gate": lambda arch, prefix: Interleaved(f"{prefix}mlp.experts.w13_weight", 0),
    "moe.w_up": lambda arch, prefix: Interleaved(f"{prefix}mlp.experts.w13_weight", 1),
    "moe.w_down": "mlp.experts.w2_weight", "_prefix": "model.llm.layers.", "_resolve": _resolve,
    "_top": {"embed": "model.llm.embed.weight", "embed_norm": "model.llm.embed_norm.weight",
             "norm": "model.llm.norm.weight", "final_input.query": "model.llm.attn_res.output_query"}}}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
