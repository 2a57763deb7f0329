"""Cutting an ONNX model in two: each part runs, the head then the tail give what the whole
gives, graph inputs the tail still reads are added, external-data initializers are shared as
they are, and the result is the same bytes every time."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from backends.onnx.split import submodel

RNG = np.random.default_rng(0)
TABLE = RNG.standard_normal((10, 4)).astype(np.float32)
W = RNG.standard_normal((4, 3)).astype(np.float32)
X_INFO = {"x": helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 4])}


def model(extra_nodes=()):
    """ids [B, S] and feats [M, 4] in; out = Reshape((table[ids] + 1) @ W, Shape(ids) ++ [-1])
    and g = feats @ W out. The cut tensor x = table[ids] + 1 has no ValueInfo."""
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], name="gather"),
        helper.make_node("Add", ["emb", "one"], ["x"], name="add"),
        helper.make_node("MatMul", ["x", "W"], ["y"], name="matmul"),
        helper.make_node("Shape", ["ids"], ["ids_shape"], name="shape"),
        helper.make_node("Concat", ["ids_shape", "minus_one"], ["out_shape"], name="concat", axis=0),
        helper.make_node("Reshape", ["y", "out_shape"], ["out"], name="reshape"),
        helper.make_node("MatMul", ["feats", "W"], ["g"], name="feats_matmul"),
        *extra_nodes,
    ]
    inits = [numpy_helper.from_array(TABLE, "table"), numpy_helper.from_array(W, "W"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    graph = helper.make_graph(
        nodes, "toy",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", "S"]),
         helper.make_tensor_value_info("feats", TensorProto.FLOAT, ["M", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["B", "S", 3]),
         helper.make_tensor_value_info("g", TensorProto.FLOAT, ["M", 3])],
        initializer=inits, doc_string="a toy")
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="irc")
    m.ir_version = 8
    helper.set_model_props(m, {"k": "v"})
    if not extra_nodes:
        onnx.checker.check_model(m)
    return m


def run(m, feeds):
    source = m if isinstance(m, str) else m.SerializeToString()
    sess = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return dict(zip([o.name for o in sess.get_outputs()],
                    sess.run(None, {name: feeds[name] for name in names})))


FEEDS = {"ids": np.array([[1, 2, 3], [9, 0, 4]], np.int64),
         "feats": RNG.standard_normal((5, 4)).astype(np.float32)}


def test_head_runs():
    head = submodel(model(), ["ids"], ["x"], doc="head", value_info=X_INFO)
    onnx.checker.check_model(head)
    assert [i.name for i in head.graph.input] == ["ids"]
    assert [n.name for n in head.graph.node] == ["gather", "add"]
    assert sorted(t.name for t in head.graph.initializer) == ["one", "table"]
    assert head.graph.name == "toy/head" and head.graph.doc_string == "head"
    assert head.producer_name == "irc" and head.ir_version == 8
    assert [(p.key, p.value) for p in head.metadata_props] == [("k", "v")]
    np.testing.assert_allclose(run(head, FEEDS)["x"], TABLE[FEEDS["ids"]] + 1, rtol=1e-6)


def test_head_then_tail_is_the_whole():
    m = model()
    head = submodel(m, ["ids"], ["x"], value_info=X_INFO)
    tail = submodel(m, ["x"], ["out"], value_info=X_INFO)
    onnx.checker.check_model(tail)
    assert [i.name for i in tail.graph.input] == ["x", "ids"]
    assert [n.name for n in tail.graph.node] == ["matmul", "shape", "concat", "reshape"]
    assert sorted(t.name for t in tail.graph.initializer) == ["W", "minus_one"]
    x = run(head, FEEDS)["x"]
    whole = run(m, FEEDS)["out"]
    np.testing.assert_array_equal(run(tail, {**FEEDS, "x": x})["out"], whole)
    np.testing.assert_allclose(whole, (TABLE[FEEDS["ids"]] + 1) @ W, rtol=1e-5)


def test_external_data_is_shared(tmp_path):
    onnx.save(model(), str(tmp_path / "m.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="m.data", size_threshold=0)
    m = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    parts = {"head": submodel(m, ["ids"], ["x"], value_info=X_INFO),
             "tail": submodel(m, ["x"], ["out"], value_info=X_INFO)}
    source = {t.name: t for t in m.graph.initializer}
    for part in parts.values():
        for t in part.graph.initializer:
            assert t.data_location == TensorProto.EXTERNAL and not t.raw_data
            assert t.SerializeToString() == source[t.name].SerializeToString()
    for name, part in parts.items():
        with open(tmp_path / f"{name}.onnx", "wb") as f:
            f.write(part.SerializeToString())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["head.onnx", "m.data", "m.onnx", "tail.onnx"]
    x = run(str(tmp_path / "head.onnx"), FEEDS)["x"]
    out = run(str(tmp_path / "tail.onnx"), {**FEEDS, "x": x})["out"]
    np.testing.assert_array_equal(out, run(str(tmp_path / "m.onnx"), FEEDS)["out"])


def test_unknown_tensor_is_named():
    m = model([helper.make_node("Add", ["x", "ghost"], ["haunted"], name="haunt")])
    with pytest.raises(ValueError, match="'ghost'"):
        submodel(m, ["x"], ["haunted"], value_info=X_INFO)
    with pytest.raises(ValueError, match="'nowhere'"):
        submodel(model(), ["ids"], ["nowhere"])


def test_cut_without_value_info_is_an_error():
    with pytest.raises(ValueError, match="'x'"):
        submodel(model(), ["x"], ["out"])


def test_same_bytes_every_time():
    m = model()
    one = submodel(m, ["x"], ["out"], doc="tail", value_info=X_INFO)
    two = submodel(model(), ["x"], ["out"], doc="tail", value_info=X_INFO)
    assert one.SerializeToString(deterministic=True) == two.SerializeToString(deterministic=True)
    assert one.SerializeToString(deterministic=True) == one.SerializeToString(deterministic=True)
