"""Vision-language models, tool by tool, on the same tiny random twins; then the vision models'
latency per image. Prints tables; asserts nothing.

The twins are ``tests/frontends/test_hf_vlm.py``'s ``CASES`` (LLaVA with a CLIP tower, LLaVA
with a SigLIP tower and a Qwen2 text model, Gemma 3, PaliGemma, Idefics3, SmolVLM, BLIP-2 with
a Q-Former and OPT: its image's tokens before the prompt) and
``tests/frontends/test_hf_qwen_vl.py``'s (Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE with
DeepStack, Qwen3.5 and Qwen3.5-MoE with their hybrid DeltaNet decoders: fed their image grids
and the decoder its 3-D positions where it declares them, zero recurrent states beside empty
caches), ``test_hf_llava_next.py``'s and ``test_hf_mistral3.py``'s (an image of 20 x 37 and
16 x 24 pixels) and ``test_hf_mllama.py``'s (Llama-3.2-Vision: a tiled tower, gated
cross-attention layers reading the image's keys, its image of 37 x 20 pixels in 2 x 2 tiles;
``benchmarks/vlm_mllama.py``). The ``CASES`` twins, saved by transformers 5.25, are renamed to
the layout the hub's checkpoints have (``hub-4.x``: ``language_model.model.``, ``vision_tower.vision_model.``,
``multi_modal_projector.``; BLIP-2's hub names are transformers 5's). Each tool gets that folder
and is held to transformers on a prompt with one image (Gemma 3 with its ``token_type_ids``, so
one image's tokens see each other): the last position's logits, max relative error, and for
onnxruntime-genai 16 greedy tokens.

- irc: the reference interpreter; ``--target onnx`` and ``onnx-ort`` (vision, embedding and
  decoder models in ONNX Runtime); onnxruntime-genai 0.18 on the ``onnx-ort`` folder where
  genai runs the type (gemma3, mistral3, the Qwen-VLs and Qwen3.5s: the folder has
  ``preprocessor_config.json``; genai has no mllama type);
- mobius-onnx 0.1.0: ``mobius build --config DIR --dtype f32``, its vision_encoder,
  embedding and decoder models run the same way;
- onnxruntime-genai's builder 0.18: ``-p fp32 -e cpu`` (it exports a VLM's text decoder only).

A cell says ``exact`` (<= 1e-4), ``wrong (error)`` or ``refused: <the last line of its error>``.
``--latency [ROWS]``: LLaVA-1.5-7B's vision model (CLIP ViT-L/14-336 to hidden_states[-2], the
class token dropped, the projector: 576 tokens of 4096), Qwen2.5-VL-7B's (a 448 x 448 image:
1,024 patches through 32 layers, windows of 8 x 8 patches, the merger: 256 tokens of 3584) and
Qwen3-VL-8B's (a 448 x 448 image: 784 patches of 16 through 27 layers, the merger and
DeepStack's mergers after layers 8, 16 and 24: 196 tokens of 4 x 4096) per image, median of 5
after a warm-up, 2 threads: irc's ``onnx-ort`` model in ONNX Runtime against PyTorch eager
(transformers' CLIPVisionModel and LlavaMultiModalProjector, Qwen2.5-VL's tower,
Qwen3VLVisionModel), random weights (the time does not depend on them); Llama-3.2-11B-Vision's
(an image of 2 x 2 tiles of 560: 4 x 1,601 tokens through 32 local and 8 global layers, the
projector: 6,404 tokens of 4096; its image KV bytes in the 8 cross layers), median of 3 (a run
takes minutes): ``benchmarks/vlm_mllama.py``.

    python benchmarks/vlm_twins.py [--only NAME,NAME] [--latency [llava-1.5-7b,...,llama-3.2-11b-vision]]
                                   [--no-twins]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from common import ROOT, markdown_table, verdict
from vlm_cells import (builder_cell, empty_states, irc_onnx_cells, irc_vision_ms, last_line, latency_row, median_ms,
                       onnx_files)


def three_models(paths: dict, ids, pixel_values, want, extra: dict = None) -> str:
    """vision -> embedding -> decoder in ONNX Runtime (empty caches): the last logits' verdict
    (``extra``: more vision inputs, fed to a model that declares them: LLaVA-NeXT's
    ``image_rows``, or ``image_sizes``)."""
    import onnxruntime as ort

    from irc.check import relative_error
    sessions = {k: ort.InferenceSession(p, providers=["CPUExecutionProvider"]) for k, p in paths.items()}
    fed = {"pixel_values": pixel_values, **(extra or {})}
    features = sessions["vision"].run(None, {v.name: fed[v.name] for v in sessions["vision"].get_inputs()
                                             if v.name in fed})[0]
    embeds = sessions["embedding"].run(None, {"input_ids": ids, "image_features": features})[0]
    decoder = sessions["decoder"]
    feeds = {"inputs_embeds": embeds, "input_ids": ids, "attention_mask": np.ones_like(ids),
             "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None], **empty_states(decoder)}
    names = {value.name for value in decoder.get_inputs()}
    logits = decoder.run(["logits"], {k: v for k, v in feeds.items() if k in names})[0]
    return verdict(relative_error(logits[:, -1], want[:, -1]))


def irc_cells(folder: str, tmp: str, model, ids, pixel_values, want, tokens) -> list:
    from frontends import load_spec
    from irc.check import relative_error
    from irc.interpreter import run
    from tests.frontends.test_hf_vlm import decoder_feeds

    graph = load_spec(folder)
    features = run(graph.parts["vision"], {"pixel_values": pixel_values})["image_features"]
    cells = [verdict(relative_error(run(graph, decoder_feeds(graph, ids, features))["logits"], want))]
    cells += irc_onnx_cells(folder, tmp, lambda paths: three_models(paths, ids, pixel_values, want))
    return cells + [genai_tokens(os.path.join(tmp, "irc-onnx-ort"), ids, pixel_values, tokens)]


def genai_tokens(out: str, ids, pixel_values, tokens: list, grid=None) -> str:
    """onnxruntime-genai's greedy tokens from irc's onnx-ort folder against ``tokens``, where the
    folder has a genai_config.json."""
    from irc_cli.run_vlm import FolderModel, runner
    from tests.frontends.test_hf_vlm import Clock

    if not os.path.exists(os.path.join(out, "genai_config.json")):
        return "not a genai type"
    model = FolderModel(out)
    got = (runner(model, pixel_values) if grid is None else runner(model, pixel_values, grid))(
        out, ids[0].tolist(), len(tokens), set(), Clock(), engine="genai").tokens
    return "exact" if got == tokens else "wrong (tokens)"


def mobius_cell(folder: str, tmp: str, ids, pixel_values, want, grids=None, extra=None) -> str:
    out, tool = os.path.join(tmp, "mobius"), os.path.join(os.path.dirname(sys.executable), "mobius")
    if not os.path.exists(tool):
        return "not installed (pip install -c constraints.txt '.[bench]')"
    done = subprocess.run([tool, "build", "--config", folder,
                           "--dtype", "f32", out], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return f"refused: {last_line(done.stderr + done.stdout)}"
    if not os.path.isdir(os.path.join(out, "vision_encoder")):  # a text model's package
        return f"text model only ({onnx_files(out)}): no vision or embedding model"
    paths = {k: os.path.join(out, d, "model.onnx") for k, d in (("vision", "vision_encoder"), ("embedding", "embedding"),
                                                                 ("decoder", "decoder"))}
    try:
        return three_models(paths, ids, pixel_values, want, extra) if grids is None else qwen_models(
            paths, ids, pixel_values, grids, want)
    except Exception as err:  # noqa: BLE001 (a model that fails to run is a result here)
        return f"fails to run: {last_line(str(err))}"


def twins_table(only: str) -> None:
    import torch
    import transformers

    from tests.frontends import test_hf_vlm as t

    rows = []
    for name in sorted(t.CASES):
        if only and name not in only.split(","):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            model, saved = t.build(name, Path(tmp) / "saved")
            # BLIP-2's hub names are transformers 5's: no renaming
            folder = saved if name == "blip-2" else t.relaid(saved, Path(tmp) / "hub", "hub-4.x")
            processor = getattr(transformers, {"gemma3": "Gemma3ImageProcessorPil", "blip-2": "BlipImageProcessor"}.get(
                name, "CLIPImageProcessor"))
            size = model.config.vision_config.image_size
            processor(size={"height": size, "width": size}).save_pretrained(folder)  # what genai's config is made from
            ids, pixel_values = t.prompt(model, 1), t.pixels(model, 1)
            want = t.reference(model, ids, pixel_values)[1]
            with torch.no_grad():
                tokens = model.generate(input_ids=torch.from_numpy(ids), pixel_values=t.hf_pixels(model, pixel_values),
                                        attention_mask=torch.ones_like(torch.from_numpy(ids)), max_new_tokens=16,
                                        min_new_tokens=16, do_sample=False, **t.extra(model, ids))
            tokens = tokens[0, ids.shape[1]:].tolist()
            cells = irc_cells(folder, tmp, model, ids, pixel_values, want, tokens)
            rows.append([name, *cells, mobius_cell(folder, tmp, ids, pixel_values, want), builder_cell(folder, tmp)])
            print(f"  {name} done", file=sys.stderr)
    rows += qwen_table(only) + any_size_table(only) + mllama_rows(only)
    print()
    markdown_table(("twin", "irc interpreter", "irc onnx", "irc onnx-ort", "genai 0.18 (irc onnx-ort folder)",
                    "mobius-onnx 0.1.0", "genai builder 0.18"), rows)


def qwen_models(paths: dict, ids, pixel_values, grids, want) -> str:
    """``three_models`` for Qwen-VL: the vision model also takes ``image_grid_thw``, the
    decoder its positions in the rank it declares ([3, B, T]: ``irc.mrope``; [B, T]: plain)."""
    import onnxruntime as ort

    from irc.check import relative_error
    from irc.mrope import mrope_positions
    sessions = {k: ort.InferenceSession(p, providers=["CPUExecutionProvider"]) for k, p in paths.items()}
    vision = sessions["vision"]
    fed = {"pixel_values": pixel_values, "image_grid_thw": grids}
    features = vision.run(None, {v.name: fed[v.name] for v in vision.get_inputs()})[0]
    embeds = sessions["embedding"].run(None, {"input_ids": ids, "image_features": features})[0]
    decoder = sessions["decoder"]
    shapes = {v.name: v.shape for v in decoder.get_inputs()}
    positions = mrope_positions(ids, grids, QWEN_IMAGE, 2)[0]
    feeds = {"inputs_embeds": embeds, "input_ids": ids, "attention_mask": np.ones_like(ids),
             "position_ids": positions if len(shapes.get("position_ids", [])) == 3 else positions[0],
             **empty_states(decoder)}
    logits = decoder.run(["logits"], {k: v for k, v in feeds.items() if k in shapes})[0]
    return verdict(relative_error(logits[:, -1], want[:, -1]))


def qwen_table(only: str) -> list:
    """Rows for Qwen2-VL and Qwen2.5-VL (``tests/frontends/test_hf_qwen_vl.py``'s twins, which
    transformers 5.25 saves in the hub's layout: ``model.layers.``, ``visual.``)."""
    import torch

    from frontends import load_spec
    from irc.check import relative_error
    from irc.interpreter import run
    from tests.frontends import test_hf_qwen_vl as t

    rows = []
    for name in sorted(t.CLASSES):
        if only and name not in only.split(","):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            model, folder = t.build(name, Path(tmp) / "saved")
            ids, pixel_values, grids = t.prompt(1), t.pixels(1), t.GRIDS[:1]
            want = t.reference(model, ids, pixel_values, grids)[1]
            with torch.no_grad():
                tokens = model.generate(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixel_values),
                                        image_grid_thw=torch.from_numpy(grids),
                                        mm_token_type_ids=torch.from_numpy((ids == t.IMAGE) * 1), max_new_tokens=16,
                                        min_new_tokens=16, do_sample=False)[0, ids.shape[1]:].tolist()
            graph = load_spec(folder)
            features = run(graph.parts["vision"], {"pixel_values": pixel_values, "image_grid_thw": grids})
            cells = [verdict(relative_error(run(graph, t.decoder_feeds(graph, ids, features["image_features"],
                                                                        grids))["logits"], want))]
            cells += irc_onnx_cells(folder, tmp, lambda paths: qwen_models(paths, ids, pixel_values, grids, want))
            genai = genai_tokens(os.path.join(tmp, "irc-onnx-ort"), ids, pixel_values, tokens, tuple(grids[0]))
            mobius = mobius_cell(folder, tmp, ids, pixel_values, want, grids)
            rows.append([name, *cells, genai, mobius, builder_cell(folder, tmp)])
            print(f"  {name} done", file=sys.stderr)
    return rows


