"""The ONNX graph under construction: names, nodes, constants, weights and symbolic dims.

A ``Builder`` is what every lowering writes into. It owns

- names: graph inputs and outputs keep their irc names (``input_ids``, ``present.0.key``),
  irc values keep theirs, intermediates are ``<irc value>/<role>`` and collisions get
  ``_1``, ``_2``; a node is named after its first output. Everything follows the order of
  emission, so the same graph always gives the same model;
- initializers: params become ``Initializer`` records (name, type, shape and a loader) that
  are materialised only when the model is written, so a shape-only compile never touches
  a weight; small literals are constants, shared by value;
- symbolic dims: an irc dim (``B``, ``T``, ``P+T``) becomes an int64 [1] tensor read from
  the shape of a graph input (``Shape(attention_mask)[1]`` for ``P+T``), or arithmetic over
  such tensors; a symbol no input carries is a BackendError;
- a cache for subgraphs that layers share (masks, RoPE tables, sequence lengths).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np
from onnx import TensorProto, helper

from irc import dims
from irc.dtypes import DType
from irc.errors import BackendError
from irc.ops.vision import FEATURES
from irc.graph import Graph, Param, Value, fresh_name
from irc.weights import convert

ONNX_TYPES = {
    DType.f32: TensorProto.FLOAT, DType.f16: TensorProto.FLOAT16, DType.bf16: TensorProto.BFLOAT16,
    DType.i64: TensorProto.INT64, DType.i32: TensorProto.INT32, DType.i8: TensorProto.INT8,
    DType.u8: TensorProto.UINT8, DType.i4: TensorProto.INT4, DType.u4: TensorProto.UINT4,
    DType.bool: TensorProto.BOOL,
}
MS_DOMAIN = "com.microsoft"
INT64_MAX = np.iinfo(np.int64).max
# the dim names onnxruntime-genai's builder uses; other symbols keep their irc text
DIM_NAMES = {"B": "batch_size", "T": "sequence_length", "P": "past_sequence_length", "P+T": "total_sequence_length"}


def dim_param(d):
    """An irc dim as an ONNX dim: an int, or its name (``DIM_NAMES``)."""
    d = dims.canonical(d)
    return d if isinstance(d, int) else DIM_NAMES.get(d, d)


@dataclass
class Initializer:
    """One weight of the model: ``load(*[p.array() for p in params])`` gives its data.

    ``params`` are the irc params it is made from (one, or two for an interleaved MoE
    weight); ``load`` is a named module-level function (a transpose, say). ``chunking``
    says how the writer may stream it (``backends.onnx.writer``): ``"rows"`` when ``load``
    of rows [a, b) of every param gives rows [a, b) of the result, ``"columns"`` when it
    gives columns [a, b) of a 2-D result (a transpose), ``"stacked"`` when ``load`` stacks
    its params' rows one after another (``stack_rows``: the writer's ``segments`` streams
    each param by rows at its place), None when only whole."""

    name: str
    dtype: DType
    shape: tuple
    params: tuple
    load: Callable
    chunking: Optional[str] = None

    @property
    def nbytes(self) -> int:
        return self.dtype.nbytes(int(np.prod(self.shape, dtype=np.int64)))

    def array(self) -> np.ndarray:
        return self.convert(self.load(*[p.array() for p in self.params]))

    def convert(self, data) -> np.ndarray:
        """``load``'s result in this initializer's dtype, C-contiguous."""
        return convert(data, self.dtype)


def as_is(array):
    return array


def transposed(array):
    """[out, in] -> [in, out], contiguous: a linear weight as MatMul's right operand."""
    return transpose2d(np.asarray(array))


def transpose2d(array: np.ndarray) -> np.ndarray:
    """A contiguous transpose of a 2-D array, copied in blocks of rows (cache friendly,
    about 3x NumPy's plain strided copy here; bf16 moves as uint16, which NumPy copies
    natively)."""
    rows, cols = array.shape
    moved = array.view(np.uint16) if array.dtype.itemsize == 2 and array.dtype.kind == "V" else array
    block = 64 if moved.dtype.itemsize >= 4 else 128
    out = np.empty((cols, rows), moved.dtype)
    for start in range(0, rows, block):
        out[:, start:start + block] = moved[start:start + block].T
    return out.view(array.dtype) if moved is not array else out


