"""The NPU machine model: a target's description (``target``: SRAM, MAC array, dtypes,
DRAM bandwidth, clock; YAML with file:line errors) and the cost of a tiled loop nest on it
(``cost``: traffic, SRAM, cycles, the I/O lower bounds and the tiling search). Pure
arithmetic over a target: the planner (``passes/npu_tile``), the executor and the report
(``backends/npu``) all read it."""
