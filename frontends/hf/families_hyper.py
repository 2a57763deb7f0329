"""Hunyuan-V4 (``frontends.hf.families`` registers it): hyper-connected residual streams
(``frontends.dsl_hyper``) around DeepSeek sparse attention with a gate and sinks, and
GLM-4-MoE-Lite's MLP / MoE with clamped experts; built by its own loop (``expand``).

==============  ============================================================================
hy_v4           Hunyuan-V4 (``HYV4ForCausalLM``): ``hc_mult`` residual streams, each block
                entered and left through an independent hyper-connection (``attn_hc`` /
                ``ffn_hc``) and the streams collapsed by the hyper head (``hc_head``) before
                the final norm; MLA (low-rank q, interleaved RoPE) over the keys a lightning
                indexer keeps (``irc.ops.sparse_index.topk_mask``), ``"shared"`` layers
                reusing the latest ``"full"`` layer's selection, a learned sink logit per
                head, the output gated per head by sigmoid(``gate_proj(x)``); dense SwiGLU or
                sigmoid-routed experts whose gate / up are clamped at ``swiglu_limit``
==============  ============================================================================

Per layer, as ``HYV4DecoderLayer``: the attention's input is ``input_layernorm`` of the
streams collapsed by ``attn_hc``; its output is spread back over the streams; likewise the
MLP with ``ffn_hc`` and ``post_attention_layernorm``. The model's hidden state is
``norm(hc_head(streams))``; the embedding enters as ``hc_mult`` copies.

The attention (``HYV4Attention``): q = q_b(rms_norm(q_a(x))) [B, T, H, nope + rope], the
latent ``kv_a`` split into the normed KV latent (``kv_b`` expands it per head to keys'
nope part and values) and one shared RoPE key; scores · softmax scale (DeepSeek's, with
YaRN's mscale²), keys outside the selection at float32's minimum, softmax with the head's
sink logit in its denominator, times values, times sigmoid(``gate_proj(x)``) per head,
then ``o_proj``. Its caches are the per-head ``past_key_values.{i}.key`` / ``.value``.

The indexer (``HYV4Indexer``, on ``"full"`` layers): q = wq_b(q latent) [B, T, H_i, D_i],
k = LayerNorm(wk(x)) [B, T, D_i] (eps ``rms_norm_eps``, with bias), the interleaved RoPE on
the last ``qk_rope_head_dim`` dims of both; scores Σ_h w_h · relu(q_h · k) with w =
``weights_proj(x)`` · H_i^-0.5 · D_i^-0.5; each query keeps its ``index_topk`` best visible
keys. Its rotated keys are cached, ``past_key_values.{i}.index_key`` [B, 1, P, D_i].

The MoE (``HYV4MoE``) lowers to the sorted form (``moe_route``: sigmoid scores plus
``e_score_correction_bias`` for the choice, top-k, renormalised, times
``routed_scaling_factor``; ``moe_dispatch``, ``grouped_gemm``) with silu(min(gate, L)) ·
clip(up, -L, L) between the GEMMs, added to the shared experts' SwiGLU (unclamped).

Checkpoint names: the hub's, as save_pretrained writes them back (``hc_pre.hc_attn_layer.hc_fn``,
``self_attn.linear_gate``, ``self_attn.learnable_sink_param``, ``mlp.linear_gate``,
``model.hc_pre.hc_head.hc_head_fn``...), or transformers' own after its renames (``attn_hc.fn``,
``gate_proj``, ``sinks``, ``model.hc_head.hc_fn``), tensor by tensor; the experts fused
(``mlp.experts.gate_up_proj`` / ``down_proj``); the MTP layers (``model.mtp_layers.*``) spare.

Refused at their key: ``attention_bias``, a ``q_lora_rank`` of null (the indexer reads the
q latent), ``layer_types`` other than "indexed_attention", an ``indexer_types`` whose first
layer is "shared" (transformers raises there), no shared experts, ``swiglu_limit`` <= 0
(transformers' code clamps even then, unlike its docstring), partial rotary.
"""
from __future__ import annotations

from functools import partial

from frontends.hf.families_common import embedded_inputs
from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope
from frontends.hf.families_common import _arch, _no, _rope, _silu, _swiglu
from frontends.hf.families_deepseek_v32 import _Ops
from frontends.hf.weights import FusedExperts, Tensor
import numpy as np

