"""Qwen-VL's mechanisms as ops, against transformers 5.25's own functions and on every target
that runs them (the NumPy module, both ONNX targets on ONNX Runtime):

- ``rope`` with ``mrope``: Qwen2-VL's sectioned multimodal RoPE (``Qwen2VLRotaryEmbedding``),
  Qwen3-VL's interleaved one (``Qwen3VLTextRotaryEmbedding``), the towers' 2-D RoPE
  (``per_axis``: ``VisionRotaryEmbedding``'s height then width frequencies);
- ``patch_grid``: the patches' 2-D positions (``get_vision_position_ids``), frames
  (``get_vision_cu_seqlens``) and windows (``get_vision_window_index``: the same partition of
  the patches into windows), for several images, a two-frame grid and windows that do not
  divide the grid;
- ``resample_positions``: a learned S x S position grid resampled to each image's grid
  (``get_vision_interpolation_indices_and_weights``, bilinear, corners aligned: Qwen3.5's
  ``pos_embed``), up and down and to a 1-patch side;
- a bidirectional ``attention`` with ``blocks``: block-diagonal (transformers' packed
  ``cu_seqlens`` attention, each block alone)."""
import importlib.util

import numpy as np
import pytest

from backends.numpy.emit import emit_module
from backends.onnx.emit import emit_model
from backends.onnx.runtime import ort_engine
from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph
from irc.interpreter import run
from irc.ops.vision import patch_grid, resample_positions

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HEADS, HEAD_DIM = 2, 12
GRIDS = np.array([[1, 8, 12], [2, 4, 6], [1, 10, 4]])  # t, h, w: 96, 48 and 40 patches


def targets(graph: Graph, feeds: dict, tmp_path) -> dict:
    """target -> outputs of ``graph`` on ``feeds``: reference, NumPy module, onnx, onnx-ort."""
    out = {"reference": run(graph, feeds)}
    emit_module(graph, str(tmp_path / "m.py"))
    spec = importlib.util.spec_from_file_location("m", tmp_path / "m.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out["numpy"] = module.forward(module.load_weights(), **feeds)
    for target in ("onnx", "onnx-ort"):
        emit_model(graph, str(tmp_path / f"{target}.onnx"), target=target, genai=False)
        out[target] = ort_engine(str(tmp_path / f"{target}.onnx"))(feeds)
    return out


def rope_graph(mrope: dict, axes: int) -> Graph:
    g = Graph("mrope")
    x = g.add_input("x", DType.f32, ("B", "T", HEADS * HEAD_DIM))
    positions = g.add_input("position_ids", DType.i64, (axes, "B", "T"))
    g.outputs = [emit1(g, "rope", [x, positions], {"head_dim": HEAD_DIM, "base": 10000.0, "mrope": mrope}, "y")]
    return g


def hf_text_rope(kind: str, x: np.ndarray, positions: np.ndarray, sections=(2, 2, 2)) -> np.ndarray:
    """transformers' rotary embedding and apply_rotary_pos_emb on x [B, T, H·D]."""
    module = getattr(transformers.models, kind)
    modeling = getattr(module, f"modeling_{kind}")
    if kind == "qwen2_vl":
        config = transformers.Qwen2VLTextConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                 "mrope_section": [2, 2, 2]})
        rotary = modeling.Qwen2VLRotaryEmbedding(config)
    else:
        config = transformers.Qwen3VLTextConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                                                head_dim=HEAD_DIM, rope_parameters={
                                                    "rope_type": "default", "rope_theta": 10000.0,
                                                    "mrope_section": list(sections), "mrope_interleaved": True})
        rotary = modeling.Qwen3VLTextRotaryEmbedding(config)
    q = torch.from_numpy(x).view(x.shape[0], x.shape[1], HEADS, HEAD_DIM).transpose(1, 2)
    cos, sin = rotary(q, torch.from_numpy(positions))
    rotated, _ = modeling.apply_rotary_pos_emb(q, q, cos, sin)
    return rotated.transpose(1, 2).reshape(x.shape).numpy()


def text_feeds(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((2, 7, HEADS * HEAD_DIM)).astype(np.float32),
            "position_ids": rng.integers(0, 40, (3, 2, 7)).astype(np.int64)}


