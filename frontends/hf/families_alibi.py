"""The ALiBi decoders (``frontends.hf.families`` registers them): no position enters the
tokens, each attention adds its heads' slopes times key minus query index to the scores
(``irc.ops.alibi``); built by the classic loop (``families_classic.expand``, sequential form).

=================  ==========================================================================
bloom              BLOOM: ``word_embeddings_layernorm`` after the token lookup, pre-LayerNorm
                   layers (``input_layernorm``, ``post_attention_layernorm``, ``ln_f``) with
                   biases, the fused ``query_key_value`` whose rows hold per head q | k | v,
                   biases everywhere, GELU (tanh form), softmax scale head_dim^-0.5, the
                   paper's slopes (``bloom_slopes``), tied; names under ``transformer.`` or,
                   as the hub's checkpoints saved from ``BloomModel`` have them, without it
mpt                MPT: LayerNorms without bias (``norm_1``, ``norm_2``, ``norm_f``), the fused
                   ``Wqkv`` (q | k | v), no biases, ``attn_config.clip_qkv`` clamping q, k
                   and v, ``attn_config.softmax_scale``, a 4·d GELU MLP (``ffn``), MPT's
                   slopes (``mpt_slopes``, bias max 8), tied
=================  ==========================================================================

Falcon's ``alibi: true`` is ``families_classic``'s Falcon with these slopes.

Refused, naming config.json and the key: BLOOM's
``apply_residual_connection_post_layernorm``; the MPT settings transformers' MptForCausalLM
does not compute (so no checkpoint of them runs there either): ``attn_config.attn_type``
other than multihead, ``attn_config.qk_ln``, ``attn_config.prefix_lm``,
``attn_config.attn_uses_sequence_id``, ``attn_config.alibi`` false, an
``attn_config.alibi_bias_max`` other than 8, ``no_bias`` false,
``expansion_ratio`` other than 4 and a ``logit_scale``.
"""
from __future__ import annotations

from functools import partial

from frontends.hf.config import Arch, Attention, Config, LayerSpec, NestedConfig
from frontends.hf.families_classic import _base_model_resolve, _heads, _neox_rows, expand
from frontends.hf.weights import View
from irc.ops.alibi import bloom_slopes, mpt_slopes
from irc.yamlloc import boolean, layer_count, positive_int, positive_number

DEFAULTS = {  # transformers 5.24's config classes
    "bloom": {"vocab_size": 250880, "hidden_size": 64, "n_layer": 2, "n_head": 8, "layer_norm_epsilon": 1e-5,
              "apply_residual_connection_post_layernorm": False, "tie_word_embeddings": True},
    "mpt": {"d_model": 2048, "n_heads": 16, "n_layers": 24, "expansion_ratio": 4, "max_seq_len": 2048,
            "vocab_size": 50368, "layer_norm_epsilon": 1e-5, "attn_config": None, "logit_scale": None,
            "no_bias": True, "tie_word_embeddings": True},
}
MPT_ATTENTION = {"attn_type": "multihead_attention", "clip_qkv": None, "softmax_scale": None, "prefix_lm": False,
                 "qk_ln": False, "attn_uses_sequence_id": False, "alibi": True, "alibi_bias_max": 8}
MPT_FFN_RATIO = 4  # MptMLP's up_proj is 4·d whatever expansion_ratio says
MPT_BIAS_MAX = 8  # MptModel's slopes take build_mpt_alibi_tensor's default, not attn_config's


def _arch(cfg: Config, name: str, model_type: str, d: int, n: int, attention: Attention, mlp: dict,
          eps: float) -> Arch:
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=eps, attention=attention, layers=[LayerSpec(None, None)] * n,
                mlp=mlp, tied=cfg.get("tie_word_embeddings", boolean), checkpoint=model_type)
    arch.expand = partial(expand, "sequential")
    return arch


