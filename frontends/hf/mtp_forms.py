"""Where each family's multi-token-prediction head lives in its checkpoint, and what config.json
says of it (``frontends.hf.mtp`` builds it): a form per family, ``FORMS[model_type](cfg, arch)``
-> ``MtpHead`` or None (no head declared).

The first MTP layer is built; further ones are left aside.

=============================  ==============================================================
deepseek_v3, glm4_moe          ``model.layers.{n}.`` (n = num_hidden_layers): ``enorm``, ``hnorm``,
                               ``eh_proj``, ``shared_head.norm`` and the block's own names;
                               ``num_nextn_predict_layers`` (or ``num_mtp_layers``); the copies of
                               the embedding and head there (``embed_tokens``, ``shared_head.head``)
                               are the decoder's and left aside, as transformers does
qwen3_next, qwen3_5_text,      ``mtp.``: ``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``, ``fc``,
qwen3_5_moe_text               ``norm`` and the block at ``mtp.layers.0.`` (a full-attention layer);
                               ``mtp_num_hidden_layers``
=============================  ==============================================================
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

from frontends.hf.config import Arch, Config, LayerSpec
from irc.yamlloc import non_negative_int


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


def _qwen(cfg: Config, arch: Arch) -> Optional[MtpHead]:
    layers = _count(cfg, "mtp_num_hidden_layers")
    if not layers:
        return None
    full = next((s for s in arch.layers if s.mixer == "attention"), None)
    if full is None:
        raise cfg.error("mtp_num_hidden_layers", "the MTP block is a full-attention layer, and this model has none")
    spec = dataclasses.replace(full, moe=arch.moe is not None, window=None)
    return MtpHead(layers, spec, False, {"mtp.enorm": "mtp.pre_fc_norm_embedding.weight",
                                         "mtp.hnorm": "mtp.pre_fc_norm_hidden.weight", "mtp.eh_proj": "mtp.fc.weight",
                                         "norm": "mtp.norm.weight"}, "mtp.layers.", 0)


FORMS = {"deepseek_v3": _deepseek, "glm4_moe": _deepseek,
         "qwen3_next": _qwen, "qwen3_5_text": _qwen, "qwen3_5_moe_text": _qwen}


def _count(cfg: Config, *keys: str) -> int:
    key = next((k for k in keys if cfg.has(k)), None)
    return 0 if key is None else cfg.get(key, non_negative_int) or 0


__all__ = ["FORMS", "MtpHead"]
