"""What onnxruntime-genai 0.18 needs, beyond a plain decoder's config, to run a Qwen2.5-VL,
Qwen3-VL or Qwen3.5 folder with an image (``model.type`` ``qwen2_5_vl``, ``qwen3_vl``,
``qwen3_5`` or ``qwen3_5_moe``, its ``MultiModalLanguageModel``; they share
``QwenImageProcessor`` and the 3-D positions, and its multimodal decoder state carries a
hybrid's recurrent states beside the KV caches: ``src/models/model.cpp``, ``multi_modal.cpp``).
genai sizes the image features and ``inputs_embeds`` by ``decoder.hidden_size`` alone
(``multi_modal_features.cpp``, ``embeddings.cpp``), so a Qwen3-VL folder, whose features carry
DeepStack's levels beside the token's, declares that width (``backends.onnx.vlm``).

Sources (microsoft/onnxruntime-genai, the snapshot nearest 0.18; the installed 0.18
parser was probed and accepts / refuses the same keys):

- ``src/config.cpp`` ``Vision_Element`` / ``Model_Element``: the keys below; any other key is
  an error ("Unknown value"). ``src/config.h`` ``Vision``: ``inputs.image_grid_thw``
  defaults to ``"image_sizes"``, so it is written out.
- ``src/models/qwen2_5_vl_image_processor.cpp``: genai's processor runs ``processor_config.json``
  (``vision.config_filename``) through onnxruntime-extensions, then replaces each
  ``<|vision_start|>...<|vision_end|>`` in the prompt with ``<|vision_start|>`` + t*h*w/merge^2
  ``<|image_pad|>`` + ``<|vision_end|>``; it hands ``pixel_values`` [patches, C*T*p*p] (cast to
  the vision model's input type), ``image_grid_thw`` int64 [images, 3], ``num_image_tokens``.
- ``src/models/position_inputs.cpp`` ``Qwen2VLPositionInputs``: transformers' ``get_rope_index``
  from ``image_token_id``, ``vision_start_token_id``, ``video_token_id``,
  ``vision.spatial_merge_size`` and ``vision.tokens_per_second``; position_ids [3, batch, seq].
- onnxruntime-extensions ``shared/api/image_transforms.hpp`` (``Resize`` with ``smart_resize``,
  ``Rescale``, ``Normalize`` with ``qwen2_5_vl``), ``image_transforms_qwen2_5.hpp``
  (``PatchImage``); the step list is genai's ``test/models/qwen2-5-vl/processor_config.json``
  (and ``qwen3-5/``'s, whose ``Normalize`` flag ``qwen3_vl`` is the same switch).
- transformers 5.25 ``Qwen2VLImageProcessor`` for the defaults of a missing key.

``vision.patch_size`` and ``vision.window_size`` only matter to genai's QNN three-stage vision
pipeline (``qwen_vl_vision.cpp``); a single ``vision.onnx`` computes its window index and
rotary positions itself from ``image_grid_thw``.
"""
from __future__ import annotations

import json

from irc.errors import BackendError

GENAI_TYPE = "qwen2_5_vl"
QWEN_TYPES = ("qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe")  # genai's types that take these sections
_NAMES = {"qwen2_5_vl": ("qwen2_5_image_processor", "qwen2_5_vl")}  # processor name, Normalize flag
_QWEN3 = ("qwen3_vl_image_processor", "qwen3_vl")
RESAMPLE = {0: "NEAREST", 1: "LANCZOS", 2: "LINEAR", 3: "CUBIC"}  # Pillow's codes -> onnxruntime-extensions'
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
DEFAULTS = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 56 * 56,
            "max_pixels": 28 * 28 * 1280, "resample": 3, "rescale_factor": 1 / 255}


def _int(settings: dict, key: str, path: str) -> int:
    value = settings.get(key, DEFAULTS.get(key))
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BackendError(f"{key} must be a positive integer, not {value!r}", location=path)
    return value


