"""Llama-3.2-Vision (``mllama``: a tiled tower, a Llama decoder with gated cross-attention
layers) against transformers 5.25 on a tiny random twin: MllamaImageProcessor's tiles, ids and
masks from odd-sized photos equal irc's processor; the tower's features and the logits with
one and with two images, on text alone, and on a left-padded batch, through the reference
interpreter; the compiled folder (onnx and onnx-ort) and the interpreter generate
transformers' 16 greedy tokens with its image KV cache, ``irc run --image`` included; bad
settings name the key; the full-size example counts transformers' parameters."""
import json
import os

import numpy as np
import pytest

from frontends import load_spec
from irc.check import relative_error
from irc.interpreter import run
from irc_cli import main
from tests.frontends.test_hf_models import built_once
from tests.frontends.test_hf_vlm import Clock, changed_config, randomized
from tests.image_inputs import odd_image

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
processing = pytest.importorskip("transformers.models.mllama.processing_mllama")

TOLERANCE = 1e-4
IMAGE, TILE, TILES, TILE_TOKENS = 300, 16, 4, 17  # 4 x 4 patches of 4 pixels and the class token
TOWER = dict(hidden_size=32, num_hidden_layers=4, num_global_layers=2, attention_heads=4, intermediate_size=64,
             vision_output_dim=96, image_size=TILE, patch_size=4, max_num_tiles=TILES, intermediate_layers_indices=[1, 3])
TEXT = dict(vocab_size=300, hidden_size=64, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, cross_attention_layers=[1, 3], max_position_embeddings=256, bos_token_id=1,
            eos_token_id=2, pad_token_id=3,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "high_freq_factor": 4.0,
                             "low_freq_factor": 1.0, "original_max_position_embeddings": 64})
SIZES = [(37, 20), (9, 30), (50, 50)]  # width x height: 2 tiles side by side, 1 tile, 2 x 2 tiles


def build(name: str, folder):
    config = transformers.MllamaConfig(vision_config=TOWER, text_config=TEXT, image_token_index=IMAGE)
    model = randomized(transformers.MllamaForConditionalGeneration(config).eval(), 11)  # gates random, not 0
    model.save_pretrained(folder)
    processor().save_pretrained(folder)
    return model, str(folder)


def processor():
    return transformers.MllamaImageProcessorPil(size={"height": TILE, "width": TILE}, max_image_tiles=TILES)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    return built_once(build, tmp_path_factory)


def case(ids: list, sizes: list) -> dict:
    """transformers' inputs for one prompt and its images: the processor's tiles and the
    processor's cross-attention mask [1, T, images, tiles]."""
    inputs = processor()([[odd_image(*size) for size in sizes]], return_tensors="np") if sizes else {}
    spans = processing.get_cross_attention_token_mask(ids, IMAGE)
    tiles = inputs["num_tiles"] if sizes else [[]]
    mask = processing.convert_sparse_cross_attention_mask_to_dense([spans], tiles, TILES, len(ids)) if sizes else None
    return {"input_ids": np.asarray([ids]), **{k: inputs[k] for k in ("pixel_values", "aspect_ratio_ids",
                                                                      "aspect_ratio_mask") if sizes},
            **({"cross_attention_mask": mask} if sizes else {})}


def torch_inputs(inputs: dict) -> dict:
    return {k: torch.from_numpy(np.asarray(v)) for k, v in inputs.items()}


def irc_features(graph, inputs: dict) -> np.ndarray:
    """The vision model's features of a prompt's images, as the decoder takes them [1, I, d]."""
    feeds = {"pixel_values": inputs["pixel_values"][0], "aspect_ratio_ids": inputs["aspect_ratio_ids"][0],
             "aspect_ratio_mask": inputs["aspect_ratio_mask"][0]}
    features = run(graph.parts["vision"], feeds)["image_features"]
    return features.reshape(1, -1, features.shape[-1])


def decoder_feeds(graph, inputs: dict, features) -> dict:
    ids = inputs["input_ids"]
    mask = inputs.get("cross_attention_mask")
    keys = np.zeros((1, ids.shape[1], 0), np.int64) if mask is None else \
        np.repeat(mask.reshape(*ids.shape, -1), TILE_TOKENS, axis=2).astype(np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(ids.shape[1])[None],
             "image_features": features, "cross_attention_mask": keys}
    for value in graph.inputs:
        if value.name.startswith("past_key_values."):
            feeds[value.name] = np.zeros((ids.shape[0], value.shape[1], 0, value.shape[3]), np.float32)
    return feeds


