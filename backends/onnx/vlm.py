"""A VLM as three ONNX models in one folder, onnxruntime-genai's multimodal layout.

- ``vision.onnx``: ``pixel_values`` [B, C, S, S] -> ``image_features`` [B·tokens, d], the
  decoder graph's ``parts["vision"]`` (the projector inside), its weights in
  ``vision.onnx.data`` when they are large;
- ``embedding.onnx``: ``input_ids`` [B, T] + ``image_features`` [I, d] -> ``inputs_embeds``
  [B, T, d]: the token lookup and the placeholder merge (``merge_tokens``), I = 0 on a step
  without an image;
- ``model.onnx``: ``inputs_embeds`` + the decoder's usual inputs (``attention_mask``,
  ``position_ids``, the caches; ``input_ids`` too where something past the merge reads it)
  -> ``logits`` and ``present.*``.

The decoder graph is lowered once and cut at the merge's output
(``backends.onnx.split.submodel``), so the embedding and decoder models share
``model.onnx.data`` (a tied head reads the same table). ``irc_vlm.json`` names the three
files, the image placeholder token, the tokens per image and the image size, and marks the
folder for ``irc run``. Everything is staged and committed together (``irc.output``).

onnxruntime-genai 0.18 runs multimodal folders only for its own model types (gemma3,
mistral3, phi3v, the Qwen-VLs, ...). For those irc compiles (``GENAI_TYPES``: gemma3,
qwen2_5_vl, qwen3_vl, qwen3_5, qwen3_5_moe and mistral3, whose sections ``backends.onnx.genai_qwen`` and
``genai_mistral3`` write) the
folder also gets ``genai_config.json`` with its ``vision`` / ``embedding`` / ``decoder``
sections (the decoder's ``inputs_embeds``, and ``input_ids`` where the decoder reads them:
Gemma 3's image blocks) and ``processor_config.json``, onnxruntime-extensions' steps made
from the checkpoint's ``preprocessor_config.json`` (decode as RGB, resize to the model's image
size with its resample filter, rescale, normalise, channels first; no ``ConvertRGB``, which in
0.18 swaps red and blue). genai's own image
resize is not Pillow's, so its pixels can differ slightly from transformers'; ``irc run``
uses Pillow (``irc_cli.images``). A llava folder has neither (genai refuses the type).
"""
from __future__ import annotations

import json
import os

from irc.errors import BackendError
from irc.graph import Graph
from irc.output import OutputFolder

from backends.onnx.emit import Emitted, _value_info, emit_model
from backends.onnx.genai import CONFIG, genai_config
from backends.onnx.genai_mistral3 import mistral3_genai_sections, mistral3_processor_config
from backends.onnx.genai_qwen import QWEN_TYPES, qwen_genai_sections, qwen_processor_config
from backends.onnx.split import submodel
from irc.ops.vision import CROSS_MASK

VISION = "vision.onnx"
EMBEDDING = "embedding.onnx"
MANIFEST = "irc_vlm.json"
EMBEDS = "inputs_embeds"
PROCESSOR = "processor_config.json"
GENAI_TYPES = {"gemma3": "gemma3", "mistral3": "mistral3", **{kind: kind for kind in QWEN_TYPES},
               "qwen3_vl_moe": "qwen3_vl"}  # irc's model type -> genai's (its pipelines are the decoder's type)
RESAMPLE = {0: "NEAREST", 1: "LANCZOS", 2: "LINEAR", 3: "CUBIC"}  # Pillow's codes -> onnxruntime-extensions'


def _merge(graph: Graph):
    """Where the embedding model ends: the merge of the image features into the embeddings,
    or, in a decoder that reads them by cross-attention (Llama-3.2-Vision), the token lookup."""
    merges = [node for node in graph.nodes if node.op == "merge_tokens"]
    if not merges and any(v.name == CROSS_MASK for v in graph.inputs):
        merges = [node for node in graph.nodes if node.op == "embedding" and node.inputs[0].name == "input_ids"]
    if len(merges) != 1:
        raise BackendError(f"a VLM decoder merges its image features once; graph {graph.name} has {len(merges)} "
                           "merge_tokens nodes")
    return merges[0]


