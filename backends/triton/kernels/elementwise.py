"""Elementwise math as Triton expressions, and the fused row kernel.

A chain of row-wise ops (elementwise ops, norms, an embedding gather at its head) over
rows of one length D becomes one ``row kernel``: each program loads a [BLOCK_R, BLOCK_D]
tile of every operand once, runs the whole chain in fp32 registers, and stores only the
values read outside the chain. Operands come in five kinds:

- ``rows``: an activation, a [R0, R1, D] view with any strides for R0 and R1 (last stride
  1), so a slice of a wider buffer or a window of a KV cache can be read or written;
- ``vector``: a [D] weight broadcast over rows (norm weights, biases);
- ``rowscalar``: a [R0, R1, 1] view, one value per row (MoE gating weights, a gate score);
- ``scalar``: a 0-d tensor broadcast over the tile (a constant: the zero of Nemotron-H's relu²);
- ``gather``: rows of a [V, D] table picked by integer ids [R0, R1] (the embedding lookup).

Expressions here are also the epilogues of the matmul kernels (``expression``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from irc.dtypes import DType

from backends.triton.kernels import Kernel, docstring, indent, parameter_lines, round_to, signature_type

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

# tanh through exp (exact at +-inf, absolute error ~1e-7 near 0): Triton has no tl.tanh
TANH_HELPER = '''@triton.jit
def tanh_f32(x):
    """tanh(x) = 1 - 2 / (exp(2x) + 1), in fp32."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)'''

UNARY = {
    "exp": "tl.exp({x})",
    "tanh": "tanh_f32({x})",
    "sqrt": "tl.sqrt_rn({x})",
    "rsqrt": "(1.0 / tl.sqrt_rn({x}))",
    "sigmoid": "(1.0 / (1.0 + tl.exp(-{x})))",
    "silu": "({x} / (1.0 + tl.exp(-{x})))",
    "cos": "tl.cos({x})",
    "sin": "tl.sin({x})",
    "log": "tl.log({x})",
    "neg": "(-{x})",
}
BINARY = {"add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "div": "({a} / {b})",
          "maximum": "tl.maximum({a}, {b})"}
ELEMENTWISE = set(UNARY) | set(BINARY) | {"gelu", "softcap", "cast"}
FLOAT_CASTS = ("f32", "f16", "bf16")


def supports(op: str, attrs: dict) -> bool:
    """Whether ``expression`` can write ``op`` (casts only between float types)."""
    return op in ELEMENTWISE and (op != "cast" or attrs.get("to") in FLOAT_CASTS)


def expression(op: str, attrs: dict, args: list[str], result: DType) -> str:
    """The fp32 Triton expression of elementwise ``op`` over operand expressions ``args``,
    rounded to ``result`` as the reference rounds each node's output."""
    if op in UNARY:
        text = UNARY[op].format(x=args[0])
    elif op in BINARY:
        text = BINARY[op].format(a=args[0], b=args[1])
    elif op == "gelu":
        x = args[0]
        if attrs.get("approximate") == "tanh":
            text = f"(0.5 * {x} * (1.0 + tanh_f32({SQRT_2_OVER_PI!r} * ({x} + 0.044715 * {x} * {x} * {x}))))"
        else:
            text = f"(0.5 * {x} * (1.0 + tl.erf({x} * {1 / math.sqrt(2.0)!r})))"
    elif op == "softcap":
        cap = float(attrs["cap"])
        text = f"({cap!r} * tanh_f32({args[0]} / {cap!r}))"
    elif op == "cast":
        text = args[0]
        result = DType.parse(attrs["to"])
    else:
        raise KeyError(op)
    return round_to(text, result)


def uses_tanh(text: str) -> bool:
    return "tanh_f32(" in text


# ---- the row kernel -------------------------------------------------------------------------

@dataclass
class RowInput:
    """An operand of a row kernel: ``kind`` is rows, vector, rowscalar, scalar or gather (see
    the module docstring); ``var`` the fp32 register tile it is loaded into."""

    var: str
    kind: str
    dtype: DType
    index_dtype: DType = DType.i64  # gather: the ids' type


@dataclass
class RowOutput:
    var: str
    dtype: DType


def _params(inputs: list[RowInput], outputs: list[RowOutput]) -> tuple[list[str], dict]:
    params, signature = [], {}

    def add(name, kind):
        params.append(name)
        signature[name] = kind

    for item in inputs:
        if item.kind == "gather":
            add(f"{item.var}_ids", "*" + signature_type(item.index_dtype))
            add(f"{item.var}_ids_s0", "i32")
            add(f"{item.var}_ids_s1", "i32")
            add(f"{item.var}_table", "*" + signature_type(item.dtype))
            add(f"{item.var}_table_s0", "i32")
        elif item.kind in ("vector", "scalar"):
            add(f"{item.var}_ptr", "*" + signature_type(item.dtype))
        else:
            add(f"{item.var}_ptr", "*" + signature_type(item.dtype))
            add(f"{item.var}_s0", "i32")
            add(f"{item.var}_s1", "i32")
    for item in outputs:
        add(f"{item.var}_out", "*" + signature_type(item.dtype))
        add(f"{item.var}_out_s0", "i32")
        add(f"{item.var}_out_s1", "i32")
    for name in ("R", "INNER", "D"):
        add(name, "i32")
    add("BLOCK_R", "constexpr")
    add("BLOCK_D", "constexpr")
    return params, signature


