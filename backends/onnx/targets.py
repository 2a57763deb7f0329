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

Both default pipelines end with ``scan-chunk{size=64}``: ``ssd`` and ``gated_delta_rule``
prefills in chunks of 64 tokens (the portable target builds its chunked lowerings from the
attribute, an ``If`` keeping the token Scan for decode and short inputs; onnx-ort passes it
to ``LinearAttention`` as ``chunk_size``). ``--passes`` without it builds the token Scan.

Both take ``--dtype {auto,f32,f16,bf16}``: every compile runs ``retype{dtype=...}`` before
its pipeline (``prelude``), so weights, activations, the KV cache and quantization scales
share one float type (``auto``: f32). fp16 graphs cast to f32 around the ops ORT's CPU
provider has no fp16 kernel for (``backends.onnx.precision``); bf16 graphs are for
providers with bf16 kernels (the CPU provider has none for MatMul).

Both end with ``last-logits`` (``postlude``) unless ``--logits all``: the folder is for a
generate loop (onnxruntime-genai, ``irc run``), which reads the last row of a prefill's
logits only, and the head is a small model's largest matmul: on SmolLM2-135M the default
prefills in 0.83x the time of ``--logits all`` at 128 and at 1,024 tokens, and the
1,024-token process peaks 190 MB lower (``benchmarks/cpu_speed.py``). Scoring every position
(perplexity) needs ``--logits all``.
"""
from __future__ import annotations

from dataclasses import dataclass

from irc.errors import BackendError

DEFAULT_OPSET = 23
MIN_OPSET = 21
MAX_OPSET = 24
WEIGHTS = ("seeded", "none")
DTYPES = ("auto", "f32", "f16", "bf16")
TIED_HEADS = ("auto", "fused", "gemm", "transpose")
LOGITS = ("last", "all")  # the first is the default
FUSIONS = ("gqa-rope", "pack-qkv")  # backends.onnx.gqa_fuse


@dataclass(frozen=True)
class Target:
    name: str
    flavour: str            # "portable" or "ort"
    summary: str            # what -o writes
    pipeline_23: str        # default pipeline at opset >= 23
    pipeline_old: str       # default pipeline at opsets 21 and 22

    def pipeline(self, opset: int) -> str:
        return self.pipeline_23 if opset >= 23 else self.pipeline_old


SCAN_CHUNK = "scan-chunk{size=64}"  # recurrent prefills in chunks (module docstring)

TARGETS = {
    "onnx": Target("onnx", "portable", "an ONNX model with standard ops (+ genai_config.json)",
                   f"dce,cse,{SCAN_CHUNK}", f"lower-norms,gqa-broadcast,dce,cse,{SCAN_CHUNK}"),
    "onnx-ort": Target("onnx-ort", "ort", "an ONNX model with ONNX Runtime contrib ops (+ genai_config.json)",
                       f"dce,cse,{SCAN_CHUNK}", f"dce,cse,{SCAN_CHUNK}"),
}


def add_arguments(parser) -> None:
    """The ONNX targets' own options on ``irc compile`` (None when not given). ``--weights``
    is every compile's option (the CLI adds it); these targets read it, ``none`` included."""
    parser.add_argument("--opset", type=int, default=None,
                        help=f"ONNX opset for --target onnx/onnx-ort (default {DEFAULT_OPSET}, at least {MIN_OPSET})")
    parser.add_argument("--dtype", default=None, choices=DTYPES,
                        help="ONNX targets: the type of float weights and activations (default auto: f32 on CPU, "
                             "the fastest exact model ONNX Runtime's CPU provider runs; quantized weights keep "
                             "their codes, with scales in this type)")
    parser.add_argument("--tied-head", default=None, choices=TIED_HEADS,
                        help="ONNX targets: how a head tied to the embedding reads the shared table (default auto: "
                             "fused, FusedMatMul(transB), the fastest, for onnx-ort; transpose for onnx: a Transpose "
                             "node ONNX Runtime folds at load, one copy in the file and the least peak memory; gemm: "
                             "Gemm(transB), but ONNX Runtime copies the logits in its Reshape)")
    parser.add_argument("--logits", default=None, choices=LOGITS,
                        help="ONNX targets: last (default: the last-logits pass after the pipeline, logits "
                             "[B, 1, V], all a generate loop such as onnxruntime-genai reads; a prefill skips the "
                             "head's work on every other position) or all ([B, T, V]: every position, for "
                             "perplexity or scoring)")
    parser.add_argument("--unfuse", default=None,
                        help="onnx-ort: fusions to turn off, comma-separated: gqa-rope (RoPE inside "
                             "GroupQueryAttention, do_rotary) and pack-qkv (one q|k|v MatMul feeding it)")


