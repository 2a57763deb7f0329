"""Idefics3's and SmolVLM's image processor (``SmolVLMImageProcessorPil`` in transformers 5.25)
with Pillow: an image as tiles of ``max_image_size`` and a global view.

1. RGB; resize (``resample``, Lanczos by default) so the longest edge is ``size["longest_edge"]``,
   the other int(edge · aspect) rounded up to even, neither above 4096;
2. with ``do_image_splitting``: resize again so both sides are multiples of m =
   ``max_image_size["longest_edge"]`` (the long side rounded up, the short one int(long /
   aspect) rounded up), cut into rows x columns tiles of m x m, row by row, then the global
   view: that image resized to m x m (an image no larger than m is itself, no grid);
   without it: the image resized to m x m;
3. rescale and normalise each (``Processor.finish``). Every output is m x m, so padding adds
   nothing and the pixel attention mask is all ones.
"""
from __future__ import annotations

import math

import numpy as np

from irc_cli.image_file import to_rgb

MAX_SIDE = 4096  # transformers' MAX_IMAGE_SIZE


def longest_edge(height: int, width: int, edge: int) -> tuple[int, int]:
    """transformers' ``_resize_output_size_rescale_to_max_len`` then ``..._scale_below_upper_bound``."""
    aspect = width / height
    if width >= height:
        width, height = edge, int(edge / aspect)
        height += height % 2
    else:
        height, width = edge, int(edge * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_SIDE:
        width, height = MAX_SIDE, int(MAX_SIDE / aspect)
    elif height > width and height > MAX_SIDE:
        height, width = MAX_SIDE, int(MAX_SIDE * aspect)
    return max(height, 1), max(width, 1)


def multiples(height: int, width: int, side: int) -> tuple[int, int]:
    """transformers' ``resize_for_vision_encoder``: both sides up to multiples of ``side``."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / side) * side
        height = math.ceil(int(width / aspect) / side) * side
    else:
        height = math.ceil(height / side) * side
        width = math.ceil(int(height * aspect) / side) * side
    return height, width


def tiles(processor, image) -> tuple[np.ndarray, int, int]:
    """(pixel values [N, C, m, m], rows, columns) of a Pillow image."""
    from PIL import Image

    s = processor.settings
    resample = Image.Resampling(int(s["resample"]))
    side = s["max_image_size"]["longest_edge"]
    if s.get("do_convert_rgb"):
        image = to_rgb(image)
    if s.get("do_resize"):
        height, width = longest_edge(image.height, image.width, s["size"]["longest_edge"])
        image = image.resize((width, height), resample=resample)
    rows = columns = 0
    if s.get("do_image_splitting"):
        height, width = multiples(image.height, image.width, side)
        image = image.resize((width, height), resample=resample)
        frames = [image]
        if height > side or width > side:
            rows, columns = (height - side) // side + 1, (width - side) // side + 1
            frames = [image.crop((c * side, r * side, (c + 1) * side, (r + 1) * side))
                      for r in range(rows) for c in range(columns)]
            frames.append(image.resize((side, side), resample=resample))
    else:
        frames = [image.resize((side, side), resample=resample)]
    pixels = [processor.finish(np.asarray(frame).transpose(2, 0, 1), frame.mode) for frame in frames]
    return np.stack(pixels), rows, columns
