"""DeepSeek-V2 in the DSL; builds the same graph as examples/deepseek-v2.yaml.

Multi-head latent attention in every layer; layer 0 has a dense SwiGLU, the others a
mixture of 160 experts (top-6, group-limited to 3 of 8 groups) plus 2 shared experts.
"""
from frontends.dsl import Model, Rope

DENSE_LAYERS = (0,)


def build():
    m = Model("deepseek-v2", vocab=102400, d_model=5120, dtype="bf16")
    rope = Rope(base=10000, convention="interleaved",
                scaling={"kind": "yarn", "factor": 40, "original_max_position": 4096, "beta_fast": 32,
                         "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707})
    x = m.embed(m.input_ids())
    for layer in m.layers(60):
        h = layer.rms_norm(x, name="attn_norm", eps=1e-6)
        x = x + layer.mla_attention(h, heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                                    qk_rope_head_dim=64, v_head_dim=128, rope=rope, eps=1e-6)
        h = layer.rms_norm(x, name="mlp_norm", eps=1e-6)
        if layer.index in DENSE_LAYERS:
            x = x + layer.swiglu(h, d_ff=12288)
        else:
            x = x + layer.moe(h, experts=160, top_k=6, d_ff=1536, shared_experts=2, norm_topk_prob=False,
                              routed_scale=16.0, groups=8, top_groups=3)
    m.logits(m.rms_norm(x, name="norm", eps=1e-6))
    return m.graph
