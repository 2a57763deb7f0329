"""SigLIP 2's NaFlex image processor (``irc_cli.images_siglip2``): pixel values, the attention
mask and the spatial shapes equal to transformers 5.25's ``Siglip2ImageProcessorPil`` (exactly;
the class transformers falls back to without torchvision) on real photographs (scikit-image's
sample data: RGB, and with ``do_convert_rgb`` grayscale, RGBA and a JPEG too) and on odd sizes
(tiny, strips, an image larger than the budget, one that fills it exactly), with the defaults
(patches of 16, 256 of them), a small budget and the form of a hub checkpoint's config; its
``size_for_patches`` equal to transformers' search over many sizes; an image transformers
refuses (not RGB without ``do_convert_rgb``) refused; a bad setting one SpecError naming the
file and key."""
import numpy as np
import pytest

from irc.errors import IRCError, SpecError
from irc_cli import images
from irc_cli.images_siglip2 import naflex, size_for_patches
from tests.image_inputs import odd_image as sized_image, written

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from transformers.models.siglip2 import image_processing_pil_siglip2 as hf_siglip2  # noqa: E402

CHECKPOINT = {  # the form of google/siglip2-base-patch16-naflex's preprocessor_config.json
    "do_convert_rgb": None, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Siglip2ImageProcessor", "image_std": [0.5, 0.5, 0.5],
    "max_num_patches": 256, "patch_size": 16, "processor_class": "Siglip2Processor", "resample": 2,
    "rescale_factor": 0.00392156862745098}
CONFIGS = {"defaults": {}, "small": {"patch_size": 8, "max_num_patches": 12},
           "rgb": {"patch_size": 14, "max_num_patches": 64, "do_convert_rgb": True}}
ODD = {"37x91": (37, 91), "strip 1000x30": (1000, 30), "strip 9x700": (9, 700), "tiny 5x7": (5, 7),
       "one pixel": (1, 1), "exactly 256x256": (256, 256), "640x480": (640, 480), "113x29": (113, 29)}


def compare(ours, hf, image, name) -> None:
    """Our three arrays against transformers' on one image: equal bit for bit."""
    want = hf(image, return_tensors="np")
    got = naflex(ours, image)
    for key in ("pixel_values", "pixel_attention_mask", "spatial_shapes"):
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, (name, key)
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"{name}: {key}")


@pytest.mark.parametrize("config", ["defaults", "small", "rgb", "checkpoint"])
def test_arrays_are_transformers_on_photographs_and_odd_sizes(config, photographs, tmp_path):
    if config == "checkpoint":
        folder = written(tmp_path, CHECKPOINT)
        hf = hf_siglip2.Siglip2ImageProcessorPil.from_pretrained(folder)
    else:
        hf = hf_siglip2.Siglip2ImageProcessorPil(**CONFIGS[config])
        hf.save_pretrained(tmp_path)
        folder = str(tmp_path)
    ours = images.Processor.read(folder)
    assert ours.kind == "Siglip2ImageProcessor" and ours.output_size() is None
    cases = [(name, Image.open(path)) for name, path in sorted(photographs.items())]
    cases += [(name, sized_image(*ODD[name])) for name in sorted(ODD)]
    compared = 0
    for name, image in cases:
        if image.mode != "RGB" and not ours.settings.get("do_convert_rgb"):  # transformers refuses it too
            with pytest.raises(ValueError, match="mean must have"):
                hf(image, return_tensors="np")
            with pytest.raises(IRCError, match="do_convert_rgb"):
                naflex(ours, image)
            continue
        compare(ours, hf, image, name)
        compared += 1
    assert compared >= len(ODD) + 2  # the RGB photographs and every odd size at least


def test_the_size_search_is_transformers_over_many_sizes():
    for height, width in [(h, w) for h in (1, 2, 7, 15, 16, 17, 100, 333, 1000, 4000) for w in (1, 3, 16, 64, 999)]:
        for patch, budget in ((16, 256), (14, 729), (8, 12), (4, 1)):
            want = hf_siglip2.get_image_size_for_max_num_patches(height, width, patch, budget)
            got = size_for_patches(height, width, patch, budget)
            assert got == want, (height, width, patch, budget)
            assert (got[0] // patch) * (got[1] // patch) <= max(budget, 1)


def test_the_patches_are_rows_of_pixels_with_channels_innermost():
    """Patch k is the p x p square at (k // columns, k % columns), its pixels row by row, each
    pixel's C values together; zero rows after the image."""
    ours = images.Processor("<test>", {**images.DEFAULTS["Siglip2ImageProcessor"], "do_resize": False,
                                       "do_rescale": False, "do_normalize": False, "patch_size": 2,
                                       "max_num_patches": 9}, "Siglip2ImageProcessor")
    data = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    got = naflex(ours, Image.fromarray(data, "RGB"))
    assert got["spatial_shapes"].tolist() == [[2, 3]] and got["pixel_attention_mask"].tolist() == [[1] * 6 + [0] * 3]
    for k in range(6):
        row, column = divmod(k, 3)
        square = data[2 * row:2 * row + 2, 2 * column:2 * column + 2].astype(np.float32)
        np.testing.assert_array_equal(got["pixel_values"][0, k], square.reshape(-1))
    assert not got["pixel_values"][0, 6:].any()


def test_without_resize_an_image_must_be_whole_patches_within_the_budget():
    ours = images.Processor("<test>", {**images.DEFAULTS["Siglip2ImageProcessor"], "do_resize": False,
                                       "patch_size": 4, "max_num_patches": 6}, "Siglip2ImageProcessor")
    for width, height in ((9, 8), (16, 8)):  # a partial patch; 8 patches over the 6
        with pytest.raises(IRCError, match="not 1 to 6 whole 4x4 patches"):
            naflex(ours, sized_image(width, height))


@pytest.mark.parametrize("change, message", [
    ({"patch_size": 0}, "patch_size: expected a positive integer, got 0"),
    ({"max_num_patches": "many"}, "max_num_patches: expected a positive integer, got 'many'"),
])
def test_a_bad_setting_names_the_file_and_key(tmp_path, change, message):
    folder = written(tmp_path, {**CHECKPOINT, **change})
    with pytest.raises(SpecError, match=message) as err:
        images.Processor.read(folder)
    assert "preprocessor_config.json" in str(err.value)