def _load(item: RowInput) -> list[str]:
    v = item.var
    if item.kind == "rows":
        return [f"{v} = tl.load({v}_ptr + (r0 * {v}_s0 + r1 * {v}_s1)[:, None] + cols[None, :], mask=tile_ok, "
                "other=0.0)",
                f"{v} = {v}.to(tl.float32)"]
    if item.kind == "vector":
        return [f"{v} = tl.load({v}_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]"]
    if item.kind == "scalar":
        return [f"{v} = tl.load({v}_ptr).to(tl.float32)"]
    if item.kind == "rowscalar":
        return [f"{v} = tl.load({v}_ptr + r0 * {v}_s0 + r1 * {v}_s1, mask=row_ok, other=0.0).to(tl.float32)[:, None]"]
    if item.kind == "gather":
        return [f"{v}_row = tl.load({v}_ids + r0 * {v}_ids_s0 + r1 * {v}_ids_s1, mask=row_ok, other=0)",
                f"{v} = tl.load({v}_table + ({v}_row.to(tl.int64) * {v}_table_s0)[:, None] + cols[None, :], "
                f"mask=tile_ok, other=0.0)",
                f"{v} = {v}.to(tl.float32)"]
    raise ValueError(item.kind)


def row_kernel(name: str, summary: str, inputs: list[RowInput], steps: list[str], outputs: list[RowOutput],
               details: list[str] = ()) -> Kernel:
    """A kernel that runs ``steps`` (lines over fp32 tiles; ``tile_ok``, ``col_ok``, ``D``
    are in scope) on every row and stores ``outputs``.

    The launch helper takes (R0, R1, D) and one tensor per operand and output, in order:
    rows/rowscalar/outputs as [R0, R1, D] (or [R0, R1, 1]) views, vectors as [D], scalars as
    0-d tensors, a gather operand as (ids [R0, R1], table [V, D])."""
    params, signature = _params(inputs, outputs)
    body = ["rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)",
            "cols = tl.arange(0, BLOCK_D)",
            "r0 = rows // INNER",
            "r1 = rows % INNER",
            "row_ok = rows < R",
            "col_ok = cols < D",
            "tile_ok = row_ok[:, None] & col_ok[None, :]"]
    for item in inputs:
        body += _load(item)
    body += list(steps)
    for item in outputs:
        v = item.var
        body.append(f"tl.store({v}_out + (r0 * {v}_out_s0 + r1 * {v}_out_s1)[:, None] + cols[None, :], "
                    f"{v}.to({v}_out.dtype.element_ty), mask=tile_ok)")
    source = "\n".join(["@triton.jit", f"def {name}(", *indent(parameter_lines(signature), 1),
                        "):", docstring(summary, list(details) + [
                            "One program per BLOCK_R rows; fp32 registers; stores only what is read later."]),
                        *indent(body, 1)])
    args, call = [], []
    for item in inputs:
        if item.kind == "gather":
            args += [f"{item.var}_ids", f"{item.var}_table"]
            call += [f"{item.var}_ids", f"{item.var}_ids.stride(0)", f"{item.var}_ids.stride(1)",
                     f"{item.var}_table", f"{item.var}_table.stride(0)"]
        elif item.kind in ("vector", "scalar"):
            args.append(item.var)
            call.append(item.var)
        else:
            args.append(item.var)
            call += [item.var, f"{item.var}.stride(0)", f"{item.var}.stride(1)"]
    for item in outputs:
        args.append(f"{item.var}_out")
        call += [f"{item.var}_out", f"{item.var}_out.stride(0)", f"{item.var}_out.stride(1)"]
    launcher = "\n".join([
        f"def launch_{name}(R0, R1, D, {', '.join(args)}):",
        '    """Operands and outputs as the kernel docstring lists them: [R0, R1, D] views."""',
        "    block_d = triton.next_power_of_2(D)",
        "    block_r = max(1, min(64, ROW_TILE // block_d))",
        "    rows = R0 * R1",
        f"    {name}[(triton.cdiv(rows, block_r),)](",
        *indent([", ".join(call[i:i + 6]) + "," for i in range(0, len(call), 6)], 2),
        "        rows, R1, D, BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4 if block_r * block_d <= 2048 else 8)",
    ])
    return Kernel(name, "row", source, launcher, signature, {"BLOCK_R": 4, "BLOCK_D": 128})
