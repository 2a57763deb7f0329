"""ZAYA1 (Zyphra; ``model_type`` zaya, transformers' ``ZayaForCausalLM``), built by its own
loop through the DSL.

Model: x = (embed + ``input_hidden_states_bias``) · ``input_hidden_states_scale``; layer i::

    a = attn(input_layernorm(x));           x = (a + hb)·hs + (x + rb)·rs   (post_attention_residual_scale)
    m = moe(post_attention_layernorm(x));   x = (m + hb)·hs + (x + rb)·rs   (post_mlp_residual_scale)
    logits = lm_head(norm(x)) (+ bias with ``lm_head_bias``; tied by default)

CCA projection (``ZayaCCAProjection``), H query heads, K kv heads of D, g = H/K, on the
hidden states h (padded tokens zeroed, the ``conv`` mask): q = Wq·h, k = Wk·h; the q/k
residuals qr = (q + k repeated per group)/2 and kr = qr's mean over each group; q|k (C =
(H+K)·D channels) goes through a depthwise causal convolution of ``cca_time0`` taps and a
grouped one of ``cca_time1`` taps (one [D, D] matrix per head and tap), both with biases,
over a zero history; q = conv[:H·D] + qr, k = conv[H·D:] + kr. irc writes the first as the
``causal_conv1d`` op without its bias (u; state ``conv_state`` [B, C, t0-1], padded inputs
zeroed, as the op does), the second as Σ_j W_j·(u delayed j tokens + b_dw) + b_g, each W_j
the block-diagonal [C, C] of tap t1-1-j, the delays chained ``token_shift`` ops (states
``shift_state_{j}`` [B, C]): transformers' padded start is the depthwise output b_dw
before any token, which a zero state of u plus b_dw is. Values: v_proj_current(h) | the
previous token's v_proj_delayed(h) (zero before the first), concatenated and read as K
heads; the delay is a ``causal_conv1d`` of kernel [1, 0] (state ``value_state`` [B, Cv, 1]),
which zeroes padded tokens as transformers' mask does. Every state is graph I/O
(``past_key_values.{i}.*`` -> ``present.{i}.*``), so decoding is exact.

Q/K norm (``ZayaQKNorm``): each head times sqrt(D) / max(‖·‖₂, float32 eps), keys then
times ``temp`` [K] per kv head; RoPE (rotate-half, partial: ``rope_parameters`` nested by
layer type ``hybrid`` / ``hybrid_sliding``), attention scaled by D^-1/2, windows on
``hybrid_sliding`` layers.

MoE (``ZayaSparseMoeBlock``): the router's r = down_proj(x) (+ r of the layer before times
``router_states_scale`` from layer 1 on: the chain stays inside one forward), logits =
out_proj(gelu(fc2(gelu(fc1(rms(r)))))) over E + 1 classes, softmax, top-1 of probabilities +
``balancing_biases``, weighted by its probability (not renormalised). Class E is the skip
expert: transformers gives it weight 0 (a zero expert, not an identity), which irc writes
as an expert of zero weights. The sorted-MoE ops (``moe_route`` on the router MLP's
features with ``out_proj`` as the router, ``moe_dispatch``, ``grouped_gemm``) carry it.

Refused, naming config.json and the key: ``attention_bias`` (a biased projection of a
zeroed padded token is not zero; irc keeps the padding exact), ``num_experts_per_tok`` other
than 1 (transformers raises), an activation other than silu, RoPE types other than default.
"""
from __future__ import annotations

import numpy as np

from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, read_rope
from frontends.hf.families_common import _arch, _dims, _layer_types, _rope
from frontends.hf.weights import Checkpoint, FusedExperts, Source, Tensor
from irc import dims as irc_dims
from irc.yamlloc import boolean, positive_int

HYBRID, SLIDING = "hybrid", "hybrid_sliding"
MAX_TAPS = 8  # of the grouped convolution (cca_time1): one layout entry each
ZAYA_ROPE = {HYBRID: {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.5},
             SLIDING: {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5}}
