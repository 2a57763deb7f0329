"""lower-norms: rms_norm (plain and Gemma offset) and layer_norm to primitives."""
from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph
from irc.passmanager import PassManager, parse_pipeline
from irc.testing import apply_pass, assert_pass, assert_unchanged
from irc.check import compare_outputs
from irc.weights import seed_absent
from passes.lower_norms import LowerNorms

F32 = DType.f32


def norms_graph(dtype: DType = F32) -> Graph:
    """x[B,T,8] through rms_norm, Gemma rms_norm (offset 1), layer_norm with and without bias."""
    g = Graph("norms")
    x = g.add_input("x", dtype, ("B", "T", 8))
    rms = emit1(g, "rms_norm", [x, g.add_param("rms_norm", dtype, (8,))], {"eps": 1e-6}, "rms")
    gemma = emit1(g, "rms_norm", [rms, g.add_param("gemma_norm", dtype, (8,))], {"eps": 1e-6, "offset": 1.0},
                  "gemma")
    ln = emit1(g, "layer_norm", [gemma, g.add_param("ln_norm", dtype, (8,)), g.add_param("ln_bias", dtype, (8,))],
               None, "ln")
    # the omitted bias is passed as None: layer_norm's reference unpacks three operands
    g.outputs = [emit1(g, "layer_norm", [ln, g.add_param("ln2_norm", dtype, (8,)), None], {"eps": 1e-6}, "hidden")]
    seed_absent(g)
    return g


def test_lower_norms():
    assert assert_pass(LowerNorms(), norms_graph(), golden="lower-norms")


def test_lower_norms_computes_half_precision_in_f32():
    graph = norms_graph(DType.bf16)
    assert assert_pass(LowerNorms(), graph, golden="lower-norms-bf16", rtol=2 ** -8)  # one bf16 ulp
    after, _ = apply_pass(LowerNorms(), graph)
    assert all(v.dtype == F32 for n in after.nodes if n.op in ("rsqrt", "reduce_mean") for v in n.outputs)


def test_gemma_offset_folds_into_a_param():
    graph = norms_graph()
    PassManager(parse_pipeline("lower-norms,fold,dce"), checker=compare_outputs).run(graph)
    assert "gemma_norm.scale" in graph.params and "gemma_norm" not in graph.params
    assert {n.op for n in graph.nodes} == {"mul", "reduce_mean", "add", "rsqrt", "constant", "sub"}


def test_lower_norms_without_norms(tiny_llama):
    assert_unchanged(LowerNorms(), apply_pass(LowerNorms(), tiny_llama)[0])
