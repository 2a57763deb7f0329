"""moe: the reference against transformers' Mixtral, Qwen2-MoE, DeepSeek-V2 and DeepSeek-V3
blocks; the dense and per-token references agree; routing details, inference, cost."""
import numpy as np
import pytest

from irc import ops
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Value
from irc.ops.moe import moe_dense, moe_per_token, route
from irc.ops.registry import TensorType
from irc.testing import run_op

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

D, F, FS, E = 16, 8, 12, 8
B, T = 2, 5


def weights(seed, experts=E, shared=False, shared_gate=False, bias=False):
    rng = np.random.default_rng(seed)

    def randn(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = {"x": randn(B, T, D, scale=1.0), "router": randn(experts, D, scale=1.0), "w_gate": randn(experts, F, D),
         "w_up": randn(experts, F, D), "w_down": randn(experts, D, F)}
    w["router_bias"] = randn(experts, scale=0.2) if bias else None
    for name, shape in (("shared_gate", (FS, D)), ("shared_up", (FS, D)), ("shared_down", (D, FS))):
        w[name] = randn(*shape) if shared else None
    w["shared_expert_gate"] = randn(1, D) if shared_gate else None
    return w


ORDER = ("x", "router", "w_gate", "w_up", "w_down", "router_bias", "shared_gate", "shared_up", "shared_down",
         "shared_expert_gate")


def irc_moe(w, attrs):
    (out,) = run_op("moe", [w[name] for name in ORDER], attrs)
    return out


def load_experts(block_experts, w):
    with torch.no_grad():
        block_experts.gate_up_proj.copy_(torch.from_numpy(np.concatenate([w["w_gate"], w["w_up"]], axis=1)))
        block_experts.down_proj.copy_(torch.from_numpy(w["w_down"]))


def load_mlp(mlp, w):
    with torch.no_grad():
        mlp.gate_proj.weight.copy_(torch.from_numpy(w["shared_gate"]))
        mlp.up_proj.weight.copy_(torch.from_numpy(w["shared_up"]))
        mlp.down_proj.weight.copy_(torch.from_numpy(w["shared_down"]))


def hf_run(block, x):
    with torch.no_grad():
        out = block.eval()(torch.from_numpy(x))
    return (out[0] if isinstance(out, tuple) else out).numpy()


def test_matches_mixtral():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    config = MixtralConfig(hidden_size=D, intermediate_size=F, num_local_experts=E, num_experts_per_tok=2)
    block, w = MixtralSparseMoeBlock(config), weights(0)
    with torch.no_grad():
        block.gate.weight.copy_(torch.from_numpy(w["router"]))
    load_experts(block.experts, w)
    got = irc_moe(w, {"experts": E, "top_k": 2})
    np.testing.assert_allclose(got, hf_run(block, w["x"]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_matches_qwen2_moe_with_gated_shared_expert(norm_topk_prob):
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
    config = Qwen2MoeConfig(hidden_size=D, moe_intermediate_size=F, shared_expert_intermediate_size=FS,
                            num_experts=E, num_experts_per_tok=3, norm_topk_prob=norm_topk_prob)
    block, w = Qwen2MoeSparseMoeBlock(config), weights(1, shared=True, shared_gate=True)
    with torch.no_grad():
        block.gate.weight.copy_(torch.from_numpy(w["router"]))
        block.shared_expert_gate.weight.copy_(torch.from_numpy(w["shared_expert_gate"]))
    load_experts(block.experts, w)
    load_mlp(block.shared_expert, w)
    got = irc_moe(w, {"experts": E, "top_k": 3, "norm_topk_prob": norm_topk_prob})
    np.testing.assert_allclose(got, hf_run(block, w["x"]), rtol=1e-5, atol=1e-5)


def test_matches_deepseek_v3():
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    config = DeepseekV3Config(hidden_size=D, num_attention_heads=4, moe_intermediate_size=F, n_routed_experts=E,
                              num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                              norm_topk_prob=True, n_shared_experts=1)
    w = weights(2, shared=True, bias=True)
    w["shared_gate"], w["shared_up"], w["shared_down"] = (w["shared_gate"][:F], w["shared_up"][:F],
                                                          w["shared_down"][:, :F])
    block = DeepseekV3MoE(config)
    with torch.no_grad():
        block.gate.weight.copy_(torch.from_numpy(w["router"]))
        block.gate.e_score_correction_bias.copy_(torch.from_numpy(w["router_bias"]))
    load_experts(block.experts, w)
    load_mlp(block.shared_experts, w)
    attrs = {"experts": E, "top_k": 3, "scoring": "sigmoid", "routed_scale": 2.5, "n_group": 4, "topk_group": 2,
             "group_score": "top2_sum"}
    got = irc_moe(w, attrs)
    np.testing.assert_allclose(got, hf_run(block, w["x"]), rtol=1e-5, atol=1e-5)
    # the bias steers the choice, so dropping it changes the result
    assert not np.allclose(got, irc_moe({**w, "router_bias": None}, attrs), atol=1e-4)


def test_matches_deepseek_v2_group_limited_greedy():
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe
    # top_k > topk_group, so the group limit really removes candidates
    config = DeepseekV2Config(hidden_size=D, num_attention_heads=4, moe_intermediate_size=F, n_routed_experts=E,
                              num_experts_per_tok=3, n_group=2, topk_group=1, topk_method="group_limited_greedy",
                              routed_scaling_factor=1.5, n_shared_experts=1, norm_topk_prob=False)
    w = weights(3, shared=True)
    w["shared_gate"], w["shared_up"], w["shared_down"] = (w["shared_gate"][:F], w["shared_up"][:F],
                                                          w["shared_down"][:, :F])
    block = DeepseekV2Moe(config)
    with torch.no_grad():
        block.gate.weight.copy_(torch.from_numpy(w["router"]))
    load_experts(block.experts, w)
    load_mlp(block.shared_experts, w)
    got = irc_moe(w, {"experts": E, "top_k": 3, "norm_topk_prob": False, "routed_scale": 1.5, "n_group": 2,
                      "topk_group": 1})
    np.testing.assert_allclose(got, hf_run(block, w["x"]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs, extra", [
    ({"top_k": 2}, {}),
    ({"top_k": 3, "scoring": "sigmoid", "n_group": 4, "topk_group": 2, "group_score": "top2_sum",
      "routed_scale": 2.5}, {"bias": True, "shared": True}),
    ({"top_k": 1, "norm_topk_prob": False, "activation": "gelu_tanh"}, {"shared": True, "shared_gate": True}),
])
def test_dense_equals_per_token(attrs, extra):
    w = weights(5, **extra)
    routing = {"scoring": "softmax", "norm_topk_prob": True, "routed_scale": 1.0, "n_group": None,
               "topk_group": None, "group_score": "max", "activation": "silu", **attrs}
    arrays = [w[name] for name in ORDER]
    dense, per_token = moe_dense(*arrays, **routing), moe_per_token(*arrays, **routing)
    np.testing.assert_allclose(dense, per_token, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(irc_moe(w, {"experts": E, **attrs}), dense, rtol=1e-6, atol=1e-6)


def test_route_ties_pick_lower_index_and_groups_limit_choice():
    x = np.ones((1, D), np.float32)
    router = np.zeros((E, D), np.float32)
    router[5] = 1.0  # expert 5 best, the other seven tie
    ids, weights_ = route(x, router, top_k=3)
    assert ids.tolist() == [[5, 0, 1]] and ids.dtype == np.int64
    np.testing.assert_allclose(weights_.sum(), 1.0, rtol=1e-6)
    # groups of two: keep only the best group (experts 4, 5), so the third choice is impossible
    ids, _ = route(x, router, top_k=2, n_group=4, topk_group=1)
    assert ids.tolist() == [[5, 4]]
    # bias steers selection only; weights stay the unbiased scores
    bias = np.zeros(E, np.float32)
    bias[7] = 10.0
    ids, weights_ = route(x, router, bias, top_k=2, scoring="sigmoid", norm_topk_prob=False)
    assert ids.tolist() == [[7, 5]]
    np.testing.assert_allclose(weights_, [[0.5, 1 / (1 + np.exp(-D))]], rtol=1e-6)


def test_infer_and_errors():
    w = weights(0, shared=True, shared_gate=True, bias=True)
    values = [None if w[n] is None else Value(n, DType.f32, ("B", "T", D) if n == "x" else w[n].shape) for n in ORDER]
    attrs = ops.get_op("moe").normalize_attrs({"experts": E, "top_k": 2})
    assert ops.infer("moe", values, attrs) == [TensorType(DType.f32, ("B", "T", D))]
    with pytest.raises(ShapeError, match="router"):
        ops.infer("moe", values, ops.get_op("moe").normalize_attrs({"experts": 4, "top_k": 2}))
    with pytest.raises(ShapeError, match="top_k"):
        ops.infer("moe", values, ops.get_op("moe").normalize_attrs({"experts": E, "top_k": 9}))
    with pytest.raises(ShapeError, match="n_group"):
        ops.infer("moe", values, ops.get_op("moe").normalize_attrs({"experts": E, "top_k": 2, "n_group": 3,
                                                                    "topk_group": 1}))
    with pytest.raises(ShapeError, match="together"):
        ops.infer("moe", values[:7] + [None, None, None], attrs)
    bad = list(values)
    bad[4] = Value("w_down", DType.f32, (E, F, D))
    with pytest.raises(ShapeError, match="w_down"):
        ops.infer("moe", bad, attrs)


def test_active_fraction():
    opdef = ops.get_op("moe")
    attrs = opdef.normalize_attrs({"experts": 8, "top_k": 2})
    assert [opdef.active_fraction(attrs, n) for n in ("w_gate", "w_up", "w_down")] == [0.25] * 3
    assert opdef.active_fraction(attrs, "router") == 1.0 and opdef.active_fraction(attrs, "shared_up") == 1.0


def test_cost_by_hand():
    # x [2,3,16]; E=4, f=8, top_k=2; shared fs=12 with its gate; 6 tokens
    f32 = DType.f32
    inputs = [TensorType(f32, (2, 3, 16)), TensorType(f32, (4, 16)), TensorType(f32, (4, 8, 16)),
              TensorType(f32, (4, 8, 16)), TensorType(f32, (4, 16, 8)), None, TensorType(f32, (12, 16)),
              TensorType(f32, (12, 16)), TensorType(f32, (16, 12)), TensorType(f32, (1, 16))]
    opdef = ops.get_op("moe")
    cost = opdef.cost(inputs, [inputs[0]], opdef.normalize_attrs({"experts": 4, "top_k": 2}))
    # router 64 + 2 experts x 384 + shared 576 + gate 16 = 1424 weights per token
    assert cost.flops == 2 * 6 * 1424 == 17088
    assert cost.other_flops == 6 * (5 * 4 + 4 * (2 * 8 + 12))
    assert cost.bytes_read == 4 * (96 + 64 + 512 * 2 + 512 + 192 * 2 + 192 + 16)
    assert cost.bytes_written == 4 * 96
