"""Ergo (Amazon; ``model_type`` ergo, transformers' ``ErgoForCausalLM``), built by its own
loop through the DSL.

Layer i (``ErgoDecoderLayer``)::

    h = post_attention_layernorm(attn(input_layernorm(x)));       x = gate_a(h, x)
    h = post_feedforward_layernorm(ffn(pre_feedforward_layernorm(x))); x = gate_f(h, x)
    logits = lm_head(norm(x))        (lm_head never tied: ErgoForCausalLM ties nothing)

``gate(h, r)`` (``ErgoResidualGate``, weight w [d]) is sigmoid(w)·h + sqrt(1 + sigmoid(w))·
exp(-softplus(w)/2)·r, written with irc's elementwise ops on the parameter.

Attention: one fused ``qkv_proj`` (q | k | v rows, read as ``attn.wq/wk/wv``), per-head RMS
norms of q and k, then on ``sliding_attention`` layers RoPE with a window of
``sliding_window`` tokens, on ``full_attention`` layers no position embedding and the logits
times ``global_attention_scale`` when set (transformers multiplies q and k by its square
root each: the attention op's scale is head_dim^-1/2 · global_attention_scale). Ergo's RoPE
builds cos/sin with ``repeat_interleave`` (pair j's angle at features 2j and 2j+1) and its
``rotate_half`` maps (x[2j], x[2j+1]) to (-x[2j+1], x[2j]): adjacent pairs turned by their
angle, GPT-J's rotation, irc's ``interleaved`` convention exactly (no permutation needed).
head_dim is hidden_size / num_attention_heads (``ErgoAttention``).

FFN: the first layers (``mlp_layer_types`` "dense") down(relu(up(h))²); the others a MoE
(``ErgoMoE``) of squared-ReLU experts (``up_proj`` [E, d, F], ``down_proj`` [E, F, d], read
as [E, F, d] and [E, d, F]) whose every routed output is RMS-normed with its expert's own
weight (``post_expert_norm`` [E, d]) before the weighted sum, plus a shared squared-ReLU
expert followed by an RMS norm (``shared_experts.norm``). Router: sigmoid scores of
``gate.linear``, top-k on scores + ``e_score_correction_bias``, renormalised (+1e-20),
times ``moe_routed_scaling_factor``. irc writes the routed part with the sorted-MoE ops
(``irc.ops.moe_sorted``: ``moe_route``, ``moe_dispatch``, ``gather``, ``grouped_gemm``)
and the per-row norm between the down GEMM and the weighting: each sorted row is RMS-normed
and multiplied by row ``expert_ids[slot]`` of ``post_expert_norm``, then by its routing
weight, and ``scatter_add``-ed back to its token.

Checkpoints hold the hub's names (``tok_embeddings``, ``layers.{i}.attention.wqkv``,
``feed_forward.*``, ``output``), which transformers' ``save_pretrained`` writes back (its
conversion mapping for ergo); the router's ``gate_kernel`` and the shared expert's
projections are stored [in, out] and read transposed. The window is ``sliding_window`` or
the released configs' ``local_attention_window`` (ErgoConfig's attribute_map).

Ergo's default RoPE rotates the whole head: a ``partial_rotary_factor`` is ignored, as
``ErgoRotaryEmbedding.compute_default_rope_parameters`` ignores it.

Refused, naming config.json and the key: a RoPE type other than default (transformers'
scaled types were not checked against Ergo's interleaved rotation), layer or MLP types
other than Ergo's, a missing window where a layer slides.
"""
from __future__ import annotations

import numpy as np

from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, string_list
from frontends.hf.families_common import FULL, SLIDING, _arch, _dims, _layer_types, _rope
from frontends.hf.weights import Checkpoint, Rows, Tensor, View
from irc import dims as irc_dims
from irc.yamlloc import non_negative_int, positive_int, positive_number

