"""DeepSeek-V3.2 (``frontends.hf.families`` registers it): DeepSeek-V3 with DeepSeek sparse
attention (DSA), built by its own loop through the DSL (``expand``).

==============  ============================================================================
deepseek_v32    DeepSeek-V3.2(-Exp): DeepSeek-V3's MLA (low-rank q, interleaved RoPE) and
                sigmoid-routed experts (``families._deepseek``), each query attending only
                to the ``index_topk`` keys its lightning indexer scores highest, as a
                masked dense attention (``irc.ops.sparse_index.topk_mask``)
==============  ============================================================================

The indexer (transformers' ``DeepseekV32Indexer``), per layer: queries ``wq_b`` of the MLA's
normalised q latent (``q_a_norm(q_a(x))``) [B, T, H_i, D_i]; one key ``k_norm(wk(x))``
[B, T, D_i] (a LayerNorm with bias, eps 1e-6); RoPE on the first ``qk_rope_head_dim`` dims of
both, rotate-half (not interleaved like the MLA's), at the model's frequencies; scores
Σ_h w_h · relu(q_h · k · D_i^-0.5) with w = ``weights_proj(x)`` · H_i^-0.5 [B, T, S];
``topk_mask`` keeps each row's ``index_topk`` best visible keys; the MLA's scores outside
the mask are float32's minimum before the softmax. The MLA runs as primitives (the latent
expanded per head through ``kv_b``, as ``mla_attention`` does), its caches the per-head
``past_key_values.{i}.key`` / ``.value`` [B, H, P, ·]; the indexer's keys (after RoPE) are
cached too, ``past_key_values.{i}.index_key`` [B, 1, P, D_i] (transformers keeps them on
its cache layer: ``update_indexer``).

Checkpoint names: DeepSeek-V3's, plus ``self_attn.indexer.{wq_b, wk, k_norm, weights_proj}``.
``q_lora_rank`` must be set (the indexer reads the q latent), ``mlp_layer_types`` must be
what ``first_k_dense_replace`` gives, and ``layer_types`` all "indexed_attention".

``sparse_mla`` also builds the kin's layers (``families_dsa``, ``families_dsa2``): a ``Form``
of departures from this MLA, another layer's selection reused, per-layer sizes, and layers
without an indexer (every visible key, or a window, through the ``attention`` op);
``indexer["convention"]`` turns the indexer's RoPE pairing.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from frontends.hf.families_common import embedded_inputs
from frontends.hf import families_base
from frontends.hf.config import Arch, Config, dsl_rope
from irc.ops.attention import mla_softmax_scale
from irc.yamlloc import non_negative_int, positive_int

MLA_NORM_EPS = 1e-6  # transformers builds the q_a / kv_a norms and the indexer's k_norm with eps 1e-6
NEG = float(np.finfo(np.float32).min)  # transformers' masked score (its additive mask's minimum)

DEFAULTS = {
    "deepseek_v32": {
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "max_position_embeddings": 163840, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
        "moe_intermediate_size": 2048, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
        "norm_topk_prob": True, "routed_scaling_factor": 2.5, "first_k_dense_replace": 3, "n_shared_experts": 1,
        "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64, "vocab_size": 129280, "hidden_size": 7168,
        "intermediate_size": 18432, "num_hidden_layers": 61, "num_attention_heads": 128,
        "num_key_value_heads": 128,
        # what DeepSeek-V3's reader asks of these keys, fixed in DeepseekV32Config's code
        "rope_interleave": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "moe_layer_freq": 1,
    },
}

INDEXER = "attn.indexer."
LAYOUTS = {"deepseek_v32": {
    f"{INDEXER}wq_b": "self_attn.indexer.wq_b.weight", f"{INDEXER}wk": "self_attn.indexer.wk.weight",
    f"{INDEXER}k_norm": "self_attn.indexer.k_norm.weight", f"{INDEXER}k_norm.bias": "self_attn.indexer.k_norm.bias",
    f"{INDEXER}weights_proj": "self_attn.indexer.weights_proj.weight"}}


def _deepseek_v32(cfg: Config, name: str, model_type: str) -> Arch:
    """DeepSeek-V3's reading of the config, plus the indexer's sizes."""
    for key in ("rope_interleave", "scoring_func", "topk_method", "moe_layer_freq"):
        if cfg.has(key) and cfg.raw(key) != DEFAULTS["deepseek_v32"][key]:  # DeepseekV32Config reads none of them
            raise cfg.unsupported(key, cfg.raw(key), hint="DeepSeek-V3.2's code fixes it to "
                                                          f"{DEFAULTS['deepseek_v32'][key]!r}")
    arch = families_base.FAMILIES["deepseek_v3"](cfg, name, "deepseek_v3")
    arch.model_type, arch.checkpoint = model_type, "deepseek_v32"
    n = arch.n_layers
    if arch.attention.mla["q_lora_rank"] is None:
        raise cfg.error("q_lora_rank", "the indexer reads the low-rank query latent: give q_lora_rank")
    first_dense = cfg.get("first_k_dense_replace", non_negative_int)
    expected = ["dense"] * min(first_dense, n) + ["sparse"] * max(0, n - first_dense)
    cfg.check("mlp_layer_types", lambda v: v is None or list(v) == expected,
              hint=f"irc places the experts after first_k_dense_replace layers: {expected}")
    arch.expand = partial(expand, read_indexer(cfg, arch))
    return arch


def read_indexer(cfg: Config, arch: Arch) -> dict:
    """The indexer's sizes (``layer_types`` all "indexed_attention", the q latent given)."""
    if arch.attention.mla["q_lora_rank"] is None:
        raise cfg.error("q_lora_rank", "the indexer reads the low-rank query latent: give q_lora_rank")
    cfg.check("layer_types", lambda v: v is None or all(t == "indexed_attention" for t in v),
              hint="every DeepSeek-V3.2 layer is \"indexed_attention\"")
    indexer = {"heads": cfg.get("index_n_heads", positive_int), "head_dim": cfg.get("index_head_dim", positive_int),
               "topk": cfg.get("index_topk", positive_int)}
    rope_dim = arch.attention.mla["qk_rope_head_dim"]
    if indexer["head_dim"] < rope_dim:
        raise cfg.error("index_head_dim", f"{indexer['head_dim']} is narrower than qk_rope_head_dim {rope_dim}, "
                                          "the indexer's rotated part")
    return indexer


