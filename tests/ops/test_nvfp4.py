"""``nvfp4_fake_quantize`` (irc.ops.nvfp4, Kolibri-1.1's NVFP4 rounding): the reference bitwise
equal to transformers' ``nvfp4_fake_quantize`` (random values over many scales, values on the
E2M1 grid's midpoints, block maxima whose scale falls midway between E4M3 values, normal and
subnormal), shape inference, the ONNX lowering on both targets and the Triton fallback's torch
line bitwise equal to the reference; onnx-npu has no lowering for it."""
import numpy as np
import pytest

from irc import ops
from irc.build import emit
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Graph, Value
from irc.ops.nvfp4 import nvfp4_round
from irc.testing import run_op

OP = "nvfp4_fake_quantize"


def samples() -> np.ndarray:
    """[8, 3, 64]: random blocks at scales 1e-6 .. 1e4, E2M1 midpoints, E4M3-midpoint scales."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((8, 3, 64)) * 10.0 ** rng.integers(-6, 5, (8, 3, 1))).astype(np.float32)
    x[0, 0] = rng.integers(-24, 25, 64) * np.float32(0.25)  # multiples of 0.25: every E2M1 midpoint at scale 1
    for row, bound in enumerate([1.0625, 1.1875, 1.5 * 2 ** -9, 2.5 * 2 ** -9, 13.0 * 2 ** -8]):
        block = rng.uniform(-1, 1, 64).astype(np.float32) * np.float32(bound * 6)
        block[::16] = np.float32(bound * 6)  # each block's max |x| / 6 exactly midway between two E4M3 values
        x[1 + row // 3, row % 3] = block
    return x


def test_reference_is_bitwise_transformers():
    torch = pytest.importorskip("torch")
    kolibri = pytest.importorskip("transformers.models.kolibri1_1.modeling_kolibri1_1")
    x = samples()
    want = kolibri.nvfp4_fake_quantize(torch.from_numpy(x)).numpy()
    (got,) = run_op(OP, [x], {})
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, x)


def test_infers_x_and_refuses_widths_off_the_block():
    out = ops.infer(OP, [Value("x", DType.f16, ("B", 4, 32))], {})
    assert out[0].dtype == DType.f16 and out[0].shape == ("B", 4, 32)
    with pytest.raises(ShapeError, match="multiple of 16"):
        ops.infer(OP, [Value("x", DType.f32, (2, 24))], {})


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_onnx_is_bitwise_the_reference(tmp_path, target):
    ort = pytest.importorskip("onnxruntime")
    from backends.onnx.emit import emit_model

    g = Graph(OP)
    x = g.add_input("x", DType.f32, ("B", 3, 64))
    g.outputs = emit(g, OP, [x], {}, ["y"])
    path = str(tmp_path / "m.onnx")
    emit_model(g, path, target=target, genai=False)
    (got,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": samples()})
    np.testing.assert_array_equal(got, nvfp4_round(samples()))


def test_triton_fallback_line_is_bitwise_the_reference():
    torch = pytest.importorskip("torch")
    from backends.triton.fallback import HELPERS, fallback_line

    line, helpers = fallback_line(OP, {}, ["x"], [Value("y", DType.f32, (8, 3, 64))])
    namespace = {"torch": torch}
    for name in sorted(helpers):
        exec(HELPERS[name], namespace)
    got = eval(line, {**namespace, "x": torch.from_numpy(samples())})
    np.testing.assert_array_equal(got.numpy(), nvfp4_round(samples()))