DEFAULTS = {  # transformers 5.25's ErgoConfig
    "ergo": {"vocab_size": 262144, "hidden_size": 8192, "num_hidden_layers": 64, "num_attention_heads": 64,
             "num_key_value_heads": 8, "first_dense_intermediate_size": 32768, "num_dense_blocks": 1,
             "moe_intermediate_size": 4096, "shared_intermediate_size": 8192, "num_experts": 256,
             "num_experts_per_tok": 8, "moe_routed_scaling_factor": 8 ** 0.5, "max_position_embeddings": 524288,
             "rms_norm_eps": 1e-12, "sliding_window": 512, "global_attention_every_n_layers": 4,
             "global_attention_scale": None, "rope_theta": 1_000_000.0, "tie_word_embeddings": False},
}


def _ergo(cfg: Config, name: str, model_type: str) -> Arch:
    dims = _dims(cfg)
    n, d, heads = dims["layers"], dims["d"], dims["heads"]
    if d % heads:
        raise cfg.error("hidden_size", f"{d} does not split into {heads} heads (Ergo's head_dim)")
    if cfg.has("head_dim") and cfg.raw("head_dim") != d // heads:  # RoPE would read it, the attention not
        raise cfg.unsupported("head_dim", cfg.raw("head_dim"), hint=f"Ergo's heads are hidden_size / "
                              f"num_attention_heads = {d // heads} wide")
    dims["head_dim"] = d // heads
    every = cfg.get("global_attention_every_n_layers", positive_int)
    types = _layer_types(cfg, n, lambda i: SLIDING if (i + 1) % every else FULL)
    dense = cfg.get("num_dense_blocks", non_negative_int)
    mlp_types = cfg.get("mlp_layer_types", string_list, None) or ["dense" if i < dense else "sparse" for i in range(n)]
    if len(mlp_types) != n or not set(mlp_types) <= {"dense", "sparse"}:
        raise cfg.error("mlp_layer_types", f"expected {n} entries, each \"dense\" or \"sparse\"")
    rope = None
    if SLIDING in types:
        rope = _rope(cfg, dims["head_dim"], SLIDING, convention="interleaved",
                     default_base=DEFAULTS["ergo"]["rope_theta"])
        if rope.scaling is not None:
            raise cfg.unsupported("rope_parameters.rope_type", rope.scaling["kind"],
                                  hint="irc reads Ergo's default RoPE only")
        rope.rotary_dim = None  # ErgoRotaryEmbedding's default RoPE rotates the whole head, whatever the factor
    scale = cfg.get("global_attention_scale", positive_number, None)
    full_scale = dims["head_dim"] ** -0.5 * (scale if scale is not None else 1.0)
    # the released checkpoints' configs name the window local_attention_window (ErgoConfig's attribute_map)
    key = "local_attention_window" if cfg.has("local_attention_window") and not cfg.has("sliding_window") else \
        "sliding_window"
    window = cfg.get(key, positive_int) if SLIDING in types else None
    layers = [LayerSpec(window if kind == SLIDING else None, rope if kind == SLIDING else None, kind_mlp == "sparse")
              for kind, kind_mlp in zip(types, mlp_types)]
    moe = None
    if "sparse" in mlp_types:
        experts, top_k = cfg.get("num_experts", positive_int), cfg.get("num_experts_per_tok", positive_int)
        if top_k > experts:
            raise cfg.error("num_experts_per_tok", f"top_k {top_k} exceeds {experts} experts (num_experts)")
        moe = {"experts": experts, "top_k": top_k, "d_ff": cfg.get("moe_intermediate_size", positive_int),
               "shared_d_ff": cfg.get("shared_intermediate_size", positive_int),
               "routed_scale": cfg.get("moe_routed_scaling_factor", positive_number)}
    attention = Attention("gqa", heads, dims["kv_heads"], dims["head_dim"], qk_norm=True, scale=full_scale)
    mlp = {"kind": "relu2", "d_ff": cfg.get("first_dense_intermediate_size", positive_int)}
    arch = _arch(cfg, name, model_type, dims, attention, layers, mlp, moe=moe, checkpoint="ergo", expand=expand)
    arch.tied = False  # ErgoForCausalLM declares no tied weights
    return arch


