"""The NPU executor's memory and numbers: the SRAM as one byte array, its buffers, the DMA
that counts the bytes it moves, and how stored values map to real ones (``Numbers``,
``store_as``). Both the GEMM/attention executor and the recurrent scans stand on it."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from irc.errors import BackendError
from irc.npu.target import Machine, round_up

NUMPY = {"int8": np.int8, "int16": np.int16, "fp16": np.float16, "bf16": np.float32, "fp32": np.float32}


@dataclass(frozen=True)
class Numbers:
    """How stored values map to real ones (integer dtypes) for the epilogue."""

    acc_scale: float = 1.0       # real value of one accumulator unit (A scale x B scale)
    operand_scale: float = 1.0   # real value of one unit of a fused epilogue operand
    out_scale: float = 1.0       # real value of one unit of the output
    v_scale: float = 1.0         # attention: real value of one unit of V


# ---- SRAM and DMA ------------------------------------------------------------------------

class Sram:
    """The target's SRAM as one byte array; buffers are allocated from it in order."""

    def __init__(self, machine: Machine):
        self.machine = machine
        self.memory = np.zeros(machine.sram_bytes, dtype=np.uint8)
        self.used = 0

    def allocate(self, name: str, nbytes: int) -> np.ndarray:
        nbytes = round_up(nbytes, self.machine.align)
        if self.used + nbytes > len(self.memory):
            raise BackendError(f"SRAM overflow: buffer {name} needs {nbytes:,} bytes at offset {self.used:,}, "
                               f"past the {len(self.memory):,} bytes of {self.machine.target}")
        region = self.memory[self.used:self.used + nbytes]
        self.used += nbytes
        return region


class Buffer:
    """One planned buffer (one or two copies); ``place`` lays a tile out in a copy."""

    def __init__(self, sram: Sram, name: str, entry: dict):
        self.name, self.machine = name, sram.machine
        self.copies = [sram.allocate(f"{name}[{i}]", entry["bytes"]) for i in range(entry["copies"])]
        self.turn = -1

    def next_copy(self) -> int:
        self.turn = (self.turn + 1) % len(self.copies)
        return self.turn

    def place(self, shape: tuple, dtype, copy: int = 0, offset: int = 0) -> np.ndarray:
        """A writable view of a [rows, cols] (or [n, rows, cols]) tile at ``offset`` bytes
        into copy ``copy``; rows padded to whole bursts."""
        *lead, rows, cols = shape
        itemsize = np.dtype(dtype).itemsize
        pitch = round_up(cols * itemsize, self.machine.align)
        count = math.prod(lead) * rows
        region = self.copies[copy]
        if offset + count * pitch > len(region):
            raise BackendError(f"tile {'x'.join(map(str, shape))} ({np.dtype(dtype).name}) does not fit buffer "
                               f"{self.name} ({len(region):,} bytes, {offset:,} in use)")
        view = region[offset:offset + count * pitch].reshape(count, pitch)[:, :cols * itemsize]
        return view.view(dtype).reshape(shape)


class Dma:
    """Moves tiles between DRAM arrays and SRAM views, counting bytes per stream."""

    def __init__(self, machine: Machine):
        self.machine = machine
        self.bytes: dict[str, int] = {}

    def _count(self, stream: str, rows: int, cols: int, width: int) -> None:
        self.bytes[stream] = self.bytes.get(stream, 0) + rows * round_up(cols * width, self.machine.align)

    def load(self, stream: str, source: np.ndarray, target: np.ndarray) -> np.ndarray:
        *lead, rows, cols = target.shape
        self._count(stream, math.prod(lead) * rows, cols, target.dtype.itemsize)
        target[...] = source
        return target

    def store(self, stream: str, source: np.ndarray, target: np.ndarray, width: int) -> None:
        *lead, rows, cols = source.shape
        self._count(stream, math.prod(lead) * rows, cols, width)
        target[...] = source


# ---- numbers -----------------------------------------------------------------------------
def store_as(y, machine: Machine, numbers: Numbers) -> np.ndarray:
    dtype = np.dtype(NUMPY[machine.dtype])
    if machine.is_float:
        return y.astype(dtype)
    info = np.iinfo(dtype)
    return np.clip(np.rint(y / np.float32(numbers.out_scale)), info.min, info.max).astype(dtype)