QWEN_IMAGE = 150  # the twins' image placeholder id


def any_size_table(only: str) -> list:
    """Rows for LLaVA-NeXT and Mistral-3 (``tests/frontends/test_hf_llava_next.py``'s and
    ``test_hf_mistral3.py``'s twins), one image of a size that is neither square nor a tile."""
    from frontends import load_spec
    from irc.check import relative_error
    from irc.interpreter import run
    from tests.frontends import test_hf_llava_next as next_twin
    from tests.frontends import test_hf_mistral3 as mistral
    from tests.frontends.test_hf_vlm import decoder_feeds

    rows = []
    for name, module in (("llava_next", next_twin), ("mistral3", mistral)):
        if only and name not in only.split(","):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            model, folder = module.build(name, Path(tmp) / "saved")
            if name == "mistral3":  # what genai's config is made from
                import transformers
                transformers.PixtralImageProcessorPil(patch_size={"height": 8, "width": 8},
                                                      size={"longest_edge": 24}).save_pretrained(folder)
            if name == "llava_next":
                image_rows, pixel_values, ids, _, want = module.case(model, (20, 37))
                extra = {"image_rows": image_rows, "image_sizes": np.asarray([[20, 37]], np.int64)}
            else:
                pixel_values, ids, _, want = module.case(model, (16, 24))
                extra = {"image_sizes": np.asarray([[16, 24]], np.int64)}
            graph = load_spec(folder)
            features = run(graph.parts["vision"], {k: v for k, v in {"pixel_values": pixel_values, **extra}.items()
                                                   if k in {x.name for x in graph.parts["vision"].inputs}})
            cells = [verdict(relative_error(run(graph, decoder_feeds(graph, ids, features["image_features"]))[
                "logits"], want))]
            cells += irc_onnx_cells(folder, tmp, lambda paths: three_models(paths, ids, pixel_values, want, extra))
            genai = "not a genai type"
            if name == "mistral3" and os.path.exists(os.path.join(tmp, "irc-onnx-ort", "genai_config.json")):
                import torch
                with torch.no_grad():
                    tokens = model.generate(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixel_values),
                                            image_sizes=torch.tensor([[16, 24]]), max_new_tokens=16, min_new_tokens=16,
                                            do_sample=False)[0, ids.shape[1]:].tolist()
                genai = genai_tokens(os.path.join(tmp, "irc-onnx-ort"), ids, pixel_values, tokens, (2, 3))
            rows.append([name, *cells, genai, mobius_cell(folder, tmp, ids, pixel_values, want, extra=extra),
                         builder_cell(folder, tmp)])
            print(f"  {name} done", file=sys.stderr)
    return rows


