"""Where a model's weights come from, said out loud, and ``--weights``.

A Hugging Face folder or a GGUF file brings its weights; a folder with only config.json
(or a GGUF without tensors) would otherwise compile with seeded random weights and nobody
would know. So for those inputs a command that needs weights refuses, naming the input,
unless ``--weights seeded`` (random weights, on purpose) or ``--weights none`` (a
shape-only ONNX model: the weights are referenced, not written). YAML, DSL and .ir specs
describe architectures without weights: seeded is their default.

``source(spec, graph)`` gives (kind, words): kind ``checkpoint`` (weights from files),
``missing`` (a checkpoint format without weight files) or ``seeded``; the words are what
``irc show`` prints after "weights:".
"""
from __future__ import annotations

import os

from irc.errors import IRCError

CHOICES = ("seeded", "none")


def add_argument(parser, shape_only: bool = True) -> None:
    """``--weights`` (checked by ``check``: a bad value is one IRCError like every other)."""
    parser.add_argument("--weights", default=None, metavar="{seeded,none}" if shape_only else "seeded",
                        help="seeded: absent weights seeded by name (random, on purpose; the default for YAML, DSL "
                             "and .ir specs)" + ("; none: a shape-only ONNX model that references weights it "
                                                 "does not write (onnx targets)" if shape_only else ""))


def check(choice, choices=CHOICES) -> None:
    if choice is not None and choice not in choices:
        raise IRCError(f"--weights {choice!r} is not supported", hint=f"one of {', '.join(choices)}")


def source(spec: str, graph) -> tuple[str, str]:
    """(kind, words) for the weights of ``graph`` loaded from ``spec`` (module docstring)."""
    loaded = [p.data for p in graph.params.values() if p.data is not None]
    if os.path.isdir(spec):
        files = {path for data in loaded for path in getattr(getattr(data, "checkpoint", None), "files", {}).values()}
        if not loaded:
            return "missing", f"none ({spec} has no *.safetensors files)"
        return "checkpoint", f"from {len(files)} safetensors file{'s' if len(files) != 1 else ''}"
    if spec.lower().endswith(".gguf"):
        if not loaded:
            return "missing", f"none ({os.path.basename(spec)} holds no tensors)"
        return "checkpoint", f"from GGUF {os.path.basename(spec)}"
    if loaded and len(loaded) == len(graph.params):
        return "checkpoint", "from the spec"
    return "seeded", "seeded (random)"


def require(spec: str, graph, choice) -> str:
    """The weights a command that needs them will use, or one IRCError for a checkpoint
    format without weight files and no ``--weights``."""
    kind, words = source(spec, graph)
    if kind == "missing" and choice is None:
        what = "this folder has no weight files (*.safetensors)" if os.path.isdir(spec) else "this file holds no tensors"
        raise IRCError(f"{what}, and irc does not make up random weights silently", location=spec,
                       hint="--weights seeded for random weights on purpose, or --weights none for a shape-only "
                            "ONNX model")
    return "seeded (random)" if kind == "missing" or choice == "seeded" and kind == "seeded" else words
