"""RecurrentGemma / Griffin (``frontends.hf.families`` dispatches here), built by its own loop
through the DSL (``expand``, set as ``Arch.expand``; the recurrent block is
``frontends.dsl_rglru``'s):

===============  =============================================================================
recurrent_gemma  transformers' ``RecurrentGemmaForCausalLM``: embeddings times sqrt(d) (rounded
                 to bfloat16, as transformers' ``normalizer`` buffer is); per layer
                 x + temporal(norm(x)), x + mlp(norm(x)) with Gemma's (1 + w) RMS norms; the
                 temporal block cycles through ``block_types``: "recurrent" is Griffin's
                 recurrent block (linear_y -> GELU, linear_x -> causal depthwise conv ->
                 RG-LRU ``rg_lru``, their product -> linear_out), "attention" local attention
                 (GQA / MQA over ``attention_window_size`` tokens, partial rotary, an output
                 bias); the MLP is gelu(gate) · up -> down with biases, ``intermediate_size``
                 // 2 wide; final norm -> head (tied by default) -> tanh soft-cap
                 ``logits_soft_cap``
===============  =============================================================================

Sizes follow ``RecurrentGemmaConfig``: ``lru_width`` None is hidden_size; ``head_dim`` is
hidden_size // num_attention_heads (transformers sets it so whatever the file says);
``num_key_value_heads`` None is num_attention_heads; ``partial_rotary_factor`` defaults to
0.5. ``hidden_activation`` (both the recurrent block's y branch and the MLP) is
gelu_pytorch_tanh or gelu.

The state per recurrent layer: ``past_key_values.{i}.conv_state`` [B, W, K-1] (the
convolution's last K-1 inputs, transformers' ``conv1d_state``) and ``.recurrent_state``
[B, W] (the RG-LRU's h, float32: ``rg_lru.recurrent_states``); attention layers keep a KV
cache. A token at position 0 resets the RG-LRU (transformers' ``position_ids == 0``).
transformers' recurrent blocks ignore ``attention_mask`` (only attention reads it), and so
does irc: a left-padded row's pad tokens pass through the convolution and the recurrence.

Checkpoint names (``LAYOUTS``): ``model.layers.{i}.temporal_pre_norm`` / ``channel_pre_norm``,
``temporal_block.{q,k,v,o}_proj`` or ``temporal_block.{linear_x,linear_y,linear_out,conv_1d}``
and ``temporal_block.rg_lru.*``, ``mlp_block.{gate,up,down}_proj``, ``model.final_norm``.
"""
from __future__ import annotations


import numpy as np

from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope, read_rope, rope_dict
from irc.yamlloc import boolean, layer_count, positive_int, positive_number, string

DEFAULTS = {  # transformers 5.25's RecurrentGemmaConfig
    "recurrent_gemma": {"num_hidden_layers": 26, "vocab_size": 256000, "hidden_size": 2560,
                        "intermediate_size": 3 * 2560, "num_attention_heads": 10, "lru_width": None,
                        "attention_window_size": 2048, "conv1d_width": 4, "logits_soft_cap": 30.0,
                        "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh", "rope_theta": 10000.0,
                        "partial_rotary_factor": 0.5, "block_types": ["recurrent", "recurrent", "attention"],
                        "num_key_value_heads": None, "attention_bias": False, "tie_word_embeddings": True},
}
ACTIVATIONS = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}
BLOCKS = ("recurrent", "attention")

_BLOCK = "temporal_block."
_GATES = {"input_gate": "input_gate", "recurrence_gate": "recurrent_gate"}
LAYOUTS = {
    "recurrent_gemma": {
        "attn_norm": "temporal_pre_norm.weight", "mlp_norm": "channel_pre_norm.weight",
        **{f"attn.w{x}": f"{_BLOCK}{x}_proj.weight" for x in "qkvo"},
        **{f"attn.b{x}": f"{_BLOCK}{x}_proj.bias" for x in "qkvo"},
        **{f"rglru.{n}{s}": f"{_BLOCK}{n}.{w}" for n in ("linear_x", "linear_y", "linear_out")
           for s, w in (("", "weight"), ("_bias", "bias"))},
        "rglru.conv": f"{_BLOCK}conv_1d.weight", "rglru.conv_bias": f"{_BLOCK}conv_1d.bias",
        "rglru.a_param": f"{_BLOCK}rg_lru.recurrent_param",
        **{f"rglru.{k}{s}": f"{_BLOCK}rg_lru.{v}_{w}" for k, v in _GATES.items()
           for s, w in (("", "weight"), ("_bias", "bias"))},
        **{f"mlp.{p}_{x}": f"mlp_block.{x}_proj.{w}" for x in ("gate", "up", "down")
           for p, w in (("w", "weight"), ("b", "bias"))},
        "_top": {"embed": "model.embed_tokens.weight", "norm": "model.final_norm.weight", "lm_head": "lm_head.weight"},
    },
}


