"""Qwen3-Next-80B-A3B in the DSL (structure only: ``irc show``): 48 layers, three gated-DeltaNet
layers (16 key / 32 value heads of 128, conv 4) to one gated attention layer (16 / 2 heads of
256, RoPE on a quarter of each head, base 1e7), each followed by a MoE of 512 experts (top 10,
width 512, renormalised) with a sigmoid-gated shared expert; Qwen's (1 + w) RMS norms. The
Hugging Face frontend builds the same graph from the checkpoint's config.json (held against
this file in tests/frontends/test_hf_delta.py); tiny_qwen3_next_dsl.py is its tiny twin."""
from frontends.dsl import Model, Rope


def build():
    m = Model("qwen3-next-80b-a3b", vocab=151936, d_model=2048, dtype="bf16")
    x = m.embed(m.input_ids())
    for layer in m.layers(48):
        if (layer.index + 1) % 4:  # full_attention_interval 4
            h = layer.rms_norm(x, name="ssm_norm", offset=1.0)
            x = x + layer.gated_delta(h, key_heads=16, value_heads=32, key_dim=128, value_dim=128, conv_kernel=4,
                                      projections="fused")
        else:
            h = layer.rms_norm(x, name="attn_norm", offset=1.0)
            x = x + layer.attention(h, heads=16, kv_heads=2, head_dim=256, rope=Rope(base=1e7, rotary_dim=64),
                                    qk_norm=True, qk_norm_offset=1.0, output_gate=True)
        h = layer.rms_norm(x, name="mlp_norm", offset=1.0)
        x = x + layer.moe(h, experts=512, top_k=10, d_ff=512, shared_experts=1, shared_d_ff=512,
                          shared_expert_gate=True)
    m.logits(m.rms_norm(x, name="norm", offset=1.0))
    return m.graph
