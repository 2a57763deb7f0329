"""The DSL builder: conventions, names, origins, errors, and identity with the YAML form."""
import math
from pathlib import Path

import pytest

from frontends import load_spec, yaml_spec
from frontends.dsl import ArgError, Model, Rope
from irc.dtypes import DType
from irc.errors import SpecError
from irc.printer import print_graph
from irc.check import check_feeds, run_reference
from irc.verify import verify

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PAIRS = [("llama3-8b.yaml", "llama3_8b_dsl.py"), ("tiny-llama3.yaml", "tiny_llama3_dsl.py"),
         ("deepseek-v2.yaml", "deepseek_v2_dsl.py"), ("tiny-deepseek-v2.yaml", "tiny_deepseek_v2_dsl.py")]


def tiny_llama():
    """The sample from DESIGN.md, unnamed norms and all."""
    m = Model("tiny-llama", vocab=256, d_model=64)
    x = m.embed(m.input_ids())
    for layer in m.layers(2):
        x = x + layer.attention(layer.rms_norm(x), heads=4, kv_heads=2, rope=Rope(base=1e4))
        x = x + layer.swiglu(layer.rms_norm(x), d_ff=160)
    m.logits(m.rms_norm(x))
    return m


@pytest.mark.parametrize("yaml_name, dsl_name", PAIRS)
def test_dsl_examples_build_the_yaml_graph(yaml_name, dsl_name):
    from_yaml = load_spec(EXAMPLES / yaml_name)
    from_dsl = load_spec(EXAMPLES / dsl_name)
    assert print_graph(from_dsl) == print_graph(from_yaml)
    assert from_dsl.meta == from_yaml.meta


def test_graph_conventions():
    g = tiny_llama().graph
    verify(g)
    assert [v.name for v in g.inputs] == [
        "input_ids", "attention_mask", "position_ids", "past_key_values.0.key", "past_key_values.0.value",
        "past_key_values.1.key", "past_key_values.1.value"]
    assert [v.name for v in g.outputs] == ["logits", "present.0.key", "present.0.value", "present.1.key",
                                           "present.1.value"]
    assert g.inputs[1].shape == ("B", "P+T")
    assert g.inputs[3].shape == ("B", 2, "P", 16) and g.inputs[3].dtype == DType.f32
    assert g.outputs[0].shape == ("B", "T", 256) and g.outputs[0].dtype == DType.f32
    assert g.outputs[1].shape == ("B", 2, "P+T", 16)
    assert {"layers.0.attn_norm", "layers.0.mlp_norm", "layers.1.attn.wq", "norm", "lm_head"} <= set(g.params)
    assert all(p.data is None for p in g.params.values())
    names = [out.name for node in g.nodes for out in node.outputs]
    assert {"layers.0.q", "layers.0.attn_out", "layers.0.x", "layers.0.x_1"} <= set(names)


def test_origins_are_call_sites_outside_the_dsl():
    g = tiny_llama().graph
    here = Path(__file__).name
    assert all(node.origin.startswith(f"{here}:") for node in g.nodes)
    attention = next(n for n in g.nodes if n.op == "attention")
    line = tiny_llama.__code__.co_firstlineno + 5
    assert attention.origin == f"{here}:{line}"


def test_the_dsl_graph_runs():
    g = tiny_llama().graph
    logits = run_reference(g, check_feeds(g))[0]
    assert logits.shape == (2, 3, 256) and math.isfinite(float(abs(logits).sum()))


def test_meta_records_the_config():
    meta = tiny_llama().graph.meta
    assert meta["attention"] == "gqa" and meta["n_heads"] == 4 and meta["n_kv_heads"] == 2
    assert meta["head_dim"] == 16 and meta["n_layers"] == 2 and meta["window"] == [None, None]
    assert meta["rope"] == {"base": 10000.0, "convention": "half", "rotary_dim": None, "scaling": None}
    assert meta["d_ff"] == 160 and meta["vocab_size"] == 256 and meta["tied_embeddings"] is False


