"""``block_topk_mask`` (irc.ops.sparse_index, MiniMax-M3's block selection): against
transformers' ``MiniMaxM3VLIndexer`` selection and ``build_block_mask`` fed the same scores
(left padding included: the positions lag the slots), shape inference, the ONNX lowering on
both targets and the Triton fallback's torch line, each against the reference."""
import numpy as np
import pytest

from irc import ops
from irc.build import emit
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Graph, Value
from irc.ops.sparse_index import block_topk_visible
from irc.testing import run_op


def case(seed: int, heads: int, seq: int, past: int, pads):
    """Scores [2, H, T, P+T], the left-padded rows' positions and mask (as generate makes them)."""
    rng = np.random.default_rng(seed)
    total = past + seq
    mask = np.ones((2, total), np.int64)
    for row, pad in enumerate(pads):
        mask[row, :pad] = 0
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)[:, past:]
    return rng.standard_normal((2, heads, seq, total)).astype(np.float32), positions, mask


def hf_selection(scores, positions, mask, block, k, local):
    """transformers 5.25's MiniMaxM3VLIndexer.forward after its matmul, then build_block_mask
    with the causal-and-padding mask create_causal_mask makes (bool, True = visible)."""
    torch = pytest.importorskip("torch")
    from transformers.models.minimax_m3_vl.modeling_minimax_m3_vl import MiniMaxM3VLIndexer

    batch, heads, seq, total = scores.shape
    position_ids = torch.from_numpy(positions)
    scores = torch.from_numpy(scores).masked_fill(torch.arange(total)[None, None, None, :] >
                                                  position_ids[:, None, :, None], float("-inf"))
    blocks = -(-total // block)
    scores = torch.nn.functional.pad(scores, (0, blocks * block - total), value=float("-inf"))
    pooled = scores.view(batch, heads, seq, blocks, block).amax(dim=-1)
    if local > 0:
        index = (position_ids // block)[..., None] - torch.arange(local).view(1, 1, -1)
        pooled.scatter_(-1, index.clamp(min=0).unsqueeze(1).expand(-1, heads, -1, -1), float("inf"))
    values, indices = pooled.topk(min(k, blocks), dim=-1)
    indices = indices.masked_fill(values == float("-inf"), -1)
    query = (total - seq) + torch.arange(seq)[:, None]
    visible = (torch.arange(total)[None, :] <= query)[None, None] & torch.from_numpy(mask != 0)[:, None, None, :]
    indexer = MiniMaxM3VLIndexer.__new__(MiniMaxM3VLIndexer)
    indexer.block_size, indexer.config = block, type("C", (), {"num_attention_heads": heads})()
    additive = indexer.build_block_mask(indices, visible, total, torch.float32, "cpu", position_ids)
    return (additive == 0).numpy()


@pytest.mark.parametrize("heads, seq, past, block, k, local, pads", [
    (2, 9, 0, 2, 2, 1, [0, 3]), (1, 1, 8, 3, 2, 1, [0, 2]), (2, 5, 4, 2, 3, 2, [1, 0]), (1, 7, 0, 4, 1, 0, [0, 5]),
    (2, 6, 0, 1, 3, 1, [0, 2])])
def test_matches_transformers_selection(heads, seq, past, block, k, local, pads):
    scores, positions, mask = case(seq + past, heads, seq, past, pads)
    attrs = {"block": block, "k": k, "local": local}
    (got,) = run_op("block_topk_mask", [scores, positions, mask], attrs)
    np.testing.assert_array_equal(got, hf_selection(scores, positions, mask, block, k, local))


@pytest.mark.parametrize("shapes, attrs, message", [
    (((2, 3, 5), (2, 3)), {"block": 2, "k": 1}, "float \\[B, H, T, S\\]"),
    (((2, 1, 3, 5), (2, 4)), {"block": 2, "k": 1}, "position_ids must be"),
    (((2, 1, 3, 5), (2, 3)), {"block": 0, "k": 1}, "block must be a positive int"),
    (((2, 1, 3, 5), (2, 3)), {"block": 2, "k": 1, "local": 2}, "local must be an int in \\[0, k\\]")])
def test_inference_refuses(shapes, attrs, message):
    inputs = [Value("s", DType.f32, shapes[0]), Value("p", DType.i64, shapes[1])]
    with pytest.raises(ShapeError, match=message):
        ops.infer("block_topk_mask", inputs, ops.get_op("block_topk_mask").normalize_attrs(attrs))


def block_graph(attrs: dict) -> Graph:
    g = Graph("block_topk_mask")
    scores = g.add_input("scores", DType.f32, ("B", 2, "T", "P+T"))
    positions = g.add_input("position_ids", DType.i64, ("B", "T"))
    mask = g.add_input("attention_mask", DType.i64, ("B", "P+T"))
    g.outputs = emit(g, "block_topk_mask", [scores, positions, mask], attrs, ["keep"])
    return g


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("seq, past, block, k, local", [(9, 0, 2, 2, 1), (1, 8, 3, 2, 1), (5, 4, 2, 3, 2)])
def test_onnx_equals_the_reference(tmp_path, target, seq, past, block, k, local):
    ort = pytest.importorskip("onnxruntime")
    from backends.onnx.emit import emit_model
    from irc.interpreter import Interpreter

    graph = block_graph({"block": block, "k": k, "local": local})
    path = str(tmp_path / "m.onnx")
    emit_model(graph, path, target=target, genai=False)
    scores, positions, mask = case(seq, 2, seq, past, [0, 3])
    feeds = {"scores": scores, "position_ids": positions, "attention_mask": mask}
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (got,) = session.run(None, feeds)
    np.testing.assert_array_equal(got, Interpreter(graph).run(feeds)["keep"])


def test_triton_fallback_line_equals_the_reference():
    torch = pytest.importorskip("torch")
    from backends.triton.fallback import HELPERS, fallback_line

    attrs = {"block": 2, "k": 2, "local": 1}
    line, helpers = fallback_line("block_topk_mask", attrs, ["s", "p", "m"], [Value("keep", DType.bool, (2, 2, 5, 9))])
    namespace = {"torch": torch}
    for name in sorted(helpers):
        exec(HELPERS[name], namespace)
    scores, positions, mask = case(3, 2, 5, 4, [0, 6])
    got = eval(line, {**namespace, "s": torch.from_numpy(scores), "p": torch.from_numpy(positions),
                      "m": torch.from_numpy(mask)})
    np.testing.assert_array_equal(got.numpy(), block_topk_visible(scores, positions, mask, **attrs))
