"""How ``quantize`` chooses a weight's codes: round-to-nearest (``rtn``), a per-group scale
search that minimises the group's squared error (``mse``), and the same search weighted by
each input channel's mean squared activation from a calibration text (``imatrix``).

All three write the layout of ``irc.ops.quant`` (MatMulNBits'): a group (block) of
``block_size`` weights along K shares one scale s and, when asymmetric, an integer zero
point z, and stands for ``s * j`` with integer ``j`` in a window of 2^bits values containing
0: [-2^(bits-1), 2^(bits-1) - 1] symmetric (z = 2^(bits-1), fixed), [-z, 2^bits - 1 - z]
asymmetric.

``rtn`` is ``irc.ops.quant.quantize_blocks``: max-abs scaling, j in [-7, 7] for 4 bits.

``ort`` is onnxruntime's compiled blockwise quantizer (``passes.quantize_ort``, the scheme of
onnxruntime-genai's builder int4): the signed largest-magnitude weight onto j = -8, so the
full [-8, 7]; bit for bit its NumPy statement, ``ort_blocks_numpy``. ``awq`` writes the same
codes, of each weight as ``passes.quantize_awq`` left it (its AWQ scale folded in, or not).

``mse`` and ``imatrix`` search each group's scale: ``passes.quantize_search`` says how.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from irc.dtypes import DType
from irc.graph import Graph, Param
from irc.ops.quant import block_count, packed_width, quantize_blocks
from irc.weights import Derived, materialize, read_rows, read_rows_stored
from passes.quantize_search import search_blocks

METHODS = ("rtn", "ort", "mse", "imatrix", "gptq", "awq")
CALIBRATED = ("imatrix", "gptq", "awq")
PARTS = ("qweight", "scales", "zero_points")


def quantize_weight(weight, *, bits: int, block_size: int, symmetric: bool, method: str,
                    scale_dtype: str = "float32", importance: Optional[np.ndarray] = None) -> tuple:
    """(qweight u8, scales, zero_points u8 or None) of ``weight`` [..., N, K] by ``method``;
    ``importance`` [K] (imatrix) weights each input channel's squared error."""
    if method == "rtn":
        return quantize_blocks(weight, bits=bits, block_size=block_size, symmetric=symmetric,
                               scale_dtype=scale_dtype)
    if method in ("ort", "awq"):  # awq: the ort codes of the weight as passes.quantize_awq scaled it
        from passes.quantize_ort import ort_blocks
        return ort_blocks(weight, bits=bits, block_size=block_size, symmetric=symmetric, scale_dtype=scale_dtype)
    if method == "gptq":
        from passes.quantize_gptq import gptq_blocks
        return gptq_blocks(weight, hessian=importance, bits=bits, block_size=block_size, symmetric=symmetric,
                           scale_dtype=scale_dtype)
    return search_blocks(weight, bits=bits, block_size=block_size, symmetric=symmetric, scale_dtype=scale_dtype,
                         importance=importance)


def is_embedding_or_head(param: Param) -> bool:
    """An embedding table (read by ``embedding``) or an LM head (named ``lm_head``)."""
    return param.name.split(".")[-1] == "lm_head" or any(node.op == "embedding" for node in param.uses)


class QuantizedWeight:
    """The quantization of one float param by one method, whole or by rows of the source.

    Each computation yields all parts at once; each part is handed out once from it and
    then forgotten, so reading qweight, scales and zero points of the same rows one after
    another costs one quantization, and nothing is held once all were read."""

    def __init__(self, source: Param, bits: int, block_size: int, symmetric: bool, method: str, importance=None):
        self.source, self.bits, self.block_size, self.symmetric = source, bits, block_size, symmetric
        self.method, self.importance = method, importance
        self._rows = None
        self._pending: dict = {}

    def part(self, name: str, rows: Optional[tuple] = None):
        if rows != self._rows or name not in self._pending:
            if rows is None:
                weight = materialize(self.source)
            else:  # the compiled kernel (ort, awq) widens a bfloat16 / float16 checkpoint's rows itself
                weight = (read_rows_stored if self.method in ("ort", "awq") else read_rows)(self.source, *rows)
            arrays = quantize_weight(weight, bits=self.bits, block_size=self.block_size, symmetric=self.symmetric,
                                     method=self.method, scale_dtype=self.source.dtype.numpy.name,
                                     importance=self.importance)
            self._rows, self._pending = rows, {p: a for p, a in zip(PARTS, arrays) if a is not None}
        return self._pending.pop(name)

    def scheme(self) -> str:
        return (f"bits={self.bits}, block_size={self.block_size}, "
                f"{'symmetric' if self.symmetric else 'asymmetric'}, {self.method}")


class QuantizedPart:
    """One part (qweight, scales or zero_points) of a ``QuantizedWeight``, as Derived data."""

    def __init__(self, weight: QuantizedWeight, part: str):
        self.weight, self.part = weight, part

    def __call__(self):
        return self.weight.part(self.part)

    def rows(self, start: int, stop: int):
        return self.weight.part(self.part, (start, stop))

    @property
    def share(self):  # the writer reads all parts of one weight, block by block, in one thread
        return self.weight

    @property
    def row_elements(self) -> int:  # source elements behind one row (sizes the writer's pieces)
        return self.weight.source.numel // max(self.weight.source.shape[0], 1)


def quantized_params(graph: Graph, weight: QuantizedWeight) -> list:
    """``@<source>.qweight``, ``.scales`` and (asymmetric) ``.zero_points``, lazily derived."""
    source, bits, block = weight.source, weight.bits, weight.block_size
    *lead, n, k = source.shape
    nb = block_count(k, block)
    shapes = {"qweight": (DType.u8, (*lead, n, nb, block * bits // 8)),
              "scales": (source.dtype, (*lead, n, nb)),
              "zero_points": (DType.u8, (*lead, n, packed_width(nb, bits)))}
    params = []
    for part in PARTS[:2] if weight.symmetric else PARTS:
        dtype, shape = shapes[part]
        param = graph.add_param(f"{source.name}.{part}", dtype, shape)
        param.data = Derived(QuantizedPart(weight, part), f"quantize @{source.name} ({weight.scheme()}): {part}")
        params.append(param)
    return params


__all__ = ["METHODS", "CALIBRATED", "PARTS", "quantize_weight", "search_blocks", "is_embedding_or_head",
           "QuantizedWeight", "QuantizedPart", "quantized_params"]
