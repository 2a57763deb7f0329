"""retype: one float type for weights, activations and the KV cache; exact to f32, lazy
weights, quantization scales that follow the activations."""
import numpy as np
import pytest

from frontends.dsl import Model, Rope
from irc.dtypes import DType
from irc.errors import PassError
from irc.passmanager import PassManager, parse_pipeline
from irc.testing import apply_pass, assert_pass, assert_unchanged
from irc.weights import Cast, seed_absent
from passes.retype import Retype


def model(dtype: str = "bf16", decomposed: bool = False):
    """Two layers of GQA attention (RoPE fused or as model code writes it) and SwiGLU."""
    m = Model("tiny", vocab=48, d_model=32, dtype=dtype)
    x = m.embed(m.input_ids())
    for layer in m.layers(2):
        x = x + layer.attention(layer.rms_norm(x, "attn_norm"), heads=4, kv_heads=2,
                                rope=Rope(base=1e4, decomposed=decomposed))
        x = x + layer.swiglu(layer.rms_norm(x, "mlp_norm"), d_ff=48)
    m.logits(m.rms_norm(x, "norm"))
    seed_absent(m.graph)
    return m.graph


def test_bf16_weights_to_f32_is_exact():
    graph = model("bf16")
    assert assert_pass(Retype(dtype="f32"), graph, golden="retype", rtol=0.0)
    after, _ = apply_pass(Retype(dtype="f32"), graph)
    assert all(p.dtype == DType.f32 and isinstance(p.data, Cast) for p in after.params.values())
    assert not any(n.op == "cast" for n in after.nodes)  # the lookup's cast became an identity
    assert after.meta["dtype"] == "f32"


@pytest.mark.parametrize("decomposed", [False, True])
def test_f16_rounds_but_computes_rope_tables_in_f32(decomposed):
    graph = model("f32", decomposed)
    assert assert_pass(Retype(dtype="f16"), graph, rtol=1e-2)
    after, _ = apply_pass(Retype(dtype="f16"), graph)
    caches = [v for v in after.inputs if v.name.startswith("past_key_values.")]
    assert all(v.dtype == DType.f16 for v in caches + after.outputs)
    if decomposed:  # positions * inv_freq in f32, cast to f16 where the tables meet q and k
        tables = [n for n in after.nodes if n.op in ("cos", "sin")]
        assert tables and all(n.outputs[0].dtype == DType.f32 for n in tables)
        assert any(n.op == "cast" and n.attrs["to"] == "f16" for n in after.nodes)


def test_an_f32_graph_is_left_alone():
    assert_unchanged(Retype(dtype="f32"), model("f32"))


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_quantization_scales_follow_the_activations(dtype):
    graph = model("bf16")
    PassManager(parse_pipeline(f"retype{{dtype={dtype}}},lower-mlp,quantize{{bits=4,group=16}}")).run(graph)
    scales = [p for name, p in graph.params.items() if name.endswith(".scales")]
    assert scales and all(p.dtype == DType.parse(dtype) for p in scales)
    assert all(n.inputs[0].dtype == DType.parse(dtype) for n in graph.nodes if n.op == "dequant_linear")


def test_weights_are_cast_on_read_by_rows():
    graph = model("bf16")
    source = graph.params["layers.0.mlp.w_up"]
    whole = source.array()
    after, _ = apply_pass(Retype(dtype="f16"), graph)
    param = after.params["layers.0.mlp.w_up"]
    assert param.data.reads_rows is False  # seeded data is drawn whole
    np.testing.assert_array_equal(param.data.rows(3, 7), whole[3:7].astype(np.float32).astype(np.float16))
    array_backed = Cast(whole, DType.f32)
    assert array_backed.reads_rows and array_backed.rows(1, 2).dtype == np.float32


def test_refuses_a_quantized_graph_and_bad_options():
    graph = model("f32")
    with pytest.raises(PassError, match="run retype before quantize"):
        PassManager(parse_pipeline("lower-mlp,quantize{group=16},retype{dtype=f16}")).run(graph)
    with pytest.raises(PassError, match="dtype must be one of f32, f16, bf16"):
        parse_pipeline("retype{dtype=i8}")
