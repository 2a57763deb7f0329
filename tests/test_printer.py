import pytest

from irc.build import emit, emit1
from irc.dtypes import DType
from irc.errors import ParseError
from irc.graph import Graph
from irc.parser import parse_graph
from irc.printer import print_graph


def graph_with_everything():
    g = Graph("tiny-model")
    g.meta = {"d_model": 8, "rope": {"base": 10000.0}}
    ids = g.add_input("input_ids", DType.i64, ["B", "T"])
    past = g.add_input("past", DType.f32, ["B", "P", 8])
    table = g.add_param("embed", DType.f32, [16, 8])
    x = emit1(g, "embedding", [ids, table], name="x")
    n = emit1(g, "rms_norm", [x, g.add_param("layers.0.norm", DType.bf16, [8])], {"eps": 1e-5}, name="h")
    both = emit1(g, "concat", [past, n], {"axis": 1}, name="cat")
    vals, idx = emit(g, "topk", [both], {"k": 2}, ["top", "top_i"])
    eps = emit1(g, "constant", [], {"value": [1.5, -2.0], "dtype": "f32"}, name="c")
    g.outputs = [vals, idx, both, eps]
    return g


def test_round_trip_is_exact():
    text = print_graph(graph_with_everything())
    again = parse_graph(text)
    assert print_graph(again) == text
    assert "{k=2}" in text and "concat %past, %h {axis=1} : f32[B,P+T,8]" in text


def test_defaults_are_omitted_and_restored():
    text = print_graph(graph_with_everything())
    assert "largest" not in text
    g = parse_graph(text)
    topk = next(n for n in g.nodes if n.op == "topk")
    assert topk.attrs == {"axis": -1, "k": 2, "largest": True}


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.replace("= rms_norm", "= rms_nrom"), "unknown op 'rms_nrom'"),
    (lambda t: t.replace("%x, @layers.0.norm", "%nope, @layers.0.norm"), "unknown value %nope"),
    (lambda t: t.replace("{axis=1}", "{axis=1, bogus=2}"), "no attribute 'bogus'"),
    (lambda t: t.replace("  return", "  # return"), "missing 'return'"),
])
def test_parse_errors_name_the_line(mutate, message):
    text = mutate(print_graph(graph_with_everything()))
    with pytest.raises(ParseError, match=message) as info:
        parse_graph(text, source="m.ir")
    assert str(info.value).startswith("m.ir:")
