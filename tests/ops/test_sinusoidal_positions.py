"""``sinusoidal_positions`` (irc.ops.positions, XGLM's fairseq positions): against transformers'
``XGLMSinusoidalPositionalEmbedding`` (its table, its forward on position ids, the grown table
past ``max_position_embeddings``, an odd width and the zeroed padding row), shape inference and
cost, the ONNX lowering on both targets and the Triton fallback's torch line, each against the
reference."""
import numpy as np
import pytest

from irc import ops
from irc.build import emit
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Graph, Value
from irc.ops.registry import TensorType
from irc.ops.positions import sinusoidal_rows
from irc.testing import run_op

OP = "sinusoidal_positions"


def hf_module(positions: int, dim: int, padding_idx):
    pytest.importorskip("torch")
    xglm = pytest.importorskip("transformers.models.xglm.modeling_xglm")
    return xglm.XGLMSinusoidalPositionalEmbedding(positions, dim, padding_idx)


@pytest.mark.parametrize("dim, padding_idx", [(32, 1), (48, None), (9, 5), (4, 0)])
def test_table_matches_transformers(dim, padding_idx):
    module = hf_module(64, dim, padding_idx)
    want = module.weights.numpy()
    got = sinusoidal_rows(np.arange(want.shape[0]), dim, padding_idx)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
    if padding_idx is not None:
        assert not got[padding_idx].any()


@pytest.mark.parametrize("dim, padding_idx, past", [(32, 1, 0), (16, 4, 3), (7, None, 0), (32, 1, 100)])
def test_forward_on_position_ids_matches_transformers(dim, padding_idx, past):
    torch = pytest.importorskip("torch")
    module = hf_module(16, dim, padding_idx)  # past 100: transformers grows its table
    positions = past + np.array([[0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 1, 2]], np.int64)
    with torch.no_grad():
        want = module(torch.from_numpy(positions), cache_length=past).numpy()
    (got,) = run_op(OP, [positions], {"dim": dim, "offset": 2, "padding_idx": padding_idx})
    assert got.dtype == np.float32 and got.shape == (2, 6, dim)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


def test_layout_is_sines_then_cosines():
    (got,) = run_op(OP, [np.array([[1]], np.int64)], {"dim": 8})
    frequencies = np.exp(-np.arange(4) * np.log(10000) / 3)
    np.testing.assert_allclose(got[0, 0], np.concatenate([np.sin(frequencies), np.cos(frequencies)]), atol=1e-6)


@pytest.mark.parametrize("dtype, attrs, message", [
    (DType.f32, {"dim": 8}, "integers"), (DType.i64, {"dim": 3}, "dim must be an int >= 4"),
    (DType.i64, {"dim": 8, "padding_idx": 1.5}, "padding_idx"), (DType.i64, {"dim": 8, "offset": True}, "offset")])
def test_inference_refuses(dtype, attrs, message):
    with pytest.raises(ShapeError, match=message):
        ops.infer(OP, [Value("p", dtype, ("B", "T"))], ops.get_op(OP).normalize_attrs(attrs))


def test_infers_f32_rows_and_costs_one_operation_per_element():
    positions = TensorType(DType.i64, (2, 3))
    attrs = ops.get_op(OP).normalize_attrs({"dim": 8, "offset": 2})
    out = ops.infer(OP, [positions], attrs)
    assert out == [TensorType(DType.f32, (2, 3, 8))]
    cost = ops.get_op(OP).cost([positions], out, attrs)
    assert cost.other_flops == 48 and cost.bytes_read == 48 and cost.bytes_written == 192


def positions_graph(attrs: dict) -> Graph:
    g = Graph(OP)
    positions = g.add_input("position_ids", DType.i64, ("B", "T"))
    g.outputs = emit(g, OP, [positions], attrs, ["table"])
    return g


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("attrs", [{"dim": 32, "offset": 2, "padding_idx": 5}, {"dim": 9, "offset": 0},
                                   {"dim": 16, "offset": 2, "padding_idx": 1}])
def test_onnx_equals_the_reference(tmp_path, target, attrs):
    ort = pytest.importorskip("onnxruntime")
    from backends.onnx.emit import emit_model
    from irc.interpreter import Interpreter

    graph = positions_graph(attrs)
    path = str(tmp_path / "m.onnx")
    emit_model(graph, path, target=target, genai=False)
    feeds = {"position_ids": np.array([[0, 1, 2, 3, 4, 3000], [0, 0, 0, 0, 1, 2]], np.int64)}
    (got,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got, Interpreter(graph).run(feeds)["table"], rtol=0, atol=2e-5)


@pytest.mark.parametrize("attrs", [{"dim": 32, "offset": 2, "padding_idx": 5}, {"dim": 9, "offset": 0,
                                                                                "padding_idx": None}])
def test_triton_fallback_line_equals_the_reference(attrs):
    torch = pytest.importorskip("torch")
    from backends.triton.fallback import HELPERS, fallback_line

    line, helpers = fallback_line(OP, attrs, ["p"], [Value("table", DType.f32, (2, 6, attrs["dim"]))])
    namespace = {"torch": torch}
    for name in sorted(helpers):
        exec(HELPERS[name], namespace)
    positions = np.array([[0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 1, 2]], np.int64)
    got = eval(line, {**namespace, "p": torch.from_numpy(positions)})
    want = sinusoidal_rows(positions + attrs["offset"], attrs["dim"], attrs["padding_idx"])
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=2e-6)
