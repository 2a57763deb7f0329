"""The passes. Importing this package imports every module in it, so each pass registers
itself (``irc.passmanager.PASSES``) under its kebab-case name; a pass lives in the module of
the same name in snake_case (``lower-norms`` in ``passes/lower_norms.py``).

Modules are found, not listed, so adding a pass is adding its file. They are imported in
sorted order so registration order is deterministic.
"""
from __future__ import annotations

import importlib
import pkgutil


def _import_all() -> None:
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        if not module.startswith("_"):
            importlib.import_module(f"{__name__}.{module}")


_import_all()
