"""The tiny Jamba twin in the DSL; builds the same graph as examples/tiny-jamba-1.5-mini.yaml."""
from frontends.dsl import Model

ATTENTION_PERIOD, ATTENTION_OFFSET = 8, 4  # Jamba's attn_layer_period / attn_layer_offset
EXPERT_PERIOD, EXPERT_OFFSET = 2, 1        # expert_layer_period / expert_layer_offset


def build():
    m = Model("tiny-jamba", vocab=256, d_model=64)
    x = m.embed(m.input_ids())
    for layer in m.layers(8):
        if layer.index % ATTENTION_PERIOD == ATTENTION_OFFSET:
            h = layer.rms_norm(x, name="attn_norm", eps=1e-6)
            x = x + layer.attention(h, heads=4, kv_heads=2, head_dim=16)
        else:
            h = layer.rms_norm(x, name="ssm_norm", eps=1e-6)
            x = x + layer.mamba(h, d_inner=128, state_size=8, conv_kernel=4, dt_rank=4, bcdt_norm="weighted",
                                norm_eps=1e-6)
        h = layer.rms_norm(x, name="mlp_norm", eps=1e-6)
        if layer.index % EXPERT_PERIOD == EXPERT_OFFSET:
            x = x + layer.moe(h, experts=4, top_k=2, d_ff=128, norm_topk_prob=False)
        else:
            x = x + layer.swiglu(h, d_ff=128)
    m.logits(m.rms_norm(x, name="norm", eps=1e-6))
    return m.graph
