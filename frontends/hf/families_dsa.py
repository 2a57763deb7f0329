"""DeepSeek sparse attention (DSA) kin of DeepSeek-V3.2 (``frontends.hf.families`` registers
them): each is ``families_deepseek_v32``'s MLA over the keys its lightning indexer keeps
(``irc.ops.sparse_index.topk_mask``), through ``sparse_mla`` with the family's options.

============  ==============================================================================
glm_moe_dsa   GLM-5 (GLM-MoE-DSA): DeepSeek-V3.2 whose indexer rotates interleaved pairs
              (``GlmMoeDsaIndexer``: ``apply_rotary_pos_emb_interleave`` on its first
              ``qk_rope_head_dim`` dims) and whose ``"shared"`` layers (``indexer_types``) have
              no indexer and reuse the selection of the nearest earlier ``"full"`` layer
axk2          A.X-K2: DeepSeek-V3.2 with a fused ``q_gate_proj`` over concat(q_a_norm(q_a(x)),
              q_a(x)) giving each head's query and an output gate (attention · sigmoid(gate)),
              gated RMSNorms (``AXK2GatedRMSNorm``: y = rms(x); y · sigmoid(fc2(silu(fc1(y)))))
              before every attention and before the experts, a plain RMSNorm before a dense
              MLP, the dense/MoE pattern of ``mlp_layer_types``, routing without expert groups
============  ==============================================================================

The indexer keys are cached as DeepSeek-V3.2's are (``past_key_values.{i}.index_key``, on the
layers that have an indexer). Refused: A.X-K2 with ``n_group`` (its grouped router fills the
other groups' scores with 0.0, not -inf, before the top-k: ``AXK2TopkRouter.apply_group_scoring``;
irc's ``moe`` masks them), a GLM-5 ``"shared"`` first layer (transformers raises), and what
DeepSeek-V3.2's reader refuses.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Optional

from frontends.hf.families_common import embedded_inputs
from frontends.hf.config import Arch, Config, string_list
from frontends.hf.families_common import _swiglu
from frontends.hf.families_deepseek_v32 import DEFAULTS as V32_DEFAULTS
from frontends.hf.families_deepseek_v32 import LAYOUTS as V32_LAYOUTS
from frontends.hf.families_deepseek_v32 import V32, Form, _deepseek_v32, read_indexer, sparse_mla
from irc.yamlloc import layer_count, non_negative_int, positive_int

_V32 = V32_DEFAULTS["deepseek_v32"]
DEFAULTS = {
    "glm_moe_dsa": {**_V32, "vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288,
                    "num_hidden_layers": 78, "num_attention_heads": 64, "num_key_value_heads": 64,
                    "q_lora_rank": 2048, "qk_nope_head_dim": 192, "v_head_dim": 256, "n_group": 1, "topk_group": 1,
                    "max_position_embeddings": 202752, "rms_norm_eps": 1e-5, "index_n_heads": 32},
    "axk2": {**_V32, "vocab_size": 163840, "hidden_size": 2048, "intermediate_size": 5120, "moe_intermediate_size": 512,
             "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 32, "n_routed_experts": 128,
             "kv_lora_rank": 128, "q_lora_rank": 384, "qk_rope_head_dim": 32, "qk_nope_head_dim": 64, "v_head_dim": 64,
             "max_position_embeddings": 131072, "index_n_heads": 16, "gated_norm_rank": 16, "n_group": None,
             "topk_group": None, "first_k_dense_replace": 1},  # the legacy key AXK2Config derives layers from
}


def _gate_names(irc: str, hf: str) -> dict:
    """A gated norm's tensors as the checkpoints store them (transformers renames W_down /
    W_up to mlp.fc1 / mlp.fc2 on load, back on save)."""
    return {irc: f"{hf}.norm.weight", f"{irc}_gate.fc1": f"{hf}.W_down.weight", f"{irc}_gate.fc2": f"{hf}.W_up.weight"}


# the fused query + gate projection is stored as q_b_proj (transformers' q_gate_proj once loaded)
LAYOUTS = {"axk2": {**V32_LAYOUTS["deepseek_v32"], "attn.q_gate": "self_attn.q_b_proj.weight",
                    **_gate_names("attn_norm", "input_layernorm"),
                    **_gate_names("mlp_gnorm", "post_attention_layernorm")}}


def _glm_moe_dsa(cfg: Config, name: str, model_type: str) -> Arch:
    """DeepSeek-V3.2's reading, the indexer's RoPE interleaved, its per-layer sharing."""
    arch = _deepseek_v32(cfg, name, model_type)
    indexer = dict(arch.expand.args[0], convention="interleaved")
    sources = tuple("shared" if t == "shared" else "index" for t in _indexer_types(cfg, arch.n_layers))
    arch.expand = partial(expand, Plan(indexer, sources))
    return arch


def _indexer_types(cfg: Config, n: int) -> list[str]:
    """``indexer_types``, else what GlmMoeDsaConfig derives from ``index_topk_pattern`` or
    ``index_topk_freq`` / ``index_skip_topk_offset``."""
    key = "indexer_types"
    if cfg.raw(key) is not None:
        types = cfg.get(key, string_list)
    elif cfg.raw("index_topk_pattern") is not None:
        key, pattern = "index_topk_pattern", cfg.raw("index_topk_pattern")
        if isinstance(pattern, str):
            if set(pattern) - {"F", "S"}:
                raise cfg.unsupported(key, pattern, hint="a pattern of F (full) and S (shared)")
            types = [{"F": "full", "S": "shared"}[c] for c in pattern]
        else:
            types = cfg.get(key, string_list)
    else:
        freq = max(cfg.get("index_topk_freq", positive_int, 1), 1)
        offset = cfg.get("index_skip_topk_offset", non_negative_int, 2)
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if len(types) < n or set(types[:n]) - {"full", "shared"}:
        raise cfg.unsupported(key, cfg.raw(key), hint=f"{n} entries, each \"full\" or \"shared\"")
    if types[0] != "full":
        raise cfg.unsupported(key, cfg.raw(key), hint="a \"shared\" layer reuses an earlier \"full\" layer's "
                                                      "selection: the first layer must be \"full\"")
    return types[:n]


def _axk2(cfg: Config, name: str, model_type: str) -> Arch:
    """DeepSeek-V3's reading with every layer's MLP from ``mlp_layer_types``, the gates."""
    from frontends.hf.families_2026 import _deepseek_v3

    n = cfg.get("num_hidden_layers", layer_count)
    for key in ("n_group", "topk_group"):
        if cfg.raw(key) is not None:
            raise cfg.unsupported(key, cfg.raw(key), hint="A.X-K2's grouped router fills the other groups' scores "
                                  "with 0.0, irc's with -inf; only the ungrouped router (null) is exact")
    if cfg.raw("mlp_layer_types") is not None:
        types = cfg.get("mlp_layer_types", string_list)
        if len(types) != n or set(types) - {"dense", "sparse"}:
            raise cfg.unsupported("mlp_layer_types", types, hint=f"{n} entries, each \"dense\" or \"sparse\"")
    else:
        first, freq = cfg.get("first_k_dense_replace", non_negative_int), cfg.get("moe_layer_freq", positive_int, 1)
        types = ["sparse" if i >= first and i % freq == 0 else "dense" for i in range(n)]
    arch = _deepseek_v3(cfg, name, first_k_dense_replace=0, moe_layer_freq=1, mlp_layer_types=None)
    arch.model_type, arch.checkpoint = model_type, "axk2"
    arch.layers = [replace(spec, moe=t == "sparse") for spec, t in zip(arch.layers, types)]
    arch.mlp = _swiglu(cfg) if "dense" in types else None
    arch.expand = partial(expand, Plan(read_indexer(cfg, arch), ("index",) * n,
                                       gate_rank=cfg.get("gated_norm_rank", positive_int), form=Form(q_gate=True)))
    return arch


FAMILIES = {"glm_moe_dsa": _glm_moe_dsa, "axk2": _axk2}


@dataclass(frozen=True)
class Plan:
    """What ``expand`` builds per layer: ``sources[i]`` "index" (the layer's own indexer),
    "shared" (the previous selection), or "dense" (every visible key, within the layer's
    window); ``sizes[i]`` the layer's (mla, heads), None for the model's; ``gate_rank`` A.X-K2's
    gated norms; ``form`` the MLA's ``Form``."""
    indexer: dict
    sources: tuple
    sizes: tuple = ()
    gate_rank: Optional[int] = None
    form: Form = V32


def expand(plan: Plan, arch: Arch, origin: str):
    """The decoder through the DSL: DeepSeek-V3.2's with the plan's per-layer attention; a
    ``gate_rank`` gates the norms before each attention and each MoE (A.X-K2)."""
    from frontends.dsl import Model
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps, gated = arch.norm_eps, plan.gate_rank is not None
    with m.at(origin):
        x = embedded_inputs(m, arch)
        keep = None
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            source = plan.sources[layer.index]
            mla, heads = plan.sizes[layer.index] if plan.sizes else (None, None)
            h = _norm(m, layer, x, "attn_norm", eps, plan.gate_rank)
            out, keep = sparse_mla(m, layer, h, arch, spec, plan.indexer if source == "index" else None,
                                   keep=keep if source == "shared" else None, form=plan.form, mla=mla, heads=heads)
            x = x + out
            h = _norm(m, layer, x, "mlp_gnorm", eps, plan.gate_rank) if gated and spec.moe else \
                layer.rms_norm(x, "mlp_norm", eps)
            x = x + (layer.moe(h, **arch.moe) if spec.moe else layer.swiglu(h, d_ff=arch.mlp["d_ff"]))
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    m.meta["sparse_index"] = dict(plan.indexer)
    return m.graph


def _norm(m, layer, x, name: str, eps: float, gate_rank):
    """RMSNorm ``@layers.{i}.{name}``; with ``gate_rank`` r, A.X-K2's gate on it: y ·
    sigmoid(fc2(silu(fc1(y)))), fc1 [r, d] and fc2 [d, r] ``@layers.{i}.{name}_gate.fc*``."""
    y = layer.rms_norm(x, name, eps)
    if gate_rank is None:
        return y
    p, d = f"{layer.prefix}{name}_gate.", m._features(y)

    def emit(op: str, inputs, tail: str):
        return m.emit(op, inputs, None, p + tail)[0]

    hidden = emit("silu", [emit("linear", [y, m.param(f"{p}fc1", (gate_rank, d))], "fc1_out")], "act")
    gate = emit("sigmoid", [emit("linear", [hidden, m.param(f"{p}fc2", (d, gate_rank))], "fc2_out")], "sigmoid")
    return emit("mul", [y, gate], "out")
