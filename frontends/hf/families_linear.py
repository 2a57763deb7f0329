"""The linear-attention hybrids irc reads but does not build yet (``frontends.hf.families``
registers them), each refused with one error naming config.json and the key that holds its
linear-attention layers, so that ``irc show`` and ``irc compile`` stop at the model type
instead of building something else.

=================  ==========================================================================
kimi_linear        Moonshot's Kimi-Linear: Kimi Delta Attention layers (a gated delta rule
                   whose decay is per key channel, g = -exp(A_log)·softplus(f_b(f_a(x)) +
                   dt_bias) [B, T, H·d_k], separate short convolutions over q, k and v, a
                   low-rank output gate g_b(g_a(x)) into a gated RMS norm) between MLA
                   attention layers, and a DeepSeek-V3-style MoE. Missing in irc: the
                   per-channel decay in ``gated_delta_rule`` and the Kimi mixer around it.
minimax            MiniMax-Text-01: lightning attention (linear attention with a constant
                   per-head decay exp(-slope_h·(1 - i/(L-1))), S = λ·S + kᵀv, o = q·S,
                   SiLU on q|k|v, an RMS norm over all heads, a sigmoid output gate)
                   between softmax attention layers, a Mixtral MoE, and residuals taken
                   after the input norm and scaled by ``*_alpha_factor`` / ``*_beta_factor``.
                   Missing in irc: the constant-decay linear attention in
                   ``gated_delta_rule`` and the MiniMax decoder layer around it.
=================  ==========================================================================

The key named is the one the checkpoint's own config.json uses for its linear-attention
layers: ``linear_attn_config`` (Kimi's checkpoints) or ``layer_types`` (transformers writes
it for both families), else ``model_type``.
"""
from __future__ import annotations

from frontends.hf.config import Config

DEFAULTS = {  # transformers 5.24's config classes (the keys the refusal reads)
    "kimi_linear": {"num_hidden_layers": 27, "linear_num_heads": 32, "linear_head_dim": 128},
    "minimax": {"num_hidden_layers": 32, "num_attention_heads": 32, "block_size": 256},
}
MISSING = {
    "kimi_linear": ("Kimi Delta Attention (its 'linear_attention' layers) is not supported: irc's gated_delta_rule "
                    "has a per-head decay, and Kimi's decay gate is per key channel ([B, T, H·d_k], "
                    "f_a_proj/f_b_proj), with separate q/k/v convolutions and a low-rank output gate"),
    "minimax": ("MiniMax lightning attention (its 'linear_attention' layers) is not supported: irc has no "
                "linear attention with a constant per-head decay (S = λ·S + kᵀv, o = q·S) nor MiniMax's "
                "decoder layer (residual after the input norm, alpha/beta factors)"),
}
HINTS = {"kimi_linear": "see frontends/hf/families_linear.py for what Kimi-Linear needs (issue 26)",
         "minimax": "see frontends/hf/families_linear.py for what MiniMax-Text-01 needs (issue 26)"}
KEYS = {"kimi_linear": ("linear_attn_config", "layer_types"), "minimax": ("layer_types",)}


def _refuse(cfg: Config, name: str, model_type: str):
    """One SpecError at the key that holds the linear-attention layers."""
    key = next((k for k in KEYS[model_type] if k in cfg.data), "model_type")
    raise cfg.error(key, MISSING[model_type], hint=HINTS[model_type])


FAMILIES = {model_type: _refuse for model_type in DEFAULTS}
LAYOUTS: dict = {}  # nothing is built, so no checkpoint layout yet

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
