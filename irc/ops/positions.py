"""``sinusoidal_positions``: sinusoidal position embeddings, computed rather than stored
(XGLM's fairseq table, transformers' ``XGLMSinusoidalPositionalEmbedding``; CTRL's
``positional_encoding``), the fourth position encoding beside learned tables
(``Model.embed_positions``), RoPE and ALiBi.

    sinusoidal_positions(position_ids i64 [...]) {dim, offset, padding_idx, frequencies} -> f32 [..., dim]

Each position p is read as table row r = p + ``offset`` (XGLM's 2), and row r is

    [sin(r·f_0), ..., sin(r·f_{h-1}), cos(r·f_0), ..., cos(r·f_{h-1})]  (+ one 0 if dim is odd)

for h = dim // 2 and, with ``frequencies`` "fairseq" (the default), f_i = exp(−i · log(10000)
/ (h − 1)); with "transformer" (CTRL's ``angle_defn``, "Attention Is All You Need"'s spacing;
an even dim), f_i = 1 / 10000^(2i / dim). The sines then the cosines, not
interleaved (tensor2tensor's layout, which fairseq and transformers keep). The row
``padding_idx`` (XGLM: ``pad_token_id``) is zeros; None zeros no row. All in float32 as
transformers computes the table (the frequencies in float32, r·f_i a float32 product), so the
table has no length: a position past ``max_position_embeddings`` is what transformers gets
when it grows its table.

Cost: a multiply and a sine or cosine per output element; the positions read, the result written.
"""
from __future__ import annotations

import math

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.ops.primitives import elementwise_cost
from irc.ops.registry import REQUIRED, OpDef, TensorType, expect, register

OP = "sinusoidal_positions"


FREQUENCIES = ("fairseq", "transformer")


def sinusoidal_frequencies(dim: int, frequencies: str = "fairseq") -> np.ndarray:
    """[dim // 2] f32: "fairseq": exp(−i · log(10000) / (dim // 2 − 1)), the exponent a float32
    product as transformers forms it, its exp rounded from float64 (torch's float32 exp agrees
    with the rounded value far more often than NumPy's float32 exp does); "transformer":
    1 / 10000^(2i / dim), the exponent and the power float32 as CTRL's ``angle_defn`` forms them
    (the power rounded from float64)."""
    half = dim // 2
    if frequencies == "transformer":
        exponent = np.arange(half, dtype=np.float32) * np.float32(2) / np.float32(dim)
        power = np.power(np.float64(10000.0), exponent.astype(np.float64)).astype(np.float32)
        return (np.float32(1.0) / power).astype(np.float32)
    step = math.log(10000) / (half - 1)
    exponent = np.arange(half, dtype=np.float32) * np.float32(-step)
    return np.exp(exponent.astype(np.float64)).astype(np.float32)


def sinusoidal_rows(rows, dim: int, padding_idx=None, frequencies: str = "fairseq") -> np.ndarray:
    """f32 [..., dim]: the sinusoidal table's rows ``rows`` (integers), sines | cosines."""
    rows = np.asarray(rows, dtype=np.int64)
    angles = rows.astype(np.float32)[..., None] * sinusoidal_frequencies(dim, frequencies)
    parts = [np.sin(angles), np.cos(angles)]
    if dim % 2:
        parts.append(np.zeros(rows.shape + (1,), np.float32))
    out = np.concatenate(parts, axis=-1).astype(np.float32)
    if padding_idx is not None:
        out = np.where((rows == padding_idx)[..., None], np.float32(0.0), out).astype(np.float32)
    return out


def _infer(inputs, attrs):
    (positions,) = inputs
    dim, offset, pad = attrs["dim"], attrs["offset"], attrs["padding_idx"]
    expect(isinstance(dim, int) and not isinstance(dim, bool) and dim >= 4,
           f"{OP}: dim must be an int >= 4 (the frequencies divide by dim // 2 - 1), got {dim!r}")
    expect(attrs["frequencies"] in FREQUENCIES,
           f"{OP}: frequencies must be one of {', '.join(FREQUENCIES)}, got {attrs['frequencies']!r}")
    expect(attrs["frequencies"] == "fairseq" or dim % 2 == 0,
           f"{OP}: the transformer frequencies need an even dim, got {dim}")
    expect(isinstance(offset, int) and not isinstance(offset, bool), f"{OP}: offset must be an int, got {offset!r}")
    expect(pad is None or (isinstance(pad, int) and not isinstance(pad, bool)),
           f"{OP}: padding_idx must be an int or None, got {pad!r}")
    expect(positions.dtype in (DType.i64, DType.i32),
           f"{OP}: position_ids must be integers, got {positions.dtype} {dims.format_shape(positions.shape)}")
    return [TensorType(DType.f32, tuple(positions.shape) + (dim,))]


def _reference(inputs, attrs):
    """The table rows at position_ids + offset (the module docstring)."""
    rows = np.asarray(inputs[0], dtype=np.int64) + attrs["offset"]
    return [sinusoidal_rows(rows, attrs["dim"], attrs["padding_idx"], attrs["frequencies"])]


register(OpDef(OP, ("position_ids",), {"dim": REQUIRED, "offset": 0, "padding_idx": None, "frequencies": "fairseq"},
               _infer, _reference, elementwise_cost))
