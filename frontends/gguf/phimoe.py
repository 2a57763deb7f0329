"""llama.cpp's ``phimoe`` (Phi-3.5-MoE): its keys -> the ``Arch``
``frontends.hf.families_phimoe`` builds from a config.json (its decoder loop), its tensors ->
the same irc params.

Keys (``PhiMoeModel``, a ``Phi3MiniModel``): widths, heads, ``attention.layer_norm_rms_epsilon``
(the LayerNorms' eps, as transformers reads ``rms_norm_eps``), ``rope.freq_base``,
``attention.sliding_window`` (0: none; else every layer), ``expert_count``,
``expert_used_count`` (must be 2), LongRoPE from ``rope_factors_long/short.weight`` with
``rope.scaling.original_context_length`` and ``rope.scaling.attn_factor``
(``frontends.gguf.longrope``). Tensors: Phi-3's names (q, k, v apart, or one ``attn_qkv``
split by rows), biases where the file has them (``attn_*.bias``, the LayerNorms' ``.bias``,
``output.bias`` for the head's), the experts stacked ``ffn_{gate,up,down}_exps``.

Routing: llama.cpp routes Phi-MoE with a softmax top-2; irc computes the model's own
sparsemixer, as transformers does at inference (``irc.ops.moe``, scoring ``sparsemixer``: two
argmax rounds, each weight a softmax over the logits within 2 * jitter (relative) of that
round's maximum, not renormalised), so the graph is the HF frontend's.

What the file cannot say, so irc reads the released model's values: ``router_jitter_noise``
(the converter drops it): 0.01, Phi-3.5-MoE's and transformers' default. LongRoPE as
transformers' Phi-MoE computes it: always the short factors (``rope_factors_short``; its
rotary embedding never switches to the long ones), cos and sin times the file's
``attn_factor``. The converter writes that factor as LongRoPE's computed
sqrt(1 + ln(s) / ln(n)), not the checkpoint's ``short_mscale`` / ``long_mscale``, which it
drops: a file made from a model whose mscale differs from that value is read with the file's
factor (llama.cpp's result).
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Optional

from frontends.gguf.arch import Hparams, make_arch, read_dims, read_rope
from frontends.gguf.longrope import phi3_longrope
from frontends.gguf.reader import GGUFFile
from frontends.gguf.tensors import TensorSource
from frontends.hf.config import Arch, Attention, LayerSpec

JITTER = 0.01  # router_jitter_noise: transformers' default and Phi-3.5-MoE's config


def describe_phimoe(hp: Hparams, name: str) -> Arch:
    from frontends.hf.families_phimoe import _expand

    dims = read_dims(hp)
    n = dims["layers"]
    experts, top_k = hp.count("expert_count"), hp.count("expert_used_count")
    if top_k != 2:
        raise hp.error("expert_used_count", f"{top_k} is not supported: Phi-MoE's sparsemixer routes 2 experts")
    if experts < 2:
        raise hp.error("expert_count", f"sparsemixer routes 2 experts; {experts} is too few")
    if any(f"blk.{i}.ffn_gate_inp.weight" not in hp.gguf.tensors for i in range(n)):
        missing = next(i for i in range(n) if f"blk.{i}.ffn_gate_inp.weight" not in hp.gguf.tensors)
        raise hp.gguf.error(f"blk.{missing}.ffn_gate_inp.weight", "tensor is missing: every Phi-MoE layer is MoE")
    rope = phi3_longrope(hp, read_rope(hp, dims["head_dim"], scaled=False), dims["head_dim"])
    if rope.rotary_dim is not None:
        raise hp.error("rope.dimension_count", f"rotates {rope.rotary_dim} of {dims['head_dim']} dims: Phi-MoE's "
                                               "RoPE rotates the whole head")
    if rope.scaling is not None:  # transformers' Phi-MoE rotates by the short factors only
        rope = replace(rope, scaling={**rope.scaling, "long_factor": rope.scaling["short_factor"]})
    window = hp.count("attention.sliding_window", 0, minimum=0) or None
    moe = {"experts": experts, "top_k": 2, "d_ff": hp.count("feed_forward_length"), "scoring": "sparsemixer",
           "jitter_eps": JITTER, "norm_topk_prob": False}
    bias = "blk.0.attn_q.bias" in hp.gguf.tensors or "blk.0.attn_qkv.bias" in hp.gguf.tensors
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qkv_bias=bias)
    layers = [LayerSpec(window, rope, True) for _ in range(n)]
    return make_arch(hp, name, "phimoe", dims, attention, layers, None, moe=moe,
                     expand=partial(_expand, "output.bias" in hp.gguf.tensors))


BIASES = {"attn.bo": "attn_output.bias", "attn_norm.bias": "attn_norm.bias", "mlp_norm.bias": "ffn_norm.bias"}
TOP = {"norm.bias": "output_norm.bias", "lm_head.bias": "output.bias"}
QKV = {"attn.wq": ("weight", 0), "attn.wk": ("weight", 1), "attn.wv": ("weight", 2),
       "attn.bq": ("bias", 0), "attn.bk": ("bias", 1), "attn.bv": ("bias", 2)}


def source(arch: Arch, gguf: GGUFFile, param: str, block: Optional[str], suffix: Optional[str]):
    """The tensor behind ``param`` where Phi-MoE departs from ``frontends.gguf.tensors``
    (None: the common layout holds)."""
    if param in TOP:
        return TensorSource(TOP[param])
    if suffix in BIASES:
        return TensorSource(block + BIASES[suffix])
    if suffix in QKV and f"{block}attn_qkv.{QKV[suffix][0]}" in gguf.tensors:
        a = arch.attention
        q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
        kind, part = QKV[suffix]
        start = (0, q, q + kv)[part]
        return TensorSource(f"{block}attn_qkv.{kind}", rows=(start, start + (q, kv, kv)[part]))
    return None


FAMILIES = {"phimoe": describe_phimoe}
