"""ALiBi (``irc.ops.alibi``, the ``attention`` op's ``alibi`` operand): the seeds' slopes for
8 and 12 heads (the non-power-of-two rule), MPT's interleaved rule, transformers' own slopes
and bias tables, and the claims the op rests on: only key minus query index enters, so a
left-padded row attends as it does alone, and a KV cache gives what the whole prompt gives."""
import numpy as np
import pytest

from irc.build import emit
from irc.dtypes import DType
from irc.graph import Graph
from irc.interpreter import random_feeds, run
from irc.ops.alibi import alibi_bias, bloom_slopes, mpt_slopes
from irc.ops.attention import attention

F32 = DType.f32


def test_the_seeds_slopes_for_8_and_12_heads():
    """8 heads: 2^-1 .. 2^-8 (the geometric sequence starting at 2^(-8/n)); 12: those 8, then
    the odd terms of 16 heads' sequence, 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5."""
    np.testing.assert_allclose(bloom_slopes(8), 2.0 ** -np.arange(1, 9), rtol=1e-7)
    np.testing.assert_allclose(bloom_slopes(12), np.concatenate([2.0 ** -np.arange(1, 9),
                                                                 2.0 ** -np.array([0.5, 1.5, 2.5, 3.5])]), rtol=1e-6)


def test_mpt_interleaves_a_larger_power_of_two():
    """MPT with 6 heads: 8 heads' slopes 2^-1 .. 2^-8, odd-indexed first, the first 6."""
    np.testing.assert_allclose(mpt_slopes(6), 2.0 ** -np.array([2, 4, 6, 8, 1, 3]), rtol=1e-7)
    np.testing.assert_allclose(mpt_slopes(8), bloom_slopes(8), rtol=1e-7)


@pytest.mark.parametrize("heads", [1, 4, 6, 8, 12, 32, 71])
def test_the_slopes_are_transformers(heads):
    torch = pytest.importorskip("torch")
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    np.testing.assert_allclose(bloom_slopes(heads), _get_alibi_slopes(heads, torch.device("cpu")).numpy(), rtol=1e-6)
    mpt = build_mpt_alibi_tensor(heads, 2).numpy()[:, 0, 0]  # the bias of the key one before the last
    np.testing.assert_allclose(mpt_slopes(heads), -mpt, rtol=1e-6)


def test_transformers_bias_table_differs_by_a_constant_per_query_row():
    """BLOOM's ``build_alibi_tensor`` on a left-padded batch (positions counted among real
    tokens) minus irc's slope · (j − i), over each row's real keys: one constant per (row,
    head, query), which the softmax drops."""
    torch = pytest.importorskip("torch")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    mask = np.array([[1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1]], np.int64)
    heads, seq = 6, 7
    theirs = build_alibi_tensor(torch.from_numpy(mask), heads, torch.float32).numpy().reshape(2, heads, 1, seq)
    ours = alibi_bias(bloom_slopes(heads), seq, seq)[None]
    difference = (theirs - ours)
    for row in range(2):
        real = difference[row][..., mask[row] == 1]
        np.testing.assert_allclose(real, np.broadcast_to(real[..., :1], real.shape), atol=1e-5)
    assert not np.allclose(difference[0], difference[1])  # the rows' constants differ: padding moves them


def alibi_graph(heads=4, kv_heads=2, head_dim=8, window=None, slopes=None):
    g = Graph("alibi")
    q = g.add_input("q", F32, ("B", "T", heads * head_dim))
    k = g.add_input("k", F32, ("B", "T", kv_heads * head_dim))
    v = g.add_input("v", F32, ("B", "T", kv_heads * head_dim))
    mask = g.add_input("attention_mask", DType.i64, ("B", "P+T"))
    past = [g.add_input(f"past_key_values.0.{role}", F32, ("B", kv_heads, "P", head_dim)) for role in ("key", "value")]
    values = bloom_slopes(heads) if slopes is None else slopes
    (table,) = emit(g, "constant", [], {"value": [float(s) for s in values], "dtype": "f32"}, ["alibi_slopes"])
    g.outputs = list(emit(g, "attention", [q, k, v, mask, *past, None, None, table],
                          {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "window": window},
                          ["out", "present.0.key", "present.0.value"]))
    return g


def test_the_op_adds_slope_times_distance_to_the_scaled_scores():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 5, 16)).astype(np.float32) for _ in range(3))
    slopes = bloom_slopes(2)
    got, _, _ = attention(q, k, v, alibi=slopes, heads=2, kv_heads=2, head_dim=8)
    for h in range(2):
        qh, kh, vh = (x[0, :, h * 8:(h + 1) * 8] for x in (q, k, v))
        scores = qh @ kh.T / np.sqrt(8) + slopes[h] * (np.arange(5)[None, :] - np.arange(5)[:, None])
        scores = np.where(np.tril(np.ones((5, 5), bool)), scores, -np.inf)
        weights = np.exp(scores - scores.max(1, keepdims=True))
        np.testing.assert_allclose(got[0, :, h * 8:(h + 1) * 8], weights / weights.sum(1, keepdims=True) @ vh,
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window", [None, 3])
def test_a_left_padded_row_and_a_cache_attend_as_the_row_alone(window):
    """Row 1 left-padded by 3 equals the same tokens run unpadded; 4 tokens after a 5-token
    cache equal the last 4 rows of the 9-token prompt."""
    g = alibi_graph(window=window)
    feeds = random_feeds(g, batch=2, tokens=9, past=0, seed=1)
    feeds["attention_mask"][1, :3] = 0
    both = run(g, feeds)["out"]
    alone = {name: value[1:, 3:] if name in "qkv" else value[1:] for name, value in feeds.items()}
    alone["attention_mask"] = feeds["attention_mask"][1:, 3:]
    np.testing.assert_allclose(run(g, alone)["out"][0], both[1, 3:], rtol=1e-5, atol=1e-6)
    first = {name: value[:, :5] if name in "qkv" else value for name, value in feeds.items()}
    first["attention_mask"] = feeds["attention_mask"][:, :5]
    cached = run(g, first)
    rest = {name: value[:, 5:] for name, value in feeds.items() if name in "qkv"}
    rest.update({"attention_mask": feeds["attention_mask"], "past_key_values.0.key": cached["present.0.key"],
                 "past_key_values.0.value": cached["present.0.value"]})
    np.testing.assert_allclose(run(g, rest)["out"], both[:, 5:], rtol=1e-5, atol=1e-6)


def test_the_slopes_are_checked():
    from irc.errors import ShapeError

    with pytest.raises(ShapeError, match="alibi"):
        alibi_graph(slopes=[0.5, 0.25])
