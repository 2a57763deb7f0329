"""The analysis numbers the issue and the seeds pin down, on the full-size examples
(weights absent: nothing is allocated)."""
import pytest

from frontends import load_spec
from irc.analysis import analyze
from irc.dtypes import DType

GiB = 1 << 30


def show(name, **kw):
    return analyze(load_spec(f"examples/{name}.yaml"), **kw)


def test_llama3_8b_params_and_cache():
    s = show("llama3-8b", cache_dtype=DType.bf16)
    assert s["params_total"] == 8_030_261_248
    assert s["params_active"] == s["params_total"]
    assert s["kv_cache_bytes_per_token"] == 131_072
    assert s["kv_cache_elements_per_token_per_layer"] == 2 * 8 * 128
    assert s["n_layers"] == 32 and len(s["layers"]) == 32


def test_llama3_8b_flops_follow_the_seed_accounting():
    # 2 FLOPs per matmul weight (LM head in, embedding lookup out) + 4·S·d per layer
    d, layers, vocab = 4096, 32, 128_256
    matmul_weights = 8_030_261_248 - vocab * d - (2 * layers + 1) * d
    for context in (1, 4096, 131_072):
        s = show("llama3-8b", context=context)
        assert s["flops_per_token"] == 2 * matmul_weights + layers * 4 * context * d


def test_llama2_7b_cache_is_512_kib_per_token():
    s = show("llama2-7b", cache_dtype=DType.bf16)
    assert s["kv_cache_bytes_per_token"] == 524_288 == 512 * 1024


def test_llama2_70b_cache_at_8k_fp16():
    s = show("llama2-70b", cache_dtype=DType.f16, context=8192)
    assert s["kv_cache_bytes_at_context"] == int(2.5 * GiB)
    assert s["kv_cache_bytes_mha_equivalent_at_context"] == 20 * GiB


def test_mixtral_total_and_active():
    s = show("mixtral-8x7b")
    assert s["params_total"] == 46_702_792_704
    assert s["params_active"] == 12_879_925_248  # about 12.9 B: 2 of 8 experts per token
    assert {layer["mlp"] for layer in s["layers"]} == {"moe"}


def test_deepseek_v2_unabsorbed_cache_and_latent():
    s = show("deepseek-v2", cache_dtype=DType.bf16)
    heads, qk, v = 128, 128 + 64, 128
    assert s["kv_cache_elements_per_token_per_layer"] == heads * (qk + v)  # per-head K and V
    assert s["kv_cache_latent_elements_per_token_per_layer"] == 576      # d_c + d_rope
    assert s["kv_cache_latent_bytes_per_token"] == 69_120 == int(67.5 * 1024)
    assert s["kv_cache_bytes_mha_equivalent_per_token"] == 3_932_160
    assert s["layers"][0]["mlp"] == "dense" and s["layers"][1]["mlp"] == "moe"


def test_sliding_window_caps_cache_and_attention_flops():
    full = show("mistral-7b", context=4096)
    long = show("mistral-7b", context=32_768)
    assert long["kv_cache_bytes_at_context"] == full["kv_cache_bytes_at_context"]  # window 4096
    assert long["flops_per_token"] == full["flops_per_token"]


def test_gemma2_local_layers_cap_only_their_share():
    s4k, s8k = show("gemma2-9b", context=4096), show("gemma2-9b", context=8192)
    windows = [layer["window"] for layer in s4k["layers"]]
    assert windows.count(4096) == 21 and windows.count(None) == 21
    per_token = s4k["kv_cache_bytes_per_token"]
    assert s8k["kv_cache_bytes_at_context"] == per_token // 2 * 8192 + per_token // 2 * 4096


@pytest.mark.parametrize("name", ["llama3-8b", "mixtral-8x7b", "deepseek-v2", "gemma2-9b"])
def test_full_size_specs_allocate_no_weights(name):
    graph = load_spec(f"examples/{name}.yaml")
    assert all(p.data is None for p in graph.params.values())
