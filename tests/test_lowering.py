"""irc.rewrite.lowering: the Emitter's naming rule and the LoweringPass walk (replace, refuse
with a note the user sees, pass by), with the changed flag held both ways."""
import io

import pytest

from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph
from irc.passmanager import Pass, PassManager
from irc.printer import print_graph
from irc.rewrite.lowering import Emitter, LoweringPass
from irc.testing import apply_pass, assert_pass, assert_unchanged
from irc.weights import seed_absent
from passes.fold import Fold
from passes.lower_linear import LowerLinear
from passes.lower_softcap import LowerSoftcap

F32 = DType.f32


def norm_graph() -> Graph:
    """Two rms_norms and a linear: x[B,T,8] -> %h (norm) -> %y (linear) -> %out (norm)."""
    g = Graph("norms")
    x = g.add_input("x", F32, ("B", "T", 8))
    h = emit1(g, "rms_norm", [x, g.add_param("n1", F32, (8,))], {"eps": 1e-5}, "h")
    y = emit1(g, "linear", [h, g.add_param("w", F32, (8, 8))], None, "y")
    g.outputs = [emit1(g, "rms_norm", [y, g.add_param("n2", F32, (8,))], {"eps": 1e-5}, "out")]
    return g


def square_norm(e: Emitter, node):
    """rms_norm -> x * x (not its meaning: the walk is under test, not the math); refuses %out."""
    if node.outputs[0].name == "out":
        return "the output norm stays"
    return e("mul", [node.inputs[0], node.inputs[0]])


class SquareNorms(LoweringPass):
    """Test-only: rewrites every rms_norm but the last, which it refuses."""
    name = "test-square-norms"
    lowerings = {"rms_norm": square_norm}


def refuse(e: Emitter, node):
    return f"eps {node.attrs['eps']} is not to my taste"


def pass_by(e: Emitter, node):
    return None


def no_values(e: Emitter, node):
    return []


class RefuseAll(LoweringPass):
    """Test-only: refuses every rms_norm."""
    name = "test-refuse-all"
    lowerings = {"rms_norm": refuse}


class PassBy(LoweringPass):
    """Test-only: every rms_norm is none of its business."""
    name = "test-pass-by"
    lowerings = {"rms_norm": pass_by}


def test_a_refusal_shows_in_print_after_change_even_when_nothing_changed():
    out = io.StringIO()
    PassManager([RefuseAll()], print_after_change=True, out=out).run(norm_graph())
    assert out.getvalue() == ("# test-refuse-all: left rms_norm %h: eps 1e-05 is not to my taste\n"
                              "# test-refuse-all: left rms_norm %out: eps 1e-05 is not to my taste\n")


def test_a_refusal_shows_beside_the_rewritten_region():
    out = io.StringIO()
    manager = PassManager([SquareNorms()], print_after_change=True, out=out)
    manager.run(norm_graph())
    text = out.getvalue()
    assert "# ----- after test-square-norms (changed) -----" in text
    assert "+  %h = mul %x, %x" in text
    assert text.endswith("# test-square-norms: left rms_norm %out: the output norm stays\n")
    assert manager.records[0].changed


def test_notes_are_cleared_for_each_run_and_logged(caplog):
    p = SquareNorms()
    with caplog.at_level("DEBUG", logger=__name__):
        p.run(norm_graph())
    assert p.notes == ["test-square-norms: left rms_norm %out: the output norm stays"]
    assert p.notes[0] in caplog.text
    p.run(norm_graph())
    assert len(p.notes) == 1  # not two: each run starts afresh

    class Quiet(Pass):
        """Test-only: says nothing and leaves its notes alone."""
        name = "test-quiet"

        def run(self, graph):
            return False

    quiet = Quiet()
    quiet.notes = ["stale"]
    PassManager([quiet]).run(norm_graph())
    assert not quiet.notes  # the manager clears a pass's notes before it runs


def test_changed_both_ways():
    assert_unchanged(RefuseAll(), norm_graph())
    assert_unchanged(PassBy(), norm_graph())
    after, changed = apply_pass(SquareNorms(), norm_graph())
    assert changed
    assert [n.op for n in after.nodes] == ["mul", "linear", "rms_norm"]
    assert print_graph(after) != print_graph(norm_graph())


