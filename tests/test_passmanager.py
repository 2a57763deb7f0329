"""The pass manager: pipeline strings, verify after each pass, the numeric check, dumps and
printing instruments."""
import io
import re

import pytest

import passes  # noqa: F401  (registers the passes)
from irc.build import emit1
from irc.dtypes import DType
from irc.errors import PassError
from irc.graph import Graph
from irc.parser import parse_graph
from irc.passmanager import PASSES, Pass, PassManager, parse_pipeline
from irc.printer import print_graph
from irc.check import compare_outputs
from passes.fold import Fold
from irc.rewrite.edit import replace_node


# ---- test-only passes (registered per test with monkeypatch) ---------------------------

class BreakTypes(Pass):
    """Corrupts the first node's result type, which verify must catch."""

    name = "break-types"

    def run(self, graph: Graph) -> bool:
        graph.nodes[0].outputs[0].dtype = DType.i8
        return True


class AddToSub(Pass):
    """A wrong rewrite: ``add`` becomes ``sub`` (types still check)."""

    name = "add-to-sub"

    def run(self, graph: Graph) -> bool:
        changed = False
        for node in list(graph.nodes):
            if node.op == "add":
                replace_node(graph, node, [emit1(graph, "sub", node.inputs, None, node.name, before=node)])
                changed = True
        return changed


class ScaleWeight(Pass):
    """A wrong rewrite that only touches data: doubles one param."""

    name = "scale-weight"
    options = {"param": "lm_head", "factor": 2.0}

    def run(self, graph: Graph) -> bool:
        param = graph.params[self.config["param"]]
        param.data = param.array() * self.config["factor"]
        return True


@pytest.fixture
def test_passes(monkeypatch):
    for cls in (BreakTypes, AddToSub, ScaleWeight):
        monkeypatch.setitem(PASSES, cls.name, cls)


# ---- pipeline strings ------------------------------------------------------------------

def test_parse_pipeline_with_options():
    pipeline = parse_pipeline(" lower-linear , fold{max_constant=8}, dce")
    assert [p.name for p in pipeline] == ["lower-linear", "fold", "dce"]
    assert isinstance(pipeline[1], Fold) and pipeline[1].config == {"max_constant": 8}
    assert repr(pipeline[1]) == "fold{max_constant=8}" and repr(pipeline[0]) == "lower-linear"


def test_parse_pipeline_string_option(test_passes):
    (p,) = parse_pipeline("scale-weight{param=embed,factor=0.5}")
    assert p.config == {"param": "embed", "factor": 0.5}


def test_unknown_pass_names_the_known_ones():
    with pytest.raises(PassError) as err:
        parse_pipeline("dce,no-such-pass")
    assert "no-such-pass" in str(err.value)
    for name in ("cse", "dce", "fold", "lower-linear", "lower-norms", "lower-mlp"):
        assert name in err.value.hint


def test_unknown_option_is_refused():
    with pytest.raises(PassError, match="max_constant"):
        parse_pipeline("fold{limit=3}")
    with pytest.raises(PassError, match="key=value"):
        parse_pipeline("fold{max_constant}")


def test_registered_passes_follow_the_contract():
    for name, cls in PASSES.items():
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name)
        assert cls.summary(), f"pass {name} has no docstring"
        if cls.__module__.startswith("passes."):
            assert cls.__module__ == "passes." + name.replace("-", "_"), f"pass {name} lives in {cls.__module__}"


# ---- verify and the numeric check ------------------------------------------------------

def test_verify_after_each_pass_names_the_pass_and_what_ran(tiny_llama, test_passes):
    with pytest.raises(PassError) as err:
        PassManager(parse_pipeline("lower-mlp,cse,break-types,dce")).run(tiny_llama)
    text = str(err.value)
    assert "pass break-types broke the graph" in text
    assert "after lower-mlp, cse" in text


