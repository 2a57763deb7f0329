"""llama.cpp's ``kimi-linear`` (Moonshot's Kimi-Linear): its keys -> the ``Arch``
``frontends.hf.families_kimi`` builds from a config.json, its tensors -> the same irc params.

A layer whose ``attention.head_count_kv`` entry is 0 is Kimi Delta Attention (the
converter's recurrent layers), any other MLA without RoPE; KDA has ``attention.head_count``
heads of ``kda.head_dim`` and a short conv of ``ssm.conv_kernel`` taps (llama.cpp gives KDA
and MLA one head count). MLA: ``attention.kv_lora_rank``, ``attention.q_lora_rank`` (absent:
a direct q), ``rope.dimension_count`` the key's shared (never rotated) part,
``attention.key_length_mla`` and ``attention.value_length_mla``; its q_a / kv_a norms have
eps 1e-6 as transformers builds them. From ``leading_dense_block_count`` on, DeepSeek-V3's
MoE: sigmoid scores (``expert_gating_func`` must be 2) with ``exp_probs_b``, groups where
``expert_group_count`` says, renormalised (llama.cpp always renormalises here; the
converter writes no flag), times ``expert_weights_scale``, plus ``expert_shared_count``
shared experts of ``expert_feed_forward_length`` each.

What the converter did (``KimiLinearModel.modify_tensors``), undone on load: the q, k and v
conv weights stored apart, each [1, C, 1, K] (or [1, C, K]): joined into irc's one conv
[3C, 1, K]; ``ssm_a`` = -exp(A_log) (``frontends.gguf.ssm.a_log_from_a``), stored
[1, 1, H, 1] or [1, H]; ``dt_bias`` is ``ssm_dt.bias``; ``kv_b`` split into ``attn_k_b``
(transposed per head) and ``attn_v_b`` (joined back by ``frontends.gguf.tensors``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from frontends.gguf.arch import Hparams, make_arch
from frontends.gguf.reader import GGUFFile
from frontends.gguf.ssm import a_log_from_a, attention_layers, size
from frontends.gguf.tensors import TensorSource
from frontends.hf.config import Arch, Attention, LayerSpec
from irc import limits
from irc.errors import SpecError


def describe_kimi(hp: Hparams, name: str) -> Arch:
    from frontends.hf.families_kimi import expand

    d, n = size(hp, "embedding_length"), size(hp, "block_count", limits.check_layers)
    heads = size(hp, "attention.head_count")
    attends, _ = attention_layers(hp, n)
    rope_dim = hp.count("rope.dimension_count")
    key_dim = hp.count("attention.key_length_mla")
    if key_dim <= rope_dim:
        raise hp.error("attention.key_length_mla", f"{key_dim} leaves no room beside {rope_dim} rope dims")
    mla = {"q_lora_rank": hp.count("attention.q_lora_rank", None), "kv_lora_rank": hp.count("attention.kv_lora_rank"),
           "qk_nope_head_dim": key_dim - rope_dim, "qk_rope_head_dim": rope_dim,
           "v_head_dim": hp.count("attention.value_length_mla")}
    kda = {"kind": "kimi_delta", "heads": heads, "head_dim": size(hp, "kda.head_dim"),
           "conv_kernel": size(hp, "ssm.conv_kernel"), "norm_eps": hp.number("attention.layer_norm_rms_epsilon")}
    dense = hp.count("leading_dense_block_count", 0, minimum=0)
    sparse = [i >= dense for i in range(n)]
    layers = [LayerSpec(None, None, is_moe, mixer="attention" if attend else "kimi_delta")
              for attend, is_moe in zip(attends, sparse)]
    mlp = {"kind": "swiglu", "d_ff": hp.count("feed_forward_length")} if not all(sparse) else None
    return make_arch(hp, name, "kimi_linear", {"d": d, "layers": n},
                     Attention("mla", heads, heads, key_dim, mla=mla), layers, mlp,
                     moe=_moe(hp) if any(sparse) else None, ssm=kda, expand=expand)


def _moe(hp: Hparams) -> dict:
    gating = hp.count("expert_gating_func")
    if gating != 2:
        raise hp.error("expert_gating_func", f"{gating} is not sigmoid gating (2), which Kimi-Linear routes with")
    experts, top_k = hp.count("expert_count"), hp.count("expert_used_count")
    if top_k > experts:
        raise hp.error("expert_used_count", f"top_k {top_k} exceeds {experts} experts")
    groups = hp.count("expert_group_count", 1)
    if experts % groups:
        raise hp.error("expert_group_count", f"{experts} experts do not split into {groups} groups")
    moe = {"experts": experts, "top_k": top_k, "d_ff": hp.count("expert_feed_forward_length"),
           "shared_experts": hp.count("expert_shared_count", 0, minimum=0),
           "routed_scale": hp.number("expert_weights_scale", 1.0), "scoring": "sigmoid", "router_bias": True,
           "norm_topk_prob": True, "groups": groups, "top_groups": hp.count("expert_group_used_count", groups),
           "group_score": "top2_sum"}
    if moe["top_groups"] > groups:
        raise hp.error("expert_group_used_count", f"{moe['top_groups']} exceeds {groups} groups")
    return moe


# ---- tensors -------------------------------------------------------------------------------

KDA = {  # irc name under layers.{i}. -> GGUF name under blk.{i}.
    "ssm_norm": "attn_norm.weight", "ssm.q_proj": "attn_q.weight", "ssm.k_proj": "attn_k.weight",
    "ssm.v_proj": "attn_v.weight", "ssm.o_proj": "attn_output.weight", "ssm.b_proj": "ssm_beta.weight",
    "ssm.f_a_proj": "ssm_f_a.weight", "ssm.f_b_proj": "ssm_f_b.weight", "ssm.g_a_proj": "ssm_g_a.weight",
    "ssm.g_b_proj": "ssm_g_b.weight", "ssm.o_norm": "ssm_norm.weight", "ssm.dt_bias": "ssm_dt.bias",
}


@dataclass(frozen=True)
class JoinedConv:
    """KDA's q, k and v conv weights, each stored [1, C, 1, K] or [1, C, K], as irc's one conv
    [3C, 1, K] (always in float: three tensors make one param)."""

    parts: tuple

    def names(self) -> list[str]:
        return list(self.parts)

    def _channels(self, gguf: GGUFFile, name: str) -> tuple:
        shape = gguf.tensor(name).shape
        squeezed = [s for s in shape if s != 1]
        if len(squeezed) != 2 or shape[-1] != squeezed[-1]:
            raise SpecError(f"tensor {name} {list(shape)} is not a [1, C, 1, K] conv weight", location=gguf.path)
        return tuple(squeezed)

    def logical_shape(self, gguf: GGUFFile) -> tuple:
        shapes = [self._channels(gguf, name) for name in self.parts]
        if len({s[1] for s in shapes}) != 1:
            raise SpecError(f"tensors {', '.join(self.parts)} have different conv widths {shapes}", location=gguf.path)
        return sum(s[0] for s in shapes), 1, shapes[0][1]

    def exact(self, gguf: GGUFFile) -> bool:
        return False

    def read_float(self, gguf: GGUFFile) -> np.ndarray:
        joined = [TensorSource(name).read_float(gguf).reshape(self._channels(gguf, name)) for name in self.parts]
        return np.ascontiguousarray(np.concatenate(joined)[:, None, :])

    def __repr__(self) -> str:
        return " + ".join(self.parts)


def source(arch: Arch, gguf: GGUFFile, param: str, block: Optional[str], suffix: Optional[str]):
    """The tensor behind ``param`` where Kimi-Linear departs from ``frontends.gguf.tensors``
    (None: the common layout holds)."""
    if suffix == "ssm.conv":
        return JoinedConv(tuple(f"{block}ssm_conv1d_{x}.weight" for x in "qkv"))
    if suffix == "ssm.A_log":
        return TensorSource(f"{block}ssm_a", shape=(1, 1, arch.ssm["heads"], 1), undo=a_log_from_a)
    if suffix in KDA:
        return TensorSource(block + KDA[suffix])
    return None


FAMILIES = {"kimi-linear": describe_kimi}
