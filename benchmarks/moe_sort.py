"""The reference's dense MoE against the sorted form ``moe-sort`` lowers to.

Dense (``irc.ops.moe.moe_dense``): every expert over every token, masked by the gating
weights: E * N rows of expert MLP. Sorted (``irc.ops.moe_sorted.moe_sorted``, the new ops'
references chained): route, stable sort of the N * k token slots by expert, gather,
grouped GEMMs over contiguous segments, weighted scatter-add: N * k rows. Both route and
add the (absent here) shared expert the same way.

Sizes: d_model 64, d_ff 32 (per expert), float32, softmax top-k routing with random
weights; experts 8 / 64 / 256, top-2 and top-8, tokens 1 / 16 / 256 / 4096. Each cell
times dense and sorted alternately (one warm-up each, then ``--repeat`` interleaved pairs:
three times as many when a dense call takes under 10 ms, half when it takes over a second) and prints medians, dense / sorted, the
max relative difference, the load imbalance (max / mean tokens per expert) and the rows a
16-row GEMM tile would pad. Prints a table; never asserts on time.

    python benchmarks/moe_sort.py [--repeat 5] [--d-model 64] [--d-ff 32]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from common import interleaved
from irc.ops.moe import moe_dense, route  # noqa: E402
from irc.ops.moe_sorted import dispatch, moe_sorted, tile_padding  # noqa: E402

EXPERTS = (8, 64, 256)
TOP_K = (2, 8)
TOKENS = (1, 16, 256, 4096)
TILE = 16


def weights(experts: int, d: int, f: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
            for shape in ((experts, d), (experts, f, d), (experts, f, d), (experts, d, f))]


def timed(fn, *args, **kwargs) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - start, out


def cell(experts: int, top_k: int, tokens: int, d: int, f: int, repeat: int) -> dict:
    rng = np.random.default_rng(tokens)
    x = rng.standard_normal((1, tokens, d)).astype(np.float32)
    router, w_gate, w_up, w_down = weights(experts, d, f, experts)
    routing = {"top_k": top_k}
    first_dense, dense = timed(moe_dense, x, router, w_gate, w_up, w_down, **routing)
    _, ours = timed(moe_sorted, x, router, w_gate, w_up, w_down, **routing)
    pairs = repeat * 3 if first_dense < 0.01 else repeat if first_dense < 1.0 else max(2, repeat // 2)
    forms = {"dense": moe_dense, "sorted": moe_sorted}
    times = interleaved({name: lambda fn=fn: timed(fn, x, router, w_gate, w_up, w_down, **routing)[0]
                         for name, fn in forms.items()}, pairs)  # interleaved, so drift hits both alike
    expert_ids, _ = route(x, router, **routing)
    counts = np.bincount(expert_ids.reshape(-1), minlength=experts)
    indptr = dispatch(expert_ids, experts)[2]
    scale = float(np.abs(dense).max()) or 1.0
    return {"dense": statistics.median(times["dense"]), "sorted": statistics.median(times["sorted"]),
            "error": float(np.abs(ours - dense).max()) / scale, "imbalance": counts.max() / counts.mean(),
            "padding": tile_padding(np.diff(indptr), TILE), "pairs": tokens * top_k}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--d-ff", type=int, default=32)
    args = parser.parse_args()
    print(f"dense moe (irc.ops.moe.moe_dense) vs sorted (moe_route -> moe_dispatch -> grouped_gemm -> "
          f"scatter_add), d_model {args.d_model}, d_ff {args.d_ff}, f32, medians of interleaved repeats")
    header = (f"{'experts':>7} {'top_k':>5} {'tokens':>6} {'dense ms':>10} {'sorted ms':>10} {'dense/sorted':>12} "
              f"{'max rel diff':>12} {'imbalance':>9} {f'pad@{TILE}':>7}")
    print(header)
    print("-" * len(header))
    start = time.perf_counter()
    for experts in EXPERTS:
        for top_k in TOP_K:
            for tokens in TOKENS:
                r = cell(experts, top_k, tokens, args.d_model, args.d_ff, args.repeat)
                print(f"{experts:>7} {top_k:>5} {tokens:>6} {r['dense'] * 1e3:>10.3f} {r['sorted'] * 1e3:>10.3f} "
                      f"{r['dense'] / r['sorted']:>12.1f} {r['error']:>12.1e} {r['imbalance']:>9.2f} "
                      f"{r['padding']:>7}", flush=True)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