DEFAULTS = {  # transformers 5.25's ZayaConfig
    "zaya": {"vocab_size": 262272, "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 8,
             "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
             "tie_word_embeddings": True, "sliding_window": None, "moe_intermediate_size": 2048,
             "num_experts_per_tok": 1, "num_experts": 16, "head_dim": 128, "attention_bias": False,
             "lm_head_bias": False, "router_hidden_size": 256, "cca_time0": 2, "cca_time1": 2},
}


def _zaya(cfg: Config, name: str, model_type: str) -> Arch:
    dims = _dims(cfg)
    n = dims["layers"]
    cfg.check("attention_bias", lambda v: not v, hint="irc reads ZAYA's CCA projections without biases")
    cfg.check("hidden_act", lambda v: v == "silu", hint="ZAYA's experts are SwiGLU (silu)")
    cfg.check("num_experts_per_tok", lambda v: v == 1, hint="ZAYA routes one expert a token (transformers raises)")
    if dims["kv_heads"] * dims["head_dim"] % 2:
        raise cfg.error("head_dim", "the value heads split in two halves: num_key_value_heads·head_dim must be even")
    types = _layer_types(cfg, n, lambda i: HYBRID, kinds=(HYBRID, SLIDING))
    window = cfg.get("sliding_window", positive_int) if SLIDING in types else None
    ropes = {kind: _zaya_rope(cfg, dims["head_dim"], kind) for kind in sorted(set(types))}
    layers = [LayerSpec(window if kind == SLIDING else None, ropes[kind], True) for kind in types]
    moe = {"experts": cfg.get("num_experts", positive_int), "top_k": 1,
           "d_ff": cfg.get("moe_intermediate_size", positive_int),
           "router": cfg.get("router_hidden_size", positive_int), "t0": cfg.get("cca_time0", positive_int),
           "t1": cfg.get("cca_time1", positive_int), "head_bias": cfg.get("lm_head_bias", boolean)}
    if moe["t0"] < 2:
        raise cfg.error("cca_time0", f"{moe['t0']} taps: irc's causal convolution keeps at least one past token")
    if moe["t1"] > MAX_TAPS:
        raise cfg.unsupported("cca_time1", moe["t1"], hint=f"irc reads up to {MAX_TAPS} taps of the grouped conv")
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], scale=dims["head_dim"] ** -0.5)
    return _arch(cfg, name, model_type, dims, attention, layers, None, moe=moe, checkpoint="zaya", expand=expand)


def _zaya_rope(cfg: Config, head_dim: int, kind: str):
    if cfg.data.get("rope_parameters") is None:
        return read_rope(cfg, head_dim, dict(ZAYA_ROPE[kind]), "rope_parameters")
    params = cfg.data["rope_parameters"]
    if not isinstance(params, dict) or not isinstance(params.get(kind), dict):
        raise cfg.error("rope_parameters", f"ZAYA gives RoPE per layer type: no {kind!r} entry")
    rope = _rope(cfg, head_dim, kind)
    if rope.scaling is not None:
        raise cfg.unsupported(f"rope_parameters.{kind}.rope_type", rope.scaling["kind"],
                              hint="irc reads ZAYA's default RoPE only")
    return rope


def _op(m, kind: str, inputs, name: str, attrs=None):
    return m.emit(kind, inputs, attrs, name)[0]


def _const(m, value: float, name: str):
    return _op(m, "constant", [], name, {"value": float(value)})


def _state_op(m, layer, kind: str, inputs, attrs, state: str, shape: tuple):
    """An op with a recurrent state: past_key_values.{i}.{state} in, present.{i}.{state} out."""
    i, p = layer.index, layer.prefix
    past = m._state(i, state, shape)
    operands = [inputs[0], inputs[1], None, past, inputs[2]] if kind == "causal_conv1d" else [inputs[0], past]
    out, present = m.emit(kind, operands, attrs, [f"{p}{state}_out", f"present.{i}.{state}"])
    m._presents.append(present.value)
    return out


