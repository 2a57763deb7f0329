"""Qwen4-Exp (``frontends.hf.families`` registers it): Qwen3.5-MoE's gated DeltaNet and gated
attention with QSA block selection, in gated hyper-connected residual streams; built by its
own loop through the DSL (``expand``).

===============  ===========================================================================
qwen4_exp_text   Qwen4-Exp (``Qwen4ExpForCausalLM``): ``hc_count`` residual streams, each
                 block entered and left through a gated hyper-connection
                 (``frontends.dsl_hyper.GatedHyperConnections``), the streams mixed into
                 one by ``hyper_connection_mixer`` before the head (no final norm); by
                 ``layer_types`` a gated DeltaNet or an "indexed_attention" layer whose
                 queries see only the QSA indexer's blocks; a MoE on every layer;
                 hashed n-gram embeddings on the ``ple_layer_ids`` layers
qwen4_exp        its multimodal config: the text model (``text_config``), the vision tower
                 left aside
===============  ===========================================================================

The attention (``Qwen4ExpTextAttention``): Qwen3.5's (a sigmoid output gate read with q from
``q_proj``, (1 + w) q / k norms per head, RoPE on ``partial_rotary_factor`` of each head,
default all of it), as primitives over the caches ``past_key_values.{i}.key`` / ``.value``,
the keys outside the indexer's selection at float32's minimum before the softmax.

The indexer (``Qwen4ExpTextQSAIndexer``): q, k = ``index_qk_proj(x)`` split into
``indexer_n_heads`` query heads and one raw key of ``indexer_head_dim``; q (1 + w)-normed
(``q_layernorm``) and RoPE'd on its first rotary dims at the query's position. The raw keys
are cached (``past_key_values.{i}.index_key`` [B, 1, P, D_i]). A key's rank r is its count of
real tokens before it (cumsum(attention_mask) - 1, as a matmul with a triangle of ones);
ranks split into blocks of c = ``indexer_compress_ratio``; each block's key is the mean of
its c raw keys (a [S, S] block-membership matmul per call), (1 + w)-normed (``k_layernorm``),
RoPE'd at position c · block (positions are ranks, as transformers' generate makes them).
For query position p, a block is complete when c · (block + 1) <= p + 1: its score is
Σ_h relu(q_h · key) / sqrt(D_i), given to each of its keys; ``topk_mask`` keeps the
``indexer_budget`` best keys among complete blocks' (equal within a block, lower keys first
on ties: exactly the budget / c best blocks, as torch.topk picks them but for ties), and the
unfinished block's visible keys are kept too. No op beyond the existing ones: every target
that lowers them lowers this.

The per-layer embeddings (PLE, where ``ple_layer_ids`` names linear layers): hashed n-gram
embeddings gated into the streams before the layer's blocks (``frontends.hf.families_qwen4_ple``,
``irc.ops.ngram``), the last tokens and the dilated convolution's inputs carried across calls.

Refused, naming config.json and the key: ``hc_count`` < 2, an ``output_gate_type`` or
``hidden_act`` other than SiLU, ``attention_bias``, an indexed layer without the five
``indexer_*`` settings, ``indexer_kv_heads`` other than 1, a budget that is not a multiple
of the compress ratio, rotary dims wider than ``indexer_head_dim``; PLE on a layer that is
not linear, without ``eos_token_id``, or a ``ple_embed_dim`` the n-gram heads do not split.

Checkpoint names: transformers', the experts one tensor each (as save_pretrained writes
them) or fused (``mlp.experts.gate_up_proj`` / ``down_proj``, as transformers holds them);
the PLE table whole or in ``split_ngram_parts`` shards; spare as transformers leaves them:
``mtp.*``, the vision tower (``model.visual.*``), the hash's buffers (irc derives them).
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np

from frontends.hf.families_common import embedded_inputs
from frontends.hf.config import (Arch, Attention, Config, LayerSpec, attention_dims, dsl_rope, read_rope, rope_dict,
                                 string_list)
from frontends.hf.families_deepseek_v32 import _Ops
from frontends.hf.families_delta import _layout as _delta_layout, delta_config
from frontends.hf.families_gemma_shared import text_model
from frontends.hf.families_qwen4_ple import BUFFERS, ple_streams, read_ple, table_source
from frontends.hf.weights import FusedExperts
from irc.yamlloc import boolean, layer_count, positive_int, positive_number

NEG = float(np.finfo(np.float32).min)  # transformers' masked score
LINEAR, INDEXED = "linear_attention", "indexed_attention"
QSA = ("indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget", "indexer_compress_ratio")

DEFAULTS = {  # transformers 5.25's Qwen4ExpTextConfig
    "qwen4_exp_text": {
        "vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
        "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False, "attention_bias": False, "head_dim": 256, "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
        "num_experts_per_tok": 10, "num_experts": 512, "norm_topk_prob": True, "full_attention_interval": 4,
        "hc_count": 4, "hc_lowrank": 320, "ple_layer_ids": None, "output_gate_type": None, "rope_theta": 10000.0,
        "ple_embed_dim": None, "ple_conv_kernel_size": 4, "ngram_size": 3, "heads_per_ngram": 8,
        "ngram_vocab_size_base": 20000000, "make_ngram_vocab_size_divisible_by": 128, "seed": 1234,
        "split_ngram_parts": 512, "eos_token_id": None,
        **{key: None for key in QSA},
    },
    "qwen4_exp": {},  # Qwen4ExpConfig: its text_config holds the decoder's settings
}

_HC = {"hc_norm": "hc_norm.weight", "down": "input_mix_weight_down.weight", "up": "input_mix_weight_up.weight",
       "inject": "block_inject_weight.weight"}
_MIXER = {f"hc_mixer.{x}": f"hyper_connection_mixer.{name}" for x, name in _HC.items() if x != "inject"}


def _layout(model: str) -> dict:
    """The names under ``{model}layers.`` (the text model's prefix)."""
    return {**{k: v for k, v in _delta_layout().items() if k not in ("ssm_norm", "_spare")},
            "attn.indexer.qk": "self_attn.indexer.index_qk_proj.weight",
            "attn.indexer.q_norm": "self_attn.indexer.q_layernorm.weight",
            "attn.indexer.k_norm": "self_attn.indexer.k_layernorm.weight",
            **{f"{block}_hc.{x}": f"{block}_hyper_connection.{name}" for block in ("attn", "mlp")
               for x, name in _HC.items()},
            "ple.table": "ple.ple_embedding.ngram_embedding.weight", "ple.conv": "ple.conv1d.weight",
            **{f"ple.{x}": f"ple.{x}.weight" for x in ("key_proj", "value_proj", "norm_key", "norm_query",
                                                        "norm_conv")},
            "_spare_suffixes": BUFFERS,
            "_prefix": f"{model}layers.",
            "_top": {"embed": f"{model}embed_tokens.weight", "lm_head": "lm_head.weight",
                     **{k: model + v for k, v in _MIXER.items()}}}


def _resolve(arch: Arch, param: str, checkpoint):
    """The experts fused as transformers holds them (``mlp.experts.gate_up_proj`` [E, 2F, d],
    ``down_proj``) where the file has them, a PLE table in shards; None (one tensor per
    expert, as save_pretrained writes them; the whole table) otherwise."""
    table = table_source(arch, param, checkpoint, LAYOUTS[arch.checkpoint]["_prefix"])
    if table is not None:
        return table
    layer, _, suffix = param.partition(".")[2].partition(".")
    if not param.startswith("layers.") or suffix not in ("moe.w_gate", "moe.w_up", "moe.w_down"):
        return None
    part = suffix[len("moe.w_"):]
    name = (f"{LAYOUTS[arch.checkpoint]['_prefix']}{layer}.mlp.experts."
            f"{'down_proj' if part == 'down' else 'gate_up_proj'}")
    return FusedExperts(name, part, arch.moe["d_ff"], arch.d_model) if name in checkpoint.files else None


LAYOUTS = {"qwen4_exp_text": {**_layout("model."), "_spare": ("mtp.",), "_resolve": _resolve},
           "qwen4_exp": {**_layout("model.language_model."), "_spare": ("mtp.", "model.visual."),
                         "_resolve": _resolve}}


def _kinds(cfg: Config, n: int) -> list[str]:
    """``layer_types`` ("full_attention" read as "indexed_attention", as transformers does),
    else every ``full_attention_interval``-th layer indexed."""
    if cfg.data.get("layer_types") is None:
        interval = cfg.get("full_attention_interval", positive_int)
        return [LINEAR if (i + 1) % interval else INDEXED for i in range(n)]
    kinds = [INDEXED if k == "full_attention" else k for k in cfg.get("layer_types", string_list)]
    for kind in kinds:
        if kind not in (LINEAR, INDEXED):
            raise cfg.unsupported("layer_types", kind, hint=f"Qwen4-Exp layer kinds: {LINEAR}, {INDEXED}")
    if len(kinds) != n:
        raise cfg.error("layer_types", f"has {len(kinds)} entries for {n} layers (num_hidden_layers)")
    return kinds


def _rope(cfg: Config, head_dim: int):
    params, key = rope_dict(cfg)
    for name in ("mrope_section", "mrope_interleaved"):  # text positions: every section alike
        params.pop(name, None)
    return read_rope(cfg, head_dim, params, key, original_max=cfg.get("max_position_embeddings", positive_int))


def _qsa(cfg: Config, rotary: int) -> dict:
    """The indexer's settings, checked as Qwen4ExpTextConfig.validate_architecture does."""
    missing = [key for key in QSA if cfg.data.get(key) is None]
    if missing:
        raise cfg.error(missing[0], "an indexed_attention layer needs the QSA indexer's settings "
                                    f"({', '.join(QSA)}); missing: {', '.join(missing)}")
    qsa = {key: cfg.get(key, positive_int) for key in QSA}
    if qsa["indexer_kv_heads"] != 1:
        raise cfg.unsupported("indexer_kv_heads", qsa["indexer_kv_heads"], hint="Qwen4-Exp's QSA has one key head")
    if qsa["indexer_budget"] % qsa["indexer_compress_ratio"]:
        raise cfg.error("indexer_budget", f"{qsa['indexer_budget']} is not a multiple of indexer_compress_ratio "
                                          f"{qsa['indexer_compress_ratio']}")
    if rotary > qsa["indexer_head_dim"]:
        raise cfg.error("indexer_head_dim", f"{qsa['indexer_head_dim']} is narrower than the {rotary} rotary dims "
                                            "of an attention head")
    return {"heads": qsa["indexer_n_heads"], "head_dim": qsa["indexer_head_dim"], "topk": qsa["indexer_budget"],
            "block": qsa["indexer_compress_ratio"]}


def _qwen4(cfg: Config, name: str, model_type: str) -> Arch:
    """Qwen4-Exp's text model (module docstring)."""
    cfg.check("hidden_act", lambda v: v == "silu", hint="the gated MLPs and the convolution use SiLU")
    cfg.check("output_gate_type", lambda v: v in (None, "silu"), hint="the DeltaNet's gated norm irc builds is SiLU")
    cfg.check("attention_bias", lambda v: not v, hint="irc's gated attention here has no bias")
    streams = cfg.get("hc_count", positive_int)
    if streams < 2:
        raise cfg.error("hc_count", f"{streams}: Qwen4-Exp needs two or more residual streams")
    d, heads, kv_heads, head_dim = attention_dims(cfg)
    n = cfg.get("num_hidden_layers", layer_count)
    kinds = _kinds(cfg, n)
    rope = _rope(cfg, head_dim)
    qsa = _qsa(cfg, rope.rotary_dim or head_dim) if INDEXED in kinds else None
    ple = read_ple(cfg, n, kinds, LINEAR)
    experts, top_k = cfg.get("num_experts", positive_int), cfg.get("num_experts_per_tok", positive_int)
    if top_k > experts:
        raise cfg.error("num_experts_per_tok", f"top_k {top_k} exceeds {experts} experts (num_experts)")
    moe = {"experts": experts, "top_k": top_k, "d_ff": cfg.get("moe_intermediate_size", positive_int),
           "norm_topk_prob": cfg.get("norm_topk_prob", boolean), "shared_experts": 1,
           "shared_d_ff": cfg.get("shared_expert_intermediate_size", positive_int), "shared_expert_gate": True}
    layers = [LayerSpec(None, rope if kind == INDEXED else None, True,
                        mixer="attention" if kind == INDEXED else "gated_delta") for kind in kinds]
    hc = {"streams": streams, "rank": cfg.get("hc_lowrank", positive_int)}
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=Attention("gqa", heads, kv_heads, head_dim, qk_norm=True), layers=layers, mlp=None,
                moe=moe, norm_offset=1.0, tied=cfg.get("tie_word_embeddings", boolean), checkpoint=model_type,
                ssm=delta_config(cfg, fused=False), expand=partial(expand, qsa, hc, ple))


