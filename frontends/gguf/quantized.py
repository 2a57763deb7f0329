"""Giving a float graph's params their GGUF data: block codes where the format has a form
(``frontends.gguf.forms``), dequantized floats elsewhere.

``attach_weights(graph, arch, gguf, weights)`` checks every param against
its GGUF tensor (present, readable type, shape as the hyperparameters say), sets lazy data,
and refuses GGUF tensors the model has no place for. Unless ``weights`` is ``"float"``, a param of rank
>= 2 stored in a format of ``frontends.gguf.blocks.EXACT`` is replaced by
``@<name>.qweight``, ``@<name>.scales`` and (for forms with zero points) ``@<name>.zero_points``
(float, or u8 for a requantized form: ``blocks4`` / ``int4``), each lazily repacked from the GGUF blocks, and its
readers change as the ``quantize`` pass changes them: ``linear(x, W, b)`` becomes
``dequant_linear(x, qweight, scales, zero_points?, b)`` (MatMulNBits at accuracy level 4, or
0 with ``exact``), ``embedding(ids, W)`` becomes ``dequant_embedding`` (only the
looked-up rows are dequantized: GatherBlockQuantized; a table no linear reads keeps the
file's codes); a gated MLP (``swiglu``, ``geglu``) is first unfolded into the ``linear`` layers
``lower-mlp`` writes (``unfold_gated``), so gate and up pack into one MatMulNBits as irc's
int4 does; any other reader (the ungated MLPs, ``moe``, MLA) reads one ``dequantize`` node
named after the param. Everything else is dequantized to float32 with ``gguf``'s dequantizer; the
notes (``graph.meta["gguf"]["notes"]``, one line per format) say which tensors went which way,
in which form, and whether that form is the file's values.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from frontends.gguf.forms import ACCURACY_LEVEL, EXACT_LEVEL, form, in_form
from frontends.gguf.layout import Layout
from frontends.gguf.reader import GGUFFile
from frontends.gguf.tensors import FLOAT_TYPES, BlockData, FloatData, readable
from frontends.hf.config import Arch
from irc.build import emit1
from irc.dtypes import DType
from irc.errors import SpecError
from irc.graph import Graph, Node, Param, Value
from irc.ops.quant import dequantize_blocks, packed_width
from irc.rewrite.edit import replace_node

PARTS = ("qweight", "scales", "zero_points")


def attach_weights(graph: Graph, arch: Arch, gguf: GGUFFile, weights: str = "blocks", layout=None) -> list[str]:
    """Point every param at the file (module docstring); returns the notes. ``layout``: the
    names of a graph of part of the file (an MTP head's, ``frontends.gguf.mtp``), whose
    tensors left over are not checked."""
    whole = layout is None
    layout = layout or Layout(gguf, arch)
    used = set(layout.consumed)
    kept, converted, samples = defaultdict(int), defaultdict(int), {}
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
        if weights != "float" and param.rank >= 2 and source.exact(gguf):
            key = (kind, *use_blocks(graph, param, gguf, source, weights))
            kept[key] += 1
            samples.setdefault(key, source)
            continue
        param.data = FloatData(gguf, source, param.dtype)
        if kind not in FLOAT_TYPES:
            converted[kind.name] += 1
    spare = sorted(name for name in gguf.tensors if name not in used) if whole else []
    if spare:
        more = f" and {len(spare) - 1} more" if len(spare) > 1 else ""
        raise SpecError(f"tensor {spare[0]}{more} has no place in the model the metadata describes",
                        location=gguf.path, hint="the file has weights irc's model lacks (a bias, another layout?)")
    level = f"level {EXACT_LEVEL} (float activations)" if weights == "exact" else \
        f"level {ACCURACY_LEVEL} (int8 activations)"
    notes = []
    for key, count in sorted(kept.items(), key=lambda item: (item[0][0], item[0][2])):
        kind, held, lookups = key
        cost = "" if held.exact else f"; {sampled_error(gguf, samples[key], held)}"
        notes.append(f"{count} {kind.name} tensor(s) kept as {held.describe()}, " +
                     ("read by lookups only (GatherBlockQuantized)" if lookups else f"MatMulNBits at accuracy {level}")
                     + cost)
    notes += [f"{count} {name} tensor(s) dequantized to float32" + (" (float weights asked for)" if weights == "float" else "")
              for name, count in sorted(converted.items())]
    return notes


SAMPLE_ROWS = 256


def sampled_error(gguf: GGUFFile, source, held) -> str:
    """What a lossy form costs, measured where the compile can afford it: the relative RMS
    error (and the largest error over the RMS) of the first ``SAMPLE_ROWS`` rows of
    ``source`` in ``held``'s form against the file's own values."""
    rows = (0, min(SAMPLE_ROWS, gguf.tensor(source.name).shape[0]))
    parts = source.read_blocks(gguf, rows)
    exact = form(gguf.tensor(source.name).ggml_type, "exact")
    k = gguf.tensor(source.name).shape[-1]
    want = dequantize_blocks(*parts, bits=exact.bits, block_size=exact.block, k=k).astype(np.float64)
    ours = dequantize_blocks(*in_form(parts, held), bits=held.bits, block_size=held.block, k=k).astype(np.float64)
    rms = float(np.sqrt(np.mean(want ** 2))) or 1.0
    error = ours - want
    return (f"relative RMS weight error {np.sqrt(np.mean(error ** 2)) / rms:.1%} (largest {np.abs(error).max() / rms:.2f}"
            f" x RMS) on rows {rows[0]}-{rows[1] - 1} of {source.name}")


GATED = {"swiglu": "silu", "geglu": "gelu"}  # gated MLP op -> its activation


def unfold_gated(graph: Graph, node: Node) -> Value:
    """A gated MLP (``swiglu``, ``geglu``) as the ``linear`` layers and activation that
    ``lower-mlp`` writes (same names), so each of its weights in blocks becomes one
    ``dequant_linear`` and gate and up, reading one activation, share one MatMulNBits
    (``backends.onnx.quant_pack``) instead of two; the reference result is the same up to
    float32 rounding."""
    x, w_gate, w_up, w_down = node.inputs
    out = node.outputs[0].name

    def step(op, inputs, role, attrs=None):
        return emit1(graph, op, inputs, attrs or {}, f"{out}.{role}" if role else out, before=node,
                     origin=node.origin)

    gate = step("linear", [x, w_gate], "gate")
    attrs = {"approximate": node.attrs["approximate"]} if node.op == "geglu" else None
    hidden = step("mul", [step(GATED[node.op], [gate], "act", attrs), step("linear", [x, w_up], "up")], "hidden")
    down = step("linear", [hidden, w_down], None)
    replace_node(graph, node, [down])
    return down


def use_blocks(graph: Graph, param: Param, gguf: GGUFFile, source, weights: str = "blocks") -> tuple:
    """Replace ``param`` by its blocks in their form (``frontends.gguf.forms``) and rewire its
    readers (module docstring); returns (the form, whether lookups are its only readers)."""
    level = {"accuracy_level": EXACT_LEVEL if weights == "exact" else ACCURACY_LEVEL}
    for node in [n for n in graph.users(param) if n.op in GATED]:
        unfold_gated(graph, node)
    lookups_only = all(node.op == "embedding" for node in graph.users(param))
    # a lookup costs the same in any form: the file's codes
    held = form(gguf.tensor(source.name).ggml_type, "exact" if lookups_only else weights)
    *lead, n, k = param.shape
    nb = k // held.block
    shapes = {"qweight": (DType.u8, (*lead, n, nb, held.block * held.bits // 8)),
              "scales": (param.dtype, (*lead, n, nb)),
              "zero_points": (param.dtype, (*lead, n, nb)) if held.zero == "float" else
              (DType.u8, (*lead, n, packed_width(nb, held.bits)))}
    parts = []
    for index, part in enumerate(PARTS if held.zero != "none" else PARTS[:2]):
        dtype, shape = shapes[part]
        parts.append(graph.add_param(f"{param.name}.{part}", dtype, shape,
                                     BlockData(gguf, source, index, held)))
    attrs = {"K": k, "bits": held.bits, "block_size": held.block}
    weight = None
    for node in graph.users(param):
        for index, value in enumerate(list(node.inputs)):
            if value is not param:
                continue
            if node.op == "embedding" and index == 1:  # only the looked-up rows (GatherBlockQuantized)
                out = emit1(graph, "dequant_embedding", [node.inputs[0], *parts], {**attrs, **node.attrs},
                            f"{node.outputs[0].name}.q", before=node, origin=node.origin)
                replace_node(graph, node, [out])
                break
            if node.op == "linear" and index == 1:
                x, _, bias = (list(node.inputs) + [None])[:3]
                operands = [x, *(parts + [None])[:3], bias]
                while operands[-1] is None:
                    operands.pop()
                out = emit1(graph, "dequant_linear", operands, {**attrs, **level, "N": n}, f"{node.outputs[0].name}.q",
                            before=node, origin=node.origin)
                replace_node(graph, node, [out])
                break
            if weight is None:
                weight = emit1(graph, "dequantize", parts, {**attrs, **level}, param.name, before=node,
                               origin=node.origin)
            node.set_input(index, weight)
    del graph.params[param.name]
    return held, lookups_only
