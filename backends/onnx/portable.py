"""Standard ONNX ops for each irc op: primitives and the dense model ops.

One lowering per op, ``lower_<op>(b, node, outs)``: it reads the node's operands through
the builder (``b.value``) and writes the node's results under ``outs`` (names chosen by
the emitter). The table at the bottom is the portable target's; attention, RoPE, MLA and
MoE live in their own modules and join the table there.

Semantics are the references' (``irc.ops``): float math in the activation's type, linear
weights [out, in] (stored transposed, [in, out], as MatMul's right operand, unless the
param is also read another way, such as a tied embedding: then ``shared_linear``; onnx-ort
keeps every f32 linear weight as stored, [out, in], under ``FusedMatMul(transB=1)``:
``stored_matmul``),
reshapes with ``allowzero=1`` so that a dim that is 0 at run time (P in a prefill) stays 0.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from onnx import TensorProto

from irc import dims
from irc.dtypes import DType
from irc.errors import BackendError
from irc.graph import Node, Param, Value
from irc.ops.registry import pad_inputs

from backends.onnx.builder import MS_DOMAIN, ONNX_TYPES, Builder
from backends.onnx.fits import only_matrix_uses
from backends.onnx.vision import VISION_LOWERINGS

BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "maximum": "Max",
          "less": "Less", "equal": "Equal", "where": "Where", "less_equal": "LessOrEqual", "logical_and": "And"}
UNARY = {"log": "Log", "exp": "Exp", "tanh": "Tanh", "sqrt": "Sqrt", "sigmoid": "Sigmoid", "cos": "Cos", "sin": "Sin",
         "neg": "Neg"}
REDUCE = {"reduce_sum": "ReduceSum", "reduce_mean": "ReduceMean", "reduce_max": "ReduceMax"}
NUMPY_OF = {dtype: dtype.numpy for dtype in DType}


def _ins(b: Builder, node: Node) -> list[str]:
    """The operands; a float param read beside activations of another float type (an f16
    position table added to activations lowered in f32: ``backends.onnx.precision``) cast to
    theirs."""
    floats = {v.dtype for v in node.inputs if v is not None and not isinstance(v, Param) and v.dtype.is_float}
    dtype = next(iter(floats)) if len(floats) == 1 else None
    return [b.weight(v, dtype=dtype) if isinstance(v, Param) and v.dtype.is_float and dtype is not None
            else b.value(v) for v in node.inputs]


# ---- primitives ------------------------------------------------------------------------

def lower_elementwise(b: Builder, node: Node, outs: list[str]) -> None:
    """One standard op per irc op (add -> Add, less -> Less, exp -> Exp, ...)."""
    b.node({**BINARY, **UNARY}[node.op], _ins(b, node), outs)


def lower_rsqrt(b: Builder, node: Node, outs: list[str]) -> None:
    root = b.op("Sqrt", _ins(b, node), f"{outs[0]}/sqrt")
    b.node("Reciprocal", [root], outs)


def silu(b: Builder, x: str, out: str) -> str:
    return b.node("Mul", [x, b.op("Sigmoid", [x], f"{out}/sigmoid")], [out])[0]


def lower_silu(b: Builder, node: Node, outs: list[str]) -> None:
    silu(b, b.value(node.inputs[0]), outs[0])


def lower_gelu(b: Builder, node: Node, outs: list[str]) -> None:
    b.node("Gelu", _ins(b, node), outs, approximate=node.attrs["approximate"])


def softcap(b: Builder, x: str, cap: float, dtype: DType, out: str) -> str:
    """cap * tanh(x / cap)."""
    cap_name = b.const(cap, NUMPY_OF[dtype], f"{out}/cap")
    tanh = b.op("Tanh", [b.op("Div", [x, cap_name], f"{out}/scaled")], f"{out}/tanh")
    return b.node("Mul", [tanh, cap_name], [out])[0]


def lower_softcap(b: Builder, node: Node, outs: list[str]) -> None:
    x = node.inputs[0]
    softcap(b, b.value(x), node.attrs["cap"], x.dtype, outs[0])


def lower_cast(b: Builder, node: Node, outs: list[str]) -> None:
    b.node("Cast", _ins(b, node), outs, to=ONNX_TYPES[DType.parse(node.attrs["to"])])


def lower_constant(b: Builder, node: Node, outs: list[str]) -> None:
    value = np.asarray(node.attrs["value"], dtype=DType.parse(node.attrs["dtype"]).numpy)
    b.node("Identity", [b.const(value, value.dtype, f"{outs[0]}/value")], outs)


def lower_reduce(b: Builder, node: Node, outs: list[str]) -> None:
    axes = b.i64(list(node.attrs["axes"]))
    b.node(REDUCE[node.op], [b.value(node.inputs[0]), axes], outs, keepdims=int(node.attrs["keepdims"]))


def lower_softmax(b: Builder, node: Node, outs: list[str]) -> None:
    b.node("Softmax", _ins(b, node), outs, axis=node.attrs["axis"])


def lower_matmul(b: Builder, node: Node, outs: list[str]) -> None:
    b.node("MatMul", _ins(b, node), outs)


def lower_reshape(b: Builder, node: Node, outs: list[str]) -> None:
    """``Reshape``: to a constant shape where every symbolic dim is the input's own at the same
    index (written 0, ONNX's "copy this dim", with ``allowzero=0``; exact even when that dim
    is 0 at run time): [B, T, 512] -> [B, T, 8, 64] needs no Shape/Concat nodes per step. Else
    the shape is computed from the inputs' dims and ``allowzero=1`` keeps a 0 a 0."""
    x = node.inputs[0]
    copied = copied_shape(x.shape, node.attrs["shape"])
    if copied is not None:
        b.node("Reshape", [b.value(x), b.i64(copied)], outs)
        return
    b.node("Reshape", [b.value(x), b.shape(node.attrs["shape"])], outs, allowzero=1)


