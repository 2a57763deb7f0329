"""NPU tiling plans against the I/O lower bound and a naive tiling (no assertions).

Prints, for Llama-3-8B, DeepSeek-V2 and the hybrids with recurrent layers (Mamba-2-2.7B,
Qwen3-Next-80B-A3B and the tiny Mamba-2, Granite-4.0-H, LFM2 and Qwen3-Next twins; weights
absent) at prefill (T = 512) and decode (P = 4,096) on every shipped target (a recurrent
layer is a scan: its state in and out once per call, irc.npu.scan):

1. one row per distinct op (layers repeat; the first layer that has the op stands for
   all): the plan's DRAM bytes, the lower bound, their ratio, the naive tiling's bytes
   (fixed 16x16x16 tiles, m-n-k order) and ratio, cycles and what bounds them;
2. the totals per model, phase and target, with the time per token;
3. the time to plan the 80-layer Llama-2-70B (median of ``--repeat`` runs): the planner
   alone, and load + pass manager + JSON as ``irc tile`` does it.

    python benchmarks/npu_plans.py [--repeat 5] [--models llama3-8b,tiny-mamba2-2.7b]
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import time

from common import ROOT

from passes.npu_tile.plan import dumps, machine_of, naive_record, plan_graph  # noqa: E402
from irc.text import format_bytes as _bytes, format_seconds as _seconds  # noqa: E402
from irc.npu.target import load_target  # noqa: E402
from frontends import load_spec  # noqa: E402
from irc.passmanager import PassManager  # noqa: E402
from passes.npu_tile import NpuTile  # noqa: E402

MODELS = ("llama3-8b", "deepseek-v2", "mamba2-2.7b", "qwen3-next-80b-a3b", "tiny-mamba2-2.7b",
          "tiny-granite-4.0-h-small", "tiny-lfm2-1.2b", "tiny-qwen3-next-80b-a3b")
TARGETS = sorted(glob.glob(os.path.join(ROOT, "examples", "targets", "*.yaml")))


def op_key(record: dict) -> str:
    return record["name"].split(".", 2)[-1] if record["layer"] is not None else record["name"]


def table(models: list) -> None:
    header = (f"{'model':<12} {'phase':<7} {'target':<14} {'op':<34} {'plan':>10} {'bound':>10} {'ratio':>6} "
              f"{'naive':>10} {'naive/LB':>8} {'cycles':>14} {'bound by':<9}")
    print(header)
    print("-" * len(header))
    totals = []
    for model in models:
        graph = load_spec(os.path.join(ROOT, "examples", f"{model}.yaml"))
        for path in TARGETS:
            plan = plan_graph(graph, load_target(path))
            machine = machine_of(plan)
            naive_sum = {"prefill": 0, "decode": 0}
            for r in plan["ops"]:
                naive_sum[r["phase"]] += naive_record(r, machine)["dram_bytes"]
            for phase in ("prefill", "decode"):
                seen = set()
                for r in (r for r in plan["ops"] if r["phase"] == phase):
                    key = (op_key(r), str(r["shape"]))
                    if key in seen:
                        continue
                    seen.add(key)
                    naive = naive_record(r, machine)
                    print(f"{model:<12} {phase:<7} {plan['target']['name']:<14} {op_key(r)[:34]:<34} "
                          f"{_bytes(r['dram_bytes']):>10} {_bytes(r['lower_bound_bytes']):>10} {r['ratio']:>6.3f} "
                          f"{_bytes(naive['dram_bytes']):>10} {naive['ratio']:>8.2f} {r['cycles']:>14,} "
                          f"{r['bound']:<9}")
                t = plan["totals"][phase]
                totals.append((model, phase, plan["target"]["name"], t, naive_sum[phase]))
    print()
    header = (f"{'model':<12} {'phase':<7} {'target':<14} {'DRAM':>10} {'bound':>10} {'ratio':>6} {'naive':>10} "
              f"{'naive/LB':>8} {'time/token':>11} {'MAC util':>8}")
    print(header)
    print("-" * len(header))
    for model, phase, target, t, naive in totals:
        print(f"{model:<12} {phase:<7} {target:<14} {_bytes(t['dram_bytes']):>10} {_bytes(t['lower_bound_bytes']):>10} "
              f"{t['ratio']:>6.3f} {_bytes(naive):>10} {naive / t['lower_bound_bytes']:>8.2f} "
              f"{_seconds(t['seconds_per_token']):>11} {t['mac_utilization']:>8.1%}")


def planning_time(repeat: int) -> None:
    spec = os.path.join(ROOT, "examples", "llama2-70b.yaml")
    graph = load_spec(spec)
    print(f"\nplanning Llama-2-70B ({len(graph.nodes)} nodes, 80 layers), prefill + decode, median of {repeat}")
    print(f"{'target':<14} {'ops':>5} {'planner s':>10} {'irc tile s':>11}")
    for path in TARGETS:
        target = load_target(path)
        plan_graph(graph, target)  # warm imports
        planner, whole, ops = [], [], 0
        for _ in range(repeat):
            start = time.perf_counter()
            ops = len(plan_graph(graph, target)["ops"])
            planner.append(time.perf_counter() - start)
            start = time.perf_counter()
            fresh = load_spec(spec)
            PassManager([NpuTile(target=path)]).run(fresh)
            dumps(fresh.meta["npu_plan"])
            whole.append(time.perf_counter() - start)
        print(f"{target.name:<14} {ops:>5} {statistics.median(planner):>10.3f} {statistics.median(whole):>11.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    table(args.models.split(","))
    planning_time(args.repeat)


if __name__ == "__main__":
    main()
