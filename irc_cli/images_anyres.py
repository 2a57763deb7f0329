"""LLaVA-NeXT's any-resolution images (``LlavaNextImageProcessorPil`` in transformers 5.25) with
Pillow, and which of the vision tower's features ``LlavaNextModel.pack_image_features`` keeps.

An image becomes N = 1 + rows x columns views, t = ``crop_size["height"]`` the tile side:

1. RGB (``do_convert_rgb``); its (height, width) is transformers' ``image_sizes``;
2. the best grid pinpoint (h, w) of ``image_grid_pinpoints`` (``select_best_resolution``: the
   most of the image's pixels kept once it is scaled to fit, then the least area wasted, the
   first such);
3. the base view: the image resized (``resample``, bicubic by default) to s x s, s = ``size``'s
   shortest edge (or to its height x width);
4. the tiles: the image resized to fit (h, w) keeping its aspect (the tighter side exact, the
   other ceil(side · scale), at most the pinpoint's), zero-padded about the centre (the odd
   pixel after), cut into rows x columns = h / t x w / t tiles of t x t, row by row;
5. each view (base first) as one CLIP image: ``Processor.__call__`` resizes to ``size``,
   centre-crops to ``crop_size``, rescales and normalises (a t x t tile with t = s is as it was).

The features (``feature_rows``): the tower gives side x side tokens a view (the class token
dropped). The base view's come first as they are; the tiles' form one (rows · side) x
(columns · side) grid, from which ``unpad_image`` drops the rows (or columns) that only the
padding filled, and each kept row is followed by the ``image_newline`` vector.
"""
from __future__ import annotations

import math

import numpy as np

from irc.errors import IRCError
from irc_cli.image_file import to_rgb


def pinpoint_problem(pinpoints, tile: int):
    """Why ``pinpoints`` cannot be tiled by t x t tiles, or None: a non-empty list of [height,
    width] positive integers, each a multiple of ``tile`` (transformers' model fails otherwise)."""
    if not isinstance(pinpoints, (list, tuple)) or not pinpoints:
        return f"expected a non-empty list of [height, width], got {pinpoints!r}"
    for pair in pinpoints:
        ok = isinstance(pair, (list, tuple)) and len(pair) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pair)
        if not ok:
            return f"expected [height, width] with positive integers, got {pair!r}"
        if pair[0] % tile or pair[1] % tile:
            return f"{list(pair)} is not whole {tile}x{tile} tiles"
    return None


def check(processor) -> tuple[int, tuple[int, int], list]:
    """(tile side t, base view (height, width), pinpoints) of ``processor.settings``, or one
    SpecError naming the key."""
    s = processor.settings
    size = processor._size("size", ({"height", "width"}, {"shortest_edge"}))
    base = (size["height"], size["width"]) if "height" in size else (size["shortest_edge"],) * 2
    if s.get("crop_size") is not None:
        tile = processor._size("crop_size", ({"height", "width"},))["height"]
    else:
        tile = base[0]
    problem = pinpoint_problem(s.get("image_grid_pinpoints"), tile)
    if problem:
        raise processor._error("image_grid_pinpoints", problem, hint=f"crop_size {tile} is the tile side")
    return tile, base, [tuple(pair) for pair in s["image_grid_pinpoints"]]


