"""dots3-note's and MiniMax-M3's text models (dots3_note_text, minimax_m3_vl_text):
``frontends.hf.families`` registers them; dots3 is built by ``families_dsa.expand`` over
``families_deepseek_v32.sparse_mla``, MiniMax-M3 by ``expand_m3``.

===============  ===========================================================================
dots3_note_text  DeepSeek-V3.2's MLA with dots3's ``Form``: the q / kv latents' RMSNorms at
                 ``rms_norm_eps``, the normed latents times sqrt(d / rank) (the indexer reads
                 the scaled q latent), an RMSNorm on the shared rotated key
                 (``k_rope_only_layernorm``) before its RoPE, a per-head sigmoid gate
                 (``g_proj``) on the output, the softmax scale qk^-0.5; per ``layer_types``:
                 "indexed_attention" layers select keys with GLM-5's indexer (interleaved
                 RoPE), "sliding_attention" layers attend within ``sliding_window``,
                 "full_attention" layers to every visible key; per-layer MLA sizes from
                 ``per_layer_config``; sigmoid-routed experts and a shared MLP of
                 ``shared_experts_intermediate_size`` · ``n_shared_experts``
===============  ===========================================================================

RoPE (transformers' ``DiffusionGemmaTextRotaryEmbedding``): one set of frequencies per layer
type, ``rope_parameters[type]``'s ``rope_theta``, over int(head_dim · qk_rope_head_dim /
head_dim) dims of the type's first layer, which must be its ``qk_rope_head_dim``; "default"
RoPE only (transformers' MLA scale here ignores a scaling's mscale: refused, not guessed).
The legacy keys ``DotsNoteTextConfig`` translates (``use_sliding_window``, ``use_dsa``,
``first_k_dense_replace``, ``moe_layer_freq``, ``swa_*``, ``sliding_window_size``,
``moe_shared_expert_intermediate_size``, ``swa_rope_theta``) are read as it reads them.

==================  ========================================================================
minimax_m3_vl_text  MiniMax-M3's text model: Gemma RMSNorms (1 + w), GQA with per-head Gemma
                    q/k norms before RoPE (``rope_parameters``' partial factor; the legacy
                    ``rotary_dim`` is unread, as transformers leaves it), "minimax_m3_sparse"
                    layers attending over the key blocks their indexer takes
                    (``irc.ops.sparse_index.block_topk_mask``: blocks of ``index_block_size``
                    slots, the ``index_topk_blocks`` best by max score, the
                    ``index_local_blocks`` at the query's position always), the clamped GLU
                    of GPT-OSS (swiglu_alpha, swiglu_limit) in dense MLPs
                    (``dense_intermediate_size``), sigmoid-routed experts with a bias and a
                    shared expert of ``shared_intermediate_size``, ``routed_scaling_factor``
==================  ========================================================================

MiniMax-M3's attention is built from primitives on every layer, the keys a row may not keep
at float32's minimum before the softmax, as transformers' eager attention adds it: its
selection anchors blocks on cache slots but ranks by ``position_ids``, so with left padding
a real row can keep only padding and then averages every value (the padding rows' too, which
is why every layer matches transformers on the padding rows as well). Refused: an indexer
narrower than the rotated dims (transformers cuts the RoPE table to it), more local than top
blocks (torch orders the tied local blocks freely).
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial

from frontends.hf.families_common import embedded_inputs
from frontends.hf.config import (Arch, Attention, Config, LayerSpec, RopeSpec, dsl_rope, read_rope, rope_dict,
                                 string_list)
from frontends.hf.families_common import _arch, _dims, _swiglu
from frontends.hf.families_deepseek_v32 import DEFAULTS as V32_DEFAULTS
from frontends.hf.families_deepseek_v32 import LAYOUTS as V32_LAYOUTS
from frontends.hf.families_deepseek_v32 import INDEXER, NEG, Form, _groups, _index_past, _Ops
from frontends.hf.families_llama_like import _fused
from frontends.hf.weights import Rows
from frontends.hf.families_dsa import Plan, expand
from irc.yamlloc import Bad, layer_count, non_negative_int, positive_int, positive_number

INDEXED, SLIDING, FULL = "indexed_attention", "sliding_attention", "full_attention"
SIZES = ("num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "head_dim", "qk_nope_head_dim",
         "qk_rope_head_dim", "v_head_dim")
SWA = {"num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1024, "kv_lora_rank": 1024,
       "head_dim": 256, "qk_nope_head_dim": 192, "v_head_dim": 128}  # Dots3NoteTextConfig's swa_* defaults
DEFAULTS = {"dots3_note_text": {
    **V32_DEFAULTS["deepseek_v32"], "vocab_size": 152064, "hidden_size": 5120, "intermediate_size": 13824,
    "num_hidden_layers": 46, "max_position_embeddings": 524288, "rms_norm_eps": 1e-5, "head_dim": 256,
    "q_lora_rank": 1024, "moe_intermediate_size": 1536, "shared_experts_intermediate_size": 1536,
    "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    "rope_theta": 80_000_000.0}}
LAYOUTS = {"dots3_note_text": {**V32_LAYOUTS["deepseek_v32"],
                               "attn.k_rope_norm": "self_attn.k_rope_only_layernorm.weight",
                               "attn.g_proj": "self_attn.g_proj.weight"}}
DOTS3 = dict(lora_scales=True, k_rope_norm=True, head_gate=True, plain_scale=True)


def _dots3(cfg: Config, name: str, model_type: str) -> Arch:
    """DeepSeek-V3's reading of the experts, dots3's layers, sizes, RoPE and indexer."""
    from frontends.hf.families_2026 import _deepseek_v3

    n = cfg.get("num_hidden_layers", layer_count)
    types, mlp = _layer_types(cfg, n), _mlp_types(cfg, n)
    sizes = _sizes(cfg, types)
    first = types.index(INDEXED) if INDEXED in types else 0
    arch = _deepseek_v3(cfg, name, first_k_dense_replace=0, moe_layer_freq=1, mlp_layer_types=None, layer_types=None,
                        rope_parameters={"rope_type": "default"}, rope_scaling=None, per_layer_config=None,
                        **{k: sizes[first][k] for k in SIZES})
    arch.model_type, arch.checkpoint = model_type, "dots3_note_text"
    shared = cfg.get("n_shared_experts", positive_int)
    width = cfg.get("moe_shared_expert_intermediate_size", positive_int, None) or \
        cfg.get("shared_experts_intermediate_size", positive_int)
    arch.moe = {**arch.moe, "shared_experts": shared, "shared_d_ff": width * shared}
    window = cfg.get("sliding_window", positive_int, None) or cfg.get("sliding_window_size", positive_int, 512)
    ropes = _ropes(cfg, types, sizes)
    arch.layers = [LayerSpec(window if t == SLIDING else None, ropes[t], moe=kind == "sparse")
                   for t, kind in zip(types, mlp)]
    arch.mlp = _swiglu(cfg) if "dense" in mlp else None
    eps = cfg.get("rms_norm_eps", positive_number)
    indexer = {"heads": cfg.get("index_n_heads", positive_int), "head_dim": cfg.get("index_head_dim", positive_int),
               "topk": cfg.get("index_topk", positive_int), "convention": "interleaved"}
    for size, kind in zip(sizes, types):
        if kind == INDEXED and size["qk_rope_head_dim"] > indexer["head_dim"]:
            raise cfg.error("index_head_dim", f"{indexer['head_dim']} is narrower than qk_rope_head_dim "
                                              f"{size['qk_rope_head_dim']}, the indexer's rotated part")
    plan_sizes = tuple((_mla(size), size["num_attention_heads"]) for size in sizes)
    sources = tuple("index" if t == INDEXED else "dense" for t in types)
    arch.expand = partial(expand, Plan(indexer, sources, plan_sizes, form=Form(norm_eps=eps, **DOTS3)))
    return arch


FAMILIES = {"dots3_note_text": _dots3}


def _mla(size: dict) -> dict:
    return {k: size[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")}


def _layer_types(cfg: Config, n: int) -> list[str]:
    """``layer_types``, else Dots3NoteTextConfig's from ``use_sliding_window`` / ``use_dsa``."""
    use_dsa = cfg.raw("use_dsa") if cfg.has("use_dsa") else (None if cfg.has("per_layer_config") else True)
    if cfg.raw("layer_types") is not None:
        types = cfg.get("layer_types", string_list)
        if len(types) != n or set(types) - {INDEXED, SLIDING, FULL}:
            raise cfg.unsupported("layer_types", types, hint=f"{n} entries of {INDEXED}, {SLIDING}, {FULL}")
    else:
        sliding = cfg.raw("use_sliding_window", True)
        kind = FULL if use_dsa is False else INDEXED
        types = [kind if not sliding or i < 2 or i % 4 == 1 else SLIDING for i in range(n)]
    if use_dsa is not None:
        old, new = (INDEXED, FULL) if use_dsa is False else (FULL, INDEXED)
        types = [new if t == old else t for t in types]
    return types


