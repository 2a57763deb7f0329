"""LongRoPE settings from config.json (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini, Phi-3.5-MoE).

transformers 5.25 reads them as follows (``_compute_longrope_parameters`` and
``standardize_rope_params``), and so does ``read_longrope``:

- ``short_factor`` / ``long_factor``: lists of rotary_dim / 2 numbers (required);
- ``original_max_position_embeddings``: the pretraining length the switch compares
  against. A top-level key wins over the one inside the RoPE settings (HF gives
  ``self.original_max_position_embeddings`` priority whenever the config has the attribute,
  and Phi-3's config class always has it, 4096 by default: the family default here);
  without either, ``max_position_embeddings``. The same under Phi-3's old type names ``su``
  and ``yarn``. transformers 5.24 renamed ``su`` only after that step, so there the RoPE
  settings' own value won; 5.25 renames both first (``Phi3Config.convert_rope_params_to_dict``),
  which is what Phi-3's own modeling code (``trust_remote_code``, which reads the top-level
  ``config.original_max_position_embeddings`` whatever the type) always did: irc follows it;
- ``factor``: as written (a positive number; only null is unset), else max_position_embeddings /
  original_max_position_embeddings; it only sets the default ``attention_factor``.

The result is irc's scaling dict (``irc.ops.rope``, kind ``longrope``).
"""
from __future__ import annotations

import math
from typing import Optional

ORIGINAL = "original_max_position_embeddings"


def _number(cfg, key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise cfg.error(key, f"expected a positive number, got {value!r}")
    return float(value)


def _factors(cfg, params: dict, key: str, name: str, rotary: int) -> list:
    where = f"{key}.{name}"
    if params.get(name) is None:
        raise cfg.error(where, "longrope RoPE needs it", hint=f"a list of {rotary // 2} numbers (rotary dim / 2)")
    factors = params[name]
    if not isinstance(factors, list):
        raise cfg.error(where, f"expected a list of {rotary // 2} numbers, got {type(factors).__name__}")
    if len(factors) != rotary // 2:
        raise cfg.error(where, f"has {len(factors)} entries; a rotary dim of {rotary} needs {rotary // 2}")
    return [_number(cfg, where, value) for value in factors]


def _original(cfg, params: dict, key: str, original_max: Optional[int]) -> tuple[int, str]:
    if ORIGINAL in cfg.data or ORIGINAL in cfg.defaults:
        value, where = cfg.raw(ORIGINAL), ORIGINAL
    elif params.get(ORIGINAL) is not None:
        value, where = params[ORIGINAL], f"{key}.{ORIGINAL}"
    else:
        value, where = original_max, "max_position_embeddings"
        if value is None:
            raise cfg.error(f"{key}.{ORIGINAL}", "longrope RoPE needs it")
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise cfg.error(where, f"expected an integer above 1, got {value!r}")
    return value, where


def read_longrope(cfg, params: dict, key: str, rotary: int, original_max: Optional[int]) -> dict:
    """irc's ``longrope`` scaling dict from the flat RoPE settings ``params`` (found under
    ``key``) for a rotary width ``rotary``; ``original_max`` is max_position_embeddings."""
    scaling = {"kind": "longrope", "short_factor": _factors(cfg, params, key, "short_factor", rotary),
               "long_factor": _factors(cfg, params, key, "long_factor", rotary)}
    original, _ = _original(cfg, params, key, original_max)
    scaling["original_max_position"] = original
    if params.get("factor") is not None:
        scaling["factor"] = _number(cfg, f"{key}.factor", params["factor"])
    elif original_max is None:
        raise cfg.error(f"{key}.factor", "longrope RoPE needs a factor or max_position_embeddings")
    else:
        scaling["factor"] = original_max / original
    if params.get("attention_factor") is not None:
        scaling["attention_factor"] = _number(cfg, f"{key}.attention_factor", params["attention_factor"])
    return scaling
