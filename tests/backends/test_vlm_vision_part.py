"""``irc compile VLM --part vision`` on the targets that write one model: a VLM's vision model
(tower, feature selection and projector: LLaVA's CLIP tower with the class token dropped,
Gemma 3's pooled SigLIP, PaliGemma's linear projector) alone, as the NumPy module (within 1e-5),
the Triton module in Triton's interpreter (1e-4) and onnx-npu's static vision graph on ONNX
Runtime's CPU provider (1e-4), against transformers' ``get_image_features``; a dual encoder's
text tower with ``--part text``; a part the model lacks is one error."""
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


@pytest.mark.parametrize("name", NAMES)
def test_numpy_module(twins, tmp_path, name):
    model, folder = twins(name)
    path = tmp_path / "vision_np.py"
    assert main(["compile", folder, "--part", "vision", "--target", "numpy", "-o", str(path), "--quiet"]) == 0
    module = load(path)
    pixels = one_image(model)
    got = module.forward(module.load_weights(), pixel_values=pixels)["image_features"]
    assert relative_error(got, want(model, pixels)) <= 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_triton_module(twins, tmp_path, name):
    pytest.importorskip("triton")
    model, folder = twins(name)
    path = tmp_path / "vision_tt.py"
    assert main(["compile", folder, "--part", "vision", "--target", "triton", "-o", str(path), "--quiet"]) == 0
    module = load(path)
    pixels = one_image(model)
    got = module.forward(module.load_weights(), pixel_values=pixels)["image_features"]
    got = got if isinstance(got, np.ndarray) else got.cpu().float().numpy()
    assert relative_error(got, want(model, pixels)) <= 1e-4


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


def test_a_dual_encoders_text_tower_alone(tmp_path):
    from tests.frontends.test_hf_dual import build, reference, texts

    model, folder = build("clip", tmp_path / "clip")
    path = tmp_path / "text_np.py"
    assert main(["compile", str(folder), "--part", "text", "--target", "numpy", "-o", str(path), "--quiet"]) == 0
    module = load(path)
    ids, mask = texts("clip")
    got = module.forward(module.load_weights(), input_ids=ids, attention_mask=mask)["text_embeds"]
    pixels = np.random.default_rng(7).standard_normal((3, 3, 16, 16)).astype(np.float32)
    assert relative_error(got, reference(model, ids, mask, pixels)[0]) <= 1e-5


def test_a_part_the_model_lacks_is_one_error(twins, tmp_path, capsys):
    _, folder = twins("llava-clip")
    assert main(["compile", folder, "--part", "text", "--target", "numpy", "-o", str(tmp_path / "m.py")]) == 2
    assert "--part text: this model has no text part (its parts: vision)" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
