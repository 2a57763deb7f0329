"""``scan-chunk`` (the state-space duality as a pass): prefill time of a recurrent layer stack
in its sequential form and in chunks, on the reference interpreter and on both ONNX targets.

Two stacks, random weights (seeded), fp32, small widths so a run takes minutes:

- Mamba-2: d_model 256, 4 layers of 8 heads x 32, state 64, one group, conv 4;
- gated DeltaNet (Qwen3-Next's mixer): d_model 256, 4 layers of 2 key / 4 value heads of
  64 x 64, conv 4.

Variants: ``sequential`` (pipeline ``dce,cse``: the interpreter runs the recurrence, the
portable target a token Scan, onnx-ort ``LinearAttention`` without ``chunk_size``) and
``chunk N`` (``dce,cse,scan-chunk{size=N}``: the interpreter's chunked references, the
portable target's chunked lowerings behind an ``If`` on T, onnx-ort's ``LinearAttention``
with ``chunk_size = N``). ``--sizes 16,64,256`` measures whether the chunk size matters.

Each figure is one run of batch 1 from random states (a prefill of T tokens; ``decode`` is
one token, the median of 8 steps, where the portable target's ``If`` takes the token Scan),
ORT with 2 intra-op threads; rounds are interleaved variant by variant and the table gives
medians. Not a test (nothing asserts on time); the host is shared and noisy.

    python benchmarks/scan_chunk.py [--rounds 3] [--sizes 64] [--tokens 1024,4096]
    python benchmarks/scan_chunk.py --quick      # tiny widths, 64 and 130 tokens, one round
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from common import markdown_table, median_seconds

THREADS = 2
DECODE_STEPS = 8
ENGINES = ("interpreter", "onnx", "onnx-ort")
FULL = {"d_model": 256, "layers": 4, "vocab": 256, "heads": 8, "head_dim": 32, "state": 64, "key_heads": 2,
        "value_heads": 4, "key_dim": 64, "value_dim": 64}
QUICK = {"d_model": 32, "layers": 2, "vocab": 64, "heads": 4, "head_dim": 8, "state": 8, "key_heads": 1,
         "value_heads": 2, "key_dim": 8, "value_dim": 8}


def mamba2_stack(w: dict):
    from frontends.dsl import Model

    m = Model("mamba2-stack", vocab=w["vocab"], d_model=w["d_model"])
    x = m.embed(m.input_ids())
    for layer in m.layers(w["layers"]):
        x = x + layer.mamba2(layer.rms_norm(x, "norm"), heads=w["heads"], head_dim=w["head_dim"],
                             state_size=w["state"], groups=1)
    m.logits(m.rms_norm(x, "norm"))
    return m.graph


def delta_stack(w: dict):
    from frontends.dsl import Model

    m = Model("gated-deltanet-stack", vocab=w["vocab"], d_model=w["d_model"])
    x = m.embed(m.input_ids())
    for layer in m.layers(w["layers"]):
        x = x + layer.gated_delta(layer.rms_norm(x, "norm"), key_heads=w["key_heads"], value_heads=w["value_heads"],
                                  key_dim=w["key_dim"], value_dim=w["value_dim"])
    m.logits(m.rms_norm(x, "norm"))
    return m.graph


def variants(sizes: list) -> dict:
    return {"sequential": "dce,cse", **{f"chunk {n}": f"dce,cse,scan-chunk{{size={n}}}" for n in sizes}}


def engines(make_graph, pipeline: str, directory: str, tag: str) -> dict:
    """engine name -> run(feeds), for the graph after ``pipeline``."""
    import passes  # noqa: F401  (registers the passes)
    from backends.onnx.emit import emit_model
    from backends.onnx.runtime import interpreter_engine, ort_session
    from irc.passmanager import PassManager, parse_pipeline

    graph = make_graph()
    PassManager(parse_pipeline(pipeline)).run(graph)
    out = {"interpreter": interpreter_engine(graph)}
    for target in ENGINES[1:]:
        path = os.path.join(directory, f"{tag}.{target}.onnx")
        emit_model(graph, path, target=target, genai=False, context=8192)
        session = ort_session(path, THREADS)
        out[target] = lambda feeds, session=session: session.run(None, feeds)
    return out


def feeds(graph, tokens: int, seed: int) -> dict:
    from irc.interpreter import random_feeds

    out = random_feeds(graph, batch=1, tokens=tokens, past=0, seed=seed)
    for name, value in out.items():
        if name.startswith("past_key_values."):
            out[name] = (0.1 * value).astype(np.float32)
    return out


def timed(run, inputs: dict, steps: int) -> float:
    """Median seconds of ``steps`` calls (no warm-up: ``measure`` warmed every engine)."""
    return median_seconds(lambda: run(inputs), steps, warmup=0)


def measure(make_graph, tokens: list, sizes: list, rounds: int, directory: str, tag: str) -> dict:
    """(engine, variant) -> phase -> seconds per round; phases are the prefill lengths and decode."""
    graph = make_graph()
    inputs = {**{f"prefill {t}": feeds(graph, t, t) for t in tokens}, "decode": feeds(graph, 1, 1)}
    built = {}
    for variant, pipeline in variants(sizes).items():
        start = time.perf_counter()
        built[variant] = engines(make_graph, pipeline, directory, f"{tag}-{variant.replace(' ', '')}")
        for run in built[variant].values():
            run(inputs["decode"])  # warm-up
        print(f"built {tag} {variant} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    samples = {(engine, variant): {phase: [] for phase in inputs} for variant in built for engine in ENGINES}
    for round_ in range(rounds):
        order = list(built) if round_ % 2 == 0 else list(reversed(built))
        for phase, phase_inputs in inputs.items():
            for engine in ENGINES:
                for variant in order:
                    steps = DECODE_STEPS if phase == "decode" else 1
                    samples[(engine, variant)][phase].append(timed(built[variant][engine], phase_inputs, steps))
        print(f"  {tag}: round {round_ + 1}/{rounds} done", file=sys.stderr)
    return samples


def table(title: str, samples: dict) -> None:
    """Medians in ms per (engine, variant) and phase, and each prefill's speed-up over the
    engine's sequential form."""
    phases = list(next(iter(samples.values())))
    header = ("engine", "variant", *(f"{p} ms" for p in phases), *(f"x {p}" for p in phases if p != "decode"))
    rows = []
    for (engine, variant), by_phase in samples.items():
        base = samples[(engine, "sequential")]
        cells = [f"{statistics.median(by_phase[p]) * 1e3:.2f}" for p in phases]
        cells += [f"{statistics.median(base[p]) / statistics.median(by_phase[p]):.2f}" for p in phases
                  if p != "decode"]
        rows.append((engine, variant, *cells))
    print(title)
    markdown_table(header, rows, left=2)
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="64", help="chunk sizes, comma-separated (powers of two)")
    parser.add_argument("--tokens", default="1024,4096", help="prefill lengths, comma-separated")
    parser.add_argument("--quick", action="store_true", help="tiny widths, prefill 64 and 130, one round")
    args = parser.parse_args()
    widths = QUICK if args.quick else FULL
    tokens = [64, 130] if args.quick else [int(t) for t in args.tokens.split(",")]
    rounds = 1 if args.quick else args.rounds
    sizes = [int(n) for n in args.sizes.split(",")]
    stacks = {"mamba2": (mamba2_stack, f"Mamba-2 stack ({widths['layers']} layers, d_model {widths['d_model']}, "
                                       f"{widths['heads']} heads x {widths['head_dim']}, state {widths['state']})"),
              "deltanet": (delta_stack, f"gated-DeltaNet stack ({widths['layers']} layers, d_model "
                                        f"{widths['d_model']}, {widths['key_heads']} key / {widths['value_heads']} "
                                        f"value heads of {widths['key_dim']} x {widths['value_dim']})")}
    for tag, (make, title) in stacks.items():
        with tempfile.TemporaryDirectory() as directory:
            samples = measure(lambda make=make: make(widths), tokens, sizes, rounds, directory, tag)
        table(f"{title}; fp32, batch 1, ORT CPU with {THREADS} threads; medians of {rounds} interleaved "
              f"round(s)", samples)


if __name__ == "__main__":
    main()
