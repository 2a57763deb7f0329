"""Thinking Machines' Inkling text decoder (``inkling_text``): attention without RoPE whose
keys and values pass short convolutions, a relative position bias read from each query's
own relative states, and a sigmoid-routed MoE whose shared experts share the routing softmax
(``frontends.hf.families`` registers it).

Layer i (transformers' ``InklingDecoderLayer``), with sc(x) = x + conv(x) a depthwise causal
convolution of ``conv_kernel_size`` taps (``sconv_kernel_size``) and its residual::

    x = x + sc_attn(o(attention(rms(x))));   x = x + sc_mlp(ffn(rms(x)))
    attention: q = rms_head(q(h)), k = rms_head(sc_k(k(h))), v = sc_v(v(h)), r = r(h) [H, d_rel]
               score(t, j) = tau(t) · (q_t·k_j / head_dim + r_t·proj[:, d])  for 0 <= d < extent
               (d = (P + t) − j, the slot distance; the bias is 0 beyond extent)
    ffn:       SwiGLU · global_scale (``mlp_layer_types`` "dense") or the MoE ("sparse")

Layers whose ``layer_types`` entry is "hybrid_sliding" see ``sliding_window_size`` keys (d <
window) with ``swa_*`` head counts and extent = the window; "hybrid" layers see every key,
extent ``rel_extent``. tau(t) = 1 + ``log_scaling_alpha`` · log(max((P + t + 1) /
``log_scaling_n_floor``, 1)) on the full layers when the floor is set, else 1: transformers
counts the query's slot in the cache (left padding included), not its position id, and so
does irc (P + t, from the mask's and the ids' lengths). The embedding is RMS-normed
(``embed_tokens.embed_norm``); logits = lm_head(rms(x) / ``logits_mup_width_multiplier``), the
first ``unpadded_vocab_size`` of them where that is set (irc reads only those rows of the head).

Attention is built from primitives (matmul, gather, where, softmax: no new op), the keys and
values cached after their convolution and norm (``past_key_values.{i}.key`` / ``.value``);
each layer's four convolutions keep their last K−1 inputs as graph states
``past_key_values.{i}.{k,v,attn,mlp}_conv_state`` [B, C, K−1] (the ``causal_conv1d`` op: a
padded token's input is zeroed, as transformers' conv mask does).

The MoE (``InklingMoE``): logits l = x @ gate.T over the E routed and S shared experts; top-k
of sigmoid(l) + ``e_score_correction_bias`` among the routed; every chosen and shared expert
weighs sigmoid(l_e) / (sum over chosen and shared of sigmoid) · ``route_scale`` ·
gate.global_scale. irc: the ``moe`` op (sigmoid, selection bias, no renormalisation) gives the
routed sum of sigmoid(l_e)·expert_e, ``moe_route`` the chosen sigmoids' sum, and the shared
experts are SwiGLU linears; the sum is scaled by route_scale · global_scale / denominator.

Refused, naming config.json and the key: activations other than SiLU, ``n_shared_experts`` 0
(transformers' router slices ``[:-0]``: no routed experts), layer or MLP kinds other than the
above, lists whose length is not ``num_hidden_layers``. ``shared_expert_sink`` and
``rms_norm_eps_moe_gate`` are not read by transformers' model (the sink is always on), nor by
irc. The multi-token-prediction layers (``model.mtp.*``) are not part of the causal LM and are
ignored, as transformers does.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Optional

import numpy as np

from frontends.dsl import Model
from frontends.hf.config import Arch, Attention, Config, LayerSpec, int_list, string_list
from frontends.hf.weights import Checkpoint, FusedExperts, Rows, Tensor
from irc.errors import SpecError
from irc.yamlloc import layer_count, non_negative_int, number, positive_int, positive_number, size

SLIDING, FULL, DENSE, SPARSE = "hybrid_sliding", "hybrid", "dense", "sparse"
MASKED = float(np.finfo(np.float32).min)  # a hidden score: exp(MASKED - peak) is exactly 0

DEFAULTS = {  # transformers 5.25's InklingTextConfig
    "inkling_text": {
        "vocab_size": 201024, "unpadded_vocab_size": None, "hidden_size": 6144, "num_hidden_layers": 66,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "swa_num_attention_heads": 64,
        "swa_num_key_value_heads": 16, "swa_head_dim": 128, "sliding_window_size": 512, "d_rel": 16,
        "rel_extent": 1024, "log_scaling_n_floor": None, "log_scaling_alpha": 0.1, "local_layer_ids": None,
        "layer_types": None, "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "conv_kernel_size": 4,
        "mlp_layer_types": None, "intermediate_size": 24576, "hidden_act": "silu", "moe_intermediate_size": 3072,
        "n_routed_experts": 256, "num_experts_per_tok": 6, "n_shared_experts": 2, "shared_expert_sink": True,
        "route_scale": 8.0, "logits_mup_width_multiplier": 24.0, "rms_norm_eps_moe_gate": 1e-6,
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None},
}
ALIASES = {"sconv_kernel_size": "conv_kernel_size", "sliding_window": "sliding_window_size",
           "num_local_experts": "n_routed_experts", "embedding_multiplier": "logits_mup_width_multiplier"}


@dataclass
class Heads:
    heads: int
    kv_heads: int
    head_dim: int
    extent: int
    window: Optional[int]


@dataclass
class Inkling:
    kinds: list
    mlps: list
    heads: dict
    d_rel: int
    kernel: int
    d_ff: int
    moe: dict
    log_floor: Optional[float]
    log_alpha: float
    mup: float
    vocab_rows: int


def _key(cfg: Config, key: str) -> str:
    """``key``, or the name transformers' attribute_map reads for it where only that is written."""
    alias = next((a for a, k in ALIASES.items() if k == key), None)
    return alias if alias is not None and alias in cfg.data and key not in cfg.data else key


