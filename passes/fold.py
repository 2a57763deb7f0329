"""``fold``: constant folding into params and constants."""
from __future__ import annotations

from typing import Optional

import numpy as np

from irc import dims, ops
from irc.dtypes import DType
from irc.graph import Graph, Node, Param, Value
from irc.passmanager import register_pass
from irc.printer import format_attrs, operand
from irc.rewrite.edit import is_graph_output
from irc.rewrite.lowering import Emitter, LoweringPass
from irc.weights import Derived


def _known(value) -> bool:
    """Operands fold can evaluate: params with data (present or lazy) and ``constant`` results."""
    if value is None:
        return True
    if isinstance(value, Param):
        return value.data is not None
    return value.producer is not None and value.producer.op == "constant"


def _array(value):
    if value is None:
        return None
    if isinstance(value, Param):
        return value.array()
    node = value.producer
    return ops.get_op("constant").reference([], node.attrs)[0]


class FoldedOutput:
    """Output ``index`` of ``op`` over ``sources`` (params, read lazily, or constant arrays)."""

    def __init__(self, op: str, sources: list, attrs: dict, index: int, dtype):
        self.op, self.sources, self.attrs, self.index, self.dtype = op, sources, attrs, index, dtype

    def __call__(self) -> np.ndarray:
        args = [s.array() if isinstance(s, Param) else s for s in self.sources]
        result = ops.get_op(self.op).reference(args, self.attrs)[self.index]
        return np.asarray(result).astype(self.dtype.numpy, copy=False)


def _literal(array: np.ndarray, dtype):
    """A JSON-able nested list (or scalar) holding ``array`` exactly for ``constant``."""
    if dtype.is_float:
        return np.asarray(array, dtype=np.float64).tolist()
    if dtype == DType.bool:
        return np.asarray(array, dtype=bool).tolist()
    return np.asarray(array, dtype=np.int64).tolist()


def _int_shapes(node: Node) -> bool:
    if any(isinstance(d, str) for v in node.outputs for d in v.shape):
        return False
    for key in ops.get_op(node.op).shape_attrs:
        if any(isinstance(d, str) for d in node.attrs[key]):
            return False
    return True


@register_pass
class Fold(LoweringPass):
    """Evaluate nodes whose operands are all known at compile time.

    A node folds when every operand is a param with data (present or lazy) or the result
    of a ``constant`` node, its result shapes are concrete, some node reads it and it is
    not a graph output (a param cannot be returned). Each result becomes:

    - a new param whose data is ``irc.weights.Derived``, computed on demand from the source
      params with the op's reference (nothing is loaded at compile time), named after the
      replaced value (``%layers.0.attn.wq.T`` -> ``@layers.0.attn.wq.T``), when a param is
      among the operands or the result has more than ``max_constant`` elements;
    - otherwise a ``constant`` node holding the value (constants only, small results).

    Ops marked ``foldable=False`` (dequantize) stay: folding them would undo the rewrite
    that made them. Nodes are visited in order, so chains (``transpose(cast(@w))``) fold in one run.
    Params without data (a shape-only compile) are left alone. The folded nodes are
    removed; params they read stay for ``dce``. Deterministic: names come from values. A
    node that cannot fold is passed by without a note (there is nothing to refuse).
    """

    name = "fold"
    options = {"max_constant": 64}

    def lowering(self, node: Node):
        """Every op but ``constant`` and those marked ``foldable=False`` may fold."""
        if node.op == "constant" or not ops.get_op(node.op).foldable:
            return None
        return fold_node


def fold_node(e: Emitter, node: Node) -> Optional[list[Value]]:
    """The params or constants replacing ``node``'s results, or None when it cannot fold."""
    graph = e.graph
    if not node.inputs or not all(_known(v) for v in node.inputs):
        return None
    if not _int_shapes(node) or not any(out.uses for out in node.outputs):
        return None
    if any(is_graph_output(graph, out) for out in node.outputs):
        return None
    from_params = any(isinstance(v, Param) for v in node.inputs)
    small = all(dims.product(out.shape) <= e.options["max_constant"] for out in node.outputs)
    if from_params or not small:
        sources = [v if v is None or isinstance(v, Param) else _array(v) for v in node.inputs]
        description = f"{node.op} {', '.join(operand(v) for v in node.inputs)}{format_attrs(node)}"
        params = []
        for index, out in enumerate(node.outputs):
            param = graph.add_param(_free_param_name(graph, out.name), out.dtype, out.shape)
            param.data = Derived(FoldedOutput(node.op, sources, dict(node.attrs), index, out.dtype), description)
            params.append(param)
        return params
    arrays = ops.get_op(node.op).reference([_array(v) for v in node.inputs], node.attrs)
    return [e.constant(_literal(a, out.dtype), out.dtype, name=f"{out.name}.folded")
            for a, out in zip(arrays, node.outputs)]


def _free_param_name(graph: Graph, hint: str) -> str:
    name, n = hint, 0
    while name in graph.params:
        n += 1
        name = f"{hint}_{n}"
    return name


__all__ = ["Fold", "FoldedOutput"]