FAMILIES = {"deepseek_v32": _deepseek_v32}


def expand(indexer: dict, arch: Arch, origin: str):
    """The decoder through the DSL: DeepSeek-V3's (``frontends.hf.build.expand``) with the
    attention of ``sparse_mla``."""
    from frontends.dsl import Model
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps = arch.norm_eps
    with m.at(origin):
        x = embedded_inputs(m, arch)
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            x = x + sparse_mla(m, layer, layer.rms_norm(x, "attn_norm", eps), arch, spec, indexer)[0]
            h = layer.rms_norm(x, "mlp_norm", eps)
            x = x + (layer.moe(h, **arch.moe) if spec.moe else layer.swiglu(h, d_ff=arch.mlp["d_ff"]))
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    m.meta["sparse_index"] = dict(indexer)  # beside the MLA's entries (Layer._note_attention)
    return m.graph


class _Ops:
    """Emit helpers under one layer's prefix."""

    def __init__(self, m, prefix: str):
        self.m, self.p = m, prefix

    def __call__(self, op: str, inputs, attrs, name: str):
        return self.m.emit(op, inputs, attrs, self.p + name)[0]

    def view(self, x, shape, name: str):
        return self("reshape", [x], {"shape": list(shape)}, name)

    def cols(self, x, start: int, end, name: str):
        return self("slice", [x], {"axis": -1, "start": start, "end": end}, name)

    def t(self, x, perm, name: str):
        return self("transpose", [x], {"perm": list(perm)}, name)

    def const(self, value: float, name: str):
        return self("constant", [], {"value": value}, name)

    def linear(self, x, weight, name: str):
        return self("linear", [x, weight], None, name)

    def rope(self, x, positions, rope, head_dim: int, name: str):
        return self("rope", [x, positions], rope.attrs(head_dim), name)


