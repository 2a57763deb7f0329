"""NPU tiling plans: ``plan_graph(graph, target)`` -> the plan, plain JSON data.

For each phase (prefill: B x T new tokens, P = 0; decode: one token over a cache of P;
an image encoder, ``graph.meta["vision"]``, has one phase, ``image``: B images at their
fixed token count, no T or P) the planner extracts the matmul-like work
(``passes.npu_tile.workloads``), searches each distinct shape once
(``irc.npu.cost.search``; layers repeat, so a 80-layer model is a handful of searches),
and records per op its tile, loop order, buffers, traffic against the lower bound, and
cycles; then per phase the totals and the time per token (per image for ``image``).
Nodes the plan does not tile (norms, RoPE, embedding, ...) are costed as streaming their
operands once at the DRAM rate.

The plan is deterministic: the same graph, target and options give the same data, and
``dumps`` gives the same bytes (sorted keys, ratios rounded to 4 places). Its schema is in
the README (``irc tile``).
"""
from __future__ import annotations

import json
import math
from typing import Optional

from irc.errors import BackendError
from irc.graph import Graph
from irc.npu import cost, scan
from irc.ops.vision import FEATURES
from passes.npu_tile import workloads
from irc.npu.target import Machine, Target

FORMAT, VERSION = "irc-npu-plan", 1
PHASES = ("prefill", "decode")
IMAGE = "image"


def phase_bindings(tokens: int, past: int, batch: int, vision: Optional[dict] = None) -> dict:
    """Bindings per phase: a decoder's prefill and decode, or an image encoder's one image
    phase (its token count is fixed by the graph; only B is free, or Qwen-VL's images of its
    reference size, ``vision["bindings"]``). A VLM decoder's image rows
    (``I``) are bound to 0 by ``plan_graph``: its vision model is planned apart (``irc tile``
    plans both)."""
    if vision is not None:  # Qwen-VL's: its visual tokens and images at its reference size, times the batch
        extra = {k: v * batch if k != "N" else batch for k, v in vision.get("bindings", {}).items()}
        return {IMAGE: {"B": batch, **extra}}
    return {"prefill": {"B": batch, "T": tokens, "P": 0}, "decode": {"B": batch, "T": 1, "P": past}}


