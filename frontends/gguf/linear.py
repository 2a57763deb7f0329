"""llama.cpp's short-convolution and gated-DeltaNet architectures: their keys -> the ``Arch``
that ``frontends.hf.families_lfm2`` and ``frontends.hf.families_delta`` build from a
config.json, their tensors -> the same irc params.

=========  =====================================================================================
lfm2       a short conv where ``attention.head_count_kv`` (one entry a layer) is 0, else GQA
           with q/k RMS norms and rotate-half RoPE (the converter does not permute), then a
           SwiGLU MLP of ``feed_forward_length`` (the converter writes LFM2's adjusted width);
           ``shortconv.l_cache`` taps; biases where ``shortconv.in_proj.bias`` is; the final
           norm is ``token_embd_norm`` (HF's ``embedding_norm``, applied after the last layer)
lfm2moe    LFM2's layers; from ``leading_dense_block_count`` on a MoE of ``expert_count``
           experts (``expert_gating_func`` must be sigmoid: 2): experts chosen on sigmoid(router)
           + ``exp_probs_b``, weighted by the unbiased sigmoids renormalised (llama.cpp always
           renormalises here), times ``expert_weights_scale`` where the file has it (the
           converter writes none: LFM2-MoE's routed_scaling_factor is 1)
qwen3next  a gated DeltaNet on layer i unless (i + 1) % ``full_attention_interval`` == 0
           (default 4, as llama.cpp), else the gated attention (``attn_q`` holds per head its
           query then its gate), partial RoPE on ``rope.dimension_count`` dims; a MoE
           (softmax top-k, ``expert_weights_norm`` default true, a shared expert behind a
           sigmoid gate) where the block has ``ffn_gate_inp``, else a SwiGLU MLP
qwen35,    Qwen3.5's layers with split projections; a SwiGLU MLP (qwen35) or a MoE on every
qwen35moe  layer (qwen35moe); ``rope.dimension_sections`` (multimodal RoPE: for text every
           section reads the same position) is set aside
=========  =====================================================================================

The delta-net shapes are llama.cpp's ``ssm.*`` keys, all required: ``ssm.group_count`` =
key heads, ``ssm.time_step_rank`` = value heads, ``ssm.state_size`` = the key head dim,
``ssm.inner_size`` = value heads x value head dim, ``ssm.conv_kernel``.

What the converter did (``Qwen3NextModel`` / ``_LinearAttentionVReorderBase.modify_tensors``),
undone on load:

- every norm but the gated one (``ssm_norm``) stored as 1 + w: irc's (1 + w) norms read w;
- ``ssm_a`` = -exp(A_log): log(-ssm_a) (``frontends.gguf.ssm.a_log_from_a``); ``dt_bias``
  is ``ssm_dt.bias``; the conv squeezed to [C, K]: read as [C, 1, K];
- Qwen3-Next's fused ``in_proj_qkvz`` (per key head q | k | v | z) regrouped into
  ``attn_qkv`` (all q | all k | all v) and ``attn_gate`` (z): irc reads them as the split
  projections; ``ssm_ba`` (per key head b | a) is as the checkpoint has it, and irc takes
  its b rows and its a rows apart (a row order: blocks kept). An older file with the fused
  ``ssm_in`` is read as the checkpoint's fused projection;
- Qwen3.5 with more value heads than key heads: the value heads reordered from grouped
  (by key head) to tiled (head i of every key head together), in attn_qkv's v rows,
  attn_gate, ssm_beta, ssm_alpha, ssm_a, ssm_dt, the conv's v channels and ssm_out's
  columns. Rows go back by a row order (blocks kept); ssm_out's columns are put back in
  float32 (a column order crosses blocks).

Lost by the converter: a ``layer_types`` list that is not every interval-th layer
attention (llama.cpp reads the interval alone); Qwen3-Next's multi-token-prediction head.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from frontends.gguf.arch import Hparams, head_size, make_arch, moe_layers, read_rope
from frontends.gguf.reader import GGUFFile
from frontends.gguf.ssm import a_log_from_a, attention_layers, has_tensor, size
from frontends.gguf.tensors import TensorSource
from frontends.hf.config import Arch, Attention, LayerSpec
from irc import limits
from irc.errors import SpecError

DELTA_ARCHS = ("qwen3next", "qwen35", "qwen35moe")


@dataclass(frozen=True)
class RowOrder(TensorSource):
    """A tensor whose first axis is read in ``order`` (stored row indices): a selection or
    permutation of whole rows, so block formats keep their blocks."""

    order: tuple = ()

    def logical_shape(self, gguf: GGUFFile) -> tuple:
        stored = self.stored_shape(gguf)
        if not stored or max(self.order) >= stored[0]:
            raise SpecError(f"tensor {self.name} {list(stored)} has no row {max(self.order)}", location=gguf.path)
        shape = (len(self.order), *stored[1:])
        if self.shape is not None:
            if int(np.prod(shape)) != int(np.prod(self.shape)):
                raise SpecError(f"tensor {self.name} {list(stored)} cannot be read as {list(self.shape)}",
                                location=gguf.path)
            shape = self.shape
        return tuple(shape)

    def _select(self, stored: np.ndarray, rows: Optional[tuple] = None) -> np.ndarray:
        order = np.asarray(self.order, dtype=np.int64)
        return stored[order if rows is None else order[rows[0]:rows[1]]]


# ---- lfm2 ----------------------------------------------------------------------------------

def describe_lfm2(hp: Hparams, name: str) -> Arch:
    """lfm2, lfm2moe: a short conv or attention, then a SwiGLU MLP or (lfm2moe, after the
    leading dense layers) a MoE, on every layer."""
    d, n = size(hp, "embedding_length"), size(hp, "block_count", limits.check_layers)
    heads = size(hp, "attention.head_count")
    attends, kv_heads = attention_layers(hp, n)
    head_dim = head_size(hp, d, heads, kv_heads)
    rope = read_rope(hp, head_dim)
    first_conv = next((i for i, attend in enumerate(attends) if not attend), 0)
    conv = {"kind": "short_conv", "conv_kernel": size(hp, "shortconv.l_cache"),
            "bias": has_tensor(hp, f"blk.{first_conv}.shortconv.in_proj.bias")}
    moe, moe_flags = _lfm2_moe(hp, n) if hp.arch == "lfm2moe" else (None, [False] * n)
    layers = [LayerSpec(None, rope, is_moe) if attend else LayerSpec(None, None, is_moe, mixer="short_conv")
              for attend, is_moe in zip(attends, moe_flags)]
    mlp = None if all(moe_flags) else {"kind": "swiglu", "d_ff": size(hp, "feed_forward_length")}
    return make_arch(hp, name, "lfm2_moe" if moe else "lfm2", {"d": d, "layers": n},
                     Attention("gqa", heads, kv_heads, head_dim, qk_norm=True), layers, mlp, moe=moe, ssm=conv)


def _lfm2_moe(hp: Hparams, n: int) -> tuple:
    """(``Layer.moe``'s arguments, which layers are MoE) of an lfm2moe file."""
    dense = hp.count("leading_dense_block_count", 0, minimum=0)
    flags = [i >= dense for i in range(n)]
    if not any(flags):
        return None, flags
    gating = hp.count("expert_gating_func", 2)
    if gating != 2:
        raise hp.error("expert_gating_func", f"{gating} is not sigmoid gating (2), which LFM2-MoE routes with")
    moe = {"experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count"),
           "d_ff": hp.count("expert_feed_forward_length"), "scoring": "sigmoid", "norm_topk_prob": True,
           "router_bias": has_tensor(hp, f"blk.{dense}.exp_probs_b.bias"),
           "routed_scale": hp.number("expert_weights_scale", 1.0, positive=False) or 1.0}
    if moe["top_k"] > moe["experts"]:
        raise hp.error("expert_used_count", f"top_k {moe['top_k']} exceeds {moe['experts']} experts")
    return moe, flags


