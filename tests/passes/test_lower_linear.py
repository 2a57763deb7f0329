"""lower-linear: linear -> matmul against the transposed weight (+ bias); with fold the
transpose becomes a derived param."""
import numpy as np

from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph
from irc.passmanager import PassManager, parse_pipeline
from irc.printer import print_graph
from irc.testing import assert_pass, assert_unchanged, check_golden
from irc.check import compare_outputs
from irc.weights import Derived, seed_absent
from passes.lower_linear import LowerLinear

F32 = DType.f32


def linears_graph() -> Graph:
    """x[B,T,8]: a biased linear, two linears sharing a weight, a bf16 weight, rank-2 input."""
    g = Graph("linears")
    x = g.add_input("x", F32, ("B", "T", 8))
    rows = g.add_input("rows", F32, ("T", 8))
    w = g.add_param("proj.weight", F32, (6, 8))
    b = g.add_param("proj.bias", F32, (6,))
    shared = g.add_param("shared", F32, (8, 8))
    half = g.add_param("half", DType.bf16, (8, 8))
    seed_absent(g)
    y = emit1(g, "linear", [x, w, b], None, "y")
    s1 = emit1(g, "linear", [x, shared], None, "s1")
    s2 = emit1(g, "linear", [s1, shared], None, "s2")
    h = emit1(g, "linear", [s2, half], None, "h")
    g.outputs = [y, h, emit1(g, "linear", [rows, shared], None, "r")]
    return g


def test_lower_linear():
    assert assert_pass(LowerLinear(), linears_graph(), golden="lower-linear")


def test_lower_linear_refuses_rank_one_activation():
    g = Graph("vector")
    x = g.add_input("x", F32, (8,))
    g.outputs = [emit1(g, "linear", [x, g.add_param("w", F32, (4, 8))], None, "y")]
    assert_unchanged(LowerLinear(), g)


def test_lower_linear_fold_dce_pipeline(tiny_llama):
    """The pipeline checked pass by pass through the reference interpreter."""
    originals = {name: p.array() for name, p in tiny_llama.params.items()}
    manager = PassManager(parse_pipeline("lower-mlp,lower-linear,fold,dce"), checker=compare_outputs)
    graph = manager.run(tiny_llama)
    check_golden("lower-linear-fold-dce.after.ir", print_graph(graph))
    assert [r.changed for r in manager.records] == [True, True, True, True]
    assert all(r.check_error <= 1e-5 for r in manager.records)
    assert not any(n.op in ("linear", "transpose", "swiglu") for n in graph.nodes)
    assert [v.name for v in graph.outputs] == ["logits"]
    head = graph.params["lm_head.T"]
    assert isinstance(head.data, Derived) and "lm_head" not in graph.params
    np.testing.assert_array_equal(head.array(), originals["lm_head"].T)


def test_lower_linear_without_linears():
    g = Graph("none")
    x = g.add_input("x", F32, ("B", 8))
    g.outputs = [emit1(g, "tanh", [x], name="y")]
    assert_unchanged(LowerLinear(), g)
