"""DeepSeek-V4 (``frontends.hf.families`` registers it): mHC hyper-connected streams
(``frontends.dsl_hyper``, form "manifold") around shared-KV MQA with sinks over a sliding
window plus compressed KV entries (HCA, and CSA with its lightning indexer), and clamped
SwiGLU experts routed by sqrt-softplus scores or by a token-id hash table; built by its own
loop (``expand``).

==============  ============================================================================
deepseek_v4     DeepSeek-V4 (``DeepseekV4ForCausalLM``): ``hc_mult`` residual streams mixed
                in and out of each block by Sinkhorn-projected hyper-connections; attention
                with one shared K=V head over the ``sliding_window`` latest tokens plus, on
                compressed layers, one pooled entry per closed window of ``compress_rates``
                tokens (``"heavily_compressed_attention"``: every entry; ``"compressed_sparse_
                attention"``: overlapping windows, the indexer's ``index_topk`` best);
                grouped low-rank output projection; experts chosen by top-k of sqrtsoftplus /
                softmax / sigmoid scores (plus ``e_score_correction_bias``) or, on
                ``"hash_moe"`` layers, by ``tid2eid[input_ids]``
==============  ============================================================================

The attention (``DeepseekV4Attention``): q = rms(q_b(rms_norm(q_a(x)))) per head (the second
norm weightless), kv = rms_norm(kv_proj(x)) [B, T, D], both rotated on their last
``D · partial_rotary_factor`` dims (interleaved pairs; ``rope_parameters.main`` on sliding
layers, ``.compress`` on compressed ones, at ``position_ids``); scores q·k · D^-0.5 over
[window keys, compressed entries], a hidden key at float32's minimum, softmax with the head's
sink logit in its denominator, times the same keys as values; the result's rotated dims
turned back by -position, then ``o_a`` per group of heads (``o_groups``) and ``o_b``.

Window keys: slot j is seen by the query at slot s when s - ``sliding_window`` < j <= s and
attention_mask[j] (transformers' sliding mask; its cache keeps the window, irc's
``past_key_values.{i}.key`` [B, 1, P, D] every slot).

Compressed entries (``DeepseekV4HCACompressor`` / ``DeepseekV4CSACompressor``), held ONE PER
SLOT: with c = kv_proj and g = gate_proj of the layer's input, the slot s whose s + 1 is a
multiple of the rate r closes window w = (s + 1) / r - 1 and holds rms_norm(Σ_j softmax_j(g_j
+ position_bias_j) · c_j) over the window's slots (CSA: 2r slots, the previous window's
through the first half of c, g and the bias, its own through the second; window 0 has no
previous one), rotated at slot w · r; every other slot holds a value no query sees. Windows
count cache slots, left padding included, as transformers' cache does (so a padded row is
held against transformers' padded batch, not the row alone). The query at position p
(``position_ids``) sees closed window w when w < (p + 1) // r; on HCA layers a call of one
token sees every closed window (transformers builds no mask there). The last span - 1 slots'
[c | g] ride along as ``past_key_values.{i}.compressed_window`` (zeros before the first
call), so a prefill in several calls and decode are exact. COST: the compressed cache
``past_key_values.{i}.compressed_key`` [B, 1, P, D] holds r times transformers' entries
(it keeps P // r); ``irc show`` counts the caches as they are.

CSA's indexer (``DeepseekV4Indexer``): its own entries the same way at ``index_head_dim``
(``index_window`` / ``index_key``), q = q_b(the q latent) per index head rotated at the
positions, scores Σ_h weights_proj(x)_h · H_i^-0.5 · relu(q_h · k) · D_i^-0.5 over the
visible entries; the attention sees the ``index_topk`` best (``topk_mask``; ties to the lower
slot, where torch.topk leaves them unspecified).

The MoE (``DeepseekV4SparseMoeBlock``): scores = sqrt(softplus(logits)) (or softmax / sigmoid
per ``scoring_func``); experts: top-k of scores + ``e_score_correction_bias``, or on
``"hash_moe"`` layers the row input_ids of ``tid2eid`` (an i64 param: the checkpoint reader
reads integer tables into integer params only); weights = the experts' scores / (their sum
+ 1e-20) · ``routed_scaling_factor`` (whatever ``norm_topk_prob`` says, as transformers);
routed and shared experts both silu(min(gate, L)) · clip(up, -L, L), L = ``swiglu_limit``;
the shared expert is ``moe_intermediate_size`` wide (transformers reads no
``n_shared_experts``).

Checkpoint names: those save_pretrained writes (``attn.wq_a``, ``attn.compressor.ape``,
``ffn.experts.{e}.w1``, ``hc_attn_fn``, ``head.weight``...; transformers renames them on load).
Refused at their key: ``hidden_act`` other than silu, ``mlp_bias``, heads · head_dim that
``o_groups`` does not divide, a ``compress_rates`` without a used layer type, an
``index_head_dim`` narrower than the rotated dims, other ``scoring_func`` values.
"""
from __future__ import annotations

