"""Mistral-3 (``mistral3``: a Pixtral tower, the patch merger, a Mistral text model) against
transformers 5.25 on a tiny random twin: images of several sizes (whole merged blocks) give
transformers' image features and, laid out as PixtralProcessor lays them ([IMG] rows closed by
[IMG_BREAK], the last by [IMG_END]), its logits, through the reference interpreter and both
ONNX targets; the folder generates transformers' greedy tokens in irc's loop and in
onnxruntime-genai 0.18 (its ``mistral3`` type); ``irc run --image`` resizes as the processor does
and writes the rows; bad settings name the key."""
import json

import numpy as np
import pytest

from frontends import load_spec
from irc_cli import main
from tests.frontends.test_hf_vlm import Clock, decoder_feeds, randomized
from tests.frontends.twin_fixtures import once_fixture
from tests.frontends.vlm_checks import (assert_features_and_logits_match, assert_folder_matches, compile_folder,
                                        folder_model)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4
IMAGE, BREAK, END = 10, 12, 13
TOWER = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, head_dim=8,
             patch_size=4, image_size=64, hidden_act="silu")
TEXT = dict(vocab_size=128, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=12, max_position_embeddings=512, sliding_window=None)
SIZES = [(16, 24), (8, 16), (24, 8)]  # pixels: 2 x 3, 1 x 2 and 3 x 1 merged blocks of 8 (transformers squeezes a 1 x 1 away)


def build(name: str, folder):
    config = transformers.Mistral3Config(vision_config=transformers.PixtralVisionConfig(**TOWER).to_dict(),
                                         text_config=transformers.MistralConfig(**TEXT).to_dict(),
                                         image_token_index=IMAGE, spatial_merge_size=2, tie_word_embeddings=False)
    model = randomized(transformers.Mistral3ForConditionalGeneration(config).eval(), 5)
    model.save_pretrained(folder)
    return model, str(folder)


twins = once_fixture(build, "twins")


def laid_out(rows: int, columns: int) -> list:
    ids = [[IMAGE] * columns + [BREAK] for _ in range(rows)]
    ids[-1][-1] = END
    return [t for row in ids for t in row]


def case(model, size, seed: int = 0):
    pixels = np.random.default_rng(seed).standard_normal((1, 3, *size)).astype(np.float32)
    ids = np.asarray([[1, 5, 9] + laid_out(size[0] // 8, size[1] // 8) + [7, 8]], np.int64)
    with torch.no_grad():
        features = model.model.get_image_features(torch.from_numpy(pixels), torch.tensor([size])).pooler_output
        logits = model(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixels),
                       image_sizes=torch.tensor([size])).logits.numpy()
    return pixels, ids, torch.cat(list(features)).numpy(), logits


@pytest.mark.parametrize("size", SIZES)
def test_interpreter_matches_transformers(twins, size):
    model, folder = twins("mistral3")
    graph = load_spec(folder)
    vision = graph.parts["vision"]
    assert [(v.name, v.shape) for v in vision.inputs] == [("pixel_values", ("B", 3, "8*Y", "8*X"))]
    pixels, ids, want_features, want_logits = case(model, size)
    assert_features_and_logits_match(graph, {"pixel_values": pixels},
                                     lambda features: decoder_feeds(graph, ids, features), want_features, want_logits)


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_onnx_folder_matches_transformers(twins, tmp_path, target):
    model, folder = twins("mistral3")
    vlm, graph = folder_model(folder, tmp_path, target), load_spec(folder)
    for size in SIZES:
        pixels, ids, want_features, want_logits = case(model, size, seed=1)
        assert_folder_matches(vlm, graph, decoder_feeds, ids, vlm.features(pixels), want_features, want_logits, size)


def test_onnx_folder_generates_transformers_tokens(twins, tmp_path):
    from irc_cli.run_vlm import FolderModel, runner

    model, folder = twins("mistral3")
    out = compile_folder(folder, tmp_path / "out", "onnx-ort")
    pixels, ids, _, _ = case(model, SIZES[0])
    with torch.no_grad():
        want = model.generate(input_ids=torch.from_numpy(ids), pixel_values=torch.from_numpy(pixels),
                              image_sizes=torch.tensor([SIZES[0]]), attention_mask=torch.ones_like(torch.from_numpy(ids)),
                              max_new_tokens=16, min_new_tokens=16, do_sample=False)[0, ids.shape[1]:].tolist()
    got = runner(FolderModel(out), pixels, (2, 3))(out, ids[0].tolist(), 16, set(), Clock(), engine="ort")
    assert got.tokens == want


def test_irc_run_resizes_and_lays_the_rows_out(twins, tmp_path, capsys):
    from PIL import Image

    model, folder = twins("mistral3")
    processor = transformers.PixtralImageProcessorPil(patch_size={"height": 8, "width": 8}, size={"longest_edge": 24})
    processor.save_pretrained(folder)
    image = tmp_path / "photo.png"
    Image.fromarray((np.random.default_rng(3).random((20, 37, 3)) * 255).astype(np.uint8)).save(image)
    processed = processor(Image.open(image), return_tensors="pt")
    height, width = (int(v) for v in processed["image_sizes"][0])
    ids = np.asarray([[1, 7] + laid_out(height // 8, width // 8) + [9]], np.int64)
    with torch.no_grad():
        want = model.generate(input_ids=torch.from_numpy(ids), pixel_values=processed["pixel_values"],
                              image_sizes=processed["image_sizes"], max_new_tokens=6, min_new_tokens=6,
                              do_sample=False)[0, ids.shape[1]:].tolist()
    out = tmp_path / "out"
    assert main(["compile", folder, "--target", "onnx", "-o", str(out / "model.onnx"), "--quiet"]) == 0
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == "mistral3"
    engines = {(folder, "auto"): "reference interpreter", (str(out), "ort"): "onnxruntime (vision, embedding, decoder)",
               (str(out), "genai"): "onnxruntime-genai"}
    for (source, engine), name in engines.items():
        if engine == "genai":
            pytest.importorskip("onnxruntime_genai")
        assert main(["run", source, "--image", str(image), "--prompt-ids", f"1,7,{IMAGE},9", "--engine", engine,
                     "--max-new-tokens", "6", "--json", "--quiet"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["prompt_tokens"] == ids[0].tolist() and report["engine"] == name
        assert report["tokens"] == want, source


@pytest.mark.parametrize("change, key", [
    ({"vision_config": {"hidden_act": "relu"}}, "vision_config.hidden_act"),
    ({"vision_feature_layer": [-1, -2]}, "vision_feature_layer"),
    ({"vision_feature_layer": 7}, "vision_feature_layer"),
    ({"projector_hidden_act": "silu"}, "projector_hidden_act"),
])
def test_config_mistakes_name_the_key(twins, tmp_path, capsys, change, key):
    _, folder = twins("mistral3")
    config = json.loads(open(f"{folder}/config.json").read())
    for name, value in change.items():
        config[name] = {**config[name], **value} if isinstance(value, dict) else value
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    assert main(["show", str(tmp_path)]) == 2
    assert key in capsys.readouterr().err
