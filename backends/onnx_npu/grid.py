"""A tower of any image size (Qwen-VL's: its patches placed from ``image_grid_thw``; Pixtral's:
rows and columns from the image's sides) at the one image size an onnx-npu contract takes: the
checkpoint's reference image (``meta["vision"]``: one image, one frame, ``image_size`` /
``patch`` patches a side; its ``bindings`` fix the symbols).

``fixed_grid(graph)`` returns a copy in which the symbols are those numbers, ``patch_grid`` is
that grid's constant rows, ``range_like`` over a fixed dim its range, the ``image_grid_thw``
input is gone, and ``fold`` has evaluated everything that then depends on
constants and params alone: the RoPE positions, the attention blocks (frames and windows) and
the learned positions resampled to the grid (``resample_positions``) become params. What is
left is a static ViT the NPU table lowers: ``rope`` with multi-axis positions reads a position
param (``lower.lower_rope``), a bidirectional attention's blocks become an additive mask
(``lower.lower_bidirectional``). A graph whose inputs have no such symbols is returned as it is.
"""
from __future__ import annotations

import numpy as np

from irc import dims, ops
from irc.dtypes import DType
from irc.graph import Graph, Node
from irc.ops.vision import patch_grid
from irc.rewrite.lowering import Emitter, LoweringPass

GRID = "image_grid_thw"


class _FixedGrid(LoweringPass):
    """``patch_grid`` nodes as the constant rows of ``grid``; ``range_like`` over a dim now
    fixed as its constant range (Pixtral's patch rows and columns)."""

    name = "fixed-grid"

    def __init__(self, grid: np.ndarray, count: int):
        super().__init__()
        self.grid, self.count = grid, count

    def lowering(self, node: Node):
        if node.op == "range_like" and isinstance(node.outputs[0].shape[0], int):
            return lambda e, node: [e.constant(list(range(node.outputs[0].shape[0])), DType.i64,
                                               name=f"{node.outputs[0].name}.fixed")]
        if node.op != "patch_grid":
            return None

        def placed(e: Emitter, node: Node):
            rows = patch_grid(self.grid, self.count, node.attrs["merge"], node.attrs["window"])
            return [e.constant(rows.tolist(), DType.i64, name=f"{node.outputs[0].name}.fixed")]
        return placed


def fixed_grid(graph: Graph) -> Graph:
    """``graph`` at its reference image (the module docstring)."""
    vision = graph.meta.get("vision") or {}
    grids = any(v.name == GRID for v in graph.inputs)
    bindings = {**vision.get("bindings", {}), **({"N": 1} if grids else {}), "B": 1}  # the contract's batch of 1
    symbols = {s for v in graph.inputs for d in v.shape if isinstance(d, str) for s in dims.symbols(d)} - {"B"}
    if not symbols or not symbols <= set(bindings):
        return graph
    from passes.dce import DeadCodeElimination
    from passes.fold import Fold

    height, width = (side // vision["patch"] for side in vision["image_size"])
    fixed = graph.clone()
    _specialize(fixed, bindings)
    _FixedGrid(np.asarray([[1, height, width]], np.int64), height * width).run(fixed)
    fixed.inputs = [v for v in fixed.inputs if v.name != GRID]
    Fold(max_constant=0).run(fixed)
    DeadCodeElimination().run(fixed)
    return fixed


def _specialize(graph: Graph, bindings: dict) -> None:
    """Every symbolic dim of ``graph`` (values' shapes, ops' shape attributes) that ``bindings``
    decide, as its number."""
    def concrete(shape):
        return tuple(dims.evaluate(dims.canonical(d), bindings) if isinstance(d, str) and
                     dims.symbols(d) <= set(bindings) else d for d in shape)

    for value in [*graph.inputs, *(out for node in graph.nodes for out in node.outputs)]:
        value.shape = concrete(value.shape)
    for node in graph.nodes:
        for key in ops.get_op(node.op).shape_attrs:
            node.attrs[key] = list(concrete(node.attrs[key]))
