"""LLaVA-NeXT's any-resolution images (``irc_cli.images_anyres``): pixel values and image sizes
equal to transformers 5.25's ``LlavaNextImageProcessorPil`` (exactly) on real photographs
(scikit-image's sample data: RGB, grayscale, RGBA, a JPEG) and odd sizes (strips, tiny images,
the pinpoints' own sizes), with llava-v1.6's config, a small one and the class defaults; the
packed feature rows equal to ``LlavaNextModel.pack_image_features`` and the token count to
``LlavaNextProcessor``'s over many sizes, and through a tiny random model's
``get_image_features``; pinpoints that cannot be tiled are one SpecError naming the key."""
from types import SimpleNamespace

import numpy as np
import pytest

from irc.errors import IRCError, SpecError
from irc_cli import images
from irc_cli.images_anyres import anyres, best_resolution, feature_rows, image_tokens
from tests.image_inputs import odd_image as sized_image, written

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from transformers.image_processing_utils import select_best_resolution  # noqa: E402
from transformers.models.llava_next import modeling_llava_next as hf_model  # noqa: E402
from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil  # noqa: E402
from transformers.models.llava_next.processing_llava_next import LlavaNextProcessor  # noqa: E402

V16_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
CHECKPOINT = {  # llava-hf/llava-v1.6-mistral-7b-hf's preprocessor_config.json
    "aspect_ratio_setting": "anyres", "crop_size": {"height": 336, "width": 336}, "do_center_crop": True,
    "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_grid_pinpoints": V16_PINPOINTS, "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "LlavaNextImageProcessor", "image_std": [0.26862954, 0.26130258, 0.27577711],
    "processor_class": "LlavaNextProcessor", "resample": 3, "rescale_factor": 0.00392156862745098,
    "size": {"shortest_edge": 336}}
SMALL_PINPOINTS = [[16, 32], [32, 16], [32, 32]]
SMALL = {**CHECKPOINT, "crop_size": {"height": 16, "width": 16}, "size": {"shortest_edge": 16},
         "image_grid_pinpoints": SMALL_PINPOINTS}
ODD = {"37x91": (37, 91), "strip 1000x30": (1000, 30), "strip 9x700": (9, 700), "tiny 5x7": (5, 7),
       "one pixel": (1, 1), "672x336": (672, 336), "336x1008": (336, 1008), "672x672": (672, 672),
       "32x16": (32, 16), "16x32": (16, 32), "33x17": (33, 17), "640x480": (640, 480)}


def odd_image(name):
    return sized_image(*ODD[name])



def compare(ours, hf, image, name):
    """Our views against transformers' on one image: equal bit for bit, the same image size."""
    want = hf(image, return_tensors="np")
    got, size = anyres(ours, image)
    assert got.dtype == np.float32 and (1,) + got.shape == want["pixel_values"].shape, name
    assert want["image_sizes"].tolist() == [list(size)] and size == (image.height, image.width), name
    np.testing.assert_array_equal(got, want["pixel_values"][0], err_msg=name)


@pytest.mark.parametrize("config", ["small", "checkpoint"])
def test_views_are_transformers_on_photographs_and_odd_sizes(config, photographs, tmp_path):
    folder = written(tmp_path, SMALL if config == "small" else CHECKPOINT)
    hf = LlavaNextImageProcessorPil.from_pretrained(folder)
    ours = images.Processor.read(folder)
    assert ours.kind == "LlavaNextImageProcessor" and ours.output_size() == (hf.crop_size.height,) * 2
    cases = [(name, Image.open(path)) for name, path in sorted(photographs.items())]
    cases += [(name, odd_image(name)) for name in sorted(ODD)]
    for name, image in cases:
        compare(ours, hf, image, name)


def test_the_class_defaults_are_transformers(tmp_path):
    """A config with only its type (a null key the default): 224 views, the llava-v1.6 pinpoints,
    which irc refuses as 224 tiles (transformers' processor resizes and crops the partial tiles,
    its model fails on them), so those of 224 replace them."""
    folder = written(tmp_path, {"image_processor_type": "LlavaNextImageProcessorPil", "crop_size": None})
    ours, hf = images.Processor.read(folder), LlavaNextImageProcessorPil()
    with pytest.raises(SpecError, match=r"image_grid_pinpoints: \[336, 672\] is not whole 224x224 tiles"):
        anyres(ours, odd_image("640x480"))
    ours.settings["image_grid_pinpoints"] = [[224, 448], [448, 224], [448, 448]]
    hf.image_grid_pinpoints = [[224, 448], [448, 224], [448, 448]]
    for name in ("640x480", "37x91", "strip 1000x30"):
        compare(ours, hf, odd_image(name), name)


def test_a_size_that_is_not_the_tile_is_resized_and_cropped_as_in_transformers(tmp_path):
    """Tiles of crop_size 16 resized to a shortest edge of 20 and cropped back; a height x width
    size is the base view's size."""
    for change in ({"size": {"shortest_edge": 20}}, {"size": {"height": 24, "width": 16}},
                   {"do_center_crop": False, "size": {"shortest_edge": 16}}, {"resample": 2}):
        folder = written(tmp_path / str(len(list(tmp_path.iterdir()))), {**SMALL, **change})
        ours, hf = images.Processor.read(folder), LlavaNextImageProcessorPil.from_pretrained(folder)
        for name in ("640x480", "37x91", "16x32"):
            compare(ours, hf, odd_image(name), f"{change} {name}")


