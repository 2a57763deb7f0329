"""Argument checking for the DSL: every mistake is an ``ArgError`` at the caller's line."""
from __future__ import annotations

import os
import sys
from typing import Optional

from irc import limits
from irc.errors import SpecError

MOE_SCORING = ("softmax", "sigmoid", "sparsemixer", "sigmoid_logits")
GROUP_SCORES = ("max", "top2_sum")

# frames in these files are the DSL itself; call_site() reports the first frame outside
DSL_FILES = {os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
             for name in ("dsl.py", "dsl_core.py", "dsl_args.py", "dsl_moe.py", "dsl_rope.py", "dsl_ssm.py",
                          "dsl_hybrid.py", "dsl_mlp.py", "dsl_delta.py", "dsl_lightning.py", "dsl_attention.py")}


class ArgError(SpecError):
    """A DSL call got a bad argument; ``arg`` names it, ``detail`` says what is wrong."""

    def __init__(self, arg: str, detail: str, location: Optional[str] = None, hint: Optional[str] = None):
        super().__init__(f"{arg}: {detail}", location=location, hint=hint)
        self.arg, self.detail = arg, detail


def call_site() -> str:
    """``file.py:line`` of the innermost frame outside this module."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in DSL_FILES:
        frame = frame.f_back
    if frame is None:
        return "<dsl>"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def positive(arg: str, value, location: Optional[str] = None, limit=limits.check_dim) -> int:
    """``value`` as a positive integer within its size limit (``irc.limits``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ArgError(arg, f"expected a positive integer, got {value!r}", location or call_site())
    try:
        limit(value)
    except limits.LimitError as err:
        raise ArgError(arg, err.message, location or call_site(), err.hint) from None
    return value


def positive_float(arg: str, value, location: Optional[str] = None) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ArgError(arg, f"expected a positive number, got {value!r}", location or call_site())
    return float(value)


def one_of(arg: str, value, options, location: Optional[str] = None):
    if value not in options:
        raise ArgError(arg, f"expected one of {', '.join(options)}, got {value!r}", location or call_site())
    return value