def plan_graph(graph: Graph, target: Target, *, tokens: int = 512, past: int = 4096, batch: int = 1,
               dtype: str = "int8") -> dict:
    """Plan every matmul-like op of ``graph`` on ``target`` for prefill and decode (an
    image encoder: for one ``image`` phase of ``batch`` images; ``tokens`` and ``past``
    do not apply and are not recorded)."""
    for name, value, least in (("tokens", tokens, 1), ("past", past, 0), ("batch", batch, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise BackendError(f"npu plan: {name} must be an integer >= {least}, got {value!r}")
    machine = target.machine(dtype)
    vision = graph.meta.get("vision")
    phases = phase_bindings(tokens, past, batch, vision)
    if any(v.name == FEATURES for v in graph.inputs):  # a VLM decoder: its image rows are the vision plan's
        phases = {phase: {**bindings, "I": 0} for phase, bindings in phases.items()}
    searched: dict = {}
    ops, totals = [], {}
    for phase, bindings in phases.items():
        works, covered = workloads.extract(graph, bindings)
        records = []
        for work in works:
            if work.shape not in searched:
                search = scan.search_scan if work.kind == "scan" else cost.search
                searched[work.shape] = search(work.shape, machine, what=f"{work.name} ({phase})")
            records.append(op_record(work, phase, searched[work.shape], machine))
        others = [n for n in graph.nodes if n.name not in covered]
        unplanned = sum(workloads.unplanned_bytes(n, bindings, machine.op_bytes) for n in others)
        totals[phase] = phase_totals(records, len(others), unplanned, bindings, machine, vision)
        ops += records
    options = {"dtype": dtype, "accumulator": machine.accumulator, "batch": batch}
    options.update({"vision": dict(vision)} if vision is not None else {"tokens": tokens, "past": past})
    return {
        "format": FORMAT, "version": VERSION, "model": graph.name, "target": target.to_json(),
        "options": options,
        "phases": phases,
        "accounting": {
            "traffic": "bytes: operands at operand width, outputs at output width, spilled partial sums at "
                       "accumulator width; tile rows move in whole DMA bursts",
            "lower_bound": "max(compulsory, min(pebbling, panel)); pebbling = 2MNK/sqrt(S) + MN with S = SRAM "
                           "bytes / accumulator bytes",
            "sram_words": machine.sram_bytes // machine.acc_bytes,
        },
        "ops": ops,
        "totals": totals,
    }


def op_record(work: workloads.Work, phase: str, choice: cost.Choice, machine: Machine) -> dict:
    """One planned op: the choice for one instance, traffic and cycles for all of them."""
    c, n = choice.cost, work.count
    dram = {name: int(v) * n for name, v in c["dram"].items()}
    dram_bytes = sum(dram.values())
    bound = {key: (value * n if value is not None else None) for key, value in choice.bound.items() if key != "words"}
    macs = work.shape.macs * n
    cycles = math.ceil(float(c["cycles"])) * n
    compute = math.ceil(float(c["compute_cycles"])) * n
    transfer = math.ceil(float(c["transfer_cycles"])) * n
    record = {
        "name": work.name, "node": work.node, "op": work.op, "role": work.role, "kind": work.kind,
        "phase": phase, "layer": work.layer, "count": n, "shape": work.shape.to_json(),
        "dtype": machine.dtype, "accumulator": machine.accumulator,
        "tile": dict(choice.tile), "loop_order": list(choice.order), "double_buffer": bool(choice.double_buffer),
        "buffers": {name: {"bytes": int(size), "copies": int(copies)} for name, (size, copies) in c["buffers"].items()},
        "sram_bytes": int(c["sram_bytes"]),
        "dram_bytes": dram_bytes, "dram": dram,
        "lower_bound_bytes": bound.pop("bytes"), "lower_bound": bound,
        "ratio": round(dram_bytes / (choice.bound["bytes"] * n), 4),
        "macs": macs, "intensity": round(2 * macs / dram_bytes, 3),
        "compute_cycles": compute, "transfer_cycles": transfer, "cycles": cycles,
        "bound": "compute" if compute >= transfer else "bandwidth",
        "mac_utilization": round(macs / (cycles * machine.peak_macs), 4),
        "steps": int(c["steps"]) * n,
        "fused": list(work.fused), "epilogue": [dict(step) for step in work.epilogue],
    }
    if work.attention is not None:
        record["attention"] = dict(work.attention)
    if work.scan is not None:
        record["scan"] = {"op": work.scan["op"], "attrs": dict(work.scan["attrs"]),
                          "operands": list(work.scan["operands"])}
    return record


def phase_totals(records: list, unplanned_nodes: int, unplanned_bytes: int, bindings: dict, machine: Machine,
                 vision: Optional[dict] = None) -> dict:
    """A phase's sums; the rate per token (a decoder) or per image (an image encoder:
    ``images``, ``seconds_per_image``, ``images_per_second``)."""
    planned_cycles = sum(r["cycles"] for r in records)
    unplanned_cycles = math.ceil(unplanned_bytes / machine.dram_bw)
    cycles = planned_cycles + unplanned_cycles
    seconds = cycles / machine.clock_hz
    dram = sum(r["dram_bytes"] for r in records)
    bound = sum(r["lower_bound_bytes"] for r in records)
    macs = sum(r["macs"] for r in records)
    if vision is not None:
        images = bindings["B"]
        rate = {"images": images, "tokens": images * vision["tokens"],
                "seconds_per_image": round(seconds / images, 9), "images_per_second": round(images / seconds, 3)}
    else:
        tokens = bindings["B"] * bindings["T"]
        rate = {"tokens": tokens, "seconds_per_token": round(seconds / tokens, 9),
                "tokens_per_second": round(tokens / seconds, 3)}
    return {
        "ops": len(records), "dram_bytes": dram, "lower_bound_bytes": bound,
        "ratio": round(dram / bound, 4) if bound else None, "macs": macs, "planned_cycles": planned_cycles,
        "unplanned": {"nodes": unplanned_nodes, "dram_bytes": unplanned_bytes, "cycles": unplanned_cycles},
        "cycles": cycles, "seconds": round(seconds, 9), **rate,
        "peak_sram_bytes": max((r["sram_bytes"] for r in records), default=0),
        "mac_utilization": round(macs / (planned_cycles * machine.peak_macs), 4) if planned_cycles else None,
        "compute_bound_ops": sum(1 for r in records if r["bound"] == "compute"),
    }


def dumps(plan: dict) -> str:
    """The plan as JSON text: sorted keys, one-space indent, a final newline."""
    return json.dumps(plan, indent=1, sort_keys=True) + "\n"


def machine_of(plan: dict) -> Machine:
    return Target.from_json(plan["target"]).machine(plan["options"]["dtype"])


def naive_record(record: dict, machine: Machine) -> dict:
    """The fixed-16x16x16 baseline for a planned op (a scan: one unit and 16 tokens a
    step): dram_bytes, cycles, ratio."""
    n = record["count"]
    if record["kind"] == "scan":   # one unit, 16 tokens a step
        base = scan.evaluate(scan.ScanShape.from_json(record["shape"]), machine, 1, 16)
        return {"dram_bytes": base["dram_bytes"] * n, "cycles": base["cycles"] * n,
                "ratio": round(base["dram_bytes"] * n / record["lower_bound_bytes"], 4),
                "sram_bytes": base["sram_bytes"]}
    shape = cost.shape_from_json(record["kind"], record["shape"])
    base = cost.naive(shape, machine)
    dram = int(base.cost["dram_bytes"]) * n
    return {"dram_bytes": dram, "cycles": math.ceil(float(base.cost["cycles"])) * n,
            "ratio": round(dram / record["lower_bound_bytes"], 4), "sram_bytes": int(base.cost["sram_bytes"])}
