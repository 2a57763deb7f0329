"""Qwen2-VL's image processor (``irc_cli.images_qwen``): pixel values and grids equal to
transformers 5.25's ``Qwen2VLImageProcessorPil`` (exactly) on real photographs (scikit-image's
sample data: RGB, grayscale, RGBA, a JPEG) and on odd sizes (a thin strip, an image under the
min pixels, one over the max), with a small config and with the checkpoint's; its
``smart_resize`` equal to transformers' over many sizes; a config that contradicts itself is
one SpecError naming the file and key."""

import numpy as np
import pytest

from irc.errors import IRCError, SpecError
from irc_cli import images
from irc_cli.images_qwen import image_tokens, patches, smart_resize
from tests.image_inputs import odd_image as sized_image, written

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as hf_qwen  # noqa: E402

SMALL = {"size": {"shortest_edge": 28 * 28 * 4, "longest_edge": 28 * 28 * 48}}  # 4 to 48 merge windows
CHECKPOINT = {  # Qwen2.5-VL-7B-Instruct's preprocessor_config.json
    "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor"}
ODD = {"37x91": (37, 91), "strip 1000x30": (1000, 30), "under min 5x7": (5, 7), "over max 640x480": (640, 480),
       "square 56x56": (56, 56)}


def odd_image(name):
    return sized_image(*ODD[name])



def compare(ours, hf, image, name):
    """Our patches against transformers' on one image: equal bit for bit; the max difference."""
    want = hf(image, return_tensors="np")
    got, grid = patches(ours, image)
    assert got.dtype == np.float32 and got.shape == want["pixel_values"].shape, name
    assert want["image_grid_thw"].dtype == np.int64 and want["image_grid_thw"].tolist() == [list(grid)], name
    np.testing.assert_array_equal(got, want["pixel_values"], err_msg=name)
    merge = ours.settings["merge_size"]
    assert image_tokens(grid, merge) * merge * merge == got.shape[0], name
    return float(np.abs(got - want["pixel_values"]).max())


@pytest.mark.parametrize("config", ["small", "defaults", "checkpoint"])
def test_patches_are_transformers_on_photographs_and_odd_sizes(config, photographs, tmp_path):
    if config == "checkpoint":
        folder = written(tmp_path, CHECKPOINT)
        hf = hf_qwen.Qwen2VLImageProcessorPil.from_pretrained(folder)
    else:
        hf = hf_qwen.Qwen2VLImageProcessorPil(**(SMALL if config == "small" else {}))
        hf.save_pretrained(tmp_path)
        folder = str(tmp_path)
    ours = images.Processor.read(folder)
    assert ours.kind == "Qwen2VLImageProcessor"
    cases = [(name, Image.open(path)) for name, path in sorted(photographs.items())
             if config == "small" or name in ("astronaut.png", "coffee.png", "logo.png")]
    cases += [(name, odd_image(name)) for name in sorted(ODD)]
    worst = max(compare(ours, hf, image, name) for name, image in cases)
    assert worst == 0.0


