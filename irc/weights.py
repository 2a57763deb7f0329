"""Lazy weight data: seeded initializers, derived params, casts, and reading by rows.

A ``Param.data`` is present (an array), absent (None) or lazy: any object with
``load() -> np.ndarray``. ``SeededInit`` gives every param deterministic random data from
its name alone, so two runs (and the graph before and after a pass) see the same weights.

Lazy data may also read a slice along its first axis: an object whose ``reads_rows`` is
true has ``rows(start, stop) -> np.ndarray`` equal to ``load()[start:stop]`` (a checkpoint
tensor, a ``Cast`` of one, a ``Derived`` weight computed row block by row block). Writers
use it to stream a weight in pieces of bounded size (``read_rows``); data that cannot is
read whole. ``Cast`` converts on read, so a bf16 checkpoint becomes an f32 or f16 graph
without a copy of the model in memory.
"""
from __future__ import annotations

import hashlib
from typing import Callable, Optional

import numpy as np

from irc.dtypes import DType
from irc.graph import Graph, Param


def name_seed(name: str, seed: int = 0) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little")


class SeededInit:
    """Random data for one param, a function of (seed, name, shape) only.

    Norm weights (1-D params whose name ends in ``norm``) are drawn near ``1 - offset``
    so normalised activations keep their scale; everything else is N(0, 1/fan_in), which
    keeps activations of random deep stacks finite and meaningful in float32.
    """

    def __init__(self, name: str, shape: tuple, dtype, seed: int = 0, centre: float = 1.0):
        self.name, self.shape, self.dtype, self.seed, self.centre = name, tuple(shape), dtype, seed, centre

    def load(self) -> np.ndarray:
        rng = np.random.default_rng(name_seed(self.name, self.seed))
        if len(self.shape) == 1 and self.name.split(".")[-1].endswith("norm"):
            data = self.centre + 0.1 * rng.standard_normal(self.shape)
        else:
            fan_in = self.shape[-1] if self.shape else 1
            data = rng.standard_normal(self.shape) / np.sqrt(fan_in)
        return data.astype(np.float32).astype(self.dtype.numpy)

    def __repr__(self) -> str:
        return f"SeededInit({self.name!r}, seed={self.seed})"


class Derived:
    """A param computed from others on demand (a pass's folded weight).

    ``compute()`` gives the whole array. When ``compute`` also has ``rows(start, stop)``
    (rows [start, stop) of the result, computed from those rows of its sources), the
    param reads by rows too. Two optional attributes of ``compute`` guide a writer that
    streams by rows: ``row_elements``, the source elements one row of the result is
    computed from (to size its pieces), and ``share``, an object that several derived
    params computed together have in common (the parts of one quantized weight): the writer
    reads those params' rows one after another in one thread, so the work is done once per
    block of rows."""

    def __init__(self, compute: Callable[[], np.ndarray], description: str):
        self.compute, self.description = compute, description

    def load(self) -> np.ndarray:
        return self.compute()

    @property
    def reads_rows(self) -> bool:
        return callable(getattr(self.compute, "rows", None))

    def rows(self, start: int, stop: int) -> np.ndarray:
        return self.compute.rows(start, stop)

    @property
    def row_elements(self) -> Optional[int]:
        return getattr(self.compute, "row_elements", None)

    @property
    def share(self):
        return getattr(self.compute, "share", None)

    def __repr__(self) -> str:
        return f"Derived({self.description})"


def seed_absent(graph: Graph, seed: int = 0) -> int:
    """Give every absent param seeded data; returns how many were seeded."""
    count = 0
    offset = float(graph.meta.get("norm_offset", 0.0) or 0.0)
    for param in graph.params.values():
        if param.data is None:
            param.data = SeededInit(param.name, param.shape, param.dtype, seed, centre=1.0 - offset)
            count += 1
    return count


class Cast:
    """Lazy data read as another float type: ``Cast(data, DType.f32)`` converts on every
    read (whole or by rows), so nothing but the rows asked for is ever held."""

    def __init__(self, data, dtype: DType):
        self.data, self.dtype = data, dtype

    def load(self) -> np.ndarray:
        return convert(load_data(self.data), self.dtype)

    @property
    def reads_rows(self) -> bool:
        return reads_rows(self.data)

    def rows(self, start: int, stop: int) -> np.ndarray:
        return convert(data_rows(self.data, start, stop), self.dtype)

    def __repr__(self) -> str:
        return f"Cast({self.data!r}, {self.dtype})"


def convert(array, dtype: DType) -> np.ndarray:
    """``array`` as ``dtype``, C-contiguous (no copy when it already is). Float conversions
    round to nearest even (bf16 and f16 through ml_dtypes and NumPy)."""
    array = np.asarray(array)
    if array.dtype == dtype.numpy:
        out = np.ascontiguousarray(array)
    else:
        out = np.ascontiguousarray(array.astype(dtype.numpy))  # bf16 <-> f16 directly: same as through f32
    return out.reshape(()) if array.ndim == 0 else out  # ascontiguousarray makes a scalar [1] (xIELU's beta)


def reads_rows(data) -> bool:
    """Can ``data`` (a Param's data) be read a slice of rows at a time?"""
    return isinstance(data, np.ndarray) or bool(getattr(data, "reads_rows", False))


def load_data(data) -> np.ndarray:
    return data if isinstance(data, np.ndarray) else data.load()


def data_rows(data, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) along the first axis of present or lazy data (whole data is
    loaded and sliced when it cannot read rows)."""
    if isinstance(data, np.ndarray):
        return data[start:stop]
    if reads_rows(data):
        return data.rows(start, stop)
    return data.load()[start:stop]


def read_rows(param: Param, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of a param's weight, in the param's dtype."""
    if param.data is None:
        raise ValueError(f"param @{param.name} has no data (shape-only compile)")
    return convert(data_rows(param.data, start, stop), param.dtype)


def read_rows_stored(param: Param, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) as the checkpoint stores them when that is bfloat16 or float16 and
    the param is float32 (a ``Cast``), else ``read_rows``: for a reader that widens them
    itself, exactly (the compiled int4 kernel), so the rows are never converted here."""
    data = param.data
    if isinstance(data, Cast) and param.dtype == DType.f32:
        raw = np.asarray(data_rows(data.data, start, stop))
        if raw.dtype.name in ("bfloat16", "float16"):
            return np.ascontiguousarray(raw)
        return convert(raw, param.dtype)
    return read_rows(param, start, stop)


def materialize(param: Param) -> np.ndarray:
    data = param.array()
    if data is None:
        raise ValueError(f"param @{param.name} has no data (shape-only compile)")
    return data
