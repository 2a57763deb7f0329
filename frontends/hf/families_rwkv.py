"""RWKV-4 (``frontends.hf.families`` dispatches here), built by its own loop through the DSL
(``expand``, set as ``Arch.expand``; the blocks are ``frontends.dsl_rwkv``'s):

=================  ==========================================================================
rwkv               RWKV-4 (transformers' ``RwkvForCausalLM``): embeddings -> ``pre_ln``
                   (block 0's LayerNorm); per layer x + time_mix(ln1(x)) (token shift, k/v/r
                   mixes, the WKV recurrence ``rwkv4_wkv`` with ``time_decay`` and
                   ``time_first``, sigmoid(r) gate, ``output``), x + channel_mix(ln2(x))
                   (token shift, relu(k)² value, sigmoid(r) gate); ``ln_out`` -> ``head``
=================  ==========================================================================

Sizes follow ``RwkvConfig``: ``attention_hidden_size`` None is hidden_size,
``intermediate_size`` None is 4 · hidden_size; ``pre_ln``, ``ln1`` and ``ln2`` take
``layer_norm_epsilon``, ``ln_out`` nn.LayerNorm's default 1e-5 (transformers builds it
without the key). ``rescale_every`` R > 0 is applied as transformers applies it at inference:
layer i's ``output`` and ``value`` results times 2^-(i // R) (transformers divides the
weights; by a power of two, the same numbers) and the residual stream halved after every R
layers; the LayerNorms' eps makes that differ from no rescale, so irc does it too.

The state per layer (transformers' five [B, d, L] tensors, per layer): the time mixing's
token shift ``past_key_values.{i}.time_shift_state`` [B, d] (``state[1]``), the channel
mixing's ``.channel_shift_state`` [B, d] (``state[0]``), the WKV state
``.recurrent_state`` [B, 3, A] (num, den, max: ``state[2:5]``). A zero state is an empty
one (``irc.ops.rwkv``). transformers' RWKV ignores ``attention_mask`` (it warns), and so
does irc: a left-padded batch runs its pad tokens through the recurrence as transformers
does, so RWKV rows are run unpadded or in batches of equal lengths.

Checkpoint names (``LAYOUTS``): ``rwkv.embeddings.weight``, ``rwkv.blocks.{i}.ln1`` /
``ln2`` (weight and bias), ``rwkv.blocks.{i}.attention.*``, ``rwkv.blocks.{i}.feed_forward.*``,
``rwkv.blocks.0.pre_ln``, ``rwkv.ln_out``, ``head.weight`` (left out when tied).
"""
from __future__ import annotations

from functools import partial

from frontends.hf.config import Arch, Config, LayerSpec
from irc.yamlloc import boolean, layer_count, positive_int, positive_number

DEFAULTS = {  # transformers 5.25's RwkvConfig
    "rwkv": {"vocab_size": 50277, "context_length": 1024, "hidden_size": 4096, "num_hidden_layers": 32,
             "attention_hidden_size": None, "intermediate_size": None, "layer_norm_epsilon": 1e-5,
             "rescale_every": 6, "tie_word_embeddings": False},
}
LN_OUT_EPS = 1e-5  # RwkvModel.ln_out = nn.LayerNorm(hidden_size): the default eps, not layer_norm_epsilon

_NORMS = {"attn_norm": "ln1", "mlp_norm": "ln2"}
_TIME = ("time_decay", "time_first", "time_mix_key", "time_mix_value", "time_mix_receptance")
LAYOUTS = {
    "rwkv": {
        **{f"{k}{s}": f"{v}.{w}" for k, v in _NORMS.items() for s, w in (("", "weight"), (".bias", "bias"))},
        **{f"rwkv.{n}": f"attention.{n}" for n in _TIME},
        **{f"rwkv.{n}": f"attention.{n}.weight" for n in ("key", "value", "receptance", "output")},
        **{f"rwkv.ffn_{n}": f"feed_forward.{n}" for n in ("time_mix_key", "time_mix_receptance")},
        **{f"rwkv.ffn_{n}": f"feed_forward.{n}.weight" for n in ("key", "value", "receptance")},
        "_prefix": "rwkv.blocks.",
        "_top": {"embed": "rwkv.embeddings.weight", "embed_norm": "rwkv.blocks.0.pre_ln.weight",
                 "embed_norm.bias": "rwkv.blocks.0.pre_ln.bias", "norm": "rwkv.ln_out.weight",
                 "norm.bias": "rwkv.ln_out.bias", "lm_head": "head.weight"},
    },
}


def _rwkv(cfg: Config, name: str, model_type: str) -> Arch:
    """RWKV-4: the sizes of ``RwkvConfig`` and its inference-time rescale."""
    d, n = cfg.get("hidden_size", positive_int), cfg.get("num_hidden_layers", layer_count)
    attention_size = cfg.get("attention_hidden_size", positive_int, None) or d
    d_ff = cfg.get("intermediate_size", positive_int, None) or 4 * d
    rescale = cfg.raw("rescale_every")
    if not isinstance(rescale, int) or isinstance(rescale, bool):
        raise cfg.error("rescale_every", f"expected an integer, got {rescale!r}")
    cfg.get("context_length", positive_int)
    arch = Arch(name=name, model_type=model_type, dtype=cfg.dtype(), vocab_size=cfg.get("vocab_size", positive_int),
                d_model=d, n_layers=n, norm_eps=cfg.get("layer_norm_epsilon", positive_number), attention=None,
                layers=[LayerSpec(None, None, mixer="rwkv4") for _ in range(n)],
                mlp={"kind": "rwkv4_channel_mix", "d_ff": d_ff}, tied=cfg.get("tie_word_embeddings", boolean),
                checkpoint="rwkv", ssm={"kind": "rwkv4", "attention_size": attention_size})
    arch.expand = partial(expand, max(rescale, 0))
    return arch


def expand(rescale_every: int, arch: Arch, origin: str):
    """The decoder through the DSL (see the module docstring); ``rescale_every`` 0: none."""
    from frontends.dsl import Model

    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps, size, d_ff = arch.norm_eps, arch.ssm["attention_size"], arch.mlp["d_ff"]
    with m.at(origin):
        x = m.layer_norm(m.embed(m.input_ids()), "embed_norm", eps)
        for layer in m.layers(arch.n_layers):
            scale = 0.5 ** (layer.index // rescale_every) if rescale_every else None
            x = x + layer.rwkv_time_mix(layer.layer_norm(x, "attn_norm", eps), attention_size=size, out_scale=scale)
            x = x + layer.rwkv_channel_mix(layer.layer_norm(x, "mlp_norm", eps), d_ff=d_ff, out_scale=scale)
            if rescale_every and (layer.index + 1) % rescale_every == 0:
                x = m.scale(x, 0.5, f"{layer.prefix}rescaled")
        m.logits(m.layer_norm(x, "norm", LN_OUT_EPS), tied=arch.tied)
    return m.graph


FAMILIES = {"rwkv": _rwkv}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS", "expand"]
