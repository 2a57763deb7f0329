"""``quantize{mixed=...}``: which weights of a 4-bit quantization get 8 bits, a named recipe.

A 4-bit model loses most where few tensors carry much: the LM head (every logit) and, in
llama.cpp's k-quant mixes, the attention value and MLP down projections of some layers.
llama.cpp's ``Q4_K_M`` (``llama_tensor_get_type``) gives the output tensor Q6_K, and the
``attn_v`` / ``ffn_down`` tensors of the layers ``use_more_bits`` picks Q6_K too: the first
and last eighth of the layers and every third layer between,
``i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2``. MatMulNBits holds 4 or 8 bits, so here the
"more bits" are 8, in the same block layout.

Recipes (``RECIPES``):

- ``none``: every weight at the pass's ``bits``;
- ``q4_k_m``: 8 bits for an untied LM head, and for the value projection (``attn.wv``) and
  MLP down projections (``w_down``, MoE and shared ones alike) of the ``use_more_bits``
  layers; an embedding table tied to the head stays at 4 bits (8 bits on the shared table
  would double the bytes of the largest tensor of a small-vocabulary model, and more);
- ``q4_k_m_tied``: ``q4_k_m`` with a tied table+head at 8 bits as well (llama.cpp's own
  choice for a tied output).

Only a 4-bit quantization mixes: at ``bits=8`` every recipe is ``none``.

Measured (``benchmarks/int4_quality.py``, 32 prompts, 16 greedy tokens; issue 44): ``q4_k_m``
beside the uniform default (the builder's codes) lowers perplexity and raises top-1
agreement on SmolLM2-135M (1.07x the builder's bytes), Gemma-3-270M (1.04x the uniform
int4) and Qwen2.5-Coder-0.5B (0.57x the builder's, which keeps its table float; greedy 10 of
32 against the builder's 8), but greedy agreement stays 1 of 32 on SmolLM2 (the builder's 1)
and falls to 0 on Gemma-3 (1 uniform), so it is an option, not the default.
"""
from __future__ import annotations

import re
from typing import Optional

from irc.graph import Graph, Param

RECIPES = ("none", "q4_k_m", "q4_k_m_tied")
MORE_BITS = 8
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
VALUE = ("wv",)
DOWN = ("w_down", "shared_down")


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's ``use_more_bits(i_layer, n_layers)`` (integer division as in C)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def layer_of(name: str) -> Optional[int]:
    match = LAYER.search(name)
    return int(match.group(1)) if match else None


def is_head(param: Param) -> tuple:
    """(reads as the LM head, tied to the embedding table): a param named ``lm_head``, or an
    embedding table that a ``linear``/``dequant_linear`` reads too."""
    readers = {node.op for node in param.uses}
    if param.name.split(".")[-1] == "lm_head":
        return True, "embedding" in readers
    tied = "embedding" in readers and bool(readers & {"linear", "dequant_linear"})
    return tied, tied


def more_bits(graph: Graph, params: list, recipe: str, bits: int) -> dict:
    """{param name: why it takes ``MORE_BITS``} among ``params`` (the weights being quantized)
    under ``recipe``; empty for ``none`` or when ``bits`` is already 8."""
    if recipe == "none" or bits >= MORE_BITS:
        return {}
    chosen = {}
    for param in params:
        head, tied = is_head(param)
        if head and not tied:
            chosen[param.name] = "the LM head (llama.cpp's Q4_K_M: output at Q6_K)"
        elif head and recipe == "q4_k_m_tied":
            chosen[param.name] = "the embedding table tied to the LM head (llama.cpp's Q4_K_M: a tied output at Q6_K)"
    for kinds, what, gguf in ((VALUE, "value projection", "attn_v"), (DOWN, "MLP down projection", "ffn_down")):
        stacks: dict = {}  # each stack of layers (a text model, a vision tower) counted apart
        for param in params:
            match = LAYER.search(param.name)
            if match and param.name.split(".")[-1] in kinds:
                stacks.setdefault(param.name[:match.start()], {})[param.name] = int(match.group(1))
        for members in stacks.values():
            layers = sorted(set(members.values()))
            for name, i in members.items():
                if use_more_bits(layers.index(i), len(layers)):
                    chosen[name] = (f"{what}s of the first and last eighth of the {len(layers)} layers and every "
                                    f"third between (llama.cpp's Q4_K_M: {gguf} at Q6_K there)")
    return chosen


def wide_lines(wide: dict) -> list[str]:
    """The headline's lines on the 8-bit weights ``more_bits`` chose: one per reason, the
    weight named when alone, else the layers listed."""
    by_reason: dict = {}
    for name, reason in wide.items():
        by_reason.setdefault(reason, []).append(name)
    lines = []
    for reason, names in by_reason.items():
        layers = [layer_of(n) for n in names]
        label = f"@{names[0]}" if len(names) == 1 else \
            f"{len(names)} weights (layers {', '.join(map(str, layers))})" if None not in layers else \
            f"{len(names)} weights ({', '.join('@' + n for n in names)})"
        lines.append(f"  int{MORE_BITS}: {label}: {reason}")
    return lines


__all__ = ["RECIPES", "MORE_BITS", "use_more_bits", "layer_of", "is_head", "more_bits", "wide_lines"]