def test_the_merge_window_order():
    """Patch k of the output is the p x p square at window (k // 4 // (gw/2), k // 4 % (gw/2)),
    offset (k % 4 // 2, k % 2) in it; its T copies side by side after each channel."""
    ours = images.Processor("<test>", {**images.DEFAULTS["Qwen2VLImageProcessor"], "do_resize": False,
                                       "do_rescale": False, "do_normalize": False, "patch_size": 2,
                                       "temporal_patch_size": 3}, "Qwen2VLImageProcessor")
    data = np.arange(8 * 12 * 3, dtype=np.uint8).reshape(8, 12, 3)
    got, grid = patches(ours, Image.fromarray(data, "RGB"))
    assert grid == (1, 4, 6) and got.shape == (24, 3 * 3 * 2 * 2) and image_tokens(grid, 2) == 6
    chw = data.transpose(2, 0, 1).astype(np.float32)
    for k in range(24):
        window, inner = divmod(k, 4)
        row = (window // 3) * 2 + inner // 2
        column = (window % 3) * 2 + inner % 2
        square = chw[:, 2 * row:2 * row + 2, 2 * column:2 * column + 2]
        np.testing.assert_array_equal(got[k].reshape(3, 3, 2, 2), np.stack([square] * 3, axis=1))


def test_smart_resize_is_transformers():
    rng = np.random.default_rng(0)
    sizes = [(int(h), int(w)) for h, w in rng.integers(1, 3000, (400, 2))] + [(14, 14), (42, 70), (2800, 14)]
    for low, high in ((3136, 12845056), (3136, 1003520), (28 * 28 * 4, 28 * 28 * 48), (100, 100)):
        for factor in (28, 32):
            for height, width in sizes:
                if max(height, width) / min(height, width) > 200:
                    continue
                assert smart_resize(height, width, factor, low, high) == hf_qwen.smart_resize(
                    height, width, factor, low, high), (height, width, factor, low, high)


def test_an_aspect_ratio_over_200_is_refused_as_by_transformers(tmp_path):
    hf = hf_qwen.Qwen2VLImageProcessorPil(**SMALL)
    hf.save_pretrained(tmp_path)
    ours = images.Processor.read(str(tmp_path))
    image = Image.new("RGB", (402, 2))
    with pytest.raises(ValueError, match="aspect ratio"):
        hf(image)
    with pytest.raises(IRCError, match="402x2 image: its aspect ratio 201.0 is over 200"):
        patches(ours, image)


def test_without_resize_the_image_must_be_whole_windows(tmp_path):
    folder = written(tmp_path, {**CHECKPOINT, "do_resize": False})
    ours, hf = images.Processor.read(folder), hf_qwen.Qwen2VLImageProcessorPil.from_pretrained(folder)
    compare(ours, hf, odd_image("square 56x56"), "56x56")
    with pytest.raises(IRCError, match="37x91 image is not whole 2x2 windows of 14x14 patches"):
        patches(ours, odd_image("37x91"))


def test_legacy_and_null_keys_map_as_in_transformers(tmp_path):
    """Top-level min/max pixels over ``size`` (also over a 4.x ``size: {min_pixels, max_pixels}``),
    null bounds the class defaults, the Fast class name the same processor."""
    image = odd_image("over max 640x480")
    configs = {
        "legacy size": {**CHECKPOINT, "max_pixels": 28 * 28 * 20, "size": {"min_pixels": 1, "max_pixels": 2}},
        "max over size": {"image_processor_type": "Qwen2VLImageProcessorFast", "max_pixels": 28 * 28 * 30,
                          "size": {"shortest_edge": 28 * 28 * 8, "longest_edge": 10 ** 7}},
        "nulls": {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": None, "max_pixels": None,
                  "size": None},
    }
    for name, config in configs.items():
        folder = written(tmp_path / name.replace(" ", "_"), config)
        hf = hf_qwen.Qwen2VLImageProcessorPil.from_pretrained(folder)
        compare(images.Processor.read(folder), hf, image, name)


def test_processor_call_points_to_patches(tmp_path):
    ours = images.Processor.read(written(tmp_path, CHECKPOINT))
    with pytest.raises(IRCError, match="as patches: irc_cli.images_qwen.patches"):
        ours(odd_image("37x91"))
    with pytest.raises(IRCError, match="their own size"):
        ours.check_model(224, 224)


@pytest.mark.parametrize("change, message", [
    ({"min_pixels": 50000, "max_pixels": 40000}, "min_pixels: the min pixels 50000 are over the max pixels 40000"),
    ({"min_pixels": None, "max_pixels": None, "size": {"shortest_edge": 900, "longest_edge": 800}},
     "size.shortest_edge: the min pixels 900 are over the max pixels 800 .size.longest_edge."),
    ({"min_pixels": 0}, "min_pixels: expected a positive number of pixels, got 0"),
    ({"max_pixels": -5}, "max_pixels: expected a positive number of pixels, got -5"),
    ({"max_pixels": "big"}, "max_pixels: expected a positive number of pixels, got 'big'"),
    ({"min_pixels": None, "max_pixels": None, "size": {"shortest_edge": 3136, "longest_edge": 0}},
     "size.longest_edge: expected a positive number of pixels, got 0"),
    ({"min_pixels": None, "max_pixels": None, "size": {"min_pixels": 1, "max_pixels": 2}},
     r"size: expected \{shortest_edge, longest_edge\}.*got \['max_pixels', 'min_pixels'\]"),
    ({"min_pixels": None, "size": {"height": 224, "width": 224}}, r"size: expected .*got \['height', 'longest_edge'"),
    ({"size": [224, 224]}, r"size: expected \{shortest_edge, longest_edge\}, got \[224, 224\]"),
    ({"patch_size": 0}, "patch_size: expected a positive integer, got 0"),
    ({"merge_size": "2"}, "merge_size: expected a positive integer, got '2'"),
    ({"temporal_patch_size": True}, "temporal_patch_size: expected a positive integer, got True"),
])
def test_a_config_that_contradicts_itself_is_one_error_naming_file_and_key(change, message, tmp_path):
    folder = written(tmp_path, {**CHECKPOINT, **change})
    with pytest.raises(SpecError, match=message) as caught:
        images.Processor.read(folder)
    assert caught.value.location == str(tmp_path / images.PREPROCESSOR)
