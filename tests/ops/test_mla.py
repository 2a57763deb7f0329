"""mla_attention: the reference against transformers' DeepseekV2Attention and
DeepseekV3Attention (q_lora or not, YaRN mscale, both RoPE layouts, padding, KV cache)."""
import numpy as np
import pytest

from irc import ops
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Value
from irc.ops.attention import mla_softmax_scale
from irc.ops.registry import TensorType
from irc.testing import run_op

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

D_MODEL, HEADS, KV_RANK, Q_RANK, NOPE, ROPE, V_DIM = 32, 4, 12, 16, 8, 4, 6
YARN_HF = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
           "mscale": 1.0, "mscale_all_dim": 0.8}
YARN_IRC = {"kind": "yarn", "factor": 4.0, "original_max_position": 16, "mscale": 1.0, "mscale_all_dim": 0.8}
PARAMS = {"wq": "q_proj", "q_a": "q_a_proj", "q_a_norm": "q_a_layernorm", "q_b": "q_b_proj",
          "kv_a": "kv_a_proj_with_mqa", "kv_a_norm": "kv_a_layernorm", "kv_b": "kv_b_proj", "wo": "o_proj"}


def hf_mask(batch, seq, past, mask):
    from transformers.masking_utils import causal_mask_function, eager_mask
    return eager_mask(batch_size=batch, q_length=seq, kv_length=past + seq, q_offset=past,
                      mask_function=causal_mask_function, attention_mask=torch.from_numpy(mask).bool())


class Case:
    """A tiny HF DeepSeek attention layer with random weights, and the same layer in irc."""

    def __init__(self, version, q_lora_rank, yarn, interleave=True):
        from transformers import DeepseekV2Config, DeepseekV3Config
        from transformers.models.deepseek_v2 import modeling_deepseek_v2 as v2
        from transformers.models.deepseek_v3 import modeling_deepseek_v3 as v3
        rope_parameters = YARN_HF if yarn else {"rope_type": "default", "rope_theta": 10000.0}
        common = dict(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                      q_lora_rank=q_lora_rank, kv_lora_rank=KV_RANK,
                      qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=V_DIM, max_position_embeddings=64,
                      rope_parameters=dict(rope_parameters))
        if version == 2:
            config = DeepseekV2Config(**common)
            self.layer, self.rotary = v2.DeepseekV2Attention(config, 0), v2.DeepseekV2RotaryEmbedding(config)
        else:
            config = DeepseekV3Config(rope_interleave=interleave, **common)
            self.layer, self.rotary = v3.DeepseekV3Attention(config, 0), v3.DeepseekV3RotaryEmbedding(config)
        config._attn_implementation = "eager"
        self.version = version
        torch.manual_seed(version * 10 + (q_lora_rank is None) + 2 * yarn)
        with torch.no_grad():
            for name, p in self.layer.named_parameters():
                if "layernorm" in name:
                    p.copy_(1.0 + 0.3 * torch.randn_like(p))
        self.layer.eval()
        self.weights = {}
        for ours, theirs in PARAMS.items():
            module = getattr(self.layer, theirs)
            self.weights[ours] = None if module is None else module.weight.detach().numpy().copy()
        self.attrs = {"heads": HEADS, "q_lora_rank": q_lora_rank, "kv_lora_rank": KV_RANK, "qk_nope_head_dim": NOPE,
                      "qk_rope_head_dim": ROPE, "v_head_dim": V_DIM,
                      "rope": {"base": 10000.0, "convention": "interleaved" if interleave else "half",
                               "scaling": YARN_IRC if yarn else None}}

    def irc(self, x, position_ids, mask, past=(None, None)):
        w = self.weights
        inputs = [x, position_ids, mask, *past, w["wq"], w["q_a"], w["q_a_norm"], w["q_b"], w["kv_a"],
                  w["kv_a_norm"], w["kv_b"], w["wo"]]
        return run_op("mla_attention", inputs, self.attrs)

    def hf(self, x, position_ids, mask, past_len, cache):
        xt = torch.from_numpy(x)
        embeddings = self.rotary(xt, torch.from_numpy(position_ids))
        mask4 = hf_mask(x.shape[0], x.shape[1], past_len, mask)
        with torch.no_grad():
            if self.version == 2:
                out, _ = self.layer(xt, attention_mask=mask4, cache=cache, position_embeddings=embeddings)
            else:
                out, _ = self.layer(xt, position_embeddings=embeddings, attention_mask=mask4, cache=cache)
        return out.numpy()


