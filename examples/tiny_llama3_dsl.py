"""The tiny Llama-3 twin in the DSL; builds the same graph as examples/tiny-llama3.yaml."""
from frontends.dsl import Model, Rope


def build():
    m = Model("tiny-llama3", vocab=256, d_model=64)
    rope = Rope(base=500000, convention="half",
                scaling={"kind": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
                         "original_max_position": 32})
    x = m.embed(m.input_ids())
    for layer in m.layers(2):
        h = layer.rms_norm(x, name="attn_norm", eps=1e-5)
        x = x + layer.attention(h, heads=4, kv_heads=2, head_dim=16, rope=rope)
        h = layer.rms_norm(x, name="mlp_norm", eps=1e-5)
        x = x + layer.swiglu(h, d_ff=160)
    m.logits(m.rms_norm(x, name="norm", eps=1e-5))
    return m.graph