def qwen_processor_config(preprocessor_path: str, genai_type: str = GENAI_TYPE) -> dict:
    """``processor_config.json`` (onnxruntime-extensions' steps) for a Qwen2.5-VL checkpoint's
    ``preprocessor_config.json``: decode as RGB, the channel swap (``ConvertRGB``, undone by
    ``Normalize``'s ``qwen2_5_vl``), ``smart_resize`` between min_pixels and max_pixels on a
    patch*merge grid, rescale, normalise, then ``PatchImage`` into [t*h*w, C*T*p*p] rows in
    transformers' merge-window order plus ``image_grid_thw``.

    min/max pixels: ``min_pixels`` / ``max_pixels`` when given, else ``size.shortest_edge`` /
    ``size.longest_edge`` (transformers' precedence), else 56*56 / 28*28*1280."""
    with open(preprocessor_path, encoding="utf-8") as f:
        settings = json.load(f)
    if not isinstance(settings, dict):
        raise BackendError("preprocessor_config.json is not a JSON object", location=preprocessor_path)
    for flag in ("do_resize", "do_normalize"):
        if settings.get(flag, True) is False:
            raise BackendError(f"{flag} false is not supported: genai's Qwen steps always resize and normalise",
                               location=preprocessor_path)
    size = settings.get("size") if isinstance(settings.get("size"), dict) else {}
    pixels = {"min_pixels": settings.get("min_pixels", size.get("shortest_edge", DEFAULTS["min_pixels"])),
              "max_pixels": settings.get("max_pixels", size.get("longest_edge", DEFAULTS["max_pixels"]))}
    low, high = (_int(pixels, key, preprocessor_path) for key in ("min_pixels", "max_pixels"))
    if low > high:
        raise BackendError(f"min_pixels {low} is above max_pixels {high}", location=preprocessor_path)
    patch, merge, temporal = (_int(settings, key, preprocessor_path)
                              for key in ("patch_size", "merge_size", "temporal_patch_size"))
    resample = settings.get("resample", DEFAULTS["resample"])
    if resample not in RESAMPLE:
        raise BackendError(f"resample {resample!r} has no onnxruntime-extensions filter", location=preprocessor_path,
                           hint=f"filters: {', '.join(f'{k} ({v})' for k, v in RESAMPLE.items())}")
    factor = settings.get("rescale_factor", DEFAULTS["rescale_factor"]) if settings.get("do_rescale", True) else 1.0
    mean = [float(v) for v in settings.get("image_mean", CLIP_MEAN)]
    std = [float(v) for v in settings.get("image_std", CLIP_STD)]
    if len(mean) != 3 or len(std) != 3 or 0.0 in std:
        raise BackendError(f"image_mean {mean} / image_std {std} must be three numbers each (no zero std)",
                           location=preprocessor_path)

    def step(name: str, kind: str, **attrs) -> dict:
        return {"operation": {"name": name, "type": kind, **({"attrs": attrs} if attrs else {})}}

    name, flag = _NAMES.get(genai_type, _QWEN3)
    steps = [step("decode_image", "DecodeImage", color_space="RGB"),
             step("convert_to_rgb", "ConvertRGB"),  # swaps R and B; Normalize's qwen2_5_vl swaps them back
             step("resize", "Resize", interpolation=RESAMPLE[resample], smart_resize=1, keep_aspect_ratio=0,
                  min_pixels=low, max_pixels=high, patch_size=patch, merge_size=merge),
             step("rescale", "Rescale", rescale_factor=float(factor)),
             step("normalize", "Normalize", mean=mean, std=std, **{flag: 1}),
             step("patch_image", "PatchImage", patch_size=patch, temporal_patch_size=temporal, merge_size=merge)]
    return {"processor": {"name": name, "transforms": steps}}


def qwen_genai_sections(merge: int, patch: int, window: int, image_token_id: int, vision_start_token_id: int,
                        video_token_id: int | None = None, tokens_per_second: float = 2.0,
                        vision_filename: str = "vision.onnx",
                        config_filename: str = "processor_config.json", genai_type: str = GENAI_TYPE) -> dict:
    """The ``genai_config.json`` ``model`` keys a ``qwen2_5_vl`` folder adds to the plain decoder's
    (``config["model"].update(...)``): ``type``, the three token ids genai's mRoPE positions read,
    and the ``vision`` section.

    merge, patch, window, tokens_per_second: the checkpoint's ``vision_config``
    (``spatial_merge_size``, ``patch_size``, ``window_size`` in pixels as transformers counts it,
    ``tokens_per_second``); image_token_id, vision_start_token_id, video_token_id: its
    ``config.json`` (Qwen2.5-VL: 151655, 151652, 151656). The embedding section stays
    ``input_ids`` + ``image_features`` -> ``inputs_embeds``; the decoder's inputs name
    ``inputs_embeds``, ``attention_mask`` and a [3, batch, seq] ``position_ids`` (same integer type
    as the mask, int64); ``decoder.hidden_size`` must equal the vision output's width."""
    for name, value in {"merge": merge, "patch": patch, "window": window, "image_token_id": image_token_id,
                        "vision_start_token_id": vision_start_token_id}.items():
        low = 0 if "token" in name or name == "window" and genai_type != GENAI_TYPE else 1  # 0: no windows
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise BackendError(f"Qwen2.5-VL {name} must be a {'non-negative' if not low else 'positive'} "
                               f"integer, not {value!r}")
    if window % (merge * patch):
        raise BackendError(f"Qwen2.5-VL window_size {window} is not a multiple of spatial_merge_size * patch_size "
                           f"({merge} * {patch})")
    model = {"type": genai_type, "image_token_id": image_token_id, "vision_start_token_id": vision_start_token_id}
    if video_token_id is not None:
        model["video_token_id"] = int(video_token_id)
    model["vision"] = {
        "filename": vision_filename,
        "config_filename": config_filename,
        "spatial_merge_size": merge,
        "patch_size": patch,
        **({"window_size": window} if window else {}),  # Qwen3.5's tower has no windows
        "tokens_per_second": float(tokens_per_second),
        "inputs": {"pixel_values": "pixel_values", "image_grid_thw": "image_grid_thw"},
        "outputs": {"image_features": "image_features"},
    }
    return model
