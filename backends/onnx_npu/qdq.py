"""W8A16 and W4A16 for onnx-npu: QDQ around every linear layer, ranges from calibration.

Placement is the minimal standard QDQ unit, which ONNX Runtime's CPU provider runs as it
is and the QNN provider folds into one quantized HTP MatMul:

    x -> QuantizeLinear(uint16) -> DequantizeLinear ┐
    W_q (int8 or int4, [in, out]) -> DequantizeLinear(axis=1) -> MatMul -> QuantizeLinear(uint16)
                                                                        -> DequantizeLinear -> y

- weights: symmetric, per output channel (one f32 scale per column of W^T, zero point 0),
  int8 for ``w8a16`` and int4 for ``w4a16``. Per channel because that is what the HTP
  compile forms a quantized unit from: with per-channel int4 the QNN log shows a
  ``FullyConnected`` over a UFIXED_POINT_16 activation and an AXIS_SCALE_OFFSET weight;
  with blocked int4 (``block_size`` 32) the compile succeeds but the MatMul runs on a
  FLOAT_16 activation with an "Unknown quantization encoding" weight (checked 2026-11-30,
  onnxruntime-qnn 2.7.0);
- activations: asymmetric uint16 over the range [min(lo, 0), max(hi, 0)] of the tensor on
  the calibration text, as the reference interpreter computes it on the float graph,
  widened by ``MARGIN``: a calibration text never shows every activation's extreme, and
  clipping a held-out value costs far more than the 0.6 bit of 16 the widening does (on
  tiny-llama3, w8a16 logits against the interpreter: 0.26 max relative error without the
  margin, 0.024 with it).

Only the graph's own ``linear`` nodes are quantized (attention projections, the MLP after
``lower-mlp``, the LM head); the rest (norms, RoPE, attention's softmax, MoE experts, MLA
internals) stays float and the HTP runs it at fp16. The calibration text is tokenized with
the spec's ``tokenizer.json`` when it carries one, else read as token ids (comma- or
space-separated); fewer than ``MIN_TOKENS`` tokens cannot give ranges and are refused.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from irc.dtypes import DType
from irc.errors import BackendError
from irc.evaluate import StreamingInterpreter, load_tokenizer, prefill_logits, windows
from irc.graph import Graph, Node

MIN_TOKENS = 16
MARGIN = 1.5
WINDOW = 256
BITS = {"w8a16": 8, "w4a16": 4}
ACTIVATION_LEVELS = 65535


@dataclass
class QuantPlan:
    """What ``lower.lower_linear`` reads: weight bits and each activation's calibrated range."""

    bits: int
    ranges: dict = field(default_factory=dict)      # irc value name -> (lo, hi)
    tokens: int = 0
    quantized: list = field(default_factory=list)   # weight names, in order met

    def covers(self, x, out) -> bool:
        return x.name in self.ranges and out.name in self.ranges


def calibration_tokens(path: str, files: Mapping[str, object], vocab: int) -> list[int]:
    """The calibration text's token ids (module docstring)."""
    if not path or not os.path.isfile(path):
        raise BackendError(f"calibration text {path!r} is not a file", location=str(path))
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    tokenizer = files.get("tokenizer.json")
    if tokenizer is not None:
        ids = load_tokenizer(tokenizer, BackendError).encode(text).ids
    elif re.fullmatch(r"[\s,0-9]*", text):
        ids = [int(t) for t in re.split(r"[\s,]+", text.strip()) if t]
    else:
        raise BackendError("the calibration text is not token ids and the spec carries no tokenizer.json",
                           location=path, hint="give comma- or space-separated token ids, or compile a spec "
                                               "with a tokenizer (a Hugging Face folder, a GGUF file)")
    if vocab and any(not 0 <= t < vocab for t in ids):
        raise BackendError(f"calibration token ids must lie in [0, {vocab})", location=path)
    if len(ids) < MIN_TOKENS:
        raise BackendError(f"the calibration text is too short to give ranges: {len(ids)} token(s), at least "
                           f"{MIN_TOKENS} needed", location=path, hint="give a longer text")
    return ids


class RangeRecorder(StreamingInterpreter):
    """Records min and max of every linear node's input and output."""

    def __init__(self, graph: Graph, seed: int):
        super().__init__(graph, seed)
        self.ranges: dict = {}

    def run_node(self, node: Node, args: list, bindings) -> list:
        results = super().run_node(node, args, bindings)
        if node.op == "linear":
            if len(args) > 2 and args[2] is not None:
                self.ranges[f"{node.outputs[0].name}/bias"] = float(np.abs(args[2]).max())
            for value, array in ((node.inputs[0], args[0]), (node.outputs[0], results[0])):
                lo, hi = float(np.min(array)), float(np.max(array))
                old = self.ranges.get(value.name, (lo, hi))
                self.ranges[value.name] = (min(old[0], lo), max(old[1], hi))
        return results


