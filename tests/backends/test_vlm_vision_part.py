"""``irc compile VLM --part vision`` on the targets that write one model: a VLM's vision model
(tower, feature selection and projector: LLaVA's CLIP tower with the class token dropped,
Gemma 3's pooled SigLIP, PaliGemma's linear projector) alone, as the NumPy module (within 1e-5),
the Triton module in Triton's interpreter (1e-4) and onnx-npu's static vision graph on ONNX
Runtime's CPU provider (1e-4), against transformers' ``get_image_features``; the towers that take
images of any size (Qwen2.5-VL's windows, Qwen3-VL's learned grid and DeepStack, two images of
different grids packed block-diagonally; Pixtral's 2-D RoPE) as the NumPy and Triton modules,
and as onnx-npu's static graph at their reference image; Llama-3.2-Vision's tiled tower and its
cross-attention decoder as the NumPy and Triton modules; a dual encoder's text tower with
``--part text``; a part the model lacks is one error."""
from __future__ import annotations

from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import importlib.util  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from irc.check import relative_error  # noqa: E402
from irc_cli import main  # noqa: E402
from tests.frontends.test_hf_models import built_once  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NAMES = ["gemma3", "llava-clip", "paligemma"]


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    from tests.frontends.test_hf_vlm import build
    return built_once(build, tmp_path_factory)


def want(model, pixel_values) -> np.ndarray:
    from tests.frontends.test_hf_vlm import hf_pixels
    with torch.no_grad():
        return torch.cat(list(model.get_image_features(hf_pixels(model, pixel_values)).pooler_output)).numpy()


def one_image(model) -> np.ndarray:
    size = model.config.vision_config.image_size
    return np.random.default_rng(2).standard_normal((1, 3, size, size)).astype(np.float32)


def load(path):
    loader = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


def part_outputs(folder, part: str, target: str, tmp_path, **feeds) -> dict:
    """``irc compile FOLDER --part PART --target TARGET`` (the NumPy or the Triton module),
    loaded and run on ``feeds``: its outputs as NumPy arrays."""
    if target == "triton":
        pytest.importorskip("triton")
    path = tmp_path / f"{part}_{target}.py"
    assert main(["compile", str(folder), "--part", part, "--target", target, "-o", str(path), "--quiet"]) == 0
    module = load(path)
    outputs = module.forward(module.load_weights(), **feeds)
    return {k: v if isinstance(v, np.ndarray) else v.cpu().float().numpy() for k, v in outputs.items()}


@pytest.mark.parametrize("target, tolerance", [("numpy", 1e-5), ("triton", 1e-4)])
@pytest.mark.parametrize("name", NAMES)
def test_numpy_and_triton_modules(twins, tmp_path, name, target, tolerance):
    model, folder = twins(name)
    pixels = one_image(model)
    got = part_outputs(folder, "vision", target, tmp_path, pixel_values=pixels)["image_features"]
    assert relative_error(got, want(model, pixels)) <= tolerance


@pytest.mark.parametrize("name", NAMES)
def test_onnx_npu_static_graph(twins, tmp_path, name):
    import onnxruntime as ort

    model, folder = twins(name)
    out = tmp_path / "npu"
    assert main(["compile", folder, "--part", "vision", "--target", "onnx-npu", "--precision", "f32", "-o", str(out),
                 "--quiet"]) == 0
    contract = json.loads((out / "irc_npu.json").read_text())
    assert all(isinstance(d, int) for entry in contract["inputs"] for d in entry["shape"])  # static shapes
    session = ort.InferenceSession(str(out / "vision.onnx"), providers=["CPUExecutionProvider"])
    pixels = one_image(model)
    (got,) = session.run(["image_features"], {"pixel_values": pixels})
    assert relative_error(got, want(model, pixels)) <= 1e-4


GRID_TOWERS = ["qwen2_5_vl", "qwen3_vl", "mistral3"]  # (and Qwen3.5's twin, for its decoder)


@pytest.fixture(scope="module")
def grid_twins(tmp_path_factory):
    """Qwen2.5-VL's and Qwen3-VL's twins (test_hf_qwen_vl) and Mistral-3's (test_hf_mistral3)."""
    from tests.frontends import test_hf_mistral3, test_hf_qwen_vl

    def build(name, folder):
        return (test_hf_mistral3 if name == "mistral3" else test_hf_qwen_vl).build(name, folder)
    return built_once(build, tmp_path_factory)