def resolve_options(target: str, options) -> tuple[int, str]:
    """(opset, weights) from the CLI's options (None: the default), checked."""
    opset = DEFAULT_OPSET if options.get("opset") is None else options["opset"]
    weights = "seeded" if options.get("weights") is None else options["weights"]
    check_options(target, opset, weights)
    return opset, weights


def resolve_tied_head(target: str, options) -> str:
    """``--tied-head`` checked (``backends.onnx.portable.shared_linear`` says what each does)."""
    layout = options.get("tied_head") or "auto"
    if layout not in TIED_HEADS:
        raise BackendError(f"--tied-head {layout!r} is not supported", hint=f"one of {', '.join(TIED_HEADS)}")
    if layout == "fused" and target != "onnx-ort":
        raise BackendError("--tied-head fused needs com.microsoft.FusedMatMul, an ONNX Runtime op",
                           hint="use --target onnx-ort, or gemm/transpose for --target onnx")
    return layout


def resolve_unfused(options) -> frozenset:
    """``--unfuse`` checked: the set of onnx-ort fusions turned off."""
    names = frozenset(n for n in (options.get("unfuse") or "").split(",") if n)
    unknown = sorted(names - set(FUSIONS))
    if unknown:
        raise BackendError(f"--unfuse {unknown[0]!r} is not a fusion", hint=f"fusions: {', '.join(FUSIONS)}")
    return names


def resolve_dtype(options) -> str:
    """The float type ``--dtype`` asks for; ``auto`` is f32, ONNX Runtime's CPU provider's
    fastest exact choice (``benchmarks/dtype_speed.py``: f32 weights decode as fast as bf16
    weights cast in the graph and load faster; f16 has no CPU kernels for MatMul and is not
    exact)."""
    dtype = options.get("dtype") or "auto"
    if dtype not in DTYPES:
        raise BackendError(f"--dtype {dtype!r} is not supported", hint=f"one of {', '.join(DTYPES)}")
    return "f32" if dtype == "auto" else dtype


def prelude(options) -> str:
    """Passes every ONNX compile runs before its pipeline: ``retype`` to the chosen float type
    (first, so quantization scales follow the activations)."""
    return f"retype{{dtype={resolve_dtype(options)}}}"


def postlude(options) -> str:
    """Passes every ONNX compile runs after its pipeline: ``last-logits`` unless ``--logits
    all``. Last, so the passes before it (and ``--eval-text``, which scores every position)
    see the whole logits; ``last-logits`` also narrows a quantized head."""
    logits = options.get("logits") or LOGITS[0]
    if logits not in LOGITS:
        raise BackendError(f"--logits {logits!r} is not supported", hint=f"one of {', '.join(LOGITS)}")
    return "last-logits" if logits == "last" else ""


def whole_pipeline(target: str, options) -> str:
    """What ``irc compile --target TARGET`` runs without ``--passes``: the prelude, the
    default pipeline at the chosen opset, the postlude."""
    opset = options.get("opset") or DEFAULT_OPSET
    return ",".join(p for p in (prelude(options), TARGETS[target].pipeline(opset), postlude(options)) if p)


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
