"""The NumPy emitter: a standalone, readable NumPy module for a compiled graph.

``irc compile SPEC --target numpy -o model_np.py`` writes ``model_np.py`` and its weights,
``model_np.npz``, beside it. The module runs without irc: it needs NumPy, plus ml_dtypes
only when a value or weight is bf16 or int4. It computes exactly what the reference
interpreter (``irc.interpreter``) computes, with the same float32 math, because
it runs the same code:

- One mechanism, no per-op templates: the source of each used op's reference (its
  ``OpDef.reference``) is copied in, with the ``irc.ops`` helpers and constants it reads
  (``backends.numpy.pysource``). An op emits as soon as its reference is emit-friendly.
- ``forward(W, /, **inputs)`` takes the weights and the graph inputs by name, binds the
  symbolic dims from the input shapes (``B = input_ids.shape[0]``; ``P = attention_mask
  .shape[1] - T`` for a compound dim), runs one line per node in IR order with the IR line
  above it as a comment, and returns the graph outputs by name. Attributes are Python
  literals; shape attributes (reshape/expand targets) are lists over the bound symbols.
- ``load_weights(path=None)`` reads the .npz with the module's own stem unless given a
  path. The .npz (a plain ``numpy.savez`` archive) holds each weight under its param name in
  its NumPy dtype, except bf16 (stored as float32) and int4/uint4 (int8/uint8): exact
  widenings that ``load_weights`` narrows back through ml_dtypes.
- ``example_inputs`` mirrors ``interpreter.random_feeds`` (same seeded draws) and a
  ``__main__`` block runs it at B=1, T=4, P=0 and prints the output shapes.

Both files are a function of the graph alone (byte-identical for the same graph; the .npz
has fixed zip timestamps). ``emit_module`` seeds absent weights from their param names, as
the interpreter does, and writes through temporary files: no half-written output.
"""
from __future__ import annotations

import io
import keyword
import os
import zipfile

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.errors import BackendError
from irc.graph import Graph, Node, Param
from irc.ops import get_op
from irc.output import OutputFolder
from irc.printer import format_node
from irc.text import identifier, interface_lines, literal, one_line
from irc.weights import seed_absent

from backends.numpy.pysource import collect

# names the module defines or uses itself; a copied definition that wants one is renamed
STANDARD_IMPORTS = {"np": "numpy", "os": "os", "ml_dtypes": "ml_dtypes"}
RESERVED = {"forward", "load_weights", "example_inputs", "WEIGHT_DTYPES", "print", *STANDARD_IMPORTS}
# NumPy dtype names the .npz cannot hold natively -> the exact wider dtype it stores instead
WIDENED = {"bfloat16": "float32", "int4": "int8", "uint4": "uint8"}
EXAMPLE_SIZES = {"B": 1, "T": 4, "P": 0}  # other symbols default to 2
WRAP = 110


def module_source(graph: Graph, *, source: str = "") -> str:
    """The text of the standalone module for ``graph`` (pure: no weights are touched)."""
    if graph.meta.get("shard"):  # its collectives meet other ranks: irc.world, or per-rank ONNX / Triton
        raise BackendError("this graph is one rank of a sharded model (the shard pass), and the numpy target "
                           "writes a single process's module", hint="use --target onnx-ort or triton (a process a "
                                                                    "rank), or irc run SPEC (the ranks in threads)")
    roots = {}
    for node in graph.nodes:
        roots.setdefault(f"op {node.op!r}", get_op(node.op).reference)
    bundle = collect(roots, RESERVED, STANDARD_IMPORTS)
    needs_ml_dtypes = "ml_dtypes" in bundle.modules or any(
        _widened(v.dtype) for v in [*graph.values(), *_weights(graph)])
    imports = {"import numpy as np", "import os", *bundle.imports}
    if needs_ml_dtypes:
        imports.add("import ml_dtypes")
    ordered = sorted(imports, key=_import_order)
    standard = [line for line in ordered if _import_order(line)[0] == 0]
    header = "\n\n".join([_docstring(graph, source, needs_ml_dtypes), "from __future__ import annotations",
                           "\n".join(standard), "\n".join(ordered[len(standard):])])
    parts = [header]
    for module, text in bundle.sections:
        parts.append(_rule(f"op references, copied from {module}") + "\n\n" + text)
    parts.append(_rule("the graph"))
    parts.append(_weights_section(graph))
    parts.append(_forward(graph, bundle))
    parts.append(_example_inputs(graph))
    parts.append('if __name__ == "__main__":\n'
                 "    outputs = forward(load_weights(), **example_inputs())\n"
                 "    for name, value in outputs.items():\n"
                 "        print(name, value.dtype, value.shape)\n")
    return "\n\n".join(part.rstrip("\n") + "\n" for part in parts)