def calibrate(graph: Graph, tokens: Sequence[int], bits: int, seed: int, window: int = WINDOW) -> QuantPlan:
    """Ranges of the linear layers' activations over ``tokens``, in prefills of ``window``."""
    runner = RangeRecorder(graph.clone(), seed)
    for chunk in windows(tokens, window):
        prefill_logits(runner, chunk)
    return QuantPlan(bits, runner.ranges, len(tokens))


# ---- the weights ------------------------------------------------------------------------

def weight_scales(bits: int, weight) -> np.ndarray:
    """[out] f32: max |W[o, :]| / qmax (1 where a row is all zeros)."""
    w = np.asarray(weight, np.float32)
    peak = np.abs(w).max(axis=1)
    return np.where(peak > 0, peak / (2 ** (bits - 1) - 1), 1.0).astype(np.float32)


def weight_codes(bits: int, weight) -> np.ndarray:
    """[in, out] codes: round(W / scale) clipped to [-qmax, qmax], transposed for MatMul."""
    w = np.asarray(weight, np.float32)
    qmax = 2 ** (bits - 1) - 1
    codes = np.clip(np.rint(w / weight_scales(bits, w)[:, None]), -qmax, qmax)
    return np.ascontiguousarray(codes.T).astype(np.int8)


def activation_qparams(lo: float, hi: float) -> tuple[float, int]:
    """(scale, uint16 zero point) for the range [lo, hi] widened to hold 0, times ``MARGIN``."""
    lo, hi = min(lo, 0.0) * MARGIN, max(hi, 0.0) * MARGIN
    scale = (hi - lo) / ACTIVATION_LEVELS if hi > lo else 1.0
    return scale, int(np.clip(np.rint(-lo / scale), 0, ACTIVATION_LEVELS))


def fake_quantize(x: str, b, lo: float, hi: float, hint: str) -> str:
    """QuantizeLinear -> DequantizeLinear (uint16) of tensor ``x``."""
    scale, zero = activation_qparams(lo, hi)
    scale_name = b.const(scale, np.float32, f"{hint}/scale")
    zero_name = b.const(zero, np.uint16, f"{hint}/zero_point")
    codes = b.cached(("quantize", x), lambda: b.op("QuantizeLinear", [x, scale_name, zero_name], f"{hint}/q"))
    return b.op("DequantizeLinear", [codes, scale_name, zero_name], f"{hint}/dq")


def quantized_linear(b, plan: QuantPlan, x, weight, out, product: str) -> None:
    """The QDQ unit of the module docstring for ``linear x, weight`` (no bias) writing
    ``product``; ``out`` is the linear's irc output, whose range the result is quantized to
    (widened by the bias's largest magnitude when a bias is added after)."""
    bits, name = plan.bits, weight.name
    if name not in plan.quantized:
        plan.quantized.append(name)
    x_dq = fake_quantize(b.value(x), b, *plan.ranges[x.name], f"{x.name}/act")
    codes = b.derived(f"{name}.q{bits}", DType.i8 if bits == 8 else DType.i4, tuple(reversed(weight.shape)),
                      (weight,), functools.partial(weight_codes, bits))
    scales = b.derived(f"{name}.scale", DType.f32, (weight.shape[0],), (weight,),
                       functools.partial(weight_scales, bits))
    w_dq = b.op("DequantizeLinear", [codes, scales], f"{name}/dq", axis=1)
    matmul = b.op("MatMul", [x_dq, w_dq], f"{product}/matmul")
    lo, hi = plan.ranges[out.name]
    margin = plan.ranges.get(f"{out.name}/bias", 0.0)
    scale, zero = activation_qparams(lo - margin, hi + margin)
    scale_name = b.const(scale, np.float32, f"{product}/act/scale")
    zero_name = b.const(zero, np.uint16, f"{product}/act/zero_point")
    codes_out = b.op("QuantizeLinear", [matmul, scale_name, zero_name], f"{product}/act/q")
    b.node("DequantizeLinear", [codes_out, scale_name, zero_name], [product])


def output_step(plan: QuantPlan, name: str) -> float:
    """The quantization step of activation ``name`` (the logits: one step of error)."""
    return activation_qparams(*plan.ranges[name])[0]