def _kinds(cfg: Config, n: int) -> tuple[list, list]:
    """(attention kinds, MLP kinds) per layer, derived as ``InklingTextConfig.__post_init__``."""
    types = cfg.get("layer_types", string_list, None)
    if types is None:
        local = cfg.get("local_layer_ids", int_list, None)
        local = {i for i in range(n) if (i + 1) % 6} if local is None else set(local)
        types = [SLIDING if i in local else FULL for i in range(n)]
    mlps = cfg.get("mlp_layer_types", string_list, None)
    if mlps is None:
        dense = cfg.get("dense_mlp_idx", non_negative_int, 0)
        mlps = [DENSE if i < dense else SPARSE for i in range(n)]
    for key, values, kinds in (("layer_types", types, (SLIDING, FULL)), ("mlp_layer_types", mlps, (DENSE, SPARSE))):
        for kind in values:
            if kind not in kinds:
                raise cfg.unsupported(key, kind, hint=f"Inkling's kinds: {', '.join(kinds)}")
        if len(values) != n:
            raise cfg.error(key, f"has {len(values)} entries for {n} layers (num_hidden_layers)")
    return types, mlps


def _heads(cfg: Config, sliding: bool) -> Heads:
    prefix = "swa_" if sliding else ""
    heads, kv_heads = cfg.get(f"{prefix}num_attention_heads", size), cfg.get(f"{prefix}num_key_value_heads", size)
    if heads % kv_heads:
        raise cfg.error(f"{prefix}num_key_value_heads", f"{heads} heads are not divisible by {kv_heads} kv heads")
    window = cfg.get(_key(cfg, "sliding_window_size"), positive_int) if sliding else None
    extent = window if sliding else cfg.get("rel_extent", positive_int)
    return Heads(heads, kv_heads, cfg.get(f"{prefix}head_dim", size), extent, window)


def _moe_widths(cfg: Config) -> tuple[int, int]:
    """(dense MLP width, experts' width): a ``dense_intermediate_size`` makes
    ``intermediate_size`` the experts' width, as ``__post_init__`` reads it."""
    if cfg.get("dense_intermediate_size", size, None) is not None:
        return cfg.get("dense_intermediate_size", size), cfg.get("intermediate_size", size)
    return cfg.get("intermediate_size", size), cfg.get("moe_intermediate_size", size)


