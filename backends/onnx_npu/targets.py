"""The onnx-npu target's options, checks and default pipeline (plain data, no onnx import).

- ``--chunk T``: tokens per prefill call (default 16); a second graph takes one token;
- ``--context N`` (global): the fixed KV-cache length, N >= T;
- ``--precision``: ``fp16`` (the default: f16 weights and activations; the HTP also compiles
  f32 graphs, at fp16 precision), ``f32``, ``w8a16`` and ``w4a16`` (QDQ: int8 or int4
  per-channel weights, uint16 activations, ranges from ``--calibration``);
- ``--calibration FILE``: a text (tokenized with the spec's tokenizer when it has one, else
  comma- or space-separated token ids) that the reference interpreter runs to record the
  activation ranges of the quantized precisions; for an image encoder, a ``.npy`` of
  preprocessed pixel values [N, C, H, W] (``backends.onnx_npu.vision``).
"""
from __future__ import annotations

from irc.errors import BackendError

PRECISIONS = ("fp16", "f32", "w8a16", "w4a16")
DEFAULT_CHUNK = 16
ARGUMENTS = ("chunk", "precision", "calibration")
PIPELINE = "fix-image-grid,lower-patch-embed,lower-norms,lower-mlp,lower-softcap,fold,dce,cse"


def add_arguments(parser) -> None:
    parser.add_argument("--chunk", type=int, default=None,
                        help=f"onnx-npu: tokens per prefill call (default {DEFAULT_CHUNK}); a T=1 decode graph "
                             "shares the weights; --context is the fixed KV-cache length")
    parser.add_argument("--precision", default=None, choices=PRECISIONS,
                        help="onnx-npu: fp16 (default), f32, or QDQ w8a16 / w4a16 (int8 / int4 weights per "
                             "channel, uint16 activations; needs --calibration)")
    parser.add_argument("--calibration", default=None,
                        help="onnx-npu: a calibration text (or token ids) for the w8a16/w4a16 activation ranges; "
                             "an image encoder's: a .npy of pixel values [N, C, H, W]")


def resolve(options) -> dict:
    """chunk, precision and calibration from the CLI's options (None: the default), checked."""
    chunk = DEFAULT_CHUNK if options.get("chunk") is None else options["chunk"]
    precision = options.get("precision") or "fp16"
    if not isinstance(chunk, int) or chunk < 1:
        raise BackendError(f"--chunk {chunk} must be a positive number of tokens",
                           hint=f"the default is {DEFAULT_CHUNK}")
    if precision not in PRECISIONS:
        raise BackendError(f"--precision {precision!r} is not supported", hint=f"one of {', '.join(PRECISIONS)}")
    calibration = options.get("calibration")
    if precision in ("w8a16", "w4a16") and not calibration:
        raise BackendError(f"--precision {precision} needs --calibration FILE",
                           hint="a text the reference interpreter runs to record activation ranges")
    if calibration and precision not in ("w8a16", "w4a16"):
        raise BackendError(f"--calibration applies to --precision w8a16 or w4a16, not {precision}",
                           hint="drop --calibration, or choose a quantized precision")
    return {"chunk": chunk, "precision": precision, "calibration": calibration}


def check_context(context, chunk: int) -> int:
    if not isinstance(context, int) or context < 1:
        raise BackendError(f"--context {context} must be a positive number of cache slots")
    if context < chunk:
        raise BackendError(f"--context {context} is smaller than --chunk {chunk}",
                           hint="the cache must hold at least one chunk: raise --context or lower --chunk")
    return context


def pipeline(options) -> str:
    resolve(options)  # bad options fail before any pass runs
    return PIPELINE


def prelude(options) -> str:
    """``retype`` to the float type of the precision (QDQ graphs are f32 around their codes)."""
    precision = resolve(options)["precision"]
    return f"retype{{dtype={'f16' if precision == 'fp16' else 'f32'}}}"
