"""The gated-DeltaNet families (Qwen3-Next, Qwen3.5 dense and MoE; Qwen3.5 as it ships, with
its vision tower, is a VLM: ``test_hf_qwen_vl``) against transformers on tiny random twins, rows
of the twin harness (test_hf_twins.py: logits on a left-padded batch of two, each row held
against the row run alone, 16 greedy tokens through the reference interpreter; both ONNX
targets in ONNX Runtime, prefill logits and 16 greedy tokens per row, the conv and recurrent
states and the KV caches fed back; and onnxruntime-genai 0.18 generating transformers' tokens
from the folder irc writes); a long prompt through the portable chunked form. Then the
refusals: one SpecError naming config.json and the key."""
import json
from pathlib import Path

import numpy as np
import pytest

from frontends import load_spec
from irc.errors import SpecError
from tests.frontends.refusals import pointed_line, refused
from tests.frontends.test_hf_models import TOLERANCE, relative_error
from tests.frontends.test_hf_ssm import unpadded_logits
from tests.frontends.twins import STATES, STATES_ONNX, family, models_fixture

try:
    import torch
    import transformers
except ImportError:  # the refusals below need neither
    torch = transformers = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch and transformers")

TEXT = dict(vocab_size=128, hidden_size=32, pad_token_id=0, bos_token_id=0, eos_token_id=0, intermediate_size=48,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6)
EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
CASES = {  # name: (config class, its settings)
    # delta, dense MLP (mlp_only_layers), delta, gated attention: MoE with a gated shared expert elsewhere
    "qwen3-next-moe": ("Qwen3NextConfig", dict(TEXT, **EXPERTS, num_hidden_layers=4, mlp_only_layers=[1])),
    # attention first, one key head per value head, d_k != d_v, kernel 3, half rotary, MoE every other layer, tied
    "qwen3-next-sparse-step-tied": ("Qwen3NextConfig", dict(
        TEXT, **EXPERTS, num_hidden_layers=3, layer_types=["full_attention", "linear_attention", "linear_attention"],
        decoder_sparse_step=2, linear_num_key_heads=4, linear_key_head_dim=4, linear_conv_kernel_dim=3,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 5e5,
                                                   "partial_rotary_factor": 0.5})),
    "qwen3.5-dense": ("Qwen3_5TextConfig", dict(TEXT, num_hidden_layers=4, linear_num_value_heads=6)),
    "qwen3.5-moe": ("Qwen3_5MoeTextConfig", dict(TEXT, **EXPERTS, num_hidden_layers=4,
                                                 layer_types=["linear_attention", "full_attention"] * 2)),
}


def sharpen(model, name: str) -> None:
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith("linear_attn.norm.weight"):  # the gated norm is plain w
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=generator))


TWINS = family(None, {}, CASES, checks=(STATES, STATES_ONNX), norm_centre=0.0, tweak=sharpen)  # norms: (1 + w)


models = models_fixture(TWINS)


@needs_torch
@pytest.mark.parametrize("name", ["qwen3-next-moe", "qwen3.5-dense"])
def test_a_long_prompt_takes_the_portable_chunked_form(models, tmp_path, name):
    """Prompts of 70 and 40 tokens (past one 64-token chunk, and inside one), left-padded:
    the portable target's chunked form (``backends.onnx.delta``, which ``scan-chunk`` asks
    for) against transformers'."""
    import passes  # noqa: F401  (registers the passes)
    from irc.passmanager import PassManager, parse_pipeline

    model, folder = models(name)
    graph = load_spec(folder)
    PassManager(parse_pipeline("scan-chunk{size=64}")).run(graph)
    assert_long_prompt_matches(model, graph, tmp_path)


def assert_long_prompt_matches(model, graph, tmp_path) -> None:
    """Prompts of 70 and 40 tokens (past one 64-token chunk, and inside one), left-padded,
    through the portable target (whose ``If`` the chunk attribute asks for) against
    transformers running each row alone."""
    import onnx

    from backends.onnx import emit, runtime

    path = str(tmp_path / "model.onnx")
    emit.emit_model(graph, path, target="onnx", genai=False)
    assert any(n.op_type == "If" for n in onnx.load(path).graph.node)
    rng = np.random.default_rng(1)
    ids, mask = np.zeros((2, 70), np.int64), np.zeros((2, 70), np.int64)
    ids[0], mask[0] = rng.integers(1, 128, 70), 1
    ids[1, 30:], mask[1, 30:] = rng.integers(1, 128, 40), 1
    result = runtime.greedy(runtime.ort_engine(path), graph, [ids[0].tolist(), ids[1, 30:].tolist()], 1)
    real = mask.astype(bool)
    assert relative_error(result["prefill"]["logits"][real], unpadded_logits(model, ids, mask)[real]) <= TOLERANCE