def _inkling(cfg: Config, name: str, model_type: str) -> Arch:
    """Inkling's text decoder (see the module docstring)."""
    cfg.check("hidden_act", lambda v: v == "silu", hint="Inkling's MLPs and experts are SwiGLU")
    n = cfg.get("num_hidden_layers", layer_count)
    vocab = cfg.get("vocab_size", positive_int)
    unpadded = cfg.get("unpadded_vocab_size", positive_int, None)
    head = vocab if unpadded is None else min(unpadded, vocab)  # logits[..., :unpadded_vocab_size]
    kinds, mlps = _kinds(cfg, n)
    d_ff, expert_ff = _moe_widths(cfg)
    moe = {}
    if SPARSE in mlps:
        experts = cfg.get(_key(cfg, "n_routed_experts"), positive_int)
        top_k = cfg.get("num_experts_per_tok", positive_int)
        if top_k > experts:
            raise cfg.error("num_experts_per_tok", f"{top_k} exceeds the {experts} routed experts")
        moe = {"experts": experts, "top_k": top_k, "d_ff": expert_ff,
               "shared": cfg.get("n_shared_experts", positive_int),
               "route_scale": cfg.get("route_scale", number)}
    floor = cfg.get("log_scaling_n_floor", positive_number, None)
    s = Inkling(kinds=kinds, mlps=mlps, heads={k: _heads(cfg, k == SLIDING) for k in set(kinds)},
                d_rel=cfg.get("d_rel", size), kernel=cfg.get(_key(cfg, "conv_kernel_size"), positive_int),
                d_ff=d_ff, moe=moe, log_floor=floor, log_alpha=cfg.get("log_scaling_alpha", number),
                mup=cfg.get(_key(cfg, "logits_mup_width_multiplier"), positive_number), vocab_rows=vocab)
    first = s.heads[kinds[0]]
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=head,
                d_model=cfg.get("hidden_size", size), n_layers=n, norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=Attention("gqa", first.heads, first.kv_heads, first.head_dim, qk_norm=True,
                                    scale=1.0 / first.head_dim),
                layers=[LayerSpec(s.heads[k].window, None, m == SPARSE) for k, m in zip(kinds, mlps)],
                mlp={"kind": "swiglu", "d_ff": d_ff}, tied=False, checkpoint="inkling_text",
                expand=partial(_graph, s))


# ---- the graph ---------------------------------------------------------------------------------

def _e(m: Model, op: str, inputs, name: str, attrs: Optional[dict] = None):
    return m.emit(op, inputs, attrs, name)[0]


def _const(m: Model, value, name: str, dtype: str = "f32"):
    return _e(m, "constant", [], name, {"value": value, "dtype": dtype})


def _linear(m: Model, x, weight, name: str):
    return _e(m, "linear", [x, weight, None], name)


def _slots(m: Model, ids) -> tuple:
    """(query slots P + t [T, 1], key slots j [S], their distance (P + t) − j [T, S]), i64."""
    mask, _ = m._context()
    keys = _e(m, "range_like", [mask], "key_slot", {"axis": 1})
    past = _e(m, "sub", [_e(m, "dim_size", [mask], "total_length", {"axis": 1}),
                         _e(m, "dim_size", [ids], "new_length", {"axis": 1})], "past_length")
    queries = _e(m, "add", [_e(m, "range_like", [ids], "new_index", {"axis": 1}), past], "query_slot")
    queries = _e(m, "reshape", [queries], "query_slot_T1", {"shape": ["T", 1]})
    return queries, keys, _e(m, "sub", [queries, keys], "slot_distance")


def _tau(m: Model, s: Inkling, queries):
    """[T, 1] f32: 1 + alpha · log(max((P + t + 1) / floor, 1))."""
    n = _e(m, "add", [_e(m, "cast", [queries], "tau_slot", {"to": "f32"}), _const(m, 1.0, "tau_one")], "tau_n")
    ratio = _e(m, "maximum", [_e(m, "div", [n, _const(m, float(s.log_floor), "tau_floor")], "tau_ratio"),
                              _const(m, 1.0, "tau_min")], "tau_clamped")
    scaled = _e(m, "mul", [_e(m, "log", [ratio], "tau_log"), _const(m, float(s.log_alpha), "tau_alpha")], "tau_term")
    return _e(m, "add", [scaled, _const(m, 1.0, "tau_base")], "tau")


