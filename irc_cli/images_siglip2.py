"""SigLIP 2's NaFlex image processor (``Siglip2ImageProcessorPil`` in transformers 5.25) with
Pillow: an image at about its own aspect ratio as rows of flattened patches.

1. RGB only with ``do_convert_rgb`` (the class sets none: an image keeps its mode);
2. resize (``resample``, bilinear by default) to ``size_for_patches``: the largest scale found by
   transformers' binary search whose sides, each rounded up to whole ``patch_size`` p (one patch
   at least), make at most ``max_num_patches`` patches;
3. rescale and normalise (``Processor.finish``);
4. patchify: the h x w patches row by row, each its p x p pixels row by row with the channels
   innermost ([h·w, p·p·C]), then zero rows up to ``max_num_patches``.

``naflex`` returns transformers' three arrays for one image: ``pixel_values`` f32
[1, max_num_patches, p·p·C], ``pixel_attention_mask`` i32 [1, max_num_patches] (1 for the image's
patches) and ``spatial_shapes`` i64 [1, 2] (h, w). Without ``do_resize`` an image must already be
whole patches, at most ``max_num_patches`` of them (transformers fails otherwise).
"""
from __future__ import annotations

import math

import numpy as np

from irc.errors import IRCError
from irc_cli.image_file import to_rgb

SEARCH_EPS = 1e-5  # transformers' get_image_size_for_max_num_patches: the binary search's width


def check(processor) -> tuple[int, int]:
    """(patch_size, max_num_patches) of ``processor.settings``, or one SpecError naming the key."""
    found = []
    for key in ("patch_size", "max_num_patches"):
        value = processor.settings.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise processor._error(key, f"expected a positive integer, got {value!r}")
        found.append(value)
    return found[0], found[1]


def size_for_patches(height: int, width: int, patch: int, max_patches: int) -> tuple[int, int]:
    """transformers' ``get_image_size_for_max_num_patches``, step for step (the same floats):
    (height, width) in whole patches for the largest scale the search finds within the budget."""
    def scaled(scale: float, size: int) -> int:
        return int(max(patch, math.ceil(size * scale / patch) * patch))

    low, high = SEARCH_EPS / 10, 100.0
    while (high - low) >= SEARCH_EPS:
        scale = (low + high) / 2
        if (scaled(scale, height) / patch) * (scaled(scale, width) / patch) <= max_patches:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)


def naflex(processor, image) -> dict:
    """The three arrays of one Pillow image (the module docstring)."""
    from PIL import Image

    patch, max_patches = check(processor)
    s = processor.settings
    if s.get("do_convert_rgb"):
        image = to_rgb(image)
    if s.get("do_resize"):
        height, width = size_for_patches(image.height, image.width, patch, max_patches)
        image = image.resize((width, height), resample=Image.Resampling(int(s["resample"])))
    rows, columns = image.height // patch, image.width // patch
    if image.height % patch or image.width % patch or not 0 < rows * columns <= max_patches:
        raise IRCError(f"a {image.width}x{image.height} image is not 1 to {max_patches} whole {patch}x{patch} patches",
                       location=processor.path, hint="do_resize: true (its default) sizes every image to fit")
    pixels = np.asarray(image)
    pixels = processor.finish((pixels[:, :, None] if pixels.ndim == 2 else pixels).transpose(2, 0, 1), image.mode)
    channels = pixels.shape[0]
    grid = pixels.reshape(channels, rows, patch, columns, patch).transpose(1, 3, 2, 4, 0)
    values = np.zeros((1, max_patches, patch * patch * channels), np.float32)
    values[0, :rows * columns] = grid.reshape(rows * columns, -1)
    mask = np.zeros((1, max_patches), np.int32)
    mask[0, :rows * columns] = 1
    return {"pixel_values": values, "pixel_attention_mask": mask,
            "spatial_shapes": np.asarray([[rows, columns]], np.int64)}