def _residual_gate(m, layer, h, residual, which: str):
    """``ErgoResidualGate``: sigmoid(w)·h + sqrt(1 + sigmoid(w))·exp(-softplus(w)/2)·residual."""
    p = f"{layer.prefix}{which}_gate"
    w = m.param(f"{p}", (m._features(h),))

    def op(kind, inputs, role, attrs=None):
        return m.emit(kind, inputs, attrs, f"{p}_{role}")[0]

    branch = op("sigmoid", [w], "branch")
    one = op("constant", [], "one", {"value": 1.0})
    half = op("constant", [], "minus_half", {"value": -0.5})
    root = op("sqrt", [op("add", [branch, one], "one_plus")], "root")
    decay = op("exp", [op("mul", [op("softplus", [w], "softplus"), half], "half_softplus")], "decay")
    keep = op("mul", [root, decay], "residual")
    return op("add", [op("mul", [branch, h], "branch_out"), op("mul", [keep, residual], "residual_out")], "out")


def _relu2(m, x, name: str):
    zero = m.emit("constant", [], {"value": 0.0}, f"{name}_zero")[0]
    act = m.emit("maximum", [x, zero], None, f"{name}_relu")[0]
    return m.emit("mul", [act, act], None, name)[0]


def _moe(m, layer, h, moe: dict, eps: float):
    """``ErgoMoE`` (module docstring): routed experts with per-expert output norms, plus the
    normed shared expert."""
    p, d = layer.prefix, m._features(h)
    experts, k, f = moe["experts"], moe["top_k"], moe["d_ff"]
    tokens = m.emit("reshape", [h], {"shape": [irc_dims.product(h.shape[:-1]), d]}, f"{p}moe_tokens")[0]
    attrs = {"experts": experts, "top_k": k, "scoring": "sigmoid", "norm_topk_prob": True,
             "routed_scale": float(moe["routed_scale"])}
    expert_ids, weights = m.emit("moe_route", [tokens, m.param(f"{p}moe.router", (experts, d)),
                                               m.param(f"{p}moe.router_bias", (experts,))], attrs,
                                 [f"{p}moe_expert_ids", f"{p}moe_weights"])
    token_index, slot_index, indptr = m.emit("moe_dispatch", [expert_ids], {"experts": experts},
                                             [f"{p}moe_token_index", f"{p}moe_slot_index", f"{p}moe_indptr"])
    gemm = {"experts": experts, "top_k": k}
    rows = m.emit("gather", [tokens, token_index], {"axis": 0}, f"{p}moe_rows")[0]
    up = m.emit("grouped_gemm", [rows, m.param(f"{p}moe.w_up", (experts, f, d)), indptr], gemm, f"{p}moe_up")[0]
    out = m.emit("grouped_gemm", [_relu2(m, up, f"{p}moe_act"), m.param(f"{p}moe.w_down", (experts, d, f)), indptr],
                 gemm, f"{p}moe_down")[0]
    out = m.plain_rms_norm(out, f"{p}moe_row_norm", eps)
    pairs = irc_dims.product(expert_ids.shape)
    flat_ids = m.emit("reshape", [expert_ids], {"shape": [pairs]}, f"{p}moe_ids_flat")[0]
    row_ids = m.emit("gather", [flat_ids, slot_index], {"axis": 0}, f"{p}moe_row_ids")[0]
    norm_rows = m.emit("gather", [m.param(f"{p}moe.expert_norm", (experts, d)), row_ids], {"axis": 0},
                       f"{p}moe_row_norm_weights")[0]
    out = m.emit("mul", [out, norm_rows], None, f"{p}moe_row_normed")[0]
    flat = m.emit("reshape", [weights], {"shape": [pairs]}, f"{p}moe_weights_flat")[0]
    row_weights = m.emit("gather", [flat, slot_index], {"axis": 0}, f"{p}moe_row_weights")[0]
    row_weights = m.emit("reshape", [row_weights], {"shape": [out.shape[0], 1]}, f"{p}moe_row_weights_M1")[0]
    weighted = m.emit("mul", [out, row_weights], None, f"{p}moe_weighted")[0]
    zero = m.emit("constant", [], {"value": 0.0}, f"{p}moe_zero")[0]
    base = m.emit("expand", [zero], {"shape": [tokens.shape[0], d]}, f"{p}moe_base")[0]
    routed = m.emit("scatter_add", [base, token_index, weighted], None, f"{p}moe_combined")[0]
    routed = m.emit("reshape", [routed], {"shape": list(h.shape)}, f"{p}moe_routed")[0]
    shared_up = m.emit("linear", [h, m.param(f"{p}moe.shared_up", (moe["shared_d_ff"], d)), None], None,
                       f"{p}moe_shared_up")[0]
    shared = m.emit("linear", [_relu2(m, shared_up, f"{p}moe_shared_act"),
                               m.param(f"{p}moe.shared_down", (d, moe["shared_d_ff"])), None], None,
                    f"{p}moe_shared_down")[0]
    return routed + m.rms_norm(shared, f"{p}moe.shared_norm", eps)


