"""Vision ops: ``patch_embed``, a ViT's patch projection, and ``merge_tokens``, a VLM's
image features put in place of its image placeholder tokens.

``patch_embed(pixel_values [B, C, H, W], weight [d, C, p, p], bias? [d]) {patch: p}`` ->
[B, ⌊H/p⌋·⌊W/p⌋, d]: the image cut into non-overlapping p x p patches, row by row (patch
(i, j) is row i·⌊W/p⌋ + j), each flattened channel-major (c, y, x) and projected by the
weight flattened the same way. It is the Conv2d with kernel = stride = p that ViT, CLIP,
SigLIP and DINOv2 checkpoints hold, followed by transformers' ``flatten(2).transpose(1, 2)``;
like that convolution it drops the last H mod p rows and W mod p columns (SigLIP-so400m's 384
pixels in patches of 14 give 27 x 27). Without overlap the convolution is a matmul of the
patches by the flattened weight (the seeds' identity), which ``lower-patch-embed`` writes out
with slice, reshape, transpose and ``linear`` for the targets. H and W are ints, at least p.

``image_blocks(ids [B, T]) {token: t, prefix: false}`` -> i64 [B, T]: each run of ``t`` ids
numbered 0, 1, ... along its row, -1 elsewhere: the ``blocks`` operand of ``attention`` with
which one image's tokens see each other (Gemma 3; ``irc.ops.attention``). With ``prefix``, a
row that holds a ``t`` is one block 0 (PaliGemma's prefix-LM: the prompt with its image seen
whole; a chunk without one, a decode step, stays causal).

``merge_tokens(embeds [B, S, d], ids [B, S], features [M, d]) {token: t}`` -> [B, S, d]: the
embeddings with the row of every id equal to ``t`` replaced, in order (batch row by batch row,
left to right), by the next row of ``features``; transformers' ``masked_scatter`` of a VLM's
image features into its token embeddings. With M = 0 (a step without an image) the embeddings
pass unchanged, a placeholder id included (transformers merges nothing without pixel
values); otherwise the placeholders must number exactly M: the reference refuses a mismatch
(the ONNX lowering reads missing rows as zeros; ``irc run`` checks the count first).

``patch_grid(grid [N, 3], patches [P, ...]) {merge: m, window: W}`` -> i64 [6, P]: where each
of the P flattened patches of Qwen-VL's processor sits, the images' ``image_grid_thw`` rows
(t, h, w) one after another, each frame's patches in merge-window order (m x m blocks row by
row, each block row by row): row 0 the patch's row in its frame, row 1 its column (the vision
tower's 2-D RoPE positions, transformers' ``rot_pos_emb``), row 2 its frame's number over all
images (the blocks of full attention: ``cu_seqlens``), row 3 its attention window's id
(frame · 2^20 + (row block / W) · 2^10 + column block / W over the m x m blocks; Qwen2.5-VL's
``get_window_index``; without ``window``, row 2 again), rows 4 and 5 its frame's height and
width in patches (what a learned position table is resampled to). Ids only compare equal or not, so the
tokens keep the processor's order where transformers permutes them into windows and back.
The reference refuses grids whose patches do not number P or whose sides m does not divide.

``resample_positions(table [S·S, d], where [6, P]) {side: S}`` -> [P, d]: each patch's learned
position, the S x S ``table`` (row-major) resampled bilinearly, corners aligned, to its
frame's h x w grid at its (row, column), both read from ``patch_grid``'s rows: source row
r·(S - 1) / max(h - 1, 1), its floor and the next row (clamped to S - 1) weighted 1 - f and f,
the same across columns, four rows of the table summed. Qwen3-VL's and Qwen3.5's towers
(transformers' ``get_vision_interpolation_indices_and_weights``, bilinear, align_corners).

``resize_positions(table [S·S, d], shapes [B, 2], patches [B, L, ...]) {side: S}`` -> [B, L, d]:
the S x S ``table`` (row-major) resized to each image's h x w = ``shapes[b]`` as torch's
``F.interpolate(mode="bilinear", align_corners=False, antialias=True)`` resizes it, in float32:
A_h @ grid @ A_w^T with A = ``antialiased_bilinear(S, n)`` per axis, flattened row by row into
rows 0 .. h·w - 1 of image b; rows h·w .. L - 1 (the processor's padding patches) repeat row 0.
SigLIP 2's NaFlex positions (transformers' ``Siglip2VisionEmbeddings.resize_positional_embeddings``).
L is ``patches``' second dim; the reference refuses a side below 1 or h·w over L.
"""
from __future__ import annotations

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.ops.nn import f32
from irc.ops.registry import REQUIRED, Cost, OpDef, TensorType, expect, pad_inputs, register