@pytest.mark.parametrize("ids, sizes", [([1, IMAGE, 5, 6, 7], SIZES[:1]),
                                         ([1, IMAGE, 5, 6, IMAGE, 7, 8], SIZES[1:]),
                                         ([IMAGE, IMAGE, 5, 6], SIZES[:2])])
def test_interpreter_matches_transformers(twins, ids, sizes):
    from irc_cli.images import Processor
    from irc_cli.images_mllama import cross_mask, mllama

    model, folder = twins("mllama")
    graph = load_spec(folder)
    inputs = case(ids, sizes)
    ours = [mllama(Processor.read(folder), odd_image(*size), TILE, TILES) for size in sizes]
    assert np.array_equal(np.stack([o[0] for o in ours]), inputs["pixel_values"][0])
    assert [o[1] for o in ours] == inputs["aspect_ratio_ids"][0].tolist()
    assert [o[2] for o in ours] == inputs["aspect_ratio_mask"][0].sum(axis=1).tolist()
    features = irc_features(graph, inputs)
    feeds = decoder_feeds(graph, inputs, features)
    assert np.array_equal(cross_mask(ids, IMAGE, [o[2] for o in ours], TILES, TILE_TOKENS), feeds["cross_attention_mask"])
    with torch.no_grad():
        pixels = torch.from_numpy(inputs["pixel_values"])
        states = model.model.vision_model(pixels, torch.from_numpy(inputs["aspect_ratio_ids"]),
                                          torch.from_numpy(inputs["aspect_ratio_mask"])).last_hidden_state
        want_features = model.model.multi_modal_projector(states).reshape(1, -1, TEXT["hidden_size"]).numpy()
        want = model(**torch_inputs(inputs)).logits.numpy()
    assert relative_error(features, want_features) <= TOLERANCE
    assert relative_error(run(graph, feeds)["logits"], want) <= TOLERANCE


def test_text_alone_skips_the_cross_layers(twins):
    """No image: transformers skips the cross-attention layers; irc's add nothing (no keys)."""
    model, folder = twins("mllama")
    graph = load_spec(folder)
    inputs = case([1, 5, 6, 7, 8], [])
    with torch.no_grad():
        want = model(**torch_inputs(inputs)).logits.numpy()
    features = np.zeros((1, 0, TEXT["hidden_size"]), np.float32)
    assert relative_error(run(graph, decoder_feeds(graph, inputs, features))["logits"], want) <= TOLERANCE


def test_left_padded_batch_matches_transformers(twins):
    """Two prompts of different lengths, one image each, left-padded into one batch."""
    model, folder = twins("mllama")
    graph = load_spec(folder)
    cases = [case([1, IMAGE, 5, 6, 7, 8], SIZES[:1]), case([1, IMAGE, 9], SIZES[2:])]
    width = max(c["input_ids"].shape[1] for c in cases)
    ids = np.full((2, width), TEXT["pad_token_id"], np.int64)
    attention = np.zeros((2, width), np.int64)
    cross = np.zeros((2, width, 1, TILES), np.int64)
    for row, c in enumerate(cases):
        n = c["input_ids"].shape[1]
        ids[row, width - n:], attention[row, width - n:] = c["input_ids"][0], 1
        cross[row, width - n:] = c["cross_attention_mask"][0]
    positions = np.maximum(np.cumsum(attention, axis=1) - 1, 0) * attention
    pixels = np.concatenate([c["pixel_values"] for c in cases])
    ratios = np.concatenate([c["aspect_ratio_ids"] for c in cases])
    used = np.concatenate([c["aspect_ratio_mask"] for c in cases])
    with torch.no_grad():
        want = model(**torch_inputs({"input_ids": ids, "attention_mask": attention, "position_ids": positions,
                                     "pixel_values": pixels, "aspect_ratio_ids": ratios, "aspect_ratio_mask": used,
                                     "cross_attention_mask": cross})).logits.numpy()
    features = run(graph.parts["vision"], {"pixel_values": pixels[:, 0], "aspect_ratio_ids": ratios[:, 0],
                                           "aspect_ratio_mask": used[:, 0]})["image_features"]
    feeds = decoder_feeds(graph, {"input_ids": ids, "cross_attention_mask": cross}, features)
    feeds.update(attention_mask=attention, position_ids=positions)
    got = run(graph, feeds)["logits"]
    for row in range(2):  # the padding rows' logits are not compared
        n = cases[row]["input_ids"].shape[1]
        assert relative_error(got[row, width - n:], want[row, width - n:]) <= TOLERANCE


