"""``irc run VLM --image FILE --prompt TEXT``: a vision-language model answers about an image.

    irc run out/llava --image photo.jpg --prompt "USER: <image> What is in this picture? ASSISTANT:"
    irc run models/gemma-3-4b-it --image photo.jpg --prompt "<start_of_image> Describe this image." --chat

The image goes through the checkpoint's ``preprocessor_config.json`` (``irc_cli.images``),
then the vision model (``image_features``, one row per visual token). The prompt must hold
the image placeholder once per image (LLaVA: ``<image>``, Gemma 3: ``<start_of_image>``); each is
laid out as transformers' processor lays it out (``image_prompt``: LLaVA's widened to the
image's tokens; Gemma 3's "\\n\\n" + <start_of_image> + its soft tokens + <end_of_image> +
"\\n\\n"; SmolVLM's tiles named row by row; PaliGemma's before the prompt), and the decoder's
embedding step puts the features there. Then greedy decoding as for text (``irc_cli.run``): a
folder ``irc compile`` wrote runs in onnxruntime-genai where it has genai's config, else its
three models in onnxruntime (``vision.onnx``, ``embedding.onnx``, the decoder); a spec or
Hugging Face folder runs in the reference interpreter. A prompt whose placeholders do not
number the images is refused before anything runs.
"""
from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np

from irc.errors import IRCError, SpecError
from irc.inputs import read_json
from irc_cli import engines
from irc_cli.image_file import read_image
from irc_cli.images import PATCHED, Processor

MANIFEST = engines.VLM_MANIFEST
GRID = "image_grid_thw"  # Qwen-VL's vision model's second input
ROWS = "image_rows"  # LLaVA-NeXT's (frontends.dsl_vision.packed_features)
RATIO_IDS, RATIO_MASK = "aspect_ratio_ids", "aspect_ratio_mask"  # Llama-3.2-Vision's (frontends.dsl_mllama)
KEYS = ("vision", "embedding", "decoder", "image_token_id", "image_tokens", "image_size", "image_prompt")


def takes_images(path: str) -> bool:
    """Is ``path`` a VLM: a folder irc compile wrote for one, or a Hugging Face folder of a
    ``frontends.hf.vlm`` family? (Anything else given ``--image`` is an image encoder's.)"""
    from frontends.hf.vlm import FAMILIES

    folder = os.path.dirname(os.path.abspath(path)) if path.endswith(".onnx") else path
    if os.path.isfile(os.path.join(folder, MANIFEST)):
        return True
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            model_type = json.load(f).get("model_type")
        return isinstance(model_type, str) and model_type in FAMILIES
    except (OSError, ValueError, AttributeError):
        return False


PLACEHOLDER_HINT = "put the model's image placeholder (LLaVA and SmolVLM: <image>, Gemma 3: <start_of_image>) in " \
                   "the prompt once per image"


def _placeholders(found: int, images: int, what: str, where: str) -> None:
    if found != images:
        raise IRCError(f"the prompt holds {found} image placeholder(s) ({what}) for {images} image(s)",
                       location=where, hint=PLACEHOLDER_HINT)


def image_tokens(model, grid: tuple) -> int:
    """Visual tokens of one image: the model's fixed count, or Qwen-VL's of its grid (t, h, w)."""
    layout = model.image_prompt
    if layout["kind"] == "anyres":  # LLaVA-NeXT: the image's packed rows
        return len(grid)
    if layout["kind"] == "rows":  # Mistral-3: a feature per merged block
        return grid[0] * grid[1]
    if layout["kind"] != "qwen":
        return model.tokens
    from irc_cli.images_qwen import image_tokens as qwen_tokens
    return qwen_tokens(grid, layout["merge"])


def image_rows(model, grid: tuple) -> list:
    """Mistral-3's image ids (PixtralProcessor's): ``grid`` rows of [IMG] x columns, each closed
    by [IMG_BREAK], the last by [IMG_END]."""
    layout = model.image_prompt
    rows = [[model.token] * grid[1] + [layout["image_break"]] for _ in range(grid[0])]
    rows[-1][-1] = layout["image_end"]
    return [t for row in rows for t in row]