def bfloat16(value: float) -> float:
    """``value`` rounded to bfloat16 (to nearest, ties to even), as a float."""
    bits = int(np.asarray(value, np.float32).view(np.uint32))
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return float(np.asarray(bits, np.uint32).view(np.float32))


def _block_types(cfg: Config, n_layers: int) -> list[str]:
    types = cfg.raw("block_types")
    if not isinstance(types, list) or not types:
        raise cfg.error("block_types", f"expected a non-empty list, got {types!r}")
    for kind in types:
        if kind not in BLOCKS:
            raise cfg.unsupported("block_types", kind, hint="RecurrentGemma's blocks: recurrent, attention")
    return (types * (n_layers // len(types) + 1))[:n_layers]


def _recurrent_gemma(cfg: Config, name: str, model_type: str) -> Arch:
    """RecurrentGemma: the sizes of ``RecurrentGemmaConfig`` (see the module docstring)."""
    d, n = cfg.get("hidden_size", positive_int), cfg.get("num_hidden_layers", layer_count)
    heads = cfg.get("num_attention_heads", positive_int)
    kv_heads = cfg.get("num_key_value_heads", positive_int, None) or heads
    if kv_heads > heads or heads % kv_heads:
        raise cfg.error("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads {heads}")
    if d % heads:
        raise cfg.error("num_attention_heads", f"hidden_size {d} is not a multiple of {heads}")
    width = cfg.get("lru_width", positive_int, None) or d
    if width % heads:
        raise cfg.error("lru_width", f"{width} is not a multiple of num_attention_heads {heads}")
    activation = cfg.get("hidden_activation", string)
    if activation not in ACTIVATIONS:
        raise cfg.unsupported("hidden_activation", activation, hint=f"irc reads {', '.join(ACTIVATIONS)}")
    d_ff = cfg.get("intermediate_size", positive_int) // 2
    if d_ff < 1:
        raise cfg.error("intermediate_size", "the MLP is intermediate_size // 2 wide: at least 2")
    head_dim = d // heads
    params, key = rope_dict(cfg)
    rope = read_rope(cfg, head_dim, params, key)
    window = cfg.get("attention_window_size", positive_int)
    types = _block_types(cfg, n)
    layers = [LayerSpec(window, rope) if kind == "attention" else LayerSpec(None, None, mixer="rg_lru")
              for kind in types]
    attention = Attention("gqa", heads, kv_heads, head_dim, qkv_bias=cfg.get("attention_bias", boolean),
                          out_bias=True)
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("rms_norm_eps", positive_number), attention=attention,
                layers=layers, mlp={"kind": "rglru_mlp", "d_ff": d_ff, "approximate": ACTIVATIONS[activation]},
                norm_offset=1.0, tied=cfg.get("tie_word_embeddings", boolean),
                final_softcap=cfg.get("logits_soft_cap", positive_number), embedding_scale=bfloat16(d ** 0.5),
                checkpoint="recurrent_gemma",
                ssm={"kind": "rg_lru", "lru_width": width, "heads": heads,
                     "conv_width": cfg.get("conv1d_width", positive_int)})
    arch.expand = expand
    return arch


def expand(arch: Arch, origin: str):
    """The decoder through the DSL (see the module docstring)."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps, a, ssm, approximate = arch.norm_eps, arch.attention, arch.ssm, arch.mlp["approximate"]
    with m.at(origin):
        x = m.embed(m.input_ids(), scale=arch.embedding_scale)
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            h = layer.rms_norm(x, "attn_norm", eps, offset=1.0)
            if spec.mixer == "rg_lru":
                h = layer.rglru_block(h, lru_width=ssm["lru_width"], heads=ssm["heads"],
                                      conv_width=ssm["conv_width"], approximate=approximate)
            else:
                h = layer.attention(h, a.heads, a.kv_heads, a.head_dim, rope=dsl_rope(spec.rope), window=spec.window,
                                    qkv_bias=a.qkv_bias, out_bias=True)
            x = x + h
            x = x + layer.rglru_mlp(layer.rms_norm(x, "mlp_norm", eps, offset=1.0), arch.mlp["d_ff"], approximate)
        m.logits(m.rms_norm(x, "norm", eps, offset=1.0), tied=arch.tied, softcap=arch.final_softcap)
    return m.graph


FAMILIES = {"recurrent_gemma": _recurrent_gemma}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS", "expand", "bfloat16"]
