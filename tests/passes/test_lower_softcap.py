"""lower-softcap: softcap -> div, tanh, mul by one constant cap."""
from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph
from irc.testing import apply_pass, assert_pass, assert_unchanged
from passes.lower_softcap import LowerSoftcap

F32 = DType.f32


def softcap_graph() -> Graph:
    """Gemma 2 style: attention-logit cap 50 inside, final logit cap 30 on the output."""
    g = Graph("softcap")
    x = g.add_input("x", F32, ("B", "T", 8))
    inner = emit1(g, "softcap", [emit1(g, "mul", [x, x], name="scores")], {"cap": 50.0}, "capped")
    g.outputs = [emit1(g, "softcap", [inner], {"cap": 30.0}, "logits")]
    return g


def test_lower_softcap():
    assert assert_pass(LowerSoftcap(), softcap_graph(), golden="lower-softcap")
    after, _ = apply_pass(LowerSoftcap(), softcap_graph())
    assert after.outputs[0].name == "logits" and after.outputs[0].producer.op == "mul"


def test_lower_softcap_refuses_integer_activation():
    g = Graph("ints")
    x = g.add_input("x", DType.i64, ("B", 8))
    g.outputs = [emit1(g, "softcap", [x], {"cap": 5.0}, "y")]
    assert_unchanged(LowerSoftcap(), g)


def test_lower_softcap_without_softcap():
    g = Graph("none")
    x = g.add_input("x", F32, ("B", 8))
    g.outputs = [emit1(g, "tanh", [x], name="y")]
    assert_unchanged(LowerSoftcap(), g)
