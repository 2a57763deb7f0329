"""``resize_positions`` (SigLIP 2's NaFlex position grid resized to each image) against torch:
the reference equals ``F.interpolate(mode="bilinear", align_corners=False, antialias=True)`` on
random grids, down (the antialiased triangle widened), up, mixed and to one row; equals
transformers 5.25's ``Siglip2VisionEmbeddings.resize_positional_embeddings`` (the padding rows
taking position 0) on a batch; and every target that runs it (the NumPy module, both ONNX
targets on ONNX Runtime, the Triton module's torch fallback in Triton's interpreter) gives the
reference's rows from one graph for any image sizes.

torch 2.13's antialiased ``F.interpolate`` is wrong when the output is one column wide and the
height changes (every output row comes out equal); transformers 5.25 writes the weights itself
and so does irc. Those sizes are held against torch on the transposed grid (one row wide, which
torch gets right) and against transformers."""
from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import importlib.util  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from backends.numpy.emit import emit_module  # noqa: E402
from backends.onnx.emit import emit_model  # noqa: E402
from backends.onnx.runtime import ort_engine  # noqa: E402
from irc.build import emit1  # noqa: E402
from irc.dtypes import DType  # noqa: E402
from irc.graph import Graph  # noqa: E402
from irc.interpreter import run  # noqa: E402
from irc.ops.vision import antialiased_bilinear, resize_positions  # noqa: E402

torch = pytest.importorskip("torch")

WIDTH = 7
SIZES = [(1, 1), (1, 9), (1, 3), (2, 3), (3, 7), (4, 4), (9, 2), (16, 16), (20, 5), (5, 20), (11, 13)]
ONE_COLUMN = [(2, 1), (3, 1), (7, 1), (16, 1)]  # torch's antialiased F.interpolate is wrong here


