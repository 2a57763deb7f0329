"""The RG-LRU recurrence (``irc.ops.rglru``): the reference against transformers'
``RecurrentGemmaRglru`` (gates computed as its ``baddbmm`` does, the recurrence ours), the
state carried across pieces equal to one run, the reset at position 0, shape inference and
cost."""
import numpy as np
import pytest

from irc.errors import ShapeError
from irc.ops import TensorType, get_op, infer
from irc.dtypes import DType
from irc.ops.rglru import rg_lru

B, T, H, W = 2, 9, 2, 8


def operands(seed: int = 0, seq: int = T):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, seq, W)).astype(np.float32)
    a_param = rng.normal(size=W).astype(np.float32)
    i = (1 / (1 + np.exp(-rng.normal(size=(B, seq, W))))).astype(np.float32)
    r = (1 / (1 + np.exp(-rng.normal(size=(B, seq, W))))).astype(np.float32)
    return x, a_param, i, r


def test_matches_transformers_rglru():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaRglru

    config = transformers.RecurrentGemmaConfig(hidden_size=W, lru_width=W, num_attention_heads=H)
    module = RecurrentGemmaRglru(config)
    rng = np.random.default_rng(3)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.from_numpy(rng.normal(size=tuple(p.shape)).astype(np.float32)))
    x = rng.normal(size=(B, T, W)).astype(np.float32)
    past = rng.normal(size=(B, W)).astype(np.float32)
    block = W // H
    blocks = torch.from_numpy(x).reshape(B * T, H, block).permute(1, 0, 2)
    with torch.no_grad():
        gates = [torch.sigmoid(torch.baddbmm(bias[:, None, :], blocks, weight).transpose(0, 1).reshape(B, T, W)).numpy()
                 for weight, bias in ((module.input_gate_weight, module.input_gate_bias),
                                      (module.recurrent_gate_weight, module.recurrent_gate_bias))]
        a_param = module.recurrent_param.numpy().copy()
        for positions in (np.arange(T)[None].repeat(B, 0), np.arange(T)[None].repeat(B, 0) + 4):
            module.recurrent_states = torch.from_numpy(past.copy())
            want = module(torch.from_numpy(x), torch.from_numpy(positions)).numpy()
            got, state = rg_lru(x, a_param, gates[0], gates[1], positions, past)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(state, module.recurrent_states.numpy(), rtol=1e-5, atol=1e-6)


def test_pieces_with_the_state_carried_equal_one_run():
    x, a, i, r = operands(1)
    positions = np.arange(T)[None].repeat(B, 0)
    whole, state = rg_lru(x, a, i, r, positions)
    pieces, mid = [], np.zeros((B, W), np.float32)
    for start, end in ((0, 4), (4, 5), (5, T)):
        out, mid = rg_lru(x[:, start:end], a, i[:, start:end], r[:, start:end], positions[:, start:end], mid)
        pieces.append(out)
    np.testing.assert_array_equal(np.concatenate(pieces, axis=1), whole)
    np.testing.assert_array_equal(mid, state)


def test_position_zero_resets_the_state():
    """At a reset token the output is x · i whatever the past state; without positions no
    token resets (the first token decays the past state)."""
    x, a, i, r = operands(2)
    positions = np.arange(T)[None].repeat(B, 0)
    past = np.full((B, W), 5.0, np.float32)
    out, _ = rg_lru(x, a, i, r, positions, past)
    np.testing.assert_allclose(out[:, 0], x[:, 0] * i[:, 0], rtol=1e-6)
    np.testing.assert_array_equal(out, rg_lru(x, a, i, r, positions)[0])
    assert not np.allclose(rg_lru(x, a, i, r, None, past)[0][:, 0], out[:, 0])


def test_shape_inference_and_cost():
    f32 = DType.f32
    act = TensorType(f32, (B, "T", W))
    pos = TensorType(DType.i64, (B, "T"))
    state = TensorType(f32, (B, W))
    out = infer("rg_lru", [act, TensorType(f32, (W,)), act, act, pos, state], {})
    assert [o.shape for o in out] == [(B, "T", W), (B, W)]
    assert len(infer("rg_lru", [act, TensorType(f32, (W,)), act, act], {})) == 1
    with pytest.raises(ShapeError, match="a_param"):
        infer("rg_lru", [act, TensorType(f32, (W + 1,)), act, act], {})
    with pytest.raises(ShapeError, match="input_gate"):
        infer("rg_lru", [act, TensorType(f32, (W,)), TensorType(f32, (B, "T", W + 1)), act], {})
    with pytest.raises(ShapeError, match="position_ids"):
        infer("rg_lru", [act, TensorType(f32, (W,)), act, act, TensorType(f32, (B, "T"))], {})
    concrete = TensorType(f32, (B, T, W))
    outs = infer("rg_lru", [concrete, TensorType(f32, (W,)), concrete, concrete], {})
    cost = get_op("rg_lru").cost([concrete, TensorType(f32, (W,)), concrete, concrete], outs, {})
    assert cost.other_flops == 14 * B * T * W and cost.flops == 0
