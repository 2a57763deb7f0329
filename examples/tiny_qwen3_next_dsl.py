"""A tiny Qwen3-Next in the DSL: three gated-DeltaNet layers to one gated attention layer,
each followed by a MoE with a sigmoid-gated shared expert; Qwen's (1 + w) RMS norms. The
full-size model is examples/qwen3_next_80b_a3b_dsl.py."""
from frontends.dsl import Model, Rope


def build():
    m = Model("tiny-qwen3-next", vocab=256, d_model=64)
    x = m.embed(m.input_ids())
    for layer in m.layers(4):
        if (layer.index + 1) % 4:  # full_attention_interval 4
            h = layer.rms_norm(x, name="ssm_norm", offset=1.0)
            x = x + layer.gated_delta(h, key_heads=2, value_heads=4, key_dim=16, value_dim=16, conv_kernel=4,
                                      projections="fused")
        else:
            h = layer.rms_norm(x, name="attn_norm", offset=1.0)
            x = x + layer.attention(h, heads=4, kv_heads=2, head_dim=32, rope=Rope(base=1e7, rotary_dim=8),
                                    qk_norm=True, qk_norm_offset=1.0, output_gate=True)
        h = layer.rms_norm(x, name="mlp_norm", offset=1.0)
        x = x + layer.moe(h, experts=8, top_k=2, d_ff=32, shared_experts=1, shared_d_ff=32,
                          shared_expert_gate=True)
    m.logits(m.rms_norm(x, name="norm", offset=1.0))
    return m.graph