def _mlp_types(cfg: Config, n: int) -> list[str]:
    """``mlp_layer_types``, else from ``first_k_dense_replace`` and ``moe_layer_freq`` (a
    number or one flag per layer)."""
    if cfg.raw("mlp_layer_types") is not None:
        types = cfg.get("mlp_layer_types", string_list)
        if len(types) != n or set(types) - {"dense", "sparse"}:
            raise cfg.unsupported("mlp_layer_types", types, hint=f"{n} entries, each \"dense\" or \"sparse\"")
        return types
    first, freq = cfg.get("first_k_dense_replace", non_negative_int), cfg.raw("moe_layer_freq", 1)
    if isinstance(freq, (list, tuple)):
        if len(freq) < n:
            raise cfg.unsupported("moe_layer_freq", freq, hint=f"one flag per layer ({n})")
        return ["sparse" if i >= first and bool(freq[i]) else "dense" for i in range(n)]
    freq = cfg.get("moe_layer_freq", positive_int)
    return ["sparse" if i >= first and i % freq == 0 else "dense" for i in range(n)]


def _sizes(cfg: Config, types: list[str]) -> list[dict]:
    """Each layer's MLA sizes: the top-level keys, overridden by ``per_layer_config[i]`` (or,
    without it, by the ``swa_*`` keys on the sliding layers)."""
    base = {k: cfg.get(k, positive_int, None) for k in SIZES}
    if base["num_key_value_heads"] is None:
        base["num_key_value_heads"] = base["num_attention_heads"]
    overrides = cfg.raw("per_layer_config")
    if overrides is None:
        swa = {k: cfg.raw(f"swa_{k}", v) for k, v in SWA.items()}
        swa["qk_rope_head_dim"] = cfg.raw("swa_qk_rope_head_dim", swa["head_dim"] - swa["qk_nope_head_dim"])
        overrides = {i: swa for i, t in enumerate(types) if t == SLIDING}
    if not isinstance(overrides, dict):
        raise cfg.unsupported("per_layer_config", overrides, hint="an object of layer index: overrides")
    sizes = [dict(base) for _ in types]
    for index, values in overrides.items():
        key = f"per_layer_config.{index}"
        try:
            i = int(index)
        except ValueError:
            raise cfg.error(key, "expected a layer index") from None
        if not 0 <= i < len(types) or not isinstance(values, dict) or set(values) - set(SIZES):
            raise cfg.unsupported(key, values, hint=f"a layer index below {len(types)} with overrides of "
                                                    f"{', '.join(SIZES)}")
        for name, value in values.items():
            try:
                sizes[i][name] = positive_int(value)
            except Bad as err:
                raise cfg.error(f"{key}.{name}", str(err)) from None
    for i, (size, kind) in enumerate(zip(sizes, types)):
        if None in size.values() or size["num_key_value_heads"] != size["num_attention_heads"]:
            raise cfg.unsupported("per_layer_config", overrides.get(i, overrides.get(str(i))),
                                  hint=f"layer {i}: every MLA size set (q_lora_rank too), kv heads == heads")
        if kind == SLIDING and size["head_dim"] != size["qk_nope_head_dim"] + size["qk_rope_head_dim"]:
            raise cfg.error("per_layer_config", f"layer {i}: head_dim {size['head_dim']} is not "
                                                "qk_nope_head_dim + qk_rope_head_dim (a sliding layer's)")
    for kind in set(types):
        if len({tuple(s.items()) for s, t in zip(sizes, types) if t == kind}) > 1:
            raise cfg.unsupported("per_layer_config", overrides, hint=f"one set of sizes per layer type ({kind}): "
                                  "transformers' RoPE reads the type's first layer")
    return sizes