def expand(arch: Arch, origin: str):
    """The decoder through the DSL (the module docstring)."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps = arch.attention, arch.norm_eps
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            h = layer.rms_norm(x, "attn_norm", eps)
            scale = None if spec.rope is not None else a.scale
            h = layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=dsl_rope(spec.rope),
                                window=spec.window, qk_norm=True, qk_norm_eps=eps, scale=scale)
            x = _residual_gate(m, layer, layer.rms_norm(h, "post_attn_norm", eps), x, "attn")
            h = layer.rms_norm(x, "mlp_norm", eps)
            h = _moe(m, layer, h, arch.moe, eps) if spec.moe else layer.relu2_mlp(h, d_ff=arch.mlp["d_ff"])
            x = _residual_gate(m, layer, layer.rms_norm(h, "post_mlp_norm", eps), x, "mlp")
        m.logits(m.rms_norm(x, "norm", eps), tied=False)
    return m.graph


class ExpertsTransposed(Tensor):
    """A fused [E, a, b] expert tensor read as [E, b, a] (Ergo stores x @ W, irc reads W·x)."""

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        stored = list(checkpoint.info(self.name)[1])
        return [stored[0], stored[2], stored[1]] if len(stored) == 3 else stored

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        return np.ascontiguousarray(checkpoint.read(self.name, start, stop).transpose(0, 2, 1))


def _qkv(part: int):
    def source(arch: Arch, prefix: str):
        a = arch.attention
        bounds = [0, a.heads * a.head_dim, (a.heads + a.kv_heads) * a.head_dim, (a.heads + 2 * a.kv_heads) * a.head_dim]
        return Rows(prefix + "attention.wqkv.weight", bounds[part], bounds[part + 1])
    return source


FF = "feed_forward."
LAYOUTS = {"ergo": {  # the hub's names, as transformers saves them (its conversion_mapping's "ergo" renamings)
    "_prefix": "layers.", "_top": {"embed": "tok_embeddings.weight", "norm": "norm.weight", "lm_head": "output.weight"},
    "attn.wq": _qkv(0), "attn.wk": _qkv(1), "attn.wv": _qkv(2), "attn.wo": "attention.wo.weight",
    "attn.q_norm": "attention.q_norm.weight", "attn.k_norm": "attention.k_norm.weight",
    "attn_norm": "attention_norm.weight", "post_attn_norm": "post_attention_norm.weight",
    "mlp_norm": "ffn_norm.weight", "post_mlp_norm": "post_ffn_norm.weight",
    "attn_gate": "post_attention_residual.scale", "mlp_gate": "post_ffn_residual.scale",
    "mlp.w_up": f"{FF}up.weight", "mlp.w_down": f"{FF}down.weight",
    "moe.router": lambda arch, prefix: View(prefix + f"{FF}gate_kernel", transpose=True),  # stored [d, E]
    "moe.router_bias": f"{FF}router_bias", "moe.expert_norm": f"{FF}expert_output_norm.scale",
    "moe.w_up": lambda arch, prefix: ExpertsTransposed(prefix + f"{FF}up_proj"),
    "moe.w_down": lambda arch, prefix: ExpertsTransposed(prefix + f"{FF}down_proj"),
    "moe.shared_up": lambda arch, prefix: View(prefix + f"{FF}shared_up_proj", transpose=True),  # stored [d, F]
    "moe.shared_down": lambda arch, prefix: View(prefix + f"{FF}shared_down_proj", transpose=True),
    "moe.shared_norm": f"{FF}shared_expert_output_norm.scale"}}
FAMILIES = {"ergo": _ergo}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
