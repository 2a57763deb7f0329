"""fold: nodes over params with data and constants become derived params or constants."""
import numpy as np

from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph
from irc.printer import print_graph
from irc.testing import apply_pass, assert_pass, assert_unchanged
from irc.weights import Derived, seed_absent
from passes.fold import Fold

F32 = DType.f32


def graph_with_foldable_nodes() -> Graph:
    g = Graph("foldable")
    x = g.add_input("x", F32, ("B", 8))
    w = g.add_param("w", F32, (6, 8))
    w16 = g.add_param("w16", DType.bf16, (6, 8))
    scale = g.add_param("scale", F32, (6,))
    seed_absent(g)
    shape_only = g.add_param("shape_only", F32, (8, 6))          # no data: not folded
    wt = emit1(g, "transpose", [w], {"perm": [1, 0]}, "w.T")     # param -> derived param
    w16t = emit1(g, "transpose", [emit1(g, "cast", [w16], {"to": "f32"}, "w16.f32")], {"perm": [1, 0]},
                 "w16.T")                                          # a chain folds in one run
    one = emit1(g, "constant", [], {"value": 1.0}, "one")
    half = emit1(g, "constant", [], {"value": [0.5, 0.25]}, "half")
    bias = emit1(g, "add", [one, half], None, "bias")             # constants -> constant
    shifted = emit1(g, "add", [scale, one], None, "scale.shifted")  # param and constant -> param
    y = emit1(g, "mul", [emit1(g, "matmul", [x, wt], name="y0"), shifted], None, "y1")
    z = emit1(g, "add", [emit1(g, "matmul", [x, w16t], name="z0"), y], None, "z1")
    u = emit1(g, "matmul", [z, emit1(g, "transpose", [shape_only], {"perm": [1, 0]}, "shape_only.T")],
              name="u")
    v = emit1(g, "slice", [u, ], {"axis": 1, "start": 0, "end": 2}, "v")
    g.outputs = [emit1(g, "add", [v, bias], None, "out"), emit1(g, "exp", [one], name="exp_one")]
    return g


def test_fold_makes_params_and_constants():
    assert assert_pass(Fold(), graph_with_foldable_nodes(), golden="fold")


def test_folded_params_are_lazy_and_derived():
    g = graph_with_foldable_nodes()
    after, _ = apply_pass(Fold(), g)
    folded = after.params["w.T"]
    assert isinstance(folded.data, Derived)
    np.testing.assert_array_equal(folded.array(), g.params["w"].array().T)
    chain = after.params["w16.T"]
    np.testing.assert_array_equal(chain.array(), g.params["w16"].array().astype(np.float32).T)
    assert "shape_only.T" not in after.params and "exp_one" not in after.params  # returned: kept


def test_fold_is_deterministic():
    first, _ = apply_pass(Fold(), graph_with_foldable_nodes())
    second, _ = apply_pass(Fold(), graph_with_foldable_nodes())
    assert print_graph(first) == print_graph(second)


def test_large_constant_results_become_params():
    g = Graph("big")
    x = g.add_input("x", F32, (3, 4))
    c = emit1(g, "constant", [], {"value": [[1.0, 2.0, 3.0, 4.0]]}, "row")
    big = emit1(g, "expand", [c], {"shape": [3, 4]}, "big")
    g.outputs = [emit1(g, "add", [x, big], None, "out")]
    after, changed = apply_pass(Fold(max_constant=8), g)
    assert changed and "big" in after.params
    after, changed = apply_pass(Fold(), g)
    assert changed and "big" not in after.params
    assert after.nodes[0].op == "constant" and after.nodes[-2].name == "big"


def test_fold_leaves_unfoldable_graph_alone(tiny_llama):
    assert_unchanged(Fold(), tiny_llama)
