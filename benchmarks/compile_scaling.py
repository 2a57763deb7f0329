"""Compile-time scaling with depth: parse + build + verify + dce,cse + print, weights absent.

Prints two tables (no assertions):
1. in-process medians for Llama-style specs at 8..128 layers (llama2-70b's shapes with
   n_layers changed), with time per layer, which stays flat when the growth is linear;
2. whole-process runs of `irc compile examples/llama2-70b.yaml --target ir --passes dce,cse`
   (start-up included): median wall time and peak resident memory.

    python benchmarks/compile_scaling.py [--repeat 5]
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from common import ROOT

from frontends import load_spec  # noqa: E402
from irc.passmanager import PassManager, parse_pipeline  # noqa: E402
from irc.printer import print_graph  # noqa: E402
import passes  # noqa: E402,F401


def compile_once(path: str) -> tuple[float, int]:
    """Seconds for one compile, and the node count of the result."""
    start = time.perf_counter()
    graph = load_spec(path)
    PassManager(parse_pipeline("dce,cse")).run(graph)  # verifies before and after each pass
    print_graph(graph)
    return time.perf_counter() - start, len(graph.nodes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    base = open(os.path.join(ROOT, "examples", "llama2-70b.yaml")).read()
    print("in-process: parse + build + verify + dce,cse + print (weights absent)")
    print(f"{'layers':>6} {'nodes':>7} {'median ms':>10} {'ms/layer':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for layers in (8, 16, 32, 64, 128):
            path = os.path.join(tmp, f"llama-{layers}.yaml")
            with open(path, "w") as f:
                f.write(re.sub(r"n_layers:\s*\d+", f"n_layers: {layers}", base, count=1))
            compile_once(path)  # warm imports and caches
            times, nodes = [], 0
            for _ in range(args.repeat):
                t, nodes = compile_once(path)
                times.append(t)
            med = statistics.median(times)
            print(f"{layers:>6} {nodes:>7} {med * 1e3:>10.1f} {med * 1e3 / layers:>9.2f}")

        print("\nwhole process: irc compile examples/llama2-70b.yaml --target ir --passes dce,cse")
        walls, peaks = [], []
        for _ in range(args.repeat):
            out = os.path.join(tmp, "70b.ir")
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "irc_cli", "compile", os.path.join(ROOT, "examples", "llama2-70b.yaml"),
                            "--target", "ir", "--passes", "dce,cse", "-o", out], check=True, cwd=ROOT,
                           stderr=subprocess.DEVNULL)
            walls.append(time.perf_counter() - start)
            peaks.append(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
        print(f"{'median wall s':>14} {'min s':>7} {'max s':>7} {'peak RSS MB':>12}")
        print(f"{statistics.median(walls):>14.3f} {min(walls):>7.3f} {max(walls):>7.3f} {max(peaks):>12.1f}")


if __name__ == "__main__":
    main()
