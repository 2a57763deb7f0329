"""irc against onnxruntime-genai's builder and mobius-onnx on a small Qwen3.5 twin (gated DeltaNet;
random weights), fp32 and int4 in one run. Prints one table; asserts nothing; not run by pytest.

The twin: transformers' ``Qwen3_5ForConditionalGeneration`` (the only Qwen3.5 form the
builder takes; irc compiles it whole, a VLM, and runs text through its embedding model) from a
small config: text d 512, 8 layers (three gated-DeltaNet layers of 4 key / 8 value heads of
64, conv 4, to one gated attention layer of 8 heads over 2 KV heads of 64, RoPE on a quarter
of each head), SwiGLU MLP of 1408, vocab 32000 (its last four ids the image tokens); a
one-block vision tower. Weights randomised as tests/frontends/test_hf_delta.py does, saved with a word-level
``tokenizer.json``. The tools, the measurements and the table are
``benchmarks/builder_compare.py``'s (shared with ``lfm2_vs_builder.py``): compile time and
size on disk, last-position logits against transformers (one unpadded 128-token prompt; a
batch of two left-padded to 128), genai's 16 greedy tokens, prefill of 128 / 1,024 tokens and
decode tokens/s after 128 and after 2,048 tokens in onnxruntime-genai, for irc fp32 / int4,
the builder fp32 / int4 and mobius-onnx fp32. ``--quick`` runs a d-64 twin once.

    python benchmarks/delta_vs_builder.py [--rounds 5] [--compile-rounds 3] [--threads 2] [--workdir DIR] [--quick]
"""
from __future__ import annotations

import json
import os

from builder_compare import arguments, compare
from common import write_tokenizer

TEXT = dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
            head_dim=64, intermediate_size=1408, linear_num_key_heads=4, linear_num_value_heads=8,
            linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4, max_position_embeddings=4096,
            bos_token_id=1, eos_token_id=2, pad_token_id=0)
VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=512, patch_size=4,
              num_position_embeddings=16)
QUICK_TEXT = dict(TEXT, vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, head_dim=16,
                  intermediate_size=128, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                  linear_value_head_dim=16)
QUICK_VISION = dict(VISION, out_hidden_size=64)


def make_twin(folder: str, quick: bool = False):
    """The multimodal twin (its text model randomised as the tests do), saved with a tokenizer."""
    import torch
    import transformers

    from tests.frontends.test_hf_models import randomize

    text, vision = (QUICK_TEXT, QUICK_VISION) if quick else (TEXT, VISION)
    vocab = text["vocab_size"]  # the image tokens inside the twin's vocabulary, as irc requires of a VLM
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=vocab - 1,
                                        video_token_id=vocab - 2, vision_start_token_id=vocab - 3,
                                        vision_end_token_id=vocab - 4)
    model = transformers.Qwen3_5ForConditionalGeneration._from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=0, norm_centre=0.0)  # Qwen's norms are (1 + w)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith("linear_attn.norm.weight"):  # the gated norm is plain w
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=generator))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder)
    write_tokenizer(folder, text["vocab_size"])
    with open(os.path.join(folder, "preprocessor_config.json"), "w") as f:  # genai's image steps come from it
        json.dump({"image_processor_type": "Qwen2VLImageProcessor", "patch_size": vision["patch_size"],
                   "merge_size": 2, "temporal_patch_size": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}, f)
    return model


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    text = QUICK_TEXT if args.quick else TEXT
    kinds = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(text["num_hidden_layers"])]
    title = (f"Qwen3.5 twin (Qwen3_5ForConditionalGeneration; text d {text['hidden_size']}, "
             f"{text['num_hidden_layers']} layers: {kinds.count('linear_attention')} gated DeltaNet, "
             f"{kinds.count('full_attention')} gated attention; vocab {text['vocab_size']})")
    compare(args, make_twin, title, "irc-delta-bench-")


if __name__ == "__main__":
    main()
