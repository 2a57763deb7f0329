"""attention: the reference against transformers' eager attention (GQA, MQA, window,
softcap, padding, KV cache), against LlamaAttention end to end, and on its own terms."""
import types

import numpy as np
import pytest

from irc import ops
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Value
from irc.ops.registry import TensorType
from irc.testing import run_op

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def randn(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def left_padded_mask(batch, total, pads):
    mask = np.ones((batch, total), dtype=np.int64)
    for b, pad in enumerate(pads):
        mask[b, :pad] = 0
    return mask


def hf_mask(batch, seq, past, mask, window=None):
    """The 4-D additive mask transformers builds for eager attention."""
    from transformers.masking_utils import (causal_mask_function, eager_mask,
                                            sliding_window_causal_mask_function)
    function = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    return eager_mask(batch_size=batch, q_length=seq, kv_length=past + seq, q_offset=past,
                      mask_function=function, attention_mask=torch.from_numpy(mask).bool())


def hf_eager(q4, k4, v4, mask4, scale, softcap=None):
    """transformers' eager attention on [B, H, T, D] tensors; returns [B, T, H*Dv]."""
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward
    module = types.SimpleNamespace(num_key_value_groups=q4.shape[1] // k4.shape[1], training=False,
                                   head_dim=q4.shape[-1])
    out, _ = eager_attention_forward(module, *(torch.from_numpy(np.ascontiguousarray(a)) for a in (q4, k4, v4)),
                                     mask4, scaling=scale, softcap=softcap)
    return out.reshape(q4.shape[0], q4.shape[2], -1).numpy()


def heads_first(x, heads):
    batch, seq, _ = x.shape
    return x.reshape(batch, seq, heads, x.shape[-1] // heads).transpose(0, 2, 1, 3)


CASES = {  # heads, kv_heads, head_dim, v_head_dim, window, softcap
    "mha": (2, 2, 8, None, None, None),
    "gqa": (4, 2, 8, None, None, None),
    "mqa": (4, 1, 8, None, None, None),
    "gqa-window": (4, 2, 8, None, 3, None),
    "gqa-v-dim": (6, 2, 4, 6, None, None),
    "softcap-window": (4, 2, 8, None, 4, 2.0),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("past", [0, 3])
def test_matches_hf_eager(name, past):
    heads, kv_heads, head_dim, v_head_dim, window, softcap = CASES[name]
    dv = v_head_dim or head_dim
    batch, seq = 3, 6
    rng = np.random.default_rng(7)
    # sizeable scores so the softcap actually bends them
    q, k = randn(rng, batch, seq, heads * head_dim, scale=2.0), randn(rng, batch, seq, kv_heads * head_dim, scale=2.0)
    v = randn(rng, batch, seq, kv_heads * dv)
    mask = left_padded_mask(batch, past + seq, [0, 2, past + 1])
    inputs = [q, k, v, mask]
    attrs = {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "v_head_dim": v_head_dim,
             "window": window, "softcap": softcap}
    if past:
        inputs += [randn(rng, batch, kv_heads, past, head_dim), randn(rng, batch, kv_heads, past, dv)]
    outs = run_op("attention", inputs, attrs)
    key = np.concatenate([inputs[4], heads_first(k, kv_heads)], axis=2) if past else heads_first(k, kv_heads)
    value = np.concatenate([inputs[5], heads_first(v, kv_heads)], axis=2) if past else heads_first(v, kv_heads)
    want = hf_eager(heads_first(q, heads), key, value, hf_mask(batch, seq, past, mask, window), head_dim ** -0.5,
                    softcap)
    real = mask[:, past:].astype(bool)  # padded query rows: HF averages, we return zeros
    np.testing.assert_allclose(outs[0][real], want[real], rtol=1e-5, atol=1e-5)
    assert np.all(outs[0][~real] == 0)
    if past:
        np.testing.assert_array_equal(outs[1], key)
        np.testing.assert_array_equal(outs[2], value)


def test_softcap_changes_the_result():
    rng = np.random.default_rng(1)
    q, k, v = randn(rng, 1, 5, 16, scale=3.0), randn(rng, 1, 5, 16, scale=3.0), randn(rng, 1, 5, 16)
    attrs = {"heads": 2, "kv_heads": 2, "head_dim": 8}
    (plain,) = run_op("attention", [q, k, v], attrs)
    (capped,) = run_op("attention", [q, k, v], {**attrs, "softcap": 1.0})
    assert not np.allclose(plain, capped, atol=1e-3)


def test_matches_llama_attention_with_cache():
    """linear -> rope -> attention -> linear equals LlamaAttention, prefill and decode,
    with left padding and a DynamicCache."""
    from transformers import DynamicCache, LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
    d, heads, kv_heads, head_dim, base = 32, 4, 2, 8, 10000.0
    config = LlamaConfig(hidden_size=d, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                         rope_parameters={"rope_type": "default", "rope_theta": base})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    layer, rotary = LlamaAttention(config, layer_idx=0).eval(), LlamaRotaryEmbedding(config)
    params = {name: p.detach().numpy() for name, p in layer.named_parameters()}
    rng = np.random.default_rng(3)
    batch, prefill = 2, 5
    x = randn(rng, batch, prefill + 1, d)
    mask = left_padded_mask(batch, prefill + 1, [0, 2])
    position_ids = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
    cache = DynamicCache()

    def irc_layer(xs, pos, step_mask, past):
        q = run_op("linear", [xs, params["q_proj.weight"]], {})[0]
        k = run_op("linear", [xs, params["k_proj.weight"]], {})[0]
        v = run_op("linear", [xs, params["v_proj.weight"]], {})[0]
        q = run_op("rope", [q, pos], {"head_dim": head_dim, "base": base})[0]
        k = run_op("rope", [k, pos], {"head_dim": head_dim, "base": base})[0]
        outs = run_op("attention", [q, k, v, step_mask, *past],
                      {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim})
        return run_op("linear", [outs[0], params["o_proj.weight"]], {})[0], outs[1:]

    def hf_layer(xs, pos, step_mask, past_len):
        xt = torch.from_numpy(xs)
        with torch.no_grad():
            out, _ = layer(xt, rotary(xt, torch.from_numpy(pos)), hf_mask(batch, xs.shape[1], past_len, step_mask),
                           cache=cache)
        return out.numpy()

    empty = [np.zeros((batch, kv_heads, 0, head_dim), np.float32)] * 2
    got, present = irc_layer(x[:, :prefill], position_ids[:, :prefill], mask[:, :prefill], empty)
    want = hf_layer(x[:, :prefill], position_ids[:, :prefill], mask[:, :prefill], 0)
    real = mask[:, :prefill].astype(bool)
    np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(present[0], cache.layers[0].keys.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(present[1], cache.layers[0].values.numpy(), rtol=1e-6, atol=1e-6)

    got, present = irc_layer(x[:, prefill:], position_ids[:, prefill:], mask, present)
    want = hf_layer(x[:, prefill:], position_ids[:, prefill:], mask, prefill)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert present[0].shape == (batch, kv_heads, prefill + 1, head_dim)


@pytest.mark.parametrize("window", [None, 3])
def test_decode_with_past_equals_full_sequence(window):
    rng = np.random.default_rng(5)
    batch, seq, attrs = 2, 6, {"heads": 4, "kv_heads": 2, "head_dim": 8, "window": window}
    q, k, v = randn(rng, batch, seq, 32), randn(rng, batch, seq, 16), randn(rng, batch, seq, 16)
    (full,) = run_op("attention", [q, k, v], attrs)
    empty = np.zeros((batch, 2, 0, 8), np.float32)
    prefill = run_op("attention", [q[:, :4], k[:, :4], v[:, :4], None, empty, empty], attrs)
    np.testing.assert_allclose(prefill[0], full[:, :4], rtol=1e-6, atol=1e-6)
    decode = run_op("attention", [q[:, 4:], k[:, 4:], v[:, 4:], None, prefill[1], prefill[2]], attrs)
    np.testing.assert_allclose(decode[0], full[:, 4:], rtol=1e-6, atol=1e-6)
    assert decode[1].shape == (batch, 2, seq, 8)


def test_left_padding_rows_are_zero_and_real_rows_unchanged():
    rng = np.random.default_rng(9)
    seq, pad, attrs = 5, 2, {"heads": 2, "kv_heads": 1, "head_dim": 8}
    q, k, v = randn(rng, 1, seq, 16), randn(rng, 1, seq, 8), randn(rng, 1, seq, 8)
    (alone,) = run_op("attention", [q, k, v], attrs)
    padded = [np.concatenate([randn(rng, 1, pad, a.shape[-1]), a], axis=1) for a in (q, k, v)]
    (out,) = run_op("attention", [*padded, left_padded_mask(1, seq + pad, [pad])], attrs)
    assert np.all(out[:, :pad] == 0) and np.all(np.isfinite(out))
    np.testing.assert_allclose(out[:, pad:], alone, rtol=1e-6, atol=1e-6)


def test_window_equals_attention_over_the_last_keys():
    rng = np.random.default_rng(11)
    seq, window, attrs = 7, 3, {"heads": 2, "kv_heads": 2, "head_dim": 4}
    q, k, v = randn(rng, 1, seq, 8), randn(rng, 1, seq, 8), randn(rng, 1, seq, 8)
    (out,) = run_op("attention", [q, k, v], {**attrs, "window": window})
    for t in range(seq):
        lo = max(0, t - window + 1)
        past = [heads_first(a[:, lo:t], 2) for a in (k, v)]  # only the window's earlier keys, as a cache
        last = run_op("attention", [q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], None, *past], attrs)
        np.testing.assert_allclose(out[:, t], last[0][:, 0], rtol=1e-6, atol=1e-6)
    (full,) = run_op("attention", [q, k, v], attrs)
    assert not np.allclose(out[:, window:], full[:, window:])


def test_not_causal_sees_every_key():
    rng = np.random.default_rng(2)
    q, k, v = randn(rng, 1, 4, 8), randn(rng, 1, 4, 8), randn(rng, 1, 4, 8)
    attrs = {"heads": 1, "kv_heads": 1, "head_dim": 8, "causal": False, "scale": 0.3}
    (out,) = run_op("attention", [q, k, v], attrs)
    scores = q[0] @ k[0].T * 0.3
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(out[0], (weights / weights.sum(-1, keepdims=True)) @ v[0], rtol=1e-5, atol=1e-6)


def symbolic(*shapes_and_dtypes):
    return [None if s is None else Value(f"v{i}", s[0], s[1]) for i, s in enumerate(shapes_and_dtypes)]


def infer(inputs, attrs):
    return ops.infer("attention", inputs, ops.get_op("attention").normalize_attrs(attrs))


def test_infer_decode_shapes():
    f32, i64 = DType.f32, DType.i64
    inputs = symbolic((f32, ("B", "T", 32)), (f32, ("B", "T", 16)), (f32, ("B", "T", 24)), (i64, ("B", "P+T")),
                      (f32, ("B", 2, "P", 8)), (f32, ("B", 2, "P", 12)))
    out = infer(inputs, {"heads": 4, "kv_heads": 2, "head_dim": 8, "v_head_dim": 12})
    assert out == [TensorType(f32, ("B", "T", 48)), TensorType(f32, ("B", 2, "P+T", 8)),
                   TensorType(f32, ("B", 2, "P+T", 12))]
    (prefill,) = infer(inputs[:3], {"heads": 4, "kv_heads": 2, "head_dim": 8, "v_head_dim": 12})
    assert prefill.shape == ("B", "T", 48)


def test_heads_not_divisible_by_kv_heads():
    inputs = symbolic((DType.f32, ("B", "T", 24)), (DType.f32, ("B", "T", 16)), (DType.f32, ("B", "T", 16)))
    with pytest.raises(ShapeError, match=r"heads \(3\).*kv_heads \(2\)"):
        infer(inputs, {"heads": 3, "kv_heads": 2, "head_dim": 8})


@pytest.mark.parametrize("shapes, message", [
    ([("B", "T", 32), ("B", "T", 8), ("B", "T", 16)], "k"),
    ([("B", "T", 32), ("B", "T", 16), ("B", "S", 16)], "v"),
])
def test_infer_rejects_bad_widths(shapes, message):
    with pytest.raises(ShapeError, match=message):
        infer(symbolic(*[(DType.f32, s) for s in shapes]), {"heads": 4, "kv_heads": 2, "head_dim": 8})


def test_past_key_and_value_go_together():
    f32 = DType.f32
    inputs = symbolic((f32, ("B", "T", 16)), (f32, ("B", "T", 16)), (f32, ("B", "T", 16)), None,
                      (f32, ("B", 2, "P", 8)), None)
    with pytest.raises(ShapeError, match="together"):
        infer(inputs, {"heads": 2, "kv_heads": 2, "head_dim": 8})


def test_mask_must_cover_past_and_new_tokens():
    f32 = DType.f32
    inputs = symbolic((f32, ("B", "T", 16)), (f32, ("B", "T", 16)), (f32, ("B", "T", 16)), (DType.i64, ("B", "T")),
                      (f32, ("B", 2, "P", 8)), (f32, ("B", 2, "P", 8)))
    with pytest.raises(ShapeError, match="attention_mask"):
        infer(inputs, {"heads": 2, "kv_heads": 2, "head_dim": 8})


def test_cost_by_hand():
    # B=2, T=3, P=5 (S=8), H=4, K=2, D=8, Dv=8, f32, mask i64
    f32 = DType.f32
    inputs = [TensorType(f32, (2, 3, 32)), TensorType(f32, (2, 3, 16)), TensorType(f32, (2, 3, 16)),
              TensorType(DType.i64, (2, 8)), TensorType(f32, (2, 2, 5, 8)), TensorType(f32, (2, 2, 5, 8))]
    outputs = [TensorType(f32, (2, 3, 32)), TensorType(f32, (2, 2, 8, 8)), TensorType(f32, (2, 2, 8, 8))]
    opdef = ops.get_op("attention")
    cost = opdef.cost(inputs, outputs, opdef.normalize_attrs({"heads": 4, "kv_heads": 2, "head_dim": 8}))
    assert cost.flops == 2 * 2 * 3 * 8 * 4 * 8 * 2  # scores + weighted sum: 6144
    assert cost.other_flops == 5 * 2 * 4 * 3 * 8  # softmax: 960
    assert cost.bytes_read == 4 * (192 + 96 + 96 + 160 + 160) + 8 * 16
    assert cost.bytes_written == 4 * (192 + 256 + 256)
