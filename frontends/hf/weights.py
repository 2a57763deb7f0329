"""safetensors checkpoints, read lazily, a tensor or a block of its rows at a time.

``Checkpoint.find(folder)`` indexes a folder's weights: a single ``model.safetensors``
(or any ``*.safetensors`` files) or a sharded checkpoint through
``model.safetensors.index.json``. Indexing reads only file headers (the JSON block at the
start of each file) for names, dtypes, shapes and byte ranges; no tensor data. A header is
checked against its file when it is read: a shard shorter than its header promises
(truncated) or a tensor whose byte range does not match its dtype and shape is a
``SpecError`` naming the file and the tensor, before anything is compiled.

A param's data is a ``CheckpointData``: ``load()`` reads its source, and ``rows(start,
stop)`` reads only rows [start, stop) of it (the writer streams large weights this way).
The source is one tensor, rows of a fused projection (``Rows``, Phi-3's qkv_proj), or the
per-expert tensors of an MoE layer stacked into the fused [E, ...] param (``Stack``).
Reads are plain positioned reads of the byte range into a fresh array (``read_bytes``), not
memory maps: a mapped file's pages would count in the process's resident memory as they
are touched, and the bytes a read returns are held only as long as the array is.

Loaded arrays are cast to the param's dtype (``irc.weights.convert``), which is the dtype of
the checkpoint's embedding table unless a pass retypes the graph; a tensor stored in
another float type (DeepSeek-V3 keeps its router bias in f32 inside a bf16 checkpoint) is
cast on load. Integer or 8-bit float tensors (quantized checkpoints) are refused, but for an
I64 / I32 table read into an integer param (an index table an op gathers, DeepSeek-V4's tid2eid).
"""
from __future__ import annotations

import glob
import json
import os
from typing import Callable, Optional

import numpy as np

from irc.dtypes import DType
from irc.errors import SpecError
from irc.weights import convert

INDEX = "model.safetensors.index.json"
DTYPES = {"F32": DType.f32, "F16": DType.f16, "BF16": DType.bf16}
STORED = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "I64": np.dtype("<i8"), "I32": np.dtype("<i4")}
STORED_LATE = {"BF16": DType.bf16}  # through ml_dtypes, imported when a bf16 tensor is first read (irc.dtypes)
INTEGERS = {"I64": DType.i64, "I32": DType.i32}  # index tables (read only where a param is integer)
ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
              "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
MAX_HEADER = 100 << 20


def read_header(path: str) -> tuple[dict, int]:
    """(the tensors a .safetensors file holds: name -> {dtype, shape, data_offsets}, the
    byte offset where their data begins), checked against the file's size."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= MAX_HEADER:
                raise SpecError("not a safetensors file (bad header size)", location=path)
            header = json.loads(f.read(size))
        file_size = os.path.getsize(path)
    except (OSError, ValueError, RecursionError) as err:
        raise SpecError(f"cannot read the safetensors header: {' '.join(str(err).split())[:200]}",
                        location=path) from None
    if not isinstance(header, dict):
        raise SpecError("not a safetensors file (the header is not a JSON object)", location=path)
    header.pop("__metadata__", None)
    data_start = 8 + size
    spans = []
    for name, entry in header.items():
        spans.append((*_check_entry(path, name, entry, file_size - data_start), name))
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:
            raise SpecError(f"tensors {first} and {second} overlap in the data", location=path,
                            hint="the file is corrupt")
    return header, data_start


def _check_entry(path: str, name: str, entry, room: int) -> tuple[int, int]:
    """(begin, end) of the tensor's bytes in the data, once its entry is found consistent."""
    entry = entry if isinstance(entry, dict) else {"entry": entry}
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not (isinstance(dtype, str) and _whole_numbers(shape) and _whole_numbers(offsets) and len(offsets) == 2):
        shown = repr(entry) if len(repr(entry)) < 200 else repr(entry)[:200] + "..."
        raise SpecError(f"tensor {name}: malformed header entry {shown}", location=path) from None
    begin, end = offsets
    count = 1
    for d in shape:
        count *= d
    if dtype in ITEM_BYTES and end - begin != count * ITEM_BYTES[dtype]:
        raise SpecError(f"tensor {name}: {dtype} {shape} needs {count * ITEM_BYTES[dtype]:,} bytes but the "
                        f"header gives it {end - begin:,}", location=path, hint="the file is corrupt")
    if not 0 <= begin <= end or end > room:
        raise SpecError(f"truncated shard: tensor {name} ends at byte {end:,} of the data, which holds only "
                        f"{max(room, 0):,} bytes", location=path,
                        hint="the file is incomplete (an interrupted download or copy?); fetch it again")
    return begin, end