def _qwen4_multimodal(outer: Config, name: str, model_type: str) -> Arch:
    """The text model of a multimodal ``qwen4_exp`` config.json."""
    cfg = text_model(outer, model_type, DEFAULTS["qwen4_exp_text"], "qwen4_exp_text", "Qwen4-Exp")
    arch = _qwen4(cfg, name, model_type)
    if any(outer.has(key) for key in ("dtype", "torch_dtype")):
        arch.dtype = outer.dtype()
    if outer.has("tie_word_embeddings"):
        arch.tied = outer.get("tie_word_embeddings", boolean)
    return arch


FAMILIES = {"qwen4_exp_text": _qwen4, "qwen4_exp": _qwen4_multimodal}


def expand(qsa, hc: dict, ple: dict, arch: Arch, origin: str):
    """The decoder through the DSL (module docstring)."""
    from frontends.dsl import Model
    from frontends.dsl_hyper import GatedHyperConnections
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps = arch.norm_eps
    delta = {k: v for k, v in arch.ssm.items() if k != "kind"}
    with m.at(origin):
        gated = GatedHyperConnections(m, hc["streams"], arch.d_model, eps, hc["rank"])
        streams = gated.widen(embedded_inputs(m, arch))
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            p = layer.prefix
            if layer.index in ple.get("layers", {}):
                streams = ple_streams(m, _Ops(m, p), layer, streams, ple, eps)
            state, h = gated.enter(streams, f"{p}attn_hc.")
            out = qsa_attention(m, layer, h, arch, spec, qsa) if spec.mixer == "attention" else \
                layer.gated_delta(h, **delta)
            streams = gated.leave(state, out, f"{p}attn_hc.")
            state, h = gated.enter(streams, f"{p}mlp_hc.")
            streams = gated.leave(state, layer.moe(h, **arch.moe), f"{p}mlp_hc.")
        m.logits(gated.head(streams, "hc_mixer."), tied=arch.tied)
    if qsa is not None:
        m.meta["sparse_index"] = dict(qsa)
    m.meta["hyper_connections"] = {"form": "gated", "streams": hc["streams"], "rank": hc["rank"]}
    return m.graph


