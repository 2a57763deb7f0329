"""LLaVA-NeXT (``llava_next``: any-resolution tiling) against transformers 5.25 on a tiny random
twin: the vision model takes the base view and the tiles (``pixel_values`` [N, C, S, S]) and the
rows they pack into (``image_rows``: the base view's tokens, then the tiles' grid unpadded to the
image's aspect with ``image_newline`` after each row, ``packed_features``), giving transformers'
``get_image_features`` and, merged into the prompt, its logits, for images of several shapes,
through the reference interpreter and both ONNX targets; ``irc run --image`` splits an image as
LlavaNextImageProcessor does and lays the prompt out to the packed row count; bad pinpoints name
the key."""
import json

import numpy as np
import pytest

from frontends import load_spec
from irc.errors import SpecError
from irc_cli import main
from tests.frontends.test_hf_vlm import decoder_feeds, randomized
from tests.frontends.twin_fixtures import once_fixture
from tests.frontends.vlm_checks import assert_features_and_logits_match, assert_folder_matches, folder_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4
IMAGE = 100
TOWER = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, image_size=16,
             patch_size=4)
TEXT = dict(vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512)
PINPOINTS = [[16, 32], [32, 16], [32, 32]]
SIZES = [(20, 37), (40, 12), (16, 16), (33, 30)]  # images (height, width): wide, tall, one tile, near square


def build(name: str, folder):
    config = transformers.LlavaNextConfig(vision_config=transformers.CLIPVisionConfig(**TOWER).to_dict(),
                                          text_config=transformers.LlamaConfig(**TEXT).to_dict(),
                                          image_token_index=IMAGE, image_grid_pinpoints=PINPOINTS)
    model = randomized(transformers.LlavaNextForConditionalGeneration(config).eval(), 3)
    model.save_pretrained(folder)
    return model, str(folder)


twins = once_fixture(build, "twins")


def packed_rows(model, size) -> np.ndarray:
    """transformers' pack_image_features on row-numbered features: which rows it keeps, in order
    (the newline numbered after the last tile's)."""
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    tiles = image_size_to_num_patches(size, PINPOINTS, TOWER["image_size"])
    side = TOWER["image_size"] // TOWER["patch_size"]
    code = torch.arange(tiles * side * side, dtype=torch.float32)[:, None].repeat(1, 48).view(tiles, side * side, 48)
    packed, _ = model.model.pack_image_features([code], torch.tensor([size]), "default",
                                                image_newline=torch.full((48,), float(tiles * side * side)))
    return packed[0][:, 0].long().numpy(), tiles


def case(model, size, seed: int = 0):
    rows, tiles = packed_rows(model, size)
    pixels = np.random.default_rng(seed).standard_normal((tiles, 3, 16, 16)).astype(np.float32)
    ids = np.asarray([[1, 5, 9] + [IMAGE] * len(rows) + [7, 8, 11]], np.int64)
    with torch.no_grad():
        features = model.model.get_image_features(torch.from_numpy(pixels)[None], torch.tensor([size])).pooler_output
        logits = model(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixels)[None],
                       image_sizes=torch.tensor([size])).logits.numpy()
    return rows, pixels, ids, torch.cat(list(features)).numpy(), logits


@pytest.mark.parametrize("size", SIZES)
def test_interpreter_matches_transformers(twins, size):
    model, folder = twins("llava_next")
    graph = load_spec(folder)
    vision = graph.parts["vision"]
    assert [(v.name, v.shape) for v in vision.inputs] == [("pixel_values", ("B", 3, 16, 16)), ("image_rows", ("I",))]
    rows, pixels, ids, want_features, want_logits = case(model, size)
    assert_features_and_logits_match(graph, {"pixel_values": pixels, "image_rows": rows},
                                     lambda features: decoder_feeds(graph, ids, features), want_features, want_logits)


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_onnx_folder_matches_transformers(twins, tmp_path, target):
    model, folder = twins("llava_next")
    vlm, graph = folder_model(folder, tmp_path, target), load_spec(folder)
    for size in SIZES:
        rows, pixels, ids, want_features, want_logits = case(model, size, seed=1)
        assert_folder_matches(vlm, graph, decoder_feeds, ids, vlm.features(pixels, rows), want_features, want_logits,
                              size)


def test_irc_run_splits_an_image_as_the_processor_does(twins, tmp_path, capsys):
    """``irc run --image``: the processor's tiles and rows (``irc_cli.images_anyres``), <image>
    widened to the packed row count, transformers' greedy tokens."""
    from PIL import Image

    model, folder = twins("llava_next")
    processor = transformers.LlavaNextImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16},
                                                         image_grid_pinpoints=PINPOINTS)
    processor.save_pretrained(folder)
    image = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(3).random((20, 37, 3)) * 255).astype(np.uint8)).save(image)
    processed = processor(Image.open(image), return_tensors="pt")
    rows, _ = packed_rows(model, (20, 37))
    ids = np.asarray([[1, 7] + [IMAGE] * len(rows) + [9]], np.int64)
    with torch.no_grad():
        want = model.generate(input_ids=torch.from_numpy(ids), pixel_values=processed["pixel_values"],
                              image_sizes=processed["image_sizes"], max_new_tokens=6, min_new_tokens=6,
                              do_sample=False)[0, ids.shape[1]:].tolist()
    out = tmp_path / "out"
    assert main(["compile", folder, "--target", "onnx", "-o", str(out / "model.onnx"), "--quiet"]) == 0
    for source in (folder, str(out)):
        assert main(["run", source, "--image", str(image), "--prompt-ids", f"1,7,{IMAGE},9", "--max-new-tokens", "6",
                     "--json", "--quiet"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["prompt_tokens"] == ids[0].tolist()
        assert report["tokens"] == want, source


@pytest.mark.parametrize("pinpoints", [[[16, 20]], [], "16x32"])
def test_bad_pinpoints_name_the_key(twins, tmp_path, pinpoints):
    _, folder = twins("llava_next")
    config = json.loads(open(f"{folder}/config.json").read())
    config["image_grid_pinpoints"] = pinpoints
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    with pytest.raises(SpecError, match="image_grid_pinpoints"):
        load_spec(str(tmp_path))


def test_a_processor_whose_pinpoints_contradict_the_model_is_refused(twins, tmp_path, capsys):
    import os

    from PIL import Image

    _, folder = twins("llava_next")
    odd = tmp_path / "odd"
    odd.mkdir()
    for name in ("config.json", "model.safetensors"):
        (odd / name).symlink_to(os.path.join(folder, name))
    transformers.LlavaNextImageProcessorPil(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16},
                                            image_grid_pinpoints=[[16, 32], [32, 16]]).save_pretrained(odd)
    image = tmp_path / "photo.png"
    Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(image)
    assert main(["run", str(odd), "--image", str(image), "--prompt-ids", f"1,{IMAGE}"]) == 2
    err = capsys.readouterr().err
    assert "preprocessor_config.json" in err and "image_grid_pinpoints" in err and "contradicts" in err
