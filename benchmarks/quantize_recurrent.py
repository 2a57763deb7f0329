"""Quantizing recurrent models: logits error and top-1 agreement against the float model by
position (buckets ending at 128, 1,024 and 4,096), for the Mamba-2 and Granite-4.0-H twins.

The models are random: each spec's seeded weights (``irc.weights.seed_absent``), at the
tiny twins' width (d_model 64) and a small one (d_model 256, same layer pattern); no
trained Mamba or hybrid checkpoint is at hand (FACTS.md). Their logits are nearly
structureless, so absolute errors are large; what the table shows is how each scheme's
error moves along the sequence and how the schemes rank.

Schemes (``quantize{bits=4}``, group 32, mse):
- ``int4 float-policy``: the default; Δ path (Mamba-2's dt rows of in_proj) and the
  recurrence's own parameters float;
- ``int4 everything``: ``recurrent=true``, the dt rows quantized with the rest of in_proj;
- ``int4 + int8 state``: the default weights, and each layer's recurrent state
  quantize-dequantized per (batch, head) to int8 (symmetric max-abs) between every decode
  step: a simulated int8 state (the pass refuses a real one: ``quantize{recurrent_state}``);
- ``float + int8 state``: float weights, the simulated int8 state alone.

Weight-only schemes run in chunks of 256 tokens through the states (the same numbers as one
token at a time); the state schemes run one token at a time, so the state is rounded after
every step. Reference: the float model, same tokens (seeded ids).

    python benchmarks/quantize_recurrent.py [--positions 4096] [--quick]
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from common import ROOT

from frontends import load_spec  # noqa: E402
from frontends.yaml_spec import loads  # noqa: E402
from irc.quant_report import chunk_logits, default_prompts, error_by_position, position_marks  # noqa: E402
from irc.weights import seed_absent  # noqa: E402
from passes.quantize import Quantize  # noqa: E402

SPECS = {"mamba2": "examples/tiny-mamba2-2.7b.yaml", "granite-4.0-h": "examples/tiny-granite-4.0-h-small.yaml"}
CHUNK = 256


def model(name: str, width: int):
    """The twin at ``width``: the tiny spec, d_model (and the Mamba-2 heads, MoE d_ff) scaled."""
    path = os.path.join(ROOT, SPECS[name])
    if width == 64:
        graph = load_spec(path)
    else:
        factor = width // 64
        text = open(path).read().replace("d_model: 64", f"d_model: {width}")
        text = text.replace("n_heads: 8\n    head_dim: 16", f"n_heads: {8 * factor}\n    head_dim: 16")
        text = text.replace("d_ff: 32", f"d_ff: {32 * factor}").replace("shared_d_ff: 64", f"shared_d_ff: {64 * factor}")
        graph = loads(text)
    seed_absent(graph)
    return graph


def int8_state(states: dict) -> dict:
    """Each ``.recurrent_state`` [B, H, ...] rounded to int8 per (batch, head), max-abs scale."""
    out = dict(states)
    for name, state in states.items():
        if name.endswith(".recurrent_state"):
            axes = tuple(range(2, state.ndim))
            scale = np.abs(state).max(axis=axes, keepdims=True) / 127.0
            safe = np.where(scale > 0, scale, 1.0)
            out[name] = (np.clip(np.rint(state / safe), -127, 127) * safe).astype(state.dtype)
    return out


def quantized(graph, **options):
    q = graph.clone()
    Quantize(bits=4, positions=0, **options).run(q)
    return q


def schemes(graph) -> list:
    """(label, graph, state hook, chunk)."""
    policy = quantized(graph)
    return [("int4 float-policy", policy, None, CHUNK),
            ("int4 everything", quantized(graph, recurrent=True), None, CHUNK),
            ("int4 + int8 state", policy, int8_state, 1),
            ("float + int8 state", graph, int8_state, 1)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=4096)
    parser.add_argument("--widths", default="64,256")
    parser.add_argument("--quick", action="store_true", help="256 positions, the tiny width only")
    args = parser.parse_args(argv)
    positions, widths = (256, [64]) if args.quick else (args.positions, [int(w) for w in args.widths.split(",")])
    marks = position_marks(positions)
    header = " | ".join(f"{'rms err':>8} {'top-1':>6}" for _ in marks)
    spans = " | ".join(f"{f'[{a}, {b})':>15}" for a, b in zip([0] + marks[:-1], marks))
    print(f"random seeded weights; {positions} seeded token ids; logits vs the float model per position bucket")
    print(f"{'model':<22} {'scheme':<20} {spans}   seconds")
    print(f"{'':<22} {'':<20} {header}")
    for name in SPECS:
        for width in widths:
            graph = model(name, width)
            ids = default_prompts(int(graph.meta["vocab_size"]), 1, positions)[0]
            reference = list(chunk_logits(graph, ids, CHUNK))
            for label, candidate, hook, chunk in schemes(graph):
                start = time.time()
                rows = error_by_position(iter(regroup(reference, chunk)), chunk_logits(candidate, ids, chunk, hook),
                                         marks)
                cells = " | ".join(f"{r['rms_relative_error']:>8.4f} {r['top1_agreement']:>6.1%}" for r in rows)
                print(f"{f'{name} d={width}':<22} {label:<20} {cells}   {time.time() - start:7.1f}", flush=True)


def regroup(chunks: list, size: int):
    """The reference's logits in chunks of ``size`` rows (to pair with a candidate's)."""
    logits = np.concatenate(chunks)
    for start in range(0, logits.shape[0], size):
        yield logits[start:start + size]


if __name__ == "__main__":
    main()