CASES = {
    "v2-q-lora": (2, Q_RANK, False, True),
    "v2-direct-q-yarn": (2, None, True, True),
    "v3-q-lora-yarn": (3, Q_RANK, True, True),
    "v3-direct-q-half": (3, None, False, False),
    "v3-q-lora-yarn-half": (3, Q_RANK, True, False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_hf_prefill_and_decode(name):
    """Left-padded prefill, then one decode step on the present cache, against HF with a
    DynamicCache (which holds the latent; ours holds expanded keys and values)."""
    from transformers import DynamicCache
    case = Case(*CASES[name])
    rng = np.random.default_rng(4)
    batch, prefill = 2, 5
    x = rng.standard_normal((batch, prefill + 1, D_MODEL)).astype(np.float32)
    mask = np.ones((batch, prefill + 1), dtype=np.int64)
    mask[1, :2] = 0
    position_ids = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
    # positions past original_max_position (16) so YaRN's frequencies matter
    position_ids = position_ids + 20
    cache = DynamicCache()
    empty = [np.zeros((batch, HEADS, 0, NOPE + ROPE), np.float32), np.zeros((batch, HEADS, 0, V_DIM), np.float32)]

    got, *present = case.irc(x[:, :prefill], position_ids[:, :prefill], mask[:, :prefill], empty)
    want = case.hf(x[:, :prefill], position_ids[:, :prefill], mask[:, :prefill], 0, cache)
    real = mask[:, :prefill].astype(bool)
    np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-5)
    assert np.all(got[~real] == 0)

    got, *present = case.irc(x[:, prefill:], position_ids[:, prefill:], mask, present)
    want = case.hf(x[:, prefill:], position_ids[:, prefill:], mask, prefill, cache)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert present[0].shape == (batch, HEADS, prefill + 1, NOPE + ROPE)
    assert present[1].shape == (batch, HEADS, prefill + 1, V_DIM)


def test_decode_equals_full_sequence_without_mask():
    case = Case(3, Q_RANK, True)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 6, D_MODEL)).astype(np.float32)
    position_ids = np.arange(6, dtype=np.int64)[None]
    (full,) = case.irc(x, position_ids, None)
    empty = [np.zeros((1, HEADS, 0, NOPE + ROPE), np.float32), np.zeros((1, HEADS, 0, V_DIM), np.float32)]
    _, *present = case.irc(x[:, :5], position_ids[:, :5], None, empty)
    step, *_ = case.irc(x[:, 5:], position_ids[:, 5:], None, present)
    np.testing.assert_allclose(step, full[:, 5:], rtol=1e-5, atol=1e-5)


def test_scale_includes_yarn_mscale_like_hf():
    case = Case(3, Q_RANK, True)
    assert mla_softmax_scale(NOPE, ROPE, case.attrs["rope"]) == pytest.approx(case.layer.scaling)
    assert mla_softmax_scale(NOPE, ROPE, {"base": 1e4}) == pytest.approx((NOPE + ROPE) ** -0.5)
    assert mla_softmax_scale(NOPE, ROPE, case.attrs["rope"], scale=0.5) == 0.5


