"""``irc.rewrite.epilogue``: the one matcher for epilogue chains, GLUs and residual norms."""
import pytest

from irc.parser import parse_graph
from irc.rewrite.epilogue import BINARY, UNARY, epilogue_chain, glu_match, operand_kinds, residual_norm

CHAIN = """graph chain(%x: f32[B,T,8], %res: f32[B,T,6]) -> (%out: f32[B,T,6]) {
  param @w: f32[6,8]
  param @b: f32[6]
  param @s: f32[1,1,6]
  %y = linear %x, @w : f32[B,T,6]
  %biased = add %y, @b : f32[B,T,6]
  %act = gelu %biased {approximate="tanh"} : f32[B,T,6]
  %scaled = mul @s, %act : f32[B,T,6]
  %summed = add %res, %scaled : f32[B,T,6]
  %out = softcap %summed {cap=30.0} : f32[B,T,6]
  return %out
}
"""


def _chain(text, operands, free=None):
    graph = parse_graph(text)
    producer = next(n for n in graph.nodes if n.op == "linear")
    return graph, epilogue_chain(graph, producer.outputs[0], operands, free)


def test_vector_operands_only_stop_at_the_residual():
    _, steps = _chain(CHAIN, ("vector",))
    assert [s.node.name for s in steps] == ["biased", "act", "scaled"]
    assert [(s.operand, s.swap) for s in steps] == [("vector", False), (None, False), ("vector", True)]
    assert steps[0].other.name == "b" and steps[2].other.name == "s"    # [6] and [1,1,6] are both per-column


def test_tile_operands_take_the_residual_and_the_chain_ends_at_the_graph_output():
    _, steps = _chain(CHAIN, ("tile", "vector"))
    assert [s.node.name for s in steps] == ["biased", "act", "scaled", "summed", "out"]
    assert (steps[3].operand, steps[3].other.name, steps[3].swap) == ("tile", "res", True)
    also = CHAIN.replace("-> (%out: f32[B,T,6])", "-> (%out: f32[B,T,6], %summed: f32[B,T,6])")
    also = also.replace("return %out", "return %out, %summed")
    assert [s.node.name for s in _chain(also, ("tile", "vector"))[1]][-1] == "summed"   # a graph output ends it


def test_a_planned_node_a_second_reader_or_an_integer_cast_stops_the_chain():
    _, steps = _chain(CHAIN, ("tile", "vector"), free=lambda node: node.name != "act")
    assert [s.node.name for s in steps] == ["biased"]
    twice = CHAIN.replace("%summed = add %res, %scaled", "%summed = add %act, %scaled")
    assert [s.node.name for s in _chain(twice, ("tile", "vector"))[1]] == ["biased", "act"]   # %act read twice
    cast = CHAIN.replace('%act = gelu %biased {approximate="tanh"} : f32[B,T,6]',
                         '%act = cast %biased {to="i32"} : i32[B,T,6]')
    cast = cast.replace("%scaled = mul @s, %act",
                        '%back = cast %act {to="f32"} : f32[B,T,6]\n  %scaled = mul @s, %back')
    assert [s.node.name for s in _chain(cast, ("vector",))[1]] == ["biased"]


def test_unknown_operand_kind_is_refused():
    graph = parse_graph(CHAIN)
    with pytest.raises(ValueError, match="unknown epilogue operand kinds"):
        epilogue_chain(graph, graph.nodes[0].outputs[0], ("rows",))


def test_operand_kinds_of_a_square_vector():
    graph = parse_graph(CHAIN)
    b, s = graph.params["b"], graph.params["s"]
    assert operand_kinds(b, (6,)) == ["tile", "vector"] and operand_kinds(s, ("B", "T", 6)) == ["vector"]
    assert operand_kinds(b, ("B", "T", 5)) == []


GLU = """graph glu(%x: f32[B,T,8], %z: f32[B,T,8]) -> (%h: f32[B,T,16]EXTRA_TYPE) {
  param @wg: f32[16,8]
  param @wu: f32[16,8]
  %g = linear %x, @wg : f32[B,T,16]
  %a = silu %g : f32[B,T,16]
  %u = linear UP, @wu : f32[B,T,16]
  %h = mul %u, %a : f32[B,T,16]
  return %hEXTRA
}
"""


def _glu(up_input="%x", also_return_act=False):
    text = GLU.replace("UP", up_input).replace("EXTRA_TYPE", ", %a: f32[B,T,16]" if also_return_act else "")
    text = text.replace("EXTRA", ", %a" if also_return_act else "")
    graph = parse_graph(text)
    return graph, next(n for n in graph.nodes if n.op == "mul")


def test_glu_match_and_its_refusals():
    graph, mul = _glu()
    assert [n.name for n in glu_match(graph, mul, ("linear",))] == ["g", "a", "u"]    # act second, matched anyway
    assert glu_match(graph, mul, ("dequant_linear",)) is None
    assert glu_match(graph, mul, ("linear",), free=lambda node: node.name != "u") is None
    assert glu_match(*_glu(also_return_act=True), ("linear",)) is None               # %a is read elsewhere
    assert glu_match(*_glu(up_input="%z"), ("linear",)) is None                      # projections of two inputs


NORMS = """graph norms(%x: f32[T,8], %r: f32[T,8], %v: f32[8]) -> (%n1: f32[T,8], %n2: f32[T,8], %s: f32[T,8]) {
  param @w: f32[8]
  %s = add %x, %r : f32[T,8]
  %n1 = rms_norm %s, @w {eps=1e-05} : f32[T,8]
  %t = add %x, %v : f32[T,8]
  %n2 = rms_norm %t, @w {eps=1e-05} : f32[T,8]
  return %n1, %n2, %s
}
"""


def test_residual_norm_needs_two_operands_of_the_sums_shape():
    graph = parse_graph(NORMS)
    n1, n2 = (n for n in graph.nodes if n.op == "rms_norm")
    assert residual_norm(n1).name == "s" and residual_norm(n2) is None       # a bias add is not a residual


def test_every_epilogue_op_has_a_triton_expression_and_an_npu_executor_rule():
    from backends.npu import executor
    from backends.triton.kernels import elementwise

    for op in UNARY + BINARY:
        assert elementwise.supports(op, {"to": "f16"} if op == "cast" else {}), op
    assert set(BINARY) <= set(executor._BINARY)
    assert set(UNARY) - set(executor._UNARY) == {"gelu", "softcap", "cast"}   # executor._unary's own branches