def _cca(m, layer, h, a: Attention, t0: int, t1: int):
    """(q, k, v) of ``ZayaCCAProjection`` (module docstring), [B, T, H·D], [B, T, K·D] each."""
    p, d = layer.prefix, m._features(h)
    heads, kv, hd = a.heads, a.kv_heads, a.head_dim
    g, c, cv = heads // kv, (heads + kv) * hd, kv * hd // 2
    mask, _ = m._context()
    q = _op(m, "linear", [h, m.param(f"{p}cca.wq", (heads * hd, d)), None], f"{p}cca_q")
    k = _op(m, "linear", [h, m.param(f"{p}cca.wk", (kv * hd, d)), None], f"{p}cca_k")
    lead = list(h.shape[:-1])
    q5 = _op(m, "reshape", [q], f"{p}cca_q_groups", {"shape": lead + [kv, g, hd]})
    k5 = _op(m, "reshape", [k], f"{p}cca_k_groups", {"shape": lead + [kv, 1, hd]})
    qr = _op(m, "mul", [_op(m, "add", [q5, k5], f"{p}cca_qk_sum"), _const(m, 0.5, f"{p}cca_half")], f"{p}cca_qr")
    kr = _op(m, "reduce_mean", [qr], f"{p}cca_kr", {"axes": [-2], "keepdims": False})
    qr = _op(m, "reshape", [qr], f"{p}cca_qr_flat", {"shape": lead + [heads * hd]})
    kr = _op(m, "reshape", [kr], f"{p}cca_kr_flat", {"shape": lead + [kv * hd]})
    qk = _op(m, "concat", [q, k], f"{p}cca_qk", {"axis": -1})
    u = _state_op(m, layer, "causal_conv1d", [qk, m.param(f"{p}cca.conv_dw", (c, 1, t0)), mask],
                  {"activation": None}, "conv_state", (c, t0 - 1))
    b_dw = m.param(f"{p}cca.conv_dw_bias", (c,))
    conv, delayed = None, u
    for j in range(t1):
        if j:
            delayed = _state_op(m, layer, "token_shift", [delayed], None, f"shift_state_{j}", (c,))
        bias = None if j else m.param(f"{p}cca.conv_bias", (c,))
        tap = _op(m, "linear", [_op(m, "add", [delayed, b_dw], f"{p}cca_tap{j}_in"),
                                m.param(f"{p}cca.conv_tap{j}", (c, c)), bias], f"{p}cca_tap{j}")
        conv = tap if conv is None else _op(m, "add", [conv, tap], f"{p}cca_conv{j}")
    q = _op(m, "add", [_op(m, "slice", [conv], f"{p}cca_conv_q", {"axis": len(lead), "start": 0,
                                                                  "end": heads * hd}), qr], f"{p}cca_query")
    k = _op(m, "add", [_op(m, "slice", [conv], f"{p}cca_conv_k", {"axis": len(lead), "start": heads * hd,
                                                                  "end": c}), kr], f"{p}cca_key")
    v_now = _op(m, "linear", [h, m.param(f"{p}cca.wv_current", (cv, d)), None], f"{p}cca_v_current")
    v_del = _op(m, "linear", [h, m.param(f"{p}cca.wv_delayed", (cv, d)), None], f"{p}cca_v_delayed_now")
    v_del = _state_op(m, layer, "causal_conv1d", [v_del, m.param(f"{p}cca.v_shift", (cv, 1, 2)), mask],
                      {"activation": None}, "value_state", (cv, 1))
    return q, k, _op(m, "concat", [v_now, v_del], f"{p}cca_value", {"axis": -1})