def short_conv(layer, x, kind: str, channels: int, kernel: int, scale: Optional[float] = None):
    """x + causal_conv1d(x) (times ``scale``: Inkling-2's) with its state
    ``past_key_values.{i}.{kind}_conv_state``."""
    m, p, i = layer.model, layer.prefix, layer.index
    mask, _ = m._context()
    weight = m.param(f"{p}{kind}_conv", (channels, 1, kernel))
    past = m._state(i, f"{kind}_conv_state", (channels, kernel - 1))
    y, present = m.emit("causal_conv1d", [x, weight, None, past, mask], {"activation": None},
                        [f"{p}{kind}_conv_out", f"present.{i}.{kind}_conv_state"])
    m._presents.append(present.value)
    out = _e(m, "add", [x, y], f"{p}{kind}_conv_residual")
    if scale is None:
        return out
    return _e(m, "mul", [out, _const(m, scale, f"{p}{kind}_conv_scale")], f"{p}{kind}_conv_scaled")


def _head_norm(m: Model, x, pname: str, heads: int, head_dim: int, eps: float):
    """Per-head RMS norm: [B, T, heads·hd] -> [B, T, heads, hd] normed by @pname [hd]."""
    split = _e(m, "reshape", [x], f"{pname}_heads", {"shape": ["B", "T", heads, head_dim]})
    return m.norm(split, pname, "rms", eps)


def rel_bias(m: Model, p: str, rel, heads: int, d_rel: int, extent: int, distance):
    """The relative position bias [B, H, T, S] of relative states ``rel`` [B, T, H, d_rel]:
    rel · proj[:, d] where 0 <= d < extent (``@{p}attn.rel_proj`` [d_rel, extent]), else 0."""
    total = m._context()[0].shape[1]
    ahead = _e(m, "less_equal", [_const(m, 0, f"{p}zero_distance", "i64"), distance], f"{p}not_future")
    inside = _e(m, "logical_and", [ahead, _e(m, "less", [distance, _const(m, extent, f"{p}extent", "i64")],
                                              f"{p}within_extent")], f"{p}in_extent")
    index = _e(m, "where", [inside, distance, _const(m, 0, f"{p}index_zero", "i64")], f"{p}rel_index")
    table = _e(m, "transpose", [m.param(f"{p}attn.rel_proj", (d_rel, extent))], f"{p}rel_table", {"perm": [1, 0]})
    rows = _e(m, "gather", [table, index], f"{p}rel_rows", {"axis": 0})  # [T, S, d_rel]
    rows = _e(m, "transpose", [rows], f"{p}rel_rows_TrS", {"perm": [0, 2, 1]})
    rows = _e(m, "reshape", [rows], f"{p}rel_rows_1TrS", {"shape": [1, "T", d_rel, total]})
    bias = _e(m, "matmul", [rel, rows], f"{p}rel_bias_BTHS")
    wide = _e(m, "reshape", [inside], f"{p}in_extent_1T1S", {"shape": [1, "T", 1, total]})
    bias = _e(m, "where", [wide, bias, _const(m, 0.0, f"{p}bias_zero")], f"{p}rel_bias_masked")
    return _e(m, "transpose", [bias], f"{p}rel_bias", {"perm": [0, 2, 1, 3]})


def _bias(layer, h, a: Heads, s: Inkling, distance):
    m, p = layer.model, layer.prefix
    rel = _e(m, "reshape", [_linear(m, h, m.param(f"{p}attn.wr", (a.heads * s.d_rel, m.d_model)), f"{p}rel")],
             f"{p}rel_heads", {"shape": ["B", "T", a.heads, s.d_rel]})
    return rel_bias(m, p, rel, a.heads, s.d_rel, a.extent, distance)


