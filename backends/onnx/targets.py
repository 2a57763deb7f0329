"""The ONNX targets, their options and default pipelines.

Plain data, no ``onnx`` import: the CLI reads this table at start-up.

- ``onnx``: standard ops only. At opset 23 (the default) the model keeps its structure as
  ``RMSNormalization``, ``RotaryEmbedding`` and grouped ``Attention``; at opsets 21 and 22
  the default pipeline runs ``lower-norms`` (RMSNormalization is new in 23) and
  ``gqa-broadcast`` (grouped attention as broadcasting matmuls over [B, K, H/K, T, D]
  queries: K/V are never repeated); the emitter writes what is left the same way (RoPE,
  MHA attention, which gqa-broadcast leaves alone, and MLA).
- ``onnx-ort``: the ONNX Runtime flavour: ``com.microsoft`` ``GroupQueryAttention``,
  ``RotaryEmbedding``, ``SkipSimplifiedLayerNormalization`` and ``MoE`` where they fit,
  standard ops where they do not (see ``backends.onnx.ort``).
"""
from __future__ import annotations

from dataclasses import dataclass

from irc.errors import BackendError

DEFAULT_OPSET = 23
MIN_OPSET = 21
MAX_OPSET = 24
WEIGHTS = ("seeded", "none")


@dataclass(frozen=True)
class Target:
    name: str
    flavour: str            # "portable" or "ort"
    summary: str            # what -o writes
    pipeline_23: str        # default pipeline at opset >= 23
    pipeline_old: str       # default pipeline at opsets 21 and 22

    def pipeline(self, opset: int) -> str:
        return self.pipeline_23 if opset >= 23 else self.pipeline_old


TARGETS = {
    "onnx": Target("onnx", "portable", "an ONNX model with standard ops (+ genai_config.json)",
                   "dce,cse", "lower-norms,gqa-broadcast,dce,cse"),
    "onnx-ort": Target("onnx-ort", "ort", "an ONNX model with ONNX Runtime contrib ops (+ genai_config.json)",
                       "dce,cse", "dce,cse"),
}


def add_arguments(parser) -> None:
    """The ONNX targets' own options on ``irc compile`` (None when not given)."""
    parser.add_argument("--opset", type=int, default=None,
                        help=f"ONNX opset for --target onnx/onnx-ort (default {DEFAULT_OPSET}, at least {MIN_OPSET})")
    parser.add_argument("--weights", default=None,
                        help="ONNX targets: seeded (default; absent weights seeded by name) or none (shape-only: "
                             "the model references external weights that are not written)")


def resolve_options(target: str, options) -> tuple[int, str]:
    """(opset, weights) from the CLI's options (None: the default), checked."""
    opset = DEFAULT_OPSET if options.get("opset") is None else options["opset"]
    weights = "seeded" if options.get("weights") is None else options["weights"]
    check_options(target, opset, weights)
    return opset, weights


def check_options(target: str, opset: int, weights: str) -> Target:
    """The target, or one BackendError naming the bad option."""
    if target not in TARGETS:
        raise BackendError(f"unknown ONNX target {target!r}", hint=f"targets: {', '.join(TARGETS)}")
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise BackendError(f"--opset {opset} is not supported",
                           hint=f"choose an opset from {MIN_OPSET} to {MAX_OPSET} (default {DEFAULT_OPSET})")
    if weights not in WEIGHTS:
        raise BackendError(f"--weights {weights!r} is not supported", hint=f"one of {', '.join(WEIGHTS)}")
    return TARGETS[target]