def table(side: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((side * side, WIDTH)).astype(np.float32)


def interpolated(grid: np.ndarray, side: int, height: int, width: int, transposed: bool = False) -> np.ndarray:
    """torch's antialiased bilinear resize of the side x side grid [S·S, WIDTH] to [h·w, WIDTH]."""
    image = torch.from_numpy(grid).reshape(side, side, WIDTH).permute(2, 0, 1)[None]
    if transposed:
        image = image.transpose(-1, -2)
    size = (width, height) if transposed else (height, width)
    out = torch.nn.functional.interpolate(image, size=size, mode="bilinear", align_corners=False, antialias=True)[0]
    if transposed:
        out = out.transpose(-1, -2)
    return out.permute(1, 2, 0).reshape(height * width, WIDTH).numpy()


@pytest.mark.parametrize("side", [4, 5, 16])
@pytest.mark.parametrize("height, width", SIZES)
def test_the_reference_is_torchs_antialiased_bilinear(side, height, width):
    grid = table(side)
    got = resize_positions(grid, [[height, width]], height * width + 3, side)[0]
    np.testing.assert_allclose(got[:height * width], interpolated(grid, side, height, width), rtol=1e-5, atol=2e-6)
    np.testing.assert_array_equal(got[height * width:], np.repeat(got[:1], 3, axis=0))


@pytest.mark.parametrize("side", [4, 5])
@pytest.mark.parametrize("height, width", ONE_COLUMN)
def test_one_column_is_torch_on_the_transposed_grid(side, height, width):
    grid = table(side)
    got = resize_positions(grid, [[height, width]], height * width, side)[0]
    np.testing.assert_allclose(got, interpolated(grid, side, height, width, transposed=True), rtol=1e-5, atol=2e-6)
    if height != side:  # the torch bug the module docstring names: one column, every row equal
        wrong = interpolated(grid, side, height, width)
        assert np.allclose(wrong, wrong[:1]) and not np.allclose(got, got[:1])


def test_the_weights_shrink_with_a_widened_triangle_and_sum_to_one():
    down, up = antialiased_bilinear(4, 1), antialiased_bilinear(2, 4)
    np.testing.assert_allclose(down, [[5 / 24, 7 / 24, 7 / 24, 5 / 24]])  # 1 - |j - 1.5| / 4, normalised
    np.testing.assert_allclose(up, [[1, 0], [0.75, 0.25], [0.25, 0.75], [0, 1]])
    for old, new in ((16, 3), (3, 16), (7, 7), (5, 1)):
        np.testing.assert_allclose(antialiased_bilinear(old, new).sum(axis=1), 1.0)


BATCH = np.array([[2, 3], [6, 4], [1, 9], [7, 1]])  # down, up, one row, one column: 6, 24, 9, 7 of 24


def test_a_batch_is_transformers_resize_positional_embeddings():
    from transformers.models.siglip2.modeling_siglip2 import Siglip2VisionEmbeddings

    side, length = 4, 24
    grid = table(side, 1)
    want = Siglip2VisionEmbeddings.resize_positional_embeddings(
        torch.from_numpy(grid).reshape(side, side, WIDTH), torch.from_numpy(BATCH), length).numpy()
    np.testing.assert_allclose(resize_positions(grid, BATCH, length, side), want, rtol=1e-5, atol=2e-6)


def test_an_image_over_its_row_is_refused():
    with pytest.raises(ValueError, match="image 1 is 5 x 5 patches, not 1 to 24"):
        resize_positions(table(4), [[2, 3], [5, 5]], 24, 4)
    with pytest.raises(ValueError, match="image 0 is 0 x 3 patches"):
        resize_positions(table(4), [[0, 3]], 24, 4)


def resize_graph(side: int) -> Graph:
    g = Graph("naflex-positions")
    positions = g.add_input("table", DType.f32, (side * side, WIDTH))
    shapes = g.add_input("spatial_shapes", DType.i64, ("B", 2))
    pixels = g.add_input("pixel_values", DType.f32, ("B", "L", 5))
    g.outputs = [emit1(g, "resize_positions", [positions, shapes, pixels], {"side": side}, "positions")]
    return g


def load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def target_outputs(graph: Graph, feeds: dict, target: str, tmp_path) -> np.ndarray:
    """``positions`` from ``graph`` compiled for ``target`` and run on ``feeds``."""
    if target in ("onnx", "onnx-ort"):
        emit_model(graph, str(tmp_path / f"{target}.onnx"), target=target, genai=False)
        return ort_engine(str(tmp_path / f"{target}.onnx"))(feeds)["positions"]
    if target == "triton":
        pytest.importorskip("triton")
        from backends.triton.emit import emit_module as emit_triton
        emit_triton(graph, str(tmp_path / "positions_tt.py"))
    else:
        emit_module(graph, str(tmp_path / "positions_tt.py"))
    module = load(tmp_path / "positions_tt.py")
    got = module.forward(module.load_weights(), **feeds)["positions"]
    return got if isinstance(got, np.ndarray) else got.cpu().numpy()


@pytest.mark.parametrize("target", ["numpy", "onnx", "onnx-ort", "triton"])
@pytest.mark.parametrize("length", [24, 30])
def test_every_target_resizes_from_the_runtime_sizes(tmp_path, length, target):
    """One graph (L a symbol), two row lengths: the NumPy module, onnx, onnx-ort and the Triton
    module (its torch fallback) give the reference's rows."""
    side = 4
    graph = resize_graph(side)
    feeds = {"table": table(side, 2), "spatial_shapes": BATCH,
             "pixel_values": np.zeros((len(BATCH), length, 5), np.float32)}
    want = run(graph, feeds)["positions"]
    np.testing.assert_allclose(want, resize_positions(feeds["table"], BATCH, length, side))
    np.testing.assert_allclose(target_outputs(graph, feeds, target, tmp_path), want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("table_shape, shapes_type, message", [
    ((15, WIDTH), DType.i64, r"table must be float \[16, d\]"),
    ((16, WIDTH), DType.f32, r"shapes must be integer \[B, 2\]"),
])
def test_shape_inference_names_the_operand(table_shape, shapes_type, message):
    from irc.errors import ShapeError

    g = Graph("bad")
    operands = [g.add_input("table", DType.f32, table_shape), g.add_input("spatial_shapes", shapes_type, ("B", 2)),
                g.add_input("pixel_values", DType.f32, ("B", "L", 5))]
    with pytest.raises(ShapeError, match=message):
        emit1(g, "resize_positions", operands, {"side": 4}, "positions")
