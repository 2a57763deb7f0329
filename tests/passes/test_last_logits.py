"""last-logits: the head computed on the last position only ([B, 1, V] logits)."""
import numpy as np

from irc.build import emit1
from irc.check import run_reference
from irc.dtypes import DType
from irc.graph import Graph
from irc.testing import apply_pass, assert_pass, assert_unchanged
from passes.last_logits import LastLogits

F32 = DType.f32


def head_graph(cap=30.0) -> Graph:
    """A residual stream read by the final norm, a tied-style head and a soft cap."""
    g = Graph("head")
    x = g.add_input("x", F32, ("B", "T", 8))
    h = emit1(g, "add", [x, x], name="h")
    norm = emit1(g, "rms_norm", [h, g.add_param("norm", F32, (8,))], {"eps": 1e-6}, "norm_out")
    logits = emit1(g, "linear", [norm, g.add_param("embed", F32, (16, 8))], name="logits_uncapped")
    g.outputs = [emit1(g, "softcap", [logits], {"cap": cap}, "logits")]
    return g


def test_last_logits():
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)}
    assert assert_pass(LastLogits(), head_graph(), golden="last-logits", feeds=feeds)
    after, _ = apply_pass(LastLogits(), head_graph())
    assert after.outputs[0].name == "logits" and after.outputs[0].shape == ("B", 1, 16)
    full, last = run_reference(head_graph(), feeds)[0], run_reference(after, feeds)[0]
    np.testing.assert_allclose(last, full[:, -1:], rtol=1e-5, atol=1e-6)


def test_last_logits_without_logits_output():
    g = Graph("none")
    x = g.add_input("x", F32, ("B", "T", 8))
    g.outputs = [emit1(g, "tanh", [x], name="y")]
    assert_unchanged(LastLogits(), g)
