"""Images in, pixel values out: a checkpoint's ``preprocessor_config.json`` applied with Pillow
as transformers' PIL image processors apply it (``PilBackend`` in transformers 5.25: CLIP,
SigLIP, ViT, BiT/DINOv2's, BLIP's and Gemma 3's processors, the last without pan-and-scan), for
``irc run --image``.

The steps, each only when its ``do_*`` key says so (missing keys take the processor class's
default, ``DEFAULTS`` by ``image_processor_type``):

1. RGB: transparency composited onto white (``do_convert_rgb``);
2. resize with the checkpoint's ``resample`` filter (Pillow's codes: 0 nearest, 1 Lanczos,
   2 bilinear, 3 bicubic, 4 box, 5 Hamming) to ``size``: ``{height, width}``, or
   ``{shortest_edge}`` (the short side to it, the long one int(size · long / short));
3. centre crop to ``crop_size`` (top = (h - crop_h) // 2; zero-padded where the image is
   smaller);
4. rescale by ``rescale_factor`` (in float64, then float32), normalise by ``image_mean`` and
   ``image_std`` (float32), channels first.

Processors whose output follows the image have modules of their own: Qwen2-VL's
(``images_qwen``), Pixtral's (``images_pixtral``), Llama-3.2-Vision's tiles (``images_mllama``),
SigLIP 2's NaFlex patches (``images_siglip2``).

An image file is read by ``irc_cli.image_file`` (Pillow, imported only there). A file that
is not an image, one over its ``MAX_PIXELS``, or a processor whose output size is not the
model's input size is one ``IRCError`` naming the file (and the key).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from irc.errors import IRCError, SpecError
from irc_cli.image_file import to_rgb

PREPROCESSOR = "preprocessor_config.json"
TILED = ("Idefics3ImageProcessor", "SmolVLMImageProcessor")
PATCHED = ("Qwen2VLImageProcessor",)
FITTED = ("PixtralImageProcessor",)
NAFLEX = ("Siglip2ImageProcessor",)
CANVASED = ("MllamaImageProcessor",)
OPENAI_MEAN, OPENAI_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
HALF = [0.5, 0.5, 0.5]
_COMMON = {"do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
           "do_center_crop": False, "do_convert_rgb": True}
DEFAULTS = {  # image_processor_type -> its class's defaults (transformers 5.25's *Pil processors)
    "CLIPImageProcessor": {**_COMMON, "resample": 3, "size": {"shortest_edge": 224}, "do_center_crop": True,
                           "crop_size": {"height": 224, "width": 224}, "image_mean": OPENAI_MEAN,
                           "image_std": OPENAI_STD},
    "BitImageProcessor": {**_COMMON, "resample": 3, "size": {"shortest_edge": 224}, "do_center_crop": True,
                          "crop_size": {"height": 224, "width": 224}, "image_mean": OPENAI_MEAN,
                          "image_std": OPENAI_STD},
    "BlipImageProcessor": {**_COMMON, "resample": 3, "size": {"height": 384, "width": 384}, "image_mean": OPENAI_MEAN,
                           "image_std": OPENAI_STD},  # BLIP-2's
    "SiglipImageProcessor": {**_COMMON, "resample": 3, "size": {"height": 224, "width": 224}, "image_mean": HALF,
                             "image_std": HALF},
    "Gemma3ImageProcessor": {**_COMMON, "resample": 2, "size": {"height": 224, "width": 224}, "image_mean": HALF,
                             "image_std": HALF, "do_pan_and_scan": None},
    # Idefics3's and SmolVLM's: tiles of max_image_size and a global view (irc_cli.images_tiled)
    **{kind: {**_COMMON, "resample": 1, "size": {"longest_edge": 4 * 364}, "max_image_size": {"longest_edge": 364},
              "do_image_splitting": True, "image_mean": HALF, "image_std": HALF, "do_pad": True}
       for kind in ("Idefics3ImageProcessor", "SmolVLMImageProcessor")},
    # Qwen2-VL's and Qwen2.5-VL's: patches at about the image's own size (irc_cli.images_qwen)
    "Qwen2VLImageProcessor": {**_COMMON, "resample": 3, "size": {"shortest_edge": 56 * 56,
                                                                 "longest_edge": 28 * 28 * 1280},
                              "min_pixels": None, "max_pixels": None, "patch_size": 14, "temporal_patch_size": 2,
                              "merge_size": 2, "image_mean": OPENAI_MEAN, "image_std": OPENAI_STD},
    # LLaVA-NeXT's: a base view and tiles of the best grid pinpoint (irc_cli.images_anyres)
    "LlavaNextImageProcessor": {**_COMMON, "resample": 3, "size": {"shortest_edge": 224}, "do_center_crop": True,
                                "crop_size": {"height": 224, "width": 224}, "image_mean": OPENAI_MEAN,
                                "image_std": OPENAI_STD, "do_pad": True, "image_grid_pinpoints": [
                                    [336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]},
    # Pixtral's and Mistral 3's: the image at about its own size, whole patches (irc_cli.images_pixtral)
    "PixtralImageProcessor": {**_COMMON, "resample": 3, "size": {"longest_edge": 1024},
                              "patch_size": {"height": 16, "width": 16}, "image_mean": OPENAI_MEAN,
                              "image_std": OPENAI_STD, "do_pad": True},
    # SigLIP 2's NaFlex: the image's own aspect ratio in at most max_num_patches patches (irc_cli.images_siglip2)
    "Siglip2ImageProcessor": {**_COMMON, "resample": 2, "patch_size": 16, "max_num_patches": 256,
                              "image_mean": HALF, "image_std": HALF, "do_convert_rgb": None},
    # Llama-3.2-Vision's: the image on a canvas of up to max_image_tiles tiles (irc_cli.images_mllama)
    "MllamaImageProcessor": {**_COMMON, "resample": 2, "size": {"height": 224, "width": 224}, "image_mean": HALF,
                             "image_std": HALF, "max_image_tiles": 4, "do_pad": True},
    "ViTImageProcessor": {**_COMMON, "resample": 2, "size": {"height": 224, "width": 224}, "image_mean": HALF,
                          "image_std": HALF, "do_convert_rgb": None},
}


@dataclass
class Processor:
    """The steps of one ``preprocessor_config.json`` (``path``) of the class ``kind``."""
    path: str
    settings: dict
    kind: str = ""

    @classmethod
    def read(cls, folder: str) -> "Processor":
        path = os.path.join(folder, PREPROCESSOR)
        if not os.path.isfile(path):
            raise SpecError(f"no {PREPROCESSOR} here: the image processor's settings are needed",
                            location=folder, hint="copy the checkpoint's preprocessor_config.json beside the model")
        try:
            data = json.loads(open(path, encoding="utf-8").read())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise SpecError(f"not a JSON file: {err}", location=path) from None
        if not isinstance(data, dict):
            raise SpecError("expected a JSON object", location=path)
        kind = str(data.get("image_processor_type", "")).removesuffix("Fast").removesuffix("Pil")
        if kind not in DEFAULTS:
            raise SpecError(f"image_processor_type: {data.get('image_processor_type')!r} is not supported",
                            location=path, hint=f"irc applies {', '.join(DEFAULTS)}")
        processor = cls(path, {**DEFAULTS[kind], **{k: v for k, v in data.items() if v is not None or k not in
                                                    DEFAULTS[kind]}}, kind)
        processor.output_size()  # the settings are checked before any image is read
        processor._refuse_pan_and_scan()
        return processor

    def _error(self, key: str, detail: str, hint=None) -> SpecError:
        return SpecError(f"{key}: {detail}", location=self.path, hint=hint)

    def _size(self, key: str, allowed: tuple) -> dict:
        size = self.settings.get(key)
        ok = isinstance(size, dict) and set(size) in allowed and all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size.values())
        if not ok:
            raise self._error(key, f"expected one of {' or '.join(str(sorted(a)) for a in allowed)} with positive "
                                   f"integers, got {size!r}")
        return size

    def output_size(self):
        """(height, width) of every output, or None when it follows the image (no crop, a
        shortest-edge resize)."""
        if self.kind in TILED:  # every tile and the global view: max_image_size square
            side = self._size("max_image_size", ({"longest_edge"},))["longest_edge"]
            self._size("size", ({"longest_edge"},))
            return side, side
        if self.kind in PATCHED:  # its size follows the image
            from irc_cli.images_qwen import check
            check(self)
            return None
        if self.kind in FITTED:  # its size follows the image
            from irc_cli.images_pixtral import check
            check(self)
            return None
        if self.kind in NAFLEX:  # patches at the image's aspect ratio
            from irc_cli.images_siglip2 import check
            check(self)
            return None
        if self.kind in CANVASED:  # tiles of size, as many as the image's canvas holds
            self._size("size", ({"height", "width"},))
            return None
        if self.settings.get("do_center_crop"):
            crop = self._size("crop_size", ({"height", "width"},))
            return crop["height"], crop["width"]
        if self.settings.get("do_resize"):
            size = self._size("size", ({"height", "width"}, {"shortest_edge"}))
            if "height" in size:
                return size["height"], size["width"]
        return None

    def _refuse_pan_and_scan(self) -> None:
        if self.settings.get("do_pan_and_scan"):
            raise self._error("do_pan_and_scan", "Gemma 3's pan-and-scan crops are not applied by irc",
                              hint="set it to false (its default)")

    def check_model(self, height: int, width: int) -> None:
        """The model takes [B, C, height, width]: the processor must give that."""
        out = self.output_size()
        if out != (height, width):
            key = "crop_size" if self.settings.get("do_center_crop") else "size"
            raise self._error(key, f"gives images of {'their own size' if out is None else f'{out[0]}x{out[1]}'}, "
                                   f"but the model takes {height}x{width}")

    def images(self, image) -> tuple[np.ndarray, int, int]:
        """A Pillow image -> (pixel values float32 [N, C, H, W], rows, columns): N = 1 and no
        grid, or Idefics3's / SmolVLM's tiles (rows x columns of them, then the global view)."""
        if self.kind in TILED:
            from irc_cli.images_tiled import tiles
            return tiles(self, image)
        return self(image)[None], 0, 0

    def __call__(self, image) -> np.ndarray:
        """A Pillow image -> pixel values float32 [C, H, W]."""
        from PIL import Image

        if self.kind in TILED:
            raise IRCError(f"{self.kind} gives an image as tiles: Processor.images", location=self.path)
        if self.kind in PATCHED:
            raise IRCError(f"{self.kind} gives an image as patches: irc_cli.images_qwen.patches", location=self.path)
        if self.kind in FITTED:
            raise IRCError(f"{self.kind} gives an image at its own size: irc_cli.images_pixtral.pixtral",
                           location=self.path)
        if self.kind in NAFLEX:
            raise IRCError(f"{self.kind} gives an image as rows of patches: irc_cli.images_siglip2.naflex",
                           location=self.path)
        if self.kind in CANVASED:
            raise IRCError(f"{self.kind} gives an image as tiles: irc_cli.images_mllama.mllama", location=self.path)
        s = self.settings
        if s.get("do_convert_rgb"):
            image = to_rgb(image)
        if s.get("do_resize"):
            size = s["size"]
            if "shortest_edge" in size:
                height, width = shortest_edge(image.height, image.width, size["shortest_edge"])
            else:
                height, width = size["height"], size["width"]
            image = image.resize((width, height), resample=Image.Resampling(int(s["resample"])))
        pixels = np.asarray(image)
        pixels = (pixels[:, :, None] if pixels.ndim == 2 else pixels).transpose(2, 0, 1)
        if s.get("do_center_crop"):
            pixels = center_crop(pixels, s["crop_size"]["height"], s["crop_size"]["width"])
        return self.finish(pixels, image.mode)

    def finish(self, pixels: np.ndarray, mode: str) -> np.ndarray:
        """[C, H, W] bytes -> float32, rescaled and normalised as the settings say."""
        s = self.settings
        pixels = pixels.astype(np.float32)
        if s.get("do_rescale"):
            pixels = (pixels.astype(np.float64) * s["rescale_factor"]).astype(np.float32)
        if s.get("do_normalize"):
            mean = np.asarray(s["image_mean"], np.float32).reshape(-1, 1, 1)
            std = np.asarray(s["image_std"], np.float32).reshape(-1, 1, 1)
            if mean.shape[0] != pixels.shape[0] or std.shape[0] != pixels.shape[0]:
                raise IRCError(f"the image has {pixels.shape[0]} channels ({mode}), image_mean and image_std "
                               f"{mean.shape[0]} and {std.shape[0]} values", location=self.path,
                               hint="do_convert_rgb: true makes every image RGB")
            pixels = (pixels - mean) / std
        return pixels


def shortest_edge(height: int, width: int, size: int) -> tuple[int, int]:
    """(height, width) with the short side ``size`` and the long one int(size · long / short)."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(size * long / short)
    return (new_long, size) if width <= height else (size, new_long)


def center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """[C, H, W] cropped about the centre to [C, height, width], zero-padded where smaller."""
    _, rows, columns = pixels.shape
    top, left = (rows - height) // 2, (columns - width) // 2
    if top >= 0 and left >= 0:
        return pixels[:, top:top + height, left:left + width]
    new_rows, new_columns = max(height, rows), max(width, columns)
    padded = np.zeros(pixels.shape[:1] + (new_rows, new_columns), pixels.dtype)
    top_pad, left_pad = -(-(new_rows - rows) // 2), -(-(new_columns - columns) // 2)
    padded[:, top_pad:top_pad + rows, left_pad:left_pad + columns] = pixels
    top, left = top + top_pad, left + left_pad
    return padded[:, max(0, top):min(new_rows, top + height), max(0, left):min(new_columns, left + width)]