def copied_shape(source, target) -> Optional[list]:
    """``target`` with each symbolic dim that equals ``source``'s at its index as 0, when every
    other entry is a positive int and at least one is copied; else None."""
    source = [dims.canonical(d) for d in source]
    target = [dims.canonical(d) for d in target]
    out = []
    for i, d in enumerate(target):
        if isinstance(d, int):
            if d <= 0:
                return None
            out.append(d)
        elif i < len(source) and source[i] == d:
            out.append(0)
        else:
            return None
    return out if 0 in out else None


def lower_expand(b: Builder, node: Node, outs: list[str]) -> None:
    b.node("Expand", [b.value(node.inputs[0]), b.shape(node.attrs["shape"])], outs)


def lower_transpose(b: Builder, node: Node, outs: list[str]) -> None:
    b.node("Transpose", _ins(b, node), outs, perm=list(node.attrs["perm"]))


def lower_slice(b: Builder, node: Node, outs: list[str]) -> None:
    """One ``Slice``; or, when this slice and its siblings (the other slices of the same
    value) tile an axis end to end, one ``Split`` that writes all of them (LFM2's B | C | x
    cut of its in-projection: one node where three were, the siblings then skipped)."""
    parts = tiling_slices(node)
    if parts:
        sizes = [_slice_end(p) - p.attrs["start"] for p in parts]
        b.node("Split", [b.value(node.inputs[0]), b.i64(sizes)], [b.name_for(p.outputs[0]) for p in parts],
               axis=parts[0].attrs["axis"] % node.inputs[0].rank)
        b.handled.update(id(p) for p in parts)
        return
    lower_plain_slice(b, node, outs)