import dataclasses
from functools import partial

import numpy as np

from frontends.hf.families_common import embedded_inputs
from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, read_rope
from frontends.hf.families_common import _arch, _silu
from frontends.hf.families_deepseek_v32 import _Ops
from frontends.hf.families_hyper import _rotate_tail, _sink_softmax
from irc import dims
from irc.yamlloc import boolean, layer_count, number, positive_int, positive_number

NEG = float(np.finfo(np.float32).min)
LAYER_TYPES = ("sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention")
SCORING = ("sqrtsoftplus", "softmax", "sigmoid")

DEFAULTS = {  # transformers 5.25's DeepseekV4Config
    "deepseek_v4": {
        "vocab_size": 129280, "hidden_size": 4096, "moe_intermediate_size": 2048, "num_hidden_layers": 43,
        "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "q_lora_rank": 1024,
        "num_experts_per_tok": 6, "n_routed_experts": 256, "n_shared_experts": 1, "scoring_func": "sqrtsoftplus",
        "norm_topk_prob": True, "routed_scaling_factor": 1.5, "max_position_embeddings": 1048576,
        "rope_theta": 10000.0, "layer_types": None, "compress_rates": None, "compress_rope_theta": 160000.0,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "mlp_layer_types": None, "swiglu_limit": 10.0,
        "sliding_window": 128, "o_groups": 8, "o_lora_rank": 1024, "index_n_heads": 64, "index_head_dim": 128,
        "index_topk": 512, "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "partial_rotary_factor": None, "attention_bias": False, "mlp_bias": False,
    },
}

def layouts(experts) -> dict:
    """The names save_pretrained writes (transformers' conversion_mapping renames them on
    load); ``experts`` is ``frontends.hf.families.Experts`` (one tensor per expert)."""
    names = {
        "attn_norm": "attn_norm.weight", "mlp_norm": "ffn_norm.weight",
        **{f"{b}_hc.{x}": f"hc_{b}_{x}" for b in ("attn", "ffn") for x in ("fn", "base", "scale")},
        **{f"attn.{x}": f"attn.w{x}.weight" for x in ("q_a", "q_b", "kv", "o_a", "o_b")},
        "attn.q_a_norm": "attn.q_norm.weight", "attn.kv_norm": "attn.norm.weight", "attn.sinks": "attn.attn_sink",
        "comp.kv": "attn.compressor.wkv.weight", "comp.gate": "attn.compressor.wgate.weight",
        "comp.position_bias": "attn.compressor.ape", "comp.kv_norm": "attn.compressor.norm.weight",
        **{f"comp.indexer.{x}": f"attn.indexer.compressor.{w}" for x, w in (
            ("kv", "wkv.weight"), ("gate", "wgate.weight"), ("position_bias", "ape"), ("kv_norm", "norm.weight"))},
        "comp.indexer.q_b": "attn.indexer.wq_b.weight", "comp.indexer.weights_proj": "attn.indexer.weights_proj.weight",
        "moe.router": "ffn.gate.weight", "moe.router_bias": "ffn.gate.bias", "moe.tid2eid": "ffn.gate.tid2eid",
        **{f"moe.w_{x}": experts(f"ffn.experts.{{e}}.{w}.weight") for x, w in (("gate", "w1"), ("up", "w3"),
                                                                              ("down", "w2"))},
        **{f"moe.shared_{x}": f"ffn.shared_experts.{w}.weight" for x, w in (("gate", "w1"), ("up", "w3"),
                                                                          ("down", "w2"))},
    }
    top = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "head.weight",
           **{f"hc_head.{x}": f"model.hc_head.hc_{x}" for x in ("fn", "base", "scale")}}
    return {"deepseek_v4": {**names, "_top": top, "_spare": ("mtp.", "model.mtp.")}}


def _kinds(cfg: Config, key: str, n: int, allowed: tuple, derive) -> list[str]:
    """A per-layer list of names from ``allowed``; ``derive(i)`` where the file gives none."""
    kinds = cfg.data.get(key)
    if kinds is None:
        return [derive(i) for i in range(n)]
    if not isinstance(kinds, list) or len(kinds) < n:
        raise cfg.error(key, f"expected a list of {n} entries (num_hidden_layers), got {kinds!r}")
    for kind in kinds[:n]:
        if kind not in allowed:
            raise cfg.unsupported(key, kind, hint=f"entries irc builds: {', '.join(allowed)}")
    return list(kinds[:n])