from irc import dims
from irc.ops.attention import mla_softmax_scale
from irc.yamlloc import boolean, layer_count, number, positive_int, positive_number

MLA_NORM_EPS = 1e-6  # transformers builds the q_a / kv_a norms with their default eps 1e-6
NEG = float(np.finfo(np.float32).min)  # transformers' masked score (its additive mask's minimum)
INDEXER = "attn.indexer."

DEFAULTS = {  # transformers 5.25's HYV4Config
    "hy_v4": {
        "vocab_size": 120832, "hidden_size": 2816, "intermediate_size": 6912, "moe_intermediate_size": 768,
        "num_hidden_layers": 34, "num_attention_heads": 32, "hidden_act": "silu", "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_experts_per_tok": 8, "routed_scaling_factor": 2.827, "norm_topk_prob": True,
        "n_group": 1, "topk_group": 1, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 192,
        "qk_rope_head_dim": 64, "v_head_dim": 256, "mlp_layer_types": None, "layer_types": None,
        "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 16, "indexer_types": None, "hc_mult": 4,
        "hc_magnitude": 2.0, "hc_eps": 1e-6, "swiglu_limit": 10.0,
    },
}


def _experts(part: str):
    """``moe.w_{part}`` from transformers' fused ``mlp.experts.gate_up_proj`` / ``down_proj``."""
    def source(arch: Arch, prefix: str) -> FusedExperts:
        name = "mlp.experts.down_proj" if part == "down" else "mlp.experts.gate_up_proj"
        return FusedExperts(prefix + name, part, arch.moe["d_ff"], arch.d_model)
    return source


_HC = ("fn", "base", "scale")
# transformers' own names for what the hub names otherwise (its conversion_mapping's renames)
_LOADED = {"attn.gate": "self_attn.gate_proj.weight", "attn.sinks": "self_attn.sinks",
           "mlp.w_gate": "mlp.gate_proj.weight", "moe.shared_gate": "mlp.shared_experts.gate_proj.weight",
           **{f"{block}_hc.{x}": f"{block}_hc.{x}" for block in ("attn", "ffn") for x in _HC}}


def _resolve(arch: Arch, param: str, checkpoint):
    """A checkpoint in transformers' own names (as its modules hold them) read alike: the
    renamed tensor where the file has it; None (the layout's hub name) otherwise."""
    layer, _, suffix = param.partition(".")[2].partition(".")
    if param.startswith("layers.") and suffix in _LOADED:
        name = f"model.layers.{layer}.{_LOADED[suffix]}"
    elif param.startswith("hc_head."):
        name = f"model.hc_head.hc_{param.split('.')[-1]}"
    else:
        return None
    return Tensor(name) if name in checkpoint.files else None


# the hub's names, which save_pretrained writes back (transformers' conversion_mapping renames them on load)
LAYOUTS = {"hy_v4": {
    "_resolve": _resolve,
    **{f"{INDEXER}{x}": f"self_attn.indexer.{x}.weight" for x in ("wq_b", "wk", "k_norm", "weights_proj")},
    f"{INDEXER}k_norm.bias": "self_attn.indexer.k_norm.bias",
    "attn.gate": "self_attn.linear_gate.weight", "attn.sinks": "self_attn.learnable_sink_param",
    "mlp.w_gate": "mlp.linear_gate.weight", "moe.shared_gate": "mlp.shared_experts.linear_gate.weight",
    **{f"moe.w_{x}": _experts(x) for x in ("gate", "up", "down")},
    **{f"{block}_hc.{x}": f"hc_pre.hc_{hub}_layer.hc_{x}" for block, hub in (("attn", "attn"), ("ffn", "mlp"))
       for x in _HC},
    "_top": {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight",
             **{f"hc_head.{x}": f"model.hc_pre.hc_head.hc_head_{x}" for x in _HC}},
    "_spare": ("model.mtp_layers.",),
}}


def _kinds(cfg: Config, key: str, n: int, allowed: tuple, derive) -> list[str]:
    """A per-layer list of names from ``allowed``; ``derive(i)`` where the file gives none."""
    kinds = cfg.data.get(key)
    if kinds is None:
        return [derive(i) for i in range(n)]
    if not isinstance(kinds, list) or len(kinds) != n:
        raise cfg.error(key, f"expected a list of {n} entries (num_hidden_layers), got {kinds!r}")
    for kind in kinds:
        if kind not in allowed:
            raise cfg.unsupported(key, kind, hint=f"entries: {', '.join(allowed)}")
    return list(kinds)


