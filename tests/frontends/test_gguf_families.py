"""The GGUF frontend against transformers, one tiny random model per family: the model is
written as llama.cpp's converter writes it (``gguf_writer``: gguf's own name table, the
converter's permutations and offsets), read back with ``load_spec(file.gguf)``, and must
give transformers' logits on a left-padded batch (reference interpreter) and its greedy
continuation. Block formats: the same model quantized to Q8_0 / Q4_0 / Q4_1 / Q5_1 keeps
its blocks exactly (``weights="exact"``: ``dequant_linear`` / ``dequantize`` at accuracy level
0) and matches the float-weights graph of the same file, through the interpreter and both
ONNX targets (the default's faster forms: ``test_gguf_forms``)."""
from collections import Counter

import gguf
import numpy as np
import onnx
import pytest

from frontends import load_spec
from frontends.gguf import load_gguf
from frontends.gguf.blocks import EXACT
from gguf_writer import write_model
from test_hf_models import (MLA, SMALL, TOLERANCE, assert_greedy_matches, assert_logits_match, irc_logits, prompts,
                            relative_error)
from twin_fixtures import once_fixture, random_twin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NEW_TOKENS = 8
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}
CASES = {  # name: (config class, overrides of SMALL, GGUF architecture, write_model options)
    "llama-llama3-rope": ("LlamaConfig", dict(hidden_size=64, head_dim=16, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 2048}), "llama", {}),
    "llama-mqa-tied-linear": ("LlamaConfig", dict(hidden_size=48, head_dim=8, num_key_value_heads=1,
                                                  tie_word_embeddings=True, rope_parameters={
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}), "llama", {}),
    "mistral-window-4": ("MistralConfig", dict(sliding_window=4, head_dim=8), "llama", {}),
    "mixtral-top2": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2), "llama", {}),
    "qwen2-bias": ("Qwen2Config", {}, "qwen2", {}),
    "qwen3-qk-norm": ("Qwen3Config", dict(head_dim=16, num_key_value_heads=1), "qwen3", {}),
    "qwen2-moe-shared-gate": ("Qwen2MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                                     shared_expert_intermediate_size=24), "qwen2moe", {}),
    "qwen3-moe-renormalised": ("Qwen3MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                                      norm_topk_prob=True, head_dim=16), "qwen3moe", {}),
    "gemma2-softcaps-window": ("Gemma2Config", dict(head_dim=16, sliding_window=4, attn_logit_softcapping=5.0,
                                                    final_logit_softcapping=3.0, query_pre_attn_scalar=16), "gemma2",
                               {}),
    "gemma3-local-global": ("Gemma3TextConfig", dict(num_hidden_layers=3, head_dim=16, sliding_window=4,
                                                     sliding_window_pattern=2, query_pre_attn_scalar=16,
                                                     rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}}), "gemma3",
                            {"extra": lambda w: w.add_sliding_window_pattern(2)}),
    "gemma-geglu-tied": ("GemmaConfig", dict(head_dim=16), "gemma", {}),
    "granite-multipliers": ("GraniteConfig", dict(embedding_multiplier=4.0, attention_multiplier=0.2,
                                                  residual_multiplier=0.5, logits_scaling=3.0), "granite", {}),
    "granitemoe-top2": ("GraniteMoeConfig", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=16,
                                                 embedding_multiplier=2.0, residual_multiplier=0.7,
                                                 logits_scaling=2.0, attention_multiplier=0.3), "granitemoe", {}),
    # llama.cpp's SmolLM3: NoPE on every fourth layer, whatever the config says
    "smollm3-nope-every-4th": ("SmolLM3Config", dict(num_hidden_layers=4, no_rope_layer_interval=4, pad_token_id=0,
                                                     bos_token_id=1, eos_token_id=2), "smollm3", {}),
    "phi3-partial-rotary-window": ("Phi3Config", dict(pad_token_id=0, sliding_window=5, partial_rotary_factor=0.5),
                                   "phi3", {}),
    "deepseek-v2-q-lora-yarn": ("DeepseekV2Config", dict(MLA, q_lora_rank=16, n_routed_experts=4,
                                                         num_experts_per_tok=2, n_shared_experts=1,
                                                         routed_scaling_factor=1.5, rope_parameters=YARN),
                                "deepseek2", {}),
    "deepseek-v2-lite-split-kv-b": ("DeepseekV2Config", dict(MLA, q_lora_rank=None, n_routed_experts=6,
                                                             num_experts_per_tok=3, n_shared_experts=2),
                                    "deepseek2", {"kv_split": True}),
    "deepseek-v3-groups": ("DeepseekV3Config", dict(MLA, q_lora_rank=16, n_routed_experts=8, num_experts_per_tok=3,
                                                    n_group=4, topk_group=2, n_shared_experts=1,
                                                    routed_scaling_factor=2.5), "deepseek2", {}),
}


