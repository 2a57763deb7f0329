"""Quantization error per scheme: RTN on Gaussian weights, and end to end on the tiny models.

Prints two tables (no assertions):
1. Gaussian weights N(0, 1) [N, K]: storage bits per weight (codes, float32 scales, zero
   points), SQNR against the theory for symmetric max-abs RTN (``gaussian_rtn_sqnr_db``),
   the largest absolute error and the largest error in steps (RTN: at most 0.5);
2. the tiny models (seeded weights) quantized by ``quantize``: logits relative error (max
   and RMS) and top-1 agreement against the float model over seeded prompts
   (``irc.quant_report``), the mean per-tensor SQNR and the param bytes kept.

    python benchmarks/quantize_error.py [--rows 1024] [--cols 4096] [--prompts 8]
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from common import ROOT

from frontends import load_spec  # noqa: E402
from irc.ops.quant import quantize_blocks  # noqa: E402
from irc.quant_report import default_prompts, gaussian_rtn_sqnr_db, quantization_report, weight_error  # noqa: E402
from irc.testing import apply_pass  # noqa: E402
from irc.weights import seed_absent  # noqa: E402
from passes.quantize import Quantize  # noqa: E402

SCHEMES = [  # (label, pass options)
    ("int8 channel sym", {"bits": 8}),
    ("int8 channel asym", {"bits": 8, "symmetric": False}),
    ("int4 g32 sym", {"bits": 4, "group": 32}),
    ("int4 g32 asym", {"bits": 4, "group": 32, "symmetric": False}),
    ("int4 g64 sym", {"bits": 4, "group": 64}),
    ("int4 g64 asym", {"bits": 4, "group": 64, "symmetric": False}),
    ("int4 g128 sym", {"bits": 4, "group": 128}),
    ("int4 g128 asym", {"bits": 4, "group": 128, "symmetric": False}),
]
MODELS = ["tiny-llama3", "tiny-qwen2-7b", "tiny-mixtral-8x7b", "tiny-deepseek-v2"]


def gaussian_table(rows: int, cols: int) -> None:
    w = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    print(f"Gaussian weights N(0,1) [{rows}, {cols}], groups along the {cols} inputs")
    print(f"{'scheme':<18} {'bits/w':>7} {'SQNR dB':>8} {'theory':>7} {'max |err|':>10} {'steps':>6}")
    for label, options in SCHEMES:
        p = Quantize(**options)
        block = p.block_size(cols)
        parts = quantize_blocks(w, bits=p.config["bits"], block_size=block, symmetric=p.config["symmetric"])
        err = weight_error(w, *parts, bits=p.config["bits"], block_size=block)
        bits = 8 * sum(a.nbytes for a in parts if a is not None) / w.size
        theory = f"{gaussian_rtn_sqnr_db(p.config['bits'], block):>7.2f}" if p.config["symmetric"] else f"{'-':>7}"
        print(f"{label:<18} {bits:>7.3f} {err['sqnr_db']:>8.2f} {theory} {err['max_abs_error']:>10.4f} "
              f"{err['max_error_steps']:>6.3f}")


def model_table(prompt_count: int) -> None:
    print(f"\ntiny models, seeded weights; {prompt_count} seeded prompts of 12 tokens "
          "(prefill 6, then decode 1 at a time)")
    print(f"{'model':<18} {'scheme':<24} {'max rel':>8} {'rms rel':>8} {'top-1':>7} {'SQNR dB':>8} {'bytes':>6}")
    rows = SCHEMES + [("int4 g32 sym + kv8", {"bits": 4, "kv_cache": True}),
                      ("int4 g32 sym + emb", {"bits": 4, "embeddings": True})]
    for name in MODELS:
        graph = load_spec(os.path.join(ROOT, "examples", f"{name}.yaml"))
        seed_absent(graph)
        prompts = default_prompts(graph.meta["vocab_size"], count=prompt_count)
        for label, options in rows:
            quantized, _ = apply_pass(Quantize(**options), graph)
            report = quantization_report(graph, quantized, prompts)
            e2e = report["end_to_end"]
            print(f"{name:<18} {label:<24} {e2e['logits_max_relative_error']:>8.4f} "
                  f"{e2e['logits_rms_relative_error']:>8.4f} {e2e['top1_agreement']:>7.1%} "
                  f"{report['tensor_summary']['mean_sqnr_db']:>8.2f} {report['param_bytes']['ratio']:>6.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--prompts", type=int, default=8)
    args = parser.parse_args()
    gaussian_table(args.rows, args.cols)
    model_table(args.prompts)


if __name__ == "__main__":
    main()