def _ropes(cfg: Config, types: list[str], sizes: list[dict]) -> dict:
    """One ``RopeSpec`` per layer type (module docstring)."""
    params = cfg.raw("rope_parameters")
    if params is None:
        if cfg.raw("rope_scaling") is not None:
            raise cfg.unsupported("rope_scaling", cfg.raw("rope_scaling"), hint="default RoPE only")
        params = {t: {"rope_type": "default", "rope_theta": cfg.raw("swa_rope_theta", 50_000.0) if t == SLIDING
                      else cfg.raw("rope_theta")} for t in set(types)}
    elif not any(isinstance(v, dict) for v in params.values()):
        params = {t: params for t in set(types)}
    ropes = {}
    for kind in set(types):
        entry, key = params.get(kind), f"rope_parameters.{kind}"
        if not isinstance(entry, dict) or entry.get("rope_type", "default") != "default":
            raise cfg.unsupported(key, entry, hint="default RoPE (rope_type \"default\") per layer type")
        size = sizes[types.index(kind)]
        head, rotated = size["head_dim"], size["qk_rope_head_dim"]
        if int(head * (rotated / head)) != rotated:
            raise cfg.error(key, f"transformers rotates int({head} * {rotated} / {head}) dims, not qk_rope_head_dim")
        try:
            ropes[kind] = RopeSpec(positive_number(entry.get("rope_theta", cfg.raw("rope_theta"))), "interleaved",
                                   None, None)
        except Bad as err:
            raise cfg.error(f"{key}.rope_theta", str(err)) from None
    return ropes


