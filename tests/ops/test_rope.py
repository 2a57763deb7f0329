"""rope: the reference against transformers' rotary embeddings for every scaling kind and
both conventions, plus inference errors and the cost rule."""
import math

import numpy as np
import pytest

from irc import ops
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Value
from irc.ops.registry import TensorType
from irc.ops.rope import rope_inv_freq, yarn_softmax_mscale
from irc.testing import run_op

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

B, T, H, D = 2, 7, 3, 16
BASE = 500.0


# irc scaling dict -> the HF rope_parameters entries for it
SCALINGS = {
    "default": (None, {}),
    "linear": ({"kind": "linear", "factor": 2.5}, {"factor": 2.5}),
    "dynamic": ({"kind": "dynamic", "factor": 3.0, "original_max_position": 16}, {"factor": 3.0}),
    "yarn": ({"kind": "yarn", "factor": 4.0, "original_max_position": 16},
             {"factor": 4.0, "original_max_position_embeddings": 16}),
    "yarn-mscale": ({"kind": "yarn", "factor": 8.0, "original_max_position": 256, "mscale": 0.8, "mscale_all_dim": 0.8,
                     "beta_fast": 16, "beta_slow": 2, "truncate": False},
                    {"factor": 8.0, "original_max_position_embeddings": 256, "mscale": 0.8, "mscale_all_dim": 0.8,
                     "beta_fast": 16, "beta_slow": 2, "truncate": False}),
    "yarn-attention-factor": ({"kind": "yarn", "factor": 4.0, "original_max_position": 16, "attention_factor": 1.3},
                              {"factor": 4.0, "original_max_position_embeddings": 16, "attention_factor": 1.3}),
    "llama3": ({"kind": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position": 64},
               {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}),
}


def hf_rope_parameters(kind, extra):
    params = {"rope_type": "default" if kind == "default" else kind.split("-")[0], "rope_theta": BASE}
    params.update(extra)
    return params


def positions(max_position):
    rng = np.random.default_rng(0)
    return np.sort(rng.integers(0, max_position, size=(B, T)), axis=-1).astype(np.int64)


def random_x(seed=1):
    return np.random.default_rng(seed).standard_normal((B, T, H * D)).astype(np.float32)


def hf_rotate(rotary, apply, x, position_ids):
    xt = torch.from_numpy(x).view(B, T, H, D).transpose(1, 2)
    cos, sin = rotary(xt, torch.from_numpy(position_ids))
    out, _ = apply(xt, xt, cos, sin)
    return out.transpose(1, 2).reshape(B, T, H * D).numpy()


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_matches_llama_rotary(name):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    scaling, extra = SCALINGS[name]
    config = LlamaConfig(hidden_size=H * D, num_attention_heads=H, head_dim=D, max_position_embeddings=16 if
                         name == "dynamic" else 128, rope_parameters=hf_rope_parameters(name, extra))
    # dynamic: positions past max_position_embeddings, so the NTK base actually changes
    position_ids = positions(48)
    x = random_x()
    want = hf_rotate(LlamaRotaryEmbedding(config), apply_rotary_pos_emb, x, position_ids)
    (got,) = run_op("rope", [x, position_ids], {"head_dim": D, "base": BASE, "scaling": scaling})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("name", ["default", "yarn", "yarn-mscale", "llama3"])
def test_inv_freq_matches_hf(name):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    scaling, extra = SCALINGS[name]
    config = LlamaConfig(hidden_size=H * D, num_attention_heads=H, head_dim=D, max_position_embeddings=128,
                         rope_parameters=hf_rope_parameters(name, extra))
    kind = name.split("-")[0]
    init = LlamaRotaryEmbedding.compute_default_rope_parameters if kind == "default" else ROPE_INIT_FUNCTIONS[kind]
    want, want_factor = init(config)
    got, got_factor = rope_inv_freq(D, BASE, scaling)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)
    assert got.dtype == np.float32 and got_factor == pytest.approx(want_factor)


def test_dynamic_below_original_length_is_default():
    scaling = SCALINGS["dynamic"][0]
    np.testing.assert_array_equal(rope_inv_freq(D, BASE, scaling, seq_len=10)[0], rope_inv_freq(D, BASE)[0])
    assert not np.allclose(rope_inv_freq(D, BASE, scaling, seq_len=40)[0], rope_inv_freq(D, BASE)[0])