def _whole_numbers(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)


def read_bytes(path: str, offset: int, size: int) -> np.ndarray:
    """``size`` bytes of ``path`` from ``offset``, into a new uint8 array."""
    buffer = np.empty(size, np.uint8)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        done = 0
        while done < size:
            got = f.readinto(view[done:])
            if not got:
                raise SpecError(f"the file ended {size - done:,} bytes early", location=path,
                                hint="was it truncated after the compile started?")
            done += got
    return buffer


class Checkpoint:
    """Which file holds each tensor, and each tensor's dtype, shape and bytes."""

    def __init__(self, folder: str, files: dict[str, str]):
        self.folder = folder
        self.files = files  # tensor name -> file path
        self._headers: dict[str, tuple[dict, int]] = {}

    @classmethod
    def find(cls, folder: str) -> Optional["Checkpoint"]:
        """The folder's checkpoint, or None when it holds no safetensors files."""
        index = os.path.join(folder, INDEX)
        if os.path.exists(index):
            try:
                with open(index, encoding="utf-8") as f:
                    weight_map = json.load(f)["weight_map"]
                files = {name: os.path.join(folder, file) for name, file in weight_map.items()}
            except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
                raise SpecError(f"cannot read the shard index: {' '.join(str(err).split())[:200]}",
                                location=index) from None
            strays = sorted({f for f in weight_map.values() if os.path.basename(f) != f or f in ("", ".", "..")})
            if strays:
                raise SpecError(f"the shard index names {strays[0]!r}, not a file of this folder", location=index,
                                hint="a weight_map names shard files beside the index")
            for path in sorted(set(files.values())):
                if not os.path.exists(path):
                    raise SpecError(f"shard {os.path.basename(path)} is missing", location=index,
                                    hint="the index lists it; copy or download it into the folder")
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
        return self._headers[path][0]

    def entry(self, name: str) -> dict:
        path = self.file(name)
        entry = self.header(path).get(name)
        if entry is None:
            raise SpecError(f"tensor {name} is not in {os.path.basename(path)}", location=path)
        return entry

    def info(self, name: str) -> tuple[str, list[int]]:
        """(safetensors dtype, shape) of a tensor, from its file's header."""
        entry = self.entry(name)
        return entry["dtype"], list(entry["shape"])

    def file(self, name: str) -> str:
        try:
            return self.files[name]
        except KeyError:
            raise SpecError(f"the checkpoint has no tensor {name}", location=self.folder) from None

    def dtype(self, name: str, integer: bool = False) -> DType:
        """A float tensor's dtype; with ``integer`` (a param an op reads as indices, such as
        DeepSeek-V4's ``tid2eid``) an I64 / I32 one's too. Anything else is refused."""
        stored, _ = self.info(name)
        if integer and stored in INTEGERS:
            return INTEGERS[stored]
        if stored not in DTYPES:
            raise SpecError(f"tensor {name} is stored as {stored}; irc reads float weights "
                            f"({', '.join(DTYPES)})", location=self.file(name),
                            hint="quantized checkpoints are not supported; use the unquantized weights")
        return DTYPES[stored]

    def read(self, name: str, start: Optional[int] = None, stop: Optional[int] = None) -> np.ndarray:
        """A tensor as stored, or only rows [start, stop) of its first axis."""
        entry = self.entry(name)
        self.dtype(name, integer=True)  # refuses other tensors (attach checks an integer one's param)
        shape = list(entry["shape"])
        item = STORED[entry["dtype"]] if entry["dtype"] in STORED else STORED_LATE[entry["dtype"]].numpy
        row = int(np.prod(shape[1:], dtype=np.int64)) * item.itemsize
        first = 0 if start is None else start
        last = (shape[0] if shape else 1) if stop is None else stop
        path = self.file(name)
        offset = self._headers[path][1] + int(entry["data_offsets"][0]) + first * row
        data = read_bytes(path, offset, (last - first) * row).view(item)
        return data.reshape([last - first] + shape[1:]) if shape else data.reshape(())