# ---- minimax_m3_vl_text: MiniMax-M3's text model ---------------------------------------------

SPARSE = "minimax_m3_sparse"
M3_LEGACY = {"index_n_heads": "sparse_num_index_heads", "index_head_dim": "sparse_index_dim",
             "index_block_size": "sparse_block_size", "index_topk_blocks": "sparse_topk_blocks",
             "index_local_blocks": "sparse_local_block"}  # sparse_attention_config's names, which win
DEFAULTS["minimax_m3_vl_text"] = {
    "vocab_size": 200064, "hidden_size": 6144, "intermediate_size": 3072, "num_hidden_layers": 60,
    "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 524288, "tie_word_embeddings": False, "num_experts_per_tok": 4,
    "num_local_experts": 128, "dense_intermediate_size": 12288, "shared_intermediate_size": 3072,
    "routed_scaling_factor": 2.0, "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "index_n_heads": 4,
    "index_head_dim": 128, "index_block_size": 128, "index_topk_blocks": 16, "index_local_blocks": 1,
    "rope_theta": 5_000_000.0}


def _shared_rows(half: int):
    def source(arch: Arch, prefix: str) -> Rows:
        width = arch.moe["shared_d_ff"]
        return Rows(f"{prefix}mlp.shared_experts.gate_up_proj.weight", half * width, (half + 1) * width)
    return source


LAYOUTS["minimax_m3_vl_text"] = {
    **{f"moe.w_{part}": _fused(part) for part in ("gate", "up", "down")},
    "moe.shared_gate": _shared_rows(0), "moe.shared_up": _shared_rows(1),
    "moe.shared_down": "mlp.shared_experts.down_proj.weight", "mlp.w_gate_up": "mlp.gate_up_proj.weight",
    **{f"{INDEXER}{x}": f"self_attn.indexer.{x}.weight" for x in ("q_proj", "k_proj", "q_norm", "k_norm")}}


