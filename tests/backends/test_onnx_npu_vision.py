"""--target onnx-npu on image encoders (the tiny CLIP, DINOv2 and SigLIP twins): one
static-shape ``vision.onnx`` over ``model.data`` and ``irc_npu.json``; on ONNX Runtime's CPU
provider a random pixel_values [1, C, H, W] gives the reference interpreter's outputs (f32
within 1e-4 relative, fp16 within 5e-3: 7e-4 measured, w8a16 within 5e-2: 1.7e-2 measured);
the same spec gives the same bytes; w8a16 calibrates on pixel values from a .npy file and
refuses anything else naming the option; where onnxruntime-qnn is installed the HTP places
every node for soc_model 60 and 69 with CPU fallback disabled."""
import json

import numpy as np
import pytest

from frontends import load_spec
from irc.check import relative_error
from irc.interpreter import run
from irc_cli.commands import main

VISION = ["examples/tiny-clip-vit-large-patch14-336.yaml", "examples/tiny-dinov2-large.yaml",
          "examples/tiny-siglip-so400m-patch14-384.yaml"]
TOLERANCE = {"f32": 1e-4, "fp16": 5e-3, "w8a16": 5e-2}


def compile_vision(spec, folder, *extra):
    assert main(["compile", spec, "--target", "onnx-npu", "-o", str(folder), "--quiet", *extra]) == 0
    return folder


def pixels(graph, seed=0, count=1):
    meta = graph.meta["vision"]
    height, width = meta["image_size"]
    return np.random.default_rng(seed).standard_normal((count, meta["channels"], height, width)).astype(np.float32)


def assert_matches_interpreter(spec, folder, precision):
    import onnxruntime as ort

    graph = load_spec(spec)
    x = pixels(graph)
    expected = run(graph, {"pixel_values": x})
    contract = json.loads((folder / "irc_npu.json").read_text())
    (entry,) = contract["inputs"]
    session = ort.InferenceSession(str(folder / "vision.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {"pixel_values": x.astype(np.float16 if entry["dtype"] == "f16" else np.float32)})
    names = [o["name"] for o in contract["outputs"]]
    assert names == [o.name for o in session.get_outputs()] == ["last_hidden_state", "pooler_output"]
    for name, array in zip(names, got):
        assert relative_error(array, expected[name]) < TOLERANCE[precision], (spec, precision, name)


@pytest.mark.parametrize("precision", ["f32", "fp16"])
@pytest.mark.parametrize("spec", VISION)
def test_vision_folder_matches_interpreter(spec, precision, tmp_path):
    folder = compile_vision(spec, tmp_path / "v", "--precision", precision)
    assert sorted(p.name for p in folder.iterdir()) == ["irc_npu.json", "model.data", "vision.onnx"]
    contract = json.loads((folder / "irc_npu.json").read_text())
    meta = load_spec(spec).meta["vision"]
    assert contract["kind"] == "vision" and contract["graphs"] == {"vision": "vision.onnx"}
    assert contract["inputs"] == [{"name": "pixel_values", "shape": [1, meta["channels"], *meta["image_size"]],
                                   "dtype": "f16" if precision == "fp16" else "f32"}]
    assert [o["shape"] for o in contract["outputs"]] == [[1, meta["tokens"], 32], [1, 32]]
    assert contract["vision"] == meta and contract["precision"] == precision
    assert_matches_interpreter(spec, folder, precision)


def test_vision_graph_is_static_and_htp_shaped(tmp_path):
    import onnx

    folder = compile_vision(VISION[0], tmp_path / "v")
    model = onnx.load(str(folder / "vision.onnx"), load_external_data=False)
    ops = {n.op_type for n in model.graph.node}
    assert not ops & {"Shape", "Range", "Conv", "LayerNormalization", "Gelu", "Attention", "If", "Loop"}
    assert {"MatMul", "Softmax", "Transpose", "Reshape"} <= ops
    for value in [*model.graph.input, *model.graph.output]:
        assert all(d.HasField("dim_value") for d in value.type.tensor_type.shape.dim), value.name


@pytest.mark.parametrize("spec", VISION)
def test_vision_folder_is_deterministic(spec, tmp_path):
    first = compile_vision(spec, tmp_path / "a")
    second = compile_vision(spec, tmp_path / "b")
    for name in ("vision.onnx", "model.data", "irc_npu.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_vision_w8a16_calibrates_on_pixel_values(tmp_path):
    spec = VISION[2]  # SigLIP: its pooling head's linear layers are quantized too
    images = tmp_path / "calibration.npy"
    np.save(images, pixels(load_spec(spec), seed=1, count=3))
    folder = compile_vision(spec, tmp_path / "q", "--precision", "w8a16", "--calibration", str(images))
    contract = json.loads((folder / "irc_npu.json").read_text())
    assert contract["calibration"]["images"] == 3 and contract["calibration"]["quantized_weights"] > 0
    assert contract["inputs"][0]["dtype"] == "f32"
    assert_matches_interpreter(spec, folder, "w8a16")


def test_vision_calibration_must_be_pixel_values(tmp_path, capsys):
    text = tmp_path / "calibration.txt"
    text.write_text("1, 2, 3\n" * 10)
    code = main(["compile", VISION[0], "--target", "onnx-npu", "-o", str(tmp_path / "q"), "--quiet",
                 "--precision", "w8a16", "--calibration", str(text)])
    assert code == 2 and "--calibration IMAGES.npy" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((2, 3, 8, 8), np.float32))
    code = main(["compile", VISION[0], "--target", "onnx-npu", "-o", str(tmp_path / "q"), "--quiet",
                 "--precision", "w8a16", "--calibration", str(wrong)])
    assert code == 2 and "[2, 3, 8, 8]" in capsys.readouterr().err


@pytest.mark.parametrize("spec", VISION)
def test_vision_graph_compiles_entirely_on_the_htp(spec, tmp_path):
    """fp16 for soc 60 and 69 (f32 and w8a16 placed whole too when measured; one each here)."""
    pytest.importorskip("onnxruntime_qnn")
    from backends.onnx_npu import qnn
    from test_onnx_npu_qnn import assert_all_on_htp

    folder = compile_vision(spec, tmp_path / "v")
    path = str(folder / "vision.onnx")
    for soc in (60, 69):
        assert_all_on_htp(qnn.compile_htp(path, soc, out=str(tmp_path / f"vision_{soc}_ctx.onnx")), path)
    if spec == VISION[0]:
        images = tmp_path / "calibration.npy"
        np.save(images, pixels(load_spec(spec), seed=1, count=2))
        for precision, soc in (("f32", 60), ("w8a16", 69)):
            other = compile_vision(spec, tmp_path / precision, "--precision", precision,
                                   *(["--calibration", str(images)] if precision == "w8a16" else []))
            path = str(other / "vision.onnx")
            assert_all_on_htp(qnn.compile_htp(path, soc, out=str(tmp_path / f"{precision}_ctx.onnx")), path)
