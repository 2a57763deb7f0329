"""Llama-4's chunks in ``irc.ops.attention.visible_keys`` against transformers' own mask
function (``masking_utils.chunked_causal_mask_function`` with each row's left padding), over a
past and new tokens, and the op's checks of the ``chunk`` attribute."""
import numpy as np
import pytest

from irc.build import emit
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Graph
from irc.ops.attention import left_padding, visible_keys


@pytest.mark.parametrize("chunk, past, seq", [(4, 0, 11), (3, 7, 5), (8, 15, 1)])
def test_the_chunks_are_transformers(chunk, past, seq):
    torch = pytest.importorskip("torch")
    from transformers.masking_utils import chunked_causal_mask_function

    mask = np.ones((3, past + seq), np.int64)
    mask[1, :2], mask[2, :5] = 0, 0
    pad = left_padding(mask, 3)
    assert pad.tolist() == [0, 2, 5]
    theirs = chunked_causal_mask_function(chunk, torch.from_numpy(pad))
    index = torch.tensor
    want = np.array([[[bool(theirs(index(b), index(0), index(past + t), index(j))) and mask[b, j] == 1
                       for j in range(past + seq)] for t in range(seq)] for b in range(3)])
    np.testing.assert_array_equal(visible_keys(3, seq, past, mask, chunk=chunk), want)


def attention_graph(attrs):
    g = Graph("chunked")
    q, k, v = (g.add_input(name, DType.f32, ("B", "T", 16)) for name in "qkv")
    return emit(g, "attention", [q, k, v], {"heads": 2, "kv_heads": 2, "head_dim": 8, **attrs}, ["out"])


@pytest.mark.parametrize("attrs, fragment", [({"chunk": 0}, "chunk must be a positive int"),
                                             ({"chunk": True}, "chunk must be a positive int"),
                                             ({"chunk": 4, "causal": False}, "chunks are a causal attention's")])
def test_the_op_checks_its_chunk(attrs, fragment):
    with pytest.raises(ShapeError, match=fragment):
        attention_graph(attrs)
