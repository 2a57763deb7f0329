"""Frontends: model specs -> Graph.

``load_spec(path)`` picks the frontend from the file:

- ``.yaml`` / ``.yml`` with top key ``model``: the architecture form (``yaml_spec``);
  with top key ``graph``: the explicit graph form (``yaml_graph``).
- ``.py``: a DSL file (``frontends.dsl``) exposing ``build() -> Graph``, or a module-level
  ``model`` (a ``dsl.Model`` or a ``Graph``).
- a directory holding ``config.json``: a Hugging Face model folder (``frontends.hf``),
  weights read lazily from its safetensors files when it has them.

Every user mistake is a ``SpecError`` naming file:line:col and the offending key.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from irc.errors import SpecError
from irc.graph import Graph


def load_spec(path) -> Graph:
    """The graph a spec describes: weights absent, except a model folder's (lazy)."""
    path = str(path)
    if os.path.isdir(path):
        from frontends.hf import load_hf
        return load_hf(path)
    suffix = Path(path).suffix.lower()
    if suffix in (".yaml", ".yml"):
        return _load_yaml(path)
    if suffix == ".py":
        return _load_python(path)
    raise SpecError(f"unknown spec type {suffix or '(no extension)'!r}", location=path,
                    hint="expected a .yaml/.yml spec or a .py DSL file")


def _load_yaml(path: str) -> Graph:
    from frontends import yaml_graph, yaml_spec
    from irc import yamlloc

    data = yamlloc.load_file(path)
    if isinstance(data, dict) and "model" in data:
        return yaml_spec.build(data, path)
    if isinstance(data, dict) and "graph" in data:
        return yaml_graph.build_graph(data, path)
    where = yamlloc.where(data) or yamlloc.Loc(path, 1, 1)
    raise SpecError("expected a top-level key 'model' (architecture form) or 'graph' (graph form)",
                    location=str(where))


def _load_python(path: str) -> Graph:
    from frontends.dsl import Model

    if not os.path.isfile(path):
        raise SpecError("no such file", location=path)
    name = "irc_spec_" + "".join(c if c.isalnum() else "_" for c in Path(path).stem)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # while it runs, so dataclasses and pickling can find it
    try:
        spec.loader.exec_module(module)
    except SyntaxError as err:
        raise SpecError(f"Python syntax error: {err.msg}", location=f"{path}:{err.lineno}:{err.offset}") from None
    finally:
        sys.modules.pop(name, None)
    if callable(getattr(module, "build", None)):
        result = module.build()
    elif hasattr(module, "model"):
        result = module.model
    else:
        raise SpecError("a DSL file must define build() -> Graph or a module-level `model`", location=path)
    if isinstance(result, Model):
        result = result.graph
    if not isinstance(result, Graph):
        raise SpecError(f"build() returned {type(result).__name__}, not a Graph", location=path)
    return result
