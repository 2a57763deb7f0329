"""MiniMax: refused until built (``frontends.hf.families`` registers it), with one
error naming config.json and the key that holds its linear-attention layers."""
from __future__ import annotations

from frontends.hf.config import Config

DEFAULTS = {"minimax": {"num_hidden_layers": 32, "num_attention_heads": 32, "block_size": 256}}  # transformers 5.24's config class (the keys read)
KEYS = ("layer_types",)
MISSING = ("MiniMax lightning attention (its 'linear_attention' layers) is not supported yet: see "
                    "frontends/hf/families_minimax.py")


def _refuse(cfg: Config, name: str, model_type: str):
    """One SpecError at the key that holds the linear-attention layers."""
    key = next((k for k in KEYS if k in cfg.data), "model_type")
    raise cfg.error(key, MISSING, hint="MiniMax-Text-01 (issue 26)")


FAMILIES = {"minimax": _refuse}
LAYOUTS: dict = {}

__all__ = ["DEFAULTS", "FAMILIES", "LAYOUTS"]
