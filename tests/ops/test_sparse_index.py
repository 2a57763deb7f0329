"""``topk_mask`` (irc.ops.sparse_index): against transformers' DeepSeek-V3.2 selection (the
indexer's topk over scores plus the additive causal mask, scattered into the attention mask),
its ties, short rows, shape inference and cost, the ONNX lowering on both targets and the
Triton fallback's torch line, each against the reference."""
import numpy as np
import pytest

from irc import ops
from irc.build import emit
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Graph, Value
from irc.ops.registry import TensorType
from irc.ops.sparse_index import topk_visible
from irc.testing import run_op


def padded_mask(batch: int, total: int, pads) -> np.ndarray:
    mask = np.ones((batch, total), np.int64)
    for row, pad in enumerate(pads):
        mask[row, :pad] = 0
    return mask


def hf_selection(scores, mask, k):
    """transformers 5.25's DeepseekV32Indexer + DeepseekV32Attention (eager): the float
    additive mask (0 visible, float32 min hidden) added to the scores, topk(min(k, S)), the
    indices scattered into a 'masked' mask, combined with the causal mask."""
    torch = pytest.importorskip("torch")
    batch, seq, total = scores.shape
    query = (total - seq) + torch.arange(seq)[:, None]
    visible = (torch.arange(total)[None, :] <= query)[None] & torch.from_numpy(mask != 0)[:, None, :]
    additive = torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)
    index = (torch.from_numpy(scores) + additive).topk(min(k, total), dim=-1).indices
    dropped = torch.ones(visible.shape, dtype=torch.bool).scatter(-1, index, False)
    return (visible & ~dropped).numpy()


@pytest.mark.parametrize("seq, past, k, pads", [(7, 0, 3, [0, 4]), (1, 6, 4, [0, 2]), (3, 4, 20, [1, 0]),
                                                (9, 0, 1, [0, 8])])
def test_matches_transformers_selection(seq, past, k, pads):
    rng = np.random.default_rng(seq * 10 + past)
    scores = rng.standard_normal((2, seq, past + seq)).astype(np.float32)
    mask = padded_mask(2, past + seq, pads)
    (got,) = run_op("topk_mask", [scores, mask], {"k": k})
    np.testing.assert_array_equal(got, hf_selection(scores, mask, k))


def test_each_row_keeps_k_visible_keys_or_all_it_sees():
    scores = np.random.default_rng(0).standard_normal((1, 6, 6)).astype(np.float32)
    (got,) = run_op("topk_mask", [scores], {"k": 3})
    np.testing.assert_array_equal(got.sum(-1)[0], [1, 2, 3, 3, 3, 3])
    assert not np.triu(got[0], 1).any()  # nothing after the query


def test_ties_keep_the_lower_key_index_and_bidirectional_sees_every_key():
    scores = np.zeros((1, 2, 5), np.float32)
    scores[0, :, 3], scores[0, :, 4] = 1.0, 2.0
    (got,) = run_op("topk_mask", [scores], {"k": 2, "causal": False})
    np.testing.assert_array_equal(got[0], [[0, 0, 0, 1, 1]] * 2)
    # causal: 3 keys cached, query 0 at key 3 cannot see key 4 and takes the lowest of the tied zeros
    np.testing.assert_array_equal(topk_visible(scores, k=2)[0], [[1, 0, 0, 1, 0], [0, 0, 0, 1, 1]])


@pytest.mark.parametrize("shape, mask_shape, k, message", [
    ((2, 3), None, 2, "float \\[B, T, S\\]"), ((2, 3, 5), (2, 4), 2, "attention_mask must be"),
    ((2, 3, 5), None, 0, "positive int")])
def test_inference_refuses(shape, mask_shape, k, message):
    inputs = [Value("s", DType.f32, shape)] + ([Value("m", DType.i64, mask_shape)] if mask_shape else [])
    with pytest.raises(ShapeError, match=message):
        ops.infer("topk_mask", inputs, ops.get_op("topk_mask").normalize_attrs({"k": k}))


def test_infers_bool_and_costs_one_operation_per_score():
    scores = TensorType(DType.f32, (2, 3, 5))
    out = ops.infer("topk_mask", [scores], ops.get_op("topk_mask").normalize_attrs({"k": 2}))
    assert out == [TensorType(DType.bool, (2, 3, 5))]
    cost = ops.get_op("topk_mask").cost([scores], out, {"k": 2, "causal": True})
    assert cost.other_flops == 30 and cost.bytes_read == 120 and cost.bytes_written == 30


def mask_graph(k: int) -> Graph:
    g = Graph("topk_mask")
    scores = g.add_input("scores", DType.f32, ("B", "T", "P+T"))
    mask = g.add_input("attention_mask", DType.i64, ("B", "P+T"))
    g.outputs = emit(g, "topk_mask", [scores, mask], {"k": k}, ["keep"])
    return g


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("seq, past, k", [(6, 0, 3), (1, 5, 2), (3, 2, 9)])
def test_onnx_equals_the_reference(tmp_path, target, seq, past, k):
    ort = pytest.importorskip("onnxruntime")
    from backends.onnx.emit import emit_model
    from irc.interpreter import Interpreter

    graph = mask_graph(k)
    path = str(tmp_path / "m.onnx")
    emit_model(graph, path, target=target, genai=False)
    rng = np.random.default_rng(seq + past)
    feeds = {"scores": rng.standard_normal((2, seq, past + seq)).astype(np.float32),
             "attention_mask": padded_mask(2, past + seq, [0, 2])}
    feeds["scores"][1, :, 3:5] = 0.5  # a tie
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (got,) = session.run(None, feeds)
    np.testing.assert_array_equal(got, Interpreter(graph).run(feeds)["keep"])


def test_triton_fallback_line_equals_the_reference():
    torch = pytest.importorskip("torch")
    from backends.triton.fallback import HELPERS, fallback_line

    line, helpers = fallback_line("topk_mask", {"k": 3, "causal": True}, ["s", "m"],
                                  [Value("keep", DType.bool, (2, 4, 7))])
    namespace = {"torch": torch}
    for name in sorted(helpers):
        exec(HELPERS[name], namespace)
    rng = np.random.default_rng(1)
    scores, mask = rng.standard_normal((2, 4, 7)).astype(np.float32), padded_mask(2, 7, [0, 5])
    got = eval(line, {**namespace, "s": torch.from_numpy(scores), "m": torch.from_numpy(mask)})
    np.testing.assert_array_equal(got.numpy(), topk_visible(scores, mask, k=3))
