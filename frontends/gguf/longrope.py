"""Phi-3's LongRoPE from a GGUF file, as llama.cpp's converter writes it
(``Phi3MiniModel``): ``rope_factors_long.weight`` and ``rope_factors_short.weight``
(float32 [rotary_dim / 2]), ``phi3.rope.scaling.original_context_length`` (n),
``phi3.rope.scaling.attn_factor`` (the cos/sin multiplier) and ``phi3.context_length``
(max_position_embeddings: the factor is context_length / n, as transformers derives it)."""
from __future__ import annotations

import numpy as np

from frontends.gguf.arch import Hparams
from frontends.hf.config import RopeSpec

TENSORS = {"long_factor": "rope_factors_long.weight", "short_factor": "rope_factors_short.weight"}


def phi3_longrope(hp: Hparams, rope: RopeSpec, head_dim: int) -> RopeSpec:
    """``rope`` with LongRoPE scaling when the file has the factor tensors (else as is)."""
    present = [name for name in TENSORS.values() if name in hp.gguf.tensors]
    if not present:
        return rope
    rotary = rope.rotary_dim or head_dim
    scaling = {"kind": "longrope"}
    for key, name in TENSORS.items():
        if name not in hp.gguf.tensors:
            raise hp.gguf.error(name, f"Phi-3's LongRoPE needs it beside {present[0]}")
        values = np.asarray(hp.gguf.tensors[name].data, dtype=np.float32).reshape(-1)
        if values.shape != (rotary // 2,):
            raise hp.gguf.error(name, f"has {values.size} entries; {rotary} rotary dims need {rotary // 2}")
        if not (np.isfinite(values).all() and (values > 0).all()):
            raise hp.gguf.error(name, "expected positive finite factors")
        scaling[key] = [float(v) for v in values]
    original = hp.count("rope.scaling.original_context_length")
    if original < 2:
        raise hp.error("rope.scaling.original_context_length", f"expected an integer above 1, got {original}")
    scaling["original_max_position"] = original
    scaling["factor"] = hp.count("context_length") / original
    if hp.has("rope.scaling.attn_factor"):
        scaling["attention_factor"] = hp.number("rope.scaling.attn_factor")
    return RopeSpec(rope.base, rope.convention, dict(sorted(scaling.items())), rope.rotary_dim)
