"""ssd's chunked form (``irc.ops.ssm.chunked_ssd``, Mamba-2's structured masked attention)
against the recurrence: chunk sizes that divide the prefill and that do not, one chunk
longer than the prompt, groups, the Δ clamp, a non-zero state, left padding; the op's
``chunk`` attribute (the form the reference computes a prefill in; one token takes the
step) and its refusals."""
import numpy as np
import pytest

from irc import ops
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Value
from irc.ops.ssm import SSD_OPERANDS, chunked_ssd, ssd
from irc.testing import run_op

B, H, P, G, N = 2, 4, 8, 2, 6
ATTRS = {"heads": H, "head_dim": P, "groups": G, "state_size": N, "dt_min": 0.01, "dt_max": 2.0}
TOLERANCE = 1e-5  # relative to the largest value


def inputs(seq, seed=0, state=True, past=2, pad=0):
    """Operands by name; row 1's first ``pad`` mask columns (past ones first) are padding."""
    rng = np.random.default_rng(seed)

    def randn(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    mask = np.ones((B, past + seq), np.int64)
    mask[1, :pad] = 0
    return {"x": randn(B, seq, H * P), "dt": randn(B, seq, H), "A_log": rng.uniform(-1, 1, H).astype(np.float32),
            "B": randn(B, seq, G * N), "C": randn(B, seq, G * N), "D": randn(H), "dt_bias": randn(H),
            "past_state": randn(B, H, N, P) if state else None, "attention_mask": mask}


def relative(got, want) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("seq, chunk", [(64, 16), (70, 16), (37, 8), (5, 64), (48, 1)])
@pytest.mark.parametrize("state", [False, True])
def test_chunked_equals_the_recurrence(seq, chunk, state):
    w = inputs(seq, seed=seq + chunk, state=state, pad=seq // 3)
    want_y, want_state = ssd(**w, **ATTRS)
    y, final = chunked_ssd(**w, **ATTRS, chunk=chunk)
    assert y.dtype == final.dtype == np.float32
    assert relative(y, want_y) <= TOLERANCE and relative(final, want_state) <= TOLERANCE


def test_a_padded_token_is_frozen_and_outputs_zero():
    """Left padding in chunks: row 1's padded tokens give 0 and leave the state where the
    unpadded prompt leaves it."""
    w = inputs(20, seed=3, past=0, pad=9)
    y, final = chunked_ssd(**w, **ATTRS, chunk=4)
    assert np.all(y[1, :9] == 0)
    short = {k: v[1:, 9:] if k in ("x", "dt", "B", "C") else v[1:] if k == "past_state" else v
             for k, v in w.items() if k != "attention_mask"}
    alone_y, alone_state = ssd(**short, **ATTRS)
    assert relative(y[1:, 9:], alone_y) <= TOLERANCE and relative(final[1:], alone_state) <= TOLERANCE


def test_one_group_per_head_without_clamp_or_skip():
    w = inputs(33, seed=4)
    w["B"], w["C"] = (np.repeat(w[n], 2, axis=-1) for n in ("B", "C"))  # G = H: 4 groups of 6
    attrs = {**ATTRS, "groups": H, "dt_min": 0.0, "dt_max": None}
    w["D"] = None
    want_y, want_state = ssd(**w, **attrs)
    y, final = chunked_ssd(**w, **attrs, chunk=8)
    assert relative(y, want_y) <= TOLERANCE and relative(final, want_state) <= TOLERANCE


def operands(w):
    return [w[name.rstrip("?")] for name in SSD_OPERANDS]


def test_the_chunk_attribute_computes_the_prefill_in_chunks():
    w = inputs(40, seed=5, pad=7)
    sequential = run_op("ssd", operands(w), ATTRS)
    chunked = run_op("ssd", operands(w), {**ATTRS, "chunk": 16})
    assert any(not np.array_equal(a, b) for a, b in zip(sequential, chunked))  # float64 inside
    for got, want in zip(chunked, sequential):
        assert relative(got, want) <= TOLERANCE
    step = inputs(1, seed=6, past=5)
    for got, want in zip(run_op("ssd", operands(step), {**ATTRS, "chunk": 16}), run_op("ssd", operands(step), ATTRS)):
        np.testing.assert_array_equal(got, want)  # decode: the step form, whatever the attribute


@pytest.mark.parametrize("chunk", [0, -16, True, 2.5, "64"])
def test_a_bad_chunk_is_refused(chunk):
    f32 = DType.f32
    values = [Value("x", f32, ("B", "T", H * P)), Value("dt", f32, ("B", "T", H)), Value("A_log", f32, (H,)),
              Value("B", f32, ("B", "T", G * N)), Value("C", f32, ("B", "T", G * N))]
    opdef = ops.get_op("ssd")
    assert ops.infer("ssd", values, opdef.normalize_attrs({**ATTRS, "chunk": 64})) == \
        ops.infer("ssd", values, opdef.normalize_attrs(ATTRS))
    with pytest.raises(ShapeError, match="chunk must be None or a positive int"):
        ops.infer("ssd", values, opdef.normalize_attrs({**ATTRS, "chunk": chunk}))