def qsa_attention(m, layer, x, arch: Arch, spec, qsa: dict):
    """Qwen3.5's gated attention over the keys the QSA indexer keeps (module docstring)."""
    a, i, p, d = arch.attention, layer.index, layer.prefix, arch.d_model
    heads, kv_heads, dim = a.heads, a.kv_heads, a.head_dim
    o, eps = _Ops(m, p), arch.norm_eps
    batch, seq = x.shape[:2]
    _, positions = m._context()
    rope = dsl_rope(spec.rope)
    q = o.view(o.linear(x, m.param(f"{p}attn.wq", (2 * heads * dim, d)), "q_gate"), (batch, seq, heads, 2 * dim),
               "q_gate_heads")
    gate = o.view(o.cols(q, dim, None, "gate_heads"), (batch, seq, heads * dim), "gate")
    q = m.norm(o.cols(q, 0, dim, "q_heads"), f"{p}attn.q_norm", "rms", eps, arch.norm_offset)
    k = m.norm(o.view(o.linear(x, m.param(f"{p}attn.wk", (kv_heads * dim, d)), "k"), (batch, seq, kv_heads, dim),
                      "k_heads"), f"{p}attn.k_norm", "rms", eps, arch.norm_offset)
    v = o.view(o.linear(x, m.param(f"{p}attn.wv", (kv_heads * dim, d)), "v"), (batch, seq, kv_heads, dim), "v_heads")
    q, k = ((o.view(o("rope", [o.view(t, (batch, seq, n * dim), f"{w}_flat"), positions], rope.attrs(dim),
                      f"{w}_rope"), (batch, seq, n, dim), f"{w}_rope_heads"))
            for t, n, w in ((q, heads, "q"), (k, kv_heads, "k")))
    past_key, past_value = m._past(i, kv_heads, dim, dim)
    key = m.emit("concat", [past_key, o.t(k, (0, 2, 1, 3), "k_bhtd")], {"axis": 2}, f"present.{i}.key")[0]
    value = m.emit("concat", [past_value, o.t(v, (0, 2, 1, 3), "v_bhtd")], {"axis": 2}, f"present.{i}.value")[0]
    m._presents += [key.value, value.value]
    total = key.shape[2]
    group = heads // kv_heads
    key, value = (o.view(o(
        "expand", [o.view(t, (batch, kv_heads, 1, total, dim), f"{w}_one")], {"shape": [batch, kv_heads, group,
                                                                                          total, dim]},
        f"{w}_groups"), (batch, heads, total, dim), f"{w}_heads") for t, w in ((key, "key"), (value, "value")))
    keep = indexer_mask(m, layer, x, spec.rope, dim, qsa, eps, arch.norm_offset)
    scores = o("mul", [o("matmul", [o.t(q, (0, 2, 1, 3), "q_bhtd"), o.t(key, (0, 1, 3, 2), "k_t")], None, "qk"),
                       o.const(dim ** -0.5, "attn_scale")], None, "scores")
    scores = o("where", [o.view(keep, (batch, 1, seq, total), "keep4"), scores, o.const(NEG, "attn_neg")], None,
               "scores_masked")
    out = o("matmul", [o("softmax", [scores], {"axis": -1}, "probs"), value], None, "attn_bhtv")
    out = o.view(o.t(out, (0, 2, 1, 3), "attn_bthv"), (batch, seq, heads * dim), "attn")
    out = o("mul", [out, o("sigmoid", [gate], None, "gate_sigmoid")], None, "attn_gated")
    kind = "mha" if kv_heads == heads else "mqa" if kv_heads == 1 else "gqa"
    layer._note_attention(kind, heads, kv_heads, dim, dim, None, None, None, rope, qk_norm=True)
    return o.linear(out, m.param(f"{p}attn.wo", (d, heads * dim)), "attn_out")