def _l2_heads(m, t, heads: int, hd: int, name: str, temp=None):
    """Each head of t times sqrt(D) / max(‖head‖, eps) (``ZayaQKNorm``), then times ``temp`` per head."""
    lead = list(t.shape[:-1])
    split = _op(m, "reshape", [t], f"{name}_heads", {"shape": lead + [heads, hd]})
    total = _op(m, "reduce_sum", [_op(m, "mul", [split, split], f"{name}_sq")], f"{name}_ss",
                {"axes": [-1], "keepdims": True})
    length = _op(m, "maximum", [_op(m, "sqrt", [total], f"{name}_len"),
                                _const(m, float(np.finfo(np.float32).eps), f"{name}_eps")], f"{name}_len_eps")
    factor = _op(m, "div", [_const(m, hd ** 0.5, f"{name}_root"), length], f"{name}_factor")
    out = _op(m, "mul", [split, factor], f"{name}_l2")
    if temp is not None:
        out = _op(m, "mul", [out, _op(m, "reshape", [temp], f"{name}_temp", {"shape": [heads, 1]})], f"{name}_temp_out")
    return _op(m, "reshape", [out], f"{name}_normed", {"shape": lead + [heads * hd]})


def _attention(m, layer, h, a: Attention, spec: LayerSpec, moe: dict):
    p, i = layer.prefix, layer.index
    q, k, v = _cca(m, layer, h, a, moe["t0"], moe["t1"])
    q = _l2_heads(m, q, a.heads, a.head_dim, f"{p}q_norm")
    k = _l2_heads(m, k, a.kv_heads, a.head_dim, f"{p}k_norm", m.param(f"{p}attn.temp", (a.kv_heads,)))
    rope = dsl_rope(spec.rope)
    q, k = layer._rotate(q, k, rope, (a.heads, a.kv_heads, a.head_dim))
    mask, _ = m._context()
    past_key, past_value = m._past(i, a.kv_heads, a.head_dim, a.head_dim)
    attrs = {"heads": a.heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim, "v_head_dim": None, "causal": True,
             "window": spec.window, "softcap": None, "scale": a.scale}
    out, present_key, present_value = m.emit("attention", [q, k, v, mask, past_key, past_value], attrs,
                                             [f"{p}attn", f"present.{i}.key", f"present.{i}.value"])
    m._presents += [present_key.value, present_value.value]
    layer._note_attention("gqa", a.heads, a.kv_heads, a.head_dim, a.head_dim, spec.window, None, a.scale, rope)
    return _op(m, "linear", [out, m.param(f"{p}attn.wo", (m._features(h), a.heads * a.head_dim)), None],
               f"{p}attn_out")


def _router(m, layer, h, moe: dict, eps: float, previous):
    """(router features [N, R], this layer's router state r) of ``ZayaRouter``."""
    p, d, r = layer.prefix, m._features(h), moe["router"]
    state = _op(m, "linear", [h, m.param(f"{p}router.down", (r, d)), m.param(f"{p}router.down_bias", (r,))],
                f"{p}router_down")
    if previous is not None:
        carried = _op(m, "mul", [previous, m.param(f"{p}router.states_scale", (r,))], f"{p}router_carried")
        state = _op(m, "add", [state, carried], f"{p}router_state")
    x = m.rms_norm(state, f"{p}router.norm", eps)
    for fc in ("fc1", "fc2"):
        x = _op(m, "linear", [x, m.param(f"{p}router.{fc}", (r, r)), m.param(f"{p}router.{fc}_bias", (r,))],
                f"{p}router_{fc}")
        x = _op(m, "gelu", [x], f"{p}router_{fc}_gelu", {"approximate": "none"})
    return x, state


