import numpy as np
import pytest

from irc.build import emit1
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Graph


def small():
    g = Graph("g")
    x = g.add_input("x", DType.f32, ["B", "T", 8])
    w = g.add_param("w", DType.f32, [8, 8])
    a = emit1(g, "linear", [x, w], name="a")
    b = emit1(g, "add", [a, x], name="b")
    g.outputs = [b]
    return g, x, w, a, b


def test_names_are_deterministic_and_suffixed():
    g, x, *_ = small()
    v1 = emit1(g, "silu", [x], name="a")
    v2 = emit1(g, "silu", [x], name="a")
    assert (v1.name, v2.name) == ("a_1", "a_2")


def test_use_lists_and_replace_all_uses():
    g, x, w, a, b = small()
    assert [n.op for n in g.users(x)] == ["linear", "add"]
    c = emit1(g, "silu", [x], name="c")
    g.replace_all_uses(a, c)
    assert b.producer.inputs[0] is c and not a.uses
    g.remove(a.producer)
    assert [n.op for n in g.nodes] == ["add", "silu"]


def test_remove_refuses_used_node():
    g, x, w, a, b = small()
    with pytest.raises(ValueError, match="still used"):
        g.remove(a.producer)


def test_clone_is_deep_for_structure():
    g, *_ = small()
    h = g.clone()
    assert [n.op for n in h.nodes] == [n.op for n in g.nodes]
    assert h.nodes[0] is not g.nodes[0] and h.params["w"] is not g.params["w"]
    assert h.outputs[0].producer is h.nodes[-1]


def test_inference_errors_name_the_value():
    g = Graph("g")
    x = g.add_input("x", DType.f32, ["B", 8])
    w = g.add_param("w", DType.f32, [4, 6])
    with pytest.raises(ShapeError, match="proj.*expects 6 input features"):
        emit1(g, "linear", [x, w], name="proj")


def test_param_sizes_pack_int4():
    g = Graph("g")
    p = g.add_param("q", DType.i4, [4, 8])
    assert p.numel == 32 and p.nbytes == 16
    assert DType.bf16.numpy.itemsize == 2
    assert DType.of(np.zeros(1, np.float16)) is DType.f16
