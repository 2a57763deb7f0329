"""Kernel generators: each module turns a small description drawn from the IR into the text
of one ``@triton.jit`` kernel and the Python helper that launches it.

A generator returns a ``Kernel``: its name in the emitted module, the kernel text, the
launch helper text, and what ``triton.compile`` needs to build it without a GPU (the
signature and representative constexpr values). The planner collects the kernels a graph
needs, keeps one copy of each distinct text, and records which graph nodes each one
implements (the kernel's docstring names them).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from irc.dtypes import DType

# irc dtype -> (Triton type in signatures, tl dtype in kernel text, torch dtype in launcher text)
TYPES = {
    DType.f32: ("fp32", "tl.float32", "torch.float32"),
    DType.f16: ("fp16", "tl.float16", "torch.float16"),
    DType.bf16: ("bf16", "tl.bfloat16", "torch.bfloat16"),
    DType.i64: ("i64", "tl.int64", "torch.int64"),
    DType.i32: ("i32", "tl.int32", "torch.int32"),
    DType.i8: ("i8", "tl.int8", "torch.int8"),
    DType.u8: ("u8", "tl.uint8", "torch.uint8"),
    DType.bool: ("i1", "tl.int1", "torch.bool"),
}


def signature_type(dtype: DType) -> str:
    return TYPES[dtype][0]


def tl_type(dtype: DType) -> str:
    return TYPES[dtype][1]


def torch_type(dtype: DType) -> str:
    return TYPES[dtype][2]


def mixed_type(dtype: DType) -> str:
    """The 16-bit tl type tensor-core dots use under MIXED: ``dtype`` when it is one, else bf16."""
    return tl_type(dtype) if dtype in (DType.f16, DType.bf16) else "tl.bfloat16"


def dot(a: str, b: str, acc: str, mix: str) -> list[str]:
    """Lines computing ``acc += a @ b``: under the MIXED constexpr with both operands in
    ``mix`` (tensor cores), else exactly (``input_precision=PRECISION`` for fp32)."""
    return ["if MIXED:  # 16-bit tensor-core operands, fp32 accumulation",
            f"    {acc} = tl.dot({a}.to({mix}), {b}.to({mix}), {acc})",
            "else:",
            f"    {acc} = tl.dot({a}, {b}.to({a}.dtype), {acc}, input_precision=PRECISION)"]


def next_pow2(n: int, at_least: int = 1) -> int:
    """The smallest power of two >= max(n, at_least) (tl.arange lengths must be powers of two)."""
    p = 1
    while p < max(n, at_least):
        p *= 2
    return p


def round_to(value_var: str, dtype: DType) -> str:
    """``value_var`` (fp32 in registers) rounded through ``dtype`` and back, as the reference
    rounds each node's result to its dtype; nothing for f32."""
    if dtype == DType.f32:
        return value_var
    if not value_var.isidentifier():
        value_var = f"({value_var})"
    return f"{value_var}.to({tl_type(dtype)}).to(tl.float32)"


@dataclass
class Kernel:
    """One generated kernel and its launch helper.

    ``signature`` maps each kernel parameter to a Triton type (``*fp32``, ``i32``, ``fp32``,
    ``constexpr``); ``constexprs`` gives every constexpr parameter a value for a compile
    check (autotuned ones a representative config's). ``tensor_cores`` says the kernel's
    inner loop is a ``tl.dot`` that must become mma/wgmma on sm_80/sm_90 with the MIXED
    constexpr on (16-bit operands); ``tensor_core_types`` are signature overrides for that
    check (none so far).
    """

    name: str
    family: str                       # matmul, row, rope, attention, mla, moe, dequant
    source: str                       # the @triton.jit text, decorators included
    launcher: str                     # def launch_<name>(...): the Python launch helper
    signature: dict
    constexprs: dict
    tensor_cores: bool = False
    tensor_core_types: dict = field(default_factory=dict)
    nodes: list = field(default_factory=list)

    def key(self) -> tuple:
        return (self.source, self.launcher)


