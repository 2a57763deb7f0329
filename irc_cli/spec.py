"""Reading a spec for any command: the frontends' formats, or the IR's own text form."""
from __future__ import annotations

import os

from irc.errors import IRCError
from irc.graph import Graph
from irc.parser import read_graph

from frontends import load_spec


def load(path: str, gguf_weights: str = "blocks") -> Graph:
    """A graph from a spec file: YAML (architecture or graph form), a DSL .py, a model
    folder, a GGUF (its block formats held as ``gguf_weights`` says), or .ir text."""
    if not os.path.exists(path):
        raise IRCError(f"no such file: {path}")
    if gguf_weights != "blocks" and not path.lower().endswith(".gguf"):
        raise IRCError(f"--gguf-weights {gguf_weights} applies to a .gguf file only", location=path)
    if path.endswith(".ir"):
        return read_graph(path)
    return load_spec(path, gguf_weights)