def _minimax_m3(cfg: Config, name: str, model_type: str) -> Arch:
    """MiniMax-M3's text model: Gemma norms, per-head q/k norms, sparse layers selecting key
    blocks (``irc.ops.sparse_index.block_topk_mask``), dense or expert MLPs of the clamped GLU."""
    dims = _dims(cfg)
    n, heads, kv_heads, head_dim = dims["layers"], dims["heads"], dims["kv_heads"], dims["head_dim"]
    legacy = cfg.raw("sparse_attention_config") or {}
    if not isinstance(legacy, dict):
        raise cfg.unsupported("sparse_attention_config", legacy, hint="an object")
    index = {}
    for key, old in M3_LEGACY.items():
        where = f"sparse_attention_config.{old}" if old in legacy else key
        try:
            index[key] = (non_negative_int if key == "index_local_blocks" else positive_int)(
                legacy[old] if old in legacy else cfg.raw(key))
        except Bad as err:
            raise cfg.error(where, str(err)) from None
    types = _m3_types(cfg, n, legacy)
    rope = read_rope(cfg, head_dim, *rope_dict(cfg), default_base=cfg.defaults["rope_theta"])
    rotated = rope.rotary_dim or head_dim
    if index["index_head_dim"] < rotated:
        raise cfg.error("index_head_dim", f"{index['index_head_dim']} is narrower than the {rotated} rotated dims",
                        hint="transformers cuts the RoPE table to the indexer's width: irc refuses to guess")
    if heads % kv_heads or heads % index["index_n_heads"]:
        raise cfg.error("index_n_heads", f"{heads} heads do not group over {kv_heads} kv heads and "
                                         f"{index['index_n_heads']} indexer heads")
    if index["index_local_blocks"] > index["index_topk_blocks"]:
        raise cfg.unsupported("index_local_blocks", index["index_local_blocks"],
                              hint="at most index_topk_blocks: torch.topk orders the tied local blocks freely")
    mlp = cfg.raw("mlp_layer_types")
    if mlp is None:
        freq = cfg.raw("moe_layer_freq")
        mlp = ["sparse" if f else "dense" for f in freq] if isinstance(freq, list) else ["sparse"] * n
    if len(mlp) != n or set(mlp) - {"dense", "sparse"}:
        raise cfg.unsupported("mlp_layer_types", mlp, hint=f"{n} entries, each \"dense\" or \"sparse\"")
    moe = {"experts": cfg.get("num_local_experts", positive_int), "top_k": cfg.get("num_experts_per_tok", positive_int),
           "d_ff": cfg.get("intermediate_size", positive_int), "shared_experts": 1,
           "shared_d_ff": cfg.get("shared_intermediate_size", positive_int), "scoring": "sigmoid",
           "router_bias": True, "norm_topk_prob": True,
           "routed_scale": cfg.get("routed_scaling_factor", positive_number), "activation": "swiglu_oai",
           "swiglu_alpha": cfg.get("swiglu_alpha", positive_number),
           "swiglu_limit": cfg.get("swiglu_limit", positive_number)}
    attention = Attention("gqa", heads, kv_heads, head_dim, qk_norm=True)
    layers = [LayerSpec(None, rope, kind == "sparse") for kind in mlp]
    arch = _arch(cfg, name, model_type, dims, attention, layers,
                 {"kind": "swiglu_oai", "d_ff": cfg.get("dense_intermediate_size", positive_int)}, moe=moe,
                 checkpoint="minimax_m3_vl_text")
    indexer = {"heads": index["index_n_heads"], "head_dim": index["index_head_dim"],
               "block": index["index_block_size"], "topk": index["index_topk_blocks"],
               "local": index["index_local_blocks"]}
    arch.expand = partial(expand_m3, indexer, tuple(t == SPARSE for t in types))
    return arch


def _m3_types(cfg: Config, n: int, legacy: dict) -> list[str]:
    """``layer_types``, else from ``sparse_attention_config.sparse_attention_freq``, else full."""
    if cfg.raw("layer_types") is not None:
        types = cfg.get("layer_types", string_list)
    elif "sparse_attention_freq" in legacy:
        types = [SPARSE if f else "full_attention" for f in legacy["sparse_attention_freq"]]
    else:
        types = ["full_attention"] * n
    if len(types) != n or set(types) - {SPARSE, "full_attention"}:
        raise cfg.unsupported("layer_types", types, hint=f"{n} entries of {SPARSE}, full_attention")
    return types


FAMILIES["minimax_m3_vl_text"] = _minimax_m3