class PrefixView(Checkpoint):
    """Part of a checkpoint under other names: each stored tensor that starts with one of
    ``renames``' stored prefixes, seen with that prefix replaced by its viewed one (a VLM's
    ``model.language_model.layers.0...`` as a text model's ``model.layers.0...``). The first
    pair that matches wins; tensors no pair matches, or whose pair's viewed prefix is None (a
    VLM's tower, stored under the text model's prefix: Qwen2-VL's ``model.visual.``), are not
    in the view."""

    def __init__(self, checkpoint: Checkpoint, renames: list[tuple[Optional[str], str]]):
        self.stored: dict[str, str] = {}
        for name in checkpoint.files:
            for viewed, stored in renames:
                if name.startswith(stored):
                    if viewed is not None:
                        self.stored.setdefault(viewed + name[len(stored):], name)
                    break
        super().__init__(checkpoint.folder, {v: checkpoint.files[s] for v, s in self.stored.items()})
        self._headers = checkpoint._headers

    def entry(self, name: str) -> dict:
        path = self.file(name)
        entry = self.header(path).get(self.stored[name])
        if entry is None:
            raise SpecError(f"tensor {self.stored[name]} is not in {os.path.basename(path)}", location=path)
        return entry


# ---- where a param's data comes from ------------------------------------------------------

class Source:
    """Checkpoint tensor(s) behind one param."""

    def names(self) -> list[str]:
        raise NotImplementedError

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        raise NotImplementedError

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of the param's first axis, as stored."""
        raise NotImplementedError


class Tensor(Source):
    """One whole tensor."""

    def __init__(self, name: str):
        self.name = name

    def names(self) -> list[str]:
        return [self.name]

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        return checkpoint.info(self.name)[1]

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        return checkpoint.read(self.name, start, stop)

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

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        return checkpoint.read(self.name, self.start + start, self.start + stop)

    def __repr__(self) -> str:
        return f"{self.name}[{self.start}:{self.stop}]"


class FusedExperts(Tensor):
    """One projection of an MoE's experts fused in one [E, ...] tensor, in either of the two
    orientations checkpoints hold it (transformers 5's Qwen3-VL-MoE converter reads both the
    same way): ``part`` "gate" or "up", a half of ``gate_up_proj`` stored [E, 2F, d] (as
    transformers 5 saves it; gate first) or [E, d, 2F] (the hub's), as irc's [E, F, d]; "down",
    ``down_proj`` stored [E, d, F] or [E, F, d], as [E, d, F]. A tensor whose two trailing
    axes are the same either way is read as transformers 5 saves it, as its converter does."""

    def __init__(self, name: str, part: str, d_ff: int, d_model: int):
        super().__init__(name)
        self.part, self.d_ff, self.d_model = part, d_ff, d_model

    def _form(self, checkpoint: Checkpoint) -> tuple[list, bool]:
        """(stored shape, whether it is the hub's orientation, to transpose)."""
        stored = list(checkpoint.info(self.name)[1])
        saved = [2 * self.d_ff, self.d_model] if self.part != "down" else [self.d_model, self.d_ff]
        if len(stored) == 3 and stored[1:] in (saved, saved[::-1]):
            return stored, stored[1:] != saved
        raise SpecError(f"tensor {self.name} {stored} is not [E, {saved[0]}, {saved[1]}] or [E, {saved[1]}, "
                        f"{saved[0]}] (experts of d_model {self.d_model}, d_ff {self.d_ff})",
                        location=checkpoint.file(self.name))

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        stored, _ = self._form(checkpoint)
        return [stored[0], self.d_ff, self.d_model] if self.part != "down" else [stored[0], self.d_model, self.d_ff]

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        _, hub = self._form(checkpoint)
        data = checkpoint.read(self.name, start, stop)
        data = data.transpose(0, 2, 1) if hub else data
        if self.part != "down":
            data = data[:, :self.d_ff] if self.part == "gate" else data[:, self.d_ff:]
        return np.ascontiguousarray(data)

    def __repr__(self) -> str:
        return f"{self.name}[experts, {self.part}]"


class Zeros(Source):
    """A param the checkpoint leaves implicit, all zeros (BLIP-2's key bias: its fused qkv bias is
    q_bias | 0 | v_bias); it reads no tensor."""

    def __init__(self, shape: tuple):
        self.wanted = list(shape)

    def names(self) -> list[str]:
        return []

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        return self.wanted

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        return np.zeros([stop - start] + self.wanted[1:], np.float32)

    def __repr__(self) -> str:
        return f"zeros{self.wanted}"


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

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        parts = [checkpoint.read(part.name) for part in self.parts[start:stop]]
        if len({p.dtype for p in parts}) > 1:  # experts stored in different float types
            parts = [p.astype(np.float32) for p in parts]
        return np.stack(parts)

    def __repr__(self) -> str:
        return f"stack({self.parts[0].name}, ... {len(self.parts)} tensors)"