class DecoderCut:
    """``pieces`` for ``emit_model``: the lowered decoder cut at the merge's output into
    ``embedding.onnx`` and ``name``; once called, what genai's config needs of the cut:
    ``in_place`` (every attention is GroupQueryAttention) and the decoder model's inputs."""

    def __init__(self, graph: Graph, name: str):
        self.graph, self.name, self.merge = graph, name, _merge(graph)
        self.in_place, self.decoder_inputs = False, []

    def __call__(self, model, b) -> dict:
        graph, merge = self.graph, self.merge
        self.in_place = sum(n.op_type == "GroupQueryAttention" for n in b.nodes) == sum(
            1 for v in graph.inputs if v.name.startswith("past_key_values.") and v.name.endswith(".key"))
        value = merge.outputs[0]
        uses = [n for n in value.uses if n.op == "cast"]  # a bf16 table's lookup, then float32
        value = uses[0].outputs[0] if merge.op == "embedding" and len(uses) == len(value.uses) == 1 else value
        cut = b.name_for(value)
        info = _value_info(value)
        info.name = cut
        taken = [b.name_for(v) for v in (merge.inputs[1:] if merge.op == "merge_tokens" else merge.inputs[:1])]
        embedding = submodel(model, taken, [cut], doc="embedding", value_info={cut: info})
        rest = [v.name for v in graph.inputs if v.name not in taken]
        decoder = submodel(model, [cut] + rest, [v.name for v in graph.outputs], doc="decoder",
                           value_info={cut: info})
        for part in (embedding, decoder):  # the cut is the decoder's inputs_embeds, whatever the graph named it
            _rename(part.graph, cut, EMBEDS)
        self.decoder_inputs = [v.name for v in decoder.graph.input]
        return {EMBEDDING: embedding, self.name: decoder}


def _rename(graph, old: str, new: str) -> None:
    """Tensor ``old`` of ``graph`` called ``new`` everywhere it is named."""
    if old == new:
        return
    for node in graph.node:
        node.input[:] = [new if n == old else n for n in node.input]
        node.output[:] = [new if n == old else n for n in node.output]
    for value in list(graph.input) + list(graph.output) + list(graph.value_info):
        if value.name == old:
            value.name = new


def vlm_genai_config(graph: Graph, name: str, context: int, pieces: DecoderCut) -> dict:
    """genai_config.json for a VLM folder of a ``GENAI_TYPES`` model type."""
    config = genai_config(graph, name, context, share_buffer=pieces.in_place)
    model = config["model"]
    model["type"] = GENAI_TYPES[graph.meta["model_type"]]
    model["image_token_id"] = graph.meta["image_token_id"]
    inputs = model["decoder"]["inputs"]
    inputs[EMBEDS] = EMBEDS
    if "input_ids" not in pieces.decoder_inputs:
        del inputs["input_ids"]
    levels = graph.meta.get("deepstack", 0)
    if levels:  # Qwen3-VL's DeepStack: image features and inputs_embeds carry (1 + levels)·d columns
        model["decoder"]["hidden_size"] *= 1 + levels
    model["embedding"] = {"filename": EMBEDDING, "inputs": {"input_ids": "input_ids", "image_features": "image_features"},
                          "outputs": {"inputs_embeds": EMBEDS}}
    model["vision"] = {"filename": VISION, "config_filename": PROCESSOR, "inputs": {"pixel_values": "pixel_values"},
                       "outputs": {"image_features": "image_features"}}
    if model["type"] == "mistral3":  # genai lays the [IMG] rows out from the patch and merge sizes
        vision = graph.parts["vision"].meta["vision"]
        model.update(mistral3_genai_sections(vision["patch"], vision["merge"], graph.meta["image_token_id"],
                                             vision_filename=VISION, config_filename=PROCESSOR))
    if model["type"] in QWEN_TYPES:  # the vision section and the token ids genai's 3-D positions read
        vision = graph.parts["vision"].meta["vision"]
        layout = graph.meta["image_prompt"]
        model.update(qwen_genai_sections(vision["merge"], vision["patch"], vision["window_pixels"],
                                         graph.meta["image_token_id"], layout["vision_start"],
                                         vision_filename=VISION, config_filename=PROCESSOR, genai_type=model["type"]))
    return config