def expand_m3(indexer: dict, sparse: tuple, arch: Arch, origin: str):
    """The decoder through the DSL: Gemma RMSNorms (1 + w), ``block_sparse_attention`` (the
    full layers without an indexer), the MLP GPT-OSS's clamped GLU, dense or as experts."""
    from frontends.dsl import Model
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps, moe = arch.norm_eps, arch.moe
    with m.at(origin):
        x = embedded_inputs(m, arch)
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            h = layer.rms_norm(x, "attn_norm", eps, offset=1.0)
            x = x + block_sparse_attention(m, layer, h, arch, spec, indexer if sparse[layer.index] else None)
            h = layer.rms_norm(x, "mlp_norm", eps, offset=1.0)
            x = x + (layer.moe(h, **moe) if spec.moe else
                     _clamped_glu(m, layer, h, arch.mlp["d_ff"], moe["swiglu_alpha"], moe["swiglu_limit"]))
        m.logits(m.rms_norm(x, "norm", eps, offset=1.0), tied=arch.tied)
    m.meta["sparse_index"] = dict(indexer)
    return m.graph


def _clamped_glu(m, layer, x, d_ff: int, alpha: float, limit: float):
    """down((clip(up, ±limit) + 1) · g · sigmoid(alpha · g)), g = min(gate, limit), gate and up
    the halves of ``mlp.w_gate_up`` [2F, d] (MiniMaxM3VLDenseMLP)."""
    o, p, d = _Ops(m, layer.prefix + "mlp."), layer.prefix, m._features(x)
    both = o.linear(x, m.param(f"{p}mlp.w_gate_up", (2 * d_ff, d)), "gate_up")
    lim, neg = o.const(limit, "limit"), o.const(-limit, "neg_limit")
    gate = o("neg", [o("maximum", [o("neg", [o.cols(both, 0, d_ff, "gate")], None, "gate_neg"), neg], None,
                       "gate_neg_clamped")], None, "gate_clamped")  # min(gate, limit) as -max(-gate, -limit)
    up = o.cols(both, d_ff, None, "up")
    up = o("neg", [o("maximum", [o("neg", [o("maximum", [up, neg], None, "up_low")], None, "up_low_neg"), neg],
                     None, "up_clamped_neg")], None, "up_clamped")
    glu = o("mul", [gate, o("sigmoid", [o("mul", [gate, o.const(alpha, "alpha")], None, "gate_scaled")], None,
                            "gate_sigmoid")], None, "glu")
    hidden = o("mul", [o("add", [up, o.const(1.0, "one")], None, "up_plus_one"), glu], None, "hidden")
    return o.linear(hidden, m.param(f"{p}mlp.w_down", (d, d_ff)), "out")


