"""Moonshot's Kimi-Linear (``kimi_linear``; ``frontends.hf.families`` registers it).

Each layer is x + mixer(input_layernorm(x)), then x + ffn(post_attention_layernorm(x)):

- the mixer by ``layer_types`` ("linear_attention" | "full_attention"); without it the
  checkpoint's ``linear_attn_config.kda_layers`` / ``full_attn_layers`` (1-indexed, every
  layer in exactly one), else every layer i > 0 with i % 4 == 0 full attention (transformers
  5.24's ``KimiLinearConfig``). A linear layer is Kimi Delta Attention (``Layer.kimi_delta``:
  ``linear_attn_config.num_heads`` heads of ``head_dim``, a short conv of
  ``short_conv_kernel_size`` taps; top-level ``linear_num_heads``, ``linear_head_dim``,
  ``linear_conv_kernel_dim`` where the dict leaves them out). A full layer is MLA without
  RoPE (``Layer.mla_attention(rope=False)``): the qk_rope_head_dim part of the key comes
  from kv_a, shared by the heads, never rotated; scale (nope + rope) ** -0.5; its q_a and
  kv_a norms have eps 1e-6 (transformers builds them with the default), every other norm
  ``rms_norm_eps``. No layer reads positions, so the graph takes no ``position_ids``.
- the feed-forward by ``mlp_layer_types`` ("dense" | "sparse"), else the first
  ``first_k_dense_replace`` (default 1) layers dense: a SwiGLU MLP of ``intermediate_size``,
  or DeepSeek-V3's MoE: sigmoid scores, top-k chosen on score + e_score_correction_bias
  within the best ``topk_group`` of ``num_expert_group`` groups (a group scores the sum of
  its top two), the chosen scores renormalised (``moe_renormalize``) and times
  ``routed_scaling_factor``, plus ``num_shared_experts`` shared experts of
  ``moe_intermediate_size`` each.

Config keys are read under both names transformers' ``attribute_map`` gives them (the
saved config.json writes the right-hand ones): num_local_experts / num_experts,
num_experts_per_tok / num_experts_per_token, norm_topk_prob / moe_renormalize, n_group /
num_expert_group, n_shared_experts / num_shared_experts. Defaults are transformers 5.24's.

Checkpoints: transformers loads two layouts and so does irc, tensor by tensor (``resolve``):
the original one (what ``save_pretrained`` writes too): ``self_attn.{q,k,v}_conv1d``,
``self_attn.f_a_proj`` / ``f_b_proj`` / ``dt_bias`` / ``A_log``, the feed-forward under
``block_sparse_moe.`` (or ``mlp.``) with per-expert ``experts.{e}.w1/w2/w3``; and the module
layout: ``self_attn.conv1d`` (q | k | v channels), ``self_attn.forget_gate.*``, ``mlp.*`` with
fused ``experts.gate_up_proj`` [E, 2·ff, d] and ``experts.down_proj`` [E, d, ff].

Refused, naming config.json and the key: a ``layer_types`` / ``mlp_layer_types`` entry of
another kind or a list whose length is not ``num_hidden_layers``, a ``linear_attn_config``
layer list naming a layer outside 1..num_hidden_layers or leaving one out, kv heads other
than the attention heads (transformers' MLA would repeat the expanded heads),
``attention_bias``, an activation other than SiLU, ``moe_layer_freq`` other than 1 and a
router activation other than sigmoid (transformers ignores both; Moonshot's code does not),
top-k above the experts, experts not splitting into the groups.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from frontends.hf.config import Arch, Attention, Config, LayerSpec, int_list, layer_types, string_list
from frontends.hf.families_ssm import Half
from frontends.hf.weights import Checkpoint, Source, Stack, Tensor
from irc.errors import SpecError
from irc.yamlloc import Bad, boolean, layer_count, non_negative_int, positive_int, positive_number, size

KDA, MLA = "linear_attention", "full_attention"
DENSE, SPARSE = "dense", "sparse"
MLA_NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm: KimiLinearRMSNorm's default eps
DEFAULTS = {"kimi_linear": {  # transformers 5.24's KimiLinearConfig
    "vocab_size": 163840, "hidden_size": 2304, "intermediate_size": 9216, "moe_intermediate_size": 1024,
    "num_hidden_layers": 27, "num_attention_heads": 32, "num_key_value_heads": 32, "routed_scaling_factor": 2.446,
    "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_group": 1, "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "attention_bias": False, "first_k_dense_replace": 1, "linear_head_dim": 128, "linear_num_heads": 32,
    "linear_conv_kernel_dim": 4, "moe_layer_freq": 1, "moe_router_activation_func": "sigmoid"}}
ALIASES = {  # transformers' name -> the name its attribute_map stores (and save_pretrained writes), default
    "num_local_experts": ("num_experts", 256), "num_experts_per_tok": ("num_experts_per_token", 8),
    "norm_topk_prob": ("moe_renormalize", True), "n_group": ("num_expert_group", 1),
    "n_shared_experts": ("num_shared_experts", 1)}
LINEAR = {"num_heads": "linear_num_heads", "head_dim": "linear_head_dim",
          "short_conv_kernel_size": "linear_conv_kernel_dim"}


def aliased(cfg: Config, name: str, kind):
    """(value, the key it was read from) of a key transformers maps onto another name."""
    stored, default = ALIASES[name]
    key = next((k for k in (stored, name) if k in cfg.data), stored)
    return cfg.get(key, kind, default), key


def linear_setting(cfg: Config, name: str) -> int:
    """``linear_attn_config.<name>``, else its top-level key (``LINEAR``)."""
    inner = cfg.data.get("linear_attn_config")
    if isinstance(inner, dict) and name in inner:
        try:
            return positive_int(inner[name])
        except Bad as err:
            raise cfg.error(f"linear_attn_config.{name}", str(err)) from None
    return cfg.get(LINEAR[name], positive_int)


def mixer_kinds(cfg: Config, n: int) -> list[str]:
    """Each layer's mixer kind, with transformers' precedence (see the module docstring)."""
    if cfg.has("layer_types"):
        return layer_types(cfg, n, (KDA, MLA), "Kimi-Linear's")
    inner = cfg.data.get("linear_attn_config")
    if inner is not None and not isinstance(inner, dict):
        raise cfg.error("linear_attn_config", "expected an object")
    if not (inner and "full_attn_layers" in inner and "kda_layers" in inner):
        return [MLA if i and i % 4 == 0 else KDA for i in range(n)]
    kinds: list[Optional[str]] = [None] * n
    for key, kind in (("full_attn_layers", MLA), ("kda_layers", KDA)):
        where = f"linear_attn_config.{key}"
        try:
            numbers = int_list(inner[key])
        except Bad as err:
            raise cfg.error(where, str(err)) from None
        for number in numbers:
            if not 1 <= number <= n:
                raise cfg.error(where, f"layer {number} is outside 1..{n} (1-indexed, num_hidden_layers {n})")
            kinds[number - 1] = kind
    if None in kinds:
        raise cfg.error("linear_attn_config", f"layer {kinds.index(None) + 1} (1-indexed) is in neither "
                                              "full_attn_layers nor kda_layers")
    return kinds


def ffn_kinds(cfg: Config, n: int) -> list[str]:
    """Each layer's feed-forward kind: ``mlp_layer_types``, else ``first_k_dense_replace``."""
    if not cfg.has("mlp_layer_types"):
        first = cfg.get("first_k_dense_replace", non_negative_int)
        return [DENSE if i < first else SPARSE for i in range(n)]
    types = cfg.get("mlp_layer_types", string_list)
    for kind in types:
        if kind not in (DENSE, SPARSE):
            raise cfg.unsupported("mlp_layer_types", kind, hint="Kimi-Linear's MLP kinds: dense, sparse")
    if len(types) != n:
        raise cfg.error("mlp_layer_types", f"has {len(types)} entries for {n} layers (num_hidden_layers)")
    return types