def _ranks(o, mask, positions):
    """(key ranks [B, 1, S] f32: real tokens before each key, the query positions [B, T, 1] f32)."""
    batch, total = mask.shape
    real = o("cast", [mask], {"to": "f32"}, "mask_f32")
    index = o("range_like", [mask], {"axis": 1}, "key_index")
    upper = o("cast", [o("less_equal", [o.view(index, (total, 1), "key_rows"), o.view(index, (1, total), "key_cols")],
                         None, "upper_bool")], {"to": "f32"}, "upper")
    counts = o("matmul", [o.view(real, (batch, 1, total), "real3"), upper], None, "real_counts")
    ranks = o("sub", [counts, o.const(1.0, "one")], None, "key_ranks")
    query = o.view(o("cast", [positions], {"to": "f32"}, "query_f32"), tuple(positions.shape) + (1,), "query_ranks")
    return real, ranks, query


def indexer_mask(m, layer, x, rope, head_dim: int, qsa: dict, eps: float, offset: float):
    """Bool [B, T, P+T]: the keys each query's QSA indexer keeps (module docstring); caches
    the raw index keys as ``past_key_values.{i}.index_key`` [B, 1, P, D_i]."""
    from frontends.hf.families_deepseek_v32 import _index_past

    o, p, i = _Ops(m, layer.prefix + "indexer."), layer.prefix + "attn.indexer.", layer.index
    heads, dim, block = qsa["heads"], qsa["head_dim"], qsa["block"]
    batch, seq = x.shape[:2]
    mask, positions = m._context()
    index_rope = dsl_rope(replace(rope, rotary_dim=rope.rotary_dim or head_dim))
    qk = o.linear(x, m.param(f"{p}qk", ((heads + 1) * dim, m._features(x))), "qk")
    q = m.norm(o.view(o.cols(qk, 0, heads * dim, "q"), (batch, seq, heads, dim), "q_heads"), f"{p}q_norm", "rms",
               eps, offset)
    q = o("rope", [o.view(q, (batch, seq, heads * dim), "q_flat"), positions], index_rope.attrs(dim), "q_rope")
    q = o.t(o.view(q, (batch, seq, heads, dim), "q_rope_heads"), (0, 2, 1, 3), "q_bhtd")
    raw = o.view(o.cols(qk, heads * dim, None, "k"), (batch, 1, seq, dim), "k_head")
    raw = m.emit("concat", [_index_past(m, i, dim), raw], {"axis": 2}, f"present.{i}.index_key")[0]
    m._presents.append(raw.value)
    total = raw.shape[2]
    raw = o.view(raw, (batch, total, dim), "keys")
    real, ranks, query = _ranks(o, mask, positions)
    blocks = o("cast", [o("cast", [o("div", [o("add", [ranks, o.const(0.5, "half")], None, "ranks_mid"),
                                            o.const(float(block), "block")], None, "block_f")], {"to": "i64"},
                          "block_i64")], {"to": "f32"}, "blocks")  # floor: ranks >= 0 where it matters
    same = o("cast", [o("equal", [o.t(blocks, (0, 2, 1), "blocks_col"), blocks], None, "same_bool")], {"to": "f32"},
             "same")
    members = o("mul", [same, o.view(real, (batch, 1, total), "real_row")], None, "members")
    pooled = o("div", [o("matmul", [members, raw], None, "block_sums"), o.const(float(block), "count")], None,
               "pooled")
    pooled = m.norm(pooled, f"{p}k_norm", "rms", eps, offset)
    starts = o.view(o("cast", [o("mul", [blocks, o.const(float(block), "block_width")], None, "starts_f")],
                          {"to": "i64"}, "starts"), (batch, total), "starts2")
    keys = o.view(o("rope", [pooled, starts], index_rope.attrs(dim), "k_rope"), (batch, 1, total, dim), "k_rope4")
    scores = o("matmul", [q, o.t(keys, (0, 1, 3, 2), "k_t")], None, "qk_scores")
    scores = o("reduce_sum", [o("maximum", [scores, o.const(0.0, "zero")], None, "qk_relu")],
               {"axes": [1], "keepdims": False}, "scores_sum")
    scores = o("mul", [scores, o.const(dim ** -0.5, "scale")], None, "scores")
    ends = o("add", [o("mul", [blocks, o.const(float(block), "block_end_width")], None, "block_first"),
                     o.const(float(block - 1), "block_last")], None, "block_ends")  # [B, 1, S]
    complete = o("less_equal", [ends, query], None, "complete")  # [B, T, S]
    ranked = o("where", [complete, scores, o.const(NEG, "neg")], None, "scores_complete")
    top = o("topk_mask", [ranked, mask], {"k": qsa["topk"], "causal": True}, "top")
    seen = o("logical_and", [o("less_equal", [ranks, query], None, "before"),
                             o("equal", [o.view(real, (batch, 1, total), "real_b1s"), o.const(1.0, "real_one")], None,
                                   "is_real")], None, "seen")
    tail = o("logical_and", [o("less", [query, ends], None, "open"), seen], None, "tail")
    either = o("add", [o("cast", [tail], {"to": "f32"}, "tail_f32"), o("cast", [top], {"to": "f32"}, "top_f32")],
               None, "either")
    return o("less", [o.const(0.5, "half_one"), either], None, "keep")  # tail or top


__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS", "expand", "indexer_mask"]
