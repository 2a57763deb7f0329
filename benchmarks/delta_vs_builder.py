"""irc's ``onnx-ort`` folder against onnxruntime-genai's builder on a small Qwen3.5 twin (gated
DeltaNet; fp32, random weights). Prints one table; asserts nothing; not run by pytest.

The twin: transformers' ``Qwen3_5ForConditionalGeneration`` (the only Qwen3.5 form the
builder takes; irc reads the text model inside it, under ``model.language_model.``) from a
small config: text d 512, 8 layers (three gated-DeltaNet layers of 4 key / 8 value heads of
64, conv 4, to one gated attention layer of 8 heads over 2 KV heads of 64, RoPE on a quarter
of each head), SwiGLU MLP of 1408, vocab 32000; a one-block vision tower that neither tool
runs. Weights randomised as tests/frontends/test_hf_delta.py does, saved with a word-level
``tokenizer.json``. The measurements are those of ``benchmarks/lfm2_vs_builder.py``, whose
helpers this reuses: compile time and size on disk, last-position logits against
transformers (one unpadded 128-token prompt; a batch of two left-padded to 128), genai's 16
greedy tokens, and prefill of 128 / 1,024 tokens and decode tokens/s in onnxruntime-genai.

    python benchmarks/delta_vs_builder.py [--rounds 5] [--compile-rounds 3] [--threads 2] [--workdir DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from big_checkpoint import write_tokenizer  # noqa: E402
from cpu_speed import generate  # noqa: E402
from int4_real import set_threads  # noqa: E402
from lfm2_vs_builder import (GREEDY, PROMPT, SHORT, TOOLS, compile_all, greedy_matches, logits_errors,  # noqa: E402
                             speeds)
from quantize_onnx import disk_bytes  # noqa: E402

TEXT = dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
            head_dim=64, intermediate_size=1408, linear_num_key_heads=4, linear_num_value_heads=8,
            linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4, max_position_embeddings=4096,
            bos_token_id=1, eos_token_id=2, pad_token_id=0)
VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=512, patch_size=4,
              num_position_embeddings=16)
COLUMNS = ["compile", "size", "logits, 1 row", "logits, left-padded 2", f"genai greedy {GREEDY}", "prefill 128",
           "prefill 1,024", "decode"]


def make_twin(folder: str):
    """The multimodal twin (its text model randomised as the tests do), saved with a tokenizer."""
    import torch
    import transformers

    from tests.frontends.test_hf_models import randomize

    config = transformers.Qwen3_5Config(text_config=TEXT, vision_config=VISION)
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
    write_tokenizer(folder, TEXT["vocab_size"])
    return model


def genai_failure(folder: str, prompt: np.ndarray) -> str:
    """"" when onnxruntime-genai generates two tokens from ``folder``, else the error's first line."""
    import onnxruntime_genai as og

    try:
        generate(og.Model(folder), prompt, 2)
        return ""
    except Exception as err:  # noqa: BLE001 - a tool's failure is a table cell
        return "genai failed: " + str(err).splitlines()[0].split("Status Message: ")[-1][:70]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved speed rounds")
    parser.add_argument("--compile-rounds", type=int, default=3, help="interleaved compile rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="irc-delta-bench-")
    hf = os.path.join(work, "hf")
    model = make_twin(hf)
    compile_s, compile_errors = compile_all(hf, work, args.compile_rounds)
    folders = {"irc onnx-ort": os.path.join(work, "irc"), "builder fp32": os.path.join(work, "builder")}
    rng = np.random.default_rng(0)
    rows = [rng.integers(3, TEXT["vocab_size"], PROMPT).tolist(), rng.integers(3, TEXT["vocab_size"], SHORT).tolist()]
    prompts = {n: rng.integers(3, TEXT["vocab_size"], (1, n)).astype(np.int32) for n in (128, 1024)}
    table, built = {}, {}
    for tool, folder in folders.items():
        if compile_errors[tool]:
            table[tool] = {"compile": f"failed: {compile_errors[tool]}"}
            continue
        set_threads(folder, args.threads)
        built[tool] = folder
        unpadded, padded = logits_errors(folder, model, rows, args.threads)
        try:
            greedy = greedy_matches(folder, model, rows[0])
        except Exception as err:  # noqa: BLE001 - a tool's failure is a table cell
            greedy = f"failed: {str(err).splitlines()[0][:40]}"
        table[tool] = {"compile": f"{compile_s[tool]:.1f} s", "size": f"{disk_bytes(folder) / 2 ** 20:.1f} MiB",
                       "logits, 1 row": unpadded, "logits, left-padded 2": padded, f"genai greedy {GREEDY}": greedy}
    failures = {tool: genai_failure(folder, prompts[128][:, :16]) for tool, folder in built.items()}
    for tool, failure in failures.items():
        if failure:
            table[tool].update({"prefill 128": failure, "prefill 1,024": "-", "decode": "-"})
    for tool, speed in speeds({t: f for t, f in built.items() if not failures[t]}, prompts, args.rounds).items():
        table[tool].update({"prefill 128": f"{speed['prefill 128'] * 1e3:.1f} ms",
                            "prefill 1,024": f"{speed['prefill 1024'] * 1e3:.1f} ms",
                            "decode": f"{speed['decode']:.0f} tok/s"})
    kinds = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(TEXT["num_hidden_layers"])]
    print(f"\nQwen3.5 twin (Qwen3_5ForConditionalGeneration; text d {TEXT['hidden_size']}, "
          f"{TEXT['num_hidden_layers']} layers: {kinds.count('linear_attention')} gated DeltaNet, "
          f"{kinds.count('full_attention')} gated attention; vocab {TEXT['vocab_size']}), fp32, "
          f"{args.threads} threads; medians of {args.rounds} interleaved rounds ({args.compile_rounds} for compile); "
          f"logits: max |Δ| / max |ref| of the last position vs transformers")
    print("| metric | " + " | ".join(TOOLS) + " |")
    print("|---|" + "---|" * len(TOOLS))
    for column in COLUMNS:
        print(f"| {column} | " + " | ".join(table.get(tool, {}).get(column, "-") for tool in TOOLS) + " |")
    if len(built) == 2 and not any(failures.values()):
        parts = []
        for phase in ("prefill 128", "prefill 1,024", "decode"):
            ours, theirs = (float(table[t][phase].split()[0]) for t in TOOLS)
            parts.append(f"{phase} {ours / theirs:.2f}x the builder's {'speed' if phase == 'decode' else 'time'}")
        print("irc: " + "; ".join(parts))
    print(f"(work folder: {work})")


if __name__ == "__main__":
    main()