def grid_case(model, name) -> tuple[dict, np.ndarray]:
    """The tower's feeds (two images of different grids for Qwen, one 16 x 24 image for
    Pixtral) and transformers' features (with Qwen3-VL's DeepStack levels beside them)."""
    if name == "mistral3":
        from tests.frontends.test_hf_mistral3 import case
        pixels, _, features, _ = case(model, (16, 24))
        return {"pixel_values": pixels}, features
    from tests.frontends.test_hf_qwen_vl import GRIDS, pixels
    with torch.no_grad():
        out = model.model.visual(torch.from_numpy(pixels(2)), grid_thw=torch.from_numpy(GRIDS))
        features = torch.cat([out.pooler_output, *(getattr(out, "deepstack_features", None) or [])], dim=-1)
    return {"pixel_values": pixels(2), "image_grid_thw": GRIDS}, features.numpy()


@pytest.mark.parametrize("target", ["numpy", "triton"])
@pytest.mark.parametrize("name", GRID_TOWERS)
def test_towers_of_any_image_size(grid_twins, tmp_path, name, target):
    """Block-diagonal attention (frames, windows) in the Triton kernels, multi-axis RoPE tables,
    the patch grid and the resampled positions in torch."""
    model, folder = grid_twins(name)
    feeds, wanted = grid_case(model, name)
    got = part_outputs(folder, "vision", target, tmp_path, **feeds)["image_features"]
    assert relative_error(got, wanted) <= 1e-4


def npu_twin(name: str, folder):
    """Qwen2.5-VL's and Qwen3-VL's twins with patches of 14, so the reference image (448 x 448)
    is 32 x 32 patches (Qwen2.5-VL's windows 2 x 2 merged blocks); Mistral-3's as the tests have it."""
    from tests.frontends import test_hf_mistral3, test_hf_qwen_vl as t
    from tests.frontends.test_hf_vlm import randomized

    if name == "mistral3":
        return test_hf_mistral3.build(name, folder)
    tower = dict(t.TOWERS[name], patch_size=14, **({"window_size": 56} if "window_size" in t.TOWERS[name] else {}))
    config_class, model_class = t.CLASSES[name]
    config = getattr(transformers, config_class)(text_config=t.TEXTS.get(name, t.TEXT), vision_config=tower,
                                                  image_token_id=t.IMAGE, video_token_id=t.VIDEO,
                                                  vision_start_token_id=t.START, vision_end_token_id=t.END)
    model = randomized(getattr(transformers, model_class)._from_config(config, attn_implementation="eager").eval(), 0)
    model.save_pretrained(folder)
    return model, str(folder)


@pytest.fixture(scope="module")
def npu_twins(tmp_path_factory):
    return built_once(npu_twin, tmp_path_factory)


