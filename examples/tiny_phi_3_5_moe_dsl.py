"""The tiny Phi-3.5-MoE twin in the DSL; builds the same graph as examples/tiny-phi-3.5-moe.yaml."""
from frontends.dsl import Model, Rope


def build():
    m = Model("tiny-phi-3.5-moe", vocab=256, d_model=64)
    rope = Rope(base=10000, convention="half")
    x = m.embed(m.input_ids())
    for layer in m.layers(2):
        h = layer.layer_norm(x, name="attn_norm", eps=1e-5)
        x = x + layer.attention(h, heads=4, kv_heads=2, head_dim=16, rope=rope, window=8, qkv_bias=True,
                                out_bias=True)
        h = layer.layer_norm(x, name="mlp_norm", eps=1e-5)
        x = x + layer.moe(h, experts=4, top_k=2, d_ff=32, scoring="sparsemixer", jitter_eps=0.01)
    m.logits(m.layer_norm(x, name="norm", eps=1e-5), bias=True)
    return m.graph