def test_bf16_weights_keep_f32_activations():
    m = Model("half", vocab=32, d_model=16, dtype="bf16")
    x = m.embed(m.input_ids())
    assert x.dtype == DType.f32 and x.value.producer.op == "cast"
    for layer in m.layers(1):
        x = x + layer.swiglu(layer.rms_norm(x), d_ff=32)
    logits = m.logits(x, tied=True)
    assert logits.dtype == DType.f32
    g = m.graph
    assert g.params["embed"].dtype == DType.bf16 and "lm_head" not in g.params
    assert g.outputs[0].producer.inputs[1] is g.params["embed"]


def test_qk_norm_bias_softcap_and_window():
    m = Model("qwen3ish", vocab=64, d_model=32)
    x = m.embed(m.input_ids(), scale=2.0)
    for layer in m.layers(2):
        x = x + layer.attention(layer.rms_norm(x), heads=4, kv_heads=1, head_dim=8, rope=Rope(rotary_dim=4),
                                qkv_bias=True, qk_norm=True, window=4 if layer.index == 0 else None,
                                softcap=20.0, scale=0.5)
        x = x + layer.gelu_mlp(layer.layer_norm(x), d_ff=64, bias=True)
    m.logits(m.rms_norm(x), softcap=30)
    g = m.graph
    verify(g)
    assert g.params["layers.0.attn.q_norm"].shape == (8,) and g.params["layers.0.attn.bk"].shape == (8,)
    assert g.meta["attention"] == "mqa" and g.meta["window"] == [4, None]
    assert g.outputs[0].producer.op == "softcap" and g.outputs[0].name == "logits"
    assert run_reference(g, check_feeds(g))[0].shape == (2, 3, 64)


def test_gemma2_dsl_matches_yaml():
    """Sandwich norms, offsets, softcaps, alternating windows, scaled tied embeddings."""
    spec = (EXAMPLES / "tiny-gemma2-9b.yaml").read_text()
    from_yaml = yaml_spec.loads(spec, "tiny-gemma2-9b.yaml")
    m = Model("tiny-gemma2-9b", vocab=256, d_model=64)
    x = m.embed(m.input_ids(), scale=math.sqrt(64))
    for layer in m.layers(3):
        h = layer.rms_norm(x, name="attn_norm", offset=1.0)
        h = layer.attention(h, heads=4, kv_heads=2, head_dim=32, rope=Rope(), softcap=50,
                            window=8 if layer.index % 2 == 0 else None, scale=24 ** -0.5)
        x = x + layer.rms_norm(h, name="post_attn_norm", offset=1.0)
        h = layer.geglu(layer.rms_norm(x, name="mlp_norm", offset=1.0), d_ff=128)
        x = x + layer.rms_norm(h, name="post_mlp_norm", offset=1.0)
    m.logits(m.rms_norm(x, offset=1.0), tied=True, softcap=30)
    assert print_graph(m.graph) == print_graph(from_yaml)
    assert m.graph.meta["window"] == [8, None, 8] and m.graph.meta["sandwich_norm"] is True


def test_moe_layers_and_shared_expert_gate():
    m = Model("qwen-moe", vocab=64, d_model=32)
    x = m.embed(m.input_ids())
    for layer in m.layers(1):
        x = x + layer.moe(layer.rms_norm(x), experts=4, top_k=2, d_ff=16, shared_experts=1, shared_d_ff=48,
                          shared_expert_gate=True)
    m.logits(x)
    g = m.graph
    assert g.params["layers.0.moe.shared_up"].shape == (48, 32)
    assert g.params["layers.0.moe.shared_expert_gate"].shape == (1, 32)
    assert g.meta["moe"]["layers"] == [0] and g.meta["d_ff"] is None


