"""Kolibri-1.1 (Aleph Alpha; ``frontends.hf.families`` registers it): Kolibri-1's decoder
(``families_act_2026``: sandwich norms, q/k RMS norms per head, RoPE'd windowed
"sliding_attention" layers, the sigmoid-of-logits router plus one shared SwiGLU expert) whose
NoPE "indexed_attention" layers attend to the keys their indexer selects.

==========  ===============================================================================
kolibri1_1  Kolibri-1.1: dense SwiGLU MLPs of ``mlp_only_intermediate_size`` on
            ``mlp_only_layers``, MoE elsewhere; indexed layers read the keys and values of
            ``kv_source_layers`` (a layer reading another's has no k/v projections and no
            cache of its own); their keys and values rounded to NVFP4
            (``irc.ops.nvfp4.nvfp4_fake_quantize``) before the attention
==========  ===============================================================================

The selection (transformers' ``Kolibri1_1Indexer``), per query row: its visible keys are the
causal and padding mask's; positions count from the row's first visible key (``start``) and
L = last visible key + 1 - start. Routing scores are head_dim^-0.5 / ``index_num_heads`` · Σ_h
relu(q_h · k) over the first ``index_num_heads`` query heads (q after its norm) and key head 0,
both NVFP4-rounded. An indexer (``index_layers``) takes a pool: every visible key, or where
L > ``index_pool_size`` the keys of the ``index_pool_size / index_compression`` best blocks of
``index_compression`` keys counted from ``start`` (a block scores against the NVFP4 rounding of
its keys' mean, keys no query sees counting as zeros; the block holding the row's newest keys
scores 0 if incomplete, later blocks are never taken); the other indexed layers reuse the pool
of the nearest earlier indexer. Where L exceeds ``index_topk`` + ``index_num_local_tokens`` +
``index_num_sink_tokens``, a row keeps the first ``index_num_sink_tokens`` and the last
``index_num_local_tokens`` keys and the ``index_topk`` best-scoring others of its pool;
otherwise every visible key. Every tie goes to the lower index, as transformers' (all through
``irc.ops.sparse_index.topk_mask``); blocks and masks are built as float 0/1 products and
matmuls with a [keys, keys] block-membership matrix, exact for integer positions.

Refused, naming config.json and the key, where transformers' config class raises too: another
``hidden_act``; layer types other than the two; ``index_layers`` / ``kv_source_layers`` it
rejects, or no ``kv_source_layers`` with more than 10 indexed layers (its default covers 10);
a head_dim off NVFP4's blocks of 16; ``index_num_heads`` beyond one key head's query heads; an
``index_pool_size`` that is not a multiple of ``index_compression``.

Cost: the indexers' block means and pool expansion are matmuls with a [S, S] block-membership
matrix per sequence, and the scores [B, T, S] per index head, quadratic in the context as
transformers' reference indexer is.
"""
from __future__ import annotations

from functools import partial

from frontends.hf.families_common import embedded_inputs
from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, int_list, string_list
from frontends.hf.families_act_2026 import DEFAULTS as ACT_DEFAULTS
from frontends.hf.families_act_2026 import LAYOUTS as ACT_LAYOUTS
from frontends.hf.families_common import _arch, _dims, _experts, _rope
from frontends.hf.families_deepseek_v32 import _groups
from frontends.hf.families_deepseek_v32 import _Ops as _LayerOps
from irc.yamlloc import boolean, non_negative_int, positive_int

INDEXED, SLIDING = "indexed_attention", "sliding_attention"
NEG = -3.4028234663852886e38  # float32's minimum: transformers' masked score
DEFAULTS = {"kolibri1_1": {**ACT_DEFAULTS["kolibri1"], "index_topk": 2048, "index_pool_size": 16384,
                           "index_compression": 16, "index_num_heads": 12, "index_num_local_tokens": 128,
                           "index_num_sink_tokens": 8, "mlp_only_intermediate_size": 3584}}
LAYOUTS = {"kolibri1_1": dict(ACT_LAYOUTS["kolibri1"])}
INDEX_KEYS = ("index_topk", "index_pool_size", "index_compression", "index_num_heads", "index_num_local_tokens",
              "index_num_sink_tokens")