def operand_values(q_lora_rank, past=True):
    f32 = DType.f32
    shapes = {"x": ("B", "T", D_MODEL), "position_ids": ("B", "T"), "attention_mask": ("B", "P+T"),
              "past_key": ("B", HEADS, "P", NOPE + ROPE), "past_value": ("B", HEADS, "P", V_DIM),
              "wq": (HEADS * (NOPE + ROPE), D_MODEL), "q_a": (Q_RANK, D_MODEL), "q_a_norm": (Q_RANK,),
              "q_b": (HEADS * (NOPE + ROPE), Q_RANK), "kv_a": (KV_RANK + ROPE, D_MODEL), "kv_a_norm": (KV_RANK,),
              "kv_b": (HEADS * (NOPE + V_DIM), KV_RANK), "wo": (D_MODEL, HEADS * V_DIM)}
    skip = {"q_a", "q_a_norm", "q_b"} if q_lora_rank is None else {"wq"}
    if not past:
        skip |= {"attention_mask", "past_key", "past_value"}
    ints = {"position_ids", "attention_mask"}
    return {name: None if name in skip else Value(name, DType.i64 if name in ints else f32, shape)
            for name, shape in shapes.items()}


def mla_attrs(q_lora_rank):
    return ops.get_op("mla_attention").normalize_attrs(
        {"heads": HEADS, "q_lora_rank": q_lora_rank, "kv_lora_rank": KV_RANK, "qk_nope_head_dim": NOPE,
         "qk_rope_head_dim": ROPE, "v_head_dim": V_DIM, "rope": {"base": 1e4, "convention": "interleaved"}})


@pytest.mark.parametrize("q_lora_rank", [None, Q_RANK])
def test_infer_symbolic(q_lora_rank):
    out = ops.infer("mla_attention", list(operand_values(q_lora_rank).values()), mla_attrs(q_lora_rank))
    assert out == [TensorType(DType.f32, ("B", "T", D_MODEL)), TensorType(DType.f32, ("B", HEADS, "P+T", NOPE + ROPE)),
                   TensorType(DType.f32, ("B", HEADS, "P+T", V_DIM))]
    (prefill,) = ops.infer("mla_attention", list(operand_values(q_lora_rank, past=False).values()),
                           mla_attrs(q_lora_rank))
    assert prefill.shape == ("B", "T", D_MODEL)


def test_infer_errors():
    values = operand_values(None)
    with pytest.raises(ShapeError, match="wq given but q_lora_rank"):
        ops.infer("mla_attention", list(values.values()), mla_attrs(Q_RANK))
    values["kv_b"] = Value("kv_b", DType.f32, (HEADS * NOPE, KV_RANK))
    with pytest.raises(ShapeError, match="kv_b"):
        ops.infer("mla_attention", list(values.values()), mla_attrs(None))
    values = operand_values(None)
    values["past_key"] = Value("past_key", DType.f32, ("B", 1, "P", NOPE + ROPE))
    with pytest.raises(ShapeError, match="past_key"):
        ops.infer("mla_attention", list(values.values()), mla_attrs(None))


def test_cost_by_hand():
    # B=1, T=2, no past; direct q. Weights: wq 48x32=1536, kv_a 16x32=512, kv_b 56x12=672, wo 32x24=768
    values = operand_values(None, past=False)
    bound = {"B": 1, "T": 2}
    types = [None if v is None else TensorType(v.dtype, tuple(bound.get(d, d) for d in v.shape))
             for v in values.values()]
    outputs = [TensorType(DType.f32, (1, 2, D_MODEL))]
    cost = ops.get_op("mla_attention").cost(types, outputs, mla_attrs(None))
    projections = 2 * 2 * (1536 + 512 + 672 + 768)
    scores, weighted = 2 * 1 * 2 * 2 * HEADS * (NOPE + ROPE), 2 * 1 * 2 * 2 * HEADS * V_DIM
    assert cost.flops == projections + scores + weighted == 14528
    # softmax 5*B*H*T*S, the kv rms_norm 4 per latent element, rope 3 per rotated element (H + 1 keys)
    assert cost.other_flops == 5 * 4 * 2 * 2 + 4 * 2 * KV_RANK + 3 * 2 * (HEADS + 1) * ROPE == 296
    weight_bytes = 4 * (1536 + 512 + KV_RANK + 672 + 768)
    assert cost.bytes_read == 4 * 2 * D_MODEL + 8 * 2 + weight_bytes
    assert cost.bytes_written == 4 * 2 * D_MODEL


