"""Two activations of 2025-26 decoders, each one op every target lowers:

    softplus(x) -> x's type
        torch's ``F.softplus`` (beta 1, threshold 20): x where x > 20, else log(1 + exp(x)),
        in float32 (Laguna's gates).

    xielu(x, alpha_p [1], alpha_n [1], beta [], eps []) -> x's type
        transformers' ``XIELUActivation`` (Apertus; arXiv 2411.13010), its Python form, with
        the learned parameters as the checkpoint stores them (``alpha_p`` and ``alpha_n``
        before their softplus; ``beta`` and ``eps`` the buffers):

            a_p = softplus(alpha_p),  a_n = beta + softplus(alpha_n)
            y = a_p·x·x + beta·x                          where x > 0
            y = (expm1(min(x, eps)) − x)·a_n + beta·x     elsewhere

All in float32 (the parameters widened from their dtype), the result in x's dtype. The
reference computes ``expm1`` exactly (NumPy's); the ONNX targets, which have no Expm1, write
exp(m) − 1: an absolute error under 2⁻²³·a_n per element (one float32 ulp of exp near 1),
far inside irc's 1e-4 relative agreement with transformers.

Cost: one operation per output element; every operand read once.
"""
from __future__ import annotations

import numpy as np

from irc import dims
from irc.ops.primitives import elementwise_cost
from irc.ops.registry import OpDef, TensorType, expect, register

SOFTPLUS_THRESHOLD = 20.0  # torch's F.softplus default: x itself above it


def softplus32(x) -> np.ndarray:
    """torch's softplus (beta 1, threshold 20) in float32."""
    x = np.asarray(x, dtype=np.float32)
    return np.where(x > SOFTPLUS_THRESHOLD, x, np.log1p(np.exp(np.minimum(x, SOFTPLUS_THRESHOLD)))).astype(np.float32)


def _softplus_infer(inputs, attrs):
    (x,) = inputs
    expect(x.dtype.is_float, f"softplus: needs a float operand, got {x.dtype}")
    return [TensorType(x.dtype, x.shape)]


def _softplus_reference(inputs, attrs):
    """x above the threshold, log1p(exp(x)) below it, in float32."""
    x = inputs[0]
    return [softplus32(x).astype(x.dtype)]


register(OpDef("softplus", ("x",), {}, _softplus_infer, _softplus_reference, elementwise_cost,
               doc="torch's softplus (beta 1, threshold 20): log(1 + exp(x)), x above 20."))

XIELU_PARAMS = {"alpha_p": (1,), "alpha_n": (1,), "beta": (), "eps": ()}  # as XIELUActivation stores them


def _xielu_infer(inputs, attrs):
    x, *params = inputs
    expect(x.dtype.is_float, f"xielu: needs a float operand, got {x.dtype}")
    for (name, shape), p in zip(XIELU_PARAMS.items(), params):
        expect(p.dtype.is_float and tuple(p.shape) == shape,
               f"xielu: {name} must be a float of shape {list(shape)}, got {p.dtype} {dims.format_shape(p.shape)}")
    return [TensorType(x.dtype, x.shape)]


def xielu32(x, alpha_p, alpha_n, beta, eps) -> np.ndarray:
    """XIELUActivation._xielu_python in float32 (the module docstring)."""
    x = np.asarray(x, dtype=np.float32)
    beta, eps = np.float32(beta), np.float32(eps)
    a_p = softplus32(alpha_p)
    a_n = beta + softplus32(alpha_n)
    positive = a_p * x * x + beta * x
    negative = (np.expm1(np.minimum(x, eps)) - x) * a_n + beta * x
    return np.where(x > 0, positive, negative).astype(np.float32)


def _xielu_reference(inputs, attrs):
    """The positive branch where x > 0, the expm1 branch elsewhere, in float32."""
    x, alpha_p, alpha_n, beta, eps = inputs
    return [xielu32(x, alpha_p, alpha_n, beta, eps).astype(x.dtype)]


register(OpDef("xielu", ("x", "alpha_p", "alpha_n", "beta", "eps"), {}, _xielu_infer, _xielu_reference,
               elementwise_cost, doc="xIELU (Apertus): learned alpha_p, alpha_n (before softplus), beta, eps."))