@pytest.mark.parametrize("name", ["default", "yarn", "linear"])
def test_partial_rotary_matches_gpt_neox(name):
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding, apply_rotary_pos_emb
    scaling, extra = SCALINGS[name]
    params = hf_rope_parameters(name, extra)
    params["partial_rotary_factor"] = 0.5
    config = GPTNeoXConfig(hidden_size=H * D, num_attention_heads=H, max_position_embeddings=128,
                           rope_parameters=params)
    position_ids = positions(40)
    x = random_x(2)
    want = hf_rotate(GPTNeoXRotaryEmbedding(config), apply_rotary_pos_emb, x, position_ids)
    (got,) = run_op("rope", [x, position_ids], {"head_dim": D, "rotary_dim": D // 2, "base": BASE, "scaling": scaling})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)
    np.testing.assert_array_equal(got.reshape(B, T, H, D)[..., D // 2:], x.reshape(B, T, H, D)[..., D // 2:])


def test_interleaved_matches_cohere():
    from transformers import CohereConfig
    from transformers.models.cohere.modeling_cohere import CohereRotaryEmbedding, apply_rotary_pos_emb
    config = CohereConfig(hidden_size=H * D, num_attention_heads=H, max_position_embeddings=128,
                          rope_parameters={"rope_type": "default", "rope_theta": BASE})
    position_ids = positions(60)
    x = random_x(3)
    want = hf_rotate(CohereRotaryEmbedding(config), apply_rotary_pos_emb, x, position_ids)
    (got,) = run_op("rope", [x, position_ids], {"head_dim": D, "base": BASE, "convention": "interleaved"})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)
    (half,) = run_op("rope", [x, position_ids], {"head_dim": D, "base": BASE})
    assert not np.allclose(half, got)


def test_interleaved_is_half_on_permuted_dims():
    # pairs (2i, 2i+1) rotate exactly like pairs (i, i+D/2) once the dims are de-interleaved
    x, position_ids = random_x(4), positions(30)
    perm = np.concatenate([np.arange(0, D, 2), np.arange(1, D, 2)])
    (inter,) = run_op("rope", [x, position_ids], {"head_dim": D, "base": BASE, "convention": "interleaved"})
    x_perm = x.reshape(B, T, H, D)[..., perm].reshape(B, T, H * D)
    (half,) = run_op("rope", [x_perm, position_ids], {"head_dim": D, "base": BASE})
    np.testing.assert_allclose(inter.reshape(B, T, H, D)[..., perm].reshape(B, T, -1), half, rtol=1e-6, atol=1e-6)


def test_bf16_in_bf16_out():
    import ml_dtypes
    x = random_x().astype(ml_dtypes.bfloat16)
    (out,) = run_op("rope", [x, positions(20)], {"head_dim": D, "base": BASE})
    assert out.dtype == ml_dtypes.bfloat16


def test_yarn_softmax_mscale_matches_deepseek():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale
    scaling = {"kind": "yarn", "factor": 40.0, "original_max_position": 4096, "mscale": 0.707,
               "mscale_all_dim": 0.707}
    want = yarn_apply_mscale({"rope_type": "yarn", "factor": 40.0, "mscale_all_dim": 0.707}, 1.0)
    assert yarn_softmax_mscale(scaling) == pytest.approx(want)
    assert yarn_softmax_mscale(scaling) == pytest.approx((0.1 * 0.707 * math.log(40) + 1) ** 2)
    assert yarn_softmax_mscale({"kind": "yarn", "factor": 40.0, "original_max_position": 4096}) == 1.0
    assert yarn_softmax_mscale(None) == 1.0


def test_infer_symbolic_shapes():
    x = Value("x", DType.bf16, ("B", "T", H * D))
    position_ids = Value("pos", DType.i64, ("B", "T"))
    (out,) = ops.infer("rope", [x, position_ids], ops.get_op("rope").normalize_attrs({"head_dim": D, "base": BASE}))
    assert out == TensorType(DType.bf16, ("B", "T", H * D))


@pytest.mark.parametrize("attrs, message", [
    ({"head_dim": D, "base": BASE, "rotary_dim": 2 * D}, "exceeds head_dim"),
    ({"head_dim": 5, "base": BASE}, "even"),
    ({"head_dim": 10, "base": BASE}, "not a multiple of head_dim"),
    ({"head_dim": D, "base": BASE, "convention": "neox"}, "convention"),
    ({"head_dim": D, "base": BASE, "scaling": {"kind": "su"}}, "scaling kind"),
    ({"head_dim": D, "base": BASE, "scaling": {"kind": "longrope"}}, "longrope rope scaling needs short_factor"),
    ({"head_dim": D, "base": BASE, "scaling": {"kind": "yarn", "factor": 4.0}}, "original_max_position"),
])
def test_infer_errors(attrs, message):
    x = Value("x", DType.f32, ("B", "T", H * D))
    position_ids = Value("pos", DType.i64, ("B", "T"))
    with pytest.raises(ShapeError, match=message):
        ops.infer("rope", [x, position_ids], ops.get_op("rope").normalize_attrs(attrs))


def test_position_ids_must_match():
    x = Value("x", DType.f32, ("B", "T", H * D))
    with pytest.raises(ShapeError, match="position_ids"):
        ops.infer("rope", [x, Value("pos", DType.i64, ("B", "S"))],
                  ops.get_op("rope").normalize_attrs({"head_dim": D, "base": BASE}))


def test_cost_by_hand():
    # [2, 7, 3*16] f32, rotary 8 of 16: 2*7*3*8 = 336 rotated elements, 3 ops each
    attrs = ops.get_op("rope").normalize_attrs({"head_dim": D, "rotary_dim": 8, "base": BASE})
    x, pos = TensorType(DType.f32, (B, T, H * D)), TensorType(DType.i64, (B, T))
    cost = ops.get_op("rope").cost([x, pos], [x], attrs)
    assert cost.other_flops == 3 * 336 and cost.flops == 0
    assert cost.bytes_read == 2 * 7 * 48 * 4 + 2 * 7 * 8 and cost.bytes_written == 2 * 7 * 48 * 4