def _moe(cfg: Config) -> dict:
    """``Layer.moe``'s arguments (DeepSeek-V3's router)."""
    cfg.check("moe_layer_freq", lambda v: v == 1, hint="transformers ignores moe_layer_freq, Moonshot's code does "
                                                       "not; irc refuses to guess")
    cfg.check("moe_router_activation_func", lambda v: v == "sigmoid", hint="transformers routes on sigmoid scores")
    experts, experts_key = aliased(cfg, "num_local_experts", positive_int)
    top_k, top_k_key = aliased(cfg, "num_experts_per_tok", positive_int)
    groups, groups_key = aliased(cfg, "n_group", positive_int)
    top_groups = cfg.get("topk_group", positive_int)
    if top_k > experts:
        raise cfg.error(top_k_key, f"top_k {top_k} exceeds {experts} experts ({experts_key})")
    if experts % groups:
        raise cfg.error(groups_key, f"{experts} experts ({experts_key}) do not split into {groups} groups")
    if top_groups > groups:
        raise cfg.error("topk_group", f"topk_group {top_groups} exceeds {groups} groups ({groups_key})")
    return {"experts": experts, "top_k": top_k, "d_ff": cfg.get("moe_intermediate_size", positive_int),
            "shared_experts": aliased(cfg, "n_shared_experts", non_negative_int)[0],
            "routed_scale": cfg.get("routed_scaling_factor", positive_number), "scoring": "sigmoid",
            "router_bias": True, "norm_topk_prob": aliased(cfg, "norm_topk_prob", boolean)[0], "groups": groups,
            "top_groups": top_groups, "group_score": "top2_sum"}


