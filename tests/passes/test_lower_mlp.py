"""lower-mlp: swiglu, geglu and gelu_mlp to linear + activation + mul."""
from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph
from irc.testing import apply_pass, assert_pass, assert_unchanged
from irc.weights import seed_absent
from passes.lower_linear import LowerLinear
from passes.lower_mlp import LowerMlp

F32 = DType.f32


def mlps_graph() -> Graph:
    """x[B,T,8] through swiglu, geglu (tanh), gelu_mlp with biases and gelu_mlp without."""
    g = Graph("mlps")
    x = g.add_input("x", F32, ("B", "T", 8))

    def weights(prefix, *names):
        shapes = {"w_gate": (12, 8), "w_up": (12, 8), "w_down": (8, 12), "b_up": (12,), "b_down": (8,)}
        return [g.add_param(f"{prefix}.{n}", F32, shapes[n]) for n in names]

    x = emit1(g, "swiglu", [x] + weights("swiglu", "w_gate", "w_up", "w_down"), None, "swiglu")
    x = emit1(g, "geglu", [x] + weights("geglu", "w_gate", "w_up", "w_down"), None, "geglu")
    x = emit1(g, "gelu_mlp", [x] + weights("fc", "w_up", "w_down", "b_up", "b_down"), None, "fc")
    x = emit1(g, "gelu_mlp", [x] + weights("fc2", "w_up", "w_down"), {"approximate": "tanh"}, "out")
    g.outputs = [x]
    seed_absent(g)
    return g


def test_lower_mlp():
    assert assert_pass(LowerMlp(), mlps_graph(), golden="lower-mlp")


def test_lower_mlp_then_lower_linear_reaches_matmul():
    lowered, _ = apply_pass(LowerMlp(), mlps_graph())
    assert assert_pass(LowerLinear(), lowered)
    matmuls, _ = apply_pass(LowerLinear(), lowered)
    assert {n.op for n in matmuls.nodes} == {"matmul", "transpose", "add", "mul", "silu", "gelu"}


def test_lower_mlp_without_mlps():
    g = Graph("none")
    x = g.add_input("x", F32, ("B", 8))
    g.outputs = [emit1(g, "linear", [x, g.add_param("w", F32, (8, 8))], None, "y")]
    assert_unchanged(LowerMlp(), g)