# ---- qwen3next, qwen35, qwen35moe ----------------------------------------------------------

def delta_config(hp: Hparams, block: str) -> dict:
    """``Layer.gated_delta``'s arguments from the ssm.* keys; ``block`` is the first
    DeltaNet layer's, whose tensors say which projections the file holds."""
    key_heads, value_heads = size(hp, "ssm.group_count"), size(hp, "ssm.time_step_rank")
    inner = size(hp, "ssm.inner_size")
    if value_heads % key_heads:
        raise hp.error("ssm.time_step_rank", f"{value_heads} value heads are not a multiple of {key_heads} key "
                                             "heads (ssm.group_count)")
    if inner % value_heads:
        raise hp.error("ssm.inner_size", f"{inner} is not a whole number of {value_heads} value heads "
                                         "(ssm.time_step_rank)")
    fused = hp.arch == "qwen3next" and has_tensor(hp, f"{block}ssm_in.weight")
    return {"kind": "gated_delta", "key_heads": key_heads, "value_heads": value_heads,
            "key_dim": size(hp, "ssm.state_size"), "value_dim": inner // value_heads,
            "conv_kernel": size(hp, "ssm.conv_kernel"), "projections": "fused" if fused else "split",
            "norm_eps": hp.number("attention.layer_norm_rms_epsilon")}


