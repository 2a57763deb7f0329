"""Norms as lines of a row kernel (``backends.triton.kernels.elementwise.row_kernel``).

RMSNorm and LayerNorm reduce over the row held in registers, so a residual add before the
norm (and Gemma's post-norm before that add) fuse into the same kernel: the row is loaded
once, the sum stored for the residual stream, the normalised row stored for the next
matmul. Reductions mask the padding columns (BLOCK_D >= D), which elementwise steps may
have made nonzero.
"""
from __future__ import annotations

from irc.dtypes import DType

from backends.triton.kernels import round_to

NORMS = ("rms_norm", "layer_norm")


def rms_norm_lines(out: str, x: str, weight: str, eps: float, offset: float, result: DType) -> list[str]:
    """x / sqrt(mean(x^2) + eps) * (weight + offset), as ``irc.ops.nn.rms_norm``."""
    scale = f"({weight} + {float(offset)!r})" if offset else weight
    return [f"{out}_ms = tl.sum(tl.where(tile_ok, {x} * {x}, 0.0), axis=1) / D",
            f"{out} = {x} / tl.sqrt_rn({out}_ms + {float(eps)!r})[:, None] * {scale}",
            f"{out} = {round_to(out, result)}" if result != DType.f32 else ""]


def layer_norm_lines(out: str, x: str, weight: str, bias, eps: float, result: DType) -> list[str]:
    """(x - mean) / sqrt(var + eps) * weight (+ bias), as the ``layer_norm`` reference."""
    lines = [f"{out}_mean = tl.sum(tl.where(tile_ok, {x}, 0.0), axis=1)[:, None] / D",
             f"{out}_c = tl.where(tile_ok, {x} - {out}_mean, 0.0)",
             f"{out}_var = tl.sum({out}_c * {out}_c, axis=1)[:, None] / D",
             f"{out} = {out}_c / tl.sqrt_rn({out}_var + {float(eps)!r}) * {weight}"]
    if bias is not None:
        lines.append(f"{out} = {out} + {bias}")
    if result != DType.f32:
        lines.append(f"{out} = {round_to(out, result)}")
    return lines


def norm_lines(op: str, attrs: dict, out: str, args: list, result: DType) -> list[str]:
    """The lines for a norm node: ``args`` are the operand tile names (None if omitted)."""
    if op == "rms_norm":
        return [line for line in rms_norm_lines(out, args[0], args[1], attrs["eps"], attrs["offset"], result) if line]
    if op == "layer_norm":
        return layer_norm_lines(out, args[0], args[1], args[2] if len(args) > 2 else None, attrs["eps"], result)
    raise KeyError(op)