def _bloom(cfg: Config, name: str, model_type: str) -> Arch:
    d = cfg.get("hidden_size", positive_int)
    heads = _heads(cfg, d, "n_head")
    cfg.check("apply_residual_connection_post_layernorm", lambda v: not v,
              hint="irc builds BLOOM's residual from the layer's input, as every released BLOOM does")
    attention = Attention("gqa", heads, heads, d // heads, qkv_bias=True, alibi=tuple(bloom_slopes(heads).tolist()))
    mlp = {"kind": "gelu", "d_ff": 4 * d, "bias": True, "approximate": "tanh", "embed_norm": True}
    return _arch(cfg, name, model_type, d, cfg.get("n_layer", layer_count), attention, mlp,
                 cfg.get("layer_norm_epsilon", positive_number))


def _mpt_attention(cfg: Config) -> Config:
    """``attn_config`` as a config of its own (MptAttentionConfig's defaults when absent)."""
    if cfg.raw("attn_config") is None:
        return Config({}, cfg.path, cfg.text, MPT_ATTENTION)
    inner = NestedConfig(cfg, "attn_config", MPT_ATTENTION, "MPT's attention settings")
    return inner


def _mpt(cfg: Config, name: str, model_type: str) -> Arch:
    d = cfg.get("d_model", positive_int)
    heads = _heads(cfg, d, "n_heads")
    a = _mpt_attention(cfg)
    a.check("attn_type", lambda v: v == "multihead_attention",
            hint="transformers' MPT is multi-head: its Wqkv holds 3·d rows")
    for key, hint in (("qk_ln", "q/k LayerNorms"), ("prefix_lm", "a prefix-LM mask"),
                      ("attn_uses_sequence_id", "sequence-id masking")):
        a.check(key, lambda v: not v, hint=f"transformers' MptAttention has no {hint}")
    a.check("alibi", lambda v: v is not False, hint="transformers' MPT always adds ALiBi")
    cfg.check("no_bias", lambda v: v is not False, hint="transformers' MPT has no biases")
    cfg.check("expansion_ratio", lambda v: v == MPT_FFN_RATIO, hint="transformers' MptMLP is 4·d wide")
    cfg.check("logit_scale", lambda v: v is None, hint="transformers' MptForCausalLM does not scale its logits")
    a.check("alibi_bias_max", lambda v: v == MPT_BIAS_MAX,
            hint="transformers' MptModel builds its slopes with 8, whatever attn_config says")
    attention = Attention("gqa", heads, heads, d // heads, scale=a.get("softmax_scale", positive_number, None),
                          alibi=tuple(mpt_slopes(heads, MPT_BIAS_MAX).tolist()),
                          clip_qkv=a.get("clip_qkv", positive_number, None))
    mlp = {"kind": "gelu", "d_ff": MPT_FFN_RATIO * d, "bias": False, "approximate": "none", "norm_bias": False,
           "head_bias": False}
    return _arch(cfg, name, model_type, d, cfg.get("n_layers", layer_count), attention, mlp,
                 cfg.get("layer_norm_epsilon", positive_number))


def _mpt_rows(part: int):
    """Rows of q (0), k (1) or v (2) in MPT's ``Wqkv`` [3d, d]: q | k | v."""
    def source(arch: Arch, prefix: str) -> View:
        d = arch.d_model
        return View(f"{prefix}attn.Wqkv.weight", rows=range(part * d, (part + 1) * d))
    return source


_BLOOM_LN = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
LAYOUTS = {
    "bloom": {**{f"{k}{s}": f"{v}.{w}" for k, v in _BLOOM_LN.items() for s, w in (("", "weight"), (".bias", "bias"))},
              **{f"attn.w{x}": _neox_rows(i, "self_attention.query_key_value")("weight") for i, x in enumerate("qkv")},
              **{f"attn.b{x}": _neox_rows(i, "self_attention.query_key_value")("bias") for i, x in enumerate("qkv")},
              "attn.wo": "self_attention.dense.weight", "attn.bo": "self_attention.dense.bias",
              "mlp.w_up": "mlp.dense_h_to_4h.weight", "mlp.b_up": "mlp.dense_h_to_4h.bias",
              "mlp.w_down": "mlp.dense_4h_to_h.weight", "mlp.b_down": "mlp.dense_4h_to_h.bias",
              "_prefix": "transformer.h.", "_resolve": partial(_base_model_resolve, prefix="transformer."),
              "_top": {"embed": "transformer.word_embeddings.weight",
                       "embed_norm": "transformer.word_embeddings_layernorm.weight",
                       "embed_norm.bias": "transformer.word_embeddings_layernorm.bias",
                       "norm": "transformer.ln_f.weight", "norm.bias": "transformer.ln_f.bias"}},
    "mpt": {"attn_norm": "norm_1.weight", "mlp_norm": "norm_2.weight",
            **{f"attn.w{x}": _mpt_rows(i) for i, x in enumerate("qkv")},
            "attn.wo": "attn.out_proj.weight", "mlp.w_up": "ffn.up_proj.weight", "mlp.w_down": "ffn.down_proj.weight",
            "_prefix": "transformer.blocks.",
            "_top": {"embed": "transformer.wte.weight", "norm": "transformer.norm_f.weight"}},
}
FAMILIES = {"bloom": _bloom, "mpt": _mpt}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
