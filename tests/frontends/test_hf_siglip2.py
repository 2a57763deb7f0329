"""SigLIP 2 (NaFlex: ``frontends.hf.siglip2``, ``frontends.dsl_naflex``) against transformers 5.25
on tiny random twins saved with ``save_pretrained``: ``siglip2_vision_model`` with its pooling
head (a 4 x 4 position grid; also saved in bf16) and without (5 x 5), and the ``siglip2`` dual
encoder.

One batch holds two images of different aspect ratios in rows of 24 patches: 2 x 3 patches
(the grid shrunk on both axes: the antialiased triangle) and 6 x 4 (grown; the 5 x 5 grid
shrunk across), the padding masked as transformers masks it. ``last_hidden_state`` (padding rows
included) and ``pooler_output`` through the reference interpreter, both ONNX targets, the NumPy
module and the Triton module (Triton's interpreter) are within 1e-4 relative of transformers';
so are the dual encoder's ``text_embeds``, image embedding and ``logits_per_image`` through the
interpreter and the ONNX folder. ``irc run --image`` (and ``--text``) on a photograph, through the
Hugging Face folder and the compiled one, gives transformers' embedding of the processor's patches
(and its logits); ``irc show`` counts one image of the grid's own patches; settings irc refuses
name config.json and the key."""
from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import importlib.util  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from frontends import load_spec  # noqa: E402
from frontends.hf.dual_text import similarity  # noqa: E402
from irc.analysis import analyze  # noqa: E402
from irc.check import relative_error  # noqa: E402
from irc.interpreter import run  # noqa: E402
from irc_cli import main  # noqa: E402
from tests.frontends.refusals import refused_changes  # noqa: E402
from tests.frontends.test_hf_dual import TEXT, texts, tiny_tokenizer  # noqa: E402
from tests.frontends.test_hf_vision import seeded_and_saved  # noqa: E402
from tests.frontends.twin_fixtures import once_fixture  # noqa: E402
from tests.frontends.vlm_checks import assert_outputs_match, tower_outputs  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, patch_size=4,
              num_patches=16)
CASES = {"siglip2-vision": VISION, "siglip2-vision-no-head": dict(VISION, num_patches=25, vision_use_head=False),
         # saved in bf16: the position table meets f32 activations through a cast, resized in f32
         "siglip2-vision-bf16": VISION, "siglip2": VISION}
SHAPES = np.array([[2, 3], [6, 4]])  # patches of each image: shrinks the 4 x 4 grid, grows it
LENGTH = 24


def build(name: str, folder):
    if name == "siglip2":
        config = transformers.Siglip2Config(vision_config=CASES[name], text_config=dict(TEXT, projection_size=32))
        model = transformers.Siglip2Model(config).eval()
    else:
        model = transformers.Siglip2VisionModel(transformers.Siglip2VisionConfig(**CASES[name])).eval()
    return seeded_and_saved(model, sorted(CASES).index(name), name.endswith("-bf16"), folder)


twins = once_fixture(build, "twins")


def feeds() -> dict:
    """The processor's arrays for two random images of SHAPES: zero rows after each image."""
    pixels = np.random.default_rng(7).standard_normal((len(SHAPES), LENGTH, 3 * 4 * 4)).astype(np.float32)
    mask = np.zeros((len(SHAPES), LENGTH), np.int64)
    for row, (height, width) in enumerate(SHAPES):
        mask[row, :height * width] = 1
    return {"pixel_values": pixels * mask[..., None].astype(np.float32), "pixel_attention_mask": mask,
            "spatial_shapes": SHAPES}


def hf_outputs(model, inputs: dict) -> dict:
    tower = getattr(model, "vision_model", model)
    with torch.no_grad():
        out = tower(**{key: torch.from_numpy(value) for key, value in inputs.items()})
    return tower_outputs(out)


@pytest.mark.parametrize("name", ["siglip2-vision", "siglip2-vision-no-head", "siglip2-vision-bf16"])
def test_the_interpreter_gives_transformers_outputs(twins, name):
    model, folder = twins(name)
    graph = load_spec(folder)
    assert [v.name for v in graph.inputs] == ["pixel_values", "pixel_attention_mask", "spatial_shapes"]
    assert_outputs_match(run(graph, feeds()), hf_outputs(model, feeds()))
    assert analyze(graph)["params_total"] == sum(p.numel() for p in model.parameters())