# ---- mla_latent_attention (absorbed at run time) -------------------------------------------

def latent_values(past=True) -> list:
    """mla_latent_attention operands for a direct query, W^UK/W^UV from kv_b's shapes."""
    values = operand_values(None, past=past)
    if past:
        values["past_key"] = Value("past_latent", DType.f32, ("B", 1, "P", KV_RANK))
        values["past_value"] = Value("past_rope", DType.f32, ("B", 1, "P", ROPE))
    kv_b = values.pop("kv_b")
    wo = values.pop("wo")
    return list(values.values()) + [Value("w_uk", kv_b.dtype, (HEADS, NOPE, KV_RANK)),
                                    Value("w_uv", kv_b.dtype, (HEADS, V_DIM, KV_RANK)), wo]


def test_latent_infer_and_errors():
    attrs = mla_attrs(None)
    out = ops.infer("mla_latent_attention", latent_values(), attrs)
    assert out == [TensorType(DType.f32, ("B", "T", D_MODEL)), TensorType(DType.f32, ("B", 1, "P+T", KV_RANK)),
                   TensorType(DType.f32, ("B", 1, "P+T", ROPE))]
    values = latent_values()
    values[11] = Value("w_uk", DType.f32, (HEADS, KV_RANK, NOPE))  # transposed by mistake
    with pytest.raises(ShapeError, match="w_uk"):
        ops.infer("mla_latent_attention", values, attrs)
    values = latent_values()
    values[3] = Value("past_latent", DType.f32, ("B", HEADS, "P", NOPE + ROPE))  # an un-absorbed cache
    with pytest.raises(ShapeError, match="past_key"):
        ops.infer("mla_latent_attention", values, attrs)


def test_latent_cost_by_hand():
    """W^UK and W^UV cost what kv_b costs (2 FLOPs per element per token); attention runs over
    the latent: scores of width d_c + rope, weighted sum of width d_c."""
    bound = {"B": 1, "T": 2}
    types = [None if v is None else TensorType(v.dtype, tuple(bound.get(d, d) for d in v.shape))
             for v in latent_values(past=False)]
    cost = ops.get_op("mla_latent_attention").cost(types, [TensorType(DType.f32, (1, 2, D_MODEL))],
                                                   mla_attrs(None))
    projections = 2 * 2 * (1536 + 512 + HEADS * (NOPE + V_DIM) * KV_RANK + 768)
    scores, weighted = 2 * 2 * 2 * HEADS * (KV_RANK + ROPE), 2 * 2 * 2 * HEADS * KV_RANK
    assert cost.flops == projections + scores + weighted


# ---- NoPE MLA (rope None: Kimi-Linear's full-attention layers) ------------------------------

class KimiCase:
    """transformers' KimiLinearAttention (MLA whose shared "rope" key part is never rotated,
    scale (nope + rope) ** -0.5) with random weights, and the same layer in irc."""

    def __init__(self, q_lora_rank):
        from transformers import KimiLinearConfig
        from transformers.models.kimi_linear import modeling_kimi_linear as kimi
        config = KimiLinearConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                                  q_lora_rank=q_lora_rank, kv_lora_rank=KV_RANK, qk_nope_head_dim=NOPE,
                                  qk_rope_head_dim=ROPE, v_head_dim=V_DIM, num_hidden_layers=1,
                                  layer_types=["full_attention"])
        config._attn_implementation = "eager"
        torch.manual_seed(5 + (q_lora_rank is None))
        self.layer = kimi.KimiLinearAttention(config, 0).eval()
        with torch.no_grad():
            for name, p in self.layer.named_parameters():
                if "layernorm" in name:
                    p.copy_(1.0 + 0.3 * torch.randn_like(p))
        self.weights = {ours: None if getattr(self.layer, theirs) is None
                        else getattr(self.layer, theirs).weight.detach().numpy().copy()
                        for ours, theirs in PARAMS.items()}
        self.attrs = {"heads": HEADS, "q_lora_rank": q_lora_rank, "kv_lora_rank": KV_RANK, "qk_nope_head_dim": NOPE,
                      "qk_rope_head_dim": ROPE, "v_head_dim": V_DIM, "rope": None}

    def irc(self, x, mask, past=(None, None)):
        w = self.weights
        return run_op("mla_attention", [x, None, mask, *past, w["wq"], w["q_a"], w["q_a_norm"], w["q_b"], w["kv_a"],
                                        w["kv_a_norm"], w["kv_b"], w["wo"]], self.attrs)

    def hf(self, x, mask, past_len, cache):
        with torch.no_grad():
            out, _ = self.layer(torch.from_numpy(x), attention_mask=hf_mask(x.shape[0], x.shape[1], past_len, mask),
                                cache=cache)
        return out.numpy()