def expand_text(prompt: str, model, images: int, grid: tuple, where: str, text) -> tuple[str, bool]:
    """(the prompt text with its placeholder laid out as the checkpoint's processor lays out
    the image, whether the tokenizer adds its special tokens): ``image_prompt`` from
    frontends.hf.vlm; ``grid``: the tiles' rows and columns; before tokenization, as the
    processors do. PaliGemma's processor writes the images' tokens, <bos>, the prompt and a
    newline itself, and tokenizes that without special tokens."""
    layout, name = model.image_prompt, text.tokenizer.id_to_token
    placeholder, image = name(layout["placeholder"]), name(model.token) * (image_tokens(model, grid) if images else 0)
    if layout["kind"] == "prepend":
        if placeholder in prompt:
            raise IRCError(f"the prompt holds {placeholder}: PaliGemma's processor puts the image before the prompt",
                           location=where, hint=f"leave {placeholder} out of the prompt")
        bos = text.config.get("bos_token") or "<bos>"
        return image * images + (bos["content"] if isinstance(bos, dict) else bos) + prompt + "\n", False
    _placeholders(prompt.count(placeholder), images, placeholder, where)
    if layout["kind"] == "cross":  # Llama-3.2-Vision: one <|image|> per image, its states read by cross-attention
        return prompt, True
    if layout["kind"] == "rows" and images:  # PixtralProcessor's rows of [IMG]
        return prompt.replace(placeholder, "".join(name(t) for t in image_rows(model, grid))), True
    if layout["kind"] == "tiles":  # SmolVLMProcessor's get_image_prompt_string
        rows, columns = grid
        fake, whole = layout["fake"], layout["global"]
        laid = "".join("".join(f"{fake}<row_{r + 1}_col_{c + 1}>{image}" for c in range(columns)) + "\n"
                       for r in range(rows))
        laid += ("\n" if rows else "") + f"{fake}{whole}{image}{fake}"
    else:
        before, after = ("".join(name(t) for t in layout[k]) for k in ("before", "after"))
        laid = layout["around"] + before + image + after + layout["around"]
    return prompt.replace(placeholder, laid), True


def expand(prompt: list, model, images: int, where: str, text=None, grid: tuple = (0, 0)) -> list:
    """Token ids with each placeholder id laid out as ``expand_text`` lays out its text
    (Gemma 3's newlines around the image only with the tokenizer); SmolVLM's tiles are named
    in text: they need ``expand_text``."""
    layout = model.image_prompt
    token = layout["placeholder"]
    if layout["kind"] == "prepend":  # PaliGemma: the images' tokens before the ids given
        return [model.token] * (model.tokens * images) + list(prompt)
    _placeholders(prompt.count(token), images, f"token {token}", where)
    if layout["kind"] == "cross":
        return list(prompt)
    if layout["kind"] == "tiles" and images:
        raise IRCError("SmolVLM's and Idefics3's image layout names its tiles in text (<row_1_col_1>, ...)",
                       location=where, hint="give the prompt as text: --prompt TEXT (with the model's tokenizer)")
    if layout["kind"] == "rows" and images:  # Mistral-3's rows of [IMG]
        return [t for x in prompt for t in (image_rows(model, grid) if x == token else [x])]
    around = text.encode(layout["around"], special=False) if layout["around"] and text is not None else []
    image = around + layout["before"] + [model.token] * (image_tokens(model, grid) if images else 0) + \
        layout["after"] + around
    return [t for x in prompt for t in (image if x == token else [x])]


