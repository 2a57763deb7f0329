"""``frontends.hf.families_hybrid2`` (OLMo-Hybrid, LFM3) and ``families_hybrid3`` (Lara-Mini,
Ling-3's BailingHybrid) against transformers on tiny random twins, rows of the twin harness
(test_hf_twins.py: logits on a left-padded batch of two, each row held against the row run
alone, 16 greedy tokens through the reference interpreter; both ONNX targets in ONNX Runtime,
prefill logits and 16 greedy tokens per row, the conv and recurrent states and the KV caches
fed back, and onnxruntime-genai 0.18 on the folder irc writes; Ling: genai's refusal of MLA's
two cache widths); a long prompt through the portable chunked form. Then the refusals: one
SpecError naming config.json and the key; and the ``log`` op Ling's safe forget gate needs,
against NumPy on the reference, both ONNX targets and the Triton fallback."""
import json

import numpy as np
import pytest

from frontends import load_spec
from tests.frontends.refusals import refused
from tests.frontends.test_hf_delta import assert_long_prompt_matches
from tests.frontends.twins import STATES, STATES_ONNX, family, models_fixture

try:
    import torch
    import transformers
except ImportError:  # the refusals below need neither
    torch = transformers = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch and transformers")

OLMO = dict(vocab_size=128, hidden_size=32, pad_token_id=0, bos_token_id=0, eos_token_id=0, intermediate_size=48,
            num_attention_heads=4, max_position_embeddings=64)
LFM = dict(vocab_size=128, hidden_size=32, pad_token_id=0, bos_token_id=0, eos_token_id=0, intermediate_size=48,
           num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64, conv_L_cache=3,
           sliding_window=4)
LARA = dict(vocab_size=128, hidden_size=32, pad_token_id=0, bos_token_id=0, eos_token_id=0, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=64, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24, sliding_window=4)
LING = dict(vocab_size=128, hidden_size=32, pad_token_id=0, bos_token_id=0, eos_token_id=0, num_attention_heads=4,
            num_key_value_heads=4,
            head_dim=8, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, intermediate_size=48,
            moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
            max_position_embeddings=64, short_conv_kernel_size=3)
CASES = {  # name: (config class, its settings, the centre of its norm weights)
    # three DeltaNet layers (2 key heads, 4 value heads, d_k 8 != d_v 6, β = 2·sigmoid(b)), then OLMo-3 attention
    "olmo-hybrid": ("OlmoHybridConfig", dict(OLMO, num_hidden_layers=4, num_key_value_heads=2, linear_num_key_heads=2,
                                             linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6),
                    1.0),
    # attention first, NoPE (rope_theta null), β = sigmoid(b), kernel 3, derived d_k 6 and d_v 12, tied
    "olmo-hybrid-nope-tied": ("OlmoHybridConfig", dict(
        OLMO, num_hidden_layers=3, layer_types=["full_attention", "linear_attention", "linear_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": None}, linear_allow_neg_eigval=False,
        linear_conv_kernel_dim=3, tie_word_embeddings=True), 1.0),
    # conv, conv, attention (proportional RoPE on half of each head), conv, sliding attention (window 4), conv:
    # sandwich norms and the per-head output gate, tied
    "lfm3": ("Lfm3Config", dict(LFM, num_hidden_layers=6), 1.0),
    # no sandwich norms, no gate; both RoPEs default, the proportional one scaled; untied
    "lfm3-plain-untied": ("Lfm3Config", dict(
        LFM, num_hidden_layers=3, layer_types=["sliding_attention", "conv", "full_attention"],
        use_sandwich_norm=False, use_attention_gate=False, tie_word_embeddings=False,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                         "full_attention": {"rope_type": "proportional", "rope_theta": 1e4, "factor": 2.0,
                                            "partial_rotary_factor": 0.25}}), 1.0),
    # delta, sliding (RoPE, window 4), delta, full (NoPE), sliding: the MoE with an ungated shared expert, tied
    "lara-mini": ("LaraMiniConfig", dict(LARA, num_hidden_layers=5), 1.0),
    # full first, kernel 3, top-k weights not renormalised, untied
    "lara-mini-untied": ("LaraMiniConfig", dict(
        LARA, num_hidden_layers=3, layer_types=["full_attention", "linear_attention", "sliding_attention"],
        linear_conv_kernel_dim=3, norm_topk_prob=False, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}), 1.0),
    # KDA (the softplus forget gate), KDA, head-gated MLA (direct q); a dense MLP first, then the grouped MoE
    "ling-hybrid": ("BailingHybridConfig", dict(LING, num_hidden_layers=3, layer_group_size=3, first_k_dense_replace=1,
                                                kda_safe_gate=False), 1.0),
    # MLA first (low-rank q), then KDA with the safe forget gate (bound -3); MoE, dense, MoE by mlp_layer_types;
    # tie_word_embeddings, which transformers' Ling ignores (its _tied_weights_keys is empty)
    "ling-hybrid-safe-gate": ("BailingHybridConfig", dict(
        LING, num_hidden_layers=3, layer_types=["full_attention", "linear_attention", "linear_attention"],
        mlp_layer_types=["sparse", "dense", "sparse"], q_lora_rank=12, kda_lower_bound=-3.0,
        tie_word_embeddings=True), 1.0),
}


