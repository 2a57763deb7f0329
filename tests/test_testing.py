"""The pass-test harness itself: it must catch what it promises to catch."""
import numpy as np
import pytest

import irc.testing
from irc.interpreter import random_feeds
from irc.build import emit, emit1
from irc.dtypes import DType
from irc.graph import Graph
from irc.passmanager import Pass
from irc.testing import assert_pass, assert_unchanged, check_golden
from irc.check import compare_outputs, relative_error
from passes.dce import DeadCodeElimination
from irc.rewrite.edit import constant
from test_passmanager import AddToSub  # replaces add by sub: wrong numbers

F32 = DType.f32


def small_graph() -> Graph:
    g = Graph("small")
    x = g.add_input("x", F32, ("B", 4))
    g.outputs = [emit1(g, "add", [emit1(g, "tanh", [x], name="t"), x], None, "y")]
    return g


class MultiplyByOne(Pass):
    """Wraps the first output in ``* 1.0`` on every run: exact, but never done."""

    name = "multiply-by-one"

    def run(self, graph):
        out = graph.outputs[0]
        one = constant(graph, 1.0, F32, "one")
        graph.outputs[0] = emit1(graph, "mul", [out, one], None, f"{out.name}.times_one")
        return True


class QuietRewrite(Pass):
    """Changes the graph but says it did not."""

    name = "quiet-rewrite"

    def run(self, graph):
        AddToSub().run(graph)
        return False


def test_relative_error():
    a = np.array([1.0, -2.0, 4.0])
    assert relative_error(a, a) == 0.0
    assert relative_error(a + [0.0, 0.0, 0.4], a) == pytest.approx(0.1)
    assert relative_error(np.zeros(3), np.zeros(3)) == 0.0
    assert relative_error(np.ones(2), np.ones(3)) == float("inf")
    assert relative_error([np.nan, 1.0], [np.nan, 1.0]) == 0.0
    assert relative_error([np.nan, 1.0], [0.0, 1.0]) == float("inf")
    assert relative_error([np.inf, 1.0], [np.inf, 1.0]) == 0.0


def test_assert_pass_catches_a_pass_that_never_settles():
    with pytest.raises(AssertionError, match="renamed the graph outputs|not idempotent"):
        assert_pass(MultiplyByOne(), small_graph())


def test_assert_pass_catches_wrong_numbers():
    with pytest.raises(AssertionError, match="add-to-sub moved the outputs"):
        assert_pass(AddToSub(), small_graph())


def test_assert_pass_catches_a_dishonest_changed_flag():
    with pytest.raises(AssertionError, match="returned False but changed"):
        assert_pass(QuietRewrite(), small_graph())


def test_assert_unchanged_catches_a_change():
    with pytest.raises(AssertionError, match="reported a change"):
        g = small_graph()
        g.add_param("unused", F32, (2,))
        assert_unchanged(DeadCodeElimination(), g)


def test_golden_files_compare_and_update(tmp_path, monkeypatch):
    monkeypatch.setattr(irc.testing.golden, "directory", tmp_path)
    monkeypatch.setattr(irc.testing.golden, "update", False)
    with pytest.raises(AssertionError, match="--update-golden"):
        check_golden("g.ir", "one\n")
    monkeypatch.setattr(irc.testing.golden, "update", True)
    check_golden("g.ir", "one\n")
    assert (tmp_path / "g.ir").read_text() == "one\n"
    monkeypatch.setattr(irc.testing.golden, "update", False)
    check_golden("g.ir", "one\n")
    with pytest.raises(AssertionError, match=r"(?s)differs.*-one\n\+two"):
        check_golden("g.ir", "two\n")


def cached_attention_graph(layout: str = "BKPD", negate_present: bool = False) -> Graph:
    """Attention over a past cache; with layout "BKDP" the key cache is kept transposed
    (a pass that changes the cache's type), with ``negate_present`` wrongly so."""
    g = Graph("cached")
    q, k, v = (g.add_input(name, F32, ("B", "T", 8)) for name in ("q", "k", "v"))
    mask = g.add_input("attention_mask", DType.i64, ("B", "P+T"))
    key_shape = ("B", 2, "P", 4) if layout == "BKPD" else ("B", 2, 4, "P")
    past_key = g.add_input("past_key_values.0.key", F32, key_shape)
    past_value = g.add_input("past_key_values.0.value", F32, ("B", 2, "P", 4))
    if layout == "BKDP":
        past_key = emit1(g, "transpose", [past_key], {"perm": [0, 1, 3, 2]}, "past_key")
    out, key, value = emit(g, "attention", [q, k, v, mask, past_key, past_value],
                           {"heads": 2, "kv_heads": 2, "head_dim": 4}, ["out", "present.0.key", "present.0.value"])
    if layout == "BKDP":
        g.rename(key, "key")
        if negate_present:
            key = emit1(g, "neg", [key], None, "key.neg")
        key = emit1(g, "transpose", [key], {"perm": [0, 1, 3, 2]}, "present.0.key")
    g.outputs = [out, key, value]
    return g


def test_compare_outputs_with_different_cache_types_runs_each_graph_on_its_own_caches():
    before = cached_attention_graph()
    after = cached_attention_graph("BKDP")
    assert [v.type_str() for v in after.inputs] != [v.type_str() for v in before.inputs]
    assert compare_outputs(before, after) <= 1e-6
    # feeds built for `before` (a past of 3, as the CLI's --check builds them) set the sizes only
    assert compare_outputs(before, after, random_feeds(before, batch=2, tokens=5, past=3)) <= 1e-6
    # a wrong cache is invisible at prefill and caught at the decode step
    wrong = cached_attention_graph("BKDP", negate_present=True)
    assert compare_outputs(before, wrong) > 1e-2