def describe_delta(hp: Hparams, name: str) -> Arch:
    """qwen3next, qwen35, qwen35moe: a gated DeltaNet or gated attention, then a MoE or MLP."""
    from frontends.hf.families_delta import expand

    d, n = size(hp, "embedding_length"), size(hp, "block_count", limits.check_layers)
    heads = size(hp, "attention.head_count")
    kv_heads = hp.count("attention.head_count_kv", heads)
    head_dim = head_size(hp, d, heads, kv_heads)
    interval = hp.count("full_attention_interval", 4)
    attends = [(i + 1) % interval == 0 for i in range(n)]
    first_delta = next((i for i, attend in enumerate(attends) if not attend), 0)
    delta = delta_config(hp, f"blk.{first_delta}.")
    rope = read_rope(hp, head_dim) if any(attends) else None
    moe_flags = moe_layers(hp, n)
    moe = mlp = None
    if any(moe_flags):
        moe = {"experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count"),
               "d_ff": hp.count("expert_feed_forward_length"), "norm_topk_prob": hp.flag("expert_weights_norm", True),
               "shared_experts": 1, "shared_d_ff": hp.count("expert_shared_feed_forward_length"),
               "shared_expert_gate": True}
        if moe["top_k"] > moe["experts"]:
            raise hp.error("expert_used_count", f"top_k {moe['top_k']} exceeds {moe['experts']} experts")
    if not all(moe_flags):
        mlp = {"kind": "swiglu", "d_ff": size(hp, "feed_forward_length")}
    layers = [LayerSpec(None, rope if attend else None, is_moe, mixer="attention" if attend else "gated_delta")
              for attend, is_moe in zip(attends, moe_flags)]
    model_type = {"qwen3next": "qwen3_next", "qwen35": "qwen3_5_text", "qwen35moe": "qwen3_5_moe_text"}[hp.arch]
    return make_arch(hp, name, model_type, {"d": d, "layers": n},
                     Attention("gqa", heads, kv_heads, head_dim, qk_norm=True), layers, mlp, moe=moe, ssm=delta,
                     norm_offset=1.0, expand=expand)


# ---- tensors -------------------------------------------------------------------------------

LFM2 = {  # irc name under layers.{i}. -> GGUF name under blk.{i}.
    "ssm_norm": "attn_norm.weight", "ssm.conv": "shortconv.conv.weight", "ssm.conv_bias": "shortconv.conv.bias",
    "ssm.in_proj": "shortconv.in_proj.weight", "ssm.in_proj_bias": "shortconv.in_proj.bias",
    "ssm.out_proj": "shortconv.out_proj.weight", "ssm.out_proj_bias": "shortconv.out_proj.bias",
}
DELTA = {
    "ssm.in_proj_qkvz": "ssm_in.weight", "ssm.in_proj_ba": "ssm_ba.weight", "ssm.in_proj_qkv": "attn_qkv.weight",
    "ssm.in_proj_z": "attn_gate.weight", "ssm.in_proj_b": "ssm_beta.weight", "ssm.in_proj_a": "ssm_alpha.weight",
    "ssm.conv": "ssm_conv1d.weight", "ssm.A_log": "ssm_a", "ssm.dt_bias": "ssm_dt.bias",
    "ssm.norm": "ssm_norm.weight", "ssm.out_proj": "ssm_out.weight",
}
OFFSET_NORMS = ("attn_norm", "ssm_norm", "mlp_norm", "attn.q_norm", "attn.k_norm")  # stored as 1 + w