def sharpen(model, name: str) -> None:
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for key, buffer in model.named_buffers():
            if key.endswith("e_score_correction_bias"):  # DeepSeek-V3's selection bias, a buffer
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))


# Ling: MLA's caches (keys nope + rope wide, values v) have two widths genai cannot allocate;
# the others' genai stops at the folder's eos (or pad)
REFUSED = "different cache layouts"
TWINS = family(None, {}, {name: case[:2] for name, case in CASES.items()}, checks=(STATES, STATES_ONNX),
               tweak=sharpen, genai_until_eos=True,
               rows={name: dict(norm_centre=case[2], genai_refused=REFUSED if name.startswith("ling") else None)
                     for name, case in CASES.items()})


models = models_fixture(TWINS)


@needs_torch
@pytest.mark.parametrize("name", ["olmo-hybrid", "lara-mini"])
def test_a_long_prompt_takes_the_portable_chunked_form(models, tmp_path, name):
    import passes  # noqa: F401  (registers the passes)
    from irc.passmanager import PassManager, parse_pipeline

    model, folder = models(name)
    graph = load_spec(folder)
    PassManager(parse_pipeline("scan-chunk{size=64}")).run(graph)
    assert_long_prompt_matches(model, graph, tmp_path)


# ---- refusals (no transformers needed) --------------------------------------------------------