def load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("target", ["onnx", "onnx-ort", "numpy", "triton"])
@pytest.mark.parametrize("name", ["siglip2-vision", "siglip2-vision-bf16"])
def test_the_targets_give_transformers_outputs(twins, tmp_path, capsys, name, target):
    model, folder = twins(name)
    if target in ("onnx", "onnx-ort"):
        from backends.onnx import runtime
        path = tmp_path / "out" / "model.onnx"
        assert main(["compile", str(folder), "--target", target, "-o", str(path), "--quiet"]) == 0
        got = runtime.ort_engine(str(path))(feeds())
    else:
        if target == "triton":
            pytest.importorskip("triton")
        path = tmp_path / f"siglip2_{target}.py"
        assert main(["compile", str(folder), "--target", target, "-o", str(path), "--quiet"]) == 0
        module = load(path)
        got = module.forward(module.load_weights(), **feeds())
    capsys.readouterr()
    assert_outputs_match(got, hf_outputs(model, feeds()))


def test_show_counts_one_image_of_the_grids_own_patches(twins, capsys):
    _, folder = twins("siglip2-vision")
    assert main(["show", str(folder), "--json"]) == 0
    vision = json.loads(capsys.readouterr().out)["vision"]
    assert (vision["patches"], vision["tokens"], vision["image_size"], vision["patch"]) == (16, 16, [16, 16], 4)
    assert vision["flops_per_image"] > 0


# ---- the dual encoder ------------------------------------------------------------------------