def lower_plain_slice(b: Builder, node: Node, outs: list[str]) -> None:
    """One ``Slice`` (the NPU target's: its HTP compiler takes Slice, not Split)."""
    a = node.attrs
    end = np.iinfo(np.int64).max if a["end"] is None else a["end"]
    slice_(b, b.value(node.inputs[0]), a["start"], end, a["axis"], outs[0])


def _slice_end(node: Node) -> int:
    x, a = node.inputs[0], node.attrs
    length = x.shape[a["axis"]]
    return length if a["end"] is None else min(a["end"], length)


def tiling_slices(node: Node) -> list:
    """The ``slice`` users of ``node``'s input, ordered by start, when there are two or more
    and they cut one static axis into consecutive parts from 0 to its end; else []."""
    x = node.inputs[0]
    axis = node.attrs["axis"] % x.rank
    if not isinstance(x.shape[axis], int):
        return []
    parts = sorted({id(u): u for u in x.uses if u.op == "slice"}.values(), key=lambda u: u.attrs["start"])
    if len(parts) < 2 or any(p.attrs["axis"] % x.rank != axis or p.attrs["start"] < 0
                             or (p.attrs["end"] is not None and p.attrs["end"] < 0) for p in parts):
        return []
    edges = [(p.attrs["start"], _slice_end(p)) for p in parts]
    if edges[0][0] != 0 or edges[-1][1] != x.shape[axis] or any(e <= s for s, e in edges):
        return []
    return parts if all(edges[i][1] == edges[i + 1][0] for i in range(len(edges) - 1)) else []


def slice_(b: Builder, x: str, start: int, end: int, axis: int, out: str) -> str:
    return b.node("Slice", [x, b.i64([start]), b.i64([end]), b.i64([axis])], [out])[0]


def lower_strided_slice(b: Builder, node: Node, outs: list[str]) -> None:
    a = node.attrs
    end = np.iinfo(np.int64).max if a["end"] is None else a["end"]
    b.node("Slice", [b.value(node.inputs[0]), b.i64([a["start"]]), b.i64([end]), b.i64([a["axis"]]),
                     b.i64([a["step"]])], outs)


def _length(b: Builder, x, axis: int, hint: str) -> str:
    """The length of ``x`` along ``axis`` as an int64 scalar."""
    axis %= x.rank
    length = b.op("Shape", [b.value(x)], f"{hint}/length", start=axis, end=axis + 1)
    return b.op("Squeeze", [length, b.i64([0])], f"{hint}/length_scalar")


def lower_dim_size(b: Builder, node: Node, outs: list[str]) -> None:
    b.node("Identity", [_length(b, node.inputs[0], node.attrs["axis"], outs[0])], outs)


def lower_range_like(b: Builder, node: Node, outs: list[str]) -> None:
    """0, 1, ..., n-1 for the length n of x along ``axis``."""
    b.node("Range", [b.i64(0), _length(b, node.inputs[0], node.attrs["axis"], outs[0]), b.i64(1)], outs)


def lower_concat(b: Builder, node: Node, outs: list[str]) -> None:
    b.node("Concat", _ins(b, node), outs, axis=node.attrs["axis"])


def lower_gather(b: Builder, node: Node, outs: list[str]) -> None:
    b.node("Gather", _ins(b, node), outs, axis=node.attrs["axis"])


def lower_scatter_add(b: Builder, node: Node, outs: list[str]) -> None:
    data, indices, updates = _ins(b, node)
    rows = b.op("Unsqueeze", [indices, b.i64([-1])], f"{outs[0]}/rows")
    b.node("ScatterND", [data, rows, updates], outs, reduction="add")


def lower_topk(b: Builder, node: Node, outs: list[str]) -> None:
    """TopK keeps the lower index first among equal values, as the reference does."""
    a = node.attrs
    b.node("TopK", [b.value(node.inputs[0]), b.i64([a["k"]])], outs, axis=a["axis"], largest=int(a["largest"]),
           sorted=1)