BASE = {"olmo_hybrid": {"model_type": "olmo_hybrid", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
                        "num_attention_heads": 4, "intermediate_size": 48},
        "lara_mini": {"model_type": "lara_mini", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 5,
                      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "linear_num_key_heads": 2,
                      "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
                      "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
        "bailing_hybrid": {"model_type": "bailing_hybrid", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 3,
                           "layer_group_size": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8,
                           "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
                           "intermediate_size": 48, "moe_intermediate_size": 16, "num_experts": 8,
                           "num_experts_per_token": 2, "num_expert_group": 2, "topk_group": 1},
        "lfm3": {"model_type": "lfm3", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 6,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48}}
REFUSALS = {  # name: (model type, changes, the key named, a fragment of the message)
    "olmo-hybrid-layer-kind": ("olmo_hybrid", {"layer_types": ["linear_attention", "sliding_attention"] * 2},
                               "layer_types", '"sliding_attention" is not supported'),
    "olmo-hybrid-value-heads": ("olmo_hybrid", {"linear_num_key_heads": 2, "linear_num_value_heads": 3},
                                "linear_num_value_heads", "3 value heads are not a multiple of 2 key heads"),
    "olmo-hybrid-attention-bias": ("olmo_hybrid", {"attention_bias": True}, "attention_bias", "true is not supported"),
    "olmo-hybrid-activation": ("olmo_hybrid", {"hidden_act": "gelu"}, "hidden_act", '"gelu" is not supported'),
    "lfm3-layer-kind": ("lfm3", {"layer_types": ["conv", "linear_attention"] * 3}, "layer_types",
                        '"linear_attention" is not supported'),
    "lfm3-rope-type": ("lfm3", {"rope_parameters": {"sliding_attention": {"rope_type": "default"},
                                                    "full_attention": {"rope_type": "yarn", "factor": 2.0}}},
                       "rope_parameters.full_attention.rope_type", '"yarn" is not supported'),
    "lara-mini-layer-kind": ("lara_mini", {"layer_types": ["linear_attention", "conv", "full_attention",
                                                           "sliding_attention", "linear_attention"]},
                             "layer_types", '"conv" is not supported'),
    "lara-mini-top-k": ("lara_mini", {"num_experts_per_tok": 5}, "num_experts_per_tok", "top_k 5 exceeds 4 experts"),
    "lara-mini-value-heads": ("lara_mini", {"linear_num_value_heads": 3}, "linear_num_value_heads",
                              "3 value heads are not a multiple of 2 key heads"),
    "ling-swiglu-limit": ("bailing_hybrid", {"expert_swiglu_limit_list": [0, 7.0, 7.0]}, "expert_swiglu_limit_list",
                          "[0, 7.0, 7.0] is not supported"),
    "ling-kv-heads": ("bailing_hybrid", {"num_key_value_heads": 2}, "num_key_value_heads", "2 is not supported"),
    "ling-lower-bound": ("bailing_hybrid", {"kda_lower_bound": 1.0}, "kda_lower_bound", "1.0 is not negative"),
    "ling-expert-groups": ("bailing_hybrid", {"num_expert_group": 3}, "num_experts",
                           "8 experts do not split into 3 groups"),
    "lfm3-attention-bias": ("lfm3", {"attention_bias": True}, "attention_bias", "true is not supported"),
}


def test_the_defaults_derive_the_layer_kinds_and_head_widths(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**BASE["olmo_hybrid"], "num_hidden_layers": 3}))
    graph = load_spec(tmp_path)
    assert graph.meta["layer_kinds"] == ["gated_delta", "gated_delta", "attention"]
    assert graph.meta["ssm"]["key_dim"] == 6 and graph.meta["ssm"]["value_dim"] == 12


@pytest.mark.parametrize("model_type, kinds", [
    ("lfm3", ["short_conv", "short_conv", "attention", "short_conv", "attention", "short_conv"]),
    ("lara_mini", ["gated_delta", "attention", "gated_delta", "attention", "attention"])])
def test_without_layer_types_the_config_class_pattern_holds(tmp_path, model_type, kinds):
    (tmp_path / "config.json").write_text(json.dumps(BASE[model_type]))
    assert load_spec(tmp_path).meta["layer_kinds"] == kinds


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_a_bad_setting_is_one_error_naming_config_json_and_the_key(tmp_path, name):
    model_type, changes, key, fragment = REFUSALS[name]
    refused(tmp_path, key, fragment, {**BASE[model_type], **changes})


# ---- the log op (Ling's safe forget gate: the inverse softplus) ----------------------------------

LOG_INPUT = np.array([[1e-30, 1e-7, 0.5, 1.0, 2.718281828, 40.0]], np.float32)


def test_the_log_op_is_numpys_log_and_keeps_the_float_type():
    from irc.testing import run_op

    (got,) = run_op("log", [LOG_INPUT], {})
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.log(LOG_INPUT), rtol=1e-6)


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_the_log_op_lowers_to_onnx_as_the_reference(tmp_path, target):
    ort = pytest.importorskip("onnxruntime")
    from backends.onnx.emit import emit_model
    from irc.build import emit
    from irc.dtypes import DType
    from irc.graph import Graph
    from irc.interpreter import Interpreter

    g = Graph("log")
    x = g.add_input("x", DType.f32, ("B", "T"))
    g.outputs = emit(g, "log", [x], {}, ["y"])
    path = str(tmp_path / "m.onnx")
    emit_model(g, path, target=target, genai=False)
    (got,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": LOG_INPUT})
    np.testing.assert_allclose(got, Interpreter(g).run({"x": LOG_INPUT})["y"], rtol=1e-6)


def test_the_log_op_in_the_triton_fallback_is_torchs_log():
    torch = pytest.importorskip("torch")
    from backends.triton.fallback import UNARY

    np.testing.assert_allclose(eval(UNARY["log"])(torch.from_numpy(LOG_INPUT)).numpy(), np.log(LOG_INPUT), rtol=1e-6)