def _layout(cfg: Config, n: int) -> tuple[list[str], list[int], list[int]]:
    """(layer types, index layers, kv source per layer) as Kolibri1_1Config derives and checks them."""
    types = cfg.get("layer_types", string_list, None) or [INDEXED if (i + 1) % 5 == 0 else SLIDING for i in range(n)]
    if len(types) != n or set(types) - {INDEXED, SLIDING}:
        raise cfg.unsupported("layer_types", types, hint=f"{n} entries, each {INDEXED!r} or {SLIDING!r}")
    indexed = [i for i, t in enumerate(types) if t == INDEXED]
    index_layers = cfg.get("index_layers", int_list, None)
    if index_layers is None:
        index_layers = [indexed[i] for i in (0, 2, 3, 5) if i < len(indexed)]
    if sorted(set(index_layers)) != index_layers or not set(index_layers) <= set(indexed) or \
            (indexed and indexed[0] not in index_layers):
        raise cfg.error("index_layers", f"{index_layers}: increasing indexed-attention layers, the first of them "
                                        "included (transformers raises)")
    sources = cfg.get("kv_source_layers", int_list, None)
    if sources is None:
        defaults = (0, 0, 0, 3, 4, 5, 5, 5, 5, 0)
        if len(indexed) > len(defaults):
            raise cfg.error("kv_source_layers", f"unset, with {len(indexed)} indexed-attention layers: transformers' "
                                                f"default covers {len(defaults)}")
        sources = list(range(n))
        for layer, source in zip(indexed, defaults):
            sources[layer] = indexed[source]
    if len(sources) != n or any(not 0 <= s <= i or sources[s] != s or types[s] != types[i] or
                                (types[i] == SLIDING and s != i) for i, s in enumerate(sources)):
        raise cfg.error("kv_source_layers", f"{sources}: each layer reads itself or an earlier producing layer "
                                            "of its type, sliding layers themselves (transformers raises)")
    return types, index_layers, sources


def _kolibri1_1(cfg: Config, name: str, model_type: str) -> Arch:
    """Kolibri-1's reading, its dense layers, the indexer's settings and the K/V sharing."""
    dims = _dims(cfg)
    n, heads, kv_heads, head_dim = dims["layers"], dims["heads"], dims["kv_heads"], dims["head_dim"]
    cfg.check("hidden_act", lambda v: v == "silu", hint="Kolibri-1.1's MLPs and experts are SwiGLU (silu)")
    types, index_layers, sources = _layout(cfg, n)
    window = cfg.get("sliding_window", positive_int) if SLIDING in types else None
    index = {key: cfg.get(key, non_negative_int if key.endswith("tokens") else positive_int) for key in INDEX_KEYS}
    if index["index_pool_size"] % index["index_compression"]:
        raise cfg.error("index_pool_size", f"{index['index_pool_size']} is not a multiple of index_compression "
                                           f"{index['index_compression']}")
    if head_dim % 16:
        raise cfg.error("head_dim", f"{head_dim}: NVFP4 rounds blocks of 16 (transformers raises)")
    if index["index_num_heads"] > heads // kv_heads:
        raise cfg.error("index_num_heads", f"{index['index_num_heads']} is more than key head 0's "
                                           f"{heads // kv_heads} query heads")
    dense = cfg.get("mlp_only_layers", int_list, None)
    dense = [i for i in (0, 1) if i < n] if dense is None else dense
    if not set(dense) <= set(range(n)):
        raise cfg.error("mlp_only_layers", f"{dense} are not all layer indices")
    rope = _rope(cfg, head_dim) if SLIDING in types else None
    layers = [LayerSpec(window, rope, moe=i not in dense) if t == SLIDING else LayerSpec(None, None, moe=i not in dense)
              for i, t in enumerate(types)]
    moe = {"experts": _experts(cfg, "num_local_experts", "num_experts"),
           "top_k": cfg.get("num_experts_per_tok", positive_int),
           "d_ff": cfg.get("moe_intermediate_size", positive_int),
           "shared_experts": 1, "shared_d_ff": cfg.get("shared_expert_intermediate_size", positive_int),
           "scoring": "sigmoid_logits", "router_bias": True, "norm_topk_prob": cfg.get("norm_topk_prob", boolean)}
    mlp = {"kind": "swiglu", "d_ff": cfg.get("mlp_only_intermediate_size", positive_int)} if dense else None
    attention = Attention("gqa", heads, kv_heads, head_dim, qk_norm=True)
    arch = _arch(cfg, name, model_type, dims, attention, layers, mlp, moe=moe if len(dense) < n else None,
                 sandwich=True, checkpoint="kolibri1_1")
    plan = {"types": tuple(types), "index_layers": tuple(index_layers), "sources": tuple(sources),
            **{key[len("index_"):]: value for key, value in index.items()}}
    arch.expand = partial(expand, plan)
    return arch


