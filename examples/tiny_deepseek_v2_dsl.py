"""The tiny DeepSeek-V2 twin in the DSL; builds the same graph as
examples/tiny-deepseek-v2.yaml."""
from frontends.dsl import Model, Rope

DENSE_LAYERS = (0,)


def build():
    m = Model("tiny-deepseek-v2", vocab=256, d_model=64)
    rope = Rope(base=10000, convention="interleaved",
                scaling={"kind": "yarn", "factor": 40, "original_max_position": 32, "beta_fast": 32,
                         "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707})
    x = m.embed(m.input_ids())
    for layer in m.layers(2):
        h = layer.rms_norm(x, name="attn_norm", eps=1e-6)
        x = x + layer.mla_attention(h, heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
                                    qk_rope_head_dim=8, v_head_dim=16, rope=rope, eps=1e-6)
        h = layer.rms_norm(x, name="mlp_norm", eps=1e-6)
        if layer.index in DENSE_LAYERS:
            x = x + layer.swiglu(h, d_ff=128)
        else:
            x = x + layer.moe(h, experts=8, top_k=2, d_ff=16, shared_experts=2, norm_topk_prob=False,
                              routed_scale=16.0, groups=4, top_groups=2)
    m.logits(m.rms_norm(x, name="norm", eps=1e-6))
    return m.graph