@pytest.mark.parametrize("target", ["interpreter", "onnx", "onnx-ort"])
def test_generates_transformers_greedy_tokens(twins, tmp_path, target):
    """16 greedy tokens: the image's keys cached in the cross layers at the prompt, later
    steps reading them (and the prompt's last mask row), as transformers' generate does."""
    from irc_cli.run_vlm import FolderModel, SpecModel, pixel_values, runner

    model, folder = twins("mllama")
    image = tmp_path / "photo.png"
    odd_image(*SIZES[0]).save(image)
    ids = [1, IMAGE, 5, 6, 7]
    inputs = case(ids, SIZES[:1])
    with torch.no_grad():
        want = model.generate(**torch_inputs(inputs), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=16, min_new_tokens=16, do_sample=False)[0, len(ids):].tolist()
    if target == "interpreter":
        vlm = SpecModel(load_spec(folder), 0)
    else:
        out = tmp_path / "out"
        assert main(["compile", folder, "--target", target, "-o", str(out / "model.onnx"), "--quiet"]) == 0
        vlm = FolderModel(str(out))
    pixels, grid = pixel_values(vlm, folder, str(image))
    got = runner(vlm, pixels, grid)(folder, ids, 16, set(), Clock(), engine="ort")
    assert got.tokens == want


def test_irc_run_answers_with_an_image_and_without(twins, tmp_path, capsys):
    model, folder = twins("mllama")
    image = tmp_path / "photo.png"
    odd_image(*SIZES[2]).save(image)
    out = tmp_path / "out"
    assert main(["compile", folder, "--target", "onnx", "-o", str(out / "model.onnx"), "--quiet"]) == 0
    assert json.loads((out / "irc_vlm.json").read_text())["tiles"] == TILES
    assert not (out / "genai_config.json").exists()  # onnxruntime-genai 0.18 has no mllama type
    for ids, sizes in (([1, IMAGE, 5, 6], SIZES[2:]), ([1, 5, 6], [])):
        inputs = case(ids, sizes)
        with torch.no_grad():
            want = model.generate(**torch_inputs(inputs), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                  max_new_tokens=6, min_new_tokens=6, do_sample=False)[0, len(ids):].tolist()
        for source in (folder, str(out)):
            assert main(["run", source, *(["--image", str(image)] if sizes else []), "--prompt-ids",
                         ",".join(map(str, ids)), "--max-new-tokens", "6", "--json", "--quiet"]) == 0
            assert json.loads(capsys.readouterr().out)["tokens"] == want, (source, sizes)
    assert main(["run", str(out), "--image", str(image), "--prompt-ids", "1,5,6", "--max-new-tokens", "2"]) == 2
    assert "image placeholder" in capsys.readouterr().err


@pytest.mark.parametrize("change, key", [
    ({"text_config.cross_attention_layers": [1, 9]}, "text_config.cross_attention_layers"),
    ({"vision_config.hidden_act": "relu"}, "vision_config.hidden_act"),
    ({"vision_config.vision_output_dim": 64}, "vision_config.vision_output_dim"),
    ({"vision_config.intermediate_layers_indices": [1, 7]}, "vision_config"),
])
def test_config_mistakes_name_the_key(twins, tmp_path, capsys, change, key):
    _, folder = twins("mllama")
    assert main(["show", changed_config(folder, tmp_path / "bad", change)]) == 2
    err = capsys.readouterr().err
    assert key in err and "Traceback" not in err


def test_show_prices_the_image_in_the_cross_layers_alone(capsys):
    """Llama-3.2-11B-Vision (examples/hf): an image's 4 tiles x 1,601 tokens are cached only in
    the 8 cross-attention layers (8 kv heads x 128 x 2, bf16): 32 KiB a token, 200 MiB an image,
    where prepending them would cost all 40 layers."""
    folder = f"{os.path.dirname(__file__)}/../../examples/hf/llama-3.2-11b-vision"
    assert main(["show", folder, "--json"]) == 0
    costs = json.loads(capsys.readouterr().out)["visual_tokens"]
    assert (costs["bridge"], costs["cross_layers"], costs["image_tokens"]) == ("cross-attention", 8, 6404)
    assert costs["kv_bytes_per_token"] == 8 * 2 * 8 * 128 * 2
    assert costs["image_kv_bytes"] == 6404 * 32768
