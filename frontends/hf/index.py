"""The index of the Hugging Face families: which module registers each ``model_type``, and
what each module reads (its docstring's first sentence). Generated from the registry
(``frontends.hf.families.MODULES``), so it cannot drift from what ``describe`` dispatches.

    python -m frontends.hf.index        # one line per module: its types, what it reads
"""
from __future__ import annotations

import re

BASE = "families"  # the types frontends.hf.families defines itself (Llama, Qwen, DeepSeek, Gemma 2/3, Phi-3)


def summary(doc: str) -> str:
    """A docstring's first sentence, on one line."""
    text = " ".join((doc or "").split())
    match = re.match(r"(.+?[.:])(\s|$)", text)
    return (match.group(1) if match else text).rstrip(":")


def modules() -> dict:
    """module name -> (its model types, sorted; its docstring's first sentence), the base
    module first, then ``MODULES`` in their order."""
    from frontends.hf import families

    found = {}
    for module in families.MODULES:
        found[module.__name__.rsplit(".", 1)[-1]] = (sorted(module.FAMILIES), summary(module.__doc__))
    registered = {t for types, _ in found.values() for t in types}
    base = sorted(t for t in families.FAMILIES if t not in registered)
    return {BASE: (base, summary(families.__doc__)), **found}


def module_of() -> dict:
    """model_type -> the module that registers it."""
    return {t: name for name, (types, _) in modules().items() for t in types}


def main() -> None:
    for name, (types, what) in modules().items():
        print(f"{name:<26}{', '.join(types)}\n{'':<26}{what}")


if __name__ == "__main__":
    main()