FAMILIES = {"kolibri1_1": _kolibri1_1}


def expand(plan: dict, arch: Arch, origin: str):
    """x = embed(ids); per layer x + post_attn_norm(attn(attn_norm(x))) (sliding: the DSL's
    windowed GQA with RoPE; indexed: ``indexed_attention``), x + post_mlp_norm(mlp or
    moe(mlp_norm(x))); the final RMS norm and the head."""
    from frontends.dsl import Model
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps = arch.attention, arch.norm_eps
    shared, pool = {}, None
    with m.at(origin):
        x = embedded_inputs(m, arch)
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            h = layer.rms_norm(x, "attn_norm", eps)
            if plan["types"][layer.index] == SLIDING:
                out = layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=dsl_rope(spec.rope),
                                      window=spec.window, qk_norm=True, qk_norm_eps=eps)
            else:
                out, pool = indexed_attention(m, layer, h, arch, plan, shared, pool)
            x = x + layer.rms_norm(out, "post_attn_norm", eps)
            h = layer.rms_norm(x, "mlp_norm", eps)
            h = layer.moe(h, **arch.moe) if spec.moe else layer.swiglu(h, d_ff=arch.mlp["d_ff"])
            x = x + layer.rms_norm(h, "post_mlp_norm", eps)
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    m.meta["sparse_index"] = {k: v for k, v in plan.items() if k not in ("types", "sources")}
    return m.graph


class _Ops(_LayerOps):
    """DeepSeek-V3.2's emit helpers under one layer's prefix, and the casts, head slices and
    comparisons Kolibri's selection takes."""

    def f32(self, x, name: str):
        return self("cast", [x], {"to": "f32"}, name)

    def heads(self, x, start: int, end: int, name: str):
        return self("slice", [x], {"axis": 1, "start": start, "end": end}, name)

    def less(self, a, b, name: str):  # float 0/1
        return self.f32(self("less", [a, b], None, name + "_bool"), name)

    def relu_scores(self, queries, keys_t, count: int, weight: float, name: str):
        """weight · Σ_h relu(q_h · k), the heads summed in order (transformers' ``score``)."""
        total = None
        for h in range(count):
            s = self("matmul", [self.heads(queries, h, h + 1, f"{name}_q{h}"), keys_t], None, f"{name}_dot{h}")
            s = self("maximum", [s, self.const(0.0, f"{name}_zero")], None, f"{name}_relu{h}")
            total = s if total is None else self("add", [total, s], None, f"{name}_sum{h}")
        return self("mul", [total, self.const(weight, f"{name}_weight")], None, name)


def indexed_attention(m, layer, x, arch: Arch, plan: dict, shared: dict, pool):
    """Kolibri-1.1's indexed attention (module docstring): (out [B, T, d], the pool [B, T, S]
    float 0/1 the next reindexer reads)."""
    a, i, eps = arch.attention, layer.index, arch.norm_eps
    heads, kv_heads, dim = a.heads, a.kv_heads, a.head_dim
    o, p, d = _Ops(m, layer.prefix), layer.prefix, m._features(x)
    batch, seq = x.shape[:2]

    def project(name: str, count: int, weight: str, norm):
        t = o.view(o("linear", [x, m.param(f"{p}{weight}", (count * dim, d))], None, name),
                   (batch, seq, count, dim), f"{name}_heads")
        t = t if norm is None else m.norm(t, f"{p}{norm}", "rms", eps)
        return o("transpose", [t], {"perm": [0, 2, 1, 3]}, f"{name}_bhtd")

    q = project("q", heads, "attn.wq", "attn.q_norm")
    source = plan["sources"][i]
    if source == i:
        key, value = project("k", kv_heads, "attn.wk", "attn.k_norm"), project("v", kv_heads, "attn.wv", None)
        past_key, past_value = m._past(i, kv_heads, dim, dim)
        key = m.emit("concat", [past_key, key], {"axis": 2}, f"present.{i}.key")[0]
        value = m.emit("concat", [past_value, value], {"axis": 2}, f"present.{i}.value")[0]
        m._presents += [key.value, value.value]
        shared[i] = key, value
    else:
        key, value = shared[source]
    keep, pool = select(m, o, x, q, key, plan, pool if i not in plan["index_layers"] else None)
    quantized = [o("nvfp4_fake_quantize", [t], None, f"{name}_nvfp4") for t, name in ((key, "k"), (value, "v"))]
    key, value = (_groups(o, t, kv_heads, heads, name) for t, name in zip(quantized, ("k", "v")))
    scores = o("matmul", [q, o("transpose", [key], {"perm": [0, 1, 3, 2]}, "k_t")], None, "qk")
    scores = o("mul", [scores, o.const(dim ** -0.5, "scale")], None, "scores")
    scores = o("where", [keep, scores, o.const(NEG, "attn_neg")], None, "scores_masked")
    out = o("matmul", [o("softmax", [scores], {"axis": -1}, "probs"), value], None, "attn_bhtd")
    out = o.view(o("transpose", [out], {"perm": [0, 2, 1, 3]}, "attn_bthd"), (batch, seq, heads * dim), "attn")
    layer._note_attention("gqa", heads, kv_heads, dim, dim, None, None, None, None, qk_norm=True)
    return o("linear", [out, m.param(f"{p}attn.wo", (d, heads * dim))], None, "attn_out"), pool



