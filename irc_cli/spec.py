"""Reading a spec for any command: the frontends' formats, or the IR's own text form."""
from __future__ import annotations

import os

from irc.errors import IRCError
from irc.graph import Graph
from irc.parser import read_graph

from frontends import hub, load_spec


def resolve(args) -> None:
    """A Hugging Face id in ``args.spec`` (``owner/name``, ``owner/name:FILE.gguf``) made
    the local folder or GGUF file of its snapshot at ``--revision`` (``frontends.hub``),
    before a command reads it, so every later step (weights, tokenizer files, messages)
    sees a local path; one IRCError for an id that does not resolve, or a ``--revision``
    given with a local path."""
    spec, revision = getattr(args, "spec", None), getattr(args, "revision", None)
    if spec is not None and hub.is_id(spec):
        args.spec = hub.resolve(spec, revision)
    elif revision is not None:
        raise IRCError(f"--revision {revision} applies to a Hugging Face id (owner/name), not a local path",
                       location=spec)


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
