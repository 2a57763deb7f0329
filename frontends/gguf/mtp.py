"""A GGUF file's multi-token-prediction (MTP) head: the same ``graph.parts["mtp"]`` the
Hugging Face frontend builds (``frontends.hf.mtp``), its weights read from the file.

llama.cpp's converters write a checkpoint's MTP layers as the last ``nextn_predict_layers``
of ``block_count`` blocks: block n (n = ``block_count`` - ``nextn_predict_layers``) holds the
layer's ordinary tensors under the family's names (``blk.{n}.attn_q.weight``, the experts...)
and the head's own as ``blk.{n}.nextn.eh_proj``, ``nextn.enorm``, ``nextn.hnorm`` and
``nextn.shared_head_norm`` (gguf-py ``MODEL_TENSOR.NEXTN_*``), with copies of the embedding and
the LM head (``nextn.embed_tokens``, ``nextn.shared_head_head``) that the head leaves aside,
as transformers does: its embedding and LM head are the decoder's (``token_embd``,
``output``). The first MTP layer is built; further ones are left aside.

=============  ===============================================================================
glm4moe        GLM-4.5 (``Glm4MoeModel``): block n is a decoder layer of the family, MoE where
               it has ``ffn_gate_inp``; the projection takes the embedding first
=============  ===============================================================================

Others whose converters keep nextn blocks are read as before, the blocks left aside
(``families_2026.consumed``): exaone-moe (K-EXAONE), qwen35 and qwen35moe in llama.cpp's
newer converters. deepseek2 files hold none (``DeepseekV2Model.skip_mtp``).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from frontends.gguf.arch import Hparams
from frontends.gguf.layout import LAYER_PARAM, Layout
from frontends.gguf.quantized import attach_weights
from frontends.gguf.reader import GGUFFile
from frontends.gguf.tensors import TensorSource
from frontends.hf.build import expand
from frontends.hf.config import Arch
from frontends.hf.mtp import HIDDEN, NEXT_HIDDEN, head_arch, return_hidden
from frontends.hf.mtp_forms import MtpHead
from irc.errors import SpecError
from irc.graph import Graph

NEXTN = ("glm4moe",)  # the architectures whose nextn blocks become the head
OWN = {"mtp.eh_proj": "nextn.eh_proj.weight", "mtp.enorm": "nextn.enorm.weight", "mtp.hnorm": "nextn.hnorm.weight",
       "norm": "nextn.shared_head_norm.weight"}  # the head's own params -> their names in block n


def read_head(gguf: GGUFFile, arch: Arch) -> None:
    """Set ``arch.mtp`` where the file holds the first nextn block of an architecture of ``NEXTN``."""
    if gguf.arch not in NEXTN:
        return
    hp = Hparams(gguf)
    layers = hp.count("nextn_predict_layers", 0, minimum=0)
    n = arch.n_layers
    if not layers or f"blk.{n}.{OWN['mtp.eh_proj']}" not in gguf.tensors:
        return
    moe = arch.moe is not None and f"blk.{n}.ffn_gate_inp.weight" in gguf.tensors
    spec = dataclasses.replace(arch.layers[-1], moe=moe, window=None)
    names = {param: f"blk.{n}.{name}" for param, name in OWN.items()}
    arch.mtp = MtpHead(layers, spec, False, names, "blk.", n)


class HeadLayout(Layout):
    """The GGUF source of each param of the head's graph: its own params by ``MtpHead.names``,
    its block's (``layers.0.*``) as block n's, the rest (embedding, LM head) as the decoder's."""

    def source(self, param: str):
        head = self.arch.mtp
        if param in head.names:
            return TensorSource(head.names[param], offset=self._offset(param))
        match = LAYER_PARAM.fullmatch(param)
        if match:
            param = f"layers.{head.index + int(match.group(1))}.{match.group(2)}"
        return super().source(param)


def build_head(gguf: GGUFFile, arch: Arch, attach: Optional[dict] = None) -> Graph:
    """The MTP graph of ``arch`` (``frontends.hf.mtp``'s), its params read from ``gguf`` with
    ``attach`` (``quantized.attach_weights``' flags; None: the structure alone)."""
    head = head_arch(arch, layout=arch.checkpoint)
    graph = expand(head, gguf.path)
    if not any(v.name == HIDDEN for v in graph.inputs):
        raise SpecError(f"{gguf.arch}: this family's decoder does not build an MTP head", location=gguf.path)
    return_hidden(graph, NEXT_HIDDEN)
    graph.meta["mtp"] = {"layers": arch.mtp.layers, "hidden_first": arch.mtp.hidden_first}
    notes = [] if attach is None else attach_weights(graph, head, gguf, layout=HeadLayout(gguf, head), **attach)
    graph.meta["gguf"] = {"architecture": gguf.arch, "notes": notes}
    return graph


__all__ = ["NEXTN", "HeadLayout", "build_head", "read_head"]
