"""Kimi-Linear: refused until built (``frontends.hf.families`` registers it), with one
error naming config.json and the key that holds its linear-attention layers."""
from __future__ import annotations

from frontends.hf.config import Config

DEFAULTS = {"kimi_linear": {"num_hidden_layers": 27, "linear_num_heads": 32, "linear_head_dim": 128}}  # transformers 5.24's config class (the keys read)
KEYS = ("linear_attn_config", "layer_types")
MISSING = ("Kimi Delta Attention (its 'linear_attention' layers) is not supported yet: see "
                    "frontends/hf/families_kimi.py")


def _refuse(cfg: Config, name: str, model_type: str):
    """One SpecError at the key that holds the linear-attention layers."""
    key = next((k for k in KEYS if k in cfg.data), "model_type")
    raise cfg.error(key, MISSING, hint="Moonshot's Kimi-Linear (issue 26)")


FAMILIES = {"kimi_linear": _refuse}
LAYOUTS: dict = {}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