def _attention(layer, h, a: Heads, s: Inkling, slots, tau, eps: float):
    """Inkling's attention for one layer (its cache ``past_key_values.{i}.key/value``)."""
    m, p, i, d = layer.model, layer.prefix, layer.index, layer.model.d_model
    queries, keys, distance = slots
    total = m._context()[0].shape[1]
    group, kv_width = a.heads // a.kv_heads, a.kv_heads * a.head_dim
    q = _linear(m, h, m.param(f"{p}attn.wq", (a.heads * a.head_dim, d)), f"{p}q")
    k = short_conv(layer, _linear(m, h, m.param(f"{p}attn.wk", (kv_width, d)), f"{p}k"), "k", kv_width, s.kernel)
    v = short_conv(layer, _linear(m, h, m.param(f"{p}attn.wv", (kv_width, d)), f"{p}v"), "v", kv_width, s.kernel)
    q = _head_norm(m, q, f"{p}attn.q_norm", a.heads, a.head_dim, eps)
    k = _head_norm(m, k, f"{p}attn.k_norm", a.kv_heads, a.head_dim, eps)
    q = _e(m, "reshape", [q], f"{p}q_groups", {"shape": ["B", "T", a.kv_heads, group, a.head_dim]})
    q = _e(m, "transpose", [q], f"{p}q_BKGTD", {"perm": [0, 2, 3, 1, 4]})
    bias = _bias(layer, h, a, s, distance)
    if tau is not None:
        q, bias = _e(m, "mul", [q, tau], f"{p}q_scaled"), _e(m, "mul", [bias, tau], f"{p}rel_bias_scaled")
    k = _e(m, "transpose", [k], f"{p}k_BKTD", {"perm": [0, 2, 1, 3]})
    v = _e(m, "transpose", [_e(m, "reshape", [v], f"{p}v_heads", {"shape": ["B", "T", a.kv_heads, a.head_dim]})],
           f"{p}v_BKTD", {"perm": [0, 2, 1, 3]})
    past_key, past_value = m._past(i, a.kv_heads, a.head_dim, a.head_dim)
    key = _e(m, "concat", [past_key, k], f"present.{i}.key", {"axis": 2})
    value = _e(m, "concat", [past_value, v], f"present.{i}.value", {"axis": 2})
    m._presents += [key.value, value.value]
    layer._note_attention("mqa" if a.kv_heads == 1 else "gqa", a.heads, a.kv_heads, a.head_dim, a.head_dim,
                          a.window, None, 1.0 / a.head_dim, None)
    key_t = _e(m, "transpose", [_e(m, "reshape", [key], f"{p}key_BK1SD", {"shape": ["B", a.kv_heads, 1, total,
                                                                                     a.head_dim]})],
               f"{p}key_BK1DS", {"perm": [0, 1, 2, 4, 3]})
    scores = _e(m, "mul", [_e(m, "matmul", [q, key_t], f"{p}scores"), _const(m, 1.0 / a.head_dim, f"{p}scale")],
                f"{p}scores_scaled")
    bias = _e(m, "reshape", [bias], f"{p}rel_bias_BKGTS", {"shape": ["B", a.kv_heads, group, "T", total]})
    scores = _e(m, "add", [scores, bias], f"{p}scores_biased")
    visible = _visible(m, p, a, queries, keys)
    scores = _e(m, "where", [visible, scores, _const(m, MASKED, f"{p}hidden")], f"{p}scores_masked")
    weights = _e(m, "where", [visible, _e(m, "softmax", [scores], f"{p}weights", {"axis": -1}),
                              _const(m, 0.0, f"{p}weights_zero")], f"{p}weights_visible")
    value = _e(m, "reshape", [value], f"{p}value_BK1SD", {"shape": ["B", a.kv_heads, 1, total, a.head_dim]})
    out = _e(m, "transpose", [_e(m, "matmul", [weights, value], f"{p}context")], f"{p}context_BTKGD",
             {"perm": [0, 3, 1, 2, 4]})
    out = _e(m, "reshape", [out], f"{p}merged", {"shape": ["B", "T", a.heads * a.head_dim]})
    return _linear(m, out, m.param(f"{p}attn.wo", (d, a.heads * a.head_dim)), f"{p}attn_out")


def _visible(m: Model, p: str, a: Heads, queries, keys):
    """Bool [B, 1, 1, T, S]: key j is real, j <= P + t and (sliding) P + t − j < window."""
    mask, _ = m._context()
    visible = _e(m, "less_equal", [keys, queries], f"{p}causal")
    if a.window is not None:
        oldest = _e(m, "sub", [queries, _const(m, a.window, f"{p}window", "i64")], f"{p}window_start")
        visible = _e(m, "logical_and", [visible, _e(m, "less", [oldest, keys], f"{p}in_window")], f"{p}causal_window")
    real = _e(m, "reshape", [_e(m, "cast", [mask], f"{p}key_is_real", {"to": "bool"})], f"{p}key_is_real_B111S",
              {"shape": ["B", 1, 1, 1, mask.shape[1]]})
    return _e(m, "logical_and", [visible, real], f"{p}visible")


