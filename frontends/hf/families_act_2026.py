"""Decoders of 2025-26 with a mechanism irc did not have (``frontends.hf.families`` registers
them): the xIELU and softplus activations (``irc.ops.activations``), Kolibri-1's router.

=================  ==========================================================================
apertus            Apertus (transformers' ``ApertusForCausalLM``): Llama attention (GQA, RoPE:
                   llama3 scaling by default, biases with ``attention_bias``) with per-head
                   RMS norms of q and k before RoPE; pre-norm layers (``attention_layernorm``,
                   ``feedforward_layernorm``); an ungated MLP down(act(up(x))) whose ``xielu``
                   activation has learned ``alpha_p``, ``alpha_n``, ``beta``, ``eps`` per layer
                   (``mlp.act_fn.*``, read from the checkpoint: ``irc.ops.activations.xielu``)
apertus1p5_text    Apertus 1.5's text model: Apertus with an LM head pruned to the first
                   ``output_vocab_size`` rows (logits that wide), the embedding table keeping
                   all ``vocab_size`` rows
laguna             Laguna (poolside): per-layer head counts (``num_attention_heads_per_layer``),
                   q/k RMS norms per head before RoPE, RoPE per layer type (``rope_parameters``
                   nested by type: partial rotary on full layers by default), windows on
                   ``sliding_attention`` layers, the heads' output times softplus(``g_proj``(x))
                   per head or per element (``gating``) before ``o_proj``
                   (``irc.ops.activations.softplus``); dense SwiGLU or MoE layers
                   (``mlp_layer_types``): sigmoid router, top-k on scores plus
                   ``e_score_correction_bias``, renormalised, routed sum times
                   ``moe_routed_scaling_factor``, plus one shared SwiGLU expert
kolibri1           Kolibri-1 (Aleph Alpha): GLM-4's sandwich norms (``post_attn_norm``,
                   ``post_ffn_norm`` on disk), q/k RMS norms per head, windows on
                   ``sliding_attention`` layers (default: every 5th layer full), NoPE on full
                   layers (EXAONE-4's); every layer a MoE whose router picks the top-k of the
                   *logits* plus ``expert_bias`` and weighs them by the sigmoid of their logits
                   (renormalised with ``norm_topk_prob``: the moe op's ``scoring=
                   "sigmoid_logits"``), plus one shared SwiGLU expert
=================  ==========================================================================

Refused, naming config.json and the key: another ``hidden_act`` (Apertus: xielu; Laguna and
Kolibri-1: silu); Kolibri-1 without ``sliding_window`` (transformers cannot build its masks); Laguna's router logit soft-cap
(``moe_router_logit_softcapping`` > 0: irc's MoE router has none) and
``moe_apply_router_weight_on_input`` (transformers raises on it); a pruned head with
``tie_word_embeddings`` (transformers would tie the whole table in and return logits as wide
as the vocabulary, whatever ``output_vocab_size`` says: irc refuses to guess which is meant).
"""
from __future__ import annotations

from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, int_list, read_rope, string_list
from frontends.hf.families_common import FULL, SLIDING, _arch, _dims, _experts, _layer_types, _rope, _windows
from irc.yamlloc import boolean, positive_int, positive_number

APERTUS_ROPE = {"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0, "original_max_position_embeddings": 8192,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}  # ApertusConfig.__post_init__'s
_APERTUS = {"vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "hidden_act": "xielu", "max_position_embeddings": 65536, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False, "attention_bias": False}
LAGUNA_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}}
DEFAULTS = {  # transformers 5.25's ApertusConfig, Apertus1p5TextConfig and LagunaConfig
    "apertus": _APERTUS,
    "apertus1p5_text": {**_APERTUS, "vocab_size": 266752, "output_vocab_size": None},
    "kolibri1": {"vocab_size": 128000, "hidden_size": 2560, "num_hidden_layers": 50, "num_attention_heads": 48,
                 "num_key_value_heads": 4, "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 262144,
                 "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "num_local_experts": 384, "num_experts_per_tok": 6,
                 "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "sliding_window": 513,
                 "norm_topk_prob": False, "rope_theta": 10000.0},
    "laguna": {"vocab_size": 100352, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 40,
               "num_attention_heads": 48, "num_key_value_heads": 8, "hidden_act": "silu", "rms_norm_eps": 1e-6,
               "max_position_embeddings": 131072, "tie_word_embeddings": False, "num_experts": 256,
               "num_experts_per_tok": 8, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
               "sliding_window": 512, "head_dim": 128, "attention_bias": False, "gating": True,
               "moe_routed_scaling_factor": 1.0, "moe_apply_router_weight_on_input": False,
               "moe_router_logit_softcapping": 0.0},
}


