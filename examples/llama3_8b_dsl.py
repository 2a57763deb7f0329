"""Llama-3-8B in the DSL; builds the same graph as examples/llama3-8b.yaml.

    irc compile examples/llama3_8b_dsl.py ...
"""
from frontends.dsl import Model, Rope


def build():
    m = Model("llama3-8b", vocab=128256, d_model=4096, dtype="bf16")
    rope = Rope(base=500000, convention="half",
                scaling={"kind": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
                         "original_max_position": 8192})
    x = m.embed(m.input_ids())
    for layer in m.layers(32):
        h = layer.rms_norm(x, name="attn_norm", eps=1e-5)
        x = x + layer.attention(h, heads=32, kv_heads=8, head_dim=128, rope=rope)
        h = layer.rms_norm(x, name="mlp_norm", eps=1e-5)
        x = x + layer.swiglu(h, d_ff=14336)
    m.logits(m.rms_norm(x, name="norm", eps=1e-5))
    return m.graph
