"""What onnxruntime-genai 0.18 needs, beyond a plain decoder's config, to run a Mistral 3
(Mistral-Small-3.1, Pixtral vision) folder with images: ``model.type`` ``mistral3``, its
``MultiModalLanguageModel`` with ``Mistral3ImageProcessor`` and ``PixtralVisionState``.

Sources: microsoft/onnxruntime-genai ``src/models/mistral3_image_processor.cpp``,
``multi_modal.cpp`` (``PixtralVisionState``), ``config.cpp``, genai's
``test/models/mistral3/processor_config.json``; onnxruntime-extensions
``shared/api/image_transforms.hpp`` (``Resize``) and ``image_transforms_pixtral.hpp``
(``PixtralImageSizes``); transformers 5.25 ``PixtralImageProcessorPil`` / ``PixtralProcessor``.
Each claim was run against the installed 0.18 (scratch folders of tiny ONNX models).

What genai does with a ``mistral3`` folder:

- its processor runs ``processor_config.json`` (one image -> ``pixel_values`` [1, 3, H, W]
  cast to the vision input's type, ``image_sizes`` int64 [N, 2]), then tokenizes the prompt and
  replaces each ``[IMG]`` (a run of adjacent ``[IMG]`` counts as one) with the image's
  H/f rows of W/f ``[IMG]`` each followed by ``[IMG_BREAK]``, the last by ``[IMG_END]``
  (f = ``vision.patch_size`` * ``vision.spatial_merge_size``). It resolves ``[IMG]``,
  ``[IMG_BREAK]``, ``[IMG_END]`` and ``[INST]`` through the tokenizer by those strings;
  ``model.image_token_id`` is not read (the embedding model alone uses it). Images without a
  placeholder go after the first ``[INST]`` (else at the start);
- ``vision.onnx`` runs once per image on [1, 3, H_i, W_i] and writes its
  (H_i/f)*(W_i/f) rows into a pre-allocated ``image_features`` [sum, decoder.hidden_size];
  a vision input named ``image_sizes`` would get the whole [N, 2] tensor on every run, so the
  model takes the size from ``pixel_values``' shape;
- the embedding model puts those rows on the ``[IMG]`` positions; the decoder gets plain
  ``position_ids`` [batch, seq] (0..S-1, then the past length) and ``attention_mask``.

onnxruntime-extensions' ``Resize`` has no longest-edge mode, so the resize is its
``smart_resize`` (``mistral3_genai_size``): each side to the *nearest* multiple of f (at least
f), then, when the area exceeds the bound's, both sides scaled down by the square root of the
ratio and floored to multiples of f. transformers instead shrinks the longest side to
``longest_edge`` and rounds each side *up* to a multiple of f. The two agree on images whose
sides are multiples of f within the bound (pixels equal to 5e-7); elsewhere genai's grid can be
a row or column smaller, and a non-square image beyond the bound keeps the bound's *area*, so
its longer side can exceed ``longest_edge``. Aspect ratios over 200 are refused by genai.
"""
from __future__ import annotations

import json
import math

from irc.errors import BackendError

GENAI_TYPE = "mistral3"
RESAMPLE = {0: "NEAREST", 1: "LANCZOS", 2: "LINEAR", 3: "CUBIC"}  # Pillow's codes -> onnxruntime-extensions'
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
DEFAULT_LONGEST_EDGE = 1024  # PixtralImageProcessor's class default
MAX_RATIO = 200.0  # onnxruntime-extensions' smart_resize refuses longer/shorter above this


def _positive(value, what: str, location: str | None = None, zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        raise BackendError(f"{what} must be a {'non-negative' if zero else 'positive'} integer, not {value!r}",
                           location=location)
    return value


def _triple(value, what: str, location: str) -> list[float]:
    values = [value] * 3 if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    if (not isinstance(values, list) or len(values) != 3
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values)):
        raise BackendError(f"{what} must be a number or three numbers, not {value!r}", location=location)
    return [float(v) for v in values]


