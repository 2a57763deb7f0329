"""Frontends: model specs -> Graph.

``load_spec(path)`` picks the frontend from the file:

- ``.yaml`` / ``.yml`` with top key ``model``: the architecture form (``yaml_spec``);
  with top key ``graph``: the explicit graph form (``yaml_graph``).
- ``.py``: a DSL file (``frontends.dsl``) exposing ``build() -> Graph``, or a module-level
  ``model`` (a ``dsl.Model`` or a ``Graph``).
- a directory holding ``config.json``: a Hugging Face model folder (``frontends.hf``),
  weights read lazily from its safetensors files when it has them.
- ``.gguf``: a llama.cpp GGUF file, or any part of a split set (``-00001-of-00003.gguf``)
  (``frontends.gguf``): exact block formats kept as quantized weights, the rest float.
- a Hugging Face Hub id, ``owner/name`` or ``owner/name:FILE.gguf``: its snapshot in the
  hub's cache, fetched when online (``frontends.hub``), then one of the two above.

Every user mistake is a ``SpecError`` naming file:line:col and the offending key.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from frontends import hub
from irc.errors import SpecError
from irc.graph import Graph


def load_spec(path, gguf_weights: str = "blocks") -> Graph:
    """The graph a spec describes: weights absent, except a model folder's or a GGUF's
    (lazy); ``gguf_weights`` is ``frontends.gguf.load_gguf``'s ``weights`` (blocks, exact
    or float), read for a GGUF only (the CLI refuses it for other specs: ``irc_cli.spec``)."""
    path = str(path)
    if hub.is_id(path):  # owner/name: the local snapshot, at the default branch (the CLI's --revision: irc_cli.spec)
        path = hub.resolve(path)
    if os.path.isdir(path):
        from frontends.hf import load_hf
        return hub.named(load_hf(path), path)
    suffix = Path(path).suffix.lower()
    if suffix == ".gguf":
        from frontends.gguf import load_gguf
        return load_gguf(path, weights=gguf_weights)
    if suffix in (".yaml", ".yml"):
        return _load_yaml(path)
    if suffix == ".py":
        return _load_python(path)
    raise SpecError(f"unknown spec type {suffix or '(no extension)'!r}", location=path,
                    hint="expected a .yaml/.yml spec, a .py DSL file, a .gguf file or a model folder")


def companion_files(path) -> tuple[dict, list]:
    """Files a spec carries that belong beside the compiled model ({name: bytes, or the path
    of a file to copy}), and notes for the user: a Hugging Face folder's tokenizer files and
    generation_config.json as they are (``frontends.hf.companion_files``); a GGUF's tokenizer as ``tokenizer.json`` and
    ``tokenizer_config.json`` (``frontends.gguf.tokenizer``; none, with a note saying why,
    when it cannot be converted faithfully). Other specs carry none. The CLI hands them to
    the emitter (``backends.EmitOptions.files``), which writes them into the output folder."""
    if os.path.isdir(str(path)):
        from frontends.hf import companion_files as hf_files
        return hf_files(str(path)), []
    if Path(str(path)).suffix.lower() != ".gguf":
        return {}, []
    from frontends.gguf import tokenizer_files
    files, note = tokenizer_files(path)
    return {name: text.encode("utf-8") for name, text in files.items()}, [note] if note else []


def load_notes(graph: Graph) -> list:
    """One-line notes a frontend left for the user: how a GGUF's tensors were read (kept as
    blocks, or dequantized to float, per format)."""
    return [f"gguf: {note}" for note in (graph.meta.get("gguf") or {}).get("notes", [])]


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
