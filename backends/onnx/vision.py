"""Standard ONNX ops for irc's vision ops (``irc.ops.vision``): the patch projection, the
image features merged into the token embeddings, the image blocks of a mask, Qwen-VL's patch
grid and its learned positions resampled to each image's grid, SigLIP 2's position grid resized
to each image (antialiased bilinear, from the runtime sizes). The portable table
(``backends.onnx.portable.LOWERINGS``) takes them whole; ONNX Runtime's target the same.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from irc.dtypes import DType
from irc.graph import Node, Param
from irc.ops.registry import pad_inputs
from irc.ops.vision import WINDOW_ID

from backends.onnx.builder import ONNX_TYPES, Builder

NUMPY_OF = {dtype: dtype.numpy for dtype in DType}


def lower_patch_embed(b: Builder, node: Node, outs: list[str]) -> None:
    """Conv(kernel = stride = p) [B, d, H/p, W/p], its grid flattened to [B, d, N] and
    transposed to [B, N, d]: the op as the checkpoint's Conv2d computes it (ONNX Runtime's
    Conv is one GEMM over the patches, the identity ``lower-patch-embed`` writes out)."""
    pixels, weight, bias = pad_inputs(node.inputs, 3)
    batch, count, width = node.outputs[0].shape
    patch = node.attrs["patch"]
    operands = [b.value(pixels)] + [b.weight(v, dtype=pixels.dtype) if isinstance(v, Param) else b.value(v)
                                    for v in (weight, bias) if v is not None]
    grid = b.op("Conv", operands, f"{outs[0]}/conv", kernel_shape=[patch, patch], strides=[patch, patch])
    flat = b.op("Reshape", [grid, b.shape([batch, width, count])], f"{outs[0]}/flat", allowzero=1)
    b.node("Transpose", [flat], outs, perm=[0, 2, 1])


def lower_merge_tokens(b: Builder, node: Node, outs: list[str]) -> None:
    """Where(ids == token and M > 0, the features' rows in placeholder order, embeds): each
    placeholder takes row cumsum(mask) - 1 of the features, every other position a zero row
    appended to them (so a step with no image, M = 0, gathers from [1, d] and keeps embeds)."""
    embeds, ids, features = node.inputs
    out = outs[0]
    rows = b.op("Shape", [b.value(features)], f"{out}/feature_rows", start=0, end=1)
    placeholder = b.op("Equal", [b.value(ids), b.const(node.attrs["token"], NUMPY_OF[ids.dtype], f"{out}/token")],
                       f"{out}/is_placeholder")
    mask = b.op("And", [placeholder, b.op("Greater", [rows, b.i64([0])], f"{out}/has_rows")], f"{out}/takes_row")
    flat = b.op("Reshape", [mask, b.i64([-1])], f"{out}/flat_mask")
    counted = b.op("CumSum", [b.op("Cast", [flat], f"{out}/mask_i64", to=TensorProto.INT64),
                              b.const(0, np.int64, f"{out}/axis0")], f"{out}/placeholders_so_far")
    order = b.op("Sub", [counted, b.i64([1])], f"{out}/feature_row")
    index = b.op("Where", [flat, order, rows], f"{out}/row")
    zero = b.const(np.zeros((1, features.shape[1])), NUMPY_OF[features.dtype], f"{out}/zero_row")
    padded = b.op("Concat", [b.value(features), zero], f"{out}/features_and_zero", axis=0)
    gathered = b.op("Gather", [padded, index], f"{out}/gathered", axis=0)
    placed = b.op("Reshape", [gathered, b.op("Shape", [b.value(embeds)], f"{out}/shape")], f"{out}/placed")
    keep = b.op("Unsqueeze", [mask, b.i64([-1])], f"{out}/mask_rows")
    b.node("Where", [keep, placed, b.value(embeds)], outs)


def lower_patch_grid(b: Builder, node: Node, outs: list[str]) -> None:
    """Each patch i of P: its image (how many images end at or before it), its place in that
    image, frame, m x m block and spot in the block, by integer Div and Mod
    (``irc.ops.vision.patch_grid``)."""
    grid, patches = node.inputs
    m, window, out = node.attrs["merge"], node.attrs["window"], outs[0]

    def op(kind: str, inputs: list, role: str, **attrs) -> str:
        return b.op(kind, inputs, f"{out}/{role}", **attrs)

    g = b.value(grid) if grid.dtype == DType.i64 else op("Cast", [b.value(grid)], "grid_i64", to=TensorProto.INT64)
    t, h, w = (op("Gather", [g, b.i64(k)], name, axis=1) for k, name in enumerate(("t", "h", "w")))
    frame = op("Mul", [h, w], "frame_patches")
    counts = op("Mul", [t, frame], "image_patches")
    zero = b.const(0, np.int64, f"{out}/axis0")
    ends = op("CumSum", [counts, zero], "image_ends")
    frames_before = op("CumSum", [t, zero], "frames_before", exclusive=1)
    count = op("Squeeze", [op("Shape", [b.value(patches)], "count1", start=0, end=1), b.i64([0])], "count")
    index = op("Range", [b.i64(0), count, b.i64(1)], "index")
    image = op("ReduceSum", [op("Cast", [op("GreaterOrEqual", [op("Unsqueeze", [index, b.i64([1])], "index_column"),
                                                               op("Unsqueeze", [ends, b.i64([0])], "ends_row")],
                                            "past_end")], "past_end_i64", to=TensorProto.INT64), b.i64([1])],
               "image", keepdims=0)

    def of_image(values: str, role: str) -> str:
        return op("Gather", [values, image], role, axis=0)

    local = op("Sub", [index, op("Sub", [of_image(ends, "end"), of_image(counts, "size")], "start")], "local")
    size = of_image(frame, "frame_size")
    spot = op("Mod", [local, size], "in_frame")
    frame_id = op("Add", [of_image(frames_before, "first_frame"), op("Div", [local, size], "frame_in_image")],
                  "frame_id")
    block, inner = op("Div", [spot, b.i64(m * m)], "block"), op("Mod", [spot, b.i64(m * m)], "in_block")
    columns = op("Div", [of_image(w, "width"), b.i64(m)], "block_columns")
    block_row, block_col = op("Div", [block, columns], "block_row"), op("Mod", [block, columns], "block_col")
    row = op("Add", [op("Mul", [block_row, b.i64(m)], "row_base"), op("Div", [inner, b.i64(m)], "inner_row")], "row")
    col = op("Add", [op("Mul", [block_col, b.i64(m)], "col_base"), op("Mod", [inner, b.i64(m)], "inner_col")], "col")
    cell = frame_id
    if window:
        cell = op("Add", [op("Mul", [frame_id, b.i64(WINDOW_ID)], "frame_windows"), op("Add", [
            op("Mul", [op("Div", [block_row, b.i64(window)], "window_row"), b.i64(1024)], "window_row_id"),
            op("Div", [block_col, b.i64(window)], "window_col")], "window_in_frame")], "window")
    rows = [op("Unsqueeze", [v, b.i64([0])], f"{role}_row") for v, role in
            ((row, "height"), (col, "width"), (frame_id, "frames"), (cell, "windows"),
             (of_image(h, "frame_height"), "frame_heights"), (of_image(w, "frame_width"), "frame_widths"))]
    b.node("Concat", rows, outs, axis=0)


def lower_image_blocks(b: Builder, node: Node, outs: list[str]) -> None:
    """Where(ids == token, cumsum(run starts) - 1, -1) along each row: a run starts where the
    token follows another id (a false column shifted in front)."""
    ids, out = node.inputs[0], outs[0]
    image = b.op("Equal", [b.value(ids), b.const(node.attrs["token"], NUMPY_OF[ids.dtype], f"{out}/token")],
                 f"{out}/is_image")
    if node.attrs["prefix"]:  # a row with an image is one block: Max over it, then -1 or 0 everywhere
        held = b.op("ReduceMax", [b.op("Cast", [image], f"{out}/image_i64", to=TensorProto.INT64), b.i64([1])],
                    f"{out}/holds_image", keepdims=1)
        b.node("Expand", [b.op("Sub", [held, b.i64(1)], f"{out}/row_block"), b.op("Shape", [b.value(ids)],
                                                                                     f"{out}/shape")], outs)
        return
    first = b.op("Slice", [image, b.i64([0]), b.i64([1]), b.i64([1])], f"{out}/first")
    before = b.op("Concat", [b.op("Xor", [first, first], f"{out}/no_image"),
                             b.op("Slice", [image, b.i64([0]), b.i64([-1]), b.i64([1])], f"{out}/all_but_last")],
                  f"{out}/previous", axis=1)
    starts = b.op("And", [image, b.op("Not", [before], f"{out}/previous_not")], f"{out}/starts")
    counted = b.op("CumSum", [b.op("Cast", [starts], f"{out}/starts_i64", to=TensorProto.INT64),
                              b.const(1, np.int64, f"{out}/axis1")], f"{out}/runs_so_far")
    number = b.op("Sub", [counted, b.i64(1)], f"{out}/run")
    b.node("Where", [image, number, b.i64(-1)], outs)


def lower_resample_positions(b: Builder, node: Node, outs: list[str]) -> None:
    """Per axis: source = index·(S - 1) / max(size - 1, 1), its floor and the next index
    (clamped), weights 1 - f and f; then four Gathers of the table weighted and summed
    (``irc.ops.vision.resample_positions``)."""
    table, where = node.inputs
    side, out = node.attrs["side"], outs[0]
    dtype = NUMPY_OF[table.dtype]

    def op(kind: str, inputs: list, role: str, **attrs) -> str:
        return b.op(kind, inputs, f"{out}/{role}", **attrs)

    grid = b.value(where)

    def axis(index_row: int, size_row: int, name: str) -> tuple[list, list]:
        index, size = (op("Cast", [op("Gather", [grid, b.i64(k)], f"{name}_{role}", axis=0)], f"{name}_{role}_f32",
                          to=TensorProto.FLOAT) for k, role in ((index_row, "index"), (size_row, "size")))
        span = op("Max", [op("Sub", [size, b.const(1.0, np.float32, f"{out}/one")], f"{name}_size_less_one"),
                          b.const(1.0, np.float32, f"{out}/one")], f"{name}_span")
        source = op("Div", [op("Mul", [index, b.const(float(side - 1), np.float32, f"{out}/last")], f"{name}_scaled"),
                            span], f"{name}_source")
        floor = op("Floor", [source], f"{name}_floor")
        frac = op("Sub", [source, floor], f"{name}_frac")
        low = op("Cast", [floor], f"{name}_low", to=TensorProto.INT64)
        high = op("Min", [op("Add", [low, b.i64(1)], f"{name}_next"), b.i64(side - 1)], f"{name}_high")
        return [low, high], [op("Sub", [b.const(1.0, np.float32, f"{out}/one"), frac], f"{name}_low_weight"), frac]

    (row_taps, row_weights), (col_taps, col_weights) = axis(0, 4, "row"), axis(1, 5, "col")
    values = b.weight(table) if isinstance(table, Param) else b.value(table)
    terms = []
    for i in range(2):
        for j in range(2):
            index = op("Add", [op("Mul", [row_taps[i], b.i64(side)], f"row{i}_base"), col_taps[j]], f"tap{i}{j}")
            weight = op("Mul", [row_weights[i], col_weights[j]], f"weight{i}{j}")
            if dtype != np.float32:
                weight = op("Cast", [weight], f"weight{i}{j}_cast", to=ONNX_TYPES[table.dtype])
            terms.append(op("Mul", [op("Gather", [values, index], f"rows{i}{j}", axis=0),
                                    op("Unsqueeze", [weight, b.i64([1])], f"weight{i}{j}_column")], f"term{i}{j}"))
    b.node("Sum", terms, outs)


def lower_resize_positions(b: Builder, node: Node, outs: list[str]) -> None:
    """From the runtime ``shapes``: each of the L rows' (row, column) in its image (integer Div
    by the width and what it leaves; 0, 0 for the padding rows), per axis its weights over the S
    grid lines in float32 (centre (i + 0.5)·S/n - 0.5, triangle max(0, 1 - |j - centre| /
    max(S/n, 1)), normalised: ``irc.ops.vision.antialiased_bilinear``), their outer product
    [B, L, S·S] times the table (``irc.ops.vision.resize_positions``). One graph for any sizes."""
    table, shapes, patches = node.inputs
    side, out = node.attrs["side"], outs[0]

    def op(kind: str, inputs: list, role: str, **attrs) -> str:
        return b.op(kind, inputs, f"{out}/{role}", **attrs)

    def number(value: float) -> str:
        return b.const(value, np.float32, f"{out}/number")

    sizes = b.value(shapes) if shapes.dtype == DType.i64 else op("Cast", [b.value(shapes)], "shapes_i64",
                                                                  to=TensorProto.INT64)
    height, width = (op("Slice", [sizes, b.i64([k]), b.i64([k + 1]), b.i64([1])], name)
                     for k, name in enumerate(("height", "width")))
    length = op("Squeeze", [op("Shape", [b.value(patches)], "length1", start=1, end=2), b.i64([0])], "length")
    index = op("Range", [b.i64(0), length, b.i64(1)], "index")
    inside = op("Less", [index, op("Mul", [height, width], "count")], "inside")
    row = op("Div", [index, width], "row_in_image")
    col = op("Sub", [index, op("Mul", [row, width], "row_start")], "col_in_image")
    lines = b.const(np.arange(side, dtype=np.float32), np.float32, f"{out}/grid_lines")

    def weights(place: str, size: str, name: str) -> str:
        at = op("Cast", [op("Where", [inside, place, b.i64(0)], f"{name}_index")], f"{name}_f32",
                to=TensorProto.FLOAT)
        scale = op("Div", [number(float(side)), op("Cast", [size], f"{name}_size", to=TensorProto.FLOAT)],
                   f"{name}_scale")
        center = op("Sub", [op("Mul", [op("Add", [at, number(0.5)], f"{name}_mid"), scale], f"{name}_mid_scaled"),
                            number(0.5)], f"{name}_center")
        distance = op("Abs", [op("Sub", [lines, op("Unsqueeze", [center, b.i64([-1])], f"{name}_center_column")],
                                 f"{name}_offset")], f"{name}_distance")
        support = op("Unsqueeze", [op("Max", [scale, number(1.0)], f"{name}_support"), b.i64([-1])],
                     f"{name}_support_column")
        triangle = op("Max", [op("Sub", [number(1.0), op("Div", [distance, support], f"{name}_reach")],
                                 f"{name}_tent"), number(0.0)], f"{name}_triangle")
        return op("Div", [triangle, op("ReduceSum", [triangle, b.i64([-1])], f"{name}_total", keepdims=1)],
                  f"{name}_weights")

    outer = op("Mul", [op("Unsqueeze", [weights(row, height, "row"), b.i64([-1])], "row_weights_column"),
                       op("Unsqueeze", [weights(col, width, "col"), b.i64([-2])], "col_weights_row")], "outer")
    flat = op("Reshape", [outer, b.i64([0, 0, side * side])], "grid_weights")
    values = b.weight(table, dtype=DType.f32) if isinstance(table, Param) else b.value(table)
    if not isinstance(table, Param) and table.dtype != DType.f32:
        values = op("Cast", [values], "table_f32", to=TensorProto.FLOAT)
    if table.dtype == DType.f32:
        b.node("MatMul", [flat, values], outs)
    else:
        b.node("Cast", [op("MatMul", [flat, values], "resized_f32")], outs, to=ONNX_TYPES[table.dtype])


VISION_LOWERINGS = {"patch_embed": lower_patch_embed, "merge_tokens": lower_merge_tokens,
                    "image_blocks": lower_image_blocks, "patch_grid": lower_patch_grid,
                    "resample_positions": lower_resample_positions, "resize_positions": lower_resize_positions}
