"""RoPE kernels: rotate q/k head tiles in place, or write them rotated into the KV cache.

``rope`` rotates each head of x [B, T, heads, W] (a view: the heads of a q/k projection,
or the RoPE slice of a wider head, as in MLA) by cos/sin [B, T, R/2] (one angle per
rotated pair, ``irc.ops.rope`` conventions):

- ``half``: pairs (i, i + R/2) (HF ``rotate_half``);
- ``interleaved``: pairs (2i, 2i + 1).

Each program holds both members of every pair it rotates in the same lanes, so rotating
in place (out is x) is race-free; written out of place (into the present KV cache), the
W - R pass-through dims are copied as well. ``store_heads`` is the copy alone: new V rows
into the cache. The cos/sin tables are computed once per forward per RoPE configuration
by the launcher (torch.cos/sin over position_ids x inv_freq, in fp32 as the reference).
"""
from __future__ import annotations

from irc.dtypes import DType

from backends.triton.kernels import Kernel, docstring, indent, parameter_lines, signature_type

CONVENTIONS = ("half", "interleaved")


def _signature(dtype: DType, rotate: bool) -> dict:
    sig = {"x_ptr": "*" + signature_type(dtype), "o_ptr": "*" + signature_type(dtype)}
    if rotate:
        sig.update({"cos_ptr": "*fp32", "sin_ptr": "*fp32"})
    sig.update({name: "i32" for name in ("sx_b", "sx_t", "sx_h", "so_b", "so_t", "so_h")})
    if rotate:
        sig.update({"sc_b": "i32", "sc_t": "i32", "HALF": "i32"})
    sig.update({"T": "i32", "HEADS": "i32", "ROWS": "i32", "REST": "i32", "BLOCK_R": "constexpr"})
    if rotate:
        sig.update({"BLOCK_HALF": "constexpr", "COPY_REST": "constexpr"})
    sig["BLOCK_REST"] = "constexpr"
    return sig


def _rows() -> list[str]:
    return ["rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)",
            "row_ok = rows < ROWS",
            "h = rows % HEADS",
            "t = (rows // HEADS) % T",
            "b = rows // (HEADS * T)",
            "x_row = x_ptr + b * sx_b + t * sx_t + h * sx_h",
            "o_row = o_ptr + b * so_b + t * so_t + h * so_h"]


def rope_kernel(name: str, convention: str, dtype: DType) -> Kernel:
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown rope convention {convention!r}")
    first, second = ("i", "i + HALF") if convention == "half" else ("2 * i", "2 * i + 1")
    body = _rows() + [
        "i = tl.arange(0, BLOCK_HALF)",
        "ok = row_ok[:, None] & (i < HALF)[None, :]",
        f"first = ({first})[None, :]",
        f"second = ({second})[None, :]",
        "x1 = tl.load(x_row[:, None] + first, mask=ok, other=0.0).to(tl.float32)",
        "x2 = tl.load(x_row[:, None] + second, mask=ok, other=0.0).to(tl.float32)",
        "table = (b * sc_b + t * sc_t)[:, None] + i[None, :]",
        "c = tl.load(cos_ptr + table, mask=ok, other=0.0)",
        "s = tl.load(sin_ptr + table, mask=ok, other=0.0)",
        "tl.store(o_row[:, None] + first, (x1 * c - x2 * s).to(o_ptr.dtype.element_ty), mask=ok)",
        "tl.store(o_row[:, None] + second, (x2 * c + x1 * s).to(o_ptr.dtype.element_ty), mask=ok)",
        "if COPY_REST:  # the dims past the rotary width, when writing out of place",
        "    j = 2 * HALF + tl.arange(0, BLOCK_REST)",
        "    rest_ok = row_ok[:, None] & (j < 2 * HALF + REST)[None, :]",
        "    tl.store(o_row[:, None] + j[None, :], tl.load(x_row[:, None] + j[None, :], mask=rest_ok), mask=rest_ok)",
    ]
    pairs = "(i, i + R/2)" if convention == "half" else "(2i, 2i + 1)"
    sig = _signature(dtype, rotate=True)
    source = "\n".join(["@triton.jit", f"def {name}(", *indent(parameter_lines(sig), 1), "):",
                        docstring(f"RoPE, {convention} convention: rotate pairs {pairs} of every head row.",
                                  ["x, o: [B, T, heads, W] views (o may be x: in place); cos/sin [B, T, R/2] fp32.",
                                   "out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin, as irc.ops.rope.apply_rope."]),
                        *indent(body, 1)])
    launcher = "\n".join([
        f"def launch_{name}(x, out, cos, sin, rotary):",
        '    """Rotate the first ``rotary`` dims of each head of x [B, T, heads, W] into out (may be x)."""',
        "    B, T, heads, width = x.shape",
        "    half = rotary // 2",
        "    rest = width - rotary",
        "    block_half = triton.next_power_of_2(max(half, 1))",
        "    block_r = max(1, min(64, ROW_TILE // block_half))",
        "    rows = B * T * heads",
        "    if rows == 0:",
        "        return",
        f"    {name}[(triton.cdiv(rows, block_r),)](",
        "        x, out, cos, sin, x.stride(0), x.stride(1), x.stride(2), out.stride(0), out.stride(1),",
        "        out.stride(2), cos.stride(0), cos.stride(1), half, T, heads, rows, rest, BLOCK_R=block_r,",
        "        BLOCK_HALF=block_half, COPY_REST=rest > 0 and out.data_ptr() != x.data_ptr(),",
        "        BLOCK_REST=triton.next_power_of_2(max(rest, 1)))",
    ])
    return Kernel(name, "rope", source, launcher, sig,
                  {"BLOCK_R": 16, "BLOCK_HALF": 32, "COPY_REST": True, "BLOCK_REST": 16})


def store_heads_kernel(name: str, dtype: DType) -> Kernel:
    """Copy rows of heads [B, T, heads, W] into a strided view (new K/V rows into the cache)."""
    body = _rows() + [
        "j = tl.arange(0, BLOCK_REST)",
        "ok = row_ok[:, None] & (j < REST)[None, :]",
        "tl.store(o_row[:, None] + j[None, :], tl.load(x_row[:, None] + j[None, :], mask=ok), mask=ok)",
    ]
    sig = _signature(dtype, rotate=False)
    source = "\n".join(["@triton.jit", f"def {name}(", *indent(parameter_lines(sig), 1), "):",
                        docstring("Copy head rows [B, T, heads, W] into a strided view (new KV rows into the cache).",
                                  ["REST is the row width W; BLOCK_REST >= W."]),
                        *indent(body, 1)])
    launcher = "\n".join([
        f"def launch_{name}(x, out):",
        '    """out[b, t, h, :] = x[b, t, h, :] for [B, T, heads, W] views."""',
        "    B, T, heads, width = x.shape",
        "    block = triton.next_power_of_2(width)",
        "    block_r = max(1, min(64, ROW_TILE // block))",
        "    rows = B * T * heads",
        "    if rows == 0:",
        "        return",
        f"    {name}[(triton.cdiv(rows, block_r),)](",
        "        x, out, x.stride(0), x.stride(1), x.stride(2), out.stride(0), out.stride(1), out.stride(2),",
        "        T, heads, rows, width, BLOCK_R=block_r, BLOCK_REST=block)",
    ])
    return Kernel(name, "rope", source, launcher, sig, {"BLOCK_R": 16, "BLOCK_REST": 64})