def lower_argsort(b: Builder, node: Node, outs: list[str]) -> None:
    """A stable ascending argsort is TopK(smallest, k = the whole axis)."""
    x = node.inputs[0]
    axis = node.attrs["axis"] % x.rank
    values = b.fresh(f"{outs[0]}/sorted")
    b.node("TopK", [b.value(x), b.dim(x.shape[axis])], [values, outs[0]], axis=axis, largest=0, sorted=1)


# ---- dense model ops -------------------------------------------------------------------

def lower_embedding(b: Builder, node: Node, outs: list[str]) -> None:
    ids, table = node.inputs
    out = node.outputs[0]
    rows = b.value(table) if table.dtype.is_float else b.weight(table, dtype=DType.f32)
    if node.attrs["scale"] is None:
        b.node("Gather", [rows, b.value(ids)], outs, axis=0)
        return
    gathered = b.op("Gather", [rows, b.value(ids)], f"{outs[0]}/rows", axis=0)
    b.node("Mul", [gathered, b.const(node.attrs["scale"], out.dtype.numpy, f"{outs[0]}/scale")], outs)


def norm_scale(b: Builder, weight: Param, offset: float, dtype: DType, hint: str) -> str:
    """The norm's multiplier: the weight in the activation's type, plus ``offset`` (Gemma)."""
    scale = b.weight(weight, dtype=dtype)
    if not offset:
        return scale
    def add_offset():
        return b.op("Add", [scale, b.const(offset, dtype.numpy, f"{hint}/offset")], f"{weight.name}.scale")

    return b.cached(("norm-scale", weight.name, offset, dtype), add_offset)


def rms_norm(b: Builder, x: str, weight: Param, eps: float, offset: float, dtype: DType, out: str) -> str:
    """RMSNormalization at opset 23; before it, the same math as primitives (float32 inside,
    as the reference computes it)."""
    scale = norm_scale(b, weight, offset, dtype, out)
    if b.opset >= 23:
        return b.node("RMSNormalization", [x, scale], [out], axis=-1, epsilon=float(eps), stash_type=1)[0]
    x32 = x if dtype == DType.f32 else b.op("Cast", [x], f"{out}/f32", to=TensorProto.FLOAT)
    mean = b.op("ReduceMean", [b.op("Mul", [x32, x32], f"{out}/square"), b.i64([-1])], f"{out}/mean_square",
                keepdims=1)
    shifted = b.op("Add", [mean, b.const(eps, np.float32, f"{out}/eps")], f"{out}/mean_square_eps")
    inv = b.op("Reciprocal", [b.op("Sqrt", [shifted], f"{out}/rms")], f"{out}/inv_rms")
    normed = b.op("Mul", [x32, inv], f"{out}/normed")
    if dtype != DType.f32:
        normed = b.op("Cast", [normed], f"{out}/cast", to=ONNX_TYPES[dtype])
    return b.node("Mul", [normed, scale], [out])[0]


def lower_rms_norm(b: Builder, node: Node, outs: list[str]) -> None:
    if b.opset < 23:
        raise BackendError(f"rms_norm needs RMSNormalization (opset 23); opset {b.opset} cannot express it",
                           hint="run the lower-norms pass first (the default pipeline for opsets 21 and 22 "
                                "does), or compile with --opset 23")
    x, weight = node.inputs
    rms_norm(b, b.value(x), weight, node.attrs["eps"], node.attrs["offset"], x.dtype, outs[0])


def lower_layer_norm(b: Builder, node: Node, outs: list[str]) -> None:
    x, weight, bias = pad_inputs(node.inputs, 3)
    inputs = [b.value(x), b.weight(weight, dtype=x.dtype)] + ([b.weight(bias, dtype=x.dtype)] if bias else [])
    b.node("LayerNormalization", inputs, outs, axis=-1, epsilon=float(node.attrs["eps"]), stash_type=1)


