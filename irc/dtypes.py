"""Element types. bf16 and the 4-bit integers are carried in NumPy through ml_dtypes."""
from __future__ import annotations

import enum
import math

import ml_dtypes
import numpy as np


class DType(enum.Enum):
    f32 = ("f32", 32, np.float32)
    f16 = ("f16", 16, np.float16)
    bf16 = ("bf16", 16, ml_dtypes.bfloat16)
    i64 = ("i64", 64, np.int64)
    i32 = ("i32", 32, np.int32)
    i8 = ("i8", 8, np.int8)
    u8 = ("u8", 8, np.uint8)
    i4 = ("i4", 4, ml_dtypes.int4)
    u4 = ("u4", 4, ml_dtypes.uint4)
    bool = ("bool", 8, np.bool_)

    def __init__(self, text: str, bits: int, numpy_type):
        self.text = text
        self.bits = bits
        self.numpy = np.dtype(numpy_type)

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
        for dtype in DType:
            if dtype.numpy == array.dtype:
                return dtype
        raise ValueError(f"no irc dtype for numpy dtype {array.dtype}")


_BY_TEXT = {d.text: d for d in DType}


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