def mistral3_processor_config(preprocessor_path: str, patch: int) -> dict:
    """``processor_config.json`` (onnxruntime-extensions' steps) for a Pixtral / Mistral 3
    checkpoint's ``preprocessor_config.json``.

    patch: f, the side of one image token in pixels, ``vision_config.patch_size`` *
    ``spatial_merge_size`` (14 * 2 = 28 for Mistral 3, 16 * 1 for Pixtral-12B): the
    preprocessor file's own ``patch_size`` is not it (``PixtralProcessor`` passes f).

    Steps: decode as RGB (no ``ConvertRGB``: in 0.18 it swaps red and blue); ``Resize`` with
    ``smart_resize`` on an f grid, ``min_pixels`` f*f, ``max_pixels`` the bound's area
    (``size.longest_edge`` squared, or ``size.height`` * ``size.width``; default 1024
    squared), the checkpoint's ``resample``; ``Rescale`` (``rescale_factor``, 1.0 when
    ``do_rescale`` is false); ``Normalize`` (``image_mean`` / ``image_std``, left out when
    ``do_normalize`` is false); ``Permute3D`` to channels first; ``PixtralImageSizes`` (the
    [H, W] genai expands the prompt with). ``do_resize`` false and a centre crop are refused."""
    location = preprocessor_path
    try:
        with open(preprocessor_path, encoding="utf-8") as f:
            settings = json.load(f)
    except (OSError, ValueError) as error:
        raise BackendError(f"cannot read preprocessor_config.json: {error}", location=location) from error
    if not isinstance(settings, dict):
        raise BackendError("preprocessor_config.json is not a JSON object", location=location)
    kind = settings.get("image_processor_type")
    if kind is not None and "Pixtral" not in str(kind):
        raise BackendError(f"image_processor_type {kind!r} is not Pixtral's; mistral3 folders need "
                           "PixtralImageProcessor settings", location=location)
    f = _positive(patch, "the image token's side (patch_size * spatial_merge_size)")
    if settings.get("do_resize", True) is False:
        raise BackendError("do_resize false is not supported: genai's mistral3 processor needs every image "
                           f"resized to whole {f}x{f} blocks", location=location)
    if settings.get("do_center_crop"):
        raise BackendError("do_center_crop is not supported: genai's mistral3 steps resize the whole image",
                           location=location, hint="set it to null (Pixtral's default)")
    size = settings.get("size")
    size = {"longest_edge": DEFAULT_LONGEST_EDGE} if size is None else size
    if not isinstance(size, dict):
        raise BackendError(f"size must be an object with longest_edge (or height and width), not {size!r}",
                           location=location)
    if "longest_edge" in size:
        bound = (_positive(size["longest_edge"], "size.longest_edge", location),) * 2
    elif "height" in size and "width" in size:
        bound = (_positive(size["height"], "size.height", location), _positive(size["width"], "size.width", location))
    else:
        raise BackendError(f"size {size!r} has neither longest_edge nor height and width", location=location)
    if min(bound) < f:
        raise BackendError(f"size {size!r} is smaller than one {f}x{f} image token", location=location)
    resample = settings.get("resample", 3)
    if isinstance(resample, bool) or resample not in RESAMPLE:
        raise BackendError(f"resample {resample!r} has no onnxruntime-extensions filter", location=location,
                           hint=f"filters: {', '.join(f'{k} ({v})' for k, v in RESAMPLE.items())}")
    factor = settings.get("rescale_factor", 1 / 255) if settings.get("do_rescale", True) is not False else 1.0
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
        raise BackendError(f"rescale_factor must be a positive number, not {factor!r}", location=location)

    def step(name: str, kind: str, **attrs) -> dict:
        return {"operation": {"name": name, "type": kind, **({"attrs": attrs} if attrs else {})}}

    steps = [step("decode_image", "DecodeImage", color_space="RGB"),
             step("resize", "Resize", interpolation=RESAMPLE[resample], smart_resize=1, keep_aspect_ratio=0,
                  min_pixels=f * f, max_pixels=bound[0] * bound[1], patch_size=f, merge_size=1),
             step("rescale", "Rescale", rescale_factor=float(factor))]
    if settings.get("do_normalize", True) is not False:
        mean = _triple(settings.get("image_mean", CLIP_MEAN), "image_mean", location)
        std = _triple(settings.get("image_std", CLIP_STD), "image_std", location)
        if 0.0 in std:
            raise BackendError(f"image_std {std} has a zero", location=location)
        steps.append(step("normalize", "Normalize", mean=mean, std=std))
    steps += [step("to_channel_first", "Permute3D", dims=[2, 0, 1]),
              step("pixtral_image_sizes", "PixtralImageSizes")]
    return {"processor": {"name": "pixtral_image_processor", "transforms": steps}}


