"""Cohere's parallel decoders and GLM-4 (``frontends.hf.families`` registers them).

=================  ==========================================================================
cohere             Command-R: one LayerNorm without bias (``layer_norm_eps``) feeding attention
                   and the SwiGLU MLP in parallel, x + attn(h) + mlp(h); interleaved RoPE
                   (Cohere's rotate pairs); logits times ``logit_scale``; tied
cohere2            Command-R7B / Command-A: Cohere's layers, ``layer_types`` (default three
                   sliding ``sliding_window`` layers to one full), RoPE on the sliding layers
                   only (the full ones are NoPE)
glm4               GLM-4: the shared decoder with norms after attention and MLP as well
                   (``post_self_attn_layernorm``, ``post_mlp_layernorm``), q/k/v biases
                   (``attention_bias``), interleaved RoPE on ``partial_rotary_factor`` of each
                   head, the fused ``gate_up_proj``
=================  ==========================================================================

``use_qk_norm`` (Command-R+): q and k LayerNorm-ed per head over ``head_dim`` (no bias, the
norm's ``layer_norm_eps``) with a weight per head, ``q_norm`` [H, D] and ``k_norm`` [K, D],
before RoPE (``Layer.attention(qk_norm="layer")``).

Refused, naming config.json and the key: ``attention_bias`` on Cohere, an activation other
than SiLU.
"""
from __future__ import annotations

from functools import partial

from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope
from frontends.hf.families_common import FULL, SLIDING, _arch, _dims, _layer_types, _no, _rope, _silu, _windows
from irc.yamlloc import boolean, positive_int, positive_number

_COHERE = {"layer_norm_eps": 1e-5, "tie_word_embeddings": True, "hidden_act": "silu", "max_position_embeddings": 8192,
           "attention_bias": False, "use_qk_norm": False, "logit_scale": 0.0625}
DEFAULTS = {  # transformers 5.24's config classes
    "cohere": dict(_COHERE),
    "cohere2": {**_COHERE, "sliding_window": 4096},
    "glm4": {"rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": True,
             "max_position_embeddings": 131072, "partial_rotary_factor": 0.5, "head_dim": 128},
}


def _cohere(cfg: Config, name: str, model_type: str) -> Arch:
    """Command-R and Command-R7B."""
    dims = _dims(cfg)
    n = dims["layers"]
    _silu(cfg)
    _no(cfg, "attention_bias")
    rope = _rope(cfg, dims["head_dim"], convention="interleaved")
    if model_type == "cohere2":
        pattern = cfg.data.get("sliding_window_pattern", 4)
        types = _layer_types(cfg, n, lambda i: SLIDING if (i + 1) % pattern else FULL)
        layers = [LayerSpec(window, rope if kind == SLIDING else None) for window, kind in zip(_windows(cfg, types),
                                                                                              types)]
    else:
        layers = [LayerSpec(None, rope)] * n
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"])
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=dims["d"], n_layers=n, norm_eps=cfg.get("layer_norm_eps", positive_number),
                attention=attention, layers=layers, mlp={"kind": "swiglu", "d_ff": cfg.get("intermediate_size",
                                                                                           positive_int)},
                tied=cfg.get("tie_word_embeddings", boolean), checkpoint="llama",
                logits_scale=cfg.get("logit_scale", positive_number, None))
    qk_norm = model_type == "cohere" and cfg.get("use_qk_norm", boolean)  # Cohere-2 has no such key
    arch.expand = partial(_expand, qk_norm="layer" if qk_norm else False)
    return arch


def _expand(arch: Arch, origin: str, qk_norm=False):
    """Cohere's decoder through the DSL: x + attn(h) + mlp(h), h = LayerNorm(x) (no bias)."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps = arch.attention, arch.norm_eps
    with m.at(origin):
        x = m.embed(m.input_ids())
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            rope = dsl_rope(spec.rope)
            h = layer.layer_norm(x, "attn_norm", eps, bias=False)
            y = layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=rope, window=spec.window,
                                qk_norm=qk_norm, qk_norm_eps=eps)
            f = layer.swiglu(h, d_ff=arch.mlp["d_ff"])
            x = x + m.add(y, f, f"{layer.prefix}branches")
        m.logits(m.layer_norm(x, "norm", eps, bias=False), tied=arch.tied, scale=arch.logits_scale)
    return m.graph


def _glm4(cfg: Config, name: str, model_type: str) -> Arch:
    """GLM-4: the shared decoder, sandwich norms, q/k/v biases, interleaved partial RoPE."""
    dims = _dims(cfg)
    _silu(cfg)
    rope = _rope(cfg, dims["head_dim"], convention="interleaved")
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"],
                          qkv_bias=cfg.get("attention_bias", boolean))
    return _arch(cfg, name, model_type, dims, attention, [LayerSpec(None, rope)] * dims["layers"],
                 {"kind": "swiglu", "d_ff": cfg.get("intermediate_size", positive_int)}, sandwich=True,
                 checkpoint="glm4")


def _gate_up(half: int):
    """GLM-4's fused ``gate_up_proj`` [2F, d]: the gate rows (0) or the up rows (1)."""
    def source(arch: Arch, prefix: str):
        from frontends.hf.weights import Rows

        d_ff = arch.mlp["d_ff"]
        return Rows(f"{prefix}mlp.gate_up_proj.weight", half * d_ff, (half + 1) * d_ff)
    return source


FAMILIES = {"cohere": _cohere, "cohere2": _cohere, "glm4": _glm4}
LAYOUTS = {"glm4": {"post_attn_norm": "post_self_attn_layernorm.weight", "post_mlp_norm": "post_mlp_layernorm.weight",
                    "mlp.w_gate": _gate_up(0), "mlp.w_up": _gate_up(1)}}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