def _v4_rope(cfg: Config, label: str, head_dim: int, rdim: int, theta: float):
    """The "main" / "compress" RoPE of ``rope_parameters`` for the last ``rdim`` dims."""
    params = cfg.data.get("rope_parameters") or {}
    sub = params.get(label) if isinstance(params.get(label), dict) else {"rope_theta": theta}
    sub = {k: v for k, v in sub.items() if k != "partial_rotary_factor"}
    spec = read_rope(cfg, rdim, sub, f"rope_parameters.{label}", default_base=theta, convention="interleaved",
                     original_max=cfg.get("max_position_embeddings", positive_int, None))
    return dataclasses.replace(spec, rotary_dim=None)


def _rates(cfg: Config) -> dict:
    """compress_rates (or the legacy compress_rate_csa / compress_rate_hca): layer type -> rate."""
    rates = dict(cfg.data.get("compress_rates") or {"compressed_sparse_attention": 4,
                                                      "heavily_compressed_attention": 128})
    for key, kind in (("compress_rate_csa", "compressed_sparse_attention"),
                      ("compress_rate_hca", "heavily_compressed_attention")):
        if cfg.data.get(key) is not None:
            rates[kind] = cfg.data[key]
    for kind, rate in rates.items():
        if isinstance(rate, bool) or not isinstance(rate, int) or rate < 2:
            raise cfg.error("compress_rates", f"{kind}: expected an int of 2 or more (irc carries the last "
                                              f"rate - 1 tokens), got {rate!r}")
    return rates


def _deepseek_v4(cfg: Config, name: str, model_type: str) -> Arch:
    """DeepSeek-V4's reading of config.json (module docstring)."""
    d, heads, n = cfg.get("hidden_size", positive_int), cfg.get("num_attention_heads", positive_int), \
        cfg.get("num_hidden_layers", layer_count)
    _silu(cfg)
    cfg.check("mlp_bias", lambda v: not v, hint="the shared expert has no bias in irc")
    dim, groups = cfg.get("head_dim", positive_int), cfg.get("o_groups", positive_int)
    if (heads * dim) % groups:
        raise cfg.error("o_groups", f"{groups} groups do not split {heads} heads of {dim}")
    partial_factor = cfg.get("partial_rotary_factor", positive_number, None)
    legacy = cfg.data.get("qk_rope_head_dim")  # transformers folds it into partial_rotary_factor
    rdim = int(dim * partial_factor) if partial_factor is not None else \
        int(dim * (legacy / dim if isinstance(legacy, int) else 64 / 512))
    if rdim % 2 or not 0 < rdim <= dim:
        raise cfg.error("partial_rotary_factor", f"rotates {rdim} of {dim} dims; RoPE needs an even count")
    ratios = cfg.data.get("compress_ratios")  # legacy per-layer 0 / 4 / 128
    by_ratio = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    kinds = _kinds(cfg, "layer_types", n, LAYER_TYPES, lambda i: by_ratio.get(ratios[i]) if isinstance(
        ratios, list) and len(ratios) > i else "heavily_compressed_attention" if i < 2 or i % 2 == 0
        else "compressed_sparse_attention")
    if None in kinds:
        raise cfg.unsupported("compress_ratios", ratios, hint="per-layer ratios 0, 4 or 128 (transformers' map)")
    rates = _rates(cfg)
    for kind in sorted(set(kinds) - {"sliding_attention"} - set(rates)):
        raise cfg.error("compress_rates", f"gives no rate for {kind} layers")
    index = {"heads": cfg.get("index_n_heads", positive_int), "dim": cfg.get("index_head_dim", positive_int),
             "topk": cfg.get("index_topk", positive_int)}
    if "compressed_sparse_attention" in kinds and index["dim"] < rdim:
        raise cfg.error("index_head_dim", f"{index['dim']} is narrower than the {rdim} rotated dims")
    mlp_kinds = _kinds(cfg, "mlp_layer_types", n, ("hash_moe", "moe"),
                       lambda i: "hash_moe" if i < cfg.data.get("num_hash_layers", 3) else "moe")
    scoring = cfg.get("scoring_func", str)
    if scoring not in SCORING:
        raise cfg.unsupported("scoring_func", scoring, hint=f"irc scores by {', '.join(SCORING)}")
    moe = {"experts": cfg.get("n_routed_experts", positive_int), "top_k": cfg.get("num_experts_per_tok", positive_int),
           "d_ff": cfg.get("moe_intermediate_size", positive_int), "scoring": scoring,
           "routed_scale": cfg.get("routed_scaling_factor", number), "limit": cfg.get("swiglu_limit", number),
           "hash": [k == "hash_moe" for k in mlp_kinds]}
    if moe["top_k"] > moe["experts"]:
        raise cfg.error("num_experts_per_tok", f"{moe['top_k']} exceeds {moe['experts']} experts")
    main = _v4_rope(cfg, "main", dim, rdim, cfg.get("rope_theta", positive_number))
    compress = _v4_rope(cfg, "compress", dim, rdim, cfg.get("compress_rope_theta", positive_number))
    v4 = {"heads": heads, "dim": dim, "rdim": rdim, "q_rank": cfg.get("q_lora_rank", positive_int),
          "groups": groups, "o_rank": cfg.get("o_lora_rank", positive_int), "rates": rates, "index": index,
          "window": cfg.get("sliding_window", positive_int), "kinds": kinds, "main": main, "compress": compress,
          "mult": cfg.get("hc_mult", positive_int), "iters": cfg.get("hc_sinkhorn_iters", positive_int),
          "hc_eps": cfg.get("hc_eps", number)}
    cfg.get("tie_word_embeddings", boolean)
    attention = Attention("gqa", heads, 1, dim)
    layers = [LayerSpec(None, main if k == "sliding_attention" else compress, True) for k in kinds]
    arch = _arch(cfg, name, model_type, {"d": d, "layers": n}, attention, layers, None, moe=moe,
                 checkpoint="deepseek_v4")
    arch.expand = partial(expand, v4)
    return arch


