"""``fix-image-grid``: a tower of any image size at the one image its target takes.

Qwen-VL's towers place their patches from ``image_grid_thw`` (``patch_grid``) and Pixtral's
reads its rows and columns from the image's sides (``range_like``); a target of static shapes
(onnx-npu) takes one image, the checkpoint's reference (``meta["vision"]``: ``image_size``,
``patch`` and the ``bindings`` of its symbols, one image of one frame, batch 1).

Guarantees: every symbolic dim the bindings decide (values' shapes, shape attributes) becomes
its number; each ``patch_grid`` becomes the constant rows of the grid [[1, H/p, W/p]] and each
``range_like`` over a now-fixed dim its constant range; the ``image_grid_thw`` input, no longer
read, is removed. The graph then computes what it computed on that image and that grid, with
pixel values as its only input; ``fold`` and ``dce`` after it turn the positions, the attention
blocks and the resampled learned positions into params. A graph whose inputs have no symbol
the bindings decide (a ViT, a decoder) is unchanged; a second run finds none left.
"""
from __future__ import annotations

import numpy as np

from irc import dims, ops
from irc.dtypes import DType
from irc.graph import Graph, Node
from irc.ops.vision import patch_grid
from irc.passmanager import register_pass
from irc.rewrite.lowering import Emitter, LoweringPass

GRID = "image_grid_thw"


@register_pass
class FixImageGrid(LoweringPass):
    """The module docstring."""

    name = "fix-image-grid"

    def run(self, graph: Graph) -> bool:
        vision = graph.meta.get("vision") or {}
        grids = any(v.name == GRID for v in graph.inputs)
        bindings = {**vision.get("bindings", {}), **({"N": 1} if grids else {}), "B": 1}  # one image, batch 1
        symbols = {s for v in graph.inputs for d in v.shape if isinstance(d, str) for s in dims.symbols(d)} - {"B"}
        if not symbols or not symbols <= set(bindings):
            return False
        height, width = (side // vision["patch"] for side in vision["image_size"])
        self.grid = np.asarray([[1, height, width]], np.int64)
        _specialize(graph, bindings)
        super().run(graph)
        graph.inputs = [v for v in graph.inputs if v.name != GRID]
        vision["fixed_grid"] = self.grid[0].tolist()
        graph.meta["bound_inputs"] = {**graph.meta.get("bound_inputs", {}), GRID: self.grid.tolist()}
        return True

    def lowering(self, node: Node):
        if node.op == "range_like" and isinstance(node.outputs[0].shape[0], int):
            return _range
        grid = self.grid
        return (lambda e, node: _grid(e, node, grid)) if node.op == "patch_grid" else None


def _range(e: Emitter, node: Node):
    return [e.constant(list(range(node.outputs[0].shape[0])), DType.i64, name=f"{node.outputs[0].name}.fixed")]


def _grid(e: Emitter, node: Node, grid: np.ndarray):
    rows = patch_grid(grid, node.outputs[0].shape[1], node.attrs["merge"], node.attrs["window"])
    return [e.constant(rows.tolist(), DType.i64, name=f"{node.outputs[0].name}.fixed")]


def _specialize(graph: Graph, bindings: dict) -> None:
    """Every symbolic dim of ``graph`` that ``bindings`` decide, as its number."""
    def concrete(shape):
        return tuple(dims.evaluate(dims.canonical(d), bindings) if isinstance(d, str) and
                     dims.symbols(d) <= set(bindings) else d for d in shape)

    for value in [*graph.inputs, *(out for node in graph.nodes for out in node.outputs)]:
        value.shape = concrete(value.shape)
    for node in graph.nodes:
        for key in ops.get_op(node.op).shape_attrs:
            node.attrs[key] = list(concrete(node.attrs[key]))


__all__ = ["FixImageGrid"]
