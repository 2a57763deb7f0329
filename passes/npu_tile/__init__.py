"""``npu-tile``: plan NPU tiling for every matmul-like op and attach the plan."""
from __future__ import annotations

from typing import Optional

from irc.graph import Graph
from irc.npu.target import load_target
from irc.passmanager import Pass, register_pass
from passes.npu_tile.plan import plan_graph


@register_pass
class NpuTile(Pass):
    """Plan tiles, loop order and double buffering for an NPU target; attach the plan.

    For every linear, MLP, MoE expert and router GEMM, MLA projection and attention core,
    at prefill (``tokens`` new tokens, no cache) and at decode (one token over ``past``
    cached ones) -- for an image encoder (``graph.meta["vision"]``) at one ``image`` phase of
    ``batch`` images at the graph's token count, patch projection included, its attention
    non-causal --, the plan picks Tm x Tn x Tk tiles aligned to the MAC array and a loop
    order that fit the target's SRAM and move the fewest DRAM bytes, then the fewest
    cycles (a roofline per tile step with pipeline fill); attention is tiled flash-style;
    single-use elementwise consumers are fused into the producer's epilogue; the recurrent
    layers (short convolution, Mamba-2's SSD, the gated delta rule) are scans over head tiles
    and token chunks with the state resident (``irc.npu.scan``). Each op's
    traffic is held against the I/O lower bound. The machine model is ``irc.npu``
    (target, cost); the planner is this package (``workloads``, ``plan``).

    Options: ``target`` (a target YAML, required), ``tokens`` [512], ``past`` [4096],
    ``batch`` [1], ``dtype`` (operand dtype, one the target supports) [int8].

    Guarantees: the only change is ``graph.meta["npu_plan"]`` (plain JSON data, the
    content ``irc tile`` writes as plan.json); nodes, params and values are untouched, so
    the numbers do not move. The plan is a function of the graph, the target's content
    and the options, so a second run with the same ones reports no change.
    """

    name = "npu-tile"
    options = {"target": None, "tokens": 512, "past": 4096, "batch": 1, "dtype": "int8"}

    def precondition(self, graph: Graph) -> Optional[str]:
        if not self.config["target"]:
            return "needs a target description: npu-tile{target=examples/targets/edge-npu.yaml}"
        return None

    def run(self, graph: Graph) -> bool:
        target = load_target(self.config["target"])
        plan = plan_graph(graph, target, tokens=self.config["tokens"], past=self.config["past"],
                          batch=self.config["batch"], dtype=self.config["dtype"])
        if graph.meta.get("npu_plan") == plan:
            return False
        graph.meta["npu_plan"] = plan
        return True


__all__ = ["NpuTile"]