def latency_table(only: str) -> None:
    """The vision models per image: irc onnx-ort in ONNX Runtime vs PyTorch eager (``only``:
    comma-separated row names, else all)."""
    import torch

    torch.set_num_threads(2)
    rows = [row(name) for name, row in LATENCY.items() if only in ("all", "") or name in only.split(",")]
    print()
    markdown_table(("vision model", "GFLOPs/image", "irc onnx-ort, ORT (ms)", "PyTorch eager (ms)", "irc speed-up"),
                   rows)


def llava_latency(name: str) -> tuple:
    """LLaVA-1.5-7B's vision model (CLIP ViT-L/14-336 to hidden_states[-2], the projector)."""
    import torch
    import transformers

    folder = os.path.join(ROOT, "examples", "hf", "llava-1.5-7b")
    pixels = np.random.default_rng(0).standard_normal((1, 3, 336, 336)).astype(np.float32)
    flops, irc_ms = irc_vision_ms(folder, {"pixel_values": pixels})
    config = transformers.AutoConfig.from_pretrained(folder)
    tower = transformers.CLIPVisionModel(config.vision_config).eval()
    projector = transformers.models.llava.modeling_llava.LlavaMultiModalProjector(config).eval()
    image = torch.from_numpy(pixels)

    def eager():
        with torch.no_grad():
            states = tower(image, output_hidden_states=True).hidden_states[-2][:, 1:]
            return projector(states)
    return latency_row(f"{name} vision model (576 tokens)", flops, irc_ms, median_ms(eager))