class CheckpointData:
    """Lazy ``Param.data``: ``load()`` or ``rows(start, stop)`` reads the source from the
    checkpoint, cast to ``dtype``."""

    reads_rows = True

    def __init__(self, checkpoint: Checkpoint, source: Source, dtype: DType):
        self.checkpoint, self.source, self.dtype = checkpoint, source, dtype

    def load(self) -> np.ndarray:
        shape = self.source.shape(self.checkpoint)
        return self.rows(0, shape[0] if shape else 1)

    def rows(self, start: int, stop: int) -> np.ndarray:
        return convert(self.source.rows(self.checkpoint, start, stop), self.dtype)

    def __repr__(self) -> str:
        return f"safetensors({self.source!r})"


class View(Tensor):
    """Part of one tensor, as a param: some of its rows (``rows``: stored row indices, in
    order — a fused projection's part, GPT-NeoX's per-head interleaved q|k|v) of the tensor
    or, with ``transpose``, of its transpose (GPT-2's Conv1D weights are stored [in, out]).
    A selection reads only the stored rows it spans; a transposed tensor is read whole."""

    def __init__(self, name: str, rows: Optional[tuple] = None, transpose: bool = False):
        super().__init__(name)
        self.selection, self.transpose = (None if rows is None else tuple(rows)), transpose

    def _stored(self, checkpoint: Checkpoint) -> list[int]:
        full = list(checkpoint.info(self.name)[1])
        if self.transpose and len(full) != 2:
            raise SpecError(f"tensor {self.name} {full} is not a 2-D weight to transpose",
                            location=checkpoint.file(self.name))
        full = full[::-1] if self.transpose else full
        if self.selection is not None and (not full or max(self.selection) >= full[0]):
            raise SpecError(f"tensor {self.name} {full} has no row {max(self.selection)}",
                            location=checkpoint.file(self.name))
        return full

    def shape(self, checkpoint: Checkpoint) -> list[int]:
        full = self._stored(checkpoint)
        return full if self.selection is None else [len(self.selection)] + full[1:]

    def rows(self, checkpoint: Checkpoint, start: int, stop: int) -> np.ndarray:
        self._stored(checkpoint)
        if self.transpose:
            data = checkpoint.read(self.name).T
            picked = data[start:stop] if self.selection is None else data[list(self.selection[start:stop])]
            return np.ascontiguousarray(picked)
        if self.selection is None:
            return checkpoint.read(self.name, start, stop)
        wanted = self.selection[start:stop]
        low, high = min(wanted), max(wanted) + 1
        return np.ascontiguousarray(checkpoint.read(self.name, low, high)[[i - low for i in wanted]])

    def __repr__(self) -> str:
        parts = (["transposed"] if self.transpose else []) + (
            [f"{len(self.selection)} rows"] if self.selection is not None else [])
        return f"{self.name}[{', '.join(parts)}]"


def attach_sources(params, checkpoint: Checkpoint, source_of: Callable[[str, tuple], Source],
                   spare: Callable[[str], bool] = lambda name: False, what: str = "the model") -> None:
    """Point each of ``params`` at its tensor(s) in ``checkpoint`` (``source_of(name, shape)``),
    names, dtypes and shapes checked; a tensor of ``checkpoint`` left over, but for those
    ``spare`` accepts, is an error (the checkpoint has weights ``what`` lacks). For a part's
    own view of a checkpoint (a VLM's tower, a dual encoder's text tower)."""
    used = set()
    for param in params:
        source = source_of(param.name, param.shape)
        for name in source.names():
            checkpoint.file(name)  # a missing tensor is an error naming it
            checkpoint.dtype(name, integer=not param.dtype.is_float)
        shape = source.shape(checkpoint)
        if tuple(shape) != param.shape:
            stored = getattr(checkpoint, "stored", {}).get(source.names()[0], source.names()[0])
            raise SpecError(f"tensor {stored} has shape {list(shape)}; config.json describes @{param.name} as "
                            f"{list(param.shape)}", location=checkpoint.file(source.names()[0]))
        param.data = CheckpointData(checkpoint, source, param.dtype)
        used.update(source.names())
    left = sorted(n for n in checkpoint.files if n not in used and not spare(n))
    if left:
        stored = getattr(checkpoint, "stored", {}).get(left[0], left[0])
        raise SpecError(f"checkpoint tensor {stored} has no place in {what} config.json describes",
                        location=checkpoint.file(left[0]), hint="the checkpoint has weights irc's model lacks")
