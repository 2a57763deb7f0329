"""The NPU backend: running and reporting tiling plans.

- ``executor``: runs one planned op tile by tile in NumPy against an explicit SRAM buffer,
  counting DMA bytes (it must count exactly the plan's); ``recurrent``: the same for a
  planned scan (a recurrent layer).

The human report of a plan is the report's NPU section (``irc.report.npu``), alone on a
page by ``irc.report.npu_page``.

The machine model (target description, cost model, lower bounds) is ``irc.npu``; the
planner is the ``npu-tile`` pass (``passes/npu_tile``), which attaches the plan to
``graph.meta["npu_plan"]``; ``irc tile`` is ``irc_cli.tile``.
"""