FAMILIES = {"deepseek_v4": _deepseek_v4}


def expand(v4: dict, arch: Arch, origin: str):
    """The decoder through the DSL (module docstring)."""
    from frontends.dsl import Model
    from frontends.dsl_hyper import HyperConnections
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps = arch.norm_eps
    with m.at(origin):
        hc = HyperConnections(m, v4["mult"], arch.d_model, eps, v4["hc_eps"], "manifold",
                              sinkhorn_iters=v4["iters"])
        streams = hc.widen(embedded_inputs(m, arch))
        for layer, kind in zip(m.layers(arch.n_layers), v4["kinds"]):
            p = layer.prefix
            state, h = hc.enter(streams, f"{p}attn_hc.")
            out = attention(m, layer, layer.rms_norm(h, "attn_norm", eps), v4, kind, eps)
            streams = hc.leave(state, out, f"{p}attn_hc.")
            state, h = hc.enter(streams, f"{p}ffn_hc.")
            out = routed_experts(m, layer, layer.rms_norm(h, "mlp_norm", eps), arch.moe)
            streams = hc.leave(state, out, f"{p}ffn_hc.")
        m.logits(m.rms_norm(hc.head(streams, "hc_head."), "norm", eps), tied=arch.tied)
    m.meta["hyper_connections"] = {"form": "manifold", "streams": v4["mult"], "eps": v4["hc_eps"],
                                   "sinkhorn_iters": v4["iters"]}
    m.meta["compressed_attention"] = {"rates": dict(v4["rates"]), "slots": "one entry per token (rate x transformers')"}
    return m.graph


def _slots(o, x, mask):
    """(i64 [T] the call's slots P + t, i64 [] T): slots count the attention mask's columns."""
    past = o("sub", [o("dim_size", [mask], {"axis": 1}, "total"), o("dim_size", [x], {"axis": 1}, "seq")], None,
             "past")
    return o("add", [o("range_like", [x], {"axis": 1}, "query_index"), past], None, "query_slots")


def _i64(o, value, name: str):
    return o("constant", [], {"value": value, "dtype": "i64"}, name)


