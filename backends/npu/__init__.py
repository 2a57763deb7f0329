"""The NPU backend: running and reporting tiling plans.

- ``executor``: runs one planned op tile by tile in NumPy against an explicit SRAM buffer,
  counting DMA bytes (it must count exactly the plan's);
- ``report``: the human report of a plan (HTML with inline SVG).

The machine model (target description, cost model, lower bounds) is ``irc.npu``; the
planner is the ``npu-tile`` pass (``passes/npu_tile``), which attaches the plan to
``graph.meta["npu_plan"]``; ``irc tile`` is ``irc_cli.tile``.
"""
