"""Qwen2-VL's and Qwen2.5-VL's image processor (``Qwen2VLImageProcessorPil`` in transformers
5.25) with Pillow: an image as a grid of patches at about its own size.

1. RGB (``do_convert_rgb``);
2. resize (``resample``, bicubic by default) to ``smart_resize``'s size: both sides multiples
   of f = ``patch_size`` · ``merge_size``, each the nearest multiple (Python's round, half to
   even); over the max pixels, both shrink by sqrt(h · w / max) and round down (to f at
   least); under the min pixels, both grow by sqrt(min / (h · w)) and round up. An aspect
   ratio over 200 is refused;
3. rescale and normalise (``Processor.finish``);
4. patchify: the gh x gw grid of p x p patches (p = ``patch_size``) in m x m merge windows
   (m = ``merge_size``): window rows, window columns, rows in the window, columns in it; each
   patch [C, T, p, p] flattened, the image repeated T = ``temporal_patch_size`` times. Grid
   (t, h, w) = (1, gh, gw); the language model sees t · h · w / m² image tokens.

The pixel bounds are ``size: {shortest_edge, longest_edge}`` (min and max pixels, despite the
names); the older top-level ``min_pixels`` / ``max_pixels`` keys replace them, as transformers
5 maps them. irc refuses a config whose bounds transformers would fail on, and, unlike
transformers, min above max.
"""
from __future__ import annotations

import math

import numpy as np

from irc.errors import IRCError
from irc_cli.image_file import to_rgb

MAX_ASPECT = 200
PATCH_KEYS = ("patch_size", "merge_size", "temporal_patch_size")
LEGACY = (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge"))


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check(processor) -> None:
    """The patch sizes and pixel bounds of ``processor.settings``, or one SpecError naming the key."""
    for key in PATCH_KEYS:
        if not _positive(processor.settings.get(key)):
            raise processor._error(key, f"expected a positive integer, got {processor.settings.get(key)!r}")
    pixel_bounds(processor)


def pixel_bounds(processor) -> tuple[int, int]:
    """(min_pixels, max_pixels): ``size``, with top-level ``min_pixels`` / ``max_pixels`` over it."""
    s = processor.settings
    if not isinstance(s.get("size"), dict):
        raise processor._error("size", f"expected {{shortest_edge, longest_edge}}, got {s.get('size')!r}")
    size = dict(s["size"])
    keys = {"shortest_edge": "size.shortest_edge", "longest_edge": "size.longest_edge"}
    for old, new in LEGACY:
        if s.get(old) is not None:
            size[new] = s[old]
            size.pop(old, None)
            keys[new] = old
    if set(size) != set(keys):
        raise processor._error("size", f"expected {{shortest_edge, longest_edge}} (the min and max pixels) or "
                                       f"min_pixels and max_pixels, got {sorted(size)}")
    for edge in keys:
        if not _positive(size[edge]):
            raise processor._error(keys[edge], f"expected a positive number of pixels, got {size[edge]!r}")
    low, high = size["shortest_edge"], size["longest_edge"]
    if low > high:
        raise processor._error(keys["shortest_edge"], f"the min pixels {low} are over the max pixels {high} "
                                                      f"({keys['longest_edge']})")
    return low, high


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' ``smart_resize``: (height, width) multiples of ``factor``, about the same
    aspect, the pixels between the bounds where rounding allows."""
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise IRCError(f"a {width}x{height} image: its aspect ratio {max(height, width) / min(height, width):.1f} "
                       f"is over {MAX_ASPECT}", hint="crop or pad the image first")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patches(processor, image) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(pixel values float32 [gh · gw, C · T · p · p], grid (1, gh, gw)) of a Pillow image."""
    from PIL import Image

    s = processor.settings
    patch, merge, temporal = (s[key] for key in PATCH_KEYS)
    if s.get("do_convert_rgb"):
        image = to_rgb(image)
    if s.get("do_resize"):
        height, width = smart_resize(image.height, image.width, patch * merge, *pixel_bounds(processor))
        image = image.resize((width, height), resample=Image.Resampling(int(s["resample"])))
    pixels = np.asarray(image)
    pixels = (pixels[:, :, None] if pixels.ndim == 2 else pixels).transpose(2, 0, 1)
    channels, height, width = pixels.shape
    if height % (patch * merge) or width % (patch * merge):
        raise IRCError(f"a {width}x{height} image is not whole {merge}x{merge} windows of {patch}x{patch} patches",
                       location=processor.path, hint="do_resize: true sizes every image so")
    pixels = processor.finish(pixels, image.mode)
    grid_h, grid_w = height // patch, width // patch
    # [C, H, W] -> [gh/m, gw/m, m, m, C, p, p], then T copies beside C
    windows = pixels.reshape(channels, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
    windows = windows.transpose(1, 4, 2, 5, 0, 3, 6)[:, :, :, :, :, None]
    repeated = np.broadcast_to(windows, windows.shape[:5] + (temporal,) + windows.shape[6:])
    flat = repeated.reshape(grid_h * grid_w, channels * temporal * patch * patch)
    return np.ascontiguousarray(flat, dtype=np.float32), (1, grid_h, grid_w)


def image_tokens(grid: tuple[int, int, int], merge_size: int) -> int:
    """How many tokens the language model sees for an image of ``grid`` (t, h, w)."""
    t, h, w = grid
    return t * h * w // (merge_size * merge_size)