def _apertus(cfg: Config, name: str, model_type: str) -> Arch:
    dims = _dims(cfg)
    cfg.check("hidden_act", lambda v: v == "xielu", hint="Apertus' MLP here: xielu (its released checkpoints')")
    bias = bool(cfg.raw("attention_bias"))
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qkv_bias=bias, out_bias=bias,
                          qk_norm=True)
    if cfg.data.get("rope_parameters") is None and cfg.data.get("rope_scaling") is None:
        rope = read_rope(cfg, dims["head_dim"], dict(APERTUS_ROPE), "rope_parameters",
                         original_max=cfg.get("max_position_embeddings", positive_int, None))
    else:
        rope = _rope(cfg, dims["head_dim"], default_base=APERTUS_ROPE["rope_theta"])
    vocab = cfg.get("vocab_size", positive_int)
    head = vocab
    if model_type == "apertus1p5_text":
        head = cfg.get("output_vocab_size", positive_int, None) or vocab
        if head > vocab:
            raise cfg.error("output_vocab_size", f"{head} is more than vocab_size {vocab}")
        if head != vocab and cfg.raw("tie_word_embeddings"):
            raise cfg.unsupported("tie_word_embeddings", True, hint="a pruned LM head (output_vocab_size) is "
                                  "its own tensor; tied, transformers returns logits as wide as the vocabulary")
    mlp = {"kind": "xielu", "d_ff": cfg.get("intermediate_size", positive_int), "embed_rows": vocab}
    arch = _arch(cfg, name, model_type, dims, attention, [LayerSpec(None, rope)] * dims["layers"], mlp,
                 checkpoint="apertus")
    arch.vocab_size = head
    arch.expand = expand
    return arch


def _mlp(m, layer, h, mlp: dict):
    """down(xielu(up(h))) with the layer's ``mlp.act.*`` parameters."""
    p, d_ff = layer.prefix, mlp["d_ff"]
    w_up, w_down, _, _ = layer._up_down(h, d_ff, bias=False)
    layer._note_mlp("xielu", d_ff)
    params = [m.param(f"{p}mlp.act.{name}", shape) for name, shape in
              (("alpha_p", (1,)), ("alpha_n", (1,)), ("beta", ()), ("eps", ()))]
    up = m.emit("linear", [h, w_up, None], None, f"{p}mlp_up")[0]
    act = m.emit("xielu", [up, *params], None, f"{p}mlp_act")[0]
    return m.emit("linear", [act, w_down, None], None, f"{p}mlp_out")[0]


