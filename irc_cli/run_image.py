"""``irc run MODEL --image FILE``: an image encoder's embeddings of one image.

    irc run out/clip --image photo.jpg --json          # a folder irc compile wrote (ONNX Runtime)
    irc run models/clip-vit-large-patch14-336 --image photo.jpg   # a Hugging Face folder (interpreter)

The image goes through the folder's ``preprocessor_config.json`` (``irc_cli.images``: Pillow,
as transformers' PIL processors; a model that takes ``spatial_shapes``, SigLIP 2's NaFlex tower,
takes its processor's rows of patches, ``irc_cli.images_siglip2``), then the model:
``pooler_output`` (the image's embedding) and ``last_hidden_state`` (one vector per token), and
a CLIP checkpoint's ``image_embeds``.
``--json`` prints one object with ``pooler_output`` (and ``image_embeds``) as numbers and each
output's shape; otherwise a short summary. Text and image together go to a VLM
(``irc_cli.run_vlm``); a text-only decoder given ``--image`` is refused.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from irc.errors import IRCError
from irc_cli import engines, run_dual, weights
from irc_cli.image_file import read_image
from irc_cli.images import NAFLEX, Processor

PIXELS = "pixel_values"
NAFLEX_SHAPES = "spatial_shapes"  # the input that marks SigLIP 2's NaFlex tower (frontends.dsl_naflex)


def _compiled(folder: str):
    """(run(feeds) -> outputs, its inputs' shapes by name, engine) of a compiled folder's model."""
    from backends.onnx.runtime import ort_session

    session = ort_session(engines.model_path(folder), threads=None)
    inputs = {value.name: value.shape for value in session.get_inputs()}
    if PIXELS not in inputs:
        raise IRCError(f"the model takes no {PIXELS} (its inputs: {', '.join(inputs)}): it is not an image encoder",
                       location=folder, hint="--image goes with an image encoder's folder")
    names = [o.name for o in session.get_outputs()]

    def run(feeds):
        return dict(zip(names, session.run(None, {name: value.astype(engines.input_type(session, name))
                                                  for name, value in feeds.items()})))
    return run, inputs, "onnxruntime"


def _spec(args):
    """(run(feeds) -> outputs, its inputs' shapes by name, engine, graph) of a spec in the
    interpreter."""
    from irc.interpreter import Interpreter
    from irc_cli.pipeline import apply_passes
    from irc_cli.spec import load

    weights.check(args.weights, weights.CHOICES[:1])
    graph = load(args.spec)
    if "vision" not in graph.meta:
        raise IRCError("--image goes with an image encoder; this model reads text only", location=args.spec,
                       hint="a vision-language model (llava, gemma3) takes --image with --prompt")
    weights.require(args.spec, graph, args.weights)
    apply_passes(graph, args)
    interpreter = Interpreter(graph, args.seed)
    return interpreter.run, {value.name: list(value.shape) for value in graph.inputs}, "interpreter", graph


def image_feeds(processor: Processor, image, inputs: dict) -> tuple[dict, str]:
    """(the model's feeds for one image, what went in: "HxW image" or "image of h x w
    patches"), the processor checked against the model's ``inputs`` (shapes by name)."""
    if NAFLEX_SHAPES not in inputs:
        processor.check_model(*inputs[PIXELS][2:])
        pixels = processor(image)[None]
        return {PIXELS: pixels}, f"{pixels.shape[2]}x{pixels.shape[3]} image"
    from irc_cli.images_siglip2 import naflex

    if processor.kind not in NAFLEX:
        raise processor._error("image_processor_type", f"{processor.kind} gives whole images, but the model takes "
                                                       "SigLIP 2's rows of patches (pixel_attention_mask, "
                                                       "spatial_shapes)", hint="use the checkpoint's "
                                                                               "Siglip2ImageProcessor settings")
    feeds = naflex(processor, image)
    width = inputs[PIXELS][-1]
    if feeds[PIXELS].shape[-1] != width:
        raise processor._error("patch_size", f"{processor.settings['patch_size']} gives patches of "
                                             f"{feeds[PIXELS].shape[-1]} values, but the model takes {width}")
    feeds["pixel_attention_mask"] = feeds["pixel_attention_mask"].astype(np.int64)
    rows, columns = feeds[NAFLEX_SHAPES][0].tolist()
    return feeds, f"image of {rows}x{columns} patches"


def run_image(args) -> int:
    for option, used in (("--prompt", args.prompt is not None), ("--prompt-ids", args.prompt_ids is not None),
                         ("--chat", args.chat), ("--logits", args.logits)):
        if used:
            raise IRCError(f"{option} does not go with --image: an image encoder reads no text",
                           hint="a vision-language model (llava, gemma3) takes --image with --prompt")
    compiled = engines.compiled_folder(args.spec)
    if compiled:
        folder = compiled[0]
        run, inputs, engine = _compiled(folder)
        source = folder
    else:
        folder = args.spec if os.path.isdir(args.spec) else os.path.dirname(os.path.abspath(args.spec))
        run, inputs, engine, source = _spec(args)
    feeds, shown = image_feeds(Processor.read(folder), read_image(args.image), inputs)
    start = time.perf_counter()
    outputs = run(feeds)
    pooled = outputs.get("pooler_output")
    scored = {} if not args.text else run_dual.zero_shot(source, folder, args.text,
                                                         outputs.get("image_embeds", pooled))
    seconds = time.perf_counter() - start
    if args.json:
        report = {"image": args.image, "engine": engine, "seconds": round(seconds, 4),
                  "shapes": {name: list(np.shape(value)) for name, value in outputs.items()},
                  "pooler_output": None if pooled is None else [float(x) for x in pooled[0]], **scored}
        if "image_embeds" in outputs:  # a dual encoder's projected embedding (CLIP)
            report["image_embeds"] = [float(x) for x in outputs["image_embeds"][0]]
        print(json.dumps(report))
    elif scored:
        for text, score in sorted(zip(scored["texts"], scored["scores"]), key=lambda pair: -pair[1]):
            print(f"{score:.4f}  {text}")
    else:
        for name, value in outputs.items():
            print(f"{name}: {' x '.join(str(d) for d in np.shape(value))}")
        if pooled is not None:
            head = ", ".join(f"{x:.4f}" for x in pooled[0][:4])
            print(f"pooler_output[0]: |x| = {float(np.linalg.norm(pooled[0])):.4f}, first values {head}, ...")
    if not args.quiet:
        print(f"irc run: one {shown} in {seconds * 1000:.0f} ms with {engine}", file=sys.stderr)
    return 0