def select(m, o, x, q, key, plan: dict, pool):
    """(keep bool [B, 1, T, S], pool float [B, T, S]): the row's selected keys, and the pool
    they come from (a new one where ``pool`` is None: an indexer)."""
    mask, _ = m._context()
    batch, seq, total = x.shape[0], x.shape[1], key.shape[2]
    # scored in float32, as transformers scores (its ``.float()`` after the rounding)
    routing_q = o.f32(o("nvfp4_fake_quantize", [o.heads(q, 0, plan["num_heads"], "routing_q_heads")], None,
                        "routing_q_nvfp4"), "routing_q")
    key0 = o.f32(o.heads(key, 0, 1, "key0_head"), "key0")  # [B, 1, S, D]
    routing_k = o("nvfp4_fake_quantize", [key0], None, "routing_k")
    keys = o.f32(o("range_like", [key], {"axis": 2}, "key_index"), "key_f")  # [S]
    size = o("dim_size", [key], {"axis": 2}, "total")
    past = o("sub", [size, o("dim_size", [x], {"axis": 1}, "seq")], None, "past")
    slots = o.f32(o("add", [o("range_like", [x], {"axis": 1}, "query_index"), past], None, "query_slots"), "slots")
    causal = o("less_equal", [o.view(keys, (1, 1, total), "key_row"), o.view(slots, (1, seq, 1), "slot_col")], None,
               "causal")  # [1, T, S]
    real = o.view(o.f32(mask, "real_f"), (batch, 1, total), "real")
    visible = o("mul", [o.f32(causal, "causal_f"), real], None, "visible")  # [B, T, S]
    size_f = o.f32(size, "total_f")
    span = o("mul", [o("sub", [size_f, keys], None, "from_end"), real], None, "from_end_real")
    start = o("sub", [size_f, o("reduce_max", [span], {"axes": [2], "keepdims": True}, "first_span")], None, "start")
    after = o("add", [keys, o.const(1.0, "one")], None, "key_after")
    end = o("reduce_max", [o("mul", [visible, after], None, "ends")], {"axes": [2], "keepdims": True}, "end")
    length = o("sub", [end, start], None, "length")  # [B, T, 1]
    rel = o("sub", [o.view(keys, (1, 1, total), "key_pos"), start], None, "rel")  # [B, 1, S]
    weight = _head_weight(q.shape[-1], plan["num_heads"])
    scores = o.relu_scores(routing_q, o("transpose", [routing_k], {"perm": [0, 1, 3, 2]}, "routing_k_t"),
                           plan["num_heads"], weight, "token_scores")
    scores = o.view(scores, (batch, seq, total), "token_scores_rows")
    if pool is None:
        pool = select_pool(o, plan, visible, length, rel, key0, routing_q, weight, (batch, seq, total))
    sinks = o("mul", [o.less(rel, o.const(float(plan["num_sink_tokens"]), "sink_count"), "before_sink_end"),
                      o.less(o.const(-0.5, "minus_half"), rel, "after_start")], None, "sinks")
    local_from = o("sub", [length, o.const(float(plan["num_local_tokens"]), "local_count")], None, "local_from")
    older = o.less(rel, local_from, "older")  # [B, T, S]
    local = o("mul", [o("sub", [o.const(1.0, "one_l"), older], None, "not_older"),
                      o.less(rel, length, "before_end")], None, "local")
    candidates = o("mul", [o("mul", [pool, o("sub", [o.const(1.0, "one_s"), sinks], None, "not_sink")], None,
                             "pool_no_sinks"), older], None, "candidates")
    chosen = _top(o, scores, candidates, plan["topk"], "tokens")
    long_row = o("less", [o.const(float(plan["topk"] + plan["num_local_tokens"] + plan["num_sink_tokens"]), "budget"),
                          length], None, "long_row")
    kept = o("maximum", [o("maximum", [chosen, sinks], None, "chosen_sinks"), local], None, "kept_long")
    kept = o("where", [long_row, o("mul", [kept, visible], None, "kept_visible"), visible], None, "kept")
    keep = o("less", [o.const(0.5, "half"), kept], None, "keep_rows")
    return o.view(keep, (batch, 1, seq, total), "keep"), pool