def _mlp(layer, h, d_ff: int):
    m, p, d = layer.model, layer.prefix, layer.model.d_model
    gate = _e(m, "silu", [_linear(m, h, m.param(f"{p}mlp.w_gate", (d_ff, d)), f"{p}mlp_gate")], f"{p}mlp_act")
    hidden = _e(m, "mul", [gate, _linear(m, h, m.param(f"{p}mlp.w_up", (d_ff, d)), f"{p}mlp_up")], f"{p}mlp_hidden")
    out = _linear(m, hidden, m.param(f"{p}mlp.w_down", (d, d_ff)), f"{p}mlp_down")
    layer._note_mlp("swiglu", d_ff)
    return _e(m, "mul", [out, m.param(f"{p}mlp.global_scale", (1,))], f"{p}mlp_out")


def _moe(layer, h, c: dict):
    """The routed experts (``moe`` op, unnormalised sigmoid weights) and the shared experts,
    all scaled by route_scale · global_scale / (chosen + shared sigmoids)."""
    m, p, d, f = layer.model, layer.prefix, layer.model.d_model, c["d_ff"]
    routed = layer.moe(h, experts=c["experts"], top_k=c["top_k"], d_ff=f, scoring="sigmoid", router_bias=True,
                       norm_topk_prob=False)
    attrs = {"experts": c["experts"], "top_k": c["top_k"], "scoring": "sigmoid", "norm_topk_prob": False,
             "routed_scale": 1.0}
    router, bias = m._graph.params[f"{p}moe.router"], m._graph.params[f"{p}moe.router_bias"]
    _, chosen = m.emit("moe_route", [h, router, bias], attrs, [f"{p}moe_ids", f"{p}moe_chosen"])
    chosen = _e(m, "reduce_sum", [chosen], f"{p}moe_chosen_sum", {"axes": [-1], "keepdims": True})
    chosen = _e(m, "reshape", [chosen], f"{p}moe_chosen_BT1", {"shape": ["B", "T", 1]})
    shared = _e(m, "sigmoid", [_linear(m, h, m.param(f"{p}moe.shared_router", (c["shared"], d)),
                                       f"{p}moe_shared_logits")], f"{p}moe_shared_scores")
    total = _e(m, "add", [chosen, _e(m, "reduce_sum", [shared], f"{p}moe_shared_sum",
                                     {"axes": [-1], "keepdims": True})], f"{p}moe_denominator")
    scale = _e(m, "mul", [m.param(f"{p}moe.global_scale", (1,)), _const(m, float(c["route_scale"]),
                                                                       f"{p}route_scale")], f"{p}moe_scale")
    factor = _e(m, "div", [scale, total], f"{p}moe_factor")
    out = _e(m, "mul", [routed, factor], f"{p}moe_routed")
    for e in range(c["shared"]):
        gamma = _e(m, "mul", [_e(m, "slice", [shared], f"{p}moe_shared_score{e}",
                                 {"axis": -1, "start": e, "end": e + 1}), factor], f"{p}moe_gamma{e}")
        gate = _e(m, "silu", [_linear(m, h, m.param(f"{p}moe.shared{e}_gate", (f, d)), f"{p}shared{e}_gate")],
                  f"{p}shared{e}_act")
        hidden = _e(m, "mul", [gate, _linear(m, h, m.param(f"{p}moe.shared{e}_up", (f, d)), f"{p}shared{e}_up")],
                    f"{p}shared{e}_hidden")
        hidden = _e(m, "mul", [hidden, gamma], f"{p}shared{e}_weighted")
        out = _e(m, "add", [out, _linear(m, hidden, m.param(f"{p}moe.shared{e}_down", (d, f)), f"{p}shared{e}_out")],
                 f"{p}moe_out_{e}")
    return out


