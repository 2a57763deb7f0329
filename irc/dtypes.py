"""Element types. bf16 and the 4-bit integers are carried in NumPy through ml_dtypes, imported
the first time one of them is asked for its NumPy type (importing ml_dtypes takes ~0.6 s here,
most of an irc command's start, and a YAML or GGUF compile in f32 never needs it)."""
from __future__ import annotations

import enum
import importlib
import math

import numpy as np


class DType(enum.Enum):
    f32 = ("f32", 32, "float32")
    f16 = ("f16", 16, "float16")
    bf16 = ("bf16", 16, "ml_dtypes.bfloat16")
    i64 = ("i64", 64, "int64")
    i32 = ("i32", 32, "int32")
    i8 = ("i8", 8, "int8")
    u8 = ("u8", 8, "uint8")
    i4 = ("i4", 4, "ml_dtypes.int4")
    u4 = ("u4", 4, "ml_dtypes.uint4")
    bool = ("bool", 8, "bool")

    def __init__(self, text: str, bits: int, numpy_name: str):
        self.text = text
        self.bits = bits
        self.numpy_name = numpy_name.rpartition(".")[2]  # NumPy's name of the type: bfloat16, int4, ...
        self._source = numpy_name

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype (ml_dtypes' for bf16, i4, u4: imported the first time, then kept)."""
        found = _NUMPY.get(self)
        if found is None:
            module, _, name = self._source.rpartition(".")
            found = _NUMPY[self] = np.dtype(getattr(importlib.import_module(module), name) if module else name)
        return found

    def __repr__(self) -> str:
        return f"DType.{self.text}"

    def __str__(self) -> str:
        return self.text

    @property
    def is_float(self) -> bool:
        return self in (DType.f32, DType.f16, DType.bf16)

    def nbytes(self, count: int) -> int:
        """Bytes taken by ``count`` elements, packing sub-byte types (two int4 per byte)."""
        return (count * self.bits + 7) // 8

    @staticmethod
    def parse(text: str) -> "DType":
        try:
            return _BY_TEXT[text]
        except KeyError:
            raise ValueError(f"unknown dtype {text!r}; expected one of {', '.join(_BY_TEXT)}") from None

    @staticmethod
    def of(array: np.ndarray) -> "DType":
        dtype = _BY_NUMPY_NAME.get(np.asarray(array).dtype.name) if hasattr(array, "dtype") else None
        if dtype is None or dtype.numpy != array.dtype:
            raise ValueError(f"no irc dtype for numpy dtype {array.dtype}")
        return dtype


_NUMPY: dict = {}  # DType -> its NumPy dtype, once asked for
_BY_TEXT = {d.text: d for d in DType}
_BY_NUMPY_NAME = {d.numpy_name: d for d in DType}


class Sized:
    """``numel`` and ``nbytes`` for a type with a ``dtype`` (a DType) and an all-int
    ``shape`` (a param, an op result's type at bound sizes)."""

    __slots__ = ()

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.dtype.nbytes(self.numel)
