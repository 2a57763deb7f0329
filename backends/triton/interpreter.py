"""Running emitted Triton modules on CPU, through Triton's interpreter.

Triton reads ``TRITON_INTERPRET=1`` when a kernel is defined, and binds its own standard
library (``tl.sum``, ``tl.max``, ``tl.cdiv``, ...) to compiled or interpreted mode when
``triton.language`` is first imported. ``use_interpreter()`` sets the variable and, when
triton was already imported in compiled mode (by torch, say), imports it afresh so a
module emitted afterwards runs entirely in the interpreter. Call it before importing an
emitted module; it imports nothing when triton is not loaded yet.
"""
from __future__ import annotations

import os
import sys


def use_interpreter() -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton.language" not in sys.modules:
        return
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(sys.modules["triton.language"].sum, InterpretedFunction):
        return
    stale = [name for name in sys.modules
             if (name == "triton" or name.startswith("triton.")) and not name.startswith("triton._C")]
    for name in stale:  # the compiled extension (triton._C) stays loaded; Python modules reload
        del sys.modules[name]
    import triton.language  # noqa: F401