def expand(arch: Arch, origin: str):
    """x = embed(ids); per layer x + attn(rms(x)) (q/k RMS norms before RoPE), x + mlp(rms(x));
    the final RMS norm and the head (``arch.vocab_size`` rows; the table ``embed_rows``)."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps, mlp = arch.attention, arch.norm_eps, arch.mlp
    with m.at(origin):
        x = m.embed(m.input_ids(), rows=mlp["embed_rows"])
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            h = layer.rms_norm(x, "attn_norm", eps)
            x = x + layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=dsl_rope(spec.rope),
                                    qkv_bias=a.qkv_bias, out_bias=a.out_bias, qk_norm=True, qk_norm_eps=eps)
            x = x + _mlp(m, layer, layer.rms_norm(x, "mlp_norm", eps), mlp)
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


def _laguna(cfg: Config, name: str, model_type: str) -> Arch:
    dims = _dims(cfg)
    n, kv_heads = dims["layers"], dims["kv_heads"]
    cfg.check("hidden_act", lambda v: v == "silu", hint="Laguna's MLPs and experts are SwiGLU (silu)")
    cfg.check("moe_router_logit_softcapping", lambda v: not v, hint="irc's MoE router has no logit soft-cap")
    cfg.check("moe_apply_router_weight_on_input", lambda v: not v, hint="transformers' Laguna raises on it")
    gating = cfg.raw("gating")
    if gating not in (True, "per-head", "per-element"):
        raise cfg.unsupported("gating", gating, hint="Laguna's gates: true or \"per-head\", \"per-element\"")
    heads = cfg.get("num_attention_heads_per_layer", int_list, None) or [dims["heads"]] * n
    if len(heads) != n:
        raise cfg.error("num_attention_heads_per_layer", f"has {len(heads)} entries for {n} layers")
    for count in heads:
        if count <= 0 or count % kv_heads:
            raise cfg.error("num_attention_heads_per_layer", f"{count} heads do not group over {kv_heads} kv heads")
    types = _layer_types(cfg, n, lambda i: FULL)
    ropes = {kind: _laguna_rope(cfg, dims["head_dim"], kind) for kind in sorted(set(types))}
    mlp_types = cfg.get("mlp_layer_types", string_list, None) or ["dense"] + ["sparse"] * (n - 1)
    if len(mlp_types) != n or not set(mlp_types) <= {"dense", "sparse"}:
        raise cfg.error("mlp_layer_types", f"expected {n} entries, each \"dense\" or \"sparse\"")
    layers = [LayerSpec(window, ropes[kind], kind_mlp == "sparse")
              for window, kind, kind_mlp in zip(_windows(cfg, types), types, mlp_types)]
    moe = None
    if "sparse" in mlp_types:
        moe = {"experts": cfg.get("num_experts", positive_int), "top_k": cfg.get("num_experts_per_tok", positive_int),
               "d_ff": cfg.get("moe_intermediate_size", positive_int), "shared_experts": 1,
               "shared_d_ff": cfg.get("shared_expert_intermediate_size", positive_int), "scoring": "sigmoid",
               "router_bias": True, "norm_topk_prob": True,
               "routed_scale": cfg.get("moe_routed_scaling_factor", positive_number)}
    bias = bool(cfg.raw("attention_bias"))
    attention = Attention("gqa", dims["heads"], kv_heads, dims["head_dim"], qkv_bias=bias, out_bias=bias,
                          qk_norm=True)
    mlp = {"kind": "swiglu", "d_ff": cfg.get("intermediate_size", positive_int), "heads": heads,
           "gate_per_head": gating != "per-element"}
    arch = _arch(cfg, name, model_type, dims, attention, layers, mlp, moe=moe, checkpoint="laguna")
    arch.expand = expand_laguna
    return arch


def _laguna_rope(cfg: Config, head_dim: int, kind: str):
    """A layer type's RoPE: ``rope_parameters`` nests them by type (LagunaRotaryEmbedding reads
    ``rope_parameters[layer_type]``); a file without any takes the class's two."""
    if cfg.data.get("rope_parameters") is None:
        return read_rope(cfg, head_dim, dict(LAGUNA_ROPE[kind]), "rope_parameters")
    params = cfg.data["rope_parameters"]
    if not isinstance(params, dict) or not isinstance(params.get(kind), dict):
        raise cfg.error("rope_parameters", f"Laguna gives RoPE per layer type: no {kind!r} entry")
    return _rope(cfg, head_dim, kind)


def _softplus_gate(m, layer, h, heads: int, head_dim: int, per_head: bool):
    """out -> out times softplus(g_proj(h)): one gate per head (broadcast over its features)
    or one per feature."""
    p = layer.prefix
    width = heads if per_head else heads * head_dim
    gate = m.emit("linear", [h, m.param(f"{p}attn.w_out_gate", (width, m._features(h))), None], None,
                  f"{p}attn_gate")[0]
    gate = m.emit("softplus", [gate], None, f"{p}attn_gate_softplus")[0]

    def apply(out):
        if not per_head:
            return m.emit("mul", [out, gate], None, f"{p}attn_gated")[0]
        lead = tuple(out.shape[:-1])
        split = m.emit("reshape", [out], {"shape": list(lead + (heads, head_dim))}, f"{p}attn_heads")[0]
        column = m.emit("reshape", [gate], {"shape": list(lead + (heads, 1))}, f"{p}attn_gate_column")[0]
        gated = m.emit("mul", [split, column], None, f"{p}attn_heads_gated")[0]
        return m.emit("reshape", [gated], {"shape": list(lead + (heads * head_dim,))}, f"{p}attn_gated")[0]
    return apply


