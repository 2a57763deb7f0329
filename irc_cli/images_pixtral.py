"""Pixtral's and Mistral 3's image processor (``PixtralImageProcessorPil`` in transformers 5.25)
with Pillow: one image at about its own size, whole patches of f x f pixels, and the token grid
``PixtralProcessor`` writes for it.

f is the patch the processor passes, ``patch_size`` · ``spatial_merge_size`` of the model (14 · 2
= 28 for Mistral 3, 16 · 1 for Pixtral-12B), not the preprocessor config's own ``patch_size``.

1. RGB (``do_convert_rgb``);
2. resize (``resample``, bicubic by default) to ``resized_size``: an image over ``size``'s
   longest edge (or its height x width) shrinks by r = max(h / max_h, w / max_w), each side
   floor(side / r); then each side grows to whole patches, ceil(side / f) · f. A side that
   shrinks to 0 pixels is refused (transformers fails on it);
3. rescale and normalise (``Processor.finish``), channels first. Its (height, width) is
   transformers' ``image_sizes``.

The language model sees ``image_layout``'s rows x columns grid: each row ``[IMG]`` x columns
then ``[IMG_BREAK]``, the last ``[IMG_BREAK]`` an ``[IMG_END]``. irc applies no centre crop
(Pixtral's checkpoints set none).
"""
from __future__ import annotations

import math

import numpy as np

from irc.errors import IRCError
from irc_cli.image_file import to_rgb


def check(processor) -> tuple[int, int]:
    """(max height, max width) of ``processor.settings``'s ``size``, or one SpecError naming the key."""
    size = processor._size("size", ({"longest_edge"}, {"height", "width"}))
    if processor.settings.get("do_center_crop"):
        raise processor._error("do_center_crop", "a centre crop after Pixtral's resize is not applied by irc",
                               hint="set it to null (its default)")
    return (size["longest_edge"],) * 2 if "longest_edge" in size else (size["height"], size["width"])


def resized_size(height: int, width: int, max_height: int, max_width: int, patch: int) -> tuple[int, int]:
    """transformers' ``get_resize_output_image_size``: (height, width) within the bounds (floor),
    then whole patches (ceil)."""
    ratio = max(height / max_height, width / max_width)
    if ratio > 1:
        height, width = math.floor(height / ratio), math.floor(width / ratio)
    return ((height - 1) // patch + 1) * patch, ((width - 1) // patch + 1) * patch


def pixtral(processor, image, patch: int) -> tuple[np.ndarray, tuple[int, int]]:
    """(pixel values float32 [1, C, H, W], (H, W)) of a Pillow image, H and W whole ``patch``
    sides when ``do_resize``."""
    from PIL import Image

    max_height, max_width = check(processor)
    s = processor.settings
    if s.get("do_convert_rgb"):
        image = to_rgb(image)
    if s.get("do_resize"):
        height, width = resized_size(image.height, image.width, max_height, max_width, patch)
        if height <= 0 or width <= 0:
            raise IRCError(f"a {image.width}x{image.height} image shrinks to {max(width, 0)}x{max(height, 0)} "
                           f"within size {max_width}x{max_height}", location=processor.path,
                           hint="crop or pad the image first")
        image = image.resize((width, height), resample=Image.Resampling(int(s["resample"])))
    pixels = np.asarray(image)
    pixels = (pixels[:, :, None] if pixels.ndim == 2 else pixels).transpose(2, 0, 1)
    return processor.finish(pixels, image.mode)[None], (image.height, image.width)


def image_layout(height: int, width: int, patch: int) -> tuple[int, int]:
    """(rows, columns) of ``[IMG]`` tokens ``PixtralProcessor`` writes for an image of (height,
    width) pixel values: height // patch x width // patch; rows · (columns + 1) tokens in all."""
    rows, columns = height // patch, width // patch
    if rows <= 0 or columns <= 0:
        raise IRCError(f"a {width}x{height} image has no whole {patch}x{patch} patch",
                       hint="do_resize: true sizes every image to whole patches")
    return rows, columns
