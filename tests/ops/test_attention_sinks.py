"""attention with sinks (GPT-OSS): the reference against transformers' gpt_oss eager attention
(GQA, MQA, windows, left padding, KV cache), a hand-written softmax, rows that see no key,
inference and cost; the ONNX lowerings (the grouped MatMul path at opsets 21 and 23, the
onnx-ort fallback without a cache) against the reference."""
import types

import numpy as np
import pytest

from irc import ops
from irc.build import emit
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Graph, Value
from irc.ops.attention import masked_softmax
from irc.ops.registry import TensorType
from irc.testing import run_op
from tests.ops.test_attention import heads_first, hf_mask, left_padded_mask, randn

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

CASES = {"gqa": (4, 2, None), "mqa": (4, 1, None), "mha-window": (2, 2, 3), "gqa-window": (6, 2, 4)}


def hf_gpt_oss_eager(q4, k4, v4, mask4, sinks, scale):
    """transformers' GPT-OSS eager attention on [B, H, T, D]; returns [B, T, H*D]."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    module = types.SimpleNamespace(num_key_value_groups=q4.shape[1] // k4.shape[1], training=False,
                                   sinks=torch.from_numpy(sinks))
    tensors = (torch.from_numpy(np.ascontiguousarray(a)) for a in (q4, k4, v4))
    out, _ = eager_attention_forward(module, *tensors, mask4, scaling=scale)
    return out.reshape(q4.shape[0], q4.shape[2], -1).numpy()


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("past", [0, 3])
def test_matches_transformers_gpt_oss(name, past):
    heads, kv_heads, window = CASES[name]
    head_dim, batch, seq = 8, 3, 6
    rng = np.random.default_rng(11)
    q, k = randn(rng, batch, seq, heads * head_dim, scale=1.5), randn(rng, batch, seq, kv_heads * head_dim, scale=1.5)
    v = randn(rng, batch, seq, kv_heads * head_dim)
    sinks = randn(rng, heads, scale=2.0)
    mask = left_padded_mask(batch, past + seq, [0, 2, past + 1])
    pasts = [randn(rng, batch, kv_heads, past, head_dim), randn(rng, batch, kv_heads, past, head_dim)] if past \
        else [None, None]
    attrs = {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "window": window}
    outs = run_op("attention", [q, k, v, mask, *pasts, sinks], attrs)
    key, value = heads_first(k, kv_heads), heads_first(v, kv_heads)
    if past:
        key, value = np.concatenate([pasts[0], key], axis=2), np.concatenate([pasts[1], value], axis=2)
    want = hf_gpt_oss_eager(heads_first(q, heads), key, value, hf_mask(batch, seq, past, mask, window), sinks,
                            head_dim ** -0.5)
    real = mask[:, past:].astype(bool)
    np.testing.assert_allclose(outs[0][real], want[real], rtol=1e-5, atol=1e-5)
    assert np.all(outs[0][~real] == 0)  # a padding row sees no key: zeros, the sink takes it all
    (plain,) = run_op("attention", [q, k, v, mask, *pasts], attrs)[:1]
    assert not np.allclose(plain[real], outs[0][real], atol=1e-3)  # the sinks matter


def test_masked_softmax_by_hand():
    scores = np.array([[1.0, 2.0, 3.0, -1.0]], np.float32)
    visible = np.array([[True, True, False, True]])
    sink = np.array([[0.5]], np.float32)
    e = np.exp(np.array([1.0, 2.0, 0.0, -1.0])) * visible[0]
    want = e / (e.sum() + np.exp(0.5))
    np.testing.assert_allclose(masked_softmax(scores, visible, sink)[0], want, rtol=1e-6)
    assert masked_softmax(scores, visible, sink).sum() < 1.0
    np.testing.assert_array_equal(masked_softmax(scores, np.zeros_like(visible), sink), np.zeros((1, 4)))


def test_a_huge_sink_silences_the_head():
    rng = np.random.default_rng(0)
    q, k, v = randn(rng, 1, 4, 16), randn(rng, 1, 4, 16), randn(rng, 1, 4, 16)
    (out,) = run_op("attention", [q, k, v, None, None, None, np.array([80.0, -80.0], np.float32)],
                    {"heads": 2, "kv_heads": 2, "head_dim": 8})
    (plain,) = run_op("attention", [q, k, v], {"heads": 2, "kv_heads": 2, "head_dim": 8})
    assert np.abs(out[..., :8]).max() < 1e-20
    np.testing.assert_allclose(out[..., 8:], plain[..., 8:], rtol=1e-6)


@pytest.mark.parametrize("shape, dtype, message", [((3,), DType.f32, r"sinks \[3\] should be \[4\]"),
                                                   ((4, 1), DType.f32, "sinks"),
                                                   ((4,), DType.i64, "sinks must be float")])
def test_inference_refuses_bad_sinks(shape, dtype, message):
    q, k = Value("q", DType.f32, ("B", "T", 32)), Value("k", DType.f32, ("B", "T", 16))
    v = Value("v", DType.f32, ("B", "T", 16))
    with pytest.raises(ShapeError, match=message):
        ops.infer("attention", [q, k, v, None, None, None, Value("s", dtype, shape)],
                  ops.get_op("attention").normalize_attrs({"heads": 4, "kv_heads": 2, "head_dim": 8}))


def test_cost_adds_the_sink_term_only():
    types_ = [TensorType(DType.f32, (2, 5, 32)), TensorType(DType.f32, (2, 5, 16)), TensorType(DType.f32, (2, 5, 16))]
    out = [TensorType(DType.f32, (2, 5, 32))]
    attrs = ops.get_op("attention").normalize_attrs({"heads": 4, "kv_heads": 2, "head_dim": 8})
    plain = ops.get_op("attention").cost(types_, out, attrs)
    sunk = ops.get_op("attention").cost(types_ + [None, None, None, TensorType(DType.f32, (4,))], out, attrs)
    assert sunk.flops == plain.flops
    assert sunk.other_flops - plain.other_flops == 2 * 2 * 5 * 4
    assert sunk.bytes_read - plain.bytes_read == 16


# ---- ONNX ----------------------------------------------------------------------------------------

def sink_graph(heads, kv_heads, head_dim, window, sinks) -> Graph:
    """q, k, v, attention_mask and a past cache as inputs; the sinks a param."""
    g = Graph("sinks")
    q = g.add_input("q", DType.f32, ("B", "T", heads * head_dim))
    k = g.add_input("k", DType.f32, ("B", "T", kv_heads * head_dim))
    v = g.add_input("v", DType.f32, ("B", "T", kv_heads * head_dim))
    mask = g.add_input("attention_mask", DType.i64, ("B", "P+T"))
    past = [g.add_input(f"past_key_values.0.{x}", DType.f32, ("B", kv_heads, "P", head_dim)) for x in ("key", "value")]
    param = g.add_param("attn.sinks", DType.f32, (heads,), sinks)
    g.outputs = emit(g, "attention", [q, k, v, mask, *past, param],
                     {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "window": window},
                     ["out", "present.0.key", "present.0.value"])
    return g


@pytest.mark.parametrize("target, opset", [("onnx", 23), ("onnx", 21)])
@pytest.mark.parametrize("name", ["gqa-window", "mqa"])
def test_onnx_grouped_path_equals_the_reference(tmp_path, name, target, opset):
    ort = pytest.importorskip("onnxruntime")
    import onnx

    from backends.onnx.emit import emit_model
    from irc.interpreter import Interpreter

    heads, kv_heads, window = CASES[name]
    rng = np.random.default_rng(5)
    graph = sink_graph(heads, kv_heads, 8, window, randn(rng, heads, scale=2.0))
    path = str(tmp_path / "sinks.onnx")
    emit_model(graph, path, target=target, opset=opset, genai=False)
    kinds = {node.op_type for node in onnx.load(path).graph.node}
    assert "Attention" not in kinds and "Concat" in kinds  # no standard op takes a sink
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    batch, seq, past = 2, 5, 3
    feeds = {"q": randn(rng, batch, seq, heads * 8), "k": randn(rng, batch, seq, kv_heads * 8),
             "v": randn(rng, batch, seq, kv_heads * 8), "attention_mask": left_padded_mask(batch, past + seq, [0, 4]),
             "past_key_values.0.key": randn(rng, batch, kv_heads, past, 8),
             "past_key_values.0.value": randn(rng, batch, kv_heads, past, 8)}
    want = Interpreter(graph).run(feeds)
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    for name_, value in want.items():
        np.testing.assert_allclose(got[name_], value, rtol=1e-5, atol=1e-6, err_msg=name_)


def test_head_sink_is_groupqueryattentions_input(tmp_path):
    """``head_sink`` names the sinks in the query's type: what GroupQueryAttention's input 11
    takes (ORT 1.32 computes the sink softmax with it, measured in the GPT-OSS twins)."""
    from backends.onnx.attention import head_sink
    from backends.onnx.emit import build

    graph = sink_graph(4, 2, 8, None, np.arange(4, dtype=np.float32))
    b = build(graph, target="onnx")
    node = next(n for n in graph.nodes if n.op == "attention")
    assert head_sink(b, node) == "attn.sinks"
    graph.nodes[0].inputs = graph.nodes[0].inputs[:6]
    assert head_sink(b, graph.nodes[0]) == ""
