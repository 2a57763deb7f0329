"""Reading a spec for any command: the frontends' formats, or the IR's own text form."""
from __future__ import annotations

import os

from irc.errors import IRCError
from irc.graph import Graph
from irc.parser import read_graph

from frontends import load_spec


def load(path: str) -> Graph:
    """A graph from a spec file: YAML (architecture or graph form), a DSL .py, a model
    folder, or .ir text."""
    if not os.path.exists(path):
        raise IRCError(f"no such file: {path}")
    if path.endswith(".ir"):
        return read_graph(path)
    return load_spec(path)