# ---- refusals (no transformers needed) --------------------------------------------------------

BASE = {"model_type": "qwen3_next", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
        "num_experts": 0, "layer_types": ["linear_attention", "linear_attention", "linear_attention",
                                          "full_attention"]}
REFUSALS = {  # name: (changes, the key named, a fragment of the message)
    "unknown-layer-kind": ({"layer_types": ["linear_attention", "sliding_attention", "linear_attention",
                                            "full_attention"]}, "layer_types", '"sliding_attention" is not supported'),
    "layer-types-too-short": ({"layer_types": ["linear_attention", "full_attention"]}, "layer_types",
                              "has 2 entries for 4 layers"),
    "value-heads-not-a-multiple": ({"linear_num_value_heads": 3}, "linear_num_value_heads",
                                   "3 value heads are not a multiple of 2 key heads"),
    "attention-bias": ({"attention_bias": True}, "attention_bias", "true is not supported"),
    "activation": ({"hidden_act": "gelu"}, "hidden_act", '"gelu" is not supported'),
    "conv-kernel-0": ({"linear_conv_kernel_dim": 0}, "linear_conv_kernel_dim", "expected a positive integer"),
    "top-k-above-experts": ({"num_experts": 4, "num_experts_per_tok": 5, "moe_intermediate_size": 16},
                            "num_experts_per_tok", "top_k 5 exceeds 4 experts"),
}


def folder_with(tmp_path, config: dict):
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    return tmp_path


QWEN3_NEXT_80B = {  # Qwen/Qwen3-Next-80B-A3B-Instruct's config.json (transformers 4.57 form: rope_theta, no layer_types)
    "architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "full_attention_interval": 4,
    "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5120,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "linear_value_head_dim": 128, "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_next",
    "moe_intermediate_size": 512, "norm_topk_prob": True, "num_attention_heads": 16, "num_experts": 512,
    "num_experts_per_tok": 10, "num_hidden_layers": 48, "num_key_value_heads": 2, "output_router_logits": False,
    "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}


def test_the_full_size_config_matches_its_dsl_twin(tmp_path):
    """80B parameters, 3B active besides the embeddings; the same analysis as
    examples/qwen3_next_80b_a3b_dsl.py."""
    from irc.analysis import analyze

    hf = analyze(load_spec(folder_with(tmp_path, QWEN3_NEXT_80B)))
    dsl = analyze(load_spec(Path(__file__).resolve().parents[2] / "examples" / "qwen3_next_80b_a3b_dsl.py"))
    assert {k: v for k, v in hf.items() if k != "name"} == {k: v for k, v in dsl.items() if k != "name"}
    assert hf["params_total"] == 79_674_391_296 and hf["params_active"] == 3_874_929_408


def test_the_base_config_builds_and_derives_the_layer_kinds(tmp_path):
    graph = load_spec(folder_with(tmp_path, {k: v for k, v in BASE.items() if k != "layer_types"}))
    assert graph.meta["layer_kinds"] == ["gated_delta", "gated_delta", "gated_delta", "attention"]
    assert graph.meta["ssm"]["kind"] == "gated_delta"


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_a_bad_setting_is_one_error_naming_config_json_and_the_key(tmp_path, name):
    changes, key, fragment = REFUSALS[name]
    assert f'"{key}"' in pointed_line(tmp_path, refused(tmp_path, key, fragment, {**BASE, **changes}))


def test_a_multimodal_config_names_its_text_config(tmp_path):
    text = {k: v for k, v in BASE.items() if k not in ("model_type", "num_experts")}
    config = {"model_type": "qwen3_5", "text_config": {**text, "model_type": "qwen3_5_text",
                                                       "linear_num_value_heads": 5}}
    with pytest.raises(SpecError, match=r"config.json:\d+: text_config.linear_num_value_heads: 5 value heads"):
        load_spec(folder_with(tmp_path, config))
    with pytest.raises(SpecError, match=r"config.json: text_config: expected the text model's settings"):
        load_spec(folder_with(tmp_path, {"model_type": "qwen3_5"}))


def test_the_cli_refuses_with_exit_2_and_writes_nothing(tmp_path, capsys):
    from irc_cli import main

    (tmp_path / "model").mkdir()
    folder = folder_with(tmp_path / "model", {**BASE, "linear_num_value_heads": 3})
    out = tmp_path / "out"
    assert main(["compile", str(folder), "--target", "onnx", "-o", str(out / "model.onnx"), "--quiet"]) == 2
    assert "linear_num_value_heads" in capsys.readouterr().err
    assert not out.exists()
