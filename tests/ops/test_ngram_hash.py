"""Qwen4-Exp's hashed n-gram ids (``irc.ops.ngram``): the reference against transformers'
``Qwen4ExpTextNGramEmbedding`` (the ids it looks up, eos in the tokens), the state carried
across pieces equal to one run, padded tokens read as eos, shape inference; the ONNX
lowering (both targets, in ONNX Runtime) and the Triton fallback equal the reference."""
import numpy as np
import pytest

from irc.dtypes import DType
from irc.errors import ShapeError
from irc.ops import TensorType, infer
from irc.ops.ngram import ngram_hash

EOS = 2


def _module(ngram_size: int = 3, heads: int = 2):
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen4_exp import modeling_qwen4_exp as module

    config = transformers.Qwen4ExpTextConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=1, layer_types=["linear_attention"], ple_layer_ids=[1],
        ngram_size=ngram_size, heads_per_ngram=heads, ngram_vocab_size_base=100,
        ple_embed_dim=(ngram_size - 1) * heads * 4, eos_token_id=EOS)
    return module.Qwen4ExpTextNGramEmbedding(config, config.ple_embed_dim, 0, 1)


def _attrs(embedding) -> dict:
    return {"eos": EOS, "multipliers": embedding.layer_multipliers.tolist(), "primes": embedding.head_vocab_sizes,
            "offsets": embedding.head_offsets, "heads_per_ngram": embedding.heads_per_ngram}


@pytest.mark.parametrize("ngram_size, heads", [(3, 2), (4, 1), (2, 3)])
def test_matches_transformers_ngram_ids(ngram_size, heads):
    torch = pytest.importorskip("torch")
    embedding = _module(ngram_size, heads)
    seen = []
    lookup = embedding.ngram_embedding.forward
    embedding.ngram_embedding.forward = lambda ids: (seen.append(ids), lookup(ids))[1]
    ids = np.random.default_rng(ngram_size).integers(0, 6, (2, 13))  # eos (2) several times
    embedding(torch.from_numpy(ids), None)
    got, _ = ngram_hash(ids, **_attrs(embedding))
    np.testing.assert_array_equal(got, seen[0].numpy())


def test_pieces_with_the_state_carried_equal_one_run():
    embedding = _module()
    attrs = _attrs(embedding)
    ids = np.random.default_rng(1).integers(0, 6, (2, 12))
    whole, state = ngram_hash(ids, past_state=np.zeros((2, 2), np.float32), **attrs)
    pieces, mid = [], np.zeros((2, 2), np.float32)
    for start, end in ((0, 1), (1, 5), (5, 6), (6, 12)):
        out, mid = ngram_hash(ids[:, start:end], past_state=mid, **attrs)
        pieces.append(out)
    np.testing.assert_array_equal(np.concatenate(pieces, axis=1), whole)
    np.testing.assert_array_equal(mid, state)
    np.testing.assert_array_equal(state, ids[:, -2:] + 1)


def test_padded_tokens_read_as_eos():
    """A left-padded row gives its tokens the ids the row alone gets (the padding, like the
    empty history, is eos)."""
    attrs = _attrs(_module())
    row = np.array([[7, 9, 4, 2, 5, 8]])
    padded = np.concatenate([np.full((1, 3), 11), row], axis=1)
    mask = np.concatenate([np.zeros((1, 3), np.int64), np.ones((1, 6), np.int64)], axis=1)
    got, _ = ngram_hash(padded, mask, **attrs)
    np.testing.assert_array_equal(got[:, 3:], ngram_hash(row, **attrs)[0])


def test_shape_inference():
    attrs = _attrs(_module())
    ids, mask = TensorType(DType.i64, ("B", "T")), TensorType(DType.i64, ("B", "S"))
    state = TensorType(DType.f32, ("B", 2))
    out = infer("ngram_hash", [ids, mask, state], attrs)
    assert [(o.dtype, o.shape) for o in out] == [(DType.i64, ("B", "T", 4)), (DType.f32, ("B", 2))]
    assert len(infer("ngram_hash", [ids], attrs)) == 1
    with pytest.raises(ShapeError, match="past_state"):
        infer("ngram_hash", [ids, mask, TensorType(DType.f32, ("B", 3))], attrs)
    with pytest.raises(ShapeError, match="primes"):
        infer("ngram_hash", [ids], {**attrs, "primes": attrs["primes"][:3]})


def _graph(attrs: dict):
    from irc.build import emit
    from irc.graph import Graph

    g = Graph("ngram_hash")
    ids = g.add_input("input_ids", DType.i64, ("B", "T"))
    mask = g.add_input("attention_mask", DType.i64, ("B", "S"))
    past = g.add_input("past_state", DType.f32, ("B", len(attrs["multipliers"]) - 1))
    g.outputs = emit(g, "ngram_hash", [ids, mask, past], attrs, ["ids", "present"])
    return g


def _feeds():
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 6, (2, 7))
    mask = np.ones((2, 10), np.int64)
    mask[1, :5] = 0  # a left-padded row: 2 padded past slots, 3 padded new tokens
    past = np.array([[3, 0], [0, 0]], np.float32)
    return {"input_ids": ids, "attention_mask": mask, "past_state": past}


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_onnx_equals_the_reference(tmp_path, target):
    ort = pytest.importorskip("onnxruntime")
    from backends.onnx.emit import emit_model
    from irc.interpreter import Interpreter

    graph = _graph(_attrs(_module()))
    path = str(tmp_path / "m.onnx")
    emit_model(graph, path, target=target, genai=False)
    feeds = _feeds()
    got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    want = Interpreter(graph).run(feeds)
    np.testing.assert_array_equal(got[0], want["ids"])
    np.testing.assert_array_equal(got[1], want["present"])


def test_triton_fallback_line_equals_the_reference():
    torch = pytest.importorskip("torch")
    from backends.triton.fallback import HELPERS, fallback_line

    graph = _graph(_attrs(_module()))
    (node,) = graph.nodes
    line, helpers = fallback_line("ngram_hash", node.attrs, ["ids", "mask", "past"], node.outputs)
    namespace = {"torch": torch}
    for name in sorted(helpers):
        exec(HELPERS[name], namespace)
    feeds = _feeds()
    got_ids, got_present = eval(line, {**namespace, **{k: torch.from_numpy(v) for k, v in
                                                        zip(("ids", "mask", "past"), feeds.values())}})
    want_ids, want_present = ngram_hash(*feeds.values(), **node.attrs)
    np.testing.assert_array_equal(got_ids.numpy(), want_ids)
    np.testing.assert_array_equal(got_present.numpy(), want_present)