def build_case(name: str, folder):
    class_name, overrides, arch, options = CASES[name]
    model = random_twin(class_name, {**SMALL, **overrides}, sorted(CASES).index(name),
                        norm_centre=0.0 if "gemma" in name else 1.0)
    return model, write_model(folder / f"{name}.gguf", model, arch, **options)


models = once_fixture(build_case)


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_transformers(models, name):
    model, path = models(name)
    assert_logits_match(load_spec(path), model)


@pytest.mark.parametrize("name", ["llama-llama3-rope", "gemma3-local-global", "deepseek-v3-groups"])
def test_greedy_generation_matches(models, name):
    model, path = models(name)
    prompt = prompts()[0][0].tolist()
    assert_greedy_matches(load_spec(path), model, prompt, NEW_TOKENS)


def test_the_graph_is_the_hf_frontends(models, tmp_path):
    """Same model, both frontends: the same ops and params (names, shapes)."""
    model, path = models("qwen3-moe-renormalised")
    model.save_pretrained(tmp_path)
    from_gguf, from_hf = load_gguf(path, weights="float"), load_spec(tmp_path)
    assert [n.op for n in from_gguf.nodes] == [n.op for n in from_hf.nodes]
    assert {n: p.shape for n, p in from_gguf.params.items()} == {n: p.shape for n, p in from_hf.params.items()}


# ---- block formats through the graph and ONNX ---------------------------------------------

QUANTIZED = {  # name: (case, GGUF block type)
    "llama-q8_0": ("llama-llama3-rope", gguf.GGMLQuantizationType.Q8_0),
    "qwen2-moe-q4_1": ("qwen2-moe-shared-gate", gguf.GGMLQuantizationType.Q4_1),
    "gemma2-q4_0": ("gemma2-softcaps-window", gguf.GGMLQuantizationType.Q4_0),
    "phi3-q5_1": ("phi3-partial-rotary-window", gguf.GGMLQuantizationType.Q5_1),
}


def takes_matmul_nbits(qtype) -> bool:
    """Every block type: 8-bit codes with float zero points (Q5_1 here) too, as u8 zero points
    plus a correction (``backends.onnx.quant_pack``)."""
    return qtype in EXACT


@pytest.mark.parametrize("name", sorted(QUANTIZED))
def test_block_formats_stay_quantized_and_match_float(models, tmp_path, name):
    from backends.onnx import emit, runtime

    case, qtype = QUANTIZED[name]
    model, _ = models(case)
    path = write_model(tmp_path / f"{name}.gguf", model, CASES[case][2], qtype=qtype, **CASES[case][3])
    blocks, floats = load_gguf(path, weights="exact"), load_gguf(path, weights="float")
    assert any(n.op in ("dequant_linear", "dequantize") for n in blocks.nodes)
    assert not any(n.op in ("dequant_linear", "dequantize") for n in floats.nodes)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    want = irc_logits(floats, ids, mask, positions)
    assert relative_error(irc_logits(blocks, ids, mask, positions)[real], want[real]) <= 1e-5
    long, short = ids[0].tolist(), ids[1][mask[1] == 1].tolist()
    for target in ("onnx", "onnx-ort"):
        onnx_path = str(tmp_path / f"{target}.onnx")
        emit.emit_model(blocks, onnx_path, target=target, genai=False)
        counts = Counter(n.op_type for n in onnx.load(onnx_path).graph.node)
        assert (counts["MatMulNBits"] > 0) == (target == "onnx-ort" and takes_matmul_nbits(qtype))
        result = runtime.greedy(runtime.ort_engine(onnx_path), blocks, [long, short], 4)
        assert relative_error(result["prefill"]["logits"][real], want[real]) <= TOLERANCE


@pytest.mark.parametrize("case, qtype", [("llama-llama3-rope", gguf.GGMLQuantizationType.Q4_1),
                                         ("phi3-partial-rotary-window", None), ("qwen2-moe-shared-gate", None)])
def test_params_read_by_rows_as_whole(models, tmp_path, case, qtype):
    """What a streaming writer reads piece by piece (``irc.weights.read_rows``) is the
    whole param's rows: un-permuted Q/K, split fused projections, stacked experts, blocks."""
    from irc.weights import read_rows, reads_rows

    model, path = models(case)
    if qtype is not None:
        path = write_model(tmp_path / "q.gguf", model, CASES[case][2], qtype=qtype, **CASES[case][3])
    graph = load_gguf(path)
    checked = 0
    for param in graph.params.values():
        if reads_rows(param.data) and param.shape[0] > 2:
            np.testing.assert_array_equal(read_rows(param, 1, 3), param.array()[1:3], err_msg=param.name)
            checked += 1
    assert checked >= 8