NODES_MARKER = "@NODES@"


def docstring(summary: str, details: list[str]) -> str:
    """A kernel docstring: a summary line, detail lines, and a marker the emitter replaces
    with the graph nodes the kernel implements."""
    lines = [f'    """{summary}', ""] + [f"    {line}" if line else "" for line in details]
    lines += ["", f"    Implements: {NODES_MARKER}", '    """']
    return "\n".join(lines)


def indent(lines: list[str], depth: int) -> list[str]:
    pad = "    " * depth
    return [pad + line if line else line for line in lines]


def parameter_lines(signature: dict, width: int = 100) -> list[str]:
    """The kernel's parameter list, wrapped; constexpr parameters annotated."""
    lines, current = [], ""
    for name, kind in signature.items():
        item = (f"{name}: tl.constexpr" if kind == "constexpr" else name) + ","
        if current and len(current) + len(item) + 1 > width:
            lines.append(current)
            current = ""
        current = f"{current} {item}" if current else item
    return lines + [current]


# ---- readable emitted code -------------------------------------------------------------------

WIDTH = 110


def _outside_strings(text: str):
    """(index, character, bracket depth before it) for each character of ``text`` outside
    string literals."""
    depth, quote = 0, None
    for i, c in enumerate(text):
        if quote:
            quote = None if c == quote and text[i - 1] != "\\" else quote
        elif c in "'\"":
            quote = c
        else:
            yield i, c, depth
            depth += (c in "([{") - (c in ")]}")


def _top_level_commas(text: str) -> list[int]:
    """Indices of the commas of ``text`` outside brackets and string literals."""
    return [i for i, c, depth in _outside_strings(text) if c == "," and depth == 0]


def _matching_call(line: str) -> tuple[int, int] | None:
    """(open, close) of the first bracket that opens right after a name and closes at the
    end of the statement (before a trailing comment)."""
    code = line.split("  # ")[0].rstrip()
    opened = None
    for i, c, depth in _outside_strings(code):
        if c in "([{" and depth == 0 and opened is None and i and (code[i - 1].isalnum() or code[i - 1] in "_]"):
            opened = i
        elif c in ")]}" and depth == 1 and opened is not None:
            return (opened, i) if i == len(code) - 1 else None
    return None


def wrap_line(line: str, width: int = WIDTH) -> list[str]:
    """A long call split after its top-level commas into continuation lines (comments
    wrapped onto ``#`` lines); anything it cannot split safely is left as it is."""
    if len(line) <= width:
        return [line]
    indent = line[:len(line) - len(line.lstrip())]
    if line.lstrip().startswith("#"):
        words, lines, current = line.lstrip()[2:].split(" "), [], indent + "#"
        for word in words:
            if len(current) + len(word) + 1 > width and current.strip() != "#":
                lines.append(current)
                current = indent + "#    "
            current += " " + word
        return lines + [current]
    span = _matching_call(line)
    if span is None:
        return [line]
    start, end = span
    inner = line[start + 1:end]
    cuts = [-1] + _top_level_commas(inner) + [len(inner)]
    args = [inner[a + 1:b].strip() for a, b in zip(cuts, cuts[1:]) if inner[a + 1:b].strip()]
    head, tail = line[:start + 1], line[end:]
    pad = indent + " " * 8
    lines, current = [head], pad
    for arg in args:
        piece = arg + ","
        if current.strip() and len(current) + len(piece) + 1 > width:
            lines.append(current.rstrip())
            current = pad
        current += piece + " "
    lines.append(current.rstrip().rstrip(","))
    lines[-1] += tail
    return lines


def wrap_code(text: str, width: int = WIDTH) -> str:
    """``wrap_line`` over every line of generated code outside triple-quoted strings."""
    out, in_string = [], False
    for line in text.split("\n"):
        if line.count('"""') % 2 == 1:
            in_string = not in_string
            out.append(line)
        elif in_string or '"""' in line:
            out.append(line)
        else:
            out.extend(wrap_line(line, width))
    return "\n".join(out)
