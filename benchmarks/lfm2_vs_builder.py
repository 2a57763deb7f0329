"""irc against onnxruntime-genai's builder and mobius-onnx on a small LFM2 twin (random weights),
fp32 and int4 in one run. Prints one table; asserts nothing; not run by pytest.

The twin: transformers' ``Lfm2ForCausalLM`` from a small config (d 512, 8 layers, attention
at layers 2, 5 and 7 with 8 heads over 2 KV heads of 64, LFM2's short convolution of 3 taps
elsewhere, SwiGLU MLP of 1408, vocab 32000, tied head), its weights randomised as the tests
do, saved with ``save_pretrained`` beside a word-level ``tokenizer.json`` of the twin's
vocabulary (the builder needs one). The tools, the measurements and the table are
``benchmarks/builder_compare.py``'s: compile time and size on disk, last-position logits
against transformers (one unpadded 128-token prompt; a batch of two left-padded to 128),
genai's 16 greedy tokens, prefill of 128 / 1,024 tokens and decode tokens/s after 128 and
after 2,048 tokens in onnxruntime-genai, for irc fp32 / int4, the builder fp32 / int4 and
mobius-onnx fp32. ``--quick`` runs a d-64 twin once: a check that the script works.

    python benchmarks/lfm2_vs_builder.py [--rounds 5] [--compile-rounds 3] [--threads 2] [--workdir DIR] [--quick]
"""
from __future__ import annotations

from builder_compare import arguments, compare
from common import write_tokenizer

TWIN = dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
            intermediate_size=2112, block_multiple_of=128, conv_L_cache=3, max_position_embeddings=4096,
            layer_types=["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv",
                         "full_attention"], bos_token_id=1, eos_token_id=2, pad_token_id=0)
QUICK = dict(TWIN, vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
             intermediate_size=256, block_multiple_of=32, layer_types=["conv", "full_attention", "conv", "full_attention"])


def make_twin(folder: str, quick: bool = False):
    """The transformers twin (randomised as the tests do), saved with a tokenizer."""
    import torch  # noqa: F401
    import transformers

    from tests.frontends.test_hf_models import randomize

    shape = QUICK if quick else TWIN
    config = transformers.Lfm2Config(**shape)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=0, norm_centre=1.0)
    model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    write_tokenizer(folder, shape["vocab_size"])
    return model


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    shape = QUICK if args.quick else TWIN
    title = (f"LFM2 twin (d {shape['hidden_size']}, {shape['num_hidden_layers']} layers: "
             f"{shape['layer_types'].count('full_attention')} attention, {shape['layer_types'].count('conv')} short "
             f"conv; vocab {shape['vocab_size']})")
    compare(args, make_twin, title, "irc-lfm2-bench-")


if __name__ == "__main__":
    main()