@pytest.mark.parametrize("name", GRID_TOWERS)
def test_onnx_npu_fixes_a_tower_of_any_image_size_at_its_reference_image(npu_twins, tmp_path, name):
    """The contract takes one image of the reference size (Qwen: 448 x 448, its grid constant,
    no image_grid_thw input; Pixtral: the twin's 64 x 64): positions, frames, windows and the
    resampled learned grid fixed at compile time; the same features as transformers."""
    import onnxruntime as ort

    model, folder = npu_twins(name)
    out = tmp_path / "npu"
    assert main(["compile", folder, "--part", "vision", "--target", "onnx-npu", "--precision", "f32", "-o", str(out),
                 "--quiet"]) == 0
    contract = json.loads((out / "irc_npu.json").read_text())
    if name == "mistral3":
        from tests.frontends.test_hf_mistral3 import case
        pixels, _, wanted, _ = case(model, (64, 64))
    else:
        grid = np.array([[1, 32, 32]])
        pixels = np.random.default_rng(3).standard_normal((1024, 3 * 2 * 14 * 14)).astype(np.float32)
        with torch.no_grad():
            out_hf = model.model.visual(torch.from_numpy(pixels), grid_thw=torch.from_numpy(grid))
            wanted = torch.cat([out_hf.pooler_output, *(getattr(out_hf, "deepstack_features", None) or [])],
                               dim=-1).numpy()
    assert contract["inputs"] == [{"name": "pixel_values", "shape": list(pixels.shape), "dtype": "f32"}]
    session = ort.InferenceSession(str(out / "vision.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(["image_features"], {"pixel_values": pixels})
    assert relative_error(got, wanted) <= 1e-4


@pytest.mark.parametrize("target", ["numpy", "triton"])
@pytest.mark.parametrize("name", ["llava-clip", "gemma3", "paligemma", "qwen3_5"])
def test_a_vlms_decoder_alone(twins, grid_twins, tmp_path, name, target):
    """``--part decoder``: the decoder that takes image_features beside its ids (LLaVA's; Gemma 3's,
    whose image tokens see each other in the causal mask, and PaliGemma's prefix-LM mask;
    Qwen3.5's DeltaNet hybrid with 3-D positions), fed transformers' image features: its logits."""
    from backends.onnx.runtime import empty_caches
    from frontends import load_spec

    if name == "qwen3_5":
        from tests.frontends.test_hf_qwen_vl import GRIDS, decoder_feeds, pixels, prompt, reference
        model, folder = grid_twins(name)
        ids = prompt(1)
        features, logits = reference(model, ids, pixels(1), GRIDS[:1])
        feeds = decoder_feeds(load_spec(folder), ids, features, GRIDS[:1])
    else:
        from tests.frontends.test_hf_vlm import decoder_feeds, pixels, prompt, reference
        model, folder = twins(name)
        ids = prompt(model, 1)
        features, logits = reference(model, ids, pixels(model, 1))
        graph = load_spec(folder)
        feeds = {**decoder_feeds(graph, ids, features), **empty_caches(graph, 1)}
    got = part_outputs(folder, "decoder", target, tmp_path, **feeds)["logits"]
    assert relative_error(got, logits) <= 1e-4


def test_a_dual_encoders_text_tower_alone(tmp_path):
    from tests.frontends.test_hf_dual import build, reference, texts

    model, folder = build("clip", tmp_path / "clip")
    ids, mask = texts("clip")
    got = part_outputs(folder, "text", "numpy", tmp_path, input_ids=ids, attention_mask=mask)["text_embeds"]
    pixels = np.random.default_rng(7).standard_normal((3, 3, 16, 16)).astype(np.float32)
    assert relative_error(got, reference(model, ids, mask, pixels)[0]) <= 1e-5


def test_a_part_the_model_lacks_is_one_error(twins, tmp_path, capsys):
    _, folder = twins("llava-clip")
    assert main(["compile", folder, "--part", "text", "--target", "numpy", "-o", str(tmp_path / "m.py")]) == 2
    assert "--part text: this model has no text part (its parts: vision)" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    from tests.frontends.test_hf_dual import build
    _, dual = build("clip", tmp_path / "clip")
    assert main(["compile", str(dual), "--part", "decoder", "--target", "numpy", "-o", str(tmp_path / "d.py")]) == 2
    assert "--part decoder: this model is not a VLM" in capsys.readouterr().err and not (tmp_path / "d.py").exists()


@pytest.mark.parametrize("target", ["numpy", "triton"])
def test_llama_vision_tower_and_cross_attention_decoder(tmp_path_factory, tmp_path, target):
    """Llama-3.2-Vision's parts (``frontends.dsl_mllama``'s tiled tower, ``dsl_cross``'s
    gated cross-attention decoder) as the NumPy and Triton modules: transformers' features of
    two images and its logits over them."""
    from frontends import load_spec
    from tests.frontends.test_hf_mllama import IMAGE, SIZES, build, case, decoder_feeds, torch_inputs

    model, folder = built_once(build, tmp_path_factory)("mllama")
    inputs = case([1, IMAGE, 5, IMAGE, 6], SIZES[:2])
    with torch.no_grad():
        want = model(**torch_inputs(inputs)).logits.numpy()
        states = model.model.vision_model(*(torch.from_numpy(inputs[k]) for k in (
            "pixel_values", "aspect_ratio_ids", "aspect_ratio_mask"))).last_hidden_state
        features = model.model.multi_modal_projector(states).numpy()[0]
    features = features.reshape(len(features), -1, features.shape[-1])  # [images, tiles·tokens, d]
    got = part_outputs(folder, "vision", target, tmp_path, pixel_values=inputs["pixel_values"][0],
                       aspect_ratio_ids=inputs["aspect_ratio_ids"][0], aspect_ratio_mask=inputs["aspect_ratio_mask"][0])
    assert relative_error(got["image_features"], features) <= 1e-4
    feeds = decoder_feeds(load_spec(folder), inputs, features.reshape(1, -1, features.shape[-1]))
    assert relative_error(part_outputs(folder, "decoder", target, tmp_path, **feeds)["logits"], want) <= 1e-4
