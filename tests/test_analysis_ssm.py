"""State accounting: recurrent-state elements per sequence (flat in context) beside KV
elements per token, and the seed's arithmetic (../shared/seeds: "a Mamba layer with d = 4096,
expansion 2 and state 16 stores 131,072 numbers whatever T is, equal to a GQA layer's cache
with H_kv·d_h = 1024 at T = 64")."""
from frontends.dsl import Model
from irc.analysis import analyze, memory_against_context, state_inputs


def one_layer(kind: str, d: int = 4096) -> Model:
    m = Model(f"one-{kind}", vocab=256, d_model=d)
    x = m.embed(m.input_ids())
    for layer in m.layers(1):
        if kind == "mamba":
            x = x + layer.mamba(layer.rms_norm(x, "ssm_norm"), expand=2, state_size=16, conv_kernel=4)
        elif kind == "mamba2":
            x = x + layer.mamba2(layer.rms_norm(x, "ssm_norm"), heads=128, head_dim=64, state_size=128, groups=8)
        else:
            x = x + layer.attention(layer.rms_norm(x, "attn_norm"), heads=32, kv_heads=8, head_dim=128)
    m.logits(m.rms_norm(x, "norm"))
    return m.graph


def test_the_seed_mamba_layer_stores_as_much_as_a_gqa_cache_at_64_tokens():
    mamba, gqa = analyze(one_layer("mamba")), analyze(one_layer("gqa"))
    assert mamba["state_elements_by_kind"]["recurrent_state"] == 131_072  # d_inner 8192 x state 16
    assert mamba["state_elements_by_kind"]["conv_state"] == 8192 * 3       # the last K-1 = 3 inputs
    assert gqa["kv_cache_elements_per_token"] == 2 * 1024                  # K and V, H_kv * d_h = 1024 each
    assert gqa["kv_cache_elements_per_token"] * 64 == mamba["state_elements_by_kind"]["recurrent_state"]
    assert mamba["kv_cache_elements_per_token"] == 0 and gqa["state_elements_per_sequence"] == 0


def test_state_is_flat_in_context_and_the_cache_grows():
    rows = memory_against_context(one_layer("mamba2"), contexts=(128, 8192))
    assert rows[0]["state_bytes"] == rows[1]["state_bytes"] == 4 * (128 * 128 * 64 + (8192 + 2 * 8 * 128) * 3)
    assert rows[0]["kv_cache_bytes"] == rows[1]["kv_cache_bytes"] == 0
    hybrid = memory_against_context(one_layer("gqa"), contexts=(128, 8192))
    assert hybrid[1]["kv_cache_bytes"] == 64 * hybrid[0]["kv_cache_bytes"]


def test_flops_per_token_count_the_scan_and_the_conv():
    d, d_inner, state, rank, kernel, vocab = 4096, 8192, 16, 256, 4, 256
    summary = analyze(one_layer("mamba"))
    projections = 2 * d_inner * d + (rank + 2 * state) * d_inner + d_inner * rank + d * d_inner
    want = 2 * projections + 2 * d_inner * kernel + 4 * d_inner * state + 2 * vocab * d
    assert summary["flops_per_token"] == want
    assert summary["layers"][0]["mixer"] == "mamba"


def test_state_inputs_are_the_past_inputs_without_a_past_length():
    graph = one_layer("mamba2")
    assert [v.name for v in state_inputs(graph)] == ["past_key_values.0.conv_state",
                                                     "past_key_values.0.recurrent_state"]
    assert [v.shape for v in state_inputs(graph)] == [("B", 8192 + 2 * 8 * 128, 3), ("B", 128, 128, 64)]
    assert "position_ids" not in {v.name for v in graph.inputs}  # nothing reads positions without RoPE
