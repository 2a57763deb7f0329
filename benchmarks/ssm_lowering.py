"""State-space layers on ONNX Runtime (CPU, onnx-ort): ``com.microsoft.LinearAttention`` against
the standard ``Scan`` lowering of the recurrence (``backends.onnx.ssm``), prefill and decode.

Models, random weights (``--weights seeded``), fp32, the onnx-ort default pipeline:

- Mamba-2 at Mamba2-130m's shape: d_model 768, 24 layers, 24 heads x 64, state 128, one
  group, conv 4, vocabulary 50,288, tied head. onnx-ort's default is LinearAttention
  (``lower_ssd_ort(linear_attention=True)``); the Scan is ``linear_attention=False``, the
  portable target's lowering.
- Mamba-1 at Mamba-130m's shape (d_model 768, d_inner 1,536, state 16, ``--mamba1-layers``
  of its 24 layers): the default is the Scan; LinearAttention (D heads of d_k = 16, d_v = 1,
  per-key-dim decay) is ``lower_selective_scan(linear_attention=True)``.

Each figure is one ``session.run`` of batch 1 with random states: a prefill of 128 and of
1,024 tokens, and one decode step (P = 128; a round's figure is the median of 8 steps), 2
intra-op threads. Rounds are interleaved phase by phase (A B, then B A in the next round), so
the ratio line is the median of paired ratios of runs seconds apart, with their range. The host
is shared and noisy: compare the ratios within one run. Not a test (nothing asserts on time).

    python benchmarks/ssm_lowering.py [--rounds 5] [--mamba1-layers 8] [--no-mamba1]
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from common import compile_graph, median_seconds, text_table

VOCAB = 50288
PHASES = {"prefill 128": (128, 0), "prefill 1024": (1024, 0), "decode": (1, 128)}  # (T, P)
DECODE_STEPS = 8  # a round's decode figure is the median of this many steps
THREADS = 2


def mamba2_graph(layers: int = 24):
    from frontends.dsl import Model

    m = Model("mamba2-130m-shaped", vocab=VOCAB, d_model=768)
    x = m.embed(m.input_ids())
    for layer in m.layers(layers):
        x = x + layer.mamba2(layer.rms_norm(x, "norm", eps=1e-5), heads=24, head_dim=64, state_size=128, groups=1)
    m.logits(m.rms_norm(x, "norm", eps=1e-5), tied=True)
    return m.graph


def mamba1_graph(layers: int):
    from frontends.dsl import Model

    m = Model("mamba-130m-shaped", vocab=VOCAB, d_model=768)
    x = m.embed(m.input_ids())
    for layer in m.layers(layers):
        x = x + layer.mamba(layer.rms_norm(x, "norm", eps=1e-5), d_inner=1536, state_size=16, conv_kernel=4)
    m.logits(m.rms_norm(x, "norm", eps=1e-5), tied=True)
    return m.graph


def variants() -> dict:
    """family -> {lowering name: the ``lowerings`` override (None: onnx-ort's default)}."""
    from backends.onnx import ssm

    return {
        "mamba2": {"LinearAttention": None,
                   "Scan": {"ssd": functools.partial(ssm.lower_ssd_ort, linear_attention=False)}},
        "mamba1": {"Scan": None,
                   "LinearAttention": {"selective_scan": functools.partial(ssm.lower_selective_scan,
                                                                           linear_attention=True)}},
    }


def build(graph, lowerings, path: str) -> None:
    from backends.onnx.targets import whole_pipeline

    compile_graph(graph, path, whole_pipeline("onnx-ort", {}), target="onnx-ort", weights="seeded", genai=False,
                  lowerings=lowerings)


def feeds(graph, tokens: int, past: int, rng) -> dict:
    from irc import dims
    from irc.analysis import past_inputs

    out = {"input_ids": rng.integers(0, VOCAB, (1, tokens)), "attention_mask": np.ones((1, past + tokens), np.int64)}
    for state in past_inputs(graph):
        shape = dims.evaluate_shape(state.shape, {"B": 1, "P": past})
        out[state.name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
    return out


def measure(family: str, make_graph, rounds: int, directory: str) -> dict:
    """lowering -> phase -> seconds per round."""
    from backends.onnx.runtime import ort_session

    rng = np.random.default_rng(0)
    inputs = {phase: feeds(make_graph(), t, p, rng) for phase, (t, p) in PHASES.items()}
    sessions = {}
    for name, lowerings in variants()[family].items():
        start = time.perf_counter()
        path = os.path.join(directory, f"{family}-{name}.onnx")
        build(make_graph(), lowerings, path)
        sessions[name] = ort_session(path, THREADS)
        for phase in PHASES:
            sessions[name].run(None, inputs[phase])  # warm-up
        print(f"built and loaded {family} {name} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    samples = {name: {phase: [] for phase in PHASES} for name in sessions}
    for round_ in range(rounds):
        for phase, (tokens, _) in PHASES.items():
            order = list(sessions) if round_ % 2 == 0 else list(reversed(sessions))
            for name in order:
                run = functools.partial(sessions[name].run, None, inputs[phase])
                samples[name][phase].append(median_seconds(run, DECODE_STEPS if tokens == 1 else 1, warmup=0))
    return samples


def table(title: str, samples: dict) -> None:
    """Medians per lowering and phase, and the second lowering's time over the first's: the
    median of the rounds' paired ratios (the two ran seconds apart) and their range."""
    first, second = list(samples)
    header = ("lowering", *(f"{phase} ms" for phase in PHASES))
    rows = [(name, *(f"{statistics.median(samples[name][phase]) * 1e3:.1f}" for phase in PHASES))
            for name in samples]
    ratios = {p: [b / a for a, b in zip(samples[first][p], samples[second][p])] for p in PHASES}
    rows.append((f"{second} / {first}", *(f"{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})"
                                          for r in ratios.values())))
    print(title)
    text_table(header, rows)
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mamba1-layers", type=int, default=8)
    parser.add_argument("--no-mamba1", action="store_true")
    args = parser.parse_args()
    families = [("mamba2", mamba2_graph, "Mamba-2, Mamba2-130m's shape (d_model 768, 24 layers, 24 heads x 64, "
                                          "state 128, 1 group)")]
    if not args.no_mamba1:
        families.append(("mamba1", functools.partial(mamba1_graph, args.mamba1_layers),
                         f"Mamba-1, Mamba-130m's width ({args.mamba1_layers} of 24 layers, d_inner 1536, state 16)"))
    for family, make_graph, title in families:
        params = sum(p.numel for p in make_graph().params.values())
        with tempfile.TemporaryDirectory() as directory:
            samples = measure(family, make_graph, args.rounds, directory)
        table(f"{title}, {params / 1e6:.1f}M params, fp32, onnx-ort on ORT's CPU provider, batch 1, "
              f"{THREADS} threads; medians of {args.rounds} interleaved rounds", samples)


if __name__ == "__main__":
    main()
