"""The image encoders' tiny examples (CLIP ViT-L/14-336, DINOv2-L, SigLIP-so400m twins, seeded
weights) through every target that takes them, against the reference interpreter on a batch of
two random images: both ONNX targets in ONNX Runtime and the NumPy module within 1e-5, the
Triton module in Triton's interpreter within 1e-4 (onnx-npu's vision graph:
test_onnx_npu_vision.py; npu-tile's image plans: test_npu_vision.py)."""
from __future__ import annotations

from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from frontends import load_spec  # noqa: E402
from irc.check import relative_error  # noqa: E402
from irc.interpreter import run  # noqa: E402
from irc_cli import main  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VISION = ["clip-vit-large-patch14-336", "dinov2-large", "siglip-so400m-patch14-384"]


def images(graph) -> dict:
    channels = graph.meta["vision"]["channels"]
    height, width = graph.meta["vision"]["image_size"]
    pixels = np.random.default_rng(5).standard_normal((2, channels, height, width)).astype(np.float32)
    return {"pixel_values": pixels}


def assert_close(got: dict, want: dict, tolerance: float) -> None:
    assert sorted(got) == sorted(want) == ["last_hidden_state", "pooler_output"]
    for name, expected in want.items():
        actual = got[name]
        actual = actual if isinstance(actual, np.ndarray) else actual.cpu().float().numpy()
        assert relative_error(actual, expected) <= tolerance, name


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", VISION)
def test_onnx_targets(name, target, tmp_path, capsys):
    from backends.onnx import runtime

    spec = str(EXAMPLES / f"tiny-{name}.yaml")
    graph = load_spec(spec)
    feeds = images(graph)
    path = tmp_path / "model.onnx"
    assert main(["compile", spec, "--target", target, "-o", str(path)]) == 0
    capsys.readouterr()
    assert_close(runtime.ort_engine(str(path))(feeds), run(graph, feeds), 1e-5)


@pytest.mark.parametrize("name", VISION)
def test_numpy_module(name, tmp_path, capsys):
    import importlib.util

    spec = str(EXAMPLES / f"tiny-{name}.yaml")
    graph = load_spec(spec)
    feeds = images(graph)
    path = tmp_path / "vision_np.py"
    assert main(["compile", spec, "--target", "numpy", "-o", str(path)]) == 0
    capsys.readouterr()
    loader = importlib.util.spec_from_file_location("vision_np", path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    assert_close(module.forward(module.load_weights(), **feeds), run(graph, feeds), 1e-5)


@pytest.mark.parametrize("name", VISION)
def test_triton_module(name, tmp_path):
    pytest.importorskip("triton")
    from tests.backends.test_triton_models import compile_example

    graph, module = compile_example(name, tmp_path)
    feeds = images(graph)
    assert_close(module.forward(module.load_weights(), **feeds), run(graph, feeds), 1e-4)
