"""JetMoE (``model_type`` jetmoe): a mixture of attention heads (MoA) and a mixture of SwiGLU
experts on every layer, both routed by a softmax over each token's top-k router logits.

Layer i (transformers' ``JetMoeDecoderLayer``)::

    h = rms(x);  x = x + moa(h) + experts.bias
    h = rms(x);  x = x + moe(h) + mlp.bias;      logits = lm_head(norm(x))

MoA (``JetMoeMoA`` in ``JetMoeAttention``): every token picks top_k of E attention experts;
slot s's queries are expert e_s's ``input_linear`` [kv_heads·head_dim, d] applied to h, all
slots attend over one shared k | v (``kv_proj``, kv_heads heads of ``kv_channels``), and
slot s's output goes through e_s's ``output_linear`` [d, kv_heads·head_dim], weighted by its
routing weight; the slots are summed. irc writes it with the sorted-MoE ops the ``moe`` op
lowers to (``irc.ops.moe_sorted``): ``moe_route`` (softmax, renormalised over the top k:
softmax of the top-k logits), ``moe_dispatch``, ``gather`` of the token rows,
``grouped_gemm`` by the query experts, ``scatter_add`` back to (token, slot) order; then the
attention op with top_k·kv_heads query heads over kv_heads key heads (transformers repeats
the keys slot-major, ``k.repeat(1, top_k, 1, 1)``: query head s·kv_heads + j reads key head j,
so irc orders its query heads kv-major, j·top_k + s, a ``transpose``, as GQA groups them);
then ``gather`` by slot, ``grouped_gemm`` by the output experts, the routing weights,
``scatter_add`` into token order. The MLP is the ``moe`` op (``input_linear`` [E, 2F, d]
read as its gate and up halves, ``output_linear`` [E, d, F]).

transformers' layer norms use eps 1e-6 whatever ``rms_norm_eps`` says (``JetMoeRMSNorm``'s
default; only the final norm reads it), as irc does. Refused, naming the key: activations
other than SiLU, RoPE types other than default.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from frontends.dsl import Model
from frontends.dsl_rope import emit_rope
from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, read_rope, rope_dict
from frontends.hf.families_ssm import Half
from irc import dims
from irc.yamlloc import boolean, layer_count, positive_int, positive_number, size

LAYER_EPS = 1e-6  # JetMoeRMSNorm's default, which the layers' norms keep

DEFAULTS = {  # transformers 5.25's JetMoeConfig
    "jetmoe": {
        "vocab_size": 32000, "hidden_size": 2048, "num_hidden_layers": 12, "num_key_value_heads": 16,
        "kv_channels": 128, "intermediate_size": 5632, "max_position_embeddings": 4096, "activation_function": "silu",
        "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": True, "rms_norm_eps": 1e-6},
}

MOA = "self_attention.experts."
LAYOUTS = {
    "jetmoe": {
        "moa.router": f"{MOA}router.layer.weight", "moa.wq": f"{MOA}input_linear.weight",
        "moa.wo": f"{MOA}output_linear.weight", "moa.bias": f"{MOA}bias", "attn.wkv": "self_attention.kv_proj.weight",
        "moe.router": "mlp.router.layer.weight", "moe.w_down": "mlp.output_linear.weight", "moe.bias": "mlp.bias",
        "moe.w_gate": lambda arch, prefix: Half(prefix + "mlp.input_linear.weight", False),
        "moe.w_up": lambda arch, prefix: Half(prefix + "mlp.input_linear.weight", True)},
}


@dataclass
class JetMoe:
    experts: int
    top_k: int
    d_ff: int
    rope: object


def _jetmoe(cfg: Config, name: str, model_type: str) -> Arch:
    """JetMoE: mixture-of-attention and mixture-of-experts layers."""
    cfg.check("activation_function", lambda v: v == "silu", hint="irc reads JetMoE's SwiGLU experts")
    d = cfg.get("hidden_size", size)
    n = cfg.get("num_hidden_layers", layer_count)
    kv_heads, head_dim = cfg.get("num_key_value_heads", size), cfg.get("kv_channels", positive_int)
    experts, top_k = cfg.get("num_local_experts", positive_int), cfg.get("num_experts_per_tok", positive_int)
    if top_k > experts:
        raise cfg.error("num_experts_per_tok", f"top_k {top_k} exceeds {experts} experts (num_local_experts)")
    params, key = rope_dict(cfg)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise cfg.unsupported(f"{key}.rope_type", kind, hint="irc reads JetMoE's default RoPE only")
    rope = read_rope(cfg, head_dim, params, key)
    settings = JetMoe(experts=experts, top_k=top_k, d_ff=cfg.get("intermediate_size", positive_int), rope=rope)
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=Attention("gqa", kv_heads * top_k, kv_heads, head_dim, scale=head_dim ** -0.5),
                layers=[LayerSpec(None, rope, True) for _ in range(n)], mlp=None,
                moe={"experts": experts, "top_k": top_k, "d_ff": settings.d_ff, "norm_topk_prob": True},
                tied=cfg.get("tie_word_embeddings", boolean), checkpoint="jetmoe",
                expand=partial(_jetmoe_graph, settings))


def _heads(m: Model, x, shape_in: list, perm: list, shape_out: list, name: str):
    """x reshaped to ``shape_in``, transposed by ``perm``, reshaped to ``shape_out``."""
    t = m.emit("reshape", [x], {"shape": shape_in}, f"{name}_split")[0]
    t = m.emit("transpose", [t], {"perm": perm}, f"{name}_transposed")[0]
    return m.emit("reshape", [t], {"shape": shape_out}, name)[0]


def mixture_of_attention(layer, h, s: JetMoe, a: Attention, rope):
    """JetMoE's MoA (module docstring), output [B, T, d] before ``moa.bias``."""
    m, p, i = layer.model, layer.prefix, layer.index
    d, k, kv, hd = m._features(h), s.top_k, a.kv_heads, a.head_dim
    width, batch, seq = kv * hd, h.shape[0], h.shape[1]
    tokens = m.emit("reshape", [h], {"shape": [dims.product(h.shape[:-1]), d]}, f"{p}moa_tokens")[0]
    router = m.param(f"{p}moa.router", (s.experts, d))
    expert_ids, weights = m.emit("moe_route", [tokens, router], {"experts": s.experts, "top_k": k},
                                 [f"{p}moa_expert_ids", f"{p}moa_weights"])
    token_index, slot_index, indptr = m.emit("moe_dispatch", [expert_ids], {"experts": s.experts},
                                             [f"{p}moa_token_index", f"{p}moa_slot_index", f"{p}moa_indptr"])
    gemm = {"experts": s.experts, "top_k": k}
    rows = m.emit("gather", [tokens, token_index], {"axis": 0}, f"{p}moa_rows")[0]
    q_rows = m.emit("grouped_gemm", [rows, m.param(f"{p}moa.wq", (s.experts, width, d)), indptr], gemm,
                    f"{p}moa_q_rows")[0]
    pairs = dims.product(expert_ids.shape)
    zero = m.emit("constant", [], {"value": 0.0}, f"{p}moa_zero")[0]
    base = m.emit("expand", [zero], {"shape": [pairs, width]}, f"{p}moa_q_base")[0]
    q = m.emit("scatter_add", [base, slot_index, q_rows], None, f"{p}moa_q_slots")[0]
    q = _heads(m, q, [batch, seq, k, kv, hd], [0, 1, 3, 2, 4], [batch, seq, kv * k * hd], f"{p}q")
    kv_out = m.emit("linear", [h, m.param(f"{p}attn.wkv", (2 * width, d)), None], None, f"{p}kv")[0]
    key, value = layer._split(kv_out, [width, width], ["k", "v"])
    mask, positions = m._context()
    if rope is not None:
        q = emit_rope(m, q, positions, rope, kv * k, hd, f"{p}q_rope")
        key = emit_rope(m, key, positions, rope, kv, hd, f"{p}k_rope")
    past_key, past_value = m._past(i, kv, hd, hd)
    attrs = {"heads": kv * k, "kv_heads": kv, "head_dim": hd, "v_head_dim": None, "causal": True, "window": None,
             "softcap": None, "scale": a.scale}
    out, present_key, present_value = m.emit("attention", [q, key, value, mask, past_key, past_value], attrs,
                                             [f"{p}attn", f"present.{i}.key", f"present.{i}.value"])
    m._presents += [present_key.value, present_value.value]
    layer._note_attention("gqa" if kv > 1 else "mqa", kv * k, kv, hd, hd, None, None, a.scale, rope)
    slots = _heads(m, out, [batch, seq, kv, k, hd], [0, 1, 3, 2, 4], [pairs, width], f"{p}moa_out_slots")
    o_rows = m.emit("gather", [slots, slot_index], {"axis": 0}, f"{p}moa_out_rows")[0]
    o_rows = m.emit("grouped_gemm", [o_rows, m.param(f"{p}moa.wo", (s.experts, d, width)), indptr], gemm,
                    f"{p}moa_o_rows")[0]
    flat = m.emit("reshape", [weights], {"shape": [pairs]}, f"{p}moa_weights_flat")[0]
    row_weights = m.emit("gather", [flat, slot_index], {"axis": 0}, f"{p}moa_row_weights")[0]
    row_weights = m.emit("reshape", [row_weights], {"shape": [o_rows.shape[0], 1]}, f"{p}moa_row_weights_M1")[0]
    weighted = m.emit("mul", [o_rows, row_weights], None, f"{p}moa_weighted")[0]
    token_base = m.emit("expand", [zero], {"shape": [tokens.shape[0], d]}, f"{p}moa_base")[0]
    combined = m.emit("scatter_add", [token_base, token_index, weighted], None, f"{p}moa_combined")[0]
    return m.emit("reshape", [combined], {"shape": list(h.shape)}, f"{p}moa_out")[0]


def _jetmoe_graph(s: JetMoe, arch: Arch, origin: str):
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    rope, d = dsl_rope(s.rope), arch.d_model
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer in m.layers(arch.n_layers):
            p = layer.prefix
            h = layer.rms_norm(x, "attn_norm", LAYER_EPS)
            y = mixture_of_attention(layer, h, s, arch.attention, rope)
            x = x + m.add(y, m.param(f"{p}moa.bias", (d,)), f"{p}moa_biased")
            h = layer.rms_norm(x, "mlp_norm", LAYER_EPS)
            y = layer.moe(h, s.experts, s.top_k, s.d_ff, norm_topk_prob=True)
            x = x + m.add(y, m.param(f"{p}moe.bias", (d,)), f"{p}moe_biased")
        m.logits(m.rms_norm(x, "norm", arch.norm_eps), tied=arch.tied)
    return m.graph


FAMILIES = {"jetmoe": _jetmoe}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS", "mixture_of_attention"]
