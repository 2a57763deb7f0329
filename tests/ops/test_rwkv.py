"""RWKV-4's ops (``irc.ops.rwkv``): the WKV reference against the plain formula (no max
tracking, float64), against transformers' ``rwkv_linear_attention_cpu`` (to rounding), the
state carried across pieces equal to one run, the zero state equal to transformers' initial
one, the token shift, shape inference and cost."""
import numpy as np
import pytest

from irc import build
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Graph
from irc.ops import get_op
from irc.ops.rwkv import rwkv4_wkv, token_shift

B, T, A = 2, 10, 6


def operands(seed: int = 0, seq: int = T):
    rng = np.random.default_rng(seed)
    k = rng.normal(size=(B, seq, A)).astype(np.float32)
    v = rng.normal(size=(B, seq, A)).astype(np.float32)
    w = rng.normal(size=A).astype(np.float32)       # time_decay as stored: the decay is -exp(w)
    u = rng.normal(size=A).astype(np.float32)       # time_first
    return k, v, w, u


def plain_wkv(k, v, w, u) -> np.ndarray:
    """wkv_t = (Σ_{i<t} e^{(t-1-i)w' + k_i} v_i + e^{u + k_t} v_t) / (the same without v),
    w' = -exp(w), in float64 without any max tracking."""
    k, v, w, u = (np.asarray(x, np.float64) for x in (k, v, w, u))
    decay = -np.exp(w)
    out = np.zeros_like(k)
    for t in range(k.shape[1]):
        weights = np.stack([np.exp((t - 1 - i) * decay + k[:, i]) for i in range(t)] + [np.exp(u + k[:, t])], axis=1)
        values = v[:, :t + 1]
        out[:, t] = (weights * values).sum(axis=1) / weights.sum(axis=1)
    return out


def test_reference_is_the_plain_formula():
    k, v, w, u = operands()
    out, _ = rwkv4_wkv(k, v, w, u)
    np.testing.assert_allclose(out, plain_wkv(k, v, w, u), rtol=2e-5, atol=2e-6)


def test_pieces_with_the_state_carried_equal_one_run():
    k, v, w, u = operands(1)
    whole, state = rwkv4_wkv(k, v, w, u)
    first, mid = rwkv4_wkv(k[:, :4], v[:, :4], w, u)
    second, mid = rwkv4_wkv(k[:, 4:5], v[:, 4:5], w, u, mid)
    third, end = rwkv4_wkv(k[:, 5:], v[:, 5:], w, u, mid)
    np.testing.assert_array_equal(np.concatenate([first, second, third], axis=1), whole)
    np.testing.assert_array_equal(end, state)


def test_zero_state_is_transformers_initial_state():
    """den 0 means no past: the max entry is read as -1e38, so a zero state and transformers'
    (0, 0, -1e30) give the same numbers."""
    k, v, w, u = operands(2)
    initial = np.zeros((B, 3, A), np.float32)
    initial[:, 2] = -1e30
    a, sa = rwkv4_wkv(k, v, w, u, np.zeros((B, 3, A), np.float32))
    b, sb = rwkv4_wkv(k, v, w, u, initial)
    c, sc = rwkv4_wkv(k, v, w, u)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(sa, sb)


def test_reference_is_transformers_cpu_kernel():
    """The same operations in the same order; torch's and NumPy's exp may differ in the last bit."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.rwkv.modeling_rwkv import rwkv_linear_attention_cpu

    k, v, w, u = operands(3)
    split = 7
    state = [torch.zeros(B, A), torch.zeros(B, A), torch.full((B, A), -1e30)]
    want1, state = rwkv_linear_attention_cpu(*(torch.from_numpy(x) for x in (w, u, k[:, :split], v[:, :split])),
                                             state=state, return_state=True)
    want2, state = rwkv_linear_attention_cpu(*(torch.from_numpy(x) for x in (w, u, k[:, split:], v[:, split:])),
                                             state=state, return_state=True)
    got1, mid = rwkv4_wkv(k[:, :split], v[:, :split], w, u)
    got2, end = rwkv4_wkv(k[:, split:], v[:, split:], w, u, mid)
    np.testing.assert_allclose(np.concatenate([got1, got2], 1), torch.cat([want1, want2], 1).numpy(), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(end, torch.stack(state, 1).numpy(), rtol=1e-5, atol=1e-6)


def test_token_shift():
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    past = -np.ones((2, 4), np.float32)
    shifted, present = token_shift(x, past)
    np.testing.assert_array_equal(shifted[:, 0], past)
    np.testing.assert_array_equal(shifted[:, 1:], x[:, :2])
    np.testing.assert_array_equal(present, x[:, -1])
    np.testing.assert_array_equal(token_shift(x)[0][:, 0], 0)


def _graph():
    g = Graph("wkv")
    k = g.add_input("k", DType.f32, ("B", "T", A))
    v = g.add_input("v", DType.f32, ("B", "T", A))
    past = g.add_input("past", DType.f32, ("B", 3, A))
    return g, k, v, past


def test_shape_inference_and_cost():
    g, k, v, past = _graph()
    w, u = g.add_param("w", DType.f32, (A,)), g.add_param("u", DType.f32, (A,))
    out, present = build.emit(g, "rwkv4_wkv", [k, v, w, u, past], None, ["wkv", "present"])
    assert out.shape == ("B", "T", A) and present.shape == ("B", 3, A)
    shifted, shift_state = build.emit(g, "token_shift", [k, g.add_input("s", DType.f32, ("B", A))], None,
                                      ["shifted", "shift_present"])
    assert shifted.shape == ("B", "T", A) and shift_state.shape == ("B", A)
    assert get_op("rwkv4_wkv").level == "model"


def test_shape_errors_name_the_operand():
    g, k, v, past = _graph()
    w, u = g.add_param("w", DType.f32, (A + 1,)), g.add_param("u", DType.f32, (A,))
    with pytest.raises(ShapeError, match="time_decay"):
        build.emit(g, "rwkv4_wkv", [k, v, w, u, past], None, ["wkv", "present"])
    wrong = g.add_input("wrong", DType.f32, ("B", 2, A))
    with pytest.raises(ShapeError, match="past_state"):
        build.emit(g, "rwkv4_wkv", [k, v, g.add_param("w2", DType.f32, (A,)), u, wrong], None, ["o", "p"])
