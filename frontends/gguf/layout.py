"""Which GGUF tensor holds each irc param, with what the converter did undone.

``Layout(gguf, arch).source(param)`` gives a ``frontends.gguf.tensors`` source for an irc
param name (``layers.3.attn.wq`` -> ``blk.3.attn_q.weight``, un-permuted for Llama,
granite, granitemoe, smollm3, granitehybrid and nemotron_h). The names and the converter's changes are listed in
``frontends.gguf.tensors`` (the state-space layers' in ``frontends.gguf.ssm``, the hybrids'
departures in ``frontends.gguf.hybrid``, LFM2's and the gated DeltaNets' in
``frontends.gguf.linear``, Kimi-Linear's in ``frontends.gguf.kimi``, Gemma-3n's and Gemma-4's
in ``frontends.gguf.gemma3n`` / ``gemma4``, Phi-MoE's in ``frontends.gguf.phimoe``); ``consumed`` names the
tensors the architecture itself reads (Llama 3's ``rope_freqs``, Phi-3's and Phi-MoE's LongRoPE factors).
"""
from __future__ import annotations

import re

from frontends.gguf import classic, families_2026, gemma3n, gemma4, hybrid, kimi, linear, phimoe, ssm
from frontends.gguf.longrope import TENSORS as LONGROPE_TENSORS
from frontends.gguf.reader import GGUFFile
from frontends.gguf.tensors import LAYER, TOP, KvFromHalves, TensorSource
from frontends.hf.config import Arch
from irc.errors import SpecError

LAYER_PARAM = re.compile(r"layers\.(\d+)\.(.+)")
PERMUTED = {"attn.wq": "heads", "attn.bq": "heads", "attn.wk": "kv_heads", "attn.bk": "kv_heads"}
PERMUTED_ARCHS = ("llama", "granite", "granitemoe", "smollm3", *hybrid.PERMUTED)  # whose Q/K rows the converter permuted (Llama's permute)


class Layout:
    """The GGUF source of each param of a graph built from ``arch``."""

    def __init__(self, gguf: GGUFFile, arch: Arch):
        self.gguf, self.arch = gguf, arch
        read = {"rope_freqs.weight", *(LONGROPE_TENSORS.values() if gguf.arch in ("phi3", "phimoe") else ())}
        shared_kv = gemma3n.consumed(gguf) if gguf.arch in ("gemma3n", "gemma4") else set()  # unread shared K/V
        self.consumed = read & set(gguf.tensors) | shared_kv | families_2026.consumed(gguf)

    def source(self, param: str):
        for module in (linear, classic, kimi, gemma3n, gemma4, phimoe, families_2026):
            if self.gguf.arch in module.FAMILIES:
                match = LAYER_PARAM.fullmatch(param)
                block, suffix = (f"blk.{match.group(1)}.", match.group(2)) if match else (None, None)
                found = module.source(self.arch, self.gguf, param, block, suffix)
                if found is not None:
                    return found
        if param in TOP:
            return TensorSource(TOP[param], offset=self._offset(param))
        match = LAYER_PARAM.fullmatch(param)
        suffix = match.group(2) if match else None
        departures = hybrid.LAYER.get(self.gguf.arch, {})
        if suffix in departures:
            return TensorSource(f"blk.{match.group(1)}.{departures[suffix]}")
        if suffix in ssm.LAYER:
            return ssm.source(self.arch, f"blk.{match.group(1)}.", suffix)
        if suffix not in LAYER:
            raise SpecError(f"no GGUF tensor is known for @{param} in the {self.gguf.arch} layout",
                            location=self.gguf.path)
        block = f"blk.{match.group(1)}."
        if self.gguf.arch == "phi3":
            fused = self._phi3(block, suffix)
            if fused is not None:
                return fused
        if suffix == "attn.kv_b" and block + LAYER[suffix] not in self.gguf.tensors \
                and block + "attn_k_b.weight" in self.gguf.tensors:
            return KvFromHalves(block + "attn_k_b.weight", block + "attn_v_b.weight")
        heads = None
        if self.gguf.arch in PERMUTED_ARCHS and suffix in PERMUTED:
            a = self.arch.attention
            heads = a.heads if PERMUTED[suffix] == "heads" else a.kv_heads
        shape = (1, self.arch.d_model) if suffix == "moe.shared_expert_gate" else None
        return TensorSource(block + LAYER[suffix], permute_heads=heads, offset=self._offset(suffix), shape=shape)

    def _offset(self, name: str) -> float:
        """Gemma stores its (1 + w) norm weights as 1 + w."""
        return self.arch.norm_offset if name.split(".")[-1].endswith("norm") else 0.0

    def _phi3(self, block: str, suffix: str):
        """Rows of Phi-3's fused ``attn_qkv`` and gate/up ``ffn_up`` (None: not fused)."""
        a = self.arch.attention
        if suffix in ("attn.wq", "attn.wk", "attn.wv") and block + "attn_qkv.weight" in self.gguf.tensors:
            q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
            rows = {"attn.wq": (0, q), "attn.wk": (q, q + kv), "attn.wv": (q + kv, q + 2 * kv)}[suffix]
            return TensorSource(block + "attn_qkv.weight", rows=rows)
        if suffix in ("mlp.w_gate", "mlp.w_up") and block + "ffn_gate.weight" not in self.gguf.tensors:
            d_ff = self.arch.mlp["d_ff"]
            rows = (0, d_ff) if suffix == "mlp.w_gate" else (d_ff, 2 * d_ff)
            return TensorSource(block + "ffn_up.weight", rows=rows)
        return None
