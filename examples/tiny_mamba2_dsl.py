"""The tiny Mamba-2 twin in the DSL; builds the same graph as examples/tiny-mamba2-2.7b.yaml."""
from frontends.dsl import Model


def build():
    m = Model("tiny-mamba2", vocab=256, d_model=64)
    x = m.embed(m.input_ids())
    for layer in m.layers(2):
        h = layer.rms_norm(x, name="ssm_norm", eps=1e-5)
        x = x + layer.mamba2(h, heads=8, head_dim=16, state_size=16, groups=1, conv_kernel=4, norm_eps=1e-5,
                             norm_group_size=128)
    m.logits(m.rms_norm(x, name="norm", eps=1e-5), tied=True)
    return m.graph