def block_sparse_attention(m, layer, x, arch: Arch, spec, indexer):
    """GQA (q and k Gemma-RMSNormed per head, then RoPE'd) over the key blocks MiniMax-M3's
    indexer takes (``block_topk_mask``), each query head using its group's indexer head; with
    ``indexer`` None over every visible key: out [B, T, d]. Keys left out score float32's
    minimum before the softmax, as transformers' eager attention adds it: a row that keeps no
    key (a padding row; with left padding, a real row whose position-based selection lands
    on padding) averages every key's value uniformly, as there. The indexer: queries
    [Hi, Di] and one key [Di] of x, Gemma-RMSNormed per head, RoPE'd on their first rotated
    dims (the model's table), scores q · k unscaled; its keys cached as
    ``past_key_values.{i}.index_key``."""
    a, i = arch.attention, layer.index
    heads, kv_heads, dim = a.heads, a.kv_heads, a.head_dim
    o, p, eps = _Ops(m, layer.prefix), layer.prefix, arch.norm_eps
    batch, seq = x.shape[:2]
    mask, positions = m._context()
    rope, d = dsl_rope(spec.rope), m._features(x)

    rotated = spec.rope.rotary_dim or dim  # the indexer rotates as many of its dims, at the model's frequencies
    width = indexer["head_dim"] if indexer else dim
    index_rope = dsl_rope(replace(spec.rope, rotary_dim=None if rotated == width else rotated))

    def heads_of(name: str, count: int, width: int, wname: str, norm, rotate: bool):
        t = o.view(o.linear(x, m.param(f"{p}{wname}", (count * width, d)), name), (batch, seq, count, width),
                   f"{name}_heads")
        t = t if norm is None else m.norm(t, f"{p}{norm}", "rms", eps, offset=1.0)
        if rotate:
            t = o.view(o.rope(o.view(t, (batch, seq, count * width), f"{name}_flat"), positions,
                              index_rope if name.startswith("index") else rope, width,
                              f"{name}_rope"), (batch, seq, count, width), f"{name}_roped")
        return o.t(t, (0, 2, 1, 3), f"{name}_bhtd")

    q = heads_of("q", heads, dim, "attn.wq", "attn.q_norm", True)
    key = heads_of("k", kv_heads, dim, "attn.wk", "attn.k_norm", True)
    value = heads_of("v", kv_heads, dim, "attn.wv", None, False)
    past_key, past_value = m._past(i, kv_heads, dim, dim)
    key = m.emit("concat", [past_key, key], {"axis": 2}, f"present.{i}.key")[0]
    value = m.emit("concat", [past_value, value], {"axis": 2}, f"present.{i}.value")[0]
    m._presents += [key.value, value.value]
    if indexer is None:
        keep = _visible(m, o, x, mask, key)
        key, value = (_groups(o, t, kv_heads, heads, name) for t, name in ((key, "k"), (value, "v")))
        return _attend(m, o, layer, q, key, value, keep, dim, rope, kv_heads, d)
    iq = heads_of("index_q", indexer["heads"], indexer["head_dim"], f"{INDEXER}q_proj", f"{INDEXER}q_norm", True)
    ik = heads_of("index_k", 1, indexer["head_dim"], f"{INDEXER}k_proj", f"{INDEXER}k_norm", True)
    ik = m.emit("concat", [_index_past(m, i, indexer["head_dim"]), ik], {"axis": 2}, f"present.{i}.index_key")[0]
    m._presents.append(ik.value)
    scores = o("matmul", [iq, o.t(ik, (0, 1, 3, 2), "index_k_t")], None, "index_scores")
    keep = o("block_topk_mask", [scores, positions, mask], {"block": indexer["block"], "k": indexer["topk"],
                                                            "local": indexer["local"]}, "keep")
    key, value, keep = (_groups(o, t, n, heads, name) for t, n, name in
                        ((key, kv_heads, "k"), (value, kv_heads, "v"), (keep, indexer["heads"], "keep")))
    return _attend(m, o, layer, q, key, value, keep, dim, rope, kv_heads, d)


def _attend(m, o, layer, q, key, value, keep, dim: int, rope, kv_heads: int, d: int):
    """softmax(where(keep, q · kᵀ / √D, min)) · v, heads merged, through ``attn.wo``."""
    batch, heads, seq = q.shape[:3]
    scores = o("mul", [o("matmul", [q, o.t(key, (0, 1, 3, 2), "k_t")], None, "qk"), o.const(dim ** -0.5, "scale")],
               None, "scores")
    scores = o("where", [keep, scores, o.const(NEG, "attn_neg")], None, "scores_masked")
    out = o("matmul", [o("softmax", [scores], {"axis": -1}, "probs"), value], None, "attn_bhtd")
    out = o.view(o.t(out, (0, 2, 1, 3), "attn_bthd"), (batch, seq, heads * dim), "attn")
    layer._note_attention("gqa", heads, kv_heads, dim, dim, None, None, None, rope, qk_norm=True)
    return o.linear(out, m.param(f"{layer.prefix}attn.wo", (d, heads * dim)), "attn_out")


def _visible(m, o, x, mask, key):
    """Bool [B, 1, T, S]: key slot j <= the query's slot (S - T + t) and attention_mask[b, j]."""
    keys = o("range_like", [key], {"axis": 2}, "key_slots")  # [S]
    offset = o("sub", [o("dim_size", [key], {"axis": 2}, "total"), o("dim_size", [x], {"axis": 1}, "seq")], None,
               "past")
    queries = o("add", [o("range_like", [x], {"axis": 1}, "query_index"), offset], None, "query_slots")  # [T]
    causal = o("less_equal", [o.view(keys, (1, key.shape[2]), "key_row"),
                              o.view(queries, (x.shape[1], 1), "query_column")], None, "causal")  # [T, S]
    real = o.view(o("cast", [mask], {"to": "bool"}, "real"), (x.shape[0], 1, 1, key.shape[2]), "real4")
    return o("logical_and", [o.view(causal, (1, 1, x.shape[1], key.shape[2]), "causal4"), real], None, "visible")

