"""Llama-3.2-Vision (``mllama``) rows of ``benchmarks/vlm_twins.py``: its twin and its vision
model's latency. Imported by vlm_twins.py (``--only mllama``, ``--latency llama-3.2-11b-vision``).

- The twin is ``tests/frontends/test_hf_mllama.py``'s (a tiled tower of 16-px tiles, up to 4,
  a Llama decoder with gated cross-attention layers), saved by transformers 5.25 in its own
  names (irc reads those and the hub's 4.x names alike). One image of 37 x 20 pixels (2 x 2 tiles)
  behind the prompt's ``<|image|>``, the processor's cross-attention mask; each tool is held to
  transformers' last-position logits. irc's ONNX folders run vision -> embedding -> decoder in
  ONNX Runtime, the decoder taking ``image_features`` and ``cross_attention_mask`` (the image's
  keys widened to its tiles' tokens) beside empty caches (self-attention [1, kv, 0, D], the
  cross layers' image caches [1, kv, 0, D]). onnxruntime-genai 0.18 has no mllama type, so no
  genai cell. mobius-onnx and the builder are run as on the other twins.
- The latency row: Llama-3.2-11B-Vision's vision model (``examples/hf/llama-3.2-11b-vision``:
  560-px tiles of 14-px patches, 32 local and 8 global layers of width 1280, the outputs of
  layers 3, 7, 15, 23 and 30 kept, the projector to 4096; 895M parameters) on an image cut into
  2 x 2 tiles (all 4 used: 4 x 1,601 tokens, padded to 4 x 1,608 inside), random weights:
  irc ``onnx-ort`` in ONNX Runtime against transformers' MllamaVisionModel and the projector
  (an ``nn.Linear``) in PyTorch eager, 2 threads, after a warm-up, median of ``ROUNDS`` (3, not
  5: a run takes minutes on 2 cores). The row also names the image's KV cache bytes in the
  decoder's 8 cross-attention layers (``irc.analysis.visual_token_costs``, the checkpoint's bf16).
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from common import verdict
from vlm_cells import builder_cell, empty_states, irc_onnx_cells, irc_vision_ms, last_line, latency_row, median_ms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUNDS = 3  # the latency row's median (a run takes minutes)
IDS = [1, 300, 5, 6, 7]  # <|image|> (the twin's IMAGE) and text after it


def mllama_rows(only: str) -> list:
    """The twin's row: name, irc interpreter, onnx, onnx-ort, genai, mobius-onnx, builder."""
    if only and "mllama" not in only.split(","):
        return []
    import torch

    from frontends import load_spec
    from irc.check import relative_error
    from irc.interpreter import run
    from tests.frontends import test_hf_mllama as t
    with tempfile.TemporaryDirectory() as tmp:
        model, folder = t.build("mllama", Path(tmp) / "saved")
        inputs = t.case(IDS, t.SIZES[:1])
        with torch.no_grad():
            want = model(**t.torch_inputs(inputs)).logits.numpy()[:, -1]
        graph = load_spec(folder)
        feeds = t.decoder_feeds(graph, inputs, t.irc_features(graph, inputs))
        cells = [verdict(relative_error(run(graph, feeds)["logits"][:, -1], want))]
        check = lambda paths: three_models(paths, inputs, feeds["cross_attention_mask"], want)  # noqa: E731
        cells += irc_onnx_cells(folder, tmp, check)
        genai = os.path.exists(os.path.join(tmp, "irc-onnx-ort", "genai_config.json"))
        cells.append("genai_config.json written" if genai else "genai has no mllama type")
        row = ["mllama", *cells, mobius_cell(folder, tmp, check), builder_cell(folder, tmp)]
        print("  mllama done", file=sys.stderr)
    return [row]


