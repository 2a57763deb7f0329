"""``softplus`` and ``xielu`` (irc.ops.activations): against torch's ``F.softplus`` and
transformers' ``XIELUActivation`` (its Python form, the one it runs on CPU), shape inference,
the ONNX lowering on both targets and onnx-npu's table, and the Triton fallback's torch line,
each against the reference."""
import numpy as np
import pytest

from irc import ops
from irc.build import emit
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Graph, Value
from irc.testing import run_op

X = np.concatenate([np.linspace(-30, 30, 61), np.linspace(-1e-3, 1e-3, 21), [-1e-6, -5e-7, 0.0, 25.0, -90.0]])
X = X.astype(np.float32).reshape(1, -1)
PARAMS = [((0.3,), (-0.4,), 0.5, -1e-6), ((-1.2,), (0.9,), 0.25, -1e-4), ((0.0,), (0.0,), 0.5, -1e-6)]


def xielu_inputs(params):
    alpha_p, alpha_n, beta, eps = params
    return [np.array(alpha_p, np.float32), np.array(alpha_n, np.float32), np.array(beta, np.float32),
            np.array(eps, np.float32)]


def test_softplus_matches_torch():
    torch = pytest.importorskip("torch")
    (got,) = run_op("softplus", [X])
    want = torch.nn.functional.softplus(torch.from_numpy(X)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("params", PARAMS)
def test_xielu_matches_transformers(params):
    torch = pytest.importorskip("torch")
    activations = pytest.importorskip("transformers.activations")
    module = activations.XIELUActivation(dtype=torch.float32)
    alpha_p, alpha_n, beta, eps = xielu_inputs(params)
    with torch.no_grad():
        module.alpha_p.copy_(torch.from_numpy(alpha_p))
        module.alpha_n.copy_(torch.from_numpy(alpha_n))
        module.beta.copy_(torch.from_numpy(beta))
        module.eps.copy_(torch.from_numpy(eps))
        want = module._xielu_python(torch.from_numpy(X)).numpy()
    (got,) = run_op("xielu", [X, alpha_p, alpha_n, beta, eps])
    assert got.dtype == np.float32 and got.shape == X.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shapes, message", [([(1,), (1,), (), (1,)], "eps must be"),
                                            ([(2,), (1,), (), ()], "alpha_p must be")])
def test_xielu_inference_refuses_other_parameter_shapes(shapes, message):
    inputs = [Value("x", DType.f32, ("B", 4))] + [Value(f"p{i}", DType.f32, s) for i, s in enumerate(shapes)]
    with pytest.raises(ShapeError, match=message):
        ops.infer("xielu", inputs, {})


def graph_of(op: str, params=None) -> Graph:
    g = Graph(op)
    x = g.add_input("x", DType.f32, ("B", "T"))
    inputs = [x]
    if params is not None:
        for name, value in zip(("alpha_p", "alpha_n", "beta", "eps"), xielu_inputs(params)):
            inputs.append(g.add_param(name, DType.f32, value.shape, data=value))
    g.outputs = emit(g, op, inputs, {}, ["y"])
    return g


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("op, params", [("softplus", None), ("xielu", PARAMS[0]), ("xielu", PARAMS[1])])
def test_onnx_equals_the_reference(tmp_path, target, op, params):
    ort = pytest.importorskip("onnxruntime")
    from backends.onnx.emit import emit_model
    from irc.interpreter import Interpreter

    graph = graph_of(op, params)
    path = str(tmp_path / "m.onnx")
    emit_model(graph, path, target=target, genai=False)
    (got,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": X})
    want = Interpreter(graph).run({"x": X})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-7)  # exp(m) - 1 for expm1: one f32 ulp near 1


def test_onnx_npu_lowers_both():
    from backends.onnx_npu.lower import LOWERINGS

    assert {"softplus", "xielu"} <= set(LOWERINGS)


@pytest.mark.parametrize("op, params", [("softplus", None), ("xielu", PARAMS[0]), ("xielu", PARAMS[1])])
def test_triton_fallback_line_equals_the_reference(op, params):
    torch = pytest.importorskip("torch")
    from backends.triton.fallback import HELPERS, fallback_line

    names = ["x"] + ([] if params is None else ["alpha_p", "alpha_n", "beta", "eps"])
    line, helpers = fallback_line(op, {}, names, [Value("y", DType.f32, X.shape)])
    namespace = {"torch": torch}
    for name in sorted(helpers):
        exec(HELPERS[name], namespace)
    arrays = [X] + ([] if params is None else xielu_inputs(params))
    got = eval(line, {**namespace, **{n: torch.from_numpy(a) for n, a in zip(names, arrays)}})
    (want,) = run_op(op, arrays)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)