def qwen_latency(name: str) -> tuple:
    """Qwen2.5-VL-7B's vision model on a 448 x 448 image (1,024 patches, 256 tokens):
    irc onnx-ort in ONNX Runtime against transformers' tower in PyTorch eager."""
    import torch
    import transformers
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    folder = os.path.join(ROOT, "examples", "hf", "qwen2.5-vl-7b")
    grid = np.array([[1, 32, 32]])
    pixels = np.random.default_rng(0).standard_normal((1024, 3 * 2 * 14 * 14)).astype(np.float32)
    flops, irc_ms = irc_vision_ms(folder, {"pixel_values": pixels, "image_grid_thw": grid})
    config = transformers.AutoConfig.from_pretrained(folder)
    tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(config.vision_config).eval()

    def eager():
        with torch.no_grad():
            return tower(torch.from_numpy(pixels), grid_thw=torch.from_numpy(grid)).pooler_output
    return latency_row(f"{name} vision model (448 x 448: 256 tokens)", flops, irc_ms, median_ms(eager))


QWEN3_VL_8B = {  # Qwen3-VL-8B-Instruct's config.json (text_config: the decoder the tower feeds)
    "vision_config": dict(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, patch_size=16,
                          spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=4096,
                          num_position_embeddings=2304, deepstack_visual_indexes=[8, 16, 24],
                          hidden_act="gelu_pytorch_tanh"),
    "text_config": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=262144,
                        rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                         "mrope_section": [24, 20, 20], "mrope_interleaved": True}),
    "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653, "tie_word_embeddings": False}