def source(arch: Arch, gguf: GGUFFile, param: str, block: Optional[str], suffix: Optional[str]):
    """The tensor behind ``param`` where these archs depart from ``frontends.gguf.tensors``
    (None: the common layout holds)."""
    if gguf.arch in ("lfm2", "lfm2moe"):
        if param == "norm":
            return TensorSource("token_embd_norm.weight")
        if suffix == "ssm.conv":
            return TensorSource(block + LFM2[suffix], shape=(arch.d_model, 1, arch.ssm["conv_kernel"]))
        return TensorSource(block + LFM2[suffix]) if suffix in LFM2 else None
    if param == "norm":
        return TensorSource("output_norm.weight", offset=1.0)
    if suffix in OFFSET_NORMS:
        stored = {"ssm_norm": "attn_norm.weight", "mlp_norm": "post_attention_norm.weight"}.get(suffix)
        return TensorSource(block + (stored or {"attn_norm": "attn_norm.weight", "attn.q_norm": "attn_q_norm.weight",
                                                "attn.k_norm": "attn_k_norm.weight"}[suffix]), offset=1.0)
    if suffix not in DELTA:
        return None
    return _delta_source(arch.ssm, gguf.arch, block + DELTA[suffix], suffix)


def _value_heads_order(delta: dict, width: int) -> np.ndarray:
    """Stored index of each of irc's (grouped) value-head rows of ``width``: head h = g·r + i
    (key head g) sits at i·K + g in the converter's tiled order."""
    key_heads, value_heads = delta["key_heads"], delta["value_heads"]
    group = value_heads // key_heads
    heads = np.arange(value_heads)
    stored = (heads % group) * key_heads + heads // group
    return (stored[:, None] * width + np.arange(width)).reshape(-1)


def _delta_source(delta: dict, gguf_arch: str, name: str, suffix: str):
    key_width = delta["key_heads"] * delta["key_dim"]
    value_dim, value_heads = delta["value_dim"], delta["value_heads"]
    channels = 2 * key_width + value_heads * value_dim
    if suffix == "ssm.in_proj_b" or suffix == "ssm.in_proj_a":
        if gguf_arch == "qwen3next":  # taken apart from ssm_ba: per key head b | a
            group = value_heads // delta["key_heads"]
            heads = np.arange(value_heads)
            order = (heads // group) * 2 * group + heads % group + (group if suffix == "ssm.in_proj_a" else 0)
            return RowOrder(name.replace(DELTA[suffix], DELTA["ssm.in_proj_ba"]), order=tuple(int(i) for i in order))
    tiled = gguf_arch != "qwen3next" and delta["key_heads"] != value_heads
    if not tiled:
        shape = (channels, 1, delta["conv_kernel"]) if suffix == "ssm.conv" else None
        return TensorSource(name, shape=shape, undo=a_log_from_a if suffix == "ssm.A_log" else None)
    heads = _value_heads_order(delta, 1)
    if suffix in ("ssm.in_proj_qkv", "ssm.conv"):
        order = np.concatenate([np.arange(2 * key_width), 2 * key_width + _value_heads_order(delta, value_dim)])
        shape = (channels, 1, delta["conv_kernel"]) if suffix == "ssm.conv" else None
        return RowOrder(name, shape=shape, order=tuple(int(i) for i in order))
    if suffix == "ssm.in_proj_z":
        return RowOrder(name, order=tuple(int(i) for i in _value_heads_order(delta, value_dim)))
    if suffix in ("ssm.in_proj_b", "ssm.in_proj_a", "ssm.dt_bias"):
        return RowOrder(name, order=tuple(int(i) for i in heads))
    if suffix == "ssm.A_log":
        return RowOrder(name, order=tuple(int(i) for i in heads), undo=a_log_from_a)
    if suffix == "ssm.out_proj":
        return TensorSource(name, undo=ColumnOrder(tuple(int(i) for i in _value_heads_order(delta, value_dim))))
    return TensorSource(name)


@dataclass(frozen=True)
class ColumnOrder:
    """An ``undo``: the columns of a float32 array put back in irc's order."""

    order: tuple

    def __call__(self, stored: np.ndarray, name: str, path: str) -> np.ndarray:
        if stored.shape[-1] != len(self.order):
            raise SpecError(f"tensor {name} has {stored.shape[-1]} columns, not {len(self.order)}", location=path)
        return stored[..., np.asarray(self.order, dtype=np.int64)]


FAMILIES = {"lfm2": describe_lfm2, "lfm2moe": describe_lfm2, **{arch: describe_delta for arch in DELTA_ARCHS}}
