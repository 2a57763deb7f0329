"""``irc run MODEL --image FILE`` and the image processors behind it (``irc_cli.images``):
pixel values equal to transformers 5.25's PIL processors (CLIP, SigLIP, ViT, BiT/DINOv2) on
real photographs (scikit-image's sample data: RGB, grayscale, RGBA, a JPEG) and on odd sizes;
a tiny CLIP vision twin's embedding of a photograph equal to transformers', from the folder
irc compile wrote (ONNX Runtime) and from the Hugging Face folder (interpreter); bad input is
one message naming the file and key, exit 2."""
import json

import numpy as np
import pytest

from irc_cli import image_file, images, main

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")

from transformers.models.bit.image_processing_pil_bit import BitImageProcessorPil  # noqa: E402
from transformers.models.blip.image_processing_pil_blip import BlipImageProcessorPil  # noqa: E402
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil  # noqa: E402
from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil  # noqa: E402
from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil  # noqa: E402

PROCESSORS = {  # as their checkpoints configure them: CLIP-L/336, SigLIP-so400m, ViT-B/16, DINOv2, BLIP-2
    "clip": lambda: CLIPImageProcessorPil(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}),
    "siglip": lambda: SiglipImageProcessorPil(size={"height": 384, "width": 384}),
    "vit": lambda: ViTImageProcessorPil(),
    "blip-2": lambda: BlipImageProcessorPil(size={"height": 224, "width": 224}),
    "dinov2": lambda: BitImageProcessorPil(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224},
                                           image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]),
}
ODD = {"tall": (7, 301, "RGB"), "wide": (333, 17, "RGB"), "tiny": (3, 2, "RGB"), "transparent": (90, 61, "RGBA")}


def odd_image(name):
    width, height, mode = ODD[name]
    data = np.random.default_rng(len(name)).integers(0, 256, (height, width, len(mode)), dtype=np.uint8)
    return Image.fromarray(data, mode)


def saved(processor, folder):
    processor.save_pretrained(folder)
    return images.Processor.read(str(folder))


@pytest.mark.parametrize("kind", sorted(PROCESSORS))
def test_pixel_values_are_transformers_on_photographs_and_odd_sizes(kind, photographs, tmp_path):
    hf = PROCESSORS[kind]()
    ours = saved(hf, tmp_path)
    cases = [(name, Image.open(path)) for name, path in sorted(photographs.items())]
    cases += [(name, odd_image(name)) for name in sorted(ODD)]
    for name, image in cases:
        if kind == "vit" and image.mode != "RGB":  # ViT's processor keeps the mode: transformers refuses it too
            with pytest.raises(Exception):
                hf(image, return_tensors="np")
            with pytest.raises(images.IRCError, match="do_convert_rgb"):
                ours(image)
            continue
        want = hf(image, return_tensors="np")["pixel_values"][0]
        got = ours(image)
        assert got.dtype == np.float32 and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)


def twin(folder, image_size=28):
    """A tiny CLIP vision tower (patches of 7) and its processor, as saved on the hub."""
    config = transformers.CLIPVisionConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=48, image_size=28, patch_size=7)
    torch.manual_seed(3)
    model = transformers.CLIPVisionModel(config).eval()
    model.save_pretrained(folder)
    CLIPImageProcessorPil(size={"shortest_edge": image_size},
                          crop_size={"height": image_size, "width": image_size}).save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def clip_twin(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clip-twin")
    return twin(folder), folder


def expected_embedding(model, folder, path) -> np.ndarray:
    pixels = CLIPImageProcessorPil.from_pretrained(str(folder))(Image.open(path), return_tensors="pt")
    with torch.no_grad():
        return model(**pixels).pooler_output[0].numpy()


@pytest.mark.parametrize("source", ["compiled", "hf-folder"])
def test_run_embeds_a_photograph_as_transformers_does(clip_twin, photographs, tmp_path, capsys, source):
    model, folder = clip_twin
    target = folder
    if source == "compiled":
        out = tmp_path / "out"
        assert main(["compile", str(folder), "--target", "onnx", "-o", str(out / "model.onnx")]) == 0
        assert (out / images.PREPROCESSOR).is_file()  # copied beside the model
        target = out
    capsys.readouterr()
    assert main(["run", str(target), "--image", str(photographs["chelsea.png"]), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["engine"] == ("onnxruntime" if source == "compiled" else "interpreter")
    assert report["shapes"] == {"last_hidden_state": [1, 17, 32], "pooler_output": [1, 32]}
    want = expected_embedding(model, folder, photographs["chelsea.png"])
    got = np.asarray(report["pooler_output"], np.float32)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_run_prints_a_summary(clip_twin, photographs, capsys):
    _, folder = clip_twin
    assert main(["run", str(folder), "--image", str(photographs["coffee.png"])]) == 0
    out, err = capsys.readouterr()
    assert "pooler_output: 1 x 32" in out and "last_hidden_state: 1 x 17 x 32" in out
    assert "one 28x28 image in" in err


def bad(tmp_path, clip_twin, what):
    _, folder = clip_twin
    if what == "processor":
        crop = json.loads((folder / images.PREPROCESSOR).read_text())
        crop["crop_size"] = {"height": 32, "width": 32}
        other = tmp_path / "model"
        other.mkdir()
        for name in ("config.json", "model.safetensors"):
            (other / name).symlink_to(folder / name)
        (other / images.PREPROCESSOR).write_text(json.dumps(crop))
        return other
    return folder


@pytest.mark.parametrize("case, message", [
    ("not-an-image", "not an image Pillow can read"),
    ("missing", "no such image file"),
    ("too-large", "pixels is over irc's limit"),
    ("processor", "crop_size: gives images of 32x32, but the model takes 28x28"),
    ("with-prompt", "--prompt-ids does not go with --image"),
    ("decoder", "--image goes with an image encoder; this model reads text only"),
])
def test_bad_input_is_one_message_exit_2(clip_twin, photographs, tmp_path, capsys, monkeypatch, case, message):
    spec = str(bad(tmp_path, clip_twin, case))
    image = str(photographs["astronaut.png"])
    argv = []
    if case == "not-an-image":
        image = tmp_path / "notes.jpg"
        image.write_text("not a picture")
    elif case == "missing":
        image = tmp_path / "nowhere.png"
    elif case == "too-large":
        monkeypatch.setattr(image_file, "MAX_PIXELS", 100)
    elif case == "with-prompt":
        argv = ["--prompt-ids", "1,2"]
    elif case == "decoder":
        spec = "examples/tiny-llama3.yaml"
    assert main(["run", spec, "--image", str(image)] + argv) == 2
    out, err = capsys.readouterr()
    assert message in err and "Traceback" not in err, err
    if case in ("not-an-image", "missing", "too-large"):
        assert str(image) in err
    if case == "processor":
        assert images.PREPROCESSOR in err


def test_a_prompt_or_an_image_is_needed(capsys):
    assert main(["run", "examples/tiny-llama3.yaml"]) == 2
    assert "give the prompt: --prompt TEXT or --prompt-ids IDS" in capsys.readouterr().err


def test_pan_and_scan_is_refused_by_name(tmp_path):
    """Gemma 3's pan-and-scan crops: one error naming the file and the key, with its fix."""
    from irc.errors import SpecError

    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "Gemma3ImageProcessor", "do_pan_and_scan": True}))
    with pytest.raises(SpecError, match="do_pan_and_scan: Gemma 3's pan-and-scan") as err:
        images.Processor.read(str(tmp_path))
    assert err.value.hint == "set it to false (its default)" and "preprocessor_config.json" in str(err.value)
