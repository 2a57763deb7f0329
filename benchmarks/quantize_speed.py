"""How fast each quantizer turns weights into int4 codes: ``ort`` (the compiled kernel,
``passes._quantize_kernel``, numba), ``ort-mlas`` (the same scheme by onnxruntime's own
kernel, ``quantize_matmul_4bits``), ``rtn`` and ``mse`` (irc's NumPy ones,
``irc.ops.quant.quantize_blocks`` and ``passes.quantize_search.search_blocks``), on
Llama-3-8B's 4096 x 4096 and 14336 x 4096 weights (N(0, 0.02), group 32, symmetric), in
float32 and in bfloat16 (what an 8B checkpoint holds).

Prints a table of medians (MB of float32-equivalent weight per second, wall and CPU seconds
per call), then for the compiled quantizers: whether they release the GIL (how far a Python
counting loop in another thread gets while one runs, against the same loop alone) and the
wall time of two weights quantized by two threads at once against one after the other (what
the weight writer's two workers get). Never asserts on time.

    python benchmarks/quantize_speed.py [--repeat 3] [--methods ort,ort-mlas,rtn,mse] [--bits 4]
"""
from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np

import common  # noqa: E402,F401  (puts the repository on sys.path)

from irc.ops.quant import quantize_blocks  # noqa: E402
from passes.quantize_search import search_blocks  # noqa: E402
from passes.quantize_ort import ort_blocks, ort_blocks_mlas  # noqa: E402

SHAPES = ((4096, 4096), (14336, 4096))
GROUP = 32


def quantizer(method: str, bits: int):
    if method == "ort":
        return lambda w: ort_blocks(w, bits=bits, block_size=GROUP, symmetric=True)
    if method == "ort-mlas":
        return lambda w: ort_blocks_mlas(w, bits=bits, block_size=GROUP, symmetric=True)
    if method == "rtn":
        return lambda w: quantize_blocks(w, bits=bits, block_size=GROUP, symmetric=True)
    return lambda w: search_blocks(w, bits=bits, block_size=GROUP, symmetric=True)


def timed(function, weight, repeat: int) -> tuple:
    """(median wall s, median CPU s of this process) over ``repeat`` calls."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        function(weight)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return float(np.median(walls)), float(np.median(cpus))


def counting(seconds: float) -> int:
    """Iterations of a pure-Python loop in ``seconds`` (it needs the GIL throughout)."""
    count, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        count += 1
    return count


def gil_share(function, weight) -> tuple:
    """(loop iterations per second while ``function`` runs in another thread, alone)."""
    alone = counting(0.5) / 0.5
    done = threading.Event()
    counts = []

    def count():
        start, n = time.perf_counter(), 0
        while not done.is_set():
            n += 1
        counts.append(n / (time.perf_counter() - start))

    thread = threading.Thread(target=count)
    thread.start()
    function(weight)
    done.set()
    thread.join()
    return counts[0], alone


def two_threads(function, weight) -> tuple:
    """(wall s of two calls in two threads at once, wall s of the two one after the other)."""
    start = time.perf_counter()
    function(weight)
    function(weight)
    serial = time.perf_counter() - start
    threads = [threading.Thread(target=function, args=(weight,)) for _ in range(2)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start, serial


def main() -> None:
    import ml_dtypes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--methods", default="ort,ort-mlas,rtn,mse")
    parser.add_argument("--bits", type=int, default=4)
    args = parser.parse_args()
    methods = args.methods.split(",")
    rng = np.random.default_rng(0)
    if "ort" in methods:
        ort_blocks(np.zeros((2, 64), np.float32), bits=args.bits, block_size=GROUP, symmetric=True)  # JIT (cached)
    print(f"int{args.bits}, group {GROUP}, symmetric; medians of {args.repeat}; {os.cpu_count()} CPUs")
    print(f"{'method':<9} {'dtype':>8} {'shape':>12} {'MB f32':>8} {'wall s':>8} {'CPU s':>8} {'MB/s':>8}")
    for n, k in SHAPES:
        weight = (rng.standard_normal((n, k), np.float32) * np.float32(0.02))
        megabytes = weight.nbytes / 1e6
        for dtype in ("float32", "bfloat16"):
            data = weight if dtype == "float32" else weight.astype(ml_dtypes.bfloat16)
            for method in methods:
                wall, cpu = timed(quantizer(method, args.bits), data, args.repeat)
                print(f"{method:<9} {dtype:>8} {f'{n}x{k}':>12} {megabytes:8.1f} {wall:8.3f} {cpu:8.3f} "
                      f"{megabytes / wall:8.0f}")
    n, k = SHAPES[1]
    data = (rng.standard_normal((n, k), np.float32) * np.float32(0.02)).astype(ml_dtypes.bfloat16)
    for method in [m for m in methods if m.startswith("ort")]:
        function = quantizer(method, args.bits)
        during, alone = gil_share(function, data)
        together, serial = two_threads(function, data)
        print(f"\n{method} on {n}x{k} bfloat16: a Python loop in another thread ran {during:,.0f} iterations/s "
              f"meanwhile, {alone:,.0f}/s alone ({during / alone:.0%}); two weights in two threads "
              f"{together:.2f} s, one after the other {serial:.2f} s ({serial / together:.2f}x)")


if __name__ == "__main__":
    main()