@pytest.mark.parametrize("q_lora_rank", [None, Q_RANK])
def test_nope_mla_matches_kimi_linear_prefill_and_decode(q_lora_rank):
    """Left-padded prefill, then two decode steps on the present cache, against transformers'
    KimiLinearAttention with a DynamicCache; no position_ids anywhere."""
    from transformers import DynamicCache
    case = KimiCase(q_lora_rank)
    rng = np.random.default_rng(6)
    batch, prefill = 2, 5
    x = rng.standard_normal((batch, prefill + 2, D_MODEL)).astype(np.float32)
    mask = np.ones((batch, prefill + 2), dtype=np.int64)
    mask[1, :2] = 0
    cache = DynamicCache()
    empty = [np.zeros((batch, HEADS, 0, NOPE + ROPE), np.float32), np.zeros((batch, HEADS, 0, V_DIM), np.float32)]
    got, *present = case.irc(x[:, :prefill], mask[:, :prefill], empty)
    want = case.hf(x[:, :prefill], mask[:, :prefill], 0, cache)
    real = mask[:, :prefill].astype(bool)
    np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-5)
    for step in (prefill, prefill + 1):
        got, *present = case.irc(x[:, step:step + 1], mask[:, :step + 1], present)
        np.testing.assert_allclose(got, case.hf(x[:, step:step + 1], mask[:, :step + 1], step, cache),
                                   rtol=1e-5, atol=1e-5)
    assert present[0].shape == (batch, HEADS, prefill + 2, NOPE + ROPE)
    # the cached "rope" part is kv_a's output as it is: the same for every head, unrotated
    np.testing.assert_array_equal(present[0][:, 0, :, NOPE:], present[0][:, HEADS - 1, :, NOPE:])


def test_nope_mla_takes_no_positions_and_a_rope_needs_them():
    attrs = {**mla_attrs(None), "rope": None}
    values = operand_values(None)
    with pytest.raises(ShapeError, match="rope is None .* leave them out"):
        ops.infer("mla_attention", list(values.values()), attrs)
    values["position_ids"] = None
    assert ops.infer("mla_attention", list(values.values()), attrs)[0].shape == ("B", "T", D_MODEL)
    with pytest.raises(ShapeError, match="'position_ids' is required with a rope"):
        ops.infer("mla_attention", list(values.values()), mla_attrs(None))
    latent = latent_values()
    latent[1] = None
    assert ops.infer("mla_latent_attention", latent, attrs)[1].shape == ("B", 1, "P+T", KV_RANK)


def test_nope_cost_has_no_rotations():
    values = operand_values(None, past=False)
    values["position_ids"] = None
    bound = {"B": 1, "T": 2}
    types = [None if v is None else TensorType(v.dtype, tuple(bound.get(d, d) for d in v.shape))
             for v in values.values()]
    outputs = [TensorType(DType.f32, (1, 2, D_MODEL))]
    with_rope = ops.get_op("mla_attention").cost(types, outputs, mla_attrs(None))
    nope = ops.get_op("mla_attention").cost(types, outputs, {**mla_attrs(None), "rope": None})
    assert nope.flops == with_rope.flops
    assert with_rope.other_flops - nope.other_flops == 3 * 2 * (HEADS + 1) * ROPE
    assert mla_softmax_scale(NOPE, ROPE, None) == pytest.approx((NOPE + ROPE) ** -0.5)
