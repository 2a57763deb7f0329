"""Where each family's multi-token-prediction head lives in its checkpoint, and what config.json
says of it (``frontends.hf.mtp`` builds it): a form per family, ``FORMS[model_type](cfg, arch)``
-> ``MtpHead`` or None (no head declared).

The first MTP layer is built; further ones are left aside.

=============================  ==============================================================
deepseek_v3, glm4_moe,         ``model.layers.{n}.`` (n = num_hidden_layers): ``enorm``, ``hnorm``,
glm4_moe_lite, sarvam_mla,     ``eh_proj``, ``shared_head.norm`` and the block's own names (the
param2moe, sarvam_moe          family's: Bailing's fused ``attention.query_key_value`` for
                               param2moe / sarvam_moe); ``num_nextn_predict_layers`` (or
                               ``num_mtp_layers``); the block is the last layer's form with the MoE;
                               the copies of the embedding and head there (``embed_tokens``,
                               ``shared_head.head``) are the decoder's and left aside, as
                               transformers does
qwen3_next, qwen3_5_text,      ``mtp.``: ``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``, ``fc``,
qwen3_5_moe_text               ``norm`` and the block at ``mtp.layers.0.`` (a full-attention layer);
                               ``mtp_num_hidden_layers``
mellum                         Qwen3-Next's names; ``num_nextn_predict_layers``; the block's
                               attention by ``mtp_layer_types`` (default sliding: a sliding layer's
                               window and RoPE) and MLP by ``mtp_mlp_layer_types`` (default sparse)
ernie4_5_moe                   ``model.mtp_emb_norm.0``, ``model.mtp_hidden_norm.0``,
                               ``model.mtp_linear_proj.0``, the block at ``model.mtp_block.0.``; the
                               post norm is the decoder's own ``model.norm`` (transformers'
                               ``_keys_shared_with_mtp``); the block is layer 0 by the MoE layer rule
                               (sparse only with ``moe_layer_start_index`` 0 and interval 1);
                               ``num_nextn_predict_layers``
=============================  ==============================================================

Not here: Inkling (``inkling_text``) and Ling's ``bailing_hybrid``, whose decoders are built by
their own ``expand`` without ``build.embedded_inputs`` (the head's projected inputs have no way
in); K-EXAONE (``exaone_moe``, ``mtp.fc`` ...), whose head transformers 5.25 does not build
(no ``num_mtp_layers`` in its config) and whose block vLLM reads from keys irc does not;
Step-3.7 (``step3p7``), which irc does not read.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

from frontends.hf.config import Arch, Config, LayerSpec, string_list
from irc.yamlloc import non_negative_int, positive_int


@dataclass
class MtpHead:
    """What an ``Arch``'s MTP head holds: the block's ``LayerSpec``, whether the projection
    takes the hidden state first, the checkpoint names of its own params, and where its block's
    names start (``prefix`` and the layer index the graph's ``layers.0`` is there)."""
    layers: int
    spec: LayerSpec
    hidden_first: bool
    names: dict
    prefix: str
    index: int
    draft: Optional[Callable] = None  # on the head's own Arch: build.embedded_inputs calls it (projected_inputs)


def _deepseek(cfg: Config, arch: Arch) -> Optional[MtpHead]:
    layers = _count(cfg, "num_nextn_predict_layers", "num_mtp_layers")
    if not layers:
        return None
    n = arch.n_layers
    p = f"model.layers.{n}."
    spec = dataclasses.replace(arch.layers[-1], moe=arch.moe is not None, window=None)
    return MtpHead(layers, spec, False, {"mtp.enorm": p + "enorm.weight", "mtp.hnorm": p + "hnorm.weight",
                                         "mtp.eh_proj": p + "eh_proj.weight", "norm": p + "shared_head.norm.weight"},
                   "model.layers.", n)


def _fc_names(prefix: str) -> dict:
    """Qwen3-Next's names for the head's own params (Mellum's too), under ``prefix``."""
    return {"mtp.enorm": prefix + "pre_fc_norm_embedding.weight", "mtp.hnorm": prefix + "pre_fc_norm_hidden.weight",
            "mtp.eh_proj": prefix + "fc.weight", "norm": prefix + "norm.weight"}


def _qwen(cfg: Config, arch: Arch) -> Optional[MtpHead]:
    layers = _count(cfg, "mtp_num_hidden_layers")
    if not layers:
        return None
    full = next((s for s in arch.layers if s.mixer == "attention"), None)
    if full is None:
        raise cfg.error("mtp_num_hidden_layers", "the MTP block is a full-attention layer, and this model has none")
    spec = dataclasses.replace(full, moe=arch.moe is not None, window=None)
    return MtpHead(layers, spec, False, _fc_names("mtp."), "mtp.layers.", 0)


def _mellum(cfg: Config, arch: Arch) -> Optional[MtpHead]:
    """Mellum: Qwen3-Next's names; the block's attention and MLP kinds by ``mtp_layer_types``
    (default sliding) and ``mtp_mlp_layer_types`` (default sparse), as MellumConfig says."""
    layers = _count(cfg, "num_nextn_predict_layers", "num_mtp_layers")
    if not layers:
        return None
    kind = _first(cfg, "mtp_layer_types", "sliding_attention", ("sliding_attention", "full_attention"))
    sliding = kind == "sliding_attention"
    like = next((s for s in arch.layers if (s.window is not None) == sliding), None)
    if like is None:
        raise cfg.error("mtp_layer_types", f"the MTP block is a {kind} layer, and this model has none")
    moe = _first(cfg, "mtp_mlp_layer_types", "sparse", ("dense", "sparse")) == "sparse"
    return MtpHead(layers, _block(cfg, arch, like, moe, "mtp_mlp_layer_types"), False, _fc_names("mtp."),
                   "mtp.layers.", 0)


def _ernie(cfg: Config, arch: Arch) -> Optional[MtpHead]:
    """ERNIE-4.5 MoE: ``model.mtp_*.0``; the post norm is the decoder's final norm; the block is
    layer 0 by the MoE layer rule (transformers builds it with layer_idx 0)."""
    layers = _count(cfg, "num_nextn_predict_layers", "num_mtp_layers")
    if not layers:
        return None
    start, interval = cfg.get("moe_layer_start_index", non_negative_int), cfg.get("moe_layer_interval", positive_int)
    moe = interval == 1 and start == 0  # (0 + 1) % interval == 0 and start <= 0 <= end
    names = {"mtp.enorm": "model.mtp_emb_norm.0.weight", "mtp.hnorm": "model.mtp_hidden_norm.0.weight",
             "mtp.eh_proj": "model.mtp_linear_proj.0.weight", "norm": "model.norm.weight"}
    return MtpHead(layers, _block(cfg, arch, arch.layers[0], moe, "moe_layer_start_index"), False, names,
                   "model.mtp_block.", 0)


FORMS = {"deepseek_v3": _deepseek, "glm4_moe": _deepseek, "glm4_moe_lite": _deepseek, "sarvam_mla": _deepseek,
         "param2moe": _deepseek, "sarvam_moe": _deepseek, "mellum": _mellum, "ernie4_5_moe": _ernie,
         "qwen3_next": _qwen, "qwen3_5_text": _qwen, "qwen3_5_moe_text": _qwen}


def _count(cfg: Config, *keys: str) -> int:
    key = next((k for k in keys if cfg.has(k)), None)
    return 0 if key is None else cfg.get(key, non_negative_int) or 0


def _first(cfg: Config, key: str, default: str, kinds: tuple) -> str:
    """The first MTP layer's entry of ``key`` (a list, one per MTP layer), one of ``kinds``."""
    kind = (cfg.get(key, string_list) if cfg.has(key) else [default])[0]
    if kind not in kinds:
        raise cfg.unsupported(key, kind, hint=f"kinds: {', '.join(kinds)}")
    return kind


def _block(cfg: Config, arch: Arch, like: LayerSpec, moe: bool, key: str) -> LayerSpec:
    """``like`` with the MLP kind ``moe``, where the decoder has that kind's weights' shape."""
    if (arch.moe if moe else arch.mlp) is None:
        raise cfg.error(key, f"the MTP block is {'sparse' if moe else 'dense'}, and this model has no such layer")
    return dataclasses.replace(like, moe=moe)


__all__ = ["FORMS", "MtpHead"]