def _graph(s: Inkling, arch: Arch, origin: str):
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps = arch.norm_eps
    with m.at(origin):
        ids = m.input_ids()
        x = m.norm(m.embed(ids, rows=s.vocab_rows), "embed_norm", "rms", eps)
        slots = _slots(m, ids)
        tau = _tau(m, s, slots[0]) if s.log_floor is not None and FULL in s.kinds else None
        for layer in m.layers(arch.n_layers):
            kind, p = s.kinds[layer.index], layer.prefix
            h = layer.rms_norm(x, "attn_norm", eps)
            a = _attention(layer, h, s.heads[kind], s, slots, tau if kind == FULL else None, eps)
            x = m.add(x, short_conv(layer, a, "attn", arch.d_model, s.kernel), f"{p}attn_residual")
            h = layer.rms_norm(x, "mlp_norm", eps)
            f = _moe(layer, h, s.moe) if s.mlps[layer.index] == SPARSE else _mlp(layer, h, s.d_ff)
            x = m.add(x, short_conv(layer, f, "mlp", arch.d_model, s.kernel), f"{p}mlp_residual")
        m.logits(m.rms_norm(x, "norm", eps), scale=1.0 / s.mup)
    return m.graph


# ---- the checkpoint ----------------------------------------------------------------------------

class ExpertSlice(Tensor):
    """Expert ``index`` of a [S, ...] tensor (the shared experts' stacked weights) as a 2-D param."""

    def __init__(self, name: str, index: int):
        super().__init__(name)
        self.index = index

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        full = list(checkpoint.info(self.name)[1])
        if len(full) != 3 or full[0] <= self.index:
            raise SpecError(f"tensor {self.name} {full} has no expert {self.index}",
                            location=checkpoint.file(self.name))
        return full[1:]

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        self.shape(checkpoint)
        return np.ascontiguousarray(checkpoint.read(self.name, self.index, self.index + 1)[0][start:stop])

    def __repr__(self) -> str:
        return f"{self.name}[{self.index}]"


class _Layer(dict):
    """Per-layer names; ``moe.shared{e}_{gate,up,down}`` read expert e of the stacked tensors."""

    def get(self, key, default=None):
        if isinstance(key, str) and key.startswith("moe.shared") and key[10:11].isdigit():
            e, part = key[10:].split("_", 1)
            return lambda arch, prefix: ExpertSlice(f"{prefix}mlp.shared_experts.{part}_proj", int(e))
        return super().get(key, default)


def _router(routed: bool):
    def source(arch: Arch, prefix: str) -> Rows:
        experts = arch.expand.args[0].moe
        start, stop = (0, experts["experts"]) if routed else (experts["experts"],
                                                              experts["experts"] + experts["shared"])
        return Rows(f"{prefix}mlp.gate.weight", start, stop)
    return source


def _fused(part: str):
    def source(arch: Arch, prefix: str) -> FusedExperts:
        name = "gate_up_proj" if part != "down" else "down_proj"
        return FusedExperts(f"{prefix}mlp.experts.{name}", part, arch.expand.args[0].moe["d_ff"], arch.d_model)
    return source


def _resolve(arch: Arch, param: str, checkpoint) -> Optional[Rows]:
    """The LM head's first ``unpadded_vocab_size`` rows (transformers drops the logits past them)."""
    return Rows("lm_head.weight", 0, arch.vocab_size) if param == "lm_head" else None


FAMILIES = {"inkling_text": _inkling}
LAYOUTS = {"inkling_text": _Layer({
    "attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
    **{f"attn.w{x}": f"self_attn.{x}_proj.weight" for x in "qkvro"}, "attn.rel_proj": "self_attn.rel_logits_proj.proj",
    "attn.q_norm": "self_attn.q_norm.weight", "attn.k_norm": "self_attn.k_norm.weight",
    "k_conv": "self_attn.k_sconv.conv1d.weight", "v_conv": "self_attn.v_sconv.conv1d.weight",
    "attn_conv": "attn_sconv.conv1d.weight", "mlp_conv": "mlp_sconv.conv1d.weight",
    **{f"mlp.w_{x}": f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")}, "mlp.global_scale": "mlp.global_scale",
    "moe.router": _router(True), "moe.shared_router": _router(False), "moe.global_scale": "mlp.gate.global_scale",
    "moe.router_bias": "mlp.gate.e_score_correction_bias",
    **{f"moe.w_{x}": _fused(x) for x in ("gate", "up", "down")},
    "_top": {"embed": "model.embed_tokens.weight", "embed_norm": "model.embed_tokens.embed_norm.weight",
             "norm": "model.norm.weight", "lm_head": "lm_head.weight"},
    "_spare": ("model.mtp.",), "_resolve": _resolve})}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
