"""Pixtral's and Mistral 3's images (``irc_cli.images_pixtral``): pixel values and image sizes
equal to transformers 5.25's ``PixtralImageProcessorPil`` (exactly) on real photographs
(scikit-image's sample data: RGB, grayscale, RGBA, a JPEG) and odd sizes (tiny, strips, whole
patches, the longest edge itself), with Mistral 3's patch of 28 and a longest edge of 1540 or
112, and with a checkpoint's config given the patch at call time as ``PixtralProcessor`` gives
it; the resize equal to transformers' over many sizes; the token grid equal to
``PixtralProcessor``'s; a bad size is one SpecError naming the file and key."""
import sys
import types

import numpy as np
import pytest

from irc.errors import IRCError, SpecError
from irc_cli import images
from irc_cli.images_pixtral import image_layout, pixtral, resized_size
from tests.image_inputs import odd_image as sized_image, written

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from transformers.models.pixtral import image_processing_pil_pixtral as hf_pixtral  # noqa: E402

PATCH = 28  # Mistral 3: the vision tower's patch_size 14 · spatial_merge_size 2
CHECKPOINT = {  # the form of Mistral-Small-3.1's preprocessor_config.json
    "crop_size": None, "do_center_crop": None, "do_convert_rgb": True, "do_normalize": True, "do_rescale": True,
    "do_resize": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "PixtralImageProcessorFast", "image_std": [0.26862954, 0.26130258, 0.27577711],
    "patch_size": {"height": 14, "width": 14}, "processor_class": "PixtralProcessor", "resample": 3,
    "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 1540}}
ODD = {"37x91": (37, 91), "strip 1000x30": (1000, 30), "strip 9x700": (9, 700), "tiny 5x7": (5, 7),
       "one pixel": (1, 1), "56x84": (56, 84), "112x112": (112, 112), "1540x770": (1540, 770),
       "1541x14": (1541, 14), "640x480": (640, 480), "113x29": (113, 29)}


def odd_image(name):
    return sized_image(*ODD[name])



def compare(ours, hf, image, name, **call):
    """Our pixel values against transformers' on one image: equal bit for bit, the same size;
    the max difference."""
    want = hf(image, return_tensors="np", **call)
    got, size = pixtral(ours, image, PATCH)
    assert got.dtype == np.float32 and got.shape == want["pixel_values"].shape, name
    assert want["image_sizes"].tolist() == [list(size)] and got.shape[2:] == size, name
    np.testing.assert_array_equal(got, want["pixel_values"], err_msg=name)
    return float(np.abs(got - want["pixel_values"]).max())


@pytest.mark.parametrize("longest_edge", [1540, 112])
def test_pixels_are_transformers_on_photographs_and_odd_sizes(longest_edge, photographs, tmp_path):
    hf = hf_pixtral.PixtralImageProcessorPil(patch_size={"height": PATCH, "width": PATCH},
                                             size={"longest_edge": longest_edge})
    hf.save_pretrained(tmp_path)
    ours = images.Processor.read(str(tmp_path))
    assert ours.kind == "PixtralImageProcessor" and ours.output_size() is None
    cases = [(name, Image.open(path)) for name, path in sorted(photographs.items())]
    cases += [(name, odd_image(name)) for name in sorted(ODD)]
    worst = max(compare(ours, hf, image, name) for name, image in cases)
    assert worst == 0.0


def test_a_checkpoint_config_takes_the_processors_patch(photographs, tmp_path):
    """Its own patch_size (14) is not the one used: PixtralProcessor passes 14 · 2 at call time."""
    folder = written(tmp_path, CHECKPOINT)
    ours, hf = images.Processor.read(folder), hf_pixtral.PixtralImageProcessorPil.from_pretrained(folder)
    for name in ("astronaut.png", "logo.png"):
        compare(ours, hf, Image.open(photographs[name]), name, patch_size=PATCH)
    for name in ("640x480", "strip 9x700", "1540x770"):
        compare(ours, hf, odd_image(name), name, patch_size=PATCH)


def test_other_settings_are_transformers(tmp_path):
    """The class defaults (longest edge 1024), a height x width bound, bilinear, no resize, no
    normalising."""
    for change in ({"image_processor_type": "PixtralImageProcessor"}, {"size": {"height": 200, "width": 90}},
                   {"resample": 2}, {"do_resize": False}, {"do_normalize": False, "do_rescale": False}):
        config = change if "image_processor_type" in change else {**CHECKPOINT, **change}
        folder = written(tmp_path / str(len(list(tmp_path.iterdir()))), config)
        ours, hf = images.Processor.read(folder), hf_pixtral.PixtralImageProcessorPil.from_pretrained(folder)
        for name in ("640x480", "37x91", "strip 1000x30", "strip 9x700"):
            compare(ours, hf, odd_image(name), f"{change} {name}", patch_size=PATCH)


def test_resized_size_is_transformers():
    rng = np.random.default_rng(0)
    sizes = [(int(h), int(w)) for h, w in rng.integers(1, 4000, (400, 2))]
    sizes += [(int(h), int(w)) for h, w in rng.integers(1, 120, (100, 2))] + [(1540, 1540), (1541, 1540), (28, 28)]
    for bounds in ((1540, 1540), (1024, 1024), (112, 112), (200, 90)):
        for patch in (28, 16, 14):
            for height, width in sizes:
                want = hf_pixtral.get_resize_output_image_size(np.zeros((3, height, width)), bounds, (patch, patch),
                                                               input_data_format="channels_first")
                assert resized_size(height, width, *bounds, patch) == want, (height, width, bounds, patch)


@pytest.fixture(scope="module")
def hf_processor():
    """transformers' PixtralProcessor without its tokenizer, patch 14 and merge 2 as Mistral 3's.
    Its module imports get_resize_output_image_size from the torchvision image processor; where
    torchvision is absent, the Pillow module's (the same function) stands in while it loads."""
    name = "transformers.models.pixtral.image_processing_pixtral"
    try:
        from transformers.models.pixtral.processing_pixtral import PixtralProcessor
    except ImportError:
        stand_in = types.ModuleType(name)
        stand_in.get_resize_output_image_size = hf_pixtral.get_resize_output_image_size
        saved = sys.modules.get(name)
        sys.modules[name] = stand_in
        try:
            from transformers.models.pixtral.processing_pixtral import PixtralProcessor
        finally:
            del sys.modules[name]
            if saved is not None:
                sys.modules[name] = saved
    processor = PixtralProcessor.__new__(PixtralProcessor)
    processor.patch_size, processor.spatial_merge_size = 14, 2
    processor.image_token, processor.image_break_token, processor.image_end_token = "[IMG]", "[IMG_BREAK]", "[IMG_END]"
    return processor


def test_image_layout_is_pixtral_processors(hf_processor):
    """The grid written for the image sizes of our resize is ours row by row; its [IMG] count is
    _get_num_multimodal_tokens's. (That reads a height of 1 or 3 as channels: none such here.)"""
    rng = np.random.default_rng(1)
    sizes = [(int(h), int(w)) for h, w in rng.integers(4, 3000, (150, 2))] + [(5, 7), (28, 28), (1540, 1540)]
    for longest_edge in (1540, 112):
        sizes = [(h, w) for h, w in sizes if min(h, w) * longest_edge >= max(h, w)]  # no side shrinks to 0
        hf_processor.image_processor = hf_pixtral.PixtralImageProcessorPil(size={"longest_edge": longest_edge})
        counts = hf_processor._get_num_multimodal_tokens(sizes).num_image_tokens
        for (height, width), count in zip(sizes, counts):
            pixels = resized_size(height, width, longest_edge, longest_edge, PATCH)
            rows, columns = image_layout(*pixels, PATCH)
            written_tokens = hf_processor.replace_image_token({"image_sizes": [list(pixels)]}, 0)
            row = "[IMG]" * columns + "[IMG_BREAK]"
            assert written_tokens == (row * rows).removesuffix("[IMG_BREAK]") + "[IMG_END]", (height, width)
            assert rows * columns == count, (height, width, longest_edge)
    assert image_layout(60, 90, PATCH) == (2, 3)  # without a resize: whole patches, as the processor counts
    with pytest.raises(IRCError, match="a 90x20 image has no whole 28x28 patch"):
        image_layout(20, 90, PATCH)


def test_a_side_that_shrinks_to_nothing_is_refused_as_by_transformers(tmp_path):
    hf = hf_pixtral.PixtralImageProcessorPil(size={"longest_edge": 112})
    hf.save_pretrained(tmp_path)
    ours = images.Processor.read(str(tmp_path))
    image = Image.new("RGB", (500, 1))
    with pytest.raises(ValueError):
        hf(image, patch_size=PATCH)
    with pytest.raises(IRCError, match="a 500x1 image shrinks to 112x0 within size 112x112") as caught:
        pixtral(ours, image, PATCH)
    assert caught.value.location == str(tmp_path / images.PREPROCESSOR)


def test_processor_call_points_to_pixtral(tmp_path):
    ours = images.Processor.read(written(tmp_path, CHECKPOINT))
    with pytest.raises(IRCError, match="at its own size: irc_cli.images_pixtral.pixtral"):
        ours(odd_image("37x91"))
    with pytest.raises(IRCError, match="their own size"):
        ours.check_model(224, 224)


@pytest.mark.parametrize("change, message", [
    ({"size": {"longest_edge": 0}}, r"size: expected one of \['longest_edge'\] or \['height', 'width'\] with "
                                    r"positive integers, got \{'longest_edge': 0\}"),
    ({"size": {"longest_edge": -5}}, r"size: .*got \{'longest_edge': -5\}"),
    ({"size": {"longest_edge": 1540.0}}, r"size: .*got \{'longest_edge': 1540.0\}"),
    ({"size": {"shortest_edge": 224}}, r"size: .*got \{'shortest_edge': 224\}"),
    ({"size": 1540}, r"size: .*got 1540"),
    ({"do_center_crop": True, "crop_size": {"height": 224, "width": 224}},
     "do_center_crop: a centre crop after Pixtral's resize is not applied by irc"),
])
def test_a_bad_config_is_one_error_naming_file_and_key(change, message, tmp_path):
    folder = written(tmp_path, {**CHECKPOINT, **change})
    with pytest.raises(SpecError, match=message) as caught:
        images.Processor.read(folder)
    assert caught.value.location == str(tmp_path / images.PREPROCESSOR)