FEATURES = "image_features"  # a VLM decoder's input that merge_tokens reads (frontends.dsl_vision)
CROSS_MASK = "cross_attention_mask"  # a cross-attention decoder's image-key visibility (frontends.dsl_cross)


def patches(pixel_values, patch: int) -> np.ndarray:
    """[B, C, H, W] -> [B, ⌊H/p⌋⌊W/p⌋, C·p·p]: the patches row by row, each channel-major (a
    remainder of rows or columns dropped)."""
    batch, channels, height, width = pixel_values.shape
    height, width = height - height % patch, width - width % patch
    grid = pixel_values[:, :, :height, :width].reshape(batch, channels, height // patch, patch, width // patch, patch)
    return grid.transpose(0, 2, 4, 1, 3, 5).reshape(batch, (height // patch) * (width // patch),
                                                    channels * patch * patch)


def _infer(inputs, attrs):
    pixels, weight, bias = pad_inputs(inputs, 3)
    patch = attrs["patch"]
    expect(isinstance(patch, int) and not isinstance(patch, bool) and patch > 0,
           f"patch_embed: patch must be a positive int, got {patch!r}")
    expect(pixels.dtype.is_float and pixels.rank == 4,
           f"patch_embed: pixel_values must be float [B, C, H, W], got {pixels.dtype}{dims.format_shape(pixels.shape)}")
    _, channels, height, width = pixels.shape
    expect(isinstance(height, int) and isinstance(width, int) and height >= patch and width >= patch,
           f"patch_embed: the image {height}x{width} must be ints of at least patch {patch}")
    expect(weight.rank == 4 and weight.shape[1:] == (channels, patch, patch),
           f"patch_embed: weight must be [d, {channels}, {patch}, {patch}], got {dims.format_shape(weight.shape)}")
    if bias is not None:
        expect(bias.shape == weight.shape[:1], f"patch_embed: bias must be [{weight.shape[0]}]")
    return [TensorType(pixels.dtype, (pixels.shape[0], (height // patch) * (width // patch), weight.shape[0]))]


def _reference(inputs, attrs):
    """Non-overlapping p x p patches, each projected: Conv2d(kernel = stride = p) flattened."""
    pixels, weight, bias = pad_inputs(inputs, 3)
    out = patches(f32(pixels), attrs["patch"]) @ f32(weight).reshape(weight.shape[0], -1).T
    if bias is not None:
        out = out + f32(bias)
    return [out.astype(pixels.dtype)]


def _cost(inputs, outputs, attrs):
    """2 FLOPs per weight per patch (the projection's matmul work)."""
    _, weight, bias = pad_inputs(inputs, 3)
    patch_count = outputs[0].shape[0] * outputs[0].shape[1]
    read = sum(t.nbytes for t in inputs if t is not None)
    bias_adds = patch_count * weight.shape[0] if bias is not None else 0
    return Cost(flops=2 * patch_count * weight.numel, other_flops=bias_adds,
                bytes_read=read, bytes_written=outputs[0].nbytes)


register(OpDef("patch_embed", ("pixel_values", "weight", "bias?"), {"patch": REQUIRED}, _infer, _reference, _cost,
               level="model"))


def _merge_infer(inputs, attrs):
    embeds, ids, features = inputs
    token = attrs["token"]
    expect(isinstance(token, int) and not isinstance(token, bool) and token >= 0,
           f"merge_tokens: token must be a non-negative int, got {token!r}")
    expect(embeds.dtype.is_float and embeds.rank == 3,
           f"merge_tokens: embeds must be float [B, S, d], got {embeds.dtype}{dims.format_shape(embeds.shape)}")
    expect(not ids.dtype.is_float and ids.rank == 2 and all(dims.canonical(a) == dims.canonical(b)
                                                            for a, b in zip(ids.shape, embeds.shape[:2])),
           f"merge_tokens: ids must be integer {dims.format_shape(embeds.shape[:2])}, got "
           f"{ids.dtype}{dims.format_shape(ids.shape)}")
    expect(features.dtype == embeds.dtype and features.rank == 2
           and dims.canonical(features.shape[1]) == dims.canonical(embeds.shape[2]),
           f"merge_tokens: features must be {embeds.dtype}[M, {embeds.shape[2]}], got "
           f"{features.dtype}{dims.format_shape(features.shape)}")
    return [TensorType(embeds.dtype, embeds.shape)]


def _merge_reference(inputs, attrs):
    """transformers' ``inputs_embeds.masked_scatter(ids == token, features)``."""
    embeds, ids, features = inputs
    if features.shape[0] == 0:  # a step without an image: nothing to merge
        return [np.array(embeds, copy=True)]
    mask = np.asarray(ids) == attrs["token"]
    count = int(mask.sum())
    if count != features.shape[0]:
        raise ValueError(f"merge_tokens: {count} placeholder tokens (id {attrs['token']}) but {features.shape[0]} "
                         "feature rows")
    out = np.array(embeds, copy=True)
    out[mask] = features
    return [out]


def _merge_cost(inputs, outputs, attrs):
    """A compare per id, a copy of the embeddings and the feature rows read."""
    embeds, ids, features = inputs
    return Cost(flops=0, other_flops=ids.numel, bytes_read=embeds.nbytes + ids.nbytes + features.nbytes,
                bytes_written=outputs[0].nbytes)


register(OpDef("merge_tokens", ("embeds", "ids", "features"), {"token": REQUIRED}, _merge_infer, _merge_reference,
               _merge_cost))


def _blocks_infer(inputs, attrs):
    ids, = inputs
    token = attrs["token"]
    expect(isinstance(token, int) and not isinstance(token, bool) and token >= 0,
           f"image_blocks: token must be a non-negative int, got {token!r}")
    expect(not ids.dtype.is_float and ids.rank == 2, f"image_blocks: ids must be integer [B, T], got "
                                                     f"{ids.dtype}{dims.format_shape(ids.shape)}")
    return [TensorType(DType.i64, ids.shape)]


def _blocks_reference(inputs, attrs):
    from irc.ops.attention import image_blocks
    if attrs["prefix"]:
        ids = np.asarray(inputs[0])
        return [np.where((ids == attrs["token"]).any(axis=1, keepdims=True), 0, -1).repeat(ids.shape[1], 1)
                .astype(np.int64)]
    return [image_blocks(inputs[0], attrs["token"])]


register(OpDef("image_blocks", ("ids",), {"token": REQUIRED, "prefix": False}, _blocks_infer, _blocks_reference,
               lambda inputs, outputs, attrs: Cost(other_flops=3 * inputs[0].numel, bytes_read=inputs[0].nbytes,
                                                   bytes_written=outputs[0].nbytes)))


GRID_ROWS = 6  # patch_grid's: row, column, frame, window, frame height, frame width
WINDOW_ID = 1 << 20  # a frame's share of the window ids (patch_grid); its row blocks are 1 << 10 apart


def patch_grid(grid, count: int, merge: int, window=None) -> np.ndarray:
    """``patch_grid``'s rows [6, count] for ``grid`` [N, 3] (the module docstring)."""
    rows, frames = [], 0
    for t, h, w in np.asarray(grid, np.int64).reshape(-1, 3).tolist():
        if min(t, h, w) < 1 or h % merge or w % merge:
            raise ValueError(f"patch_grid: image grid {[t, h, w]} is not whole {merge} x {merge} blocks")
        block_row, block_col, inner_row, inner_col = np.meshgrid(np.arange(h // merge), np.arange(w // merge),
                                                                 np.arange(merge), np.arange(merge), indexing="ij")
        height = (block_row * merge + inner_row).reshape(-1)
        width = (block_col * merge + inner_col).reshape(-1)
        cell = (block_row.reshape(-1) // window) * 1024 + block_col.reshape(-1) // window if window else 0
        for frame in range(frames, frames + t):
            ids = np.full(h * w, frame, np.int64)
            rows.append(np.stack([height, width, ids, ids * WINDOW_ID + cell if window else ids,
                                  np.full(h * w, h), np.full(h * w, w)]))
        frames += t
    out = np.concatenate(rows, axis=1) if rows else np.zeros((GRID_ROWS, 0), np.int64)
    if out.shape[1] != count:
        raise ValueError(f"patch_grid: the image grids hold {out.shape[1]} patches but pixel_values has {count} rows")
    return out.astype(np.int64)


def _grid_infer(inputs, attrs):
    grid, patches = inputs
    for key in ("merge", "window"):
        value = attrs[key]
        expect(value is None and key == "window" or isinstance(value, int) and not isinstance(value, bool)
               and value > 0, f"patch_grid: {key} must be a positive int, got {value!r}")
    expect(not grid.dtype.is_float and grid.rank == 2 and dims.canonical(grid.shape[1]) == 3,
           f"patch_grid: grid must be integer [N, 3] (t, h, w), got {grid.dtype}{dims.format_shape(grid.shape)}")
    expect(patches.rank >= 1, "patch_grid: patches must have a row per patch")
    return [TensorType(DType.i64, (GRID_ROWS, patches.shape[0]))]


def _grid_reference(inputs, attrs):
    grid, patches = inputs
    return [patch_grid(grid, patches.shape[0], attrs["merge"], attrs["window"])]


register(OpDef("patch_grid", ("grid", "patches"), {"merge": REQUIRED, "window": None}, _grid_infer, _grid_reference,
               lambda inputs, outputs, attrs: Cost(other_flops=20 * outputs[0].numel // GRID_ROWS, bytes_read=inputs[0].nbytes,
                                                   bytes_written=outputs[0].nbytes)))


def bilinear_taps(index, size, side: int) -> tuple[np.ndarray, np.ndarray]:
    """(taps [P, 2] i64, weights [P, 2] f32): the two source rows (or columns) of a bilinear,
    corners-aligned resampling of ``side`` rows to ``size`` [P] at ``index`` [P]."""
    source = np.asarray(index, np.float32) * np.float32(side - 1) / np.maximum(np.asarray(size, np.float32) - 1,
                                                                               np.float32(1))
    floor = np.floor(source)
    taps = np.minimum(floor.astype(np.int64)[:, None] + np.arange(2), side - 1)
    frac = (source - floor).astype(np.float32)
    return taps, np.stack([1 - frac, frac], axis=1).astype(np.float32)


def resample_positions(table, where, side: int) -> np.ndarray:
    """``resample_positions``'s [P, d] (the module docstring)."""
    where = np.asarray(where, np.int64)
    row_taps, row_weights = bilinear_taps(where[0], where[4], side)
    col_taps, col_weights = bilinear_taps(where[1], where[5], side)
    out = np.zeros((where.shape[1], table.shape[1]), np.float32)
    for i in range(2):
        for j in range(2):
            out += np.asarray(table, np.float32)[row_taps[:, i] * side + col_taps[:, j]] * (row_weights[:, i] * col_weights[:, j])[:, None]
    return out.astype(table.dtype)


def _check_grid_table(op: str, table, side) -> None:
    """A learned position grid's operand: ``side`` a positive int, ``table`` float [side², d]."""
    expect(isinstance(side, int) and not isinstance(side, bool) and side > 0,
           f"{op}: side must be a positive int, got {side!r}")
    expect(table.dtype.is_float and table.rank == 2 and dims.canonical(table.shape[0]) == side * side,
           f"{op}: table must be float [{side * side}, d], got {table.dtype}{dims.format_shape(table.shape)}")


def _resample_infer(inputs, attrs):
    table, where = inputs
    _check_grid_table("resample_positions", table, attrs["side"])
    expect(not where.dtype.is_float and where.rank == 2 and dims.canonical(where.shape[0]) == GRID_ROWS,
           f"resample_positions: where must be patch_grid's i64 [{GRID_ROWS}, P], got {where.dtype}"
           f"{dims.format_shape(where.shape)}")
    return [TensorType(table.dtype, (where.shape[1], table.shape[1]))]


def _resample_reference(inputs, attrs):
    return [resample_positions(inputs[0], inputs[1], attrs["side"])]


register(OpDef("resample_positions", ("table", "where"), {"side": REQUIRED}, _resample_infer, _resample_reference,
               lambda inputs, outputs, attrs: Cost(other_flops=8 * outputs[0].numel,
                                                   bytes_read=4 * outputs[0].nbytes + inputs[1].nbytes,
                                                   bytes_written=outputs[0].nbytes)))


def antialiased_bilinear(old: int, new: int) -> np.ndarray:
    """[new, old] float64: torch's antialiased bilinear resize of ``old`` samples to ``new``
    along one axis. Output i sits at source x = (i + 0.5)·old/new - 0.5; source j weighs
    max(0, 1 - |j - x| / s), the triangle widened to s = max(old/new, 1) when shrinking, and
    each row's weights are normalised to sum to 1 (the support always holds a source)."""
    scale = old / new
    center = (np.arange(new) + 0.5) * scale - 0.5
    weights = np.maximum(0.0, 1.0 - np.abs(np.arange(old)[None, :] - center[:, None]) / max(scale, 1.0))
    return weights / weights.sum(axis=1, keepdims=True)


def resize_positions(table, shapes, length: int, side: int) -> np.ndarray:
    """``resize_positions``'s [B, length, d] (the module docstring)."""
    grid = np.asarray(table, np.float32).reshape(side, side, -1).astype(np.float64)
    shapes = np.asarray(shapes, np.int64).reshape(-1, 2)
    out = np.zeros((shapes.shape[0], length, grid.shape[-1]), np.float32)
    for b, (h, w) in enumerate(shapes.tolist()):
        if h < 1 or w < 1 or h * w > length:
            raise ValueError(f"resize_positions: image {b} is {h} x {w} patches, not 1 to {length} of them")
        resized = np.einsum("ij,jkd,lk->ild", antialiased_bilinear(side, h), grid, antialiased_bilinear(side, w))
        out[b, :h * w] = resized.reshape(h * w, -1)
        out[b, h * w:] = resized[0, 0]
    return out.astype(table.dtype)


def _resize_infer(inputs, attrs):
    table, shapes, patches = inputs
    _check_grid_table("resize_positions", table, attrs["side"])
    expect(not shapes.dtype.is_float and shapes.rank == 2 and dims.canonical(shapes.shape[1]) == 2,
           f"resize_positions: shapes must be integer [B, 2] (h, w), got {shapes.dtype}"
           f"{dims.format_shape(shapes.shape)}")
    expect(patches.rank >= 2 and dims.canonical(patches.shape[0]) == dims.canonical(shapes.shape[0]),
           f"resize_positions: patches must be [{shapes.shape[0]}, L, ...], got {dims.format_shape(patches.shape)}")
    return [TensorType(table.dtype, (patches.shape[0], patches.shape[1], table.shape[1]))]


def _resize_reference(inputs, attrs):
    table, shapes, patches = inputs
    return [resize_positions(table, shapes, patches.shape[1], attrs["side"])]


def _resize_cost(inputs, outputs, attrs):
    """2·S² FLOPs per output element: each a weighted sum of the S² grid rows (the dense form
    the ONNX lowering and the Triton fallback compute)."""
    return Cost(other_flops=2 * attrs["side"] ** 2 * outputs[0].numel, bytes_read=inputs[0].nbytes + inputs[1].nbytes,
                bytes_written=outputs[0].nbytes)


register(OpDef("resize_positions", ("table", "shapes", "patches"), {"side": REQUIRED}, _resize_infer,
               _resize_reference, _resize_cost))
