"""Tiled matmul kernels: ``out = epilogue(a @ w.T)`` with w in checkpoint layout [N, K].

One generator serves the dense projections (``linear``), the gated MLPs (two weights in
one K loop, the GLU in the epilogue: ``swiglu``, ``geglu`` and the decomposed
``mul(act(linear), linear)``), the MoE grouped GEMM over sorted segments
(``backends.triton.kernels.moe``) and the int8/int4 dequant matmul
(``backends.triton.kernels.dequant``): they differ in how a program finds its rows and
weight (``Mapping``), how a weight tile is loaded (``weight_load``) and the epilogue.

Programs walk output tiles in grouped order (GROUP_M row tiles share a band of weight
columns, so the weight stays in L2 while those rows pass); block sizes come from an
autotune config list (``MATMUL_CONFIGS`` in the emitted module; one config under the
interpreter). Accumulation is fp32; fp32 inputs use ``input_precision=PRECISION``
("ieee" by default, matching the reference; "tf32" trades ~1e-3 for tensor cores). With
the MIXED constexpr (the module's ``MIXED_DOT``) both tiles go to the tensor cores in 16
bits: the weights' type (bf16 for int8/int4 and fp32 weights), as bf16 models on a GPU want.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from irc.dtypes import DType

from backends.triton.kernels import Kernel, docstring, dot, indent, mixed_type, parameter_lines, signature_type

# the emitted module's autotune lists (GPU); the interpreter gets INTERPRETER_CONFIG alone
CONFIGS_TEXT = '''MATMUL_CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=4, num_warps=8),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8}, num_stages=3, num_warps=4),
    # decode: a few rows, long weights -- narrow row tiles, deep K tiles
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "GROUP_M": 1}, num_stages=4, num_warps=4),
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 1}, num_stages=4, num_warps=4),
]
if INTERPRETED:  # the interpreter pays per program and per loop step: one large config
    MATMUL_CONFIGS = [triton.Config({"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 1})]'''
FIRST_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8}  # compile checks


@dataclass
class EpilogueInput:
    """An extra operand of the epilogue: ``vector`` [N] per column, ``rowscalar`` [M] per
    output row, ``tile`` [M, N] (row stride given)."""

    var: str
    kind: str
    dtype: DType


@dataclass
class Mapping:
    """How programs map to output tiles.

    ``dense``: grouped ordering over an [M, N] output. ``grouped``: the MoE segment GEMM,
    program axis 0 = (expert, row tile inside the expert's segment ``indptr[e]:indptr[e+1]``),
    axis 1 = column tile; a program past its segment's end returns at once. ``row_index``
    reads A's rows through an index vector (the MoE gather fused into the load);
    ``scatter`` adds each output row into ``out[scatter_index[row]]`` atomically (the
    MoE weighted scatter-add fused into the store)."""

    kind: str = "dense"
    row_index: bool = False
    scatter: bool = False


@dataclass
class GemmSpec:
    name: str
    summary: str
    a_dtype: DType
    w_dtype: DType
    out_dtype: DType
    dual: bool = False                                   # a second weight (w2), accumulator acc2
    epilogue: list = field(default_factory=list)         # lines making `out` from acc (and acc2)
    inputs: list = field(default_factory=list)           # EpilogueInput
    mapping: Mapping = field(default_factory=Mapping)
    weight_params: list = field(default_factory=list)    # dequant: per-weight (name, sig type, launch expr)
    weight_load: list = field(default_factory=list)      # dequant: lines making `w` [BLOCK_K, BLOCK_N]
    n_expr: str = "w.shape[-2]"                          # launcher: N from the weight
    stride_expr: str = "{w}.stride(-2)"                  # launcher: the weight's stride between outputs
    details: list = field(default_factory=list)


def _weight_lines(spec: GemmSpec, suffix: str) -> list[str]:
    """Lines loading one weight tile [BLOCK_K, BLOCK_N] into ``w{suffix}`` (w is [N, K])."""
    if spec.weight_load:
        return [line.replace("{w}", f"w{suffix}") for line in spec.weight_load]
    return [f"w{suffix} = tl.load(w{suffix}_base + rk[:, None] + k0, mask=k_ok[:, None] & n_ok[None, :], other=0.0)"]


def _signature(spec: GemmSpec, weights: list[str]) -> dict:
    """The kernel's parameters: pointers, sizes and strides, then the constexpr tiles."""
    mapping = spec.mapping
    sig = {"a_ptr": "*" + signature_type(spec.a_dtype)}
    for w in weights:
        sig[f"{w}_ptr"] = "*" + signature_type(spec.w_dtype)
        for name, kind, _ in spec.weight_params:
            sig[f"{w}_{name}"] = kind
    sig["c_ptr"] = "*" + signature_type(spec.out_dtype)
    if mapping.kind == "grouped":
        sig["indptr_ptr"] = "*i64"
    if mapping.row_index:
        sig["row_index_ptr"] = "*i64"
    if mapping.scatter:
        sig["scatter_index_ptr"] = "*i64"
    for item in spec.inputs:
        sig[f"{item.var}_ptr"] = "*" + signature_type(item.dtype)
    sig.update({"M": "i32", "N": "i32", "K": "i32", "stride_am": "i32"})
    for w in weights:
        sig[f"stride_{w}n"] = "i32"
        if mapping.kind == "grouped":
            sig[f"stride_{w}e"] = "i32"
    sig["stride_cm"] = "i32"
    for item in spec.inputs:
        if item.kind != "vector":
            sig[f"stride_{item.var}"] = "i32"
    sig.update({name: "constexpr" for name in ("PRECISION", "MIXED", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")})
    return sig


def _epilogue_lines(spec: GemmSpec) -> list[str]:
    """After the K loop: the epilogue inputs loaded, ``spec.epilogue`` making ``out``, and
    the store (an atomic scatter-add for a MoE down projection)."""
    mapping = spec.mapping
    body = []
    for item in spec.inputs:
        v = item.var
        if item.kind == "vector":
            body.append(f"{v} = tl.load({v}_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]")
        elif item.kind == "rowscalar":
            body.append(f"{v} = tl.load({v}_ptr + rm * stride_{v}, mask=m_ok, other=0.0).to(tl.float32)[:, None]")
        else:
            body.append(f"{v} = tl.load({v}_ptr + rm[:, None] * stride_{v} + rn[None, :], "
                        f"mask=m_ok[:, None] & n_ok[None, :], other=0.0).to(tl.float32)")
    body += list(spec.epilogue) or ["out = acc"]
    if mapping.scatter:
        body += ["out_row = tl.load(scatter_index_ptr + rm, mask=m_ok, other=0)",
                 "tl.atomic_add(c_ptr + out_row[:, None] * stride_cm + rn[None, :], "
                 "out.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])"]
    else:
        body.append("tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :], out.to(c_ptr.dtype.element_ty), "
                    "mask=m_ok[:, None] & n_ok[None, :])")
    return body


def gemm_kernel(spec: GemmSpec) -> Kernel:
    """The kernel ``spec`` describes: grouped program order (or one expert segment per row
    tile), fp32 accumulation over K, then the epilogue and the store."""
    mapping = spec.mapping
    weights = ["w", "w2"] if spec.dual else ["w"]
    sig = _signature(spec, weights)

    if mapping.kind == "dense":
        body = ["pid = tl.program_id(0)",
                "num_m = tl.cdiv(M, BLOCK_M)",
                "num_n = tl.cdiv(N, BLOCK_N)",
                "per_group = GROUP_M * num_n",
                "first_m = (pid // per_group) * GROUP_M",
                "size_m = tl.minimum(num_m - first_m, GROUP_M)",
                "pid_m = first_m + (pid % per_group) % size_m",
                "pid_n = (pid % per_group) // size_m",
                "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
                "m_ok = rm < M"]
        expert = ""
    else:
        body = ["tiles = tl.cdiv(M, BLOCK_M)",
                "expert = tl.program_id(0) // tiles",
                "start = tl.load(indptr_ptr + expert).to(tl.int32)",
                "end = tl.load(indptr_ptr + expert + 1).to(tl.int32)",
                "row0 = start + (tl.program_id(0) % tiles) * BLOCK_M",
                "if row0 >= end:",
                "    return",
                "pid_n = tl.program_id(1)",
                "rm = row0 + tl.arange(0, BLOCK_M)",
                "m_ok = rm < end"]
        expert = "expert * stride_{w}e + "
    body += ["rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
             "rk = tl.arange(0, BLOCK_K)",
             "n_ok = rn < N"]
    if mapping.row_index:
        body.append("a_row = tl.load(row_index_ptr + rm, mask=m_ok, other=0)")
        body.append("a_base = a_ptr + a_row[:, None] * stride_am + rk[None, :]")
    else:
        body.append("a_base = a_ptr + rm[:, None] * stride_am + rk[None, :]")
    for w in weights:
        if not spec.weight_load:
            body.append(f"{w}_base = {w}_ptr + {expert.format(w=w)}rn[None, :] * stride_{w}n")
        else:
            body.append(f"{w}_offset = {expert.format(w=w)}0")
    body += ["acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"]
    if spec.dual:
        body.append("acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")
    loop = ["k_ok = (k0 + rk) < K",
            "a = tl.load(a_base + k0, mask=m_ok[:, None] & k_ok[None, :], other=0.0)"]
    for w, acc in zip(weights, ["acc", "acc2"]):
        suffix = w[1:]
        loop += _weight_lines(spec, suffix)
        loop += dot("a", w, acc, mixed_type(spec.w_dtype if spec.w_dtype.is_float else spec.a_dtype))
    body += ["for k0 in range(0, K, BLOCK_K):", *indent(loop, 1)]
    body += _epilogue_lines(spec)

    restore = ', restore_value=["c_ptr"]' if mapping.scatter else ""
    details = list(spec.details) + [
        "Output tiles [BLOCK_M, BLOCK_N], fp32 accumulation over BLOCK_K steps;",
        "grouped program order." if mapping.kind == "dense" else "a row tile lies in one expert's segment."]
    source = "\n".join([f'@triton.autotune(configs=MATMUL_CONFIGS, key=["M", "N", "K"]{restore})', "@triton.jit",
                        f"def {spec.name}(",
                        *indent(parameter_lines(sig), 1),
                        "):", docstring(spec.summary, details), *indent(body, 1)])
    constexprs = {"PRECISION": "ieee", "MIXED": False, **FIRST_CONFIG}
    return Kernel(spec.name, "moe" if spec.mapping.kind == "grouped" else "matmul", source,
                  _launcher(spec, weights), sig, constexprs, tensor_cores=True)


def _launcher(spec: GemmSpec, weights: list[str]) -> str:
    """def launch_<name>(a, w[, w2], out, [indptr, row_index, scatter_index], *extras, M=None)."""
    mapping = spec.mapping
    grouped = mapping.kind == "grouped"
    args = ["a"] + weights + ["out"]
    if mapping.kind == "grouped":
        args.append("indptr")
    if mapping.row_index:
        args.append("row_index")
    if mapping.scatter:
        args.append("scatter_index")
    args += [item.var for item in spec.inputs]
    weight_args = []
    for w in weights:
        weight_args.append(w)
        weight_args += [expr.format(w=w) for _, _, expr in spec.weight_params]
    call = ["a2"] + weight_args + ["c2"]
    call += [name for name in ("indptr", "row_index", "scatter_index") if name in args]
    call += [item.var for item in spec.inputs]
    call += ["M", "N", "K", "a2.stride(0)"]
    for w in weights:
        call.append(spec.stride_expr.format(w=w))
        if mapping.kind == "grouped":
            call.append(f"{w}.stride(0)")
    call.append("c2.stride(0)")
    call += [f"{item.var}.stride(0)" for item in spec.inputs if item.kind != "vector"]
    extra = [expr.format(w=w) for w in weights for _, _, expr in spec.weight_params]
    extra = [name for name in extra if name.isidentifier()]  # scales/zero points; strides are computed
    lines = [f"def launch_{spec.name}({', '.join(args + extra)}):",
             '    """a [..., K] (rows contiguous in K); w [N, K]' + (" per expert: [E, N, K]" if grouped else "")
             + '; out [..., N]."""',
             "    K = a.shape[-1]",
             "    a2 = a.reshape(-1, K)",
             "    c2 = out.view(-1, out.shape[-1])",
             f"    M, N = {'a2.shape[0]' if not mapping.row_index else 'row_index.shape[0]'}, "
             f"{spec.n_expr}"]
    if mapping.kind == "grouped":
        lines += ["    experts = indptr.shape[0] - 1",
                  "",
                  "    def grid(meta):",
                  '        return (experts * triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))',
                  ""]
    else:
        lines += ["",
                  "    def grid(meta):",
                  '        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)',
                  ""]
    lines += [f"    {spec.name}[grid](",
              *indent([", ".join(call[i:i + 8]) + "," for i in range(0, len(call), 8)], 2),
              "        PRECISION=DOT_PRECISION, MIXED=MIXED_DOT)"]
    return "\n".join(lines)
