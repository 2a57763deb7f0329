"""XGLM (``frontends.hf.families`` registers it), built by its own loop through the DSL.

=================  ==========================================================================
xglm               XGLM (transformers' ``XGLMForCausalLM``): fairseq's sinusoidal positions,
                   computed, not stored (``irc.ops.positions``: row = position + 2, sines |
                   cosines, the row ``pad_token_id`` zeros), added to the token embeddings
                   scaled by √d_model (``scale_embedding``); BART-like pre-LayerNorm decoder
                   layers (``self_attn_layer_norm``, ``final_layer_norm``, eps 1e-5, the
                   decoder's ``layer_norm``), q/k/v/``out_proj`` and ``fc1``/``fc2`` with
                   biases, softmax scale head_dim^-0.5, GELU (or ReLU / a GELU form:
                   ``activation_function``), tied by default
=================  ==========================================================================

transformers reads the positions it is given: ``XGLMModel`` counts 0, 1, ... from the cache
length when ``position_ids`` is absent, and ``generate`` passes the attention mask's
``cumsum − 1``, as irc's ``position_ids`` input is fed, so a left-padded batch is exact.
Refused, naming config.json and the key: ``add_cross_attention`` (the decoder of an
encoder-decoder model), a negative ``pad_token_id`` (transformers zeros a row counted from the
end of a table that grows), an activation other than ReLU and GELU's forms.
"""
from __future__ import annotations

import math
from functools import partial

from frontends.hf.families_common import embedded_inputs
from frontends.hf.config import Arch, Attention, Config, LayerSpec
from frontends.hf.families_classic import GELU, _base_model_resolve
from irc.yamlloc import boolean, layer_count, positive_int

DEFAULTS = {  # transformers 5.25's XGLMConfig
    "xglm": {"vocab_size": 256008, "max_position_embeddings": 2048, "d_model": 1024, "ffn_dim": 4096,
             "num_layers": 24, "attention_heads": 16, "activation_function": "gelu", "scale_embedding": True,
             "pad_token_id": 1, "add_cross_attention": False, "tie_word_embeddings": True},
}
XGLM_POSITION_OFFSET = 2  # XGLMSinusoidalPositionalEmbedding.offset
XGLM_LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default; XGLMConfig has no key for it


def _mapped(cfg: Config, key: str, alias: str) -> str:
    """The key a config.json gives: XGLMConfig's ``attribute_map`` reads ``hidden_size`` and
    friends as its own keys."""
    return alias if alias in cfg.data and key not in cfg.data else key


def _xglm(cfg: Config, name: str, model_type: str) -> Arch:
    d_key, heads_key = _mapped(cfg, "d_model", "hidden_size"), _mapped(cfg, "attention_heads", "num_attention_heads")
    d, heads = cfg.get(d_key, positive_int), cfg.get(heads_key, positive_int)
    n = cfg.get(_mapped(cfg, "num_layers", "num_hidden_layers"), layer_count)
    if d % heads:
        raise cfg.error(heads_key, f"hidden size {d} is not divisible by {heads} heads")
    if d < 4:
        raise cfg.error(d_key, f"{d} is too small for the sinusoidal positions (at least 4)")
    cfg.check("add_cross_attention", lambda v: not v,
              hint="XGLM's cross-attention (the decoder of an encoder-decoder model) is not supported")
    pad = cfg.raw("pad_token_id")
    if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or pad < 0):
        raise cfg.unsupported("pad_token_id", pad, hint="the zeroed position row is a non-negative row index "
                                                        "(or null: none)")
    activation = cfg.raw("activation_function")
    if activation != "relu" and (not isinstance(activation, str) or activation not in GELU):
        raise cfg.unsupported("activation_function", activation, hint=f"XGLM's MLP here: relu, {', '.join(GELU)}")
    mlp = {"kind": "relu"} if activation == "relu" else {"kind": "gelu", "approximate": GELU[activation]}
    mlp.update(d_ff=cfg.get("ffn_dim", positive_int), bias=True, padding_idx=pad)
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=XGLM_LAYER_NORM_EPS,
                attention=Attention("gqa", heads, heads, d // heads, qkv_bias=True),
                layers=[LayerSpec(None, None)] * n, mlp=mlp, tied=cfg.get("tie_word_embeddings", boolean),
                checkpoint="xglm", embedding_scale=math.sqrt(d) if cfg.get("scale_embedding", boolean) else None)
    arch.expand = expand
    return arch


def expand(arch: Arch, origin: str):
    """The decoder through the DSL: x = embed·scale + sinusoidal positions; per layer
    x + attn(ln1(x)), x + mlp(ln2(x)); the final LayerNorm and the (tied) head."""
    from frontends.dsl import Model
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps, mlp = arch.attention, arch.norm_eps, arch.mlp
    with m.at(origin):
        x = m.sinusoidal_positions(embedded_inputs(m, arch), offset=XGLM_POSITION_OFFSET,
                                   padding_idx=mlp["padding_idx"])
        for layer in m.layers(arch.n_layers):
            h = layer.layer_norm(x, "attn_norm", eps)
            x = x + layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, qkv_bias=True,
                                    out_bias=True)
            h = layer.layer_norm(x, "mlp_norm", eps)
            if mlp["kind"] == "relu":
                x = x + layer.relu_mlp(h, d_ff=mlp["d_ff"], bias=True)
            else:
                x = x + layer.gelu_mlp(h, d_ff=mlp["d_ff"], bias=True, approximate=mlp["approximate"])
        m.logits(m.layer_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


_LN = {"attn_norm": "self_attn_layer_norm", "mlp_norm": "final_layer_norm"}
LAYOUTS = {"xglm": {
    **{f"{k}{s}": f"{v}.{w}" for k, v in _LN.items() for s, w in (("", "weight"), (".bias", "bias"))},
    **{f"attn.{w}{x}": f"self_attn.{x}_proj.{n}" for x in "qkv" for w, n in (("w", "weight"), ("b", "bias"))},
    "attn.wo": "self_attn.out_proj.weight", "attn.bo": "self_attn.out_proj.bias",
    "mlp.w_up": "fc1.weight", "mlp.b_up": "fc1.bias", "mlp.w_down": "fc2.weight", "mlp.b_down": "fc2.bias",
    "_prefix": "model.layers.", "_resolve": partial(_base_model_resolve, prefix="model."),
    "_top": {"embed": "model.embed_tokens.weight", "norm": "model.layer_norm.weight",
             "norm.bias": "model.layer_norm.bias", "lm_head": "lm_head.weight"}}}
FAMILIES = {"xglm": _xglm}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
