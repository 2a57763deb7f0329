"""The mLSTM recurrence (``irc.ops.mlstm``): the reference against transformers' step kernel
(``mlstm_recurrent_sequence_native``) and its default inference path (whole chunks through
the chunkwise kernel, the rest step by step: ``wrap_chunkwise_arbitrary_sequence_length``),
from zeros and from a carried state; pieces with the state carried equal one run; shape
inference and cost."""
from functools import partial

import numpy as np
import pytest

from irc.dtypes import DType
from irc.errors import ShapeError
from irc.ops import TensorType, get_op, infer
from irc.ops.mlstm import mlstm

B, T, H, DK, DV = 2, 11, 2, 4, 6


def operands(seed: int = 0, seq: int = T):
    """q, k, v of unit scale and soft-capped gates (cap 15) with input gates around 0 and
    forget gates around 3, as xLSTM's are."""
    rng = np.random.default_rng(seed)
    q, k = (rng.normal(size=(B, seq, H * DK)).astype(np.float32) for _ in range(2))
    v = rng.normal(size=(B, seq, H * DV)).astype(np.float32)
    i = (15 * np.tanh(rng.normal(scale=2.0, size=(B, seq, H)) / 15)).astype(np.float32)
    f = (15 * np.tanh((3 + 2 * rng.normal(size=(B, seq, H))) / 15)).astype(np.float32)
    return q, k, v, i, f


def state(seed: int):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(B, H, DK, DV)).astype(np.float32), rng.normal(size=(B, H, DK)).astype(np.float32),
            rng.normal(size=(B, H, 1)).astype(np.float32))


def heads_first(x, width):
    return x.reshape(B, -1, H, width).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("chunk_size", [4, 64])
@pytest.mark.parametrize("carried", [False, True])
def test_matches_transformers_kernels(chunk_size, carried):
    """chunk_size 4: 8 tokens chunkwise, 3 step by step; 64: all step by step."""
    torch = pytest.importorskip("torch")
    xlstm = pytest.importorskip("transformers.models.xlstm.modeling_xlstm")
    if xlstm.external_xlstm:
        pytest.skip("the xlstm package replaces transformers' own kernels")
    q, k, v, i, f = operands(3)
    past = state(4) if carried else (None, None, None)
    t = {name: torch.from_numpy(x) for name, x in (("query", heads_first(q, DK)), ("key", heads_first(k, DK)),
                                                   ("value", heads_first(v, DV)))}
    gates = {name: torch.from_numpy(g.transpose(0, 2, 1).copy()) for name, g in (("igate", i), ("fgate", f))}
    initial = {} if not carried else dict(zip(("c_initial", "n_initial", "m_initial"),
                                              (torch.from_numpy(p.copy()) for p in past)))
    run = partial(xlstm.wrap_chunkwise_arbitrary_sequence_length,
                  mlstm_chunkwise_kernel=xlstm.mlstm_chunkwise_native_autograd,
                  mlstm_sequence_kernel=partial(xlstm.mlstm_recurrent_sequence_native, dtype_state=torch.float32),
                  mlstm_step_kernel=partial(xlstm.mlstm_recurrent_step_native, dtype_state=torch.float32),
                  chunk_size=chunk_size, eps=1e-6, return_last_states=True)
    with torch.no_grad():
        want, (c, n, m) = run(**t, **gates, **initial)
    got, *states = mlstm(q, k, v, i, f, *past, heads=H)
    want = want.numpy().transpose(0, 2, 1, 3).reshape(B, T, H * DV)
    assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want))
    for mine, theirs in zip(states, (c, n, m)):
        np.testing.assert_allclose(mine, theirs.numpy(), rtol=1e-4, atol=1e-5)


def test_pieces_with_the_state_carried_equal_one_run():
    q, k, v, i, f = operands(1)
    whole = mlstm(q, k, v, i, f, heads=H)
    pieces, carried = [], (None, None, None)
    for start, end in ((0, 4), (4, 5), (5, T)):
        out, *carried = mlstm(*(x[:, start:end] for x in (q, k, v, i, f)), *carried, heads=H)
        pieces.append(out)
    np.testing.assert_array_equal(np.concatenate(pieces, axis=1), whole[0])
    for mine, theirs in zip(carried, whole[1:]):
        np.testing.assert_array_equal(mine, theirs)


def test_zero_state_is_the_empty_state():
    q, k, v, i, f = operands(2)
    zeros = (np.zeros((B, H, DK, DV), np.float32), np.zeros((B, H, DK), np.float32), np.zeros((B, H, 1), np.float32))
    np.testing.assert_array_equal(mlstm(q, k, v, i, f, *zeros, heads=H)[0], mlstm(q, k, v, i, f, heads=H)[0])


def test_shape_inference_and_cost():
    f32 = DType.f32
    qk, val, gate = (TensorType(f32, (B, "T", w)) for w in (H * DK, H * DV, H))
    states = [TensorType(f32, s) for s in ((B, H, DK, DV), (B, H, DK), (B, H, 1))]
    attrs = {"heads": H}
    out = infer("mlstm", [qk, qk, val, gate, gate, *states], attrs)
    assert [o.shape for o in out] == [(B, "T", H * DV), (B, H, DK, DV), (B, H, DK), (B, H, 1)]
    assert len(infer("mlstm", [qk, qk, val, gate, gate], attrs)) == 1
    with pytest.raises(ShapeError, match="come together"):
        infer("mlstm", [qk, qk, val, gate, gate, states[0]], attrs)
    with pytest.raises(ShapeError, match="past_normalizer"):
        infer("mlstm", [qk, qk, val, gate, gate, states[0], TensorType(f32, (B, H, DK + 1)), states[2]], attrs)
    with pytest.raises(ShapeError, match="igate"):
        infer("mlstm", [qk, qk, val, TensorType(f32, (B, "T", H + 1)), gate], attrs)
    with pytest.raises(ShapeError, match="multiple of heads"):
        infer("mlstm", [qk, qk, val, gate, gate], {"heads": 3})
    bound = [TensorType(f32, (B, T, w)) for w in (H * DK, H * DK, H * DV, H, H)]
    outs = infer("mlstm", bound, attrs)
    cost = get_op("mlstm").cost(bound, outs, {"heads": H, "eps": 1e-6})
    assert cost.flops == B * T * H * (4 * DK * DV + 4 * DK) and cost.other_flops == B * T * H * (10 + DV)