def best_resolution(height: int, width: int, pinpoints) -> tuple[int, int]:
    """transformers' ``select_best_resolution``: the (h, w) of ``pinpoints`` that keeps the most
    of the image once it is scaled to fit, then wastes the least area."""
    best, most_kept, least_wasted = None, 0, math.inf
    for pin_height, pin_width in pinpoints:
        scale = min(pin_width / width, pin_height / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        wasted = pin_width * pin_height - kept
        if kept > most_kept or (kept == most_kept and wasted < least_wasted):
            best, most_kept, least_wasted = (pin_height, pin_width), kept, wasted
    return best


def fit(height: int, width: int, target_height: int, target_width: int) -> tuple[int, int]:
    """transformers' ``get_patch_output_size``: the image's size scaled to fit the target."""
    scale_width, scale_height = target_width / width, target_height / height
    if scale_width < scale_height:
        return min(math.ceil(height * scale_width), target_height), target_width
    return target_height, min(math.ceil(width * scale_height), target_width)


def anyres(processor, image) -> tuple[np.ndarray, tuple[int, int]]:
    """(pixel values float32 [N, C, crop, crop], the image's (height, width)) of a Pillow image:
    the base view, then the tiles row by row."""
    from PIL import Image

    tile, (base_height, base_width), pinpoints = check(processor)
    s = processor.settings
    resample = Image.Resampling(int(s["resample"]))
    if s.get("do_convert_rgb"):
        image = to_rgb(image)
    target_height, target_width = best_resolution(image.height, image.width, pinpoints)
    fitted_height, fitted_width = fit(image.height, image.width, target_height, target_width)
    fitted = np.asarray(image.resize((fitted_width, fitted_height), resample=resample))
    canvas = np.zeros((target_height, target_width) + fitted.shape[2:], fitted.dtype)
    top, left = (target_height - fitted_height) // 2, (target_width - fitted_width) // 2
    canvas[top:top + fitted_height, left:left + fitted_width] = fitted
    views = [image.resize((base_width, base_height), resample=resample)]
    views += [Image.fromarray(np.ascontiguousarray(canvas[row:row + tile, column:column + tile]))
              for row in range(0, target_height, tile) for column in range(0, target_width, tile)]
    return np.stack([processor(view) for view in views]), (image.height, image.width)


def _kept(image_size, grid_pinpoints, tile_size: int, side: int) -> tuple[int, int, int, int, int, int]:
    """(tile rows, tile columns, top, bottom, left, right): the token grid of the tiles and the
    part of it ``unpad_image`` keeps."""
    problem = pinpoint_problem(grid_pinpoints, tile_size)
    if problem:
        raise IRCError(f"image_grid_pinpoints: {problem}")
    height, width = image_size
    target_height, target_width = best_resolution(height, width, grid_pinpoints)
    tile_rows, tile_columns = target_height // tile_size, target_width // tile_size
    rows, columns = tile_rows * side, tile_columns * side
    if width / height > columns / rows:
        kept = int(round(height * (columns / width), 7))
        pad = (rows - kept) // 2
        return tile_rows, tile_columns, pad, rows - pad, 0, columns
    kept = int(round(width * (rows / height), 7))
    pad = (columns - kept) // 2
    return tile_rows, tile_columns, 0, rows, pad, columns - pad


def feature_rows(image_size, grid_pinpoints, tile_size: int, side: int) -> np.ndarray:
    """int64 [I]: the rows of the N · side² per-view features (the views of ``anyres``, each
    side x side tokens row-major) that form the packed features of an image of ``image_size``
    (height, width); N · side² stands for the image_newline row."""
    tile_rows, tile_columns, top, bottom, left, right = _kept(image_size, grid_pinpoints, tile_size, side)
    y, x = np.arange(top, bottom)[:, None], np.arange(left, right)[None, :]
    tile = (y // side) * tile_columns + x // side
    grid = (1 + tile) * side * side + (y % side) * side + x % side
    newline = np.full((bottom - top, 1), (1 + tile_rows * tile_columns) * side * side)
    rows = np.concatenate([grid, newline], axis=1).reshape(-1)
    return np.concatenate([np.arange(side * side), rows]).astype(np.int64)


def image_tokens(image_size, grid_pinpoints, tile_size: int, side: int) -> int:
    """How many tokens the language model sees for an image of ``image_size`` (height, width):
    len(feature_rows(...))."""
    _, _, top, bottom, left, right = _kept(image_size, grid_pinpoints, tile_size, side)
    return side * side + (bottom - top) * (right - left + 1)