def test_numeric_check_catches_a_wrong_rewrite(tiny_llama, test_passes):
    manager = PassManager(parse_pipeline("lower-norms,add-to-sub,dce"), checker=compare_outputs)
    with pytest.raises(PassError) as err:
        manager.run(tiny_llama)
    assert "numeric check failed after pass add-to-sub" in str(err.value)
    assert "after lower-norms" in str(err.value)
    assert [r.name for r in manager.records] == ["lower-norms"]


def test_numeric_check_catches_a_changed_weight(tiny_llama, test_passes):
    with pytest.raises(PassError, match=r"after pass scale-weight\{factor=1.5\}"):
        PassManager(parse_pipeline("scale-weight{factor=1.5}"), checker=compare_outputs).run(tiny_llama)


def test_without_checker_a_wrong_rewrite_passes(tiny_llama, test_passes):
    PassManager(parse_pipeline("add-to-sub")).run(tiny_llama)


def test_compare_outputs_leaves_graphs_untouched(tiny_llama):
    before = tiny_llama.clone()
    before.params["norm"].data = None
    text = print_graph(before)
    # seeded from another seed, the absent @norm differs from the graph's lazy one
    assert compare_outputs(before, tiny_llama, seed=1) > 0
    assert compare_outputs(before, tiny_llama, seed=0) == 0
    assert before.params["norm"].data is None and print_graph(before) == text


# ---- instruments -----------------------------------------------------------------------

def test_dumps_parse_back(tiny_llama, tmp_path):
    manager = PassManager(parse_pipeline("lower-embedding,lower-norms,lower-mlp,lower-linear,cse,fold,dce"),
                          dump_dir=str(tmp_path))
    manager.run(tiny_llama)
    names = sorted(p.name for p in tmp_path.glob("*.ir"))
    assert names == ["00-input.ir", "01-lower-embedding.ir", "02-lower-norms.ir", "03-lower-mlp.ir",
                     "04-lower-linear.ir", "05-cse.ir", "06-fold.ir", "07-dce.ir"]
    for path in tmp_path.glob("*.ir"):
        text = path.read_text()
        assert print_graph(parse_graph(text, str(path))) == text
    assert (tmp_path / "07-dce.ir").read_text() == print_graph(tiny_llama)


def test_print_after_change_prints_only_changed_passes(tiny_llama):
    out = io.StringIO()
    manager = PassManager(parse_pipeline("lower-linear,lower-linear,cse,fold"), print_after_change=True, out=out)
    manager.run(tiny_llama)
    printed = re.findall(r"----- after (\S+) \((\w+)\) -----", out.getvalue())
    assert printed == [("lower-linear", "changed"), ("fold", "changed")]
    assert [(r.name, r.changed) for r in manager.records] == [
        ("lower-linear", True), ("lower-linear", False), ("cse", False), ("fold", True)]


def test_print_after_all_prints_every_pass(tiny_llama):
    out = io.StringIO()
    PassManager(parse_pipeline("dce,cse"), print_after_all=True, out=out).run(tiny_llama)
    assert re.findall(r"----- after (\S+) \((\w+)\) -----", out.getvalue()) == [
        ("dce", "unchanged"), ("cse", "unchanged")]


def test_print_after_change_shows_only_the_rewritten_region(tiny_llama):
    out = io.StringIO()
    PassManager(parse_pipeline("lower-norms"), print_after_change=True, out=out).run(tiny_llama)
    text = out.getvalue()
    removed = [line for line in text.splitlines() if line.startswith("-  %")]
    added = [line for line in text.splitlines() if line.startswith("+  %")]
    assert removed and all(" rms_norm " in line for line in removed)
    assert added and not any(" rms_norm " in line for line in added)
    assert "graph " not in text and "meta {" not in text  # regions far from a rewrite are not shown


def test_refusal_notes_are_printed_after_change(tiny_llama):
    class Refuses(Pass):
        """Test-only: finds nothing it may rewrite and says why."""
        name = "test-refuses"

        def run(self, graph):
            self.notes = ["test-refuses: left %x unfused: odd dimension"]
            return False

    out = io.StringIO()
    PassManager([Refuses()], print_after_change=True, out=out).run(tiny_llama)
    assert out.getvalue() == "# test-refuses: left %x unfused: odd dimension\n"
