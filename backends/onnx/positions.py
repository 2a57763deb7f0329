"""``sinusoidal_positions`` (``irc.ops.positions``, XGLM's and CTRL's positions) in standard ops,
the same for both ONNX targets: the rows (``position_ids`` + offset) cast to float,
unsqueezed and multiplied by the frequencies (a [dim // 2] f32 constant computed as the
reference computes it), ``Sin`` and ``Cos`` concatenated on the last axis (and a zero column
for an odd dim), then the ``padding_idx`` row zeroed by a ``Where``."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from irc.graph import Node
from irc.ops.positions import sinusoidal_frequencies

from backends.onnx.builder import Builder


def lower_sinusoidal_positions(b: Builder, node: Node, outs: list[str]) -> None:
    (positions,) = node.inputs
    dim, offset, pad = node.attrs["dim"], node.attrs["offset"], node.attrs["padding_idx"]
    out = outs[0]
    rows = b.op("Cast", [b.value(positions)], f"{out}/rows_i64", to=TensorProto.INT64)
    if offset:
        rows = b.op("Add", [rows, b.i64(offset, f"{out}/offset")], f"{out}/rows")
    rank = len(positions.shape)
    angles = b.op("Mul", [b.op("Unsqueeze", [b.op("Cast", [rows], f"{out}/rows_f32", to=TensorProto.FLOAT),
                                               b.i64([rank])], f"{out}/column"),
                          b.const(sinusoidal_frequencies(dim, node.attrs["frequencies"]), np.float32,
                                  f"{out}/frequencies")], f"{out}/angles")
    parts = [b.op("Sin", [angles], f"{out}/sin"), b.op("Cos", [angles], f"{out}/cos")]
    table = b.op("Concat", parts, f"{out}/sin_cos", axis=-1)
    if dim % 2:
        pads = b.i64([0] * (rank + 1) + [0] * rank + [1], f"{out}/pads")
        table = b.op("Pad", [table, pads], f"{out}/padded")
    if pad is None:
        b.node("Identity", [table], outs)
        return
    hit = b.op("Unsqueeze", [b.op("Equal", [rows, b.i64(pad, f"{out}/padding_idx")], f"{out}/is_pad"),
                             b.i64([rank])], f"{out}/pad_column")
    b.node("Where", [hit, b.const(0.0, np.float32, f"{out}/zero"), table], outs)


LOWERINGS = {"sinusoidal_positions": lower_sinusoidal_positions}
