"""dce: dead nodes and unused params go; outputs, inputs and live nodes stay."""
from irc.build import emit, emit1
from irc.dtypes import DType
from irc.graph import Graph
from irc.testing import apply_pass, assert_pass, assert_unchanged
from passes.dce import DeadCodeElimination

F32 = DType.f32


def graph_with_dead_code() -> Graph:
    g = Graph("dead")
    x = g.add_input("x", F32, ("B", 8))
    unused_input = g.add_input("unused", F32, ("B", 8))
    w = g.add_param("w", F32, (8, 8))
    dead_w = g.add_param("dead_w", F32, (8, 8))
    g.add_param("never_read", F32, (4,))
    y = emit1(g, "matmul", [x, w], name="y")
    dead = emit1(g, "matmul", [x, dead_w], name="dead")
    emit1(g, "tanh", [emit1(g, "exp", [dead], name="dead_exp")], name="dead_tanh")  # a dead chain
    values, _ = emit(g, "topk", [y], {"k": 2}, ["top_values", "top_indices"])  # half used: stays
    emit1(g, "add", [unused_input, x], name="dead_sum")
    g.outputs = [emit1(g, "exp", [values], name="out"), y]
    return g


def test_dce_removes_dead_nodes_and_params():
    assert assert_pass(DeadCodeElimination(), graph_with_dead_code(), golden="dce")
    after, _ = apply_pass(DeadCodeElimination(), graph_with_dead_code())
    assert [n.name for n in after.nodes] == ["y", "top_values", "out"]
    assert sorted(after.params) == ["w"]
    assert [v.name for v in after.inputs] == ["x", "unused"]


def test_dce_reports_removing_only_params():
    g = Graph("params_only")
    x = g.add_input("x", F32, (2, 4))
    g.add_param("stale", F32, (4,))
    g.outputs = [emit1(g, "tanh", [x], name="y")]
    assert assert_pass(DeadCodeElimination(), g)


def test_dce_leaves_live_graph_alone(tiny_llama):
    assert_unchanged(DeadCodeElimination(), tiny_llama)