class FolderModel:
    """A compiled VLM folder's three models in onnxruntime."""

    def __init__(self, folder: str):
        from backends.onnx.runtime import ort_session

        path = os.path.join(folder, MANIFEST)
        self.manifest = read_json(path)
        missing = [key for key in KEYS if key not in self.manifest] if isinstance(self.manifest, dict) else KEYS
        if missing:
            raise IRCError(f"no {missing[0]} in the folder's manifest", location=path,
                           hint="compile the model again with this irc")
        self.folder = folder
        self.vision, self.embedding, self.decoder = (ort_session(os.path.join(folder, self.manifest[k]), threads=None)
                                                     for k in ("vision", "embedding", "decoder"))
        self.engine = "onnxruntime (vision, embedding, decoder)"

    def _features_input(self):
        """(the session taking ``image_features``, that input): the embedding model, or the
        decoder where it reads them by cross-attention."""
        return next((s, v) for s in (self.embedding, self.decoder) for v in s.get_inputs() if v.name == "image_features")

    @property
    def width(self) -> int:
        return int(self._features_input()[1].shape[-1])

    @property
    def tiles(self) -> Optional[int]:
        return self.manifest.get("tiles")

    def no_rows(self) -> np.ndarray:
        """The image features for a step without an image: 0 rows ([0, d], or a cross-attention
        decoder's [1, 0, d])."""
        session, value = self._features_input()
        return np.zeros((0, self.width) if len(value.shape) == 2 else (1, 0, self.width),
                        engines.input_type(session, "image_features"))

    @property
    def token(self) -> int:
        return int(self.manifest["image_token_id"])

    @property
    def image_prompt(self) -> dict:
        return self.manifest["image_prompt"]

    @property
    def tokens(self) -> int:
        return int(self.manifest["image_tokens"])

    @property
    def size(self) -> tuple:
        return tuple(self.manifest["image_size"])

    @property
    def patch(self) -> int:
        return int(self.manifest["patch"])

    @property
    def temporal(self) -> Optional[int]:
        return self.manifest.get("temporal")

    @property
    def position_axes(self) -> Optional[int]:
        shape = next(v.shape for v in self.decoder.get_inputs() if v.name == "position_ids") \
            if any(v.name == "position_ids" for v in self.decoder.get_inputs()) else []
        return shape[0] if len(shape) == 3 else None

    def features(self, pixels: np.ndarray, grid: tuple = (0, 0)) -> np.ndarray:
        pixels = pixels.astype(engines.input_type(self.vision, "pixel_values"))
        return self.vision.run(["image_features"], vision_feeds(self.vision.get_inputs(), pixels, grid))[0]

    def caches(self) -> dict:
        return engines.session_caches(self.decoder, self.folder)

    def step(self, feeds: dict, features: np.ndarray) -> dict:
        feeds = {**feeds, "image_features": features}  # to the model that takes them
        taken = {v.name for v in self.embedding.get_inputs()}
        embeds = self.embedding.run(None, {k: v for k, v in feeds.items() if k in taken})[0]
        inputs = {v.name for v in self.decoder.get_inputs()}
        names = [o.name for o in self.decoder.get_outputs()]
        fed = {**{k: v for k, v in feeds.items() if k in inputs}, "inputs_embeds": embeds}
        return dict(zip(names, self.decoder.run(None, fed)))


class SpecModel:
    """A VLM spec (a Hugging Face folder) in the reference interpreter."""

    def __init__(self, graph, seed: int):
        from irc.interpreter import Interpreter

        self.graph, self.vision = graph, graph.parts["vision"]
        self._vision, self._decoder = Interpreter(self.vision, seed), Interpreter(graph, seed)
        self.token, self.tokens = graph.meta["image_token_id"], self.vision.meta["vision"]["tokens"]
        self.image_prompt = graph.meta["image_prompt"]
        self.size = tuple(self.vision.meta["vision"]["image_size"])
        self.patch = self.vision.meta["vision"]["patch"]
        self.temporal = self.vision.meta["vision"].get("temporal")
        self.tiles = self.vision.meta["vision"].get("tiles")
        self.engine = "reference interpreter"

    @property
    def position_axes(self) -> Optional[int]:
        shape = next((v.shape for v in self.graph.inputs if v.name == "position_ids"), ())
        return shape[0] if len(shape) == 3 else None

    def features(self, pixels: np.ndarray, grid: tuple = (0, 0)) -> np.ndarray:
        return self._vision.run(vision_feeds(self.vision.inputs, pixels, grid))["image_features"]

    def no_rows(self) -> np.ndarray:
        from irc.interpreter import no_images
        return no_images(self.graph)["image_features"]

    def caches(self) -> dict:
        from backends.onnx.runtime import empty_caches
        return empty_caches(self.graph, 1)

    def step(self, feeds: dict, features: np.ndarray) -> dict:
        return self._decoder.run({**feeds, "image_features": features})


