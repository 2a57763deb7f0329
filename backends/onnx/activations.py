"""``softplus`` and ``xielu`` (``irc.ops.activations``) in standard ONNX ops, the same for
both ONNX targets and for onnx-npu (static shapes: no op here reads a dim):

- ``softplus``: ``Softplus`` (ONNX Runtime evaluates it stably, x + log1p(exp(−x)) for
  x > 0; torch's threshold 20 changes nothing in float32 there);
- ``xielu``: the parameters' softplus on their [1] initializers (a constant expression
  ONNX Runtime folds), then Mul/Add for x > 0 and Min, Exp, Sub for the rest, joined by
  ``Where(Greater(x, 0))``; expm1 is written exp(m) − 1 (the op's docstring bounds the
  difference). The arithmetic is in x's float type, the parameters cast to it."""
from __future__ import annotations

from irc.graph import Node, Param

from backends.onnx.builder import ONNX_TYPES, Builder


def _operand(b: Builder, value, dtype) -> str:
    """A parameter read in x's float type (cast once per initializer where they differ)."""
    if isinstance(value, Param):
        return b.weight(value, dtype=dtype)
    name = b.value(value)
    return name if value.dtype == dtype else b.op("Cast", [name], f"{name}/as_x", to=ONNX_TYPES[dtype])


def lower_softplus(b: Builder, node: Node, outs: list[str]) -> None:
    b.node("Softplus", [b.value(node.inputs[0])], outs)


def lower_xielu(b: Builder, node: Node, outs: list[str]) -> None:
    x_value, *params = node.inputs
    dtype, out = x_value.dtype, outs[0]
    x = b.value(x_value)
    alpha_p, alpha_n, beta, eps = (_operand(b, p, dtype) for p in params)
    numpy_type = dtype.numpy
    a_p = b.op("Softplus", [alpha_p], f"{out}/a_p")
    a_n = b.op("Add", [beta, b.op("Softplus", [alpha_n], f"{out}/softplus_alpha_n")], f"{out}/a_n")
    beta_x = b.op("Mul", [beta, x], f"{out}/beta_x")
    positive = b.op("Add", [b.op("Mul", [b.op("Mul", [a_p, x], f"{out}/a_p_x"), x], f"{out}/a_p_x_x"), beta_x],
                    f"{out}/positive")
    exp = b.op("Exp", [b.op("Min", [x, eps], f"{out}/min_eps")], f"{out}/exp")
    expm1 = b.op("Sub", [exp, b.const(1.0, numpy_type, f"{out}/one")], f"{out}/expm1")
    negative = b.op("Add", [b.op("Mul", [b.op("Sub", [expm1, x], f"{out}/expm1_minus_x"), a_n], f"{out}/scaled"),
                            beta_x], f"{out}/negative")
    above = b.op("Greater", [x, b.const(0.0, numpy_type, f"{out}/zero")], f"{out}/above")
    b.node("Where", [above, positive, negative], outs)


LOWERINGS = {"softplus": lower_softplus, "xielu": lower_xielu}

__all__ = ["LOWERINGS", "lower_softplus", "lower_xielu"]