@pytest.mark.parametrize("kind, layout, sections", [("qwen2_vl", "sections", [2, 2, 2]),
                                                     ("qwen3_vl", "interleaved", [2, 2, 2]),
                                                     ("qwen3_vl", "interleaved", [11, 11, 10])])
def test_text_mrope_is_transformers(tmp_path, kind, layout, sections):
    """Interleaved sections that add up to more pairs than there are (Qwen3.5's default on a
    head of 6 pairs): the strides clipped, as transformers' slices clip them."""
    feeds = text_feeds(1)
    want = hf_text_rope(kind, feeds["x"], feeds["position_ids"], sections)
    for target, out in targets(rope_graph({"sections": sections, "layout": layout}, 3), feeds, tmp_path).items():
        np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-5, err_msg=target)


def test_equal_axes_are_plain_rope():
    """Text alone: every axis the same position, which is RoPE (what the decoder does without an image)."""
    feeds = text_feeds(2)
    feeds["position_ids"][:] = feeds["position_ids"][0]
    plain = Graph("plain")
    x = plain.add_input("x", DType.f32, ("B", "T", HEADS * HEAD_DIM))
    positions = plain.add_input("position_ids", DType.i64, ("B", "T"))
    plain.outputs = [emit1(plain, "rope", [x, positions], {"head_dim": HEAD_DIM, "base": 10000.0}, "y")]
    for layout in ("sections", "interleaved"):
        got = run(rope_graph({"sections": [2, 2, 2], "layout": layout}, 3), feeds)["y"]
        want = run(plain, {"x": feeds["x"], "position_ids": feeds["position_ids"][0]})["y"]
        np.testing.assert_array_equal(got, want)