def processor_config(preprocessor: str, size: list) -> dict:
    """onnxruntime-extensions' image steps for the checkpoint's ``preprocessor_config.json``."""
    with open(preprocessor, encoding="utf-8") as f:
        settings = json.load(f)
    resample = settings.get("resample", 2)
    if resample not in RESAMPLE:
        raise BackendError(f"resample {resample!r} has no onnxruntime-extensions filter", location=preprocessor,
                           hint=f"filters: {', '.join(f'{k} ({v})' for k, v in RESAMPLE.items())}")

    def step(name: str, kind: str, **attrs) -> dict:
        return {"operation": {"name": name, "type": kind, **({"attrs": attrs} if attrs else {})}}

    # DecodeImage gives RGB already; 0.18's ConvertRGB swaps red and blue (Qwen's Normalize swaps them back)
    steps = [step("decode_image", "DecodeImage", color_space="RGB"),
             step("resize", "Resize", interpolation=RESAMPLE[resample], height=size[0], width=size[1],
                  keep_aspect_ratio=0),
             step("rescale", "Rescale", rescale_factor=float(settings.get("rescale_factor", 1 / 255))),
             step("normalize", "Normalize", mean=list(settings.get("image_mean", [0.5] * 3)),
                  std=list(settings.get("image_std", [0.5] * 3))),
             step("to_channel_first", "Permute3D", dims=[2, 0, 1])]
    return {"processor": {"name": "image_processing", "transforms": steps}}


def manifest(graph: Graph, vision: Graph, name: str, vision_name: str) -> dict:
    meta = vision.meta["vision"]
    return {"model_type": graph.meta.get("model_type"), "vision": vision_name, "embedding": EMBEDDING,
            "decoder": name, "image_token_id": graph.meta["image_token_id"], "image_tokens": meta["tokens"],
            "image_size": meta["image_size"], "channels": meta["channels"], "patch": meta["patch"],
            "image_prompt": graph.meta["image_prompt"], **{k: meta[k] for k in ("merge", "temporal", "tiles") if k in meta}}


def emit_vlm(graph: Graph, path: str, **kwargs) -> tuple[Emitted, Emitted, list]:
    """Write the three models, the manifest and the companions (``kwargs``: ``emit_model``'s,
    ``files`` going with the decoder); returns what each emission wrote and the lines to
    print for the rest (a genai type without its processor settings gets no genai config)."""
    vision = graph.parts["vision"]
    folder, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    if name in (VISION, EMBEDDING):
        raise BackendError(f"the decoder cannot be named {name}: the VLM folder writes that file itself",
                           hint="use -o FOLDER/model.onnx")
    files = kwargs.pop("files", None) or {}
    pieces = DecoderCut(graph, name)
    preprocessor = files.get("preprocessor_config.json")
    genai = graph.meta.get("model_type") in GENAI_TYPES and isinstance(preprocessor, str)
    notes = [] if genai or graph.meta.get("model_type") not in GENAI_TYPES else [
        "genai_config.json not written: no preprocessor_config.json beside the checkpoint to make "
        "processor_config.json from"]
    with OutputFolder(folder, primary=name) as out:
        seen = emit_model(vision, os.path.join(folder, VISION), genai=False, out=out, **kwargs)
        text = emit_model(graph, path, genai=False, out=out, files=files, pieces=pieces, **kwargs)
        body = json.dumps(manifest(graph, vision, name, VISION), indent=2, sort_keys=True) + "\n"
        written = [out.write(MANIFEST, body)]
        if genai:
            config = vlm_genai_config(graph, name, kwargs.get("context", 4096), pieces)
            written.append(out.write(CONFIG, json.dumps(config, indent=4, sort_keys=True) + "\n"))
            meta = vision.meta["vision"]
            genai_type = GENAI_TYPES[graph.meta["model_type"]]
            steps = (qwen_processor_config(preprocessor, genai_type) if genai_type in QWEN_TYPES else
                     mistral3_processor_config(preprocessor, meta["patch"] * meta["merge"])
                     if graph.meta["model_type"] == "mistral3" else processor_config(preprocessor, meta["image_size"]))
            written.append(out.write(PROCESSOR, json.dumps(steps, indent=2) + "\n"))
    return seen, text, [f"wrote {path}" for path in written] + notes
