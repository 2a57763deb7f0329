import pytest

from irc.build import emit1
from irc.dtypes import DType
from irc.errors import VerifyError
from irc.graph import Graph, Node, Value
from irc.verify import verify


def base():
    g = Graph("g")
    x = g.add_input("x", DType.f32, ["B", 8])
    w = g.add_param("w", DType.f32, [8, 8])
    y = emit1(g, "linear", [x, w], name="y")
    z = emit1(g, "silu", [y], name="z")
    g.outputs = [z]
    return g


def test_valid_graph_passes():
    verify(base())


def test_wrong_result_type_names_the_node():
    g = base()
    g.nodes[1].outputs[0].shape = ("B", 9)
    with pytest.raises(VerifyError, match=r"node %z \(silu\).*f32\[B,9\]"):
        verify(g)


def test_use_before_definition():
    g = base()
    g.nodes.reverse()
    with pytest.raises(VerifyError, match=r"%z.*used before it is defined"):
        verify(g)


def test_foreign_param():
    g = base()
    del g.params["w"]
    with pytest.raises(VerifyError, match="@w, which the graph does not hold"):
        verify(g)


def test_dangling_value_from_another_graph():
    g = base()
    stray = Value("stray", DType.f32, ["B", 8])
    g.nodes.append(Node("silu", [stray], [Value("s", DType.f32, ["B", 8])], {}))
    with pytest.raises(VerifyError, match="%stray"):
        verify(g)


def test_missing_attribute_defaults():
    g = base()
    g.nodes.append(Node("softmax", [g.nodes[1].outputs[0]], [Value("p", DType.f32, ["B", 8])], {}))
    with pytest.raises(VerifyError, match="not normalised"):
        verify(g)
