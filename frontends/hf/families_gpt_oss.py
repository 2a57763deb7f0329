"""OpenAI's GPT-OSS (``model_type`` gpt_oss: gpt-oss-20b, gpt-oss-120b), built by its own loop
through the DSL (``Arch.expand``); ``frontends.hf.families`` registers it.

- Attention: GQA with biases on q, k, v and o (``attention_bias``, default true), a learned
  sink logit per query head in every softmax denominator (``self_attn.sinks`` [H]:
  ``irc.ops.attention``), layers alternating sliding (``sliding_window``, 128) and full by
  ``layer_types`` (default: even layers sliding), one YaRN RoPE for all layers
  (``rope_parameters``; default factor 32 over 4096 positions, beta 32/1, ``truncate``
  false, theta 150000), rotate-half.
- MoE on every layer: the router is a Linear with bias; top-k of its logits, softmax over
  the k (the op's softmax + renormalisation, with the bias on the logits); experts with
  biases and GPT-OSS's clamped SwiGLU (``swiglu_alpha`` 1.702, ``swiglu_limit`` 7:
  ``irc.ops.moe``'s ``swiglu_oai``). transformers ignores ``hidden_act`` here, and so does irc.

Weights (what ``save_pretrained`` writes, the in-memory names): ``mlp.router.{weight,bias}``,
``mlp.experts.gate_up_proj`` [E, d, 2F] with gate and up interleaved in the last axis (gate
= [..., ::2], up = [..., 1::2]) and ``gate_up_proj_bias`` [E, 2F] likewise,
``mlp.experts.down_proj`` [E, F, d] and ``down_proj_bias`` [E, d]; ``ExpertPart`` reads
each half, transposed to irc's [E, out, in], an expert block of rows at a time.

Refused, naming config.json and the key: ``layer_types`` of the wrong length or with a kind
other than sliding_attention / full_attention, ``num_experts_per_tok`` above the expert
count, a non-positive ``swiglu_limit`` / ``swiglu_alpha``, per-layer-type RoPE. The released
checkpoints are MXFP4-quantized (``quantization_config``): their weights are refused when
loaded (``frontends.hf.load_hf``), their structure compiles (``weights=False``).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from frontends.hf.config import Arch, Attention, Config, LayerSpec, read_rope, rope_dict, dsl_rope
from frontends.hf.families_common import FULL, SLIDING, _arch, _dims, _experts, _layer_types, _windows
from frontends.hf.weights import Checkpoint, Tensor
from irc.errors import SpecError
from irc.yamlloc import boolean, positive_int, positive_number

ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 4096}
DEFAULTS = {"gpt_oss": {  # transformers 5.24's GptOssConfig
    "num_hidden_layers": 36, "num_local_experts": 128, "vocab_size": 201088, "hidden_size": 2880,
    "intermediate_size": 2880, "head_dim": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
    "sliding_window": 128, "tie_word_embeddings": False, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 150000.0, "num_experts_per_tok": 4, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
    "attention_bias": True}}


def _gpt_oss(cfg: Config, name: str, model_type: str) -> Arch:
    dims = _dims(cfg)
    n = dims["layers"]
    types = _layer_types(cfg, n, lambda i: SLIDING if (i + 1) % 2 else FULL)
    params, key = rope_dict(cfg)
    if not params:  # transformers' default when the config gives none
        params, key = dict(ROPE), "rope_parameters"
    rope = read_rope(cfg, dims["head_dim"], params, key, default_base=cfg.defaults["rope_theta"], convention="half",
                     original_max=cfg.get("max_position_embeddings", positive_int, None))
    layers = [LayerSpec(window, rope, moe=True) for window in _windows(cfg, types)]
    experts = _experts(cfg, "num_local_experts", "num_experts")
    top_k = cfg.get("num_experts_per_tok", positive_int)
    if top_k > experts:
        raise cfg.error("num_experts_per_tok", f"top_k {top_k} exceeds {experts} experts (num_local_experts)")
    moe = {"experts": experts, "top_k": top_k, "d_ff": cfg.get("intermediate_size", positive_int),
           "norm_topk_prob": True, "activation": "swiglu_oai", "router_logit_bias": True, "expert_bias": True,
           "swiglu_alpha": cfg.get("swiglu_alpha", positive_number),
           "swiglu_limit": cfg.get("swiglu_limit", positive_number)}
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"],
                          qkv_bias=cfg.get("attention_bias", boolean))
    arch = _arch(cfg, name, model_type, dims, attention, layers, None, moe=moe, checkpoint="gpt_oss")
    arch.expand = _expand
    return arch


def _expand(arch: Arch, origin: str):
    """Pre-norm decoder: x + attention(rms_norm(x)) with sinks, x + moe(rms_norm(x))."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps = arch.attention, arch.norm_eps
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            rope = dsl_rope(spec.rope)
            x = x + layer.attention(layer.rms_norm(x, "attn_norm", eps), a.heads, kv_heads=a.kv_heads,
                                    head_dim=a.head_dim, rope=rope, window=spec.window, qkv_bias=a.qkv_bias,
                                    out_bias=a.qkv_bias, sinks=True)
            x = x + layer.moe(layer.rms_norm(x, "mlp_norm", eps), **arch.moe)
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