def expand_laguna(arch: Arch, origin: str):
    """x = embed(ids); per layer x + attn(rms(x)) (its own head count, q/k norms, its type's
    RoPE and window, the softplus gate before o_proj), x + (SwiGLU or MoE)(rms(x)); the final
    RMS norm and the head."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps, mlp = arch.attention, arch.norm_eps, arch.mlp
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec, heads in zip(m.layers(arch.n_layers), arch.layers, mlp["heads"]):
            h = layer.rms_norm(x, "attn_norm", eps)
            gate = _softplus_gate(m, layer, h, heads, a.head_dim, mlp["gate_per_head"])
            x = x + layer.attention(h, heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=dsl_rope(spec.rope),
                                    window=spec.window, qkv_bias=a.qkv_bias, out_bias=a.out_bias, qk_norm=True,
                                    qk_norm_eps=eps, out_gate=gate)
            h = layer.rms_norm(x, "mlp_norm", eps)
            x = x + (layer.moe(h, **arch.moe) if spec.moe else layer.swiglu(h, d_ff=mlp["d_ff"]))
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


def _kolibri1(cfg: Config, name: str, model_type: str) -> Arch:
    """Kolibri-1 on the shared decoder loop: sandwich norms, NoPE full layers, every layer a MoE."""
    dims = _dims(cfg)
    n = dims["layers"]
    cfg.check("hidden_act", lambda v: v == "silu", hint="Kolibri-1's experts are SwiGLU (silu)")
    types = _layer_types(cfg, n, lambda i: FULL if (i + 1) % 5 == 0 else SLIDING)
    window = cfg.get("sliding_window", positive_int)  # null: transformers' Kolibri1Model cannot build its masks
    rope = _rope(cfg, dims["head_dim"])
    layers = [LayerSpec(window, rope, moe=True) if kind == SLIDING else LayerSpec(None, None, moe=True)
              for kind in types]
    moe = {"experts": _experts(cfg, "num_local_experts", "num_experts"),
           "top_k": cfg.get("num_experts_per_tok", positive_int), "d_ff": cfg.get("moe_intermediate_size", positive_int),
           "shared_experts": 1, "shared_d_ff": cfg.get("shared_expert_intermediate_size", positive_int),
           "scoring": "sigmoid_logits",
           "router_bias": True, "norm_topk_prob": cfg.get("norm_topk_prob", boolean)}
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qk_norm=True)
    return _arch(cfg, name, model_type, dims, attention, layers, None, moe=moe, sandwich=True, checkpoint="kolibri1")


_APERTUS_LAYOUT = {"attn_norm": "attention_layernorm.weight", "mlp_norm": "feedforward_layernorm.weight",
                   **{f"mlp.act.{n}": f"mlp.act_fn.{n}" for n in ("alpha_p", "alpha_n", "beta", "eps")}}
LAYOUTS = {"apertus": _APERTUS_LAYOUT,
           "laguna": {"attn.w_out_gate": "self_attn.g_proj.weight", "moe.router_bias": "mlp.experts.e_score_correction_bias",
                      **{f"moe.shared_{x}": f"mlp.shared_expert.{x}_proj.weight" for x in ("gate", "up", "down")}}}
LAYOUTS["kolibri1"] = {"post_attn_norm": "post_attn_norm.weight", "post_mlp_norm": "post_ffn_norm.weight",
                       "moe.router_bias": "moe.router.expert_bias"}  # the hub's names, as transformers saves them
FAMILIES = {"apertus": _apertus, "apertus1p5_text": _apertus, "laguna": _laguna, "kolibri1": _kolibri1}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