def _hy_v4(cfg: Config, name: str, model_type: str) -> Arch:
    """Hunyuan-V4's reading of config.json (module docstring)."""
    d, heads, n = cfg.get("hidden_size", positive_int), cfg.get("num_attention_heads", positive_int), \
        cfg.get("num_hidden_layers", layer_count)
    _silu(cfg)
    _no(cfg, "attention_bias")
    if cfg.get("q_lora_rank", positive_int, None) is None:
        raise cfg.error("q_lora_rank", "the indexer reads the low-rank query latent: give q_lora_rank")
    mla = {key: cfg.get(key, positive_int) for key in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                        "qk_rope_head_dim", "v_head_dim")}
    rdim = mla["qk_rope_head_dim"]
    rope = _rope(cfg, rdim, convention="interleaved")
    if rope.rotary_dim is not None:
        raise cfg.unsupported("partial_rotary_factor", cfg.raw("partial_rotary_factor"),
                              hint="MLA rotates exactly qk_rope_head_dim")
    _kinds(cfg, "layer_types", n, ("indexed_attention",), lambda i: "indexed_attention")
    indexers = _kinds(cfg, "indexer_types", n, ("full", "shared"),
                      lambda i: "full" if i == 0 or (i - 1) % 4 == 0 else "shared")
    if indexers[0] != "full":
        raise cfg.unsupported("indexer_types", indexers, hint="a \"shared\" layer reuses an earlier \"full\" "
                                                              "layer's selection: the first must be \"full\"")
    sparse = [k == "sparse" for k in _kinds(cfg, "mlp_layer_types", n, ("dense", "sparse"),
                                            lambda i: "dense" if i == 0 else "sparse")]
    hy = {"indexer": {"heads": cfg.get("index_n_heads", positive_int),
                      "head_dim": cfg.get("index_head_dim", positive_int), "topk": cfg.get("index_topk", positive_int)},
          "full": [k == "full" for k in indexers], "mult": cfg.get("hc_mult", positive_int),
          "magnitude": cfg.get("hc_magnitude", number), "eps": cfg.get("hc_eps", number)}
    if hy["indexer"]["head_dim"] < rdim:
        raise cfg.error("index_head_dim", f"{hy['indexer']['head_dim']} is narrower than qk_rope_head_dim {rdim}, "
                                          "the indexer's rotated part")
    moe = None
    if any(sparse):
        moe = {"experts": cfg.get("n_routed_experts", positive_int),
               "top_k": cfg.get("num_experts_per_tok", positive_int),
               "d_ff": cfg.get("moe_intermediate_size", positive_int),
               "norm_topk_prob": cfg.get("norm_topk_prob", boolean),
               "routed_scale": cfg.get("routed_scaling_factor", positive_number),
               "shared": cfg.get("n_shared_experts", positive_int), "limit": cfg.get("swiglu_limit", positive_number),
               "groups": cfg.get("n_group", positive_int), "top_groups": cfg.get("topk_group", positive_int)}
        _check_moe(cfg, moe)
    attention = Attention("mla", heads, heads, mla["qk_nope_head_dim"] + rdim, mla=mla)
    layers = [LayerSpec(None, rope, is_moe) for is_moe in sparse]
    arch = _arch(cfg, name, model_type, {"d": d, "layers": n}, attention, layers,
                 None if all(sparse) else _swiglu(cfg), moe=moe, checkpoint="hy_v4")
    arch.expand = partial(expand, hy)
    return arch