def test_emitter_naming():
    g = norm_graph()
    node = g.nodes[0]
    e = Emitter(g, node)
    first = e("mul", [node.inputs[0], node.inputs[0]], "square")
    again = e("mul", [first, first], "square")
    assert (first.name, again.name) == ("h.square", "h.square_1")
    assert e.constant(2.0, F32, "two").name == "h.two"
    assert e.cast(first, F32, "f32") is first  # no cast to the dtype it has
    assert e.cast(first, DType.f16, name="x.half").name == "x.half"
    assert e("add", [again, first], name="n1.scale").name == "n1.scale"
    result = e("mul", [again, again])  # no role: the output's own name, suffixed while %h lives
    assert result.name == "h_1"
    assert [n.outputs[0].name for n in g.nodes[:6]] == ["h.square", "h.square_1", "h.two", "x.half", "n1.scale",
                                                       "h_1"]
    assert g.nodes[6] is node  # everything went before the node


def test_the_replacement_takes_over_the_name_and_the_readers():
    after, _ = apply_pass(SquareNorms(), norm_graph())
    h = after.nodes[0].outputs[0]
    assert h.name == "h" and after.nodes[1].inputs[0] is h


def test_emitter_operands_by_name():
    g = Graph("ln")
    x = g.add_input("x", F32, ("B", 8))
    g.outputs = [emit1(g, "layer_norm", [x, g.add_param("w", F32, (8,))], None, "y")]
    assert Emitter(g, g.nodes[0]).operands == {"x": x, "weight": g.params["w"], "bias": None}


def test_a_refusal_after_emitting_is_a_bug():
    def emits_then_refuses(e, node):
        e("mul", [node.inputs[0], node.inputs[0]], "wasted")
        return "too late"

    class Late(LoweringPass):
        name = "test-late"
        lowerings = {"rms_norm": emits_then_refuses}

    with pytest.raises(RuntimeError, match="must decide before it emits"):
        Late().run(norm_graph())


def test_one_value_per_output():
    class Short(LoweringPass):
        name = "test-short"
        lowerings = {"rms_norm": no_values}

    with pytest.raises(RuntimeError, match="returned 0 values for 1 outputs"):
        Short().run(norm_graph())


def test_keep_origin():
    class Keeps(SquareNorms):
        keep_origin = True

    g = norm_graph()
    g.nodes[0].origin = "spec.yaml:3"
    after, _ = apply_pass(Keeps(), g)
    assert after.nodes[0].origin == "spec.yaml:3"
    after, _ = apply_pass(SquareNorms(), g)
    assert after.nodes[0].origin is None


# ---- the passes built on it: refusals reach the user ---------------------------------------

def test_lower_linear_refusal_is_a_note():
    g = Graph("rank1")
    x = g.add_input("x", F32, (8,))
    g.outputs = [emit1(g, "linear", [x, g.add_param("w", F32, (4, 8))], None, "y")]
    out = io.StringIO()
    PassManager([LowerLinear()], print_after_change=True, out=out).run(g)
    assert out.getvalue() == "# lower-linear: left linear %y: matmul needs an activation of rank >= 2\n"


def test_lower_softcap_refusal_is_a_note():
    g = Graph("ints")
    x = g.add_input("x", DType.i64, ("B", 8))
    g.outputs = [emit1(g, "softcap", [x], {"cap": 5.0}, "y")]
    p = LowerSoftcap()
    assert_unchanged(p, g)
    assert p.notes == ["lower-softcap: left softcap %y: i64 is not a float type"]


def test_a_param_replacement_keeps_its_own_name():
    """fold replaces a transpose of a param by a derived param named after the value."""
    g = Graph("t")
    x = g.add_input("x", F32, ("B", 8))
    t = emit1(g, "transpose", [g.add_param("w", F32, (4, 8))], {"perm": [1, 0]}, "w.T")
    g.outputs = [emit1(g, "matmul", [x, t], None, "y")]
    seed_absent(g)
    assert assert_pass(Fold(), g)
    after, _ = apply_pass(Fold(), g)
    assert after.nodes[0].inputs[1] is after.params["w.T"]