def _moe(m, layer, h, moe: dict, eps: float, previous):
    """``ZayaSparseMoeBlock``: top-1 of E + 1 classes, class E a zero expert; returns (out, router state)."""
    p, d, f = layer.prefix, m._features(h), moe["d_ff"]
    classes = moe["experts"] + 1
    features, state = _router(m, layer, h, moe, eps, previous)
    tokens = _op(m, "reshape", [h], f"{p}moe_tokens", {"shape": [irc_dims.product(h.shape[:-1]), d]})
    features = _op(m, "reshape", [features], f"{p}moe_features", {"shape": [tokens.shape[0], moe["router"]]})
    attrs = {"experts": classes, "top_k": 1, "scoring": "softmax", "norm_topk_prob": False}
    expert_ids, weights = m.emit("moe_route", [features, m.param(f"{p}router.out", (classes, moe["router"])),
                                               m.param(f"{p}router.balancing_biases", (classes,))], attrs,
                                 [f"{p}moe_expert_ids", f"{p}moe_weights"])
    token_index, slot_index, indptr = m.emit("moe_dispatch", [expert_ids], {"experts": classes},
                                             [f"{p}moe_token_index", f"{p}moe_slot_index", f"{p}moe_indptr"])
    gemm = {"experts": classes, "top_k": 1}
    rows = _op(m, "gather", [tokens, token_index], f"{p}moe_rows", {"axis": 0})
    gate, up = (_op(m, "grouped_gemm", [rows, m.param(f"{p}moe.w_{x}", (classes, f, d)), indptr], f"{p}moe_{x}", gemm)
                for x in ("gate", "up"))
    hidden = _op(m, "mul", [_op(m, "silu", [gate], f"{p}moe_act"), up], f"{p}moe_hidden")
    out = _op(m, "grouped_gemm", [hidden, m.param(f"{p}moe.w_down", (classes, d, f)), indptr], f"{p}moe_down", gemm)
    row_weights = _op(m, "gather", [_op(m, "reshape", [weights], f"{p}moe_weights_flat",
                                        {"shape": [tokens.shape[0]]}), slot_index], f"{p}moe_row_weights", {"axis": 0})
    row_weights = _op(m, "reshape", [row_weights], f"{p}moe_row_weights_M1", {"shape": [out.shape[0], 1]})
    weighted = _op(m, "mul", [out, row_weights], f"{p}moe_weighted")
    base = _op(m, "expand", [_const(m, 0.0, f"{p}moe_zero")], f"{p}moe_base", {"shape": [tokens.shape[0], d]})
    combined = _op(m, "scatter_add", [base, token_index, weighted], f"{p}moe_combined")
    return _op(m, "reshape", [combined], f"{p}moe_out", {"shape": list(h.shape)}), state


def _rescale(m, layer, h, residual, which: str):
    """``ZayaResidualScaling``: (h + hb)·hs + (residual + rb)·rs."""
    p = f"{layer.prefix}{which}"
    d = m._features(h)
    branch = _op(m, "mul", [_op(m, "add", [h, m.param(f"{p}.h_bias", (d,))], f"{p}_hb"),
                            m.param(f"{p}.h_scale", (d,))], f"{p}_hs")
    kept = _op(m, "mul", [_op(m, "add", [residual, m.param(f"{p}.r_bias", (d,))], f"{p}_rb"),
                          m.param(f"{p}.r_scale", (d,))], f"{p}_rs")
    return _op(m, "add", [branch, kept], f"{p}_out")


