"""The NPU backend: tiling plans for a target described in YAML, their report, and a tiled
NumPy executor that runs a plan tile by tile.

Modules, one concern each:

- ``target``: the target description (YAML, checked with file:line errors);
- ``cost``: the tiled loop-nest model (traffic, SRAM, cycles), the lower bounds and the
  tiling search;
- ``workloads``: which work of which node is planned, at one phase's sizes;
- ``plan``: the plan for a graph, prefill and decode, as plain JSON data;
- ``executor``: runs one planned op tile by tile in NumPy against an explicit SRAM buffer,
  counting DMA bytes;
- ``report``: the human report (HTML with inline SVG);
- ``cli``: ``irc tile``.

The ``npu-tile`` pass (``passes/npu_tile.py``) attaches the plan to ``graph.meta["npu_plan"]``.
"""