def attention(m, layer, x, v4: dict, kind: str, eps: float):
    """[B, T, d]: ``DeepseekV4Attention`` (module docstring)."""
    o, p, i = _Ops(m, layer.prefix), layer.prefix, layer.index
    heads, dim, rdim, d = v4["heads"], v4["dim"], v4["rdim"], m._features(x)
    batch, seq = x.shape[:2]
    mask, positions = m._context()
    rope = dsl_rope(v4["main"] if kind == "sliding_attention" else v4["compress"])
    q_latent = m.norm(o.linear(x, m.param(f"{p}attn.q_a", (v4["q_rank"], d)), "q_a_out"), f"{p}attn.q_a_norm",
                      "rms", eps)
    q = o.view(o.linear(q_latent, m.param(f"{p}attn.q_b", (heads * dim, v4["q_rank"])), "q"),
               (batch, seq, heads, dim), "q_heads")
    q = _rotate_tail(o, m.plain_rms_norm(q, f"{p}attn.q_norm", eps), positions, rope, dim, rdim,
                     (batch, seq, heads, dim), "q")
    kv = m.norm(o.linear(x, m.param(f"{p}attn.kv", (dim, d)), "kv_out"), f"{p}attn.kv_norm", "rms", eps)
    kv = _rotate_tail(o, o.view(kv, (batch, seq, 1, dim), "kv_head0"), positions, rope, dim, rdim,
                      (batch, seq, 1, dim), "kv")
    key = _cached(m, o, i, "key", o.view(kv, (batch, 1, seq, dim), "kv_bhtd"), dim)
    slots = _slots(o, x, mask)
    keys, visible = key, _window_visible(o, x, mask, key, slots, v4["window"])
    if kind != "sliding_attention":
        oc = _Ops(m, p + "comp.")
        entries = compressed_entries(m, oc, x, v4, slots, eps, kind, dim, p + "comp.", "compressed")
        if kind == "heavily_compressed_attention":
            seen = _entries_visible(oc, x, entries, positions, v4["rates"][kind], True)
        else:
            seen = indexer_keep(m, layer, x, q_latent, v4, slots, positions, eps)
        keys = o("concat", [key, entries], {"axis": 2}, "keys")
        visible = o("concat", [visible, seen], {"axis": -1}, "visible")
    scores = o("mul", [o("matmul", [o.t(q, (0, 2, 1, 3), "q_bhtd"), o.t(keys, (0, 1, 3, 2), "k_t")], None, "qk"),
                       o.const(dim ** -0.5, "attn_scale")], None, "scores")
    scores = o("where", [visible, scores, o.const(NEG, "attn_neg")], None, "scores_masked")
    out = o("matmul", [_sink_softmax(m, o, scores, heads, p), keys], None, "attn_bhtd")
    # rotating by -position: conjugate the pairs (negate their odd halves), rotate, conjugate back
    sign = o.const([1.0] * (dim - rdim) + [1.0, -1.0] * (rdim // 2), "pair_conjugate")
    out = o("mul", [o.t(out, (0, 2, 1, 3), "attn_bthd"), sign], None, "attn_conj")
    out = _rotate_tail(o, out, positions, rope, dim, rdim, (batch, seq, heads, dim), "out")
    out = o("mul", [out, sign], None, "attn_back")
    groups, rank = v4["groups"], v4["o_rank"]
    width = heads * dim // groups
    grouped = o.view(out, (batch, seq, groups, 1, width), "grouped")
    w = o.t(o.view(m.param(f"{p}attn.o_a", (groups * rank, width)), (groups, rank, width), "o_a_groups"),
            (0, 2, 1), "o_a_t")
    low = o.view(o("matmul", [grouped, w], None, "o_a_out"), (batch, seq, groups * rank), "o_low")
    layer._note_attention("gqa", heads, 1, dim, dim, v4["window"], None, dim ** -0.5, rope)
    return o.linear(low, m.param(f"{p}attn.o_b", (d, groups * rank)), "attn_out")


def _cached(m, o, i: int, kind: str, new, dim: int):
    """concat(``past_key_values.{i}.{kind}`` [B, 1, P, dim], new) as ``present.{i}.{kind}``."""
    from frontends.dsl import ACTIVATION, PAST

    past = m._graph.add_input(f"past_key_values.{i}.{kind}", ACTIVATION, ("B", 1, PAST, dim))
    out = m.emit("concat", [past, new], {"axis": 2}, f"present.{i}.{kind}")[0]
    m._presents.append(out.value)
    return out


def _window_visible(o, x, mask, key, slots, window: int):
    """Bool [B, 1, T, S]: key slot j with s - window < j <= s (s the query's slot) and
    attention_mask[b, j]."""
    keys = o.view(o("range_like", [key], {"axis": 2}, "key_slots"), (1, key.shape[2]), "key_row")
    queries = o.view(slots, (x.shape[1], 1), "query_column")
    causal = o("less_equal", [keys, queries], None, "causal")
    recent = o("less", [o("sub", [queries, _i64(o, window, "window")], None, "window_start"), keys], None, "recent")
    both = o.view(o("logical_and", [causal, recent], None, "in_window"), (1, 1, x.shape[1], key.shape[2]),
                  "in_window4")
    real = o.view(o("cast", [mask], {"to": "bool"}, "real"), (x.shape[0], 1, 1, key.shape[2]), "real4")
    return o("logical_and", [both, real], None, "window_visible")


def compressed_entries(m, o, x, v4: dict, slots, eps: float, kind: str, dim: int, params: str, name: str):
    """Entries [B, 1, P+T, dim], one per slot (module docstring), cached as
    ``present.{i}.{name}_key``; the window's raw [c | g] as ``present.{i}.{name}_window``.
    CSA (``kind`` "compressed_sparse_attention") projects c and g to 2 · dim: slot s pools the
    2r slots s - 2r + 1 .. s, the first r through their first dim features (position_bias'
    first dim columns), the last r through their second dim (and bias columns); window 0
    has no first half (transformers' -inf gate)."""
    i, rate, d = int(params.split(".")[1]), v4["rates"][kind], m._features(x)
    overlap = kind == "compressed_sparse_attention"
    width, span = (2 * dim, 2 * rate) if overlap else (dim, rate)
    batch, seq = x.shape[:2]
    feats = o("concat", [o.linear(x, m.param(f"{params}kv", (width, d)), "kv"),
                         o.linear(x, m.param(f"{params}gate", (width, d)), "gate")], {"axis": -1}, "features")
    past = m._state(i, f"{name}_window", (span - 1, 2 * width))
    feats_all = o("concat", [past, feats], {"axis": 1}, "features_all")  # [B, span-1+T, 2 width]
    tail = o("add", [o("dim_size", [feats], {"axis": 1}, "new"), _i64(o, list(range(span - 1)), "tail_offsets")],
             None, "tail_index")
    state = m.emit("gather", [feats_all, tail], {"axis": 1}, f"present.{i}.{name}_window")[0]
    m._presents.append(state.value)
    rows = o("add", [o.view(o("range_like", [x], {"axis": 1}, "row_start"), (seq, 1), "row_start_column"),
                     _i64(o, [list(range(span))], "row_offsets")], None, "row_index")  # [T, span]
    window = o("gather", [feats_all, rows], {"axis": 1}, "windows")  # [B, T, span, 2 width]
    bias = m.param(f"{params}position_bias", (rate, width))
    if overlap:
        kv, gate = _overlap(o, window, bias, slots, rate, dim)
    else:
        kv = o.cols(window, 0, width, "window_kv")
        gate = o("add", [o.cols(window, width, 2 * width, "window_gate_raw"), bias], None, "window_gate")
    weights = o("softmax", [gate], {"axis": 2}, "window_weights")
    pooled = o("reduce_sum", [o("mul", [kv, weights], None, "weighted")], {"axes": [2], "keepdims": False}, "pooled")
    pooled = m.norm(pooled, f"{params}kv_norm", "rms", eps)
    start = o("add", [slots, _i64(o, 1 - rate, "one_minus_rate")], None, "window_first_slot")
    start = o("maximum", [start, _i64(o, 0, "zero_slot")], None, "window_first_clamped")  # slots no query sees
    start = o("expand", [o.view(start, (1, seq), "window_first_row")], {"shape": [batch, seq]}, "window_first")
    pooled = _rotate_tail(o, o.view(pooled, (batch, seq, 1, dim), "pooled_head"), start, dsl_rope(v4["compress"]),
                          dim, v4["rdim"], (batch, seq, 1, dim), "entry")
    return _cached(m, o, i, f"{name}_key", o.view(pooled, (batch, 1, seq, dim), "entry_bhtd"), dim)


def _overlap(o, window, bias, slots, rate: int, dim: int):
    """(kv, gate) [B, T, 2r, dim] of CSA's two series (``compressed_entries``)."""
    width = 2 * dim
    halves = [o("slice", [window], {"axis": 2, "start": a, "end": b}, f"{n}_rows")
              for n, a, b in (("previous", 0, rate), ("current", rate, 2 * rate))]
    kv = o("concat", [o.cols(halves[0], 0, dim, "previous_kv"), o.cols(halves[1], dim, width, "current_kv")],
           {"axis": 2}, "window_kv")
    previous = o("add", [o.cols(halves[0], width, width + dim, "previous_gate_raw"), o.cols(bias, 0, dim, "bias_a")],
                 None, "previous_gate")
    first = o.view(o("less", [slots, _i64(o, 2 * rate - 1, "second_window_end")], None, "no_previous"),
                   (1, slots.shape[0], 1, 1), "no_previous4")
    previous = o("where", [first, o.const(NEG, "gate_neg"), previous], None, "previous_gate_masked")
    current = o("add", [o.cols(halves[1], width + dim, 2 * width, "current_gate_raw"),
                        o.cols(bias, dim, width, "bias_b")], None, "current_gate")
    return kv, o("concat", [previous, current], {"axis": 2}, "window_gate")


def _entries_visible(o, x, entries, positions, rate: int, at_decode_all: bool):
    """Bool [B, 1, T, S]: slot j closes window w = (j + 1) / r - 1, seen by the query at
    position p when w < (p + 1) // r (``at_decode_all``: or always, by a call of one token)."""
    r = _i64(o, rate, "rate")
    ends = o("add", [o("range_like", [entries], {"axis": 2}, "entry_slots"), _i64(o, 1, "one")], None, "slot_ends")
    count = o("div", [ends, r], None, "windows_closed")  # (j + 1) // r
    closed = o("equal", [o("mul", [count, r], None, "closed_at"), ends], None, "closed")  # [S]
    limit = o("div", [o("add", [positions, _i64(o, 1, "one_q")], None, "positions_next"), r], None, "threshold")
    if at_decode_all:
        decode = o("equal", [o("dim_size", [x], {"axis": 1}, "calls_seq"), _i64(o, 1, "single")], None, "decode")
        limit = o("where", [decode, _i64(o, 2 ** 62, "unbounded"), limit], None, "threshold_or_all")  # [B, T]
    seen = o("less_equal", [o.view(count, (1, 1, entries.shape[2]), "count_row"),
                            o.view(limit, (x.shape[0], x.shape[1], 1), "threshold_column")], None, "causal")
    both = o("logical_and", [seen, o.view(closed, (1, 1, entries.shape[2]), "closed_row")], None, "entries_seen")
    return o.view(both, (x.shape[0], 1, x.shape[1], entries.shape[2]), "entries_visible")


def indexer_keep(m, layer, x, q_latent, v4: dict, slots, positions, eps: float):
    """Bool [B, 1, T, S]: the compressed slots CSA's lightning indexer keeps: its own entries
    (``compressed_entries`` at ``index_head_dim``), q = q_b(q latent) per index head rotated
    at the positions, scores Σ_h (weights_proj(x)_h · H_i^-0.5) · relu(q_h · k) · D_i^-0.5,
    the ``index_topk`` best of the visible entries (``topk_mask``)."""
    p, o = layer.prefix + "comp.indexer.", _Ops(m, layer.prefix + "indexer.")
    heads, dim, d = v4["index"]["heads"], v4["index"]["dim"], m._features(x)
    batch, seq = x.shape[:2]
    entries = compressed_entries(m, o, x, v4, slots, eps, "compressed_sparse_attention", dim, p, "index")
    q = o.view(o.linear(q_latent, m.param(f"{p}q_b", (heads * dim, q_latent.shape[-1])), "q"),
               (batch, seq, heads, dim), "q_heads")
    q = o.t(_rotate_tail(o, q, positions, dsl_rope(v4["compress"]), dim, v4["rdim"], (batch, seq, heads, dim), "q"),
            (0, 2, 1, 3), "q_bhtd")
    scores = o("maximum", [o("matmul", [q, o.t(entries, (0, 1, 3, 2), "k_t")], None, "qk"), o.const(0.0, "zero")],
               None, "qk_relu")
    scores = o("mul", [scores, o.const(dim ** -0.5, "softmax_scale")], None, "qk_scaled")
    weights = o("mul", [o.linear(x, m.param(f"{p}weights_proj", (heads, d)), "weights"),
                        o.const(heads ** -0.5, "weights_scale")], None, "weights_scaled")
    weights = o.view(o.t(weights, (0, 2, 1), "weights_bht"), (batch, heads, seq, 1), "weights4")
    total = o("reduce_sum", [o("mul", [scores, weights], None, "weighted")], {"axes": [1], "keepdims": False},
              "scores")
    visible = _entries_visible(o, x, entries, positions, v4["rates"]["compressed_sparse_attention"], False)
    visible3 = o.view(visible, (batch, seq, entries.shape[2]), "visible3")
    ranked = o("where", [visible3, total, o.const(NEG, "hidden")], None, "ranked")
    keep = o("topk_mask", [ranked], {"k": v4["index"]["topk"], "causal": False}, "top")
    return o.view(o("logical_and", [keep, visible3], None, "keep3"), (batch, 1, seq, entries.shape[2]), "keep")


def routed_experts(m, layer, h, moe: dict):
    """``DeepseekV4SparseMoeBlock`` in the sorted form (module docstring): [B, T, d]."""
    o, p, d, i = _Ops(m, layer.prefix + "moe."), layer.prefix + "moe.", m._features(h), layer.index
    experts, top_k = moe["experts"], moe["top_k"]
    tokens = o.view(h, (dims.product(h.shape[:-1]), d), "tokens")
    logits = o.linear(tokens, m.param(f"{p}router", (experts, d)), "logits")
    if moe["scoring"] == "sqrtsoftplus":
        scores = o("sqrt", [o("softplus", [logits], None, "softplus")], None, "scores")
    elif moe["scoring"] == "softmax":
        scores = o("softmax", [logits], {"axis": -1}, "scores")
    else:
        scores = o("sigmoid", [logits], None, "scores")
    if moe["hash"][i]:
        from irc.dtypes import DType

        table = m._graph.add_param(f"{p}tid2eid", DType.i64, (m.vocab, top_k))
        ids = o("gather", [table, o.view(m.input_ids(), (tokens.shape[0],), "ids_flat")], {"axis": 0}, "expert_ids")
    else:
        choice = o("add", [scores, m.param(f"{p}router_bias", (experts,))], None, "choice")
        ids = m.emit("topk", [choice], {"k": top_k}, [f"{p}choice_top", f"{p}expert_ids"])[1]
    hit = o("equal", [o.view(ids, (tokens.shape[0], top_k, 1), "ids3"),
                      o.view(o("range_like", [logits], {"axis": 1}, "expert_index"), (1, 1, experts), "experts3")],
            None, "one_hot")
    picked = o("reduce_sum", [o("where", [hit, o.view(scores, (tokens.shape[0], 1, experts), "scores3"),
                                          o.const(0.0, "zero")], None, "picked_scores")],
               {"axes": [-1], "keepdims": False}, "picked")
    total = o("add", [o("reduce_sum", [picked], {"axes": [-1], "keepdims": True}, "picked_sum"),
                      o.const(1e-20, "tiny")], None, "picked_total")
    weights = o("mul", [o("div", [picked, total], None, "normalized"), o.const(float(moe["routed_scale"]), "scale")],
                None, "routing_weights")
    return _experts_out(m, o, p, h, tokens, ids, weights, moe)


def _clamped(o, gate, up, limit: float, name: str):
    """silu(min(gate, L)) · clip(up, -L, L)."""
    low = o.const(-limit, f"{name}_neg_limit")
    gate = o("neg", [o("maximum", [o("neg", [gate], None, f"{name}_gate_neg"), low], None, f"{name}_gate_neg_max")],
             None, f"{name}_gate_clamped")
    up = o("maximum", [o("neg", [o("maximum", [o("neg", [up], None, f"{name}_up_neg"), low], None,
                                   f"{name}_up_neg_max")], None, f"{name}_up_min"), low], None, f"{name}_up_clamped")
    return o("mul", [o("silu", [gate], None, f"{name}_gate_silu"), up], None, f"{name}_hidden")


def _experts_out(m, o, p: str, h, tokens, ids, weights, moe: dict):
    """The routed experts (moe_dispatch, grouped_gemm) plus the clamped shared expert."""
    experts, top_k, d_ff, d, limit = moe["experts"], moe["top_k"], moe["d_ff"], m._features(h), moe["limit"]
    token_index, slot_index, indptr = m.emit("moe_dispatch", [ids], {"experts": experts},
                                             [f"{p}{x}" for x in ("token_index", "slot_index", "indptr")])
    rows = o("gather", [tokens, token_index], {"axis": 0}, "rows")
    gemm = {"experts": experts, "top_k": top_k}
    gate, up = (o("grouped_gemm", [rows, m.param(f"{p}w_{x}", (experts, d_ff, d)), indptr], gemm, x)
                for x in ("gate", "up"))
    down = o("grouped_gemm", [_clamped(o, gate, up, limit, "routed"), m.param(f"{p}w_down", (experts, d, d_ff)),
                              indptr], gemm, "down")
    pairs = token_index.shape[0]
    row_weights = o.view(o("gather", [o.view(weights, (pairs,), "weights_flat"), slot_index], {"axis": 0},
                           "row_weights"), (pairs, 1), "row_weights_M1")
    shared_gate, shared_up = (o.linear(tokens, m.param(f"{p}shared_{x}", (d_ff, d)), f"shared_{x}")
                              for x in ("gate", "up"))
    shared = o.linear(_clamped(o, shared_gate, shared_up, limit, "shared"), m.param(f"{p}shared_down", (d, d_ff)),
                      "shared")
    combined = o("scatter_add", [shared, token_index, o("mul", [down, row_weights], None, "weighted")], None,
                 "combined")
    return o.view(combined, tuple(h.shape), "out")