def weights_npz(graph: Graph) -> bytes:
    """The .npz bytes: every weight the graph reads, by param name (bf16 as float32, int4
    as int8). Absent weights are seeded from their names first, as the interpreter does."""
    seed_absent(graph)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for param in _weights(graph):
            array = np.asarray(param.array())
            if array.dtype != param.dtype.numpy or array.shape != param.shape:
                raise BackendError(f"param @{param.name} holds {array.dtype}{list(array.shape)} data but is "
                                   f"declared {param.type_str()}", location=f"graph {graph.name}",
                                   hint="give the param data of its declared dtype and shape")
            if array.dtype.name in WIDENED:
                array = array.astype(WIDENED[array.dtype.name])
            info = zipfile.ZipInfo(param.name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def emit_module(graph: Graph, path: str, *, source: str = "") -> None:
    """Write the module to ``path`` and its weights to the .npz with the same stem.

    Both are built in memory first, then written atomically: an error leaves no file."""
    text = module_source(graph, source=source)
    weights = weights_npz(graph)
    directory, name = os.path.split(os.path.abspath(path))
    with OutputFolder(directory, primary=name) as out:  # both files or neither
        out.write(os.path.splitext(name)[0] + ".npz", weights)
        out.write(name, text)


# ---- pieces --------------------------------------------------------------------------------

def _weights(graph: Graph) -> list[Param]:
    used = {v.name: v for n in graph.nodes for v in n.inputs if isinstance(v, Param)}
    used.update({v.name: v for v in graph.outputs if isinstance(v, Param)})
    return [used[name] for name in sorted(used)]


def _rule(title: str) -> str:
    return f"# ---- {title} ".ljust(96, "-")


def _import_order(line: str) -> tuple:
    """Standard library first, then numpy and ml_dtypes; ``import`` before ``from``."""
    module = line.split()[1]
    return (module.split(".")[0] not in ("math", "os"), line.startswith("from "), line)


def _widened(dtype: DType) -> bool:
    return dtype.numpy.name in WIDENED


def _docstring(graph: Graph, source: str, needs_ml_dtypes: bool) -> str:
    origin = f" from {one_line(source, True)}" if source else ""
    needs = "NumPy and ml_dtypes (bf16/int4 arrays)" if needs_ml_dtypes else "only NumPy"
    return "\n".join([
        f'"""{one_line(graph.name, True)}: a standalone NumPy module generated by irc{origin}.',
        "",
        "    W = load_weights()                          # the .npz beside this file, same stem",
        "    outputs = forward(W, **example_inputs())    # graph outputs by name",
        "",
        *interface_lines(graph),
        "",
        f"It needs {needs}, not irc.",
        "The op functions are copies of irc's NumPy reference implementations; forward() calls",
        "them one per node, in IR order (each IR line is the comment above its call), and",
        "computes exactly what irc's reference interpreter does.",
        "The .npz stores bf16 weights as float32 and int4 as int8 (exact); load_weights()",
        "narrows them back. Generated code: regenerate rather than edit.",
        '"""',
    ])


def _weights_section(graph: Graph) -> str:
    narrowed = {p.name: p.dtype.numpy.name for p in _weights(graph) if _widened(p.dtype)}
    lines = []
    if narrowed:
        lines += ["# weights the .npz stores widened (bf16 as float32, int4 as int8), narrowed on load",
                  "WEIGHT_DTYPES = " + literal(narrowed), "", ""]
    lines += ["def load_weights(path=None):",
              '    """The weights by param name, from ``path`` or the .npz beside this module."""',
              "    if path is None:",
              '        path = os.path.splitext(os.path.abspath(__file__))[0] + ".npz"',
              "    with np.load(path) as archive:",
              "        W = {name: archive[name] for name in archive.files}"]
    if narrowed:
        lines += ["    for name, dtype in WEIGHT_DTYPES.items():",
                  "        W[name] = W[name].astype(dtype)"]
    lines.append("    return W")
    return "\n".join(lines) + "\n"


def _variables(graph: Graph, taken: set) -> dict[str, str]:
    """Value name -> a Python variable name, unique and clear of ``taken``."""
    names, used = {}, set(taken)
    for value in graph.values():
        base = identifier(value.name)
        name, n = base, 0
        while name in used:
            n += 1
            name = f"{base}_{n}"
        used.add(name)
        names[value.name] = name
    return names


def _bind_symbols(graph: Graph, var: dict) -> tuple[list[str], set]:
    """Lines binding the symbols from input shapes, as ``irc.dims.binding_plan`` says."""
    lines, bound = [], set()
    for symbol, name, axis, rest, coefficient in dims.binding_plan(graph.inputs):
        lines.append(f"    {symbol} = " + dims.solve_text(f"{var[name]}.shape[{axis}]", rest, coefficient))
        bound.add(symbol)
    return lines, bound


def _operand(value, var: dict) -> str:
    if value is None:
        return "None"
    if isinstance(value, Param):
        return f"W[{literal(value.name)}]"
    return var[value.name]


def _attrs(node: Node, bound: set) -> str:
    shape_attrs = get_op(node.op).shape_attrs
    items = []
    for key, value in node.attrs.items():
        if key in shape_attrs:
            for d in value:
                missing = dims.symbols(d) - bound
                if missing:
                    raise BackendError(f"{node.op}: dim {d!r} of attribute {key!r} uses "
                                       f"{', '.join(sorted(missing))}, which no graph input's shape binds",
                                       location=f"node %{node.name}")
            text = "[" + ", ".join(str(d) for d in value) + "]"
        else:
            text = literal(value)
            if text is None:
                raise BackendError(f"{node.op}: attribute {key!r} is not a plain literal ({value!r})",
                                   location=f"node %{node.name}")
        items.append(f"{literal(key)}: {text}")
    return "{" + ", ".join(items) + "}"


def _forward(graph: Graph, bundle) -> str:
    taken = {"W", "inputs", *RESERVED, *bundle.names.values()}
    symbols = {s for value in graph.inputs for dim in value.shape for s in dims.symbols(dim)}
    for symbol in sorted(symbols):
        if symbol in taken or keyword.iskeyword(symbol):
            raise BackendError(f"symbol {symbol!r} cannot be a variable of the emitted forward()",
                               location=f"graph {graph.name}", hint="rename the dimension symbol")
    taken |= symbols
    var = _variables(graph, taken)
    lines = ["def forward(W, /, **inputs):",
             '    """Run the graph: W from load_weights(), inputs by graph input name; returns the',
             '    graph outputs by name."""']
    lines += [f"    {var[v.name]} = np.asarray(inputs[{literal(v.name)}])  # {v.type_str()}" for v in graph.inputs]
    binding, bound = _bind_symbols(graph, var)
    lines += binding
    for node in graph.nodes:
        comment = format_node(node) + (f"  ({node.origin})" if node.origin else "")
        lines.append("    # " + one_line(comment))
        outs = ", ".join(var[v.name] for v in node.outputs) + ("," if len(node.outputs) == 1 else "")
        call = bundle.name_of(get_op(node.op).reference)
        args = "[" + ", ".join(_operand(v, var) for v in node.inputs) + "]"
        attrs = _attrs(node, bound)
        line = f"    {outs} = {call}({args}, {attrs})"
        if len(line) > WRAP:
            line = f"    {outs} = {call}(\n        {args},\n        {attrs})"
        lines.append(line)
    results = [f"{literal(v.name)}: {_operand(v, var)}" for v in graph.outputs]
    if len(", ".join(results)) + 13 <= WRAP:
        lines.append("    return {" + ", ".join(results) + "}")
    else:
        lines += ["    return {"] + [f"        {r}," for r in results] + ["    }"]
    return "\n".join(lines) + "\n"


def _dtype_expr(dtype: DType) -> str:
    name = dtype.numpy.name
    if name in WIDENED:
        return f"ml_dtypes.{name}"
    return "np.bool_" if name == "bool" else f"np.{name}"


def _shape_expr(shape: tuple) -> str:
    items = [str(d) for d in shape]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _example_inputs(graph: Graph) -> str:
    """Mirrors ``interpreter.random_feeds``: the same rng draws in the same order."""
    symbols = set()
    for value in graph.inputs:
        for dim in value.shape:
            symbols |= dims.symbols(dim)
    order = [s for s in EXAMPLE_SIZES if s in symbols] + sorted(symbols - set(EXAMPLE_SIZES))
    params = ", ".join([f"{s}={EXAMPLE_SIZES.get(s, 2)}" for s in order] + ["seed=0"])
    vocab = int(graph.meta.get("vocab_size", 2))
    past = "P" if "P" in symbols else "0"
    entries = []
    for value in graph.inputs:
        shape = _shape_expr(value.shape)
        if value.name == "input_ids":
            draw = f"rng.integers(0, {vocab}, size={shape}, dtype=np.int64)"
        elif value.name == "attention_mask":
            draw = f"np.ones({shape}, dtype=np.int64)"
        elif value.name == "position_ids":
            tokens = "T" if "T" in symbols else str(value.shape[-1])
            draw = f"np.broadcast_to(np.arange({past}, {past} + {tokens}, dtype=np.int64), {shape}).copy()"
        elif value.dtype.is_float:
            draw = f"rng.standard_normal({shape}).astype({_dtype_expr(value.dtype)})"
        else:
            draw = f"rng.integers(0, 2, size={shape}).astype({_dtype_expr(value.dtype)})"
        entries.append(f"        {literal(value.name)}: {draw},")
    return "\n".join([
        f"def example_inputs({params}):",
        '    """Seeded inputs, as irc\'s random_feeds draws them: ids below the vocabulary, an',
        '    all-ones attention mask, positions after the past, standard-normal floats."""',
        "    rng = np.random.default_rng(seed)",
        "    return {", *entries, "    }",
    ]) + "\n"


def emit_target(graph: Graph, path: str, options) -> list[str]:
    """``--target numpy`` (``backends.TARGETS``)."""
    emit_module(graph, path, source=options.source)
    return [f"wrote {path} (a standalone NumPy module (+ .npz weights))"]