def dual_reference(model, ids, mask, inputs) -> tuple:
    """transformers' (text_embeds, image embeddings, logits_per_image)."""
    tensors = {key: torch.from_numpy(value) for key, value in inputs.items()}
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), **tensors)
        text = model.get_text_features(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
        image = model.get_image_features(**tensors)
    return text.pooler_output.numpy(), image.pooler_output.numpy(), out.logits_per_image.numpy()


def test_the_dual_encoder_gives_transformers_logits_in_the_interpreter(twins):
    model, folder = twins("siglip2")
    graph = load_spec(folder)
    text = graph.parts["text"]
    ids, mask = texts("siglip")  # right-padded to the whole length
    want_text, want_image, want_logits = dual_reference(model, ids, mask, feeds())
    got_text = run(text, {"input_ids": ids, "attention_mask": mask})["text_embeds"]
    got_image = run(graph, feeds())["pooler_output"]
    assert relative_error(got_text, want_text) <= TOLERANCE
    assert relative_error(got_image, want_image) <= TOLERANCE
    logits = similarity(got_image, got_text, text.meta["logit_scale"], text.meta["logit_bias"])
    assert relative_error(logits, want_logits) <= TOLERANCE


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_the_dual_encoders_onnx_folder_gives_transformers_logits(twins, tmp_path, target):
    from backends.onnx.runtime import ort_engine

    model, folder = twins("siglip2")
    out = tmp_path / "out"
    assert main(["compile", str(folder), "--target", target, "-o", str(out / "model.onnx"), "--quiet"]) == 0
    manifest = json.loads((out / "irc_dual.json").read_text())
    assert manifest["model_type"] == "siglip2" and manifest["pad_to"] == TEXT["max_position_embeddings"]
    ids, mask = texts("siglip")
    _, _, want = dual_reference(model, ids, mask, feeds())
    text = ort_engine(str(out / "text.onnx"))({"input_ids": ids, "attention_mask": mask})["text_embeds"]
    image = ort_engine(str(out / "model.onnx"))(feeds())["pooler_output"]
    logits = similarity(image, text, manifest["logit_scale"], manifest["logit_bias"])
    assert relative_error(logits, want) <= TOLERANCE


# ---- irc run --image on a photograph -----------------------------------------------------------

def with_processor(twins, name: str, tmp_path):
    """The twin's folder (linked) with a NaFlex processor of patches of 4, 24 of them, and the
    tiny tokenizer; (model, folder, transformers' processor)."""
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

    model, source = twins(name)
    folder = tmp_path / name
    folder.mkdir()
    for file in ("config.json", "model.safetensors"):
        (folder / file).symlink_to(source / file)
    processor = Siglip2ImageProcessorPil(patch_size=4, max_num_patches=LENGTH)
    processor.save_pretrained(folder)
    tiny_tokenizer(folder)
    return model, folder, processor


@pytest.mark.parametrize("source", ["hf-folder", "compiled"])
def test_run_embeds_a_photograph_as_transformers_does(twins, photographs, tmp_path, capsys, source):
    from PIL import Image

    model, folder, processor = with_processor(twins, "siglip2-vision", tmp_path)
    target = folder
    if source == "compiled":
        target = tmp_path / "out"
        assert main(["compile", str(folder), "--target", "onnx", "-o", str(target / "model.onnx"), "--quiet"]) == 0
    capsys.readouterr()
    photo = photographs["chelsea.png"]
    assert main(["run", str(target), "--image", str(photo), "--json"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["engine"] == ("onnxruntime" if source == "compiled" else "interpreter")
    assert report["shapes"] == {"last_hidden_state": [1, LENGTH, 32], "pooler_output": [1, 32]}
    inputs = processor(Image.open(photo), return_tensors="np")
    height, width = inputs["spatial_shapes"][0]
    assert f"one image of {height}x{width} patches in" in err
    want = hf_outputs(model, {key: inputs[key] for key in ("pixel_values", "pixel_attention_mask",
                                                           "spatial_shapes")})["pooler_output"][0]
    assert relative_error(np.asarray(report["pooler_output"], np.float32), want) <= TOLERANCE


@pytest.mark.parametrize("source", ["hf-folder", "compiled"])
def test_run_scores_a_photograph_against_texts(twins, photographs, tmp_path, capsys, source):
    """The texts as the tokenizer writes them, padded to the whole length and all attended (as
    SigLIP's are: ``irc_cli.run_dual``); transformers' logits_per_image and a sigmoid each."""
    from PIL import Image

    model, folder, processor = with_processor(twins, "siglip2", tmp_path)
    target = folder
    if source == "compiled":
        target = tmp_path / "out"
        assert main(["compile", str(folder), "--target", "onnx-ort", "-o", str(target / "model.onnx"),
                     "--quiet"]) == 0
    ids, mask = texts("siglip")
    mask[:] = 1
    photo = photographs["coffee.png"]
    inputs = processor(Image.open(photo), return_tensors="np")
    _, _, want = dual_reference(model, ids, mask, {key: inputs[key] for key in (
        "pixel_values", "pixel_attention_mask", "spatial_shapes")})
    capsys.readouterr()
    assert main(["run", str(target), "--image", str(photo), "--text", "w5 w7 w9", "--text", "w4 w6 w8 w11 w13 w2",
                 "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert relative_error(np.asarray(report["logits_per_image"]), want[0]) <= TOLERANCE
    assert np.allclose(report["scores"], 1 / (1 + np.exp(-want[0])), atol=1e-5)


def test_a_whole_image_processor_is_refused_for_naflex(twins, tmp_path, photographs, capsys):
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    _, folder, _ = with_processor(twins, "siglip2-vision", tmp_path)
    SiglipImageProcessorPil(size={"height": 16, "width": 16}).save_pretrained(folder)
    assert main(["run", str(folder), "--image", str(photographs["coffee.png"])]) == 2
    err = capsys.readouterr().err
    assert "image_processor_type: SiglipImageProcessor gives whole images" in err and "Traceback" not in err


# ---- refused settings ------------------------------------------------------------------------

@pytest.mark.parametrize("name, change, message", [
    ("siglip2-vision", {"num_patches": 20}, "num_patches: 20 learned positions are not a square grid"),
    ("siglip2-vision", {"hidden_act": "relu"}, 'hidden_act: "relu" is not supported'),
    ("siglip2-vision", {"patch_size": [4, 4]}, "patch_size: [4, 4] is not supported"),
    ("siglip2", {"vision_config": {"num_attention_heads": 5}},
     "vision_config.num_attention_heads: 5 heads do not divide hidden_size 32"),
    ("siglip2", {"text_config": {"hidden_act": "relu"}}, 'text_config.hidden_act: "relu" is not supported'),
])
def test_refused_settings_name_config_json_and_the_key(twins, tmp_path, name, change, message):
    _, folder = twins(name)
    refused_changes(folder, tmp_path, change, message)