def _kimi(cfg: Config, name: str, model_type: str) -> Arch:
    """Kimi-Linear: KDA and NoPE-MLA mixers, dense MLPs and DeepSeek-V3 MoE."""
    cfg.check("hidden_act", lambda v: v == "silu", hint="the MLPs, experts and the short convolution use SiLU")
    cfg.check("attention_bias", lambda v: not v, hint="irc's MLA has no projection biases")
    d, heads = cfg.get("hidden_size", size), cfg.get("num_attention_heads", size)
    if cfg.get("num_key_value_heads", size, heads) != heads:
        raise cfg.error("num_key_value_heads", f"{cfg.raw('num_key_value_heads')} kv heads for {heads} attention "
                                               "heads: Kimi-Linear's MLA expands its latent to every head")
    n = cfg.get("num_hidden_layers", layer_count)
    mixers, ffns = mixer_kinds(cfg, n), ffn_kinds(cfg, n)
    mla = {"q_lora_rank": cfg.get("q_lora_rank", positive_int, None),
           "kv_lora_rank": cfg.get("kv_lora_rank", positive_int),
           "qk_nope_head_dim": cfg.get("qk_nope_head_dim", positive_int),
           "qk_rope_head_dim": cfg.get("qk_rope_head_dim", positive_int),
           "v_head_dim": cfg.get("v_head_dim", positive_int)}
    kda = {"kind": "kimi_delta", "heads": linear_setting(cfg, "num_heads"),
           "head_dim": linear_setting(cfg, "head_dim"), "conv_kernel": linear_setting(cfg, "short_conv_kernel_size"),
           "norm_eps": cfg.get("rms_norm_eps", positive_number)}
    moe = _moe(cfg) if SPARSE in ffns else None
    layers = [LayerSpec(None, None, ffn == SPARSE, mixer="attention" if mixer == MLA else "kimi_delta")
              for mixer, ffn in zip(mixers, ffns)]
    mlp = {"kind": "swiglu", "d_ff": cfg.get("intermediate_size", positive_int)} if DENSE in ffns else None
    return Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("rms_norm_eps", positive_number),
                attention=Attention("mla", heads, heads, mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"], mla=mla),
                layers=layers, mlp=mlp, moe=moe, tied=cfg.get("tie_word_embeddings", boolean),
                checkpoint="kimi_linear", ssm=kda, expand=expand)