@dataclass
class Builder:
    graph: Graph
    opset: int
    flavour: str
    context: int = 4096
    tied_head: str = "auto"                          # how a head tied to the embedding reads it
    unfused: frozenset = frozenset()                 # onnx-ort fusions turned off (backends.onnx.gqa_fuse)
    nodes: list = field(default_factory=list)
    weights: list = field(default_factory=list)      # Initializer, in order of first use
    constants: list = field(default_factory=list)    # TensorProto, small literals
    domains: set = field(default_factory=set)
    handled: set = field(default_factory=set)        # id(irc node) already emitted by a fusion
    _names: set = field(default_factory=set)
    _values: dict = field(default_factory=dict)      # id(irc Value) -> ONNX name
    _cache: dict = field(default_factory=dict)

    def __post_init__(self):
        self._sources = _dim_sources(self.graph)

    # ---- names -------------------------------------------------------------------------
    def claim(self, name: str) -> str:
        if name in self._names:
            raise BackendError(f"two ONNX values would be named {name!r}", location=f"graph {self.graph.name}")
        self._names.add(name)
        return name

    def fresh(self, hint: str) -> str:
        return fresh_name(hint, self._names)

    def bind(self, value: Value, name: str) -> str:
        self._values[id(value)] = name
        return name

    def is_bound(self, value: Value) -> bool:
        return id(value) in self._values

    def name_for(self, value: Value) -> str:
        """The ONNX name an irc value is (or will be) emitted under."""
        if id(value) not in self._values:
            self.bind(value, self.fresh(value.name))
        return self._values[id(value)]

    def value(self, value: Optional[Value]) -> str:
        """An operand: "" for an omitted one, a param's initializer as stored, or the value."""
        if value is None:
            return ""
        if isinstance(value, Param):
            return self.weight(value)
        if id(value) not in self._values:
            raise BackendError(f"%{value.name} is used before it is defined", location=f"graph {self.graph.name}")
        return self._values[id(value)]

    # ---- nodes -------------------------------------------------------------------------
    def node(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], *, domain: str = "",
             **attrs) -> list[str]:
        """Append a node writing ``outputs`` (names already chosen); None attrs are dropped."""
        attrs = {k: v for k, v in attrs.items() if v is not None}
        if domain:
            self.domains.add(domain)
        inputs = list(inputs)
        while inputs and inputs[-1] == "":
            inputs.pop()
        self.nodes.append(helper.make_node(op_type, inputs, list(outputs), name=outputs[0], domain=domain, **attrs))
        return list(outputs)

    def op(self, op_type: str, inputs: Sequence[str], hint: str, *, domain: str = "", **attrs) -> str:
        """A single-output node with a fresh output name from ``hint``."""
        return self.node(op_type, inputs, [self.fresh(hint)], domain=domain, **attrs)[0]

    # ---- constants and weights -----------------------------------------------------------
    def const(self, value, dtype=np.float32, hint: str = "const") -> str:
        """A small literal (shared by value); ``hint`` names the first one."""
        array = np.asarray(value, dtype=dtype)
        key = ("const", array.dtype.str, array.shape, array.tobytes())
        if key not in self._cache:
            name = self.fresh(hint)
            self.constants.append(_tensor(array, name))
            self._cache[key] = name
        return self._cache[key]

    def i64(self, values, hint: str = "const") -> str:
        return self.const(values, np.int64, hint)

    def derived(self, name: str, dtype: DType, shape: tuple, params: tuple, load: Callable,
                chunking: Optional[str] = None) -> str:
        """An initializer computed from ``params`` by ``load`` when the model is written
        (``chunking``: see ``Initializer``)."""
        key = ("weight", name)
        if key not in self._cache:
            self._cache[key] = self.fresh(name)
            self.weights.append(Initializer(self._cache[key], dtype, tuple(shape), tuple(params), load, chunking))
        return self._cache[key]

    def weight(self, param: Param, layout: str = "as_is", dtype: Optional[DType] = None) -> str:
        """A param as an initializer: ``as_is`` or ``transposed`` ([in, out], named
        ``<param>.T``), cast in-graph to ``dtype`` when given and different."""
        if layout == "as_is":
            name = self.derived(param.name, param.dtype, param.shape, (param,), as_is, "rows")
        else:
            name = self.derived(f"{param.name}.T", param.dtype, tuple(reversed(param.shape)), (param,), transposed,
                                "columns")
        return self.converted(name, param.dtype, dtype)

    def converted(self, name: str, stored: DType, dtype: Optional[DType]) -> str:
        """Initializer ``name`` (of type ``stored``) cast in-graph to ``dtype`` (once per
        initializer and type; none when None or equal): a constant expression, which ONNX
        Runtime folds when it creates the session."""
        if dtype is None or dtype == stored:
            return name
        return self.cached(("cast", name, dtype), lambda: self.op("Cast", [name], f"{name}.{dtype}",
                                                                  to=ONNX_TYPES[dtype]))

    def cached(self, key, make: Callable):
        """``make()`` once per key: subgraphs that several layers share."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    # ---- symbolic dims -------------------------------------------------------------------
    def dim(self, d) -> str:
        """An int64 [1] tensor holding the value of irc dim ``d``."""
        d = dims.canonical(d)
        if isinstance(d, int):
            return self.i64([d])
        return self.cached(("dim", d), lambda: self._make_dim(d))

    def scalar(self, d) -> str:
        """An int64 scalar holding dim ``d``."""
        d = dims.canonical(d)
        if isinstance(d, int):
            return self.i64(d)
        return self.cached(("scalar", d), lambda: self.op("Squeeze", [self.dim(d), self.i64([0])], f"dims/{d}.scalar"))

    def shape(self, shape) -> str:
        """An int64 [rank] tensor holding ``shape`` (ints and symbolic dims)."""
        shape = tuple(dims.canonical(d) for d in shape)
        if all(isinstance(d, int) for d in shape):
            return self.i64(list(shape))
        text = ",".join(str(d) for d in shape)
        return self.cached(("shape", shape), lambda: self.op("Concat", [self.dim(d) for d in shape],
                                                             f"dims/[{text}]", axis=0))

    def _make_dim(self, d: str) -> str:
        if d in self._sources:
            source, axis = self._sources[d]
            return self.op("Shape", [source], f"dims/{d}", start=axis, end=axis + 1)
        terms = parse_dim(d)
        if len(terms) == 1 and terms[0][0] == 1 and len(terms[0][1]) == 1:
            return self._solve_symbol(d)
        total = None
        for coeff, symbols in terms:
            factors = [self.dim(s) for s in symbols] + ([self.i64([coeff])] if coeff != 1 or not symbols else [])
            term = factors[0]
            for factor in factors[1:]:
                term = self.op("Mul", [term, factor], f"dims/{d}.term")
            total = term if total is None else self.op("Add", [total, term], f"dims/{d}.sum")
        return self.node("Identity", [total], [self.fresh(f"dims/{d}")])[0]

    def _solve_symbol(self, symbol: str) -> str:
        """A symbol no input carries on its own, from a linear input dim (P from P+T)."""
        for dim in self._sources:
            terms = parse_dim(dim)
            alone = [c for c, s in terms if s == (symbol,) and c > 0]
            if alone and all(symbol not in s for _, s in terms if s != (symbol,)):
                rest = [t for t in terms if t[1] != (symbol,)]
                rest_dim = format_terms(rest)
                whole = self.dim(dim)
                value = whole if not rest else self.op("Sub", [whole, self.dim(rest_dim)], f"dims/{symbol}.times")
                return value if alone[0] == 1 else self.op("Div", [value, self.i64([alone[0]])], f"dims/{symbol}")
        raise BackendError(f"symbol {symbol!r} cannot be derived from the shapes of the graph inputs",
                           location=f"graph {self.graph.name}",
                           hint="the ONNX graph computes symbolic dims from its inputs' shapes; give some input "
                                f"a dimension that is exactly {symbol!r}")


def parse_dim(d) -> list[tuple[int, tuple]]:
    """Canonical dim text -> [(coefficient, (symbols...))]: ``"2*P+T"`` -> [(2, ("P",)), (1, ("T",))]."""
    if isinstance(d, int):
        return [(d, ())]
    terms = []
    for term in str(d).split("+"):
        coeff, symbols = 1, []
        for factor in term.split("*"):
            if factor.isdigit():
                coeff *= int(factor)
            else:
                symbols.append(factor)
        terms.append((coeff, tuple(sorted(symbols))))
    return terms


def format_terms(terms) -> object:
    text = "+".join("*".join(([str(c)] if c != 1 or not s else []) + list(s)) for c, s in terms)
    return dims.canonical(text) if text else 0


def _dim_sources(graph: Graph) -> dict:
    """Each symbolic dim of a graph input -> (input name, axis), first occurrence wins; a VLM
    decoder's ``input_ids`` last, since its decoder model (``backends.onnx.vlm``) takes the
    embeddings instead."""
    sources = {}
    vlm = any(v.name == FEATURES for v in graph.inputs)
    for value in sorted(graph.inputs, key=lambda v: vlm and v.name == "input_ids"):
        for axis, d in enumerate(value.shape):
            if isinstance(d, str):
                sources.setdefault(d, (value.name, axis))
    return sources


def _tensor(array: np.ndarray, name: str) -> TensorProto:
    from onnx import numpy_helper

    return numpy_helper.from_array(array, name)