def _head_weight(head_dim: int, count: int) -> float:
    """transformers' ``head_weight``: head_dim^-0.5 / index_num_heads."""
    return head_dim ** -0.5 / count


def _top(o, scores, candidates, k: int, name: str):
    """Float 0/1: each row's k best-scoring candidates (scores >= 0; ties to the lower index)."""
    ranked = o("where", [o("less", [o.const(0.5, f"{name}_half"), candidates], None, f"{name}_is_candidate"), scores,
                         o.const(-1.0, f"{name}_out")], None, f"{name}_ranked")
    top = o("topk_mask", [ranked], {"k": k, "causal": False}, f"{name}_top")
    return o("mul", [o.f32(top, f"{name}_top_f"), candidates], None, f"{name}_chosen")


def select_pool(o, plan: dict, visible, length, rel, key0, routing_q, weight: float, shape):
    """Float 0/1 [B, T, S]: an indexer's pool (module docstring); block n of a row holds the keys
    at rel in [n·c, (n + 1)·c), n over as many indices as keys (the blocks past the keys empty)."""
    batch, seq, total = shape
    c = plan["compression"]
    dim = key0.shape[-1]
    seen = o("reduce_max", [visible], {"axes": [1], "keepdims": True}, "seen")  # [B, 1, S]
    keys = o("mul", [o.view(key0, (batch, total, dim), "key0_rows"), o.view(seen, (batch, total, 1), "seen_col")],
             None, "key0_seen")
    block = o.view(o.f32(o("range_like", [key0], {"axis": 2}, "block_index"), "block_f"), (1, total, 1), "block_col")
    low = o("mul", [block, o.const(float(c), "compression")], None, "block_low")
    high = o("add", [low, o.const(float(c), "compression_add")], None, "block_high")
    members = o("mul", [o("sub", [o.const(1.0, "one_m"), o.less(rel, low, "before_block")], None, "from_block"),
                        o.less(rel, high, "before_next")], None, "members")  # [B, N, S]
    means = o("div", [o("matmul", [members, keys], None, "block_sums"), o.const(float(c), "compression_div")], None,
              "block_means")
    summaries = o("nvfp4_fake_quantize", [o.view(means, (batch, 1, total, dim), "block_means4")], None, "summaries")
    scores = o.relu_scores(routing_q, o("transpose", [summaries], {"perm": [0, 1, 3, 2]}, "summaries_t"),
                           plan["num_heads"], weight, "block_scores")
    scores = o.view(scores, (batch, seq, total), "block_scores_rows")  # [B, T, N]
    low_row, high_row = (o.view(t, (1, 1, total), f"{n}_row") for t, n in ((low, "block_low"), (high, "block_high")))
    whole = o("less_equal", [high_row, length], None, "whole")  # the block ends by the row's end
    live = o.less(low_row, length, "live")  # it starts before
    scores = o("where", [whole, scores, o.const(0.0, "partial_score")], None, "block_scores_partial")
    blocks = _top(o, scores, live, plan["pool_size"] // c, "blocks")
    keys_taken = o("matmul", [blocks, members], None, "pool_keys")  # [B, T, S]
    taken = o.f32(o("less", [o.const(0.5, "pool_half"), keys_taken], None, "pool_taken"), "pool_taken_f")
    long_row = o("less", [o.const(float(plan["pool_size"]), "pool_size"), length], None, "long_pool_row")
    return o("where", [long_row, o("mul", [taken, visible], None, "pool_visible"), visible], None, "pool")