def _check_moe(cfg: Config, moe: dict) -> None:
    """The routing fits the experts (transformers' router would fail, or pick differently)."""
    if moe["top_k"] > moe["experts"]:
        raise cfg.error("num_experts_per_tok", f"{moe['top_k']} exceeds {moe['experts']} experts")
    groups, top = moe["groups"], moe["top_groups"]
    if moe["experts"] % groups or moe["experts"] // groups < 2:
        raise cfg.error("n_group", f"{moe['experts']} experts do not split into {groups} groups of two or more")
    if top > groups or moe["top_k"] > top * (moe["experts"] // groups):
        raise cfg.error("topk_group", f"{top} of {groups} groups cannot hold top_k {moe['top_k']} experts")


FAMILIES = {"hy_v4": _hy_v4}


def expand(hy: dict, arch: Arch, origin: str):
    """The decoder through the DSL (module docstring)."""
    from frontends.dsl import Model
    from frontends.dsl_hyper import HyperConnections
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps = arch.norm_eps
    with m.at(origin):
        hc = HyperConnections(m, hy["mult"], arch.d_model, eps, hy["eps"], "independent", hy["magnitude"])
        streams, keep = hc.widen(embedded_inputs(m, arch)), None
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            p = layer.prefix
            state, h = hc.enter(streams, f"{p}attn_hc.")
            out, keep = gated_sparse_mla(m, layer, layer.rms_norm(h, "attn_norm", eps), arch, spec, hy, keep)
            streams = hc.leave(state, out, f"{p}attn_hc.")
            state, h = hc.enter(streams, f"{p}ffn_hc.")
            h = layer.rms_norm(h, "mlp_norm", eps)
            out = clamped_moe(m, layer, h, arch.moe) if spec.moe else layer.swiglu(h, d_ff=arch.mlp["d_ff"])
            streams = hc.leave(state, out, f"{p}ffn_hc.")
        m.logits(m.rms_norm(hc.head(streams, "hc_head."), "norm", eps), tied=arch.tied)
    m.meta["sparse_index"] = dict(hy["indexer"], shared=[i for i, f in enumerate(hy["full"]) if not f])
    m.meta["hyper_connections"] = {"form": "independent", "streams": hy["mult"], "magnitude": hy["magnitude"],
                                   "eps": hy["eps"]}
    return m.graph


def gated_sparse_mla(m, layer, x, arch: Arch, spec, hy: dict, keep):
    """(out [B, T, d], the selection [B, T, P+T]): the attention of the module docstring; a
    ``"shared"`` layer takes ``keep`` from the latest ``"full"`` one."""
    mla, heads, i = arch.attention.mla, arch.attention.heads, layer.index
    nope, rdim, vdim, rank = mla["qk_nope_head_dim"], mla["qk_rope_head_dim"], mla["v_head_dim"], mla["kv_lora_rank"]
    qk, d = nope + rdim, arch.d_model
    o, p = _Ops(m, layer.prefix), layer.prefix
    batch, seq = x.shape[:2]
    _, positions = m._context()
    rope = dsl_rope(spec.rope)
    q_latent = m.norm(o.linear(x, m.param(f"{p}attn.q_a", (mla["q_lora_rank"], d)), "q_a_out"), f"{p}attn.q_a_norm",
                      "rms", MLA_NORM_EPS)
    q = o.view(o.linear(q_latent, m.param(f"{p}attn.q_b", (heads * qk, mla["q_lora_rank"])), "q"),
               (batch, seq, heads, qk), "q_heads")
    q_rope = o.rope(o.view(o.cols(q, nope, qk, "q_pe"), (batch, seq, heads * rdim), "q_pe_flat"), positions, rope,
                    rdim, "q_pe_rope")
    q = o("concat", [o.cols(q, 0, nope, "q_nope"), o.view(q_rope, (batch, seq, heads, rdim), "q_pe_heads")],
          {"axis": -1}, "q_full")
    kv_a = o.linear(x, m.param(f"{p}attn.kv_a", (rank + rdim, d)), "kv_a_out")
    latent = m.norm(o.cols(kv_a, 0, rank, "kv_latent"), f"{p}attn.kv_a_norm", "rms", MLA_NORM_EPS)
    kv = o.view(o.linear(latent, m.param(f"{p}attn.kv_b", (heads * (nope + vdim), rank)), "kv"),
                (batch, seq, heads, nope + vdim), "kv_heads")
    k_rope = o.view(o.rope(o.cols(kv_a, rank, None, "k_pe"), positions, rope, rdim, "k_pe_rope"),
                    (batch, seq, 1, rdim), "k_pe_head")
    k_rope = o("expand", [k_rope], {"shape": [batch, seq, heads, rdim]}, "k_pe_heads")
    key = o.t(o("concat", [o.cols(kv, 0, nope, "k_nope"), k_rope], {"axis": -1}, "k_full"), (0, 2, 1, 3), "k_bhtd")
    value = o.t(o.cols(kv, nope, None, "v_heads"), (0, 2, 1, 3), "v_bhtd")
    past_key, past_value = m._past(i, heads, qk, vdim)
    key = m.emit("concat", [past_key, key], {"axis": 2}, f"present.{i}.key")[0]
    value = m.emit("concat", [past_value, value], {"axis": 2}, f"present.{i}.value")[0]
    m._presents += [key.value, value.value]
    if hy["full"][i]:
        keep = indexer_mask(m, layer, x, q_latent, rope, rdim, hy["indexer"], arch.norm_eps)
    scale = mla_softmax_scale(nope, rdim, rope.mla_attrs(), arch.attention.scale)
    scores = o("mul", [o("matmul", [o.t(q, (0, 2, 1, 3), "q_bhtd"), o.t(key, (0, 1, 3, 2), "k_t")], None, "qk"),
                       o.const(scale, "attn_scale")], None, "scores")
    scores = o("where", [o.view(keep, (batch, 1, seq, key.shape[2]), "keep4"), scores, o.const(NEG, "attn_neg")],
               None, "scores_masked")
    out = o("matmul", [_sink_softmax(m, o, scores, heads, p), value], None, "attn_bhtv")
    gate = o("sigmoid", [o.linear(x, m.param(f"{p}attn.gate", (heads * vdim, d)), "gate")], None, "gate_sigmoid")
    out = o("mul", [o.view(o.t(out, (0, 2, 1, 3), "attn_bthv"), (batch, seq, heads * vdim), "attn"), gate], None,
            "attn_gated")
    layer._note_attention("mla", heads, heads, qk, vdim, None, None, arch.attention.scale, rope, mla=dict(mla))
    return o.linear(out, m.param(f"{p}attn.wo", (d, heads * vdim)), "attn_out"), keep


def _sink_softmax(m, o, scores, heads: int, p: str):
    """softmax over [scores, sink_h] without the sink's column: e^(s - c) / (Σ e^(s - c) +
    e^(sink - c)), c the row's largest of both."""
    sink = o.view(m.param(f"{p}attn.sinks", (heads,)), (1, heads, 1, 1), "sink4")
    top = o("maximum", [o("reduce_max", [scores], {"axes": [-1], "keepdims": True}, "scores_max"), sink], None,
            "logits_max")
    exp = o("exp", [o("sub", [scores, top], None, "scores_shifted")], None, "scores_exp")
    sink_exp = o("exp", [o("sub", [sink, top], None, "sink_shifted")], None, "sink_exp")
    total = o("add", [o("reduce_sum", [exp], {"axes": [-1], "keepdims": True}, "scores_exp_sum"), sink_exp], None,
              "softmax_denominator")
    return o("div", [exp, total], None, "probs")


def _rotate_tail(o, x, positions, rope, dim: int, rdim: int, shape: tuple, name: str):
    """x [..., dim] (viewed per head as ``shape``) with RoPE on its last ``rdim`` dims."""
    flat = shape[:-2] + (shape[-2] * rdim,)
    rotated = o.view(o.rope(o.view(o.cols(x, dim - rdim, dim, f"{name}_rot"), flat, f"{name}_rot_flat"), positions,
                            rope, rdim, f"{name}_rope"), shape[:-1] + (rdim,), f"{name}_rot_heads")
    if dim == rdim:
        return rotated
    return o("concat", [o.cols(x, 0, dim - rdim, f"{name}_pass"), rotated], {"axis": -1}, f"{name}_full")


def indexer_mask(m, layer, x, q_latent, rope, rdim: int, indexer: dict, eps: float):
    """Bool [B, T, P+T]: the keys ``HYV4Indexer`` keeps (module docstring); caches its rotated
    keys as ``past_key_values.{i}.index_key`` [B, 1, P, D_i]."""
    from frontends.dsl import ACTIVATION, PAST

    o, p, i = _Ops(m, layer.prefix + "indexer."), layer.prefix + INDEXER, layer.index
    heads, dim, d = indexer["heads"], indexer["head_dim"], m._features(x)
    batch, seq = x.shape[:2]
    mask, positions = m._context()
    q = o.view(o.linear(q_latent, m.param(f"{p}wq_b", (heads * dim, q_latent.shape[-1])), "q"),
               (batch, seq, heads, dim), "q_heads")
    q = o.t(_rotate_tail(o, q, positions, rope, dim, rdim, (batch, seq, heads, dim), "q"), (0, 2, 1, 3), "q_bhtd")
    k = m.norm(o.linear(x, m.param(f"{p}wk", (dim, d)), "k"), f"{p}k_norm", "layer", eps, bias=True)
    k = o.view(_rotate_tail(o, o.view(k, (batch, seq, 1, dim), "k_head0"), positions, rope, dim, rdim,
                            (batch, seq, 1, dim), "k"), (batch, 1, seq, dim), "k_head")
    past = m._graph.add_input(f"past_key_values.{i}.index_key", ACTIVATION, ("B", 1, PAST, dim))
    k = m.emit("concat", [past, k], {"axis": 2}, f"present.{i}.index_key")[0]
    m._presents.append(k.value)
    scores = o("matmul", [q, o.t(k, (0, 1, 3, 2), "k_t")], None, "qk")
    scores = o("maximum", [scores, o.const(0.0, "zero")], None, "qk_relu")
    weights = o("mul", [o.linear(x, m.param(f"{p}weights_proj", (heads, d)), "weights"),
                        o.const(heads ** -0.5 * dim ** -0.5, "weights_scale")], None, "weights_scaled")
    weights = o.view(o.t(weights, (0, 2, 1), "weights_bht"), (batch, heads, seq, 1), "weights4")
    total = o("reduce_sum", [o("mul", [scores, weights], None, "weighted")], {"axes": [1], "keepdims": False},
              "scores")
    return o("topk_mask", [total, mask], {"k": indexer["topk"], "causal": True}, "keep")


def clamped_moe(m, layer, h, moe: dict):
    """``HYV4MoE`` in the sorted form (module docstring): [B, T, d]."""
    o, p, d = _Ops(m, layer.prefix + "moe."), layer.prefix + "moe.", m._features(h)
    experts, top_k, d_ff, limit = moe["experts"], moe["top_k"], moe["d_ff"], moe["limit"]
    tokens = o.view(h, (dims.product(h.shape[:-1]), d), "tokens")
    route = {"experts": experts, "top_k": top_k, "scoring": "sigmoid", "norm_topk_prob": moe["norm_topk_prob"],
             "routed_scale": float(moe["routed_scale"]),
             **({"n_group": moe["groups"], "topk_group": moe["top_groups"], "group_score": "top2_sum"}
                if moe["groups"] > 1 else {})}
    ids, weights = m.emit("moe_route", [tokens, m.param(f"{p}router", (experts, d)),
                                        m.param(f"{p}router_bias", (experts,))], route,
                          [f"{p}expert_ids", f"{p}routing_weights"])
    token_index, slot_index, indptr = m.emit("moe_dispatch", [ids], {"experts": experts},
                                             [f"{p}{x}" for x in ("token_index", "slot_index", "indptr")])
    rows = o("gather", [tokens, token_index], {"axis": 0}, "rows")
    gemm = {"experts": experts, "top_k": top_k}
    gate, up = (o("grouped_gemm", [rows, m.param(f"{p}w_{x}", (experts, d_ff, d)), indptr], gemm, x)
                for x in ("gate", "up"))
    low = o.const(-limit, "neg_limit")
    gate = o("neg", [o("maximum", [o("neg", [gate], None, "gate_neg"), low], None, "gate_neg_max")], None,
             "gate_clamped")  # min(gate, L)
    up = o("maximum", [o("neg", [o("maximum", [o("neg", [up], None, "up_neg"), low], None, "up_neg_max")], None,
                         "up_min"), low], None, "up_clamped")  # clip(up, -L, L)
    hidden = o("mul", [o("silu", [gate], None, "gate_silu"), up], None, "hidden")
    down = o("grouped_gemm", [hidden, m.param(f"{p}w_down", (experts, d, d_ff)), indptr], gemm, "down")
    pairs = token_index.shape[0]
    row_weights = o.view(o("gather", [o.view(weights, (pairs,), "weights_flat"), slot_index], {"axis": 0},
                           "row_weights"), (pairs, 1), "row_weights_M1")
    shared_ff = moe["shared"] * d_ff
    shared = o("swiglu", [tokens, m.param(f"{p}shared_gate", (shared_ff, d)), m.param(f"{p}shared_up", (shared_ff, d)),
                          m.param(f"{p}shared_down", (d, shared_ff))], None, "shared")
    combined = o("scatter_add", [shared, token_index, o("mul", [down, row_weights], None, "weighted")], None,
                 "combined")
    return o.view(combined, tuple(h.shape), "out")
