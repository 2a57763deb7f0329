"""The GGUF frontend's short-convolution and gated-DeltaNet archs (lfm2, lfm2moe, qwen3next,
qwen35, qwen35moe) against transformers: tiny random twins written as llama.cpp's converter writes
them (``gguf_writer.write_linear``: LFM2's squeezed conv and ``shortconv.l_cache``;
Qwen's 1 + w norms, ssm_a = -exp(A_log), dt_bias as ssm_dt.bias, in_proj_qkvz regrouped
into attn_qkv + attn_gate, Qwen3.5's value heads tiled), read back with ``load_spec``: the
logits of a left-padded batch equal transformers' on each row run alone, the greedy tokens
equal, a Q8_0 file keeps its blocks, and a missing delta-net key is one SpecError naming
the file and the key."""
import gguf
import numpy as np
import pytest

from frontends import load_spec
from frontends.gguf import load_gguf
from gguf_writer import linear_converted, linear_keys, write_file, write_linear
from irc.errors import SpecError
from test_hf_models import TOLERANCE, assert_greedy_matches, irc_logits, prompts, relative_error
from test_hf_ssm import unpadded_logits
from twin_fixtures import once_fixture, random_twin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NEW_TOKENS = 8
LFM2 = dict(vocab_size=128, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            pad_token_id=0, bos_token_id=0, eos_token_id=0)
QWEN = dict(vocab_size=128, hidden_size=32, pad_token_id=0, bos_token_id=0, eos_token_id=0, intermediate_size=48,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6)
EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
CASES = {  # name: (config class, settings, GGUF architecture, an older Qwen3-Next file with ssm_in)
    # conv, attention, conv, attention; a 4-tap conv with biases; untied
    "lfm2-biased-untied": ("Lfm2Config", dict(LFM2, num_hidden_layers=4, intermediate_size=96, block_multiple_of=16,
                                              conv_L_cache=4, conv_bias=True, tie_word_embeddings=False,
                                              layer_types=["conv", "full_attention", "conv", "full_attention"]),
                           "lfm2", False),
    "lfm2-tied": ("Lfm2Config", dict(LFM2, num_hidden_layers=3, intermediate_size=72, block_multiple_of=16,
                                     layer_types=["full_attention", "conv", "conv"]), "lfm2", False),
    # one dense layer, then sigmoid-routed experts with the selection bias
    "lfm2moe": ("Lfm2MoeConfig", dict(LFM2, num_hidden_layers=4, intermediate_size=48, moe_intermediate_size=16,
                                      num_experts=4, num_experts_per_tok=2, num_dense_layers=1,
                                      layer_types=["conv", "full_attention", "conv", "conv"]), "lfm2moe", False),
    # delta, delta, delta, gated attention; MoE with a gated shared expert on every layer (llama.cpp's
    # qwen3next has no dense MLP tensors, so no mlp_only_layers)
    "qwen3next-moe": ("Qwen3NextConfig", dict(QWEN, **EXPERTS, num_hidden_layers=4),
                      "qwen3next", False),
    "qwen3next-moe-ssm-in": ("Qwen3NextConfig", dict(QWEN, **EXPERTS, num_hidden_layers=4),
                             "qwen3next", True),
    # 3 value heads per key head: the converter tiles them
    "qwen35-dense": ("Qwen3_5TextConfig", dict(QWEN, num_hidden_layers=4, linear_num_value_heads=6), "qwen35", False),
    "qwen35moe": ("Qwen3_5MoeTextConfig", dict(QWEN, **EXPERTS, num_hidden_layers=4), "qwen35moe", False),
}


def build_case(name: str, folder):
    class_name, settings, arch, fused = CASES[name]
    model = random_twin(class_name, settings, sorted(CASES).index(name),
                        norm_centre=1.0 if arch.startswith("lfm2") else 0.0)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith("linear_attn.norm.weight"):  # the gated norm is plain w
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=generator))
        for key, b in model.named_buffers():
            if key.endswith("expert_bias"):  # large enough to change which experts are chosen
                b.copy_(torch.randn(b.shape, generator=generator))
    return model, write_linear(folder / f"{name}.gguf", model, arch, fused=fused)