def test_best_resolution_is_transformers():
    rng = np.random.default_rng(0)
    sizes = [(int(h), int(w)) for h, w in rng.integers(1, 2500, (300, 2))] + [(336, 672), (1, 1), (1, 5000)]
    for pinpoints in (V16_PINPOINTS, SMALL_PINPOINTS):
        for height, width in sizes:
            assert best_resolution(height, width, pinpoints) == select_best_resolution((height, width), pinpoints)


def sizes_to_pack():
    rng = np.random.default_rng(1)
    sizes = [(int(h), int(w)) for h, w in rng.integers(1, 1500, (120, 2))]
    sizes += [(int(h), int(w)) for h, w in rng.integers(1, 60, (60, 2))]
    return sizes + [(336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008), (16, 32), (32, 16), (32, 32),
                    (1, 1), (1, 1000), (1000, 1), (480, 640), (512, 512), (400, 600), (7, 5)]


@pytest.mark.parametrize("tile, patch, pinpoints", [(336, 14, V16_PINPOINTS), (16, 4, SMALL_PINPOINTS),
                                                    (32, 4, [[32, 64], [64, 32], [96, 32], [32, 96], [64, 64]])])
def test_feature_rows_are_pack_image_features(tile, patch, pinpoints):
    """Arange-coded features gathered by our rows equal transformers' packed features exactly;
    the count equals LlavaNextProcessor's (num_additional_image_tokens 1, "default")."""
    config = transformers.LlavaNextConfig(
        vision_config={"model_type": "clip_vision_model", "image_size": tile, "patch_size": patch},
        text_config={"model_type": "llama"}, image_grid_pinpoints=pinpoints)
    model = SimpleNamespace(config=config)  # pack_image_features reads only self.config
    processor = LlavaNextProcessor.__new__(LlavaNextProcessor)
    processor.image_processor = SimpleNamespace(image_grid_pinpoints=pinpoints)
    processor.patch_size, processor.num_additional_image_tokens = patch, 1
    processor.vision_feature_select_strategy, processor.image_token = "default", "<image>"
    side, depth = tile // patch, 3
    for height, width in sizes_to_pack():
        views = hf_model.image_size_to_num_patches((height, width), pinpoints, tile)
        features = torch.arange(views * side * side * depth, dtype=torch.float64).reshape(views, side * side, depth)
        newline = -1.0 - torch.arange(depth, dtype=torch.float64)
        packed, lengths = hf_model.LlavaNextModel.pack_image_features(
            model, [features], torch.tensor([[height, width]]), "default", image_newline=newline)
        rows = feature_rows((height, width), pinpoints, tile, side)
        assert rows.dtype == np.int64 and rows.min() >= 0 and rows.max() <= views * side * side
        table = np.concatenate([features.reshape(-1, depth).numpy(), newline[None].numpy()])
        np.testing.assert_array_equal(table[rows], packed[0].numpy(), err_msg=str((height, width)))
        count = len(processor.replace_image_token(
            {"image_sizes": [[height, width]], "pixel_values": [[np.zeros((3, tile, tile))]]}, 0)) // len("<image>")
        assert image_tokens((height, width), pinpoints, tile, side) == len(rows) == lengths.item() == count


def test_a_tiny_model_gets_the_gathered_features(tmp_path):
    """Our views through a tiny random LlavaNextModel's tower and projector, gathered by our rows
    and its image_newline, are its get_image_features output."""
    config = transformers.LlavaNextConfig(
        vision_config={"model_type": "clip_vision_model", "image_size": 16, "patch_size": 4, "hidden_size": 8,
                       "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2},
        text_config={"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64},
        image_grid_pinpoints=SMALL_PINPOINTS, image_token_index=63)
    torch.manual_seed(0)
    model = transformers.LlavaNextModel(config).eval()
    ours = images.Processor.read(written(tmp_path, SMALL))
    for name in ("640x480", "strip 9x700", "37x91", "32x16"):
        pixels, size = anyres(ours, odd_image(name))
        with torch.no_grad():
            want = model.get_image_features(torch.from_numpy(pixels), torch.tensor([size])).pooler_output[0]
            states = model.vision_tower(torch.from_numpy(pixels), output_hidden_states=True).hidden_states[-2]
            feats = model.multi_modal_projector(states[:, 1:]).reshape(-1, 8)
            table = torch.cat([feats, model.image_newline[None]])
        got = table[torch.from_numpy(feature_rows(size, SMALL_PINPOINTS, 16, 4))]
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("pinpoints, message", [
    ([[336, 600]], r"\[336, 600\] is not whole 336x336 tiles"),
    ([], "expected a non-empty list of \\[height, width\\], got \\[\\]"),
    ("anyres", "expected a non-empty list"),
    ([[336]], r"expected \[height, width\] with positive integers, got \[336\]"),
    ([[0, 336]], r"expected \[height, width\] with positive integers, got \[0, 336\]"),
])
def test_pinpoints_that_cannot_be_tiled_are_one_error_naming_file_and_key(pinpoints, message, tmp_path):
    folder = written(tmp_path, {**CHECKPOINT, "image_grid_pinpoints": pinpoints})
    with pytest.raises(SpecError, match="image_grid_pinpoints: " + message) as caught:
        anyres(images.Processor.read(folder), odd_image("37x91"))
    assert caught.value.location == str(tmp_path / images.PREPROCESSOR)
    with pytest.raises(IRCError, match="image_grid_pinpoints: " + message):
        feature_rows((37, 91), pinpoints, 336, 24)