def mistral3_genai_size(height: int, width: int, patch: int, max_pixels: int) -> tuple[int, int]:
    """(H, W) genai 0.18's ``Resize`` (``smart_resize``, ``min_pixels`` patch²) gives an image of
    (height, width): the prompt then holds (H/patch) x (W/patch) ``[IMG]``. Raises for an aspect
    ratio over 200, as genai does."""
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise BackendError(f"a {width}x{height} image is refused by genai's resize: aspect ratio over {MAX_RATIO:g}")
    h = max(patch, int(math.floor(height / patch + 0.5)) * patch)  # std::round: half away from zero
    w = max(patch, int(math.floor(width / patch + 0.5)) * patch)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = int(height / beta) // patch * patch, int(width / beta) // patch * patch
    return h, w


def mistral3_genai_sections(patch_size: int, spatial_merge_size: int, image_token_id: int,
                            vision_filename: str = "vision.onnx",
                            config_filename: str = "processor_config.json") -> dict:
    """The ``genai_config.json`` ``model`` keys a ``mistral3`` folder adds to the plain
    decoder's (``config["model"].update(...)``): ``type``, ``image_token_id`` and the
    ``vision`` section.

    patch_size, spatial_merge_size: the checkpoint's ``vision_config.patch_size`` and
    ``spatial_merge_size`` (Mistral 3: 14 and 2); genai counts an image's tokens as
    (H / (patch_size * spatial_merge_size)) * (W / ...), so their product must be the ``patch``
    given to ``mistral3_processor_config``. image_token_id: ``config.json``'s (``[IMG]``, 10 in
    Mistral's tokenizer), written for the record: genai takes the ids of ``[IMG]``,
    ``[IMG_BREAK]``, ``[IMG_END]`` and ``[INST]`` from the tokenizer, which must hold all four
    (a missing one becomes id -1 in the prompt).

    The rest of the folder: ``vision.onnx`` ``pixel_values`` [1, 3, H, W] (float32, float16 or
    bfloat16) -> ``image_features`` [(H/f)*(W/f), decoder.hidden_size], rank 2, rows row by row,
    the projector inside, its dtype the embedding's ``image_features`` input's; the embedding
    section ``input_ids`` + ``image_features`` -> ``inputs_embeds`` (it must take 0 feature
    rows); the decoder's ``inputs_embeds``, ``attention_mask`` and a [batch, seq]
    ``position_ids``, no ``input_ids`` needed."""
    _positive(patch_size, "Mistral 3 vision patch_size")
    _positive(spatial_merge_size, "Mistral 3 spatial_merge_size")
    _positive(image_token_id, "Mistral 3 image_token_id", zero=True)
    for name, value in (("vision_filename", vision_filename), ("config_filename", config_filename)):
        if not isinstance(value, str) or not value:
            raise BackendError(f"{name} must be a file name, not {value!r}")
    return {
        "type": GENAI_TYPE,
        "image_token_id": image_token_id,
        "vision": {
            "filename": vision_filename,
            "config_filename": config_filename,
            "spatial_merge_size": spatial_merge_size,
            "patch_size": patch_size,
            "inputs": {"pixel_values": "pixel_values"},
            "outputs": {"image_features": "image_features"},
        },
    }