def expand(arch: Arch, origin: str):
    """The decoder of the module docstring through the DSL."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps, a = arch.norm_eps, arch.attention
    kda = {k: v for k, v in arch.ssm.items() if k != "kind"}
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            if spec.mixer == "attention":
                h = layer.mla_attention(layer.rms_norm(x, "attn_norm", eps), a.heads, rope=False, eps=MLA_NORM_EPS,
                                        **a.mla)
            else:
                h = layer.kimi_delta(layer.rms_norm(x, "ssm_norm", eps), **kda)
            x = x + h
            h = layer.rms_norm(x, "mlp_norm", eps)
            x = x + (layer.moe(h, **arch.moe) if spec.moe else layer.swiglu(h, d_ff=arch.mlp["d_ff"]))
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


FAMILIES = {"kimi_linear": _kimi}


# ---- checkpoint names ------------------------------------------------------------------------

class Joined(Source):
    """Tensors joined along their first axis (the q, k and v conv weights -> one conv)."""

    def __init__(self, parts: list[Tensor]):
        self.parts = parts

    def names(self) -> list[str]:
        return [p.name for p in self.parts]

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        shapes = [p.shape(checkpoint) for p in self.parts]
        for part, shape in zip(self.parts, shapes):
            if shape[1:] != shapes[0][1:]:
                raise SpecError(f"tensor {part.name} has shape {shape}, {self.parts[0].name} {shapes[0]}",
                                location=checkpoint.file(part.name))
        return [sum(s[0] for s in shapes)] + shapes[0][1:]

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        pieces, offset = [], 0
        for part in self.parts:
            count = part.shape(checkpoint)[0]
            first, last = max(start - offset, 0), min(stop - offset, count)
            if first < last:
                pieces.append(part.rows(checkpoint, first, last))
            offset += count
        return np.concatenate(pieces)

    def __repr__(self) -> str:
        return f"join({', '.join(self.names())})"


FFN = ("block_sparse_moe.", "mlp.")  # the original (and saved) prefix, then the module's
_EXPERT = {"gate": ("w1", 0), "up": ("w3", 1)}


def _ffn(name: str) -> list:
    return [lambda arch, p, f=f: Tensor(p + f + name) for f in FFN]


def _experts(part: str) -> list:
    """Per-expert w1/w3/w2 stacked, then the module layout's fused 3-D tensors."""
    w = _EXPERT[part][0] if part in _EXPERT else "w2"

    def stacked(arch, p, f):
        return Stack([Tensor(f"{p}{f}experts.{e}.{w}.weight") for e in range(arch.moe["experts"])])

    fused = [lambda arch, p, f=f: Half(f"{p}{f}experts.gate_up_proj", bool(_EXPERT[part][1])) for f in FFN] \
        if part in _EXPERT else [lambda arch, p, f=f: Tensor(f"{p}{f}experts.down_proj") for f in FFN]
    return [lambda arch, p, f=f: stacked(arch, p, f) for f in FFN] + fused


def _gate(name: str) -> list:
    """A forget-gate tensor: under self_attn (original) or self_attn.forget_gate (module)."""
    return [lambda arch, p, where=where: Tensor(f"{p}self_attn.{where}{name}") for where in ("", "forget_gate.")]


CANDIDATES = {  # irc name under layers.{i}. -> the checkpoint sources transformers would load, in order
    "ssm.conv": [lambda arch, p: Joined([Tensor(f"{p}self_attn.{x}_conv1d.weight") for x in "qkv"]),
                 lambda arch, p: Tensor(f"{p}self_attn.conv1d.weight")],
    **{f"ssm.{n}": _gate(f"{n}.weight") for n in ("f_a_proj", "f_b_proj")},
    "ssm.dt_bias": _gate("dt_bias"), "ssm.A_log": _gate("A_log"),
    **{f"mlp.w_{x}": _ffn(f"{x}_proj.weight") for x in ("gate", "up", "down")},
    "moe.router": _ffn("gate.weight"), "moe.router_bias": _ffn("gate.e_score_correction_bias"),
    **{f"moe.shared_{x}": _ffn(f"shared_experts.{x}_proj.weight") for x in ("gate", "up", "down")},
    **{f"moe.w_{x}": _experts(x) for x in ("gate", "up", "down")},
}


def resolve(arch: Arch, param: str, checkpoint: Checkpoint) -> Optional[Source]:
    """The first of ``param``'s candidate sources whose tensors the checkpoint holds (the
    first candidate when none is whole, so the error names what is missing); None for a
    param with one name (``LAYOUTS``)."""
    layer, _, suffix = param.partition(".")[2].partition(".")
    if not param.startswith("layers.") or suffix not in CANDIDATES:
        return None
    sources = [make(arch, f"model.layers.{layer}.") for make in CANDIDATES[suffix]]
    return next((s for s in sources if all(n in checkpoint.files for n in s.names())), sources[0])


LAYOUTS = {"kimi_linear": {
    **{norm: "input_layernorm.weight" for norm in ("attn_norm", "ssm_norm")},
    **{f"ssm.{n}": f"self_attn.{n}.weight" for n in ("q_proj", "k_proj", "v_proj", "b_proj", "g_a_proj",
                                                       "g_b_proj", "o_norm", "o_proj")},
    "_resolve": resolve}}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS", "mixer_kinds", "ffn_kinds", "resolve"]
