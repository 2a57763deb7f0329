"""LLaVA-1.5-7B in the DSL: CLIP ViT-L/14 at 336 pixels, its hidden state after 23 of 24
layers with the class token dropped, a two-layer GELU projector, and Vicuna-7B (Llama-2's
shapes) whose ``<image>`` tokens (id 32000) take the 576 image features. Builds the same
graphs as the Hugging Face folder examples/hf/llava-1.5-7b.

    irc show examples/llava_1_5_7b_dsl.py
    irc compile examples/llava_1_5_7b_dsl.py --target onnx -o out/llava/model.onnx --weights none
"""
from frontends.dsl import Model, Rope
from frontends.dsl_vision import VisionSpec, hidden_states

IMAGE_TOKEN = 32000


def vision():
    m = Model("llava-1.5-7b-vision", vocab=None, d_model=1024, dtype="f16", encoder=True)
    spec = VisionSpec(image_size=336, patch=14, layers=23, heads=16, d_ff=4096, eps=1e-5, activation="quick",
                      patch_bias=False, pre_norm=True)
    x = hidden_states(m, spec)[-1]                  # transformers' hidden_states[-2]
    m.image_features(m.mlp_projector(m.drop_tokens(x), 4096))
    return m


def build():
    m = Model("llava-1.5-7b", vocab=32064, d_model=4096, dtype="f16")
    x = m.merge_image_features(m.embed(m.input_ids()), IMAGE_TOKEN)
    for layer in m.layers(32):
        h = layer.rms_norm(x, name="attn_norm", eps=1e-5)
        x = x + layer.attention(h, heads=32, kv_heads=32, head_dim=128, rope=Rope(base=10000))
        h = layer.rms_norm(x, name="mlp_norm", eps=1e-5)
        x = x + layer.swiglu(h, d_ff=11008)
    m.logits(m.rms_norm(x, name="norm", eps=1e-5))
    m.vision_model(vision())
    return m.graph