def expand(arch: Arch, origin: str):
    """The decoder through the DSL (the module docstring)."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps, moe, d = arch.attention, arch.norm_eps, arch.moe, arch.d_model
    with m.at(origin):
        x = m.embed(m.input_ids())
        x = _op(m, "mul", [_op(m, "add", [x, m.param("input_bias", (d,))], "input_biased"),
                           m.param("input_scale", (d,))], "input_scaled")
        previous = None
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            y = _attention(m, layer, layer.rms_norm(x, "attn_norm", eps), a, spec, moe)
            x = _rescale(m, layer, y, x, "attn_scale")
            y, previous = _moe(m, layer, layer.rms_norm(x, "mlp_norm", eps), moe, eps, previous)
            x = _rescale(m, layer, y, x, "mlp_scale")
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied, bias=moe["head_bias"])
    return m.graph


class BlockTap(Tensor):
    """Tap ``tap`` of a grouped Conv1d weight [C, C/G, taps] as the block-diagonal [C, C]
    matrix of its G groups (zeros between the blocks)."""

    def __init__(self, name: str, tap: int):
        super().__init__(name)
        self.tap = tap

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        stored = checkpoint.info(self.name)[1]
        return [stored[0], stored[0]]

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        weight = np.asarray(checkpoint.read(self.name), np.float32)
        channels, width = weight.shape[0], weight.shape[1]
        out = np.zeros((channels, channels), np.float32)
        for row in range(channels):
            group = row // width
            out[row, group * width:(group + 1) * width] = weight[row, :, self.tap]
        return out[start:stop]


class Shift(Source):
    """The kernel [C, 1, 2] = [1, 0] per channel: a causal convolution giving the previous token."""

    def __init__(self, channels: int):
        self.channels = channels

    def names(self) -> list[str]:
        return []

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        return [self.channels, 1, 2]

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        return np.tile(np.array([[[1.0, 0.0]]], np.float32), (stop - start, 1, 1))


class PlusZeroExpert(Source):
    """An experts' tensor [E, ...] with one more expert of zeros (ZAYA's skip class)."""

    def __init__(self, inner: Source):
        self.inner = inner

    def names(self) -> list[str]:
        return self.inner.names()

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        shape = self.inner.shape(checkpoint)
        return [shape[0] + 1] + shape[1:]

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        experts = self.inner.shape(checkpoint)[0]
        real = self.inner.rows(checkpoint, start, min(stop, experts)) if start < experts else None
        zeros = np.zeros([max(0, stop - max(start, experts))] + self.inner.shape(checkpoint)[1:], np.float32)
        return zeros if real is None else np.concatenate([np.asarray(real, np.float32), zeros])


def _experts(part: str):
    def source(arch: Arch, prefix: str):
        name = prefix + ("mlp.experts.down_proj" if part == "down" else "mlp.experts.gate_up_proj")
        return PlusZeroExpert(FusedExperts(name, part, arch.moe["d_ff"], arch.d_model))
    return source


def _tap(j: int):
    return lambda arch, prefix: BlockTap(prefix + CCA + "conv_qk_grouped.weight", arch.moe["t1"] - 1 - j)


CCA, RS = "self_attn.qkv_proj.", {"h_bias": "hidden_states_bias", "h_scale": "hidden_states_scale",
                                  "r_bias": "residual_bias", "r_scale": "residual_scale"}
LAYOUTS = {"zaya": {
    "_top": {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight",
             "lm_head.bias": "lm_head.bias", "input_bias": "model.input_hidden_states_bias",
             "input_scale": "model.input_hidden_states_scale"},
    "cca.wq": f"{CCA}q_proj.weight", "cca.wk": f"{CCA}k_proj.weight", "cca.wv_current": f"{CCA}v_proj_current.weight",
    "cca.wv_delayed": f"{CCA}v_proj_delayed.weight", "cca.conv_dw": f"{CCA}conv_qk_depthwise.weight",
    "cca.conv_dw_bias": f"{CCA}conv_qk_depthwise.bias", "cca.conv_bias": f"{CCA}conv_qk_grouped.bias",
    **{f"cca.conv_tap{j}": _tap(j) for j in range(MAX_TAPS)},
    "cca.v_shift": lambda arch, prefix: Shift(arch.attention.kv_heads * arch.attention.head_dim // 2),
    "attn.temp": "self_attn.qk_norm.temp", "mlp_norm": "post_attention_layernorm.weight",
    **{f"attn_scale.{k}": f"post_attention_residual_scale.{v}" for k, v in RS.items()},
    **{f"mlp_scale.{k}": f"post_mlp_residual_scale.{v}" for k, v in RS.items()},
    "router.down": "mlp.gate.down_proj.weight", "router.down_bias": "mlp.gate.down_proj.bias",
    "router.states_scale": "mlp.gate.router_states_scale", "router.norm": "mlp.gate.router_mlp.norm.weight",
    **{f"router.{fc}": f"mlp.gate.router_mlp.{fc}.weight" for fc in ("fc1", "fc2")},
    **{f"router.{fc}_bias": f"mlp.gate.router_mlp.{fc}.bias" for fc in ("fc1", "fc2")},
    "router.out": "mlp.gate.router_mlp.out_proj.weight", "router.balancing_biases": "mlp.gate.balancing_biases",
    **{f"moe.w_{part}": _experts(part) for part in ("gate", "up", "down")}}}
FAMILIES = {"zaya": _zaya}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
