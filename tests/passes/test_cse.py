"""cse: identical nodes merge (commutative operands in either order); outputs keep names."""
from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph
from irc.testing import apply_pass, assert_pass, assert_unchanged
from passes.cse import CommonSubexpressionElimination as CSE

F32 = DType.f32


def graph_with_duplicates() -> Graph:
    g = Graph("dups")
    a = g.add_input("a", F32, ("B", 4))
    b = g.add_input("b", F32, ("B", 4))
    s1 = emit1(g, "add", [a, b], name="s1")
    s2 = emit1(g, "add", [b, a], name="s2")            # commutative: same as s1
    d1 = emit1(g, "sub", [a, b], name="d1")
    d2 = emit1(g, "sub", [b, a], name="d2")            # not commutative: stays
    p1 = emit1(g, "mul", [s1, s1], name="p1")
    p2 = emit1(g, "mul", [s2, s2], name="p2")          # equal once s2 is s1: merges in the same run
    m1 = emit1(g, "reduce_mean", [p1], {"axes": [-1]}, "m1")
    m2 = emit1(g, "reduce_mean", [p2], {"axes": [0]}, "m2")  # other attrs: stays
    c1 = emit1(g, "constant", [], {"value": 2.0}, "c1")
    c2 = emit1(g, "constant", [], {"value": 2.0}, "c2")      # equal constants merge
    out = emit1(g, "add", [emit1(g, "mul", [d1, c1], name="e1"), emit1(g, "mul", [c2, d2], name="e2")],
                name="out")
    g.outputs = [out, m1, m2, p2]                            # p2 is returned: p1 takes its name
    return g


def test_cse_merges_duplicates():
    assert assert_pass(CSE(), graph_with_duplicates(), golden="cse")
    after, _ = apply_pass(CSE(), graph_with_duplicates())
    assert [n.name for n in after.nodes] == ["s1", "d1", "d2", "p2", "m1", "m2", "c1", "e1", "e2", "out"]
    assert [v.name for v in after.outputs] == ["out", "m1", "m2", "p2"]


def test_cse_keeps_two_returned_duplicates():
    g = Graph("two_outputs")
    x = g.add_input("x", F32, (2, 3))
    g.outputs = [emit1(g, "exp", [x], name="first"), emit1(g, "exp", [x], name="second")]
    assert_unchanged(CSE(), g)


def test_cse_leaves_distinct_nodes_alone(tiny_llama):
    assert_unchanged(CSE(), tiny_llama)
