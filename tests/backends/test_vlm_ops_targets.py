"""The VLM ops on the targets that run them: ``merge_tokens`` (image features into the
token embeddings at the placeholders) and ``image_blocks`` (each run of placeholders
numbered; with ``prefix``, a row holding one is one block), against their references and transformers' definitions, through the NumPy
module and both ONNX targets on ONNX Runtime: several images in a batch, none (0 feature
rows, a text step, where even a generated placeholder id keeps its embedding), a prompt that
ends in an image; the reference refuses a count that does not match."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from backends.numpy.emit import emit_module as emit_numpy
from backends.onnx.emit import emit_model
from backends.onnx.runtime import ort_engine
from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph
from irc.interpreter import run
from irc.ops.attention import image_blocks

TOKEN, WIDTH = 7, 4


def vlm_embedding() -> Graph:
    """ids [B, T], features [I, 4] -> (embeds with the features at the 7s, the 7s' blocks)."""
    g = Graph("vlm_embedding")
    ids = g.add_input("input_ids", DType.i64, ("B", "T"))
    features = g.add_input("image_features", DType.f32, ("I", WIDTH))
    embeds = emit1(g, "embedding", [ids, g.add_param("embed", DType.f32, (10, WIDTH))], {"scale": None}, "x")
    g.outputs = [emit1(g, "merge_tokens", [embeds, ids, features], {"token": TOKEN}, "inputs_embeds"),
                 emit1(g, "image_blocks", [ids], {"token": TOKEN}, "blocks"),
                 emit1(g, "image_blocks", [ids], {"token": TOKEN, "prefix": True}, "prefix_blocks")]
    g.params["embed"].data = np.arange(10 * WIDTH, dtype=np.float32).reshape(10, WIDTH)
    return g


CASES = {
    "two-images-in-a-batch": [[1, 7, 7, 2, 7, 7, 3], [7, 7, 4, 5, 6, 7, 7]],
    "text-only": [[1, 2, 3]],
    "ends-in-an-image": [[1, 2, 7, 7, 7]],
    "a-generated-placeholder-no-image": [[1, 7, 2]],  # a text step: 0 rows, the id keeps its embedding
}


def feeds(ids, case: str = "") -> dict:
    ids = np.asarray(ids, np.int64)
    rows = 0 if case.endswith("no-image") else int((ids == TOKEN).sum())
    return {"input_ids": ids, "image_features": -1 - np.arange(rows * WIDTH, dtype=np.float32).reshape(rows, WIDTH)}


def expected(fed: dict) -> dict:
    """transformers' masked_scatter and get_block_sequence_ids_for_mask, written out."""
    ids, features = fed["input_ids"], fed["image_features"]
    embeds = np.arange(10 * WIDTH, dtype=np.float32).reshape(10, WIDTH)[ids]
    if len(features):  # transformers merges nothing without pixel values
        embeds[ids == TOKEN] = features
    blocks = np.full(ids.shape, -1)
    for b, row in enumerate(ids):
        run_id = -1
        for t, token in enumerate(row):
            if token == TOKEN:
                run_id += t == 0 or row[t - 1] != TOKEN
                blocks[b, t] = run_id
    prefix = np.where((ids == TOKEN).any(axis=1, keepdims=True), 0, -1) + np.zeros(ids.shape, np.int64)
    return {"inputs_embeds": embeds, "blocks": blocks, "prefix_blocks": prefix}  # PaliGemma's: a row with one


def check(outputs: dict, fed: dict) -> None:
    want = expected(fed)
    np.testing.assert_array_equal(np.asarray(outputs["inputs_embeds"]), want["inputs_embeds"])
    np.testing.assert_array_equal(np.asarray(outputs["blocks"]), want["blocks"])
    np.testing.assert_array_equal(np.asarray(outputs["prefix_blocks"]), want["prefix_blocks"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference(case):
    fed = feeds(CASES[case], case)
    check(run(vlm_embedding(), fed), fed)
    np.testing.assert_array_equal(image_blocks(fed["input_ids"], TOKEN), expected(fed)["blocks"])


def test_reference_refuses_a_count_that_does_not_match():
    fed = feeds(CASES["ends-in-an-image"])
    fed["image_features"] = fed["image_features"][:2]
    with pytest.raises(ValueError, match="3 placeholder tokens .* but 2 feature rows"):
        run(vlm_embedding(), fed)


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_onnx_runtime(tmp_path, target):
    path = tmp_path / "embedding.onnx"
    emit_model(vlm_embedding(), str(path), target=target, genai=False)
    engine = ort_engine(str(path))
    for case in sorted(CASES):
        fed = feeds(CASES[case], case)
        check(engine(fed), fed)


def test_numpy_module(tmp_path):
    path = tmp_path / "embedding_np.py"
    emit_numpy(vlm_embedding(), str(path))
    spec = importlib.util.spec_from_file_location("embedding_np", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for case in sorted(CASES):
        fed = feeds(CASES[case], case)
        check(module.forward(module.load_weights(), **fed), fed)