@pytest.mark.parametrize("call, arg, detail", [
    (lambda l, x: l.attention(x, heads=6, kv_heads=4), "kv_heads", "6 heads are not divisible by 4 kv heads"),
    (lambda l, x: l.attention(x, heads=5), "heads", "d_model 16 is not divisible by 5 heads"),
    (lambda l, x: l.attention(x, heads=2, head_dim=7, rope=Rope()), "head_dim", "needs an even dimension"),
    (lambda l, x: l.swiglu(x, d_ff=0), "d_ff", "expected a positive integer, got 0"),
    (lambda l, x: l.moe(x, experts=4, top_k=5, d_ff=8), "top_k", "top_k 5 exceeds 4 experts"),
    (lambda l, x: l.moe(x, experts=6, top_k=2, d_ff=8, groups=4, top_groups=2), "groups", "do not split"),
])
def test_bad_arguments_raise_at_the_call_site(call, arg, detail):
    m = Model("bad", vocab=8, d_model=16)
    x = m.embed(m.input_ids())
    layer = next(m.layers(1))
    with pytest.raises(ArgError) as err:
        call(layer, x)
    assert err.value.arg == arg and detail in err.value.detail
    assert err.value.location.startswith(f"{Path(__file__).name}:")


def test_rope_and_model_arguments_are_checked():
    with pytest.raises(SpecError, match="rope.convention: expected one of half, interleaved"):
        Rope(convention="sideways")
    with pytest.raises(SpecError, match="rope.scaling.original_max_position: llama3 scaling needs"):
        Rope(scaling={"kind": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4})
    with pytest.raises(SpecError, match="dtype"):
        Model("m", vocab=8, d_model=8, dtype="i8")
    m = Model("m", vocab=8, d_model=8)
    x = m.embed(m.input_ids())
    layer = next(m.layers(1))
    layer.rms_norm(x, name="attn_norm")
    with pytest.raises(SpecError, match="param @layers.0.attn_norm already exists"):
        layer.rms_norm(x, name="attn_norm")


def test_floats_are_normalised():
    def build(base):
        m = Model("m", vocab=8, d_model=8)
        x = m.embed(m.input_ids())
        for layer in m.layers(1):
            x = x + layer.attention(x, heads=2, rope=Rope(base=base))
        m.logits(x)
        return print_graph(m.graph)
    assert build(10000) == build(1e4)


def test_learned_positions_offset_and_relu_mlp():
    """``embed_positions(offset=2)`` reads row position + 2 (OPT's table); ``relu_mlp`` is
    fc2(relu(fc1(x) + b1)) + b2 as primitives."""
    import numpy as np
    from irc.interpreter import Interpreter

    m = Model("optish", vocab=8, d_model=4)
    x = m.embed_positions(m.embed(m.input_ids()), positions=7, offset=2)
    layer = next(m.layers(1))
    x = x + layer.relu_mlp(x, d_ff=6, bias=True)
    m.logits(x, tied=True)
    g = m.graph
    verify(g)
    assert g.meta["mlp"] == "relu" and g.meta["d_ff"] == 6
    assert {n.op for n in g.nodes} >= {"maximum", "linear"} and "gelu_mlp" not in {n.op for n in g.nodes}
    rng = np.random.default_rng(0)
    for param in g.params.values():
        param.data = rng.standard_normal(param.shape).astype(np.float32)
    ids, positions = np.array([[3, 1, 5]]), np.array([[0, 1, 4]])
    logits = Interpreter(g).run({"input_ids": ids, "attention_mask": np.ones((1, 3), np.int64),
                                 "position_ids": positions})["logits"]
    p = {name: param.data for name, param in g.params.items()}
    h = p["embed"][ids] + p["embed_positions"][positions + 2]
    up = np.maximum(h @ p["layers.0.mlp.w_up"].T + p["layers.0.mlp.b_up"], 0)
    h = h + up @ p["layers.0.mlp.w_down"].T + p["layers.0.mlp.b_down"]
    np.testing.assert_allclose(logits, h @ p["embed"].T, rtol=1e-5, atol=1e-5)
    short = Model("short", vocab=8, d_model=4)
    with pytest.raises(ArgError, match="offset: expected an integer in"):
        short.embed_positions(short.embed(short.input_ids()), positions=2, offset=2)
