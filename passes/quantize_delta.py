"""What ``quantize`` keeps float in recurrent layers and how it cuts a projection whose Δ
rows are only some of its rows: the recurrence's own parameters (``recurrence_params``), the
projections its Δ path reads (``delta_rows``), and the row split (``split_rows``)."""
from __future__ import annotations

from typing import Optional

from irc import ops
from irc.build import emit1
from irc.graph import Graph, Param, Value
from irc.rewrite.edit import replace_node
from irc.weights import Derived, read_rows

# recurrence ops and their operands that carry the Δ path (step size, decay, write strength;
# Mamba-1's input-dependent B and C come from the same x_proj), traced back to projections
DELTA_OPERANDS = {"selective_scan": ("dt", "B", "C"), "ssd": ("dt",), "gated_delta_rule": ("a", "b")}
RECURRENCE_OPS = ("causal_conv1d", *DELTA_OPERANDS)
# what the trace walks through from a Δ operand to a projection: views, scales and norms;
# it stops at anything else (a causal conv: what enters it is the content path)
PATH_OPS = {"slice", "reshape", "concat", "mul", "add", "constant", "expand", "rms_norm", "rsqrt", "reduce_mean"}
DELTA_WHY = "its error would enter the state at every step and compound along the sequence " \
            "(quantize{recurrent=true} quantizes it)"
STATE_REFUSAL = ("an int8 recurrent state is not built: the state is a graph input/output read by every backend "
                 "(reference, ONNX, ORT, genai's declared states) as float, and its per-head scales would have "
                 "to travel beside it through all of them")
OWN_WHY = "the recurrence's own parameter ({op} {operand}), a vector or a short filter, not a matrix " \
          "the block layout quantizes (kept float even with recurrent=true)"


def recurrence_params(graph: Graph) -> list[tuple]:
    """(name, dtype, reason) of each param a recurrence op reads directly (conv taps and
    bias, A_log, D, dt_bias), once each, in graph order."""
    found = {}
    for node in graph.nodes:
        if node.op in RECURRENCE_OPS:
            names = ops.get_op(node.op).operand_names(len(node.inputs))
            for operand, value in zip(names, node.inputs):
                if isinstance(value, Param) and value.name not in found:
                    found[value.name] = (value.name, value.dtype, OWN_WHY.format(op=node.op, operand=operand))
    return list(found.values())


def delta_rows(graph: Graph) -> dict[Param, list]:
    """The projection weights the Δ path reads, each with the row ranges [start, stop) it
    reads (merged, sorted). From each Δ operand (``DELTA_OPERANDS``) the trace walks back
    through ``PATH_OPS`` to the first ``linear``; a slice of the projection's output keeps
    only its rows (Mamba-2's dt rows of in_proj), anything else that mixes the last axis
    widens to all rows. A projection wholly on the path whose input is narrower than its
    output is the up half of a low-rank Δ (Mamba-1's dt_proj): the trace goes on into it."""
    found: dict[Param, list] = {}
    stack = []
    for node in graph.nodes:
        wanted = DELTA_OPERANDS.get(node.op)
        if wanted:
            names = ops.get_op(node.op).operand_names(len(node.inputs))
            stack += [(value, None) for name, value in zip(names, node.inputs) if name in wanted and value is not None]
    seen = set()
    while stack:
        value, window = stack.pop()
        node = value.producer
        if isinstance(value, Param) or node is None or (value.name, window) in seen:
            continue
        seen.add((value.name, window))
        if node.op == "linear" and isinstance(node.inputs[1], Param):
            weight = node.inputs[1]
            rows = window or (0, weight.shape[0])
            found.setdefault(weight, []).append(rows)
            if rows == (0, weight.shape[0]) and weight.shape[-1] < weight.shape[0]:
                stack.append((node.inputs[0], None))
        elif node.op in PATH_OPS:
            stack += [(v, _window_in(node, v, window)) for v in node.inputs if v is not None]
    return {param: _merge(ranges) for param, ranges in found.items()}


def _window_in(node, operand: Value, window: Optional[tuple]) -> Optional[tuple]:
    """The range of ``operand``'s last axis that ``window`` of the node's output reads (None: all)."""
    out = node.outputs[0]
    if node.op == "slice" and node.attrs["axis"] in (-1, out.rank - 1) and isinstance(out.shape[-1], int):
        start, stop = window or (0, out.shape[-1])
        return node.attrs["start"] + start, node.attrs["start"] + stop
    if node.op in ("mul", "add") and operand.rank == out.rank and operand.shape[-1] == out.shape[-1]:
        return window
    return None


def _merge(ranges: list) -> list:
    merged: list = []
    for start, stop in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(stop, merged[-1][1]))
        else:
            merged.append((start, stop))
    return merged


class RowSlice:
    """Rows [start, stop) of a param's weight, as ``irc.weights.Derived`` data (by rows too)."""

    def __init__(self, source: Param, start: int, stop: int):
        self.source, self.start, self.stop = source, start, stop
        self.row_elements = source.numel // max(source.shape[0], 1)

    def __call__(self):
        return read_rows(self.source, self.start, self.stop)

    def rows(self, start: int, stop: int):
        return read_rows(self.source, self.start + start, self.start + min(stop, self.stop - self.start))


def row_piece(graph: Graph, param: Param, start: int, stop: int) -> Param:
    """``@<param>.rows_<start>_<stop>``: those rows of ``param`` (absent when it is)."""
    piece = graph.add_param(f"{param.name}.rows_{start}_{stop}", param.dtype, (stop - start, *param.shape[1:]))
    if param.data is not None:
        piece.data = Derived(RowSlice(param, start, stop), f"rows {start}:{stop} of @{param.name}")
    return piece


def split_rows(graph: Graph, param: Param, ranges: list) -> list[tuple]:
    """Cut ``param`` [N, K], read only as linears' weight, at the ends of ``ranges``: each
    ``linear(x, W, b)`` becomes the concat of one linear per piece of rows (its bias cut
    the same way), the same numbers up to float rounding; ``param`` is dropped. Returns
    (start, stop, piece) in row order."""
    bounds = sorted({0, param.shape[0], *(end for span in ranges for end in span)})
    pieces = [(start, stop, row_piece(graph, param, start, stop)) for start, stop in zip(bounds, bounds[1:])]
    for node in list(graph.users(param)):
        x, _, bias = (list(node.inputs) + [None])[:3]
        outs = []
        for start, stop, piece in pieces:
            if isinstance(bias, Param):
                name = f"{bias.name}.rows_{start}_{stop}"
                part = graph.params.get(name) or row_piece(graph, bias, start, stop)
            else:
                part = None if bias is None else emit1(graph, "slice", [bias], {"axis": 0, "start": start, "end": stop},
                                                        f"{bias.name}.rows_{start}_{stop}", before=node)
            outs.append(emit1(graph, "linear", [x, piece, part], None, f"{node.outputs[0].name}.rows_{start}_{stop}",
                              before=node, origin=node.origin))
        joined = emit1(graph, "concat", outs, {"axis": -1}, f"{node.outputs[0].name}.joined", before=node,
                       origin=node.origin)
        replace_node(graph, node, [joined])
        if isinstance(bias, Param) and not bias.uses:
            del graph.params[bias.name]
    del graph.params[param.name]
    return pieces


__all__ = ["DELTA_OPERANDS", "RECURRENCE_OPS", "DELTA_WHY", "STATE_REFUSAL", "recurrence_params", "delta_rows",
           "split_rows"]
