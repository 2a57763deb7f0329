"""patch_embed on every target that runs a graph: a ViT stem (pixel_values [B, 3, 8, 12],
patch 4 with bias, layer_norm, linear) through the NumPy module (the op's reference copied
in), both ONNX targets on ONNX Runtime (a Conv) and the Triton module in Triton's
interpreter (lower-patch-embed, in its default pipeline), each equal to the reference
interpreter within 1e-5 relative."""
from __future__ import annotations

from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import importlib.util  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import pytest  # noqa: E402

import passes  # noqa: E402,F401  (registers the passes)
from backends import get_target  # noqa: E402
from backends.numpy.emit import emit_module as emit_numpy  # noqa: E402
from backends.onnx.emit import emit_model  # noqa: E402
from backends.onnx.runtime import ort_engine  # noqa: E402
from irc.build import emit1  # noqa: E402
from irc.check import relative_error  # noqa: E402
from irc.dtypes import DType  # noqa: E402
from irc.errors import BackendError  # noqa: E402
from irc.graph import Graph  # noqa: E402
from irc.interpreter import random_feeds, run  # noqa: E402
from irc.passmanager import PassManager, parse_pipeline  # noqa: E402
from irc.weights import seed_absent  # noqa: E402

F32 = DType.f32
TOLERANCE = 1e-5
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="the optional triton extra")


def vit_stem() -> Graph:
    """pixel_values [B, 3, 8, 12] -> patch_embed {patch=4} (+ bias) -> layer_norm -> linear -> hidden [B, 6, 8]."""
    g = Graph("vit_stem")
    pixels = g.add_input("pixel_values", F32, ("B", 3, 8, 12))
    x = emit1(g, "patch_embed", [pixels, g.add_param("patch.weight", F32, (16, 3, 4, 4)),
                                 g.add_param("patch.bias", F32, (16,))], {"patch": 4}, "embeddings")
    x = emit1(g, "layer_norm", [x, g.add_param("pre.norm", F32, (16,)), g.add_param("pre.bias", F32, (16,))],
              {"eps": 1e-6}, "normed")
    g.outputs = [emit1(g, "linear", [x, g.add_param("proj.weight", F32, (8, 16)), g.add_param("proj.bias", F32, (8,))],
                       None, "hidden")]
    seed_absent(g)
    return g


def compiled(target: str, options=None) -> Graph:
    """The stem after ``target``'s whole default pipeline (prelude, pipeline, postlude)."""
    graph = vit_stem()
    spec = get_target(target)
    stages = (spec.prelude(options or {}), spec.pipeline(options or {}), spec.postlude(options or {}))
    PassManager(parse_pipeline(",".join(p for p in stages if p))).run(graph)
    return graph


def assert_matches_reference(outputs: dict, feeds: dict) -> None:
    expected = run(vit_stem(), feeds)
    assert set(outputs) == set(expected)
    for name, want in expected.items():
        error = relative_error(np.asarray(outputs[name], dtype=np.float32), want)
        assert error <= TOLERANCE, f"{name}: relative error {error:.2e}"


def load(path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_numpy_module(tmp_path):
    graph = compiled("numpy")
    assert "patch_embed" in {n.op for n in graph.nodes}  # the module runs the op's copied reference
    path = tmp_path / "vit_np.py"
    emit_numpy(graph, str(path))
    module = load(path, "vit_np")
    feeds = random_feeds(graph, batch=2)
    assert_matches_reference(module.forward(module.load_weights(), **feeds), feeds)


@pytest.mark.parametrize("opset", [23, 21])
@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_onnx_runtime(tmp_path, target, opset):
    graph = compiled(target, {"opset": opset})
    path = tmp_path / "vit.onnx"
    emit_model(graph, str(path), target=target, opset=opset)
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert "Conv" in {n.op_type for n in model.graph.node}
    shape = model.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in shape] == ["batch_size", 3, 8, 12]
    for batch in (1, 2):
        feeds = random_feeds(graph, batch=batch)
        assert_matches_reference(ort_engine(str(path))(feeds), feeds)


def test_onnx_fp16_computes_the_conv_in_f32(tmp_path):
    """--dtype f16: the Conv reads f32 (ORT's CPU provider has no fp16 Conv), the result is f16."""
    graph = compiled("onnx", {"dtype": "f16"})
    path = tmp_path / "vit16.onnx"
    emit_model(graph, str(path), target="onnx")
    feeds = {"pixel_values": random_feeds(graph, batch=2)["pixel_values"]}
    expected = run(graph, feeds)["hidden"].astype(np.float32)
    got = ort_engine(str(path))(feeds)["hidden"]
    assert got.dtype == np.float16 and relative_error(got.astype(np.float32), expected) <= 1e-2


@needs_triton
def test_triton_module(tmp_path):
    from backends.triton.emit import emit_module, load_module

    graph = compiled("triton")
    assert "patch_embed" not in {n.op for n in graph.nodes}  # lowered by the default pipeline
    path = tmp_path / "vit_tt.py"
    emit_module(graph, str(path), source="test")
    module = load_module(str(path))
    feeds = random_feeds(graph, batch=2)
    outputs = module.forward(module.load_weights(), **feeds)
    assert_matches_reference({name: value.cpu().float().numpy() for name, value in outputs.items()}, feeds)


@needs_triton
def test_triton_names_the_pass_when_patch_embed_is_left(tmp_path):
    from backends.triton.emit import emit_module

    with pytest.raises(BackendError, match="patch_embed") as info:
        emit_module(vit_stem(), str(tmp_path / "m.py"))
    assert "lower-patch-embed" in str(info.value) and "node %" in str(info.value)
    assert list(tmp_path.iterdir()) == []