def test_vision_rope_is_transformers(tmp_path):
    """The towers' 2-D RoPE: a quarter of each head's pairs by the row, a quarter by the column."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as modeling

    config = transformers.Qwen2_5_VLVisionConfig(hidden_size=HEADS * HEAD_DIM, num_heads=HEADS)
    rotary = modeling.Qwen2_5_VLVisionRotaryEmbedding(config)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 9, HEADS * HEAD_DIM)).astype(np.float32)
    positions = rng.integers(0, 20, (2, 1, 9)).astype(np.int64)
    cos, sin = rotary(torch.from_numpy(x), torch.from_numpy(positions[:, 0].T.copy()))
    q = torch.from_numpy(x[0]).view(9, HEADS, HEAD_DIM)
    want, _ = modeling.apply_rotary_pos_emb_vision(q, q, cos, sin)
    graph = rope_graph({"sections": [HEAD_DIM // 4] * 2, "layout": "per_axis"}, 2)
    for target, out in targets(graph, {"x": x, "position_ids": positions}, tmp_path).items():
        np.testing.assert_allclose(out["y"][0], want.reshape(9, -1).numpy(), rtol=1e-5, atol=1e-5, err_msg=target)


def grid_graph(window) -> Graph:
    g = Graph("grid")
    grid = g.add_input("image_grid_thw", DType.i64, ("N", 3))
    pixels = g.add_input("pixel_values", DType.f32, ("P", 5))
    g.outputs = [emit1(g, "patch_grid", [grid, pixels], {"merge": 2, "window": window}, "where")]
    return g


@pytest.mark.parametrize("window", [None, 2, 3])
def test_patch_grid_is_transformers(tmp_path, window):
    from transformers.vision_utils import get_vision_cu_seqlens, get_vision_position_ids, get_vision_window_index

    count = int(GRIDS.prod(1).sum())
    grids = torch.from_numpy(GRIDS)
    where = patch_grid(GRIDS, count, 2, window)
    np.testing.assert_array_equal(where[:2].T, get_vision_position_ids(grids, 2).numpy())
    frames = get_vision_cu_seqlens(grids).numpy()
    np.testing.assert_array_equal(np.searchsorted(frames, np.arange(count), side="right") - 1, where[2])
    heights, widths = (np.repeat(GRIDS[:, k], GRIDS.prod(1)) for k in (1, 2))
    np.testing.assert_array_equal(where[4:], np.stack([heights, widths]))
    if window is not None:  # the same partition of the patches: transformers' windows, in its order
        index, bounds = get_vision_window_index(grids, 2, window * 2 * 14, 14)
        order = (index.numpy()[:, None] * 4 + np.arange(4)).reshape(-1)  # merged blocks -> their 4 patches
        bounds = bounds.numpy()
        for start, end in zip(bounds[:-1], bounds[1:]):
            assert len(set(where[3][order[start:end]])) == 1
        assert len(set(where[3])) == len(bounds) - 1
    feeds = {"image_grid_thw": GRIDS, "pixel_values": np.zeros((count, 5), np.float32)}
    for target, out in targets(grid_graph(window), feeds, tmp_path).items():
        np.testing.assert_array_equal(out["where"], where, err_msg=target)


@pytest.mark.parametrize("side", [5, 2])
def test_resample_positions_is_transformers(tmp_path, side):
    """An S x S table to grids of 8 x 12, 4 x 6 (two frames), 10 x 4 and a 2 x 2 one: larger,
    smaller and not square, on every target."""
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights

    grids = np.concatenate([GRIDS, [[1, 2, 2]]])
    count = int(grids.prod(1).sum())
    table = np.random.default_rng(side).standard_normal((side * side, 7)).astype(np.float32)
    index, weight = get_vision_interpolation_indices_and_weights(torch.from_numpy(grids), side, mode="bilinear",
                                                                 align_corners=True, spatial_merge_size=2)
    want = (torch.from_numpy(table)[index] * weight[:, :, None]).sum(1).numpy()
    np.testing.assert_allclose(resample_positions(table, patch_grid(grids, count, 2), side), want, rtol=1e-5,
                               atol=1e-6)
    g = Graph("resample")
    grid = g.add_input("image_grid_thw", DType.i64, ("N", 3))
    pixels = g.add_input("pixel_values", DType.f32, ("P", 5))
    where = emit1(g, "patch_grid", [grid, pixels], {"merge": 2, "window": None}, "where")
    g.outputs = [emit1(g, "resample_positions", [g.add_input("table", DType.f32, (side * side, 7)), where],
                       {"side": side}, "positions")]
    feeds = {"image_grid_thw": grids, "pixel_values": np.zeros((count, 5), np.float32), "table": table}
    for target, out in targets(g, feeds, tmp_path).items():
        np.testing.assert_allclose(out["positions"], want, rtol=1e-5, atol=1e-6, err_msg=target)


def test_patch_grid_refuses_a_count_that_does_not_match():
    with pytest.raises(ValueError, match="hold 184 patches but pixel_values has 183 rows"):
        patch_grid(GRIDS, 183, 2)


def test_block_diagonal_attention_is_each_block_alone(tmp_path):
    rng = np.random.default_rng(4)
    g = Graph("blocks")
    q, k, v = (g.add_input(n, DType.f32, ("B", "T", HEADS * HEAD_DIM)) for n in "qkv")
    blocks = g.add_input("blocks", DType.i64, ("B", "T"))
    g.outputs = [emit1(g, "attention", [q, k, v, None, None, None, None, blocks],
                       {"heads": HEADS, "kv_heads": HEADS, "head_dim": HEAD_DIM, "causal": False}, "out")]
    ids = np.array([[0, 0, 1, 1, 1, 0, 2, 2, 2]])
    feeds = {n: rng.standard_normal((1, 9, HEADS * HEAD_DIM)).astype(np.float32) for n in "qkv"}
    feeds["blocks"] = ids
    want = np.zeros_like(feeds["q"])
    for block in (0, 1, 2):
        rows = ids[0] == block
        part = {n: feeds[n][:, rows] for n in "qkv"}
        heads = [torch.from_numpy(part[n]).view(1, -1, HEADS, HEAD_DIM).transpose(1, 2) for n in "qkv"]
        alone = torch.nn.functional.scaled_dot_product_attention(*heads)
        want[:, rows] = alone.transpose(1, 2).reshape(1, -1, HEADS * HEAD_DIM).numpy()
    for target, out in targets(g, feeds, tmp_path).items():
        np.testing.assert_allclose(out["out"], want, rtol=1e-5, atol=1e-5, err_msg=target)