def linear(b: Builder, x: str, dtype: DType, weight: Value, bias, out: str) -> str:
    """x @ weight.T (+ bias) for x [..., in] of type ``dtype``; writes ``out``. A weight that
    is not a param (a ``dequantize`` result) is transposed in the graph (``backends.onnx.quant``)."""
    product = out if bias is None else b.fresh(f"{out}/matmul")
    if not isinstance(weight, Param):
        from backends.onnx.quant import matmul_nbits, transposed_weight

        if not matmul_nbits(b, x, dtype, weight, product):
            b.node("MatMul", [x, transposed_weight(b, weight)], [product])
    elif not b.cached(("matrix-only", weight.name), lambda: only_matrix_uses(weight)):
        shared_linear(b, x, dtype, weight, product)  # a tied head: --tied-head's layout
    elif b.flavour == "ort" and dtype == DType.f32:
        stored_matmul(b, x, b.weight(weight, dtype=dtype), product)
    else:
        b.node("MatMul", [x, b.weight(weight, "transposed", dtype)], [product])
    if bias is not None:
        b.node("Add", [product, b.weight(bias, dtype=dtype)], [out])
    return out


def stored_matmul(b: Builder, x: str, weight: str, out: str) -> str:
    """x @ weight.T for an f32 initializer ``weight`` as the checkpoint stores it, [out, in]:
    ``com.microsoft.FusedMatMul(transB=1)`` (onnx-ort). ONNX Runtime packs the weight at
    session load whichever way it is stored (``MatMul`` and ``FusedMatMul`` share the float
    kernel and its pre-packing), so the compile copies every float weight as it is instead of
    transposing it: on Qwen2.5-Coder-0.5B (2.5 GB of f32) the transposes were most of the
    compile's CPU time (``benchmarks/compile_time.py``)."""
    return b.node("FusedMatMul", [x, weight], [out], domain=MS_DOMAIN, transB=1)[0]


def tied_head_layout(b: Builder, dtype: DType) -> str:
    """How ``shared_linear`` reads its weight: ``b.tied_head``, or for ``auto`` the layout
    measured fastest (``benchmarks/cpu_speed.py``, Gemma-3-270M): ``fused`` for onnx-ort in
    f32/f16, else ``transpose`` (its peak memory in a 1,024-token prefill was 2.4 GB against
    4.0 GB for ``gemm``, whose Reshape copies the 1 GB of logits)."""
    if b.tied_head != "auto":
        return b.tied_head
    return "fused" if b.flavour == "ort" and dtype in (DType.f32, DType.f16) else "transpose"


def shared_linear(b: Builder, x: str, dtype: DType, weight: Param, out: str) -> str:
    """x @ weight.T for a weight also read another way (a head tied to the embedding), so
    stored once, [out, in]. Layouts (``--tied-head``, measured in ``benchmarks/cpu_speed.py``):

    - ``fused``: ``com.microsoft.FusedMatMul(transB=1)`` on x [..., in]: no copy in the graph;
    - ``gemm``: ``Gemm(transB=1)`` on x flattened to rows, reshaped back. When the result is a
      graph output (the logits), ONNX Runtime copies it in that last Reshape;
    - ``transpose``: a ``Transpose`` node on the weight feeding ``MatMul``: ONNX Runtime folds
      it once at load, so the file keeps one copy.

    In memory ORT's weight pre-packing decides: Gemma-3-270M (a 671 MB tied table) peaks at
    2116 MB with ``fused`` or ``gemm`` and 1756 MB with ``transpose``, which prefills 1.04x
    slower; ``fused`` is the fastest, hence onnx-ort's default."""
    layout = tied_head_layout(b, dtype)
    stored = b.weight(weight, dtype=dtype)
    if layout == "fused":
        if b.flavour != "ort":
            raise BackendError("--tied-head fused needs com.microsoft.FusedMatMul", hint="use --target onnx-ort")
        return stored_matmul(b, x, stored, out)
    if layout == "transpose":
        flipped = b.cached(("transpose-node", weight.name, dtype), lambda: b.op("Transpose", [stored],
                                                                                 f"{weight.name}.T", perm=[1, 0]))
        return b.node("MatMul", [x, flipped], [out])[0]
    rows = b.op("Reshape", [x, b.i64([-1, weight.shape[1]])], f"{out}/rows")
    flat = b.op("Gemm", [rows, stored], f"{out}/gemm", transB=1)
    lead = b.op("Shape", [x], f"{out}/lead_shape", start=0, end=-1)
    shape = b.op("Concat", [lead, b.i64([weight.shape[0]])], f"{out}/shape", axis=0)
    return b.node("Reshape", [flat, shape], [out])[0]


