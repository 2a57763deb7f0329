"""Backends: the targets ``irc compile --target`` emits, in one table.

``TARGETS`` maps a target's name to a ``Target``: what ``-o`` writes, the default
pipeline, the command-line options the target reads, and its emitter. A target's module
is imported only when that target is chosen (``Target.emitter`` names it), so choosing
``--target onnx`` never imports torch or triton, and reading the table imports nothing
heavy. Each emitter has the signature

    emit(graph, path, options: EmitOptions) -> list[str]   # the lines to tell the user

Adding a target is one entry here and one module with such a function; the CLI reads the
table and needs no change. Backends import only ``irc``.
"""
from __future__ import annotations

import argparse
import functools
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from irc.errors import IRCError
from irc.graph import Graph
from irc.output import signals_held

from backends.triton import DEFAULT_PIPELINE as TRITON_PIPELINE  # plain data, no torch or triton import


@dataclass(frozen=True)
class EmitOptions:
    """What every emitter may read: the target's name, the spec it came from, the seed for
    absent weights, the context length, the target's own options (``Target.arguments``)
    by name, and ``files``: companions the spec carries for the output folder (name ->
    bytes, or the path of a file to copy: a GGUF's tokenizer), which emitters that write a
    model folder for a runtime (ONNX for onnxruntime-genai) put beside the model."""

    name: str = ""
    source: str = ""
    seed: int = 0
    context: int = 4096
    target: Mapping[str, Any] = field(default_factory=dict)
    files: Mapping[str, Any] = field(default_factory=dict)
    progress: Any = None    # an irc.progress.Progress for long writes (None: silent)
    report: Optional[str] = None   # --report FILE.html, for emitters that add to it (onnx-npu's placement)


def _fixed(pipeline: str) -> Callable[[Mapping[str, Any]], str]:
    def default_pipeline(options: Mapping[str, Any]) -> str:
        return pipeline
    return default_pipeline


def _onnx_pipeline(name: str) -> Callable[[Mapping[str, Any]], str]:
    def default_pipeline(options: Mapping[str, Any]) -> str:
        from backends.onnx.targets import DEFAULT_OPSET, TARGETS as ONNX_TARGETS  # plain data
        return ONNX_TARGETS[name].pipeline(options.get("opset") or DEFAULT_OPSET)
    return default_pipeline


@functools.lru_cache(maxsize=None)
def _lazy(path: str) -> Callable:
    """The function at ``"module:function"``, imported on its first call (the target tables
    are plain data: the CLI reads them at start-up). One object per path, so targets of one
    backend share their ``add_arguments`` and the CLI adds those options once."""
    module, function = path.split(":")

    def call(arg):
        return getattr(importlib.import_module(module), function)(arg)
    return call


@dataclass(frozen=True)
class Target:
    """One ``--target``: ``summary`` says what ``-o`` writes; ``pipeline(options)`` is the
    default pipeline; ``add_arguments(parser)`` adds the target's own options (shared by
    targets of one backend: the CLI calls each function once) and ``arguments`` names them;
    ``emitter`` is ``"module:function"``; ``needs_output`` when the target writes files only;
    ``prelude(options)`` names passes that run before any pipeline, the default or ``--passes``
    (the ONNX targets' ``retype`` to ``--dtype``), ``postlude(options)`` those that run after
    it (the ONNX targets' ``last-logits``)."""

    summary: str
    emitter: Optional[str]
    pipeline: Callable[[Mapping[str, Any]], str] = _fixed("")
    add_arguments: Optional[Callable[[argparse.ArgumentParser], None]] = None
    arguments: tuple = ()
    needs_output: bool = False
    prelude: Callable[[Mapping[str, Any]], str] = _fixed("")
    postlude: Callable[[Mapping[str, Any]], str] = _fixed("")

    def emit(self, graph: Graph, path: str, options: EmitOptions) -> list[str]:
        module, function = self.emitter.split(":")
        with signals_held():  # Ctrl-C inside onnx's native init would abort the process (irc.output)
            emitter = getattr(importlib.import_module(module), function)
        return emitter(graph, path, options)


ONNX_ARGUMENTS = ("opset", "weights", "dtype", "tied_head", "logits", "unfuse")
ONNX, NPU = "backends.onnx.targets", "backends.onnx_npu.targets"  # plain data, no onnx import

TARGETS = {
    "ir": Target("the printed IR", "backends.ir:emit_target"),
    "numpy": Target("a standalone NumPy module (+ .npz weights)", "backends.numpy.emit:emit_target",
                    _fixed("dce,cse")),
    "onnx": Target("an ONNX model, standard ops (+ genai_config.json)", "backends.onnx.compile:emit_target",
                   _onnx_pipeline("onnx"), _lazy(ONNX + ":add_arguments"), ONNX_ARGUMENTS, needs_output=True,
                   prelude=_lazy(ONNX + ":prelude"), postlude=_lazy(ONNX + ":postlude")),
    "onnx-ort": Target("an ONNX model with ONNX Runtime contrib ops (+ genai_config.json)",
                       "backends.onnx.compile:emit_target", _onnx_pipeline("onnx-ort"),
                       _lazy(ONNX + ":add_arguments"), ONNX_ARGUMENTS, needs_output=True,
                       prelude=_lazy(ONNX + ":prelude"), postlude=_lazy(ONNX + ":postlude")),
    "onnx-npu": Target("a folder of static-shape ONNX graphs for edge NPUs (chunk + decode, one weights file)",
                       "backends.onnx_npu.emit:emit_target", _lazy(NPU + ":pipeline"),
                       _lazy(NPU + ":add_arguments"), ("chunk", "precision", "calibration"), needs_output=True,
                       prelude=_lazy(NPU + ":prelude")),
    "triton": Target("a Triton module: generated kernels + launcher (+ .pt weights)",
                     "backends.triton.emit:emit_target", _fixed(TRITON_PIPELINE)),
}


def get_target(name: str) -> Target:
    if name not in TARGETS:
        raise IRCError(f"unknown target {name!r}", hint=f"targets: {', '.join(TARGETS)}")
    return TARGETS[name]