def vision_feeds(inputs, pixels: np.ndarray, grid: tuple) -> dict:
    """The vision model's feeds: the pixels, and Qwen-VL's ``image_grid_thw`` where it takes it."""
    feeds = {"pixel_values": pixels}
    if any(v.name == GRID for v in inputs):
        feeds[GRID] = np.asarray([grid], np.int64)
    if any(v.name == ROWS for v in inputs):  # LLaVA-NeXT's: the rows the image's tiles pack into
        feeds[ROWS] = np.asarray(grid, np.int64)
    if any(v.name == RATIO_IDS for v in inputs):  # Llama-3.2-Vision's: (its tile arrangement, the tiles used)
        feeds[RATIO_IDS] = np.asarray([grid[0]], np.int64)
        feeds[RATIO_MASK] = (np.arange(pixels.shape[1]) < grid[1]).astype(np.int64)[None]
    return feeds


class CrossMask:
    """A cross-attention decoder's ``cross_attention_mask`` for each step
    (``irc_cli.images_mllama.cross_mask``): the prompt's, then its last row again."""

    def __init__(self, model, used: list):
        self.model, self.used, self.mask = model, used, None

    def __call__(self, feeds: dict) -> np.ndarray:
        from irc_cli.images_mllama import cross_mask
        ids = feeds["input_ids"][0]
        if feeds["attention_mask"].shape[1] == len(ids):  # the prompt
            tiles = self.model.tiles
            self.mask = cross_mask(list(ids), self.model.token, self.used, tiles, self.model.tokens // tiles)
            return self.mask
        return self.mask[:, -1:]


class MropePositions:
    """``greedy_loop``'s positions for Qwen-VL's decoder (``irc.mrope``): the prompt's laid out
    by its image grids, each later step's plain position plus the prompt's delta."""

    def __init__(self, model, grids: list):
        self.token, self.merge, self.grids, self.delta = model.token, model.image_prompt.get("merge", 1), grids, None

    def __call__(self, past: int, ids: np.ndarray) -> np.ndarray:
        from irc.mrope import mrope_positions, step_positions
        if past == 0:
            positions, self.delta = mrope_positions(ids, self.grids, self.token, self.merge)
            return positions
        return step_positions(np.asarray([past]), ids.shape[1], self.delta)


def runner(model, pixels: Optional[np.ndarray], grid: tuple = (0, 0)):
    """An ``irc_cli.engines`` runner: the image's features go in with the prompt step (none
    for a text-only prompt), later steps take none. A folder with ``genai_config.json`` runs
    in onnxruntime-genai when it is installed (``--engine auto`` or ``genai``)."""

    def run(source, prompt, max_new_tokens, eos, clock, engine: str = "auto") -> engines.Result:
        has_config = isinstance(model, FolderModel) and os.path.isfile(os.path.join(model.folder, engines.GENAI_CONFIG))
        if engine == "genai" and not has_config:
            raise IRCError("--engine genai: onnxruntime-genai does not run this model type's multimodal folder",
                           hint="use --engine ort (irc's loop over the three models)")
        if has_config and (engine == "genai" or (engine == "auto" and engines._has_genai())):
            if pixels is None:
                inputs = {}
            elif model.image_prompt["kind"] == "rows":  # genai's Mistral-3 processor's outputs
                block = model.patch * model.image_prompt["merge"]
                inputs = {"pixel_values": pixels.astype(np.float32),
                          "image_sizes": np.asarray([[grid[0] * block, grid[1] * block]], np.int64),
                          "num_image_tokens": np.asarray([image_tokens(model, grid)], np.int64)}
            elif model.image_prompt["kind"] == "qwen":  # genai's Qwen processor's outputs
                inputs = {"pixel_values": pixels.astype(np.float32), GRID: np.asarray([grid], np.int64),
                          "num_image_tokens": np.asarray([image_tokens(model, grid)], np.int64)}
            else:
                inputs = {"pixel_values": pixels.astype(np.float32),
                          "num_image_tokens": np.asarray([model.tokens * len(pixels)], np.int64)}
            return engines.genai(model.folder, prompt, max_new_tokens, eos, clock, inputs)
        empty = model.no_rows()
        rows = [empty if pixels is None else model.features(pixels, grid).reshape(
            (1,) * (empty.ndim - 2) + (-1, empty.shape[-1]))]  # the prompt step's, then none
        cross = CrossMask(model, [] if pixels is None else [grid[1]]) if model.image_prompt["kind"] == "cross" else None

        def step(feeds):
            if cross is not None:
                feeds = {**feeds, "cross_attention_mask": cross(feeds)}
            outputs = model.step(feeds, rows[0])
            rows[0] = empty
            return outputs

        positions = None if model.position_axes is None else MropePositions(model, [] if pixels is None else [grid])
        tokens, last = engines.greedy_loop(step, model.caches(), prompt, max_new_tokens, eos, clock,
                                           positions=positions)
        return engines.Result(tokens, model.engine, last)
    return run


def pixel_values(model, folder: str, image: str) -> tuple[np.ndarray, tuple]:
    """([N, C, H, W], (rows, columns)): the image through the checkpoint's processor, checked
    against the model (N = 1, or Idefics3's / SmolVLM's tiles and global view); Qwen-VL's:
    ([patches, C·T·p·p], its grid (t, h, w))."""
    processor = Processor.read(folder)
    if model.image_prompt["kind"] == "rows":  # Pixtral's: whole merged blocks of any size
        from irc_cli.images_pixtral import image_layout, pixtral
        block = model.patch * model.image_prompt["merge"]
        pixels, (height, width) = pixtral(processor, read_image(image), block)
        return pixels, image_layout(height, width, block)
    if model.image_prompt["kind"] == "anyres":  # the base view and the tiles, and the rows they pack into
        from irc_cli.images_anyres import anyres, feature_rows
        processor.check_model(*model.size)
        agree(processor, "image_grid_pinpoints", [list(p) for p in processor.settings.get("image_grid_pinpoints") or []],
              [list(p) for p in model.image_prompt["pinpoints"]])
        pixels, size = anyres(processor, read_image(image))
        side = model.size[0] // model.patch
        return pixels, feature_rows(size, model.image_prompt["pinpoints"], model.size[0], side)
    if model.image_prompt["kind"] == "cross":  # the image's tiles, its arrangement's id and the tiles used
        from irc_cli.images_mllama import check, mllama
        if processor.kind != "MllamaImageProcessor":
            raise IRCError(f"{processor.kind or 'this processor'} does not make Llama-3.2-Vision's tiles",
                           location=processor.path, hint="a Llama-3.2-Vision checkpoint's preprocessor_config.json")
        check(processor, model.size[0], model.tiles)
        pixels, ratio, used = mllama(processor, read_image(image), model.size[0], model.tiles)
        return pixels[None], (ratio, used)
    if model.image_prompt["kind"] == "qwen":
        from irc_cli.images_qwen import patches
        if processor.kind not in PATCHED:
            raise IRCError(f"{processor.kind or 'this processor'} does not make Qwen-VL's patches",
                           location=processor.path, hint="a Qwen2-VL checkpoint's preprocessor_config.json")
        for key, wanted in (("patch_size", model.patch), ("merge_size", model.image_prompt["merge"]),
                            ("temporal_patch_size", model.temporal)):
            agree(processor, key, processor.settings.get(key), wanted)
        return patches(processor, read_image(image))
    processor.check_model(*model.size)
    pixels, rows, columns = processor.images(read_image(image))
    return pixels, (rows, columns)


def agree(processor, key: str, value, wanted) -> None:
    """The processor's ``key`` is the model's, or one error naming the file and the key."""
    if value != wanted:
        raise SpecError(f"{key}: {value!r} contradicts the model's {wanted!r} (its config.json)",
                        location=processor.path, hint="the processor and the model must come from one checkpoint")


def load_model(args, source) -> Optional[object]:
    """The VLM behind ``irc_cli.run._source``'s source (a folder or a graph), or None."""
    if isinstance(source, str):
        return FolderModel(source) if os.path.isfile(os.path.join(source, MANIFEST)) else None
    return SpecModel(source, args.seed) if "vision" in source.parts else None