def lower_linear(b: Builder, node: Node, outs: list[str]) -> None:
    x, weight, bias = pad_inputs(node.inputs, 3)
    linear(b, b.value(x), x.dtype, weight, bias, outs[0])


def activation(b: Builder, kind: str, x: str, out: str) -> str:
    """silu, gelu (erf) or gelu_tanh of x."""
    if kind == "silu":
        return silu(b, x, out)
    approximate = {"gelu": "none", "gelu_tanh": "tanh"}[kind]
    return b.node("Gelu", [x], [out], approximate=approximate)[0]


def gated_mlp(b: Builder, x: str, dtype: DType, gate: Param, up: Param, down: Param, kind: str, out: str) -> str:
    """down(act(gate(x)) * up(x))."""
    g = linear(b, x, dtype, gate, None, b.fresh(f"{out}/gate"))
    u = linear(b, x, dtype, up, None, b.fresh(f"{out}/up"))
    hidden = b.op("Mul", [activation(b, kind, g, b.fresh(f"{out}/act")), u], f"{out}/hidden")
    return linear(b, hidden, dtype, down, None, out)


def lower_gated_mlp(b: Builder, node: Node, outs: list[str]) -> None:
    x, gate, up, down = node.inputs
    kind = "silu" if node.op == "swiglu" else ("gelu_tanh" if node.attrs["approximate"] == "tanh" else "gelu")
    gated_mlp(b, b.value(x), x.dtype, gate, up, down, kind, outs[0])


def lower_gelu_mlp(b: Builder, node: Node, outs: list[str]) -> None:
    x, up, down, b_up, b_down = pad_inputs(node.inputs, 5)
    hidden = linear(b, b.value(x), x.dtype, up, b_up, b.fresh(f"{outs[0]}/up"))
    kind = "gelu_tanh" if node.attrs["approximate"] == "tanh" else "gelu"
    act = activation(b, kind, hidden, b.fresh(f"{outs[0]}/act"))
    linear(b, act, x.dtype, down, b_down, outs[0])


LOWERINGS = {
    **{op: lower_elementwise for op in (*BINARY, *UNARY)},
    "rsqrt": lower_rsqrt, "silu": lower_silu, "gelu": lower_gelu, "softcap": lower_softcap, "cast": lower_cast,
    "constant": lower_constant, **{op: lower_reduce for op in REDUCE}, "softmax": lower_softmax,
    "matmul": lower_matmul, "reshape": lower_reshape, "expand": lower_expand, "transpose": lower_transpose,
    "slice": lower_slice, "strided_slice": lower_strided_slice, "dim_size": lower_dim_size,
    "range_like": lower_range_like, "concat": lower_concat, "gather": lower_gather, "scatter_add": lower_scatter_add,
    "topk": lower_topk, "argsort": lower_argsort,
    "embedding": lower_embedding, "rms_norm": lower_rms_norm, "layer_norm": lower_layer_norm,
    "linear": lower_linear, "swiglu": lower_gated_mlp, "geglu": lower_gated_mlp, "gelu_mlp": lower_gelu_mlp,
    **VISION_LOWERINGS,
}