class ExpertPart(Tensor):
    """One half of a fused expert tensor, as irc's param: stored [E, in, 2F] (gate and up
    interleaved in the last axis) or [E, 2F] (their biases), or [E, F, d] whole; ``half`` 0
    takes [..., ::2] (gate), 1 takes [..., 1::2] (up), None all of it; ``transpose`` swaps the
    last two axes ([E, in, out] -> [E, out, in]). Rows are experts: a block of experts is
    read at a time."""

    def __init__(self, name: str, half: Optional[int], transpose: bool):
        super().__init__(name)
        self.half, self.transpose = half, transpose

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        stored = list(checkpoint.info(self.name)[1])
        if len(stored) != (3 if self.transpose else 2) or (self.half is not None and stored[-1] % 2):
            form = "[E, in, 2F]" if self.half is not None and self.transpose else "[E, F, d]" if self.transpose \
                else "[E, 2F]"
            raise SpecError(f"tensor {self.name} {stored} is not a {form} expert tensor",
                            location=checkpoint.file(self.name))
        if self.half is not None:
            stored[-1] //= 2
        return stored[:1] + stored[1:][::-1] if self.transpose else stored

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        self.shape(checkpoint)
        data = checkpoint.read(self.name, start, stop)
        if self.half is not None:
            data = data[..., self.half::2]
        return np.ascontiguousarray(data.transpose(0, 2, 1) if self.transpose else data)

    def __repr__(self) -> str:
        part = {None: "", 0: ", gate half", 1: ", up half"}[self.half]
        return f"{self.name}[experts{part}{', transposed' if self.transpose else ''}]"


def _part(name: str, half: Optional[int], transpose: bool):
    def source(arch: Arch, prefix: str) -> ExpertPart:
        return ExpertPart(prefix + name, half, transpose)
    return source


FAMILIES = {"gpt_oss": _gpt_oss}
LAYOUTS = {"gpt_oss": {
    "attn.bo": "self_attn.o_proj.bias", "attn.sinks": "self_attn.sinks",
    "moe.router": "mlp.router.weight", "moe.router_logit_bias": "mlp.router.bias",
    "moe.w_gate": _part("mlp.experts.gate_up_proj", 0, True), "moe.w_up": _part("mlp.experts.gate_up_proj", 1, True),
    "moe.b_gate": _part("mlp.experts.gate_up_proj_bias", 0, False),
    "moe.b_up": _part("mlp.experts.gate_up_proj_bias", 1, False),
    "moe.w_down": _part("mlp.experts.down_proj", None, True), "moe.b_down": "mlp.experts.down_proj_bias",
}}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