def qwen3_latency(name: str) -> tuple:
    """Qwen3-VL-8B's vision model on a 448 x 448 image (784 patches of 16 through 27 layers,
    the merger and DeepStack's three: 196 tokens of 4 x 4096): its config.json written by
    transformers, irc onnx-ort in ONNX Runtime against transformers' Qwen3VLVisionModel."""
    import torch
    import transformers
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    grid = np.array([[1, 28, 28]])
    pixels = np.random.default_rng(0).standard_normal((784, 3 * 2 * 16 * 16)).astype(np.float32)
    config = transformers.Qwen3VLConfig(**QWEN3_VL_8B)
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, name)
        config.save_pretrained(folder)
        flops, irc_ms = irc_vision_ms(folder, {"pixel_values": pixels, "image_grid_thw": grid})
    tower = Qwen3VLVisionModel._from_config(config.vision_config).eval()

    def eager():
        with torch.no_grad():
            out = tower(torch.from_numpy(pixels), grid_thw=torch.from_numpy(grid))
            return out.pooler_output, out.deepstack_features
    return latency_row(f"{name} vision model (448 x 448: 196 tokens, 3 DeepStack levels)", flops, irc_ms,
                       median_ms(eager))


from vlm_mllama import mllama_latency, mllama_rows  # noqa: E402

LATENCY = {"llava-1.5-7b": llava_latency, "qwen2.5-vl-7b": qwen_latency, "qwen3-vl-8b": qwen3_latency,
           "llama-3.2-11b-vision": mllama_latency}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated twin names")
    parser.add_argument("--latency", nargs="?", const="all", default=None, metavar="ROWS",
                        help="also time the vision models per image (all, or comma-separated: "
                             f"{', '.join(LATENCY)})")
    parser.add_argument("--no-twins", action="store_true", help="skip the twins' table")
    args = parser.parse_args()
    if not args.no_twins:
        twins_table(args.only)
    if args.latency is not None:
        latency_table(args.latency)


if __name__ == "__main__":
    main()