def three_models(paths: dict, inputs: dict, keys, want) -> str:
    """vision -> embedding -> decoder in ONNX Runtime (empty caches, the image's keys read by
    cross-attention): the last logits' verdict."""
    import onnxruntime as ort

    from irc.check import relative_error
    sessions = {k: ort.InferenceSession(p, providers=["CPUExecutionProvider"]) for k, p in paths.items()}
    fed = {k: inputs[k][0] for k in ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask")}  # N = the images
    features = sessions["vision"].run(None, {v.name: fed[v.name] for v in sessions["vision"].get_inputs()})[0]
    ids = inputs["input_ids"]
    embeds = sessions["embedding"].run(None, {"input_ids": ids})[0]
    decoder = sessions["decoder"]
    feeds = {"inputs_embeds": embeds, "input_ids": ids, "attention_mask": np.ones_like(ids),
             "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None],
             "image_features": features.reshape(1, -1, features.shape[-1]), "cross_attention_mask": keys,
             **empty_states(decoder)}
    names = {value.name for value in decoder.get_inputs()}
    logits = decoder.run(["logits"], {k: v for k, v in feeds.items() if k in names})[0]
    return verdict(relative_error(logits[:, -1], want))


def mobius_cell(folder: str, tmp: str, check) -> str:
    """``mobius build --config DIR --dtype f32``: refused (its last error line), or its
    vision_encoder, embedding and decoder models run as irc's are (``check``), or what it wrote."""
    out, tool = os.path.join(tmp, "mobius"), os.path.join(os.path.dirname(sys.executable), "mobius")
    if not os.path.exists(tool):
        return "not installed (pip install -c constraints.txt '.[bench]')"
    done = subprocess.run([tool, "build", "--config", folder, "--dtype", "f32", out], capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        return f"refused: {last_line(done.stderr + done.stdout)}"
    wrote = ", ".join(sorted(os.path.relpath(p, out) for p in glob.glob(os.path.join(out, "**", "*.onnx"),
                                                                       recursive=True)))
    paths = {k: os.path.join(out, d, "model.onnx")
             for k, d in (("vision", "vision_encoder"), ("embedding", "embedding"), ("decoder", "decoder"))}
    if not all(os.path.exists(p) for p in paths.values()):
        return f"wrote {wrote or 'no ONNX model'}: no vision_encoder, embedding and decoder"
    try:
        return check(paths)
    except Exception as err:  # noqa: BLE001 (a model that fails to run is a result here)
        return f"wrote {wrote}; fails to run: {last_line(str(err))}"


def mllama_latency(name: str) -> tuple:
    """Llama-3.2-11B-Vision's vision model on an image of 2 x 2 tiles: irc onnx-ort in ONNX
    Runtime against transformers' MllamaVisionModel and projector in PyTorch eager."""
    import torch
    import transformers
    from transformers.models.mllama.modeling_mllama import MllamaVisionModel

    from frontends import load_spec
    from irc.analysis import analyze, visual_token_costs
    from irc.text import format_bytes
    from irc_cli.images_mllama import arrangements
    folder = os.path.join(ROOT, "examples", "hf", "llama-3.2-11b-vision")
    config = transformers.AutoConfig.from_pretrained(folder)
    vision, tiles, size = config.vision_config, config.vision_config.max_num_tiles, config.vision_config.image_size
    pixels = np.random.default_rng(0).standard_normal((1, tiles, 3, size, size)).astype(np.float32)
    ratio = np.asarray([arrangements(tiles).index((2, 2)) + 1], np.int64)  # 2 x 2 tiles: all 4 used
    used = np.ones((1, tiles), np.int64)
    graph = load_spec(folder)
    seen = analyze(graph.parts["vision"])["vision"]
    costs = visual_token_costs(seen, graph, tokens=seen["tokens"])
    flops, irc_ms = irc_vision_ms(folder, {"pixel_values": pixels, "aspect_ratio_ids": ratio,
                                           "aspect_ratio_mask": used}, ROUNDS)
    print(f"  {name}: irc onnx-ort {irc_ms:,.0f} ms", file=sys.stderr)
    tower = MllamaVisionModel._from_config(vision, dtype=torch.float32).eval()
    projector = torch.nn.Linear(vision.vision_output_dim, config.text_config.hidden_size).eval()
    image, ratios, mask = (torch.from_numpy(x[:, None]) for x in (pixels, ratio, used))  # one image per prompt

    def eager():
        with torch.no_grad():
            return projector(tower(image, ratios, mask).last_hidden_state).reshape(-1, projector.out_features)
    label = (f"{name} vision model (2 x 2 tiles of {size}: {seen['tokens']:,} tokens of "
             f"{config.text_config.hidden_size}; image KV {format_bytes(costs['image_kv_bytes'])} in "
             f"{costs['cross_layers']} cross layers; median of {ROUNDS})")
    return latency_row(label, flops, irc_ms, median_ms(eager, ROUNDS))
