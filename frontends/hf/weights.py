"""safetensors checkpoints, read lazily, one tensor at a time.

``Checkpoint.find(folder)`` indexes a folder's weights: a single ``model.safetensors``
(or any ``*.safetensors`` files) or a sharded checkpoint through
``model.safetensors.index.json``. Indexing reads only file headers (the JSON block at the
start of each file) for names, dtypes and shapes; no tensor data.

A param's data is a ``CheckpointData``: ``load()`` opens the file holding its source with
``safetensors.safe_open`` and reads only that tensor, only those rows of a fused
projection (``Rows``), or the per-expert tensors of an MoE layer stacked into the fused
[E, ...] param (``Stack``; each file opened once). So a 70B folder compiles without
reading its weights, and running it reads each weight when the interpreter first needs it.

Loaded arrays are cast to the param's dtype, which is the dtype of the checkpoint's
embedding table; a tensor stored in another float type (DeepSeek-V3 keeps its router bias
in f32 inside a bf16 checkpoint) is cast on load. Integer or 8-bit float tensors
(quantized checkpoints) are refused.
"""
from __future__ import annotations

import glob
import json
import os
from collections import defaultdict
from typing import Optional

import numpy as np
from safetensors import safe_open

from irc.dtypes import DType
from irc.errors import SpecError

INDEX = "model.safetensors.index.json"
DTYPES = {"F32": DType.f32, "F16": DType.f16, "BF16": DType.bf16}
MAX_HEADER = 100 << 20


def read_header(path: str) -> dict:
    """The tensors a .safetensors file holds: name -> {dtype, shape, data_offsets}."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= MAX_HEADER:
                raise SpecError("not a safetensors file (bad header size)", location=path)
            header = json.loads(f.read(size))
    except (OSError, ValueError) as err:
        raise SpecError(f"cannot read the safetensors header: {err}", location=path) from None
    header.pop("__metadata__", None)
    return header


class Checkpoint:
    """Which file holds each tensor, and each tensor's dtype and shape."""

    def __init__(self, folder: str, files: dict[str, str]):
        self.folder = folder
        self.files = files  # tensor name -> file path
        self._headers: dict[str, dict] = {}

    @classmethod
    def find(cls, folder: str) -> Optional["Checkpoint"]:
        """The folder's checkpoint, or None when it holds no safetensors files."""
        index = os.path.join(folder, INDEX)
        if os.path.exists(index):
            try:
                with open(index, encoding="utf-8") as f:
                    weight_map = json.load(f)["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise SpecError(f"cannot read the shard index: {err}", location=index) from None
            files = {name: os.path.join(folder, file) for name, file in weight_map.items()}
            for path in sorted(set(files.values())):
                if not os.path.exists(path):
                    raise SpecError(f"shard {os.path.basename(path)} is missing", location=index)
            return cls(folder, files)
        paths = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
        if not paths:
            return None
        checkpoint = cls(folder, {})
        for path in paths:
            for name in checkpoint.header(path):
                if name in checkpoint.files:
                    raise SpecError(f"tensor {name} is in two files", location=path)
                checkpoint.files[name] = path
        return checkpoint

    def header(self, path: str) -> dict:
        if path not in self._headers:
            self._headers[path] = read_header(path)
        return self._headers[path]

    def info(self, name: str) -> tuple[str, list[int]]:
        """(safetensors dtype, shape) of a tensor, from its file's header."""
        path = self.file(name)
        entry = self.header(path).get(name)
        if entry is None:
            raise SpecError(f"tensor {name} is not in {os.path.basename(path)}", location=path)
        return entry["dtype"], list(entry["shape"])

    def file(self, name: str) -> str:
        try:
            return self.files[name]
        except KeyError:
            raise SpecError(f"the checkpoint has no tensor {name}", location=self.folder) from None

    def dtype(self, name: str) -> DType:
        stored, _ = self.info(name)
        if stored not in DTYPES:
            raise SpecError(f"tensor {name} is stored as {stored}; irc reads float weights "
                            f"({', '.join(DTYPES)})", location=self.file(name),
                            hint="quantized checkpoints are not supported; use the unquantized weights")
        return DTYPES[stored]


# ---- where a param's data comes from ------------------------------------------------------

class Source:
    """Checkpoint tensor(s) behind one param."""

    def names(self) -> list[str]:
        raise NotImplementedError

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        raise NotImplementedError

    def read(self, checkpoint: Checkpoint) -> np.ndarray:
        raise NotImplementedError


class Tensor(Source):
    """One whole tensor."""

    def __init__(self, name: str):
        self.name = name

    def names(self) -> list[str]:
        return [self.name]

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        return checkpoint.info(self.name)[1]

    def read_from(self, handle) -> np.ndarray:
        return handle.get_tensor(self.name)

    def read(self, checkpoint: Checkpoint) -> np.ndarray:
        with safe_open(checkpoint.file(self.name), framework="np") as handle:
            return self.read_from(handle)

    def __repr__(self) -> str:
        return self.name


class Rows(Tensor):
    """Rows [start, stop) of a 2-D tensor: one projection of a fused one (Phi-3's qkv_proj)."""

    def __init__(self, name: str, start: int, stop: int):
        super().__init__(name)
        self.start, self.stop = start, stop

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        full = checkpoint.info(self.name)[1]
        if len(full) != 2 or full[0] < self.stop:
            raise SpecError(f"tensor {self.name} {full} has no rows {self.start}:{self.stop}",
                            location=checkpoint.file(self.name))
        return [self.stop - self.start, full[1]]

    def read_from(self, handle) -> np.ndarray:
        return handle.get_slice(self.name)[self.start:self.stop]

    def __repr__(self) -> str:
        return f"{self.name}[{self.start}:{self.stop}]"


class Stack(Source):
    """Equal-shaped tensors stacked on a new first axis (per-expert weights -> [E, ...])."""

    def __init__(self, parts: list[Tensor]):
        self.parts = parts

    def names(self) -> list[str]:
        return [p.name for p in self.parts]

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        shapes = [p.shape(checkpoint) for p in self.parts]
        for part, shape in zip(self.parts, shapes):
            if shape != shapes[0]:
                raise SpecError(f"tensor {part.name} has shape {shape}, {self.parts[0].name} {shapes[0]}",
                                location=checkpoint.file(part.name))
        return [len(self.parts)] + shapes[0]

    def read(self, checkpoint: Checkpoint) -> np.ndarray:
        by_file: dict[str, list[int]] = defaultdict(list)
        for i, part in enumerate(self.parts):
            by_file[checkpoint.file(part.name)].append(i)
        arrays: list[Optional[np.ndarray]] = [None] * len(self.parts)
        for path, indices in by_file.items():
            with safe_open(path, framework="np") as handle:
                for i in indices:
                    arrays[i] = self.parts[i].read_from(handle)
        return np.stack(arrays)

    def __repr__(self) -> str:
        return f"stack({self.parts[0].name}, ... {len(self.parts)} tensors)"


class CheckpointData:
    """Lazy ``Param.data``: ``load()`` reads the source from the checkpoint, cast to ``dtype``."""

    def __init__(self, checkpoint: Checkpoint, source: Source, dtype: DType):
        self.checkpoint, self.source, self.dtype = checkpoint, source, dtype

    def load(self) -> np.ndarray:
        array = self.source.read(self.checkpoint)
        return np.ascontiguousarray(array.astype(self.dtype.numpy, copy=False))

    def __repr__(self) -> str:
        return f"safetensors({self.source!r})"
