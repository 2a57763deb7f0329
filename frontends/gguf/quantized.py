"""Giving a float graph's params their GGUF data: block codes where the format is exact,
dequantized floats elsewhere.

``attach_weights(graph, arch, gguf, keep_blocks)`` checks every param against its GGUF
tensor (present, readable type, shape as the hyperparameters say), sets lazy data, and
refuses GGUF tensors the model has no place for. With ``keep_blocks``, a param of rank
>= 2 stored in a format of ``frontends.gguf.blocks.EXACT`` is replaced by
``@<name>.qweight``, ``@<name>.scales`` and (for formats with a minimum) float
``@<name>.zero_points``, each lazily repacked from the GGUF blocks, and its readers
change as the ``quantize`` pass changes them: ``linear(x, W, b)`` becomes
``dequant_linear(x, qweight, scales, zero_points?, b)`` (MatMulNBits, with
``accuracy_level`` 0: float activations, not int8, so the model computes with exactly the
file's weights), any other reader
(``embedding``, the MLPs, ``moe``, MLA) reads one ``dequantize`` node named after the
param. Everything else is dequantized to float32 with ``gguf``'s dequantizer; the notes
(``graph.meta["gguf"]["notes"]``, one line per format) say which tensors went which way.
"""
from __future__ import annotations

from collections import defaultdict

from frontends.gguf.blocks import EXACT
from frontends.gguf.layout import Layout
from frontends.gguf.reader import GGUFFile
from frontends.gguf.tensors import FLOAT_TYPES, BlockData, FloatData, readable
from frontends.hf.config import Arch
from irc.build import emit1
from irc.dtypes import DType
from irc.errors import SpecError
from irc.graph import Graph, Param
from irc.rewrite.edit import replace_node

PARTS = ("qweight", "scales", "zero_points")
EXACT_ACTIVATIONS = 0  # MatMulNBits' accuracy_level: float activations, so the products are the file's weights'


def attach_weights(graph: Graph, arch: Arch, gguf: GGUFFile, keep_blocks: bool = True) -> list[str]:
    """Point every param at the file (module docstring); returns the notes."""
    layout = Layout(gguf, arch)
    used = set(layout.consumed)
    kept, converted = defaultdict(int), defaultdict(int)
    for param in list(graph.params.values()):
        source = layout.source(param.name)
        for name in source.names():
            entry = gguf.tensor(name)
            if not readable(entry.ggml_type):
                raise SpecError(f"tensor {name} is stored as {entry.type_name}, which irc cannot read",
                                location=gguf.path, hint="block types irc reads: every type the gguf package "
                                                         "dequantizes, and the float types")
        shape = tuple(source.logical_shape(gguf))
        if shape != param.shape:
            raise SpecError(f"tensor {source!r} has shape {list(shape)}; the hyperparameters describe "
                            f"@{param.name} as {list(param.shape)}", location=gguf.path)
        used.update(source.names())
        kind = gguf.tensor(source.names()[0]).ggml_type
        if keep_blocks and param.rank >= 2 and source.exact(gguf):
            use_blocks(graph, param, gguf, source)
            kept[kind.name] += 1
            continue
        param.data = FloatData(gguf, source, param.dtype)
        if kind not in FLOAT_TYPES:
            converted[kind.name] += 1
    spare = sorted(name for name in gguf.tensors if name not in used)
    if spare:
        more = f" and {len(spare) - 1} more" if len(spare) > 1 else ""
        raise SpecError(f"tensor {spare[0]}{more} has no place in the model the metadata describes",
                        location=gguf.path, hint="the file has weights irc's model lacks (a bias, another layout?)")
    notes = [f"{count} {name} tensor(s) kept as {_scheme(name)}" for name, count in sorted(kept.items())]
    notes += [f"{count} {name} tensor(s) dequantized to float32" + ("" if keep_blocks else " (float weights asked for)")
              for name, count in sorted(converted.items())]
    return notes


def _scheme(type_name: str) -> str:
    scheme = next(s for t, s in EXACT.items() if t.name == type_name)
    zero = "float zero points" if scheme.float_zero else "symmetric"
    return f"{scheme.bits}-bit codes, block {scheme.block}, {zero}"


def use_blocks(graph: Graph, param: Param, gguf: GGUFFile, source) -> None:
    """Replace ``param`` by its repacked blocks and rewire its readers (module docstring)."""
    scheme = EXACT[gguf.tensor(source.name).ggml_type]
    *lead, n, k = param.shape
    nb = k // scheme.block
    shapes = {"qweight": (DType.u8, (*lead, n, nb, scheme.block * scheme.bits // 8)),
              "scales": (param.dtype, (*lead, n, nb)), "zero_points": (param.dtype, (*lead, n, nb))}
    parts = []
    for index, part in enumerate(PARTS if scheme.float_zero else PARTS[:2]):
        dtype, shape = shapes[part]
        parts.append(graph.add_param(f"{param.name}.{part}", dtype, shape, BlockData(gguf, source, index)))
    attrs = {"K": k, "bits": scheme.bits, "block_size": scheme.block, "accuracy_level": EXACT_ACTIVATIONS}
    weight = None
    for node in graph.users(param):
        for index, value in enumerate(list(node.inputs)):
            if value is not param:
                continue
            if node.op == "linear" and index == 1:
                x, _, bias = (list(node.inputs) + [None])[:3]
                operands = [x, *(parts + [None])[:3], bias]
                while operands[-1] is None:
                    operands.pop()
                out = emit1(graph, "dequant_linear", operands, {**attrs, "N": n}, f"{node.outputs[0].name}.q",
                            before=node, origin=node.origin)
                replace_node(graph, node, [out])
                break
            if weight is None:
                weight = emit1(graph, "dequantize", parts, attrs, param.name, before=node, origin=node.origin)
            node.set_input(index, weight)
    del graph.params[param.name]
