"""Llama-3.2-Vision's image processor (``MllamaImageProcessorPil`` in transformers 5.25) with
Pillow, and the cross-attention mask ``MllamaProcessor`` gives the text.

1. RGB (``do_convert_rgb``);
2. the canvas: of the tile arrangements (w x h tiles, w·h <= ``max_image_tiles``) the one
   that scales the image up least, or, when none fits it whole, down least (the smaller area on
   a tie) (``get_optimal_tiled_canvas``); the image resized (``resample``, bilinear by
   default) to fit that canvas, its aspect kept (``get_image_size_fit_to_canvas``), then
   zero-padded right and below to the canvas;
3. rescale and normalise (``Processor.finish``), channels first; cut into its tiles, row by row,
   and packed into ``max_image_tiles`` tiles (unused ones zero): ``pixel_values`` [tiles, C, S,
   S], ``aspect_ratio_ids`` (1 + the arrangement's index) and ``aspect_ratio_mask`` (1 for each
   used tile; the first always).

``cross_mask``: which image tokens each text token sees, as ``get_cross_attention_token_mask``
lays it out: an image's ``<|image|>`` token and the text after it, up to the next image's token
(a run of consecutive image tokens shares the text after the run), the last one to the end;
each image's used tiles' tokens (tokens per tile each). A later token sees what the prompt's
last token saw (transformers' generate repeats the last row).
"""
from __future__ import annotations

import math

import numpy as np

from irc.errors import IRCError
from irc_cli.image_file import to_rgb


def arrangements(max_tiles: int) -> list[tuple[int, int]]:
    """(width tiles, height tiles) with w·h <= max_tiles, in transformers' order."""
    return [(w, h) for w in range(1, max_tiles + 1) for h in range(1, max_tiles + 1) if w * h <= max_tiles]


def canvas(height: int, width: int, max_tiles: int, tile: int) -> tuple[int, int]:
    """(canvas height, canvas width): ``get_optimal_tiled_canvas``."""
    sizes = np.array(arrangements(max_tiles)) * tile
    heights, widths = sizes.T
    scales = np.minimum(heights / height, widths / width)
    up = scales[scales >= 1]
    chosen = sizes[scales == (up.min() if len(up) else scales[scales < 1].max())]
    best = chosen[np.argmin(chosen[:, 0] * chosen[:, 1])] if len(chosen) > 1 else chosen[0]
    return int(best[0]), int(best[1])


def fitted(height: int, width: int, canvas_height: int, canvas_width: int, tile: int) -> tuple[int, int]:
    """(height, width) of the image resized into the canvas: ``get_image_size_fit_to_canvas``."""
    target_width = int(np.clip(width, tile, canvas_width))
    target_height = int(np.clip(height, tile, canvas_height))
    scale_h, scale_w = target_height / height, target_width / width
    if scale_w < scale_h:
        return min(math.floor(height * scale_w) or 1, target_height), target_width
    return target_height, min(math.floor(width * scale_h) or 1, target_width)


def mllama(processor, image, tile: int, max_tiles: int) -> tuple[np.ndarray, int, int]:
    """(pixel values f32 [max_tiles, C, tile, tile], aspect ratio id, tiles used) of a Pillow
    image."""
    from PIL import Image

    s = processor.settings
    if s.get("do_convert_rgb"):
        image = to_rgb(image)
    canvas_height, canvas_width = canvas(image.height, image.width, max_tiles, tile)
    rows, columns = canvas_height // tile, canvas_width // tile
    height, width = fitted(image.height, image.width, canvas_height, canvas_width, tile)
    image = image.resize((width, height), resample=Image.Resampling(int(s["resample"])))
    pixels = np.asarray(image)
    pixels = (pixels[:, :, None] if pixels.ndim == 2 else pixels).transpose(2, 0, 1)
    padded = np.zeros((pixels.shape[0], canvas_height, canvas_width), pixels.dtype)
    padded[:, :height, :width] = pixels
    values = processor.finish(padded, image.mode)  # [C, H, W]
    channels = values.shape[0]
    tiles = values.reshape(channels, rows, tile, columns, tile).transpose(1, 3, 0, 2, 4).reshape(-1, channels, tile, tile)
    packed = np.zeros((max_tiles, channels, tile, tile), np.float32)
    packed[:len(tiles)] = tiles
    return packed, arrangements(max_tiles).index((rows, columns)) + 1, len(tiles)


def check(processor, tile: int, max_tiles: int) -> None:
    """The processor's tile size and count are the model's, or one SpecError naming the key."""
    size = processor._size("size", ({"height", "width"},))
    if size["height"] != size["width"] or size["height"] != tile:
        raise processor._error("size", f"{size} is not the model's {tile}-pixel square tiles",
                               hint="the processor and the model must come from one checkpoint")
    if processor.settings.get("max_image_tiles") != max_tiles:
        raise processor._error("max_image_tiles", f"{processor.settings.get('max_image_tiles')!r} is not the "
                                                  f"model's {max_tiles} tiles",
                               hint="the processor and the model must come from one checkpoint")


def token_spans(ids: list, token: int) -> list[tuple[int, int]]:
    """[start, end) of the text each image's token opens (``get_cross_attention_token_mask``)."""
    places = [i for i, t in enumerate(ids) if t == token]
    spans = [[a, b] for a, b in zip(places, places[1:])] + ([[places[-1], len(ids)]] if places else [])
    end = spans[-1][1] if spans else 0
    for span in reversed(spans):  # a run of image tokens: each sees the text after the run
        if span[0] == span[1] - 1:
            span[1] = end
        end = span[1]
    return [tuple(span) for span in spans]


def cross_mask(ids: list, token: int, used: list, max_tiles: int, tile_tokens: int) -> np.ndarray:
    """i64 [1, T, images·max_tiles·tile_tokens]: may token t see image key j (module docstring);
    ``used``: each image's used tiles."""
    spans = token_spans(ids, token)
    if len(spans) != len(used):
        raise IRCError(f"the prompt holds {len(spans)} image token(s) for {len(used)} image(s)")
    mask = np.zeros((1, len(ids), len(used), max_tiles), np.int64)
    for image, ((start, end), tiles) in enumerate(zip(spans, used)):
        mask[0, start:end, image, :tiles] = 1
    return np.repeat(mask.reshape(1, len(ids), -1), tile_tokens, axis=2)


__all__ = ["arrangements", "canvas", "check", "cross_mask", "fitted", "mllama", "token_spans"]
