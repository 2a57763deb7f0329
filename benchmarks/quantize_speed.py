"""How fast each quantizer turns float32 weights into int4 codes: ``ort`` (onnxruntime's
compiled blockwise quantizer, ``passes.quantize_ort``), ``rtn`` and ``mse`` (irc's NumPy
ones, ``irc.ops.quant.quantize_blocks`` and ``passes.quantize_methods.search_blocks``), on
Llama-3-8B's 4096 x 4096 and 14336 x 4096 weights (N(0, 0.02), group 32, symmetric).

Prints a table of medians (MB of float32 weight per second, wall and CPU seconds per call)
and two properties of the compiled quantizer: how many cores it keeps busy (CPU time over
wall time) and whether it releases the GIL (how far a Python counting loop in another
thread gets while it runs, against the same loop alone). Never asserts on time.

    python benchmarks/quantize_speed.py [--repeat 3] [--methods ort,rtn,mse] [--bits 4]
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from irc.ops.quant import quantize_blocks  # noqa: E402
from passes.quantize_methods import search_blocks  # noqa: E402
from passes.quantize_ort import ort_blocks  # noqa: E402

SHAPES = ((4096, 4096), (14336, 4096))
GROUP = 32


def quantizer(method: str, bits: int):
    if method == "ort":
        return lambda w: ort_blocks(w, bits=bits, block_size=GROUP, symmetric=True)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--methods", default="ort,rtn,mse")
    parser.add_argument("--bits", type=int, default=4)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"int{args.bits}, group {GROUP}, symmetric; medians of {args.repeat}; {os.cpu_count()} CPUs")
    print(f"{'method':<6} {'shape':>12} {'MB f32':>8} {'wall s':>8} {'CPU s':>8} {'CPU/wall':>9} {'MB/s':>8}")
    for n, k in SHAPES:
        weight = (rng.standard_normal((n, k), np.float32) * np.float32(0.02))
        megabytes = weight.nbytes / 1e6
        for method in args.methods.split(","):
            wall, cpu = timed(quantizer(method, args.bits), weight, args.repeat)
            print(f"{method:<6} {f'{n}x{k}':>12} {megabytes:8.1f} {wall:8.3f} {cpu:8.3f} {cpu / wall:9.2f} "
                  f"{megabytes / wall:8.0f}")
    if "ort" in args.methods.split(","):
        n, k = SHAPES[1]
        b = np.ascontiguousarray(rng.standard_normal((n, k), np.float32).T)  # MatMul's B [K, N]
        for name, function in (("the kernel alone", kernel_call(b, args.bits)), ("ort_blocks", quantizer("ort", args.bits))):
            data = b if name == "the kernel alone" else np.ascontiguousarray(b.T)
            wall, cpu = timed(function, data, 1)
            during, alone = gil_share(function, data)
            print(f"\n{name} on {n}x{k}: CPU/wall {cpu / wall:.2f}; a Python loop in another thread ran "
                  f"{during:,.0f} iterations/s meanwhile, {alone:,.0f}/s alone ({during / alone:.0%})")


def kernel_call(b: np.ndarray, bits: int):
    """One call of onnxruntime's quantizer on B [K, N] (what ``ort_blocks`` cuts into chunks)."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    k, n = b.shape
    nb = k // GROUP
    packed = np.zeros((n, nb, GROUP * bits // 8), np.uint8)
    scales, zeros = np.zeros((n, nb), np.float32), np.zeros((n, nb), np.uint8)
    quantize = quantize_matmul_4bits if bits == 4 else quantize_matmul_8bits
    return lambda data: quantize(packed, data, scales, zeros, GROUP, n, k, True)


if __name__ == "__main__":
    main()