def _groups(o, t, count: int, heads: int, name: str):
    """[B, count, ...] -> [B, heads, ...]: head h reads entry h // (heads / count) (repeat_kv)."""
    if count == heads:
        return t
    shape = list(t.shape)
    grouped = o("expand", [o.view(t, [shape[0], count, 1] + shape[2:], f"{name}_g")],
                {"shape": [shape[0], count, heads // count] + shape[2:]}, f"{name}_expanded")
    return o.view(grouped, [shape[0], heads] + shape[2:], f"{name}_heads")


@dataclass(frozen=True)
class Form:
    """Where a DSA kin's MLA departs from DeepSeek-V3.2's (the defaults: nowhere).

    ``q_gate`` (A.X-K2): q and a per-head output gate [H, v] from ``attn.q_gate`` over
    concat(q_a_norm(q_a(x)), q_a(x)), the attention output times sigmoid(gate);
    ``norm_eps``: the q / kv latents' RMSNorms (and ``k_rope_norm``'s);
    ``lora_scales`` (dots3): the normed q latent times sqrt(d / q_lora_rank) (what the indexer
    reads too), the normed kv latent times sqrt(d / kv_lora_rank);
    ``k_rope_norm`` (dots3): an RMSNorm ``attn.k_rope_norm`` [R] on the shared key's rotated
    part before its RoPE; ``head_gate`` (dots3): head h's output times sigmoid(``attn.g_proj``
    [H, d] · x)_h; ``plain_scale`` (dots3): the softmax scale qk^-0.5, no YaRN mscale."""
    q_gate: bool = False
    norm_eps: float = MLA_NORM_EPS
    lora_scales: bool = False
    k_rope_norm: bool = False
    head_gate: bool = False
    plain_scale: bool = False


V32 = Form()


def sparse_mla(m, layer, x, arch: Arch, spec, indexer, keep=None, form: Form = V32, mla=None, heads=None):
    """MLA over the keys ``indexer_mask`` keeps: (out [B, T, d], keep) (module docstring).
    ``keep`` given: that selection (an earlier layer's), this layer has no indexer; neither
    (``indexer`` None): every visible key, within ``spec.window`` if set, through the
    ``attention`` op. ``form``: ``Form``; ``mla`` / ``heads``: this layer's sizes (default
    the model's)."""
    mla, heads, i = mla or arch.attention.mla, heads or arch.attention.heads, layer.index
    nope, rdim, vdim = mla["qk_nope_head_dim"], mla["qk_rope_head_dim"], mla["v_head_dim"]
    qk, d = nope + rdim, arch.d_model
    o, p = _Ops(m, layer.prefix), layer.prefix
    batch, seq = x.shape[:2]
    rope = dsl_rope(spec.rope)
    q, key, value, q_latent, gate = _mla_heads(m, o, p, x, mla, heads, rope, form)
    scale = qk ** -0.5 if form.plain_scale else mla_softmax_scale(nope, rdim, rope.mla_attrs(), arch.attention.scale)
    window = None
    if indexer is None and keep is None:
        window = spec.window
        flat = [o.view(t, (batch, seq, heads * t.shape[-1]), f"{n}_flat")
                for t, n in ((q, "q"), (key, "k"), (value, "v"))]
        attrs = {"heads": heads, "kv_heads": heads, "head_dim": qk, "v_head_dim": vdim, "causal": True,
                 "window": window, "softcap": None, "scale": scale}
        out, *presents = m.emit("attention", [*flat, m._context()[0], *m._past(i, heads, qk, vdim)], attrs,
                                [f"{p}attn", f"present.{i}.key", f"present.{i}.value"])
        m._presents += [t.value for t in presents]
    else:
        out, keep = _masked_attention(m, o, layer, x, q, key, value, q_latent, scale, keep, indexer, spec, rdim)
    if gate is not None:
        out = o("mul", [out, o("sigmoid", [gate], None, "gate_sigmoid")], None, "attn_gated")
    if form.head_gate:
        g = o("sigmoid", [o.linear(x, m.param(f"{p}attn.g_proj", (heads, d)), "head_gate")], None, "head_gate_sigmoid")
        out = o.view(o("mul", [o.view(out, (batch, seq, heads, vdim), "attn_heads"),
                               o.view(g, (batch, seq, heads, 1), "head_gate4")], None, "attn_heads_gated"),
                     (batch, seq, heads * vdim), "attn_gated")
    layer._note_attention("mla", heads, heads, qk, vdim, window, None, arch.attention.scale, rope, mla=dict(mla))
    return o.linear(out, m.param(f"{p}attn.wo", (d, heads * vdim)), "attn_out"), keep


def _mla_heads(m, o, p: str, x, mla: dict, heads: int, rope, form: Form):
    """This step's q [B, T, H, qk] (RoPE'd), key [B, T, H, qk] and value [B, T, H, v], the q
    latent the indexer reads, and A.X-K2's output gate [B, T, H·v] (else None)."""
    nope, rdim, vdim = mla["qk_nope_head_dim"], mla["qk_rope_head_dim"], mla["v_head_dim"]
    rank, q_rank, qk, d = mla["kv_lora_rank"], mla["q_lora_rank"], nope + rdim, m._features(x)
    batch, seq = x.shape[:2]
    _, positions = m._context()
    q_compressed = o.linear(x, m.param(f"{p}attn.q_a", (q_rank, d)), "q_a_out")
    q_latent = m.norm(q_compressed, f"{p}attn.q_a_norm", "rms", form.norm_eps)
    if form.lora_scales:
        q_latent = o("mul", [q_latent, o.const((d / q_rank) ** 0.5, "q_lora_scale")], None, "q_latent_scaled")
    gate = None
    if form.q_gate:
        q = o.view(o.linear(o("concat", [q_latent, q_compressed], {"axis": -1}, "q_gate_in"),
                            m.param(f"{p}attn.q_gate", (heads * (qk + vdim), 2 * q_rank)), "q_gate_out"),
                   (batch, seq, heads, qk + vdim), "q_gate_heads")
        gate = o.view(o.cols(q, qk, None, "gate_heads"), (batch, seq, heads * vdim), "gate")
        q = o.cols(q, 0, qk, "q_heads")
    else:
        q = o.view(o.linear(q_latent, m.param(f"{p}attn.q_b", (heads * qk, q_rank)), "q"), (batch, seq, heads, qk),
                   "q_heads")
    q_rope = o.rope(o.view(o.cols(q, nope, qk, "q_pe"), (batch, seq, heads * rdim), "q_pe_flat"), positions, rope,
                    rdim, "q_pe_rope")
    q = o("concat", [o.cols(q, 0, nope, "q_nope"), o.view(q_rope, (batch, seq, heads, rdim), "q_pe_heads")],
          {"axis": -1}, "q_full")
    kv_a = o.linear(x, m.param(f"{p}attn.kv_a", (rank + rdim, d)), "kv_a_out")
    latent = m.norm(o.cols(kv_a, 0, rank, "kv_latent"), f"{p}attn.kv_a_norm", "rms", form.norm_eps)
    if form.lora_scales:
        latent = o("mul", [latent, o.const((d / rank) ** 0.5, "kv_lora_scale")], None, "kv_latent_scaled")
    kv = o.view(o.linear(latent, m.param(f"{p}attn.kv_b", (heads * (nope + vdim), rank)), "kv"),
                (batch, seq, heads, nope + vdim), "kv_heads")
    k_pe = o.cols(kv_a, rank, None, "k_pe")
    if form.k_rope_norm:
        k_pe = m.norm(k_pe, f"{p}attn.k_rope_norm", "rms", form.norm_eps)
    k_rope = o.view(o.rope(k_pe, positions, rope, rdim, "k_pe_rope"), (batch, seq, 1, rdim), "k_pe_head")
    k_rope = o("expand", [k_rope], {"shape": [batch, seq, heads, rdim]}, "k_pe_heads")
    key = o("concat", [o.cols(kv, 0, nope, "k_nope"), k_rope], {"axis": -1}, "k_full")
    return q, key, o.cols(kv, nope, None, "v_heads"), q_latent, gate


def _masked_attention(m, o, layer, x, q, key, value, q_latent, scale: float, keep, indexer, spec, rope_dim: int):
    """Softmax attention of q over the per-head caches (``past_key_values.{i}.key`` /
    ``.value``) and this step's keys, the keys outside ``keep`` (else the indexer's selection)
    at float32's minimum: (out [B, T, H·v], keep)."""
    i = layer.index
    batch, seq, heads, qk = q.shape
    vdim = value.shape[-1]
    past_key, past_value = m._past(i, heads, qk, vdim)
    key = m.emit("concat", [past_key, o.t(key, (0, 2, 1, 3), "k_bhtd")], {"axis": 2}, f"present.{i}.key")[0]
    value = m.emit("concat", [past_value, o.t(value, (0, 2, 1, 3), "v_bhtd")], {"axis": 2}, f"present.{i}.value")[0]
    m._presents += [key.value, value.value]
    if keep is None:
        keep = indexer_mask(m, layer, x, q_latent, spec.rope, rope_dim, indexer)
    scores = o("mul", [o("matmul", [o.t(q, (0, 2, 1, 3), "q_bhtd"), o.t(key, (0, 1, 3, 2), "k_t")], None, "qk"),
                       o.const(scale, "attn_scale")], None, "scores")
    total = key.shape[2]
    scores = o("where", [o.view(keep, (batch, 1, seq, total), "keep4"), scores, o.const(NEG, "attn_neg")], None,
               "scores_masked")
    out = o("matmul", [o("softmax", [scores], {"axis": -1}, "probs"), value], None, "attn_bhtv")
    return o.view(o.t(out, (0, 2, 1, 3), "attn_bthv"), (batch, seq, heads * vdim), "attn"), keep


def indexer_mask(m, layer, x, q_latent, rope, rope_dim: int, indexer: dict):
    """Bool [B, T, P+T]: the keys each query's lightning indexer keeps (module docstring; ``rope``
    the layer's ``RopeSpec``; ``indexer["convention"]``, default "half", how its RoPE pairs
    dims: GLM-5's indexer rotates interleaved pairs); caches the indexer's rotated keys as
    ``past_key_values.{i}.index_key`` [B, 1, P, D_i]."""
    o, p, i = _Ops(m, layer.prefix + "indexer."), layer.prefix + INDEXER, layer.index
    heads, dim, d = indexer["heads"], indexer["head_dim"], m._features(x)
    batch, seq = x.shape[:2]
    mask, positions = m._context()
    half = dsl_rope(replace(rope, convention=indexer.get("convention", "half"), rotary_dim=rope_dim))
    q = o.rope(o.linear(q_latent, m.param(f"{p}wq_b", (heads * dim, q_latent.shape[-1])), "q"), positions, half, dim,
               "q_rope")
    q = o.t(o.view(q, (batch, seq, heads, dim), "q_heads"), (0, 2, 1, 3), "q_bhtd")
    k = m.norm(o.linear(x, m.param(f"{p}wk", (dim, d)), "k"), f"{p}k_norm", "layer", 1e-6, bias=True)
    k = o.view(o.rope(k, positions, half, dim, "k_rope"), (batch, 1, seq, dim), "k_head")
    k = m.emit("concat", [_index_past(m, i, dim), k], {"axis": 2}, f"present.{i}.index_key")[0]
    m._presents.append(k.value)
    scores = o("matmul", [q, o.t(k, (0, 1, 3, 2), "k_t")], None, "qk")
    scores = o("mul", [scores, o.const(dim ** -0.5, "scale")], None, "qk_scaled")
    scores = o("maximum", [scores, o.const(0.0, "zero")], None, "qk_relu")
    weights = o("mul", [o.linear(x, m.param(f"{p}weights_proj", (heads, d)), "weights"),
                        o.const(heads ** -0.5, "weights_scale")], None, "weights_scaled")
    weights = o.view(o.t(weights, (0, 2, 1), "weights_bht"), (batch, heads, seq, 1), "weights4")
    total = o("reduce_sum", [o("mul", [scores, weights], None, "weighted")], {"axes": [1], "keepdims": False},
              "scores")
    return o("topk_mask", [total, mask], {"k": indexer["topk"], "causal": True}, "keep")


def _index_past(m, layer: int, dim: int):
    """The layer's ``past_key_values.{layer}.index_key`` input [B, 1, P, D_i], the cache's
    dtype (``Model._past``'s)."""
    from frontends.dsl import ACTIVATION, PAST

    return m._graph.add_input(f"past_key_values.{layer}.index_key", ACTIVATION, ("B", 1, PAST, dim))

