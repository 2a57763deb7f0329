"""nanochat (``frontends.hf.families`` registers it), built by its own loop through the DSL:
RMS norms without weight everywhere (one after the embedding, one before each branch, the
final one), MHA or GQA without biases, RoPE and then weightless q/k norms per head, a squared
ReLU MLP (``fc1``, ``fc2``), the logits soft-capped (``final_logit_softcapping``), untied.

nanochat's ``rotate_half`` flips the other sign (x2, −x1): its RoPE turns each pair by −θ,
which is D·R(θ)·D for D the sign flip of each head's second half. Both q and k go through it
and the weightless norms keep a head's length, so the scores equal those of the standard RoPE
on D·q and D·k: irc reads ``q_proj`` and ``k_proj`` with the rows of each head's second half
negated (``SecondHalfNegated``) and rotates as usual (the cache holds R·D·k, nanochat's own
D·R·D·k up to that flip; the outputs are the same).

Refused, naming config.json and the key: ``attention_bias``, an activation other than relu2,
a partial rotary factor.
"""
from __future__ import annotations

import numpy as np

from frontends.hf.families_common import embedded_inputs
from frontends.hf.config import Arch, Attention, Config, LayerSpec, dsl_rope
from frontends.hf.families_common import _arch, _dims, _no, _rope
from frontends.hf.weights import Checkpoint, Tensor
from irc.yamlloc import positive_int, positive_number

DEFAULTS = {  # transformers 5.25's NanoChatConfig
    "nanochat": {"vocab_size": 50304, "hidden_size": 768, "intermediate_size": 8192, "num_hidden_layers": 12,
                 "num_attention_heads": 6, "num_key_value_heads": None, "max_position_embeddings": 2048,
                 "hidden_act": "relu2", "rms_norm_eps": 1e-6, "final_logit_softcapping": 15.0,
                 "attention_bias": False, "tie_word_embeddings": False},
}


def _nanochat(cfg: Config, name: str, model_type: str) -> Arch:
    dims = _dims(cfg)
    _no(cfg, "attention_bias")
    cfg.check("hidden_act", lambda v: v == "relu2", hint="nanochat's MLP is squared ReLU (relu2)")
    rope = _rope(cfg, dims["head_dim"])
    if rope.rotary_dim is not None:
        raise cfg.unsupported("partial_rotary_factor", cfg.raw("partial_rotary_factor"),
                              hint="nanochat rotates the whole head")
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qk_norm="plain")
    mlp = {"kind": "relu2", "d_ff": cfg.get("intermediate_size", positive_int), "bias": False}
    return _arch(cfg, name, model_type, dims, attention, [LayerSpec(None, rope)] * dims["layers"], mlp,
                 final_softcap=cfg.get("final_logit_softcapping", positive_number, None), checkpoint="nanochat",
                 expand=expand)


def expand(arch: Arch, origin: str):
    """The decoder through the DSL (the module docstring)."""
    from frontends.dsl import Model
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    a, eps = arch.attention, arch.norm_eps
    with m.at(origin):
        x = m.plain_rms_norm(embedded_inputs(m, arch), "embed_norm", eps)
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            h = m.plain_rms_norm(x, f"{layer.prefix}attn_norm", eps)
            x = x + layer.attention(h, a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, rope=dsl_rope(spec.rope),
                                    qk_norm=a.qk_norm, qk_norm_eps=eps)
            x = x + layer.relu2_mlp(m.plain_rms_norm(x, f"{layer.prefix}mlp_norm", eps), d_ff=arch.mlp["d_ff"])
        m.logits(m.plain_rms_norm(x, "norm", eps), tied=arch.tied, softcap=arch.final_softcap)
    return m.graph


class SecondHalfNegated(Tensor):
    """A [heads·D, d] projection with the rows of each head's second half negated (the sign
    flip D of the module docstring)."""

    def __init__(self, name: str, head_dim: int):
        super().__init__(name)
        self.head_dim = head_dim

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        data = np.array(checkpoint.read(self.name, start, stop))
        index = np.arange(start, stop) % self.head_dim >= self.head_dim // 2
        data[index] = -data[index]
        return data


def _flipped(which: str):
    return lambda arch, prefix: SecondHalfNegated(f"{prefix}self_attn.{which}_proj.weight", arch.attention.head_dim)


LAYOUTS = {"nanochat": {"attn.wq": _flipped("q"), "attn.wk": _flipped("k"), "mlp.w_up": "mlp.fc1.weight",
                        "mlp.w_down": "mlp.fc2.weight"}}
FAMILIES = {"nanochat": _nanochat}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