models = once_fixture(build_case)


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_and_greedy_tokens_match_transformers(models, name):
    model, path = models(name)
    graph = load_spec(path)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    got = irc_logits(graph, ids, mask, positions)
    assert relative_error(got[real], unpadded_logits(model, ids, mask)[real]) <= TOLERANCE
    prompt = ids[0].tolist()
    assert_greedy_matches(graph, model, prompt, NEW_TOKENS)


@pytest.mark.parametrize("name", ["lfm2-biased-untied", "lfm2moe", "qwen3next-moe-ssm-in", "qwen35-dense"])
def test_params_are_the_checkpoints(models, tmp_path, name):
    """Every param read from the file is transformers' (A_log to float32 rounding), so the
    converter's reorderings and offsets are undone exactly."""
    model, path = models(name)
    model.save_pretrained(tmp_path)
    from_gguf, from_hf = load_gguf(path, weights="float"), load_spec(tmp_path)
    assert {n: p.shape for n, p in from_gguf.params.items()} == {n: p.shape for n, p in from_hf.params.items()}
    for param in from_hf.params:
        got, want = from_gguf.params[param].array(), from_hf.params[param].array()
        if param.endswith("A_log"):
            np.testing.assert_allclose(got, want, rtol=0, atol=2 ** -20, err_msg=param)
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6, err_msg=param)


def test_q8_0_keeps_the_reordered_rows_as_blocks(models, tmp_path):
    model, _ = models("qwen35-dense")
    path = write_linear(tmp_path / "q8.gguf", model, "qwen35", qtype=gguf.GGMLQuantizationType.Q8_0)
    blocks, floats = load_gguf(path), load_gguf(path, weights="float")
    kept = {p[:-len(".qweight")] for p in blocks.params if p.endswith(".qweight")}
    assert {"layers.0.ssm.in_proj_qkv", "layers.0.ssm.in_proj_z", "layers.0.ssm.in_proj_b"} <= kept
    assert "layers.0.ssm.out_proj" not in kept  # its columns were tiled: put back in float
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    want = irc_logits(floats, ids, mask, positions)
    assert relative_error(irc_logits(blocks, ids, mask, positions)[real], want[real]) <= 1e-5


@pytest.mark.parametrize("name, key", [("qwen35-dense", "qwen35.ssm.group_count"),
                                       ("qwen35-dense", "qwen35.ssm.time_step_rank"),
                                       ("qwen3next-moe", "qwen3next.ssm.state_size"),
                                       ("qwen3next-moe", "qwen3next.ssm.inner_size"),
                                       ("qwen3next-moe", "qwen3next.ssm.conv_kernel"),
                                       ("lfm2-tied", "lfm2.shortconv.l_cache")])
def test_a_missing_key_is_one_error_naming_file_and_key(models, tmp_path, name, key):
    model, _ = models(name)
    arch = CASES[name][2]
    keys = {k: v for k, v in linear_keys(model.config, arch).items() if k != key}
    path = write_file(tmp_path / "bad.gguf", arch, keys, linear_converted(model, arch))
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert str(err.value).count(f"{key}: missing required key") == 1
    assert "bad.gguf" in str(err.value)


def test_value_heads_that_are_not_a_multiple_of_key_heads(models, tmp_path):
    model, _ = models("qwen35-dense")
    keys = {**linear_keys(model.config, "qwen35"), "qwen35.ssm.group_count": 4}
    path = write_file(tmp_path / "heads.gguf", "qwen35", keys, linear_converted(model, "qwen35"))
    with pytest.raises(SpecError, match="qwen35.ssm.time_step_rank: 6 value heads are not a multiple of 4"):
        load_spec(path)
