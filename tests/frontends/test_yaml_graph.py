"""The YAML explicit graph form: nodes, params, repeat, and located errors."""
from pathlib import Path

import pytest

from frontends import load_spec, yaml_graph
from irc.printer import format_node
from irc.check import check_feeds, run_reference
from irc.verify import verify
from tests.frontends.yaml_checks import assert_mistake, edited, spec_error

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SMALL = """\
graph:
  name: small
  inputs:
    - {name: x, dtype: f32, shape: [B, T, 8]}
  params:
    - {name: w, dtype: f32, shape: [8, 8]}
  nodes:
    - {op: linear, inputs: [x, "@w"], outputs: [h0]}
    - repeat:
        count: 3
        params: [{name: "layers.{i}.w", dtype: f32, shape: [8, 8]}]
        nodes:
          - {op: linear, inputs: ["h{i}", "@layers.{i}.w"], outputs: ["layers.{i}.y"]}
          - {op: add, inputs: ["h{i}", "layers.{i}.y"], outputs: ["h{i+1}"]}
        outputs: ["layers.{i}.y"]
    - {op: softcap, inputs: [h3], attrs: {cap: 30.0}, outputs: [y]}
  outputs: [y]
"""


def canonical(graph) -> list[str]:
    """Node lines with values renamed by position, so differently named graphs compare."""
    names = {v.name: f"v{i}" for i, v in enumerate(graph.values())}
    lines = []
    for node in graph.nodes:
        line = format_node(node)
        for old in sorted(names, key=len, reverse=True):
            line = line.replace(f"%{old} ", f"%{names[old]} ").replace(f"%{old},", f"%{names[old]},")
        lines.append(line.split(" : ")[0].split("= ", 1)[1] + " : " + line.split(" : ")[1])
    return lines


def test_repeat_expands_with_the_index():
    g = yaml_graph.loads(SMALL, "small.yaml")
    verify(g)
    assert [n.op for n in g.nodes] == ["linear"] + ["linear", "add"] * 3 + ["softcap"]
    assert list(g.params) == ["w", "layers.0.w", "layers.1.w", "layers.2.w"]
    assert [v.name for v in g.outputs] == ["y", "layers.0.y", "layers.1.y", "layers.2.y"]
    assert g.nodes[3].inputs[0].name == "h1" and g.nodes[4].outputs[0].name == "h2"
    assert g.nodes[0].origin == "small.yaml:8" and g.nodes[1].origin == g.nodes[3].origin == "small.yaml:13"
    assert g.nodes[-1].attrs["cap"] == 30.0


def test_graph_example_matches_the_architecture_form(tmp_path):
    """The hand-written tiny Llama equals the one the architecture form expands, up to names."""
    arch = tmp_path / "arch.yaml"
    arch.write_text("""\
model:
  name: tiny-llama-graph
  vocab_size: 256
  d_model: 64
  n_layers: 2
  norm: {kind: rms, eps: 1.0e-5}
  attention: {kind: gqa, n_heads: 4, n_kv_heads: 2, head_dim: 16, rope: {base: 10000}}
  mlp: {kind: swiglu, d_ff: 160}
""")
    by_hand = load_spec(EXAMPLES / "tiny-llama-graph.yaml")
    expanded = load_spec(arch)
    verify(by_hand)
    assert canonical(by_hand) == canonical(expanded)
    assert [v.name for v in by_hand.inputs] == [v.name for v in expanded.inputs]
    assert [v.name for v in by_hand.outputs] == [v.name for v in expanded.outputs]
    assert {k: p.shape for k, p in by_hand.params.items()} == {k: p.shape for k, p in expanded.params.items()}
    feeds = check_feeds(expanded)
    for a, b in zip(run_reference(by_hand, feeds), run_reference(expanded, feeds)):
        assert (a == b).all()


def graph_error(tmp_path, text: str) -> str:
    return spec_error(tmp_path, text, "g.yaml")


@pytest.mark.parametrize("old, new, line, key, words", [
    ("op: softcap", "op: softcup", 16, "graph.nodes[2].op", "unknown op 'softcup'"),
    ("inputs: [h3]", "inputs: [h9]", 16, "graph.nodes[2].inputs[0]", "undefined value 'h9'"),
    ('"@layers.{i}.w"', '"@layers.{i}.v"', 13, "graph.nodes[1].repeat.nodes[0].inputs[1]",
     "undefined param @layers.0.v (repeat i=0)"),
    ('outputs: [h0]', 'outputs: [x]', 8, "graph.nodes[0].outputs[0]", "duplicate name 'x'"),
    ('["h{i+1}"]', '["h{i}"]', 14, "graph.nodes[1].repeat.nodes[1].outputs[0]", "duplicate name 'h0'"),
    ("inputs: [x, \"@w\"], outputs: [h0]", "inputs: [h1, \"@w\"], outputs: [h0]", 8, "graph.nodes[0].inputs[0]",
     "'h1' is used before it is made (line 14)"),
    ("inputs: [x, \"@w\"], outputs: [h0]", "inputs: [h0, \"@w\"], outputs: [h0]", 8, "graph.nodes[0].inputs[0]",
     "'h0' is used before it is made (line 8)"),
    ("shape: [8, 8]}\n  nodes", "shape: [8, 4]}\n  nodes", 8, "graph.nodes[0].op", "linear: weight [8,4]"),
    ("attrs: {cap: 30.0}", "attrs: {cap: 30.0, floor: 1}", 16, "graph.nodes[2].attrs", "no attribute 'floor'"),
    ("dtype: f32, shape: [B, T, 8]", "dtype: f33, shape: [B, T, 8]", 4, "graph.inputs[0].dtype",
     "expected a dtype"),
    ("shape: [B, T, 8]", "shape: [B, T, -8]", 4, "graph.inputs[0].shape[2]", "negative dimension"),
    ("shape: [8, 8]}\n  nodes", "shape: [8, B]}\n  nodes", 6, "graph.params[0].shape[1]",
     "expected a non-negative integer"),
    ("count: 3", "count: 0", 10, "graph.nodes[1].repeat.count", "expected a positive integer"),
    ("outputs: [y]\n", "outputs: [z]\n", 17, "graph.outputs[0]", "undefined value 'z'"),
    ("outputs: [y]}", "outputs: [y, extra]}", 16, "graph.nodes[2].outputs", "softcap makes 1 outputs, 2 named"),
    ("  name: small\n", "  name: small\n  title: x\n", 3, "graph.title", "unknown key"),
    ("{op: add,", "{op: add, attr: {},", 14, "graph.nodes[1].repeat.nodes[1].attr", "did you mean 'attrs'?"),
])
def test_mistakes_name_file_line_and_key(tmp_path, old, new, line, key, words):
    assert_mistake(tmp_path, edited(SMALL, old, new, 1), line, key, words, "g.yaml", after="")


def test_repeats_do_not_nest(tmp_path):
    text = SMALL.replace("        nodes:\n", "        nodes:\n          - repeat: {count: 2, nodes: []}\n", 1)
    assert "repeats do not nest" in graph_error(tmp_path, text)


def test_wrong_container_types(tmp_path):
    assert "graph.nodes: expected a list" in graph_error(tmp_path, "graph: {name: g, nodes: {op: add}}\n")
    assert "graph.nodes[0]: expected a mapping" in graph_error(tmp_path, "graph: {name: g, nodes: [add]}\n")
    assert "graph.name: missing required key" in graph_error(tmp_path, "graph: {nodes: []}\n")
