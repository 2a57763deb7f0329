"""The weights of an ONNX model, streamed into its external data file in bounded memory.

``plan(weights, location)`` lays the initializers out: each of ``SMALL_TENSOR`` bytes or
more gets a ``ALIGN``-aligned range of ``<model>.data`` (in the order the builder met
them, so the same graph gives the same file) and an external-data reference; smaller ones
stay inline in the model. ``write_data(layout, path)`` then fills the file:

- the file is sized and its blocks reserved first (``posix_fallocate``), so a full disk
  fails before the first byte rather than in the middle;
- each initializer is cut into pieces of about ``PIECE_ELEMENTS`` elements along its first
  axis (``Initializer.chunking``): a piece reads only those rows of its params (a
  positioned read of the checkpoint, ``irc.weights.read_rows``), applies the
  initializer's ``load`` (cast, transpose, interleave, int4 packing), and is written at its
  place in the file with ``os.pwrite``. ``"rows"`` pieces are contiguous; a ``"columns"``
  piece (a transposed weight, [in, out] from rows of [out, in]) is the whole weight up to
  ``WHOLE_BYTES``, else one segment of ``SEGMENT_BYTES`` or more per row of the result.
  (Not a memory map of the file: the kernel maps neighbouring cached pages on each fault,
  and they count as the process's resident memory.) Initializers that cannot be cut are
  one piece;
- initializers whose params' data share a ``share`` key (the parts of one quantized
  weight, ``irc.weights.Derived``) are cut at the same rows and run as one task, block by
  block, so the work behind them is done once per block and by one thread;
- ``workers`` threads run the pieces (NumPy and file I/O release the GIL); at most that
  many pieces are alive at once, so memory is a few pieces whatever the model's size;
- Ctrl-C or SIGTERM (an exception in the waiting thread) stops the workers before their
  next piece and is raised within ``STOP_GRACE`` seconds: the workers are daemon threads,
  never waited for past that, so the process ends promptly and the caller (``OutputFolder``)
  removes the staged file while a piece may still be finishing.

Bytes are those ``numpy_helper.from_array`` would store (little-endian; 4-bit values two
per byte, low nibble first), at the offsets the layout gives, so the output does not
depend on the number of workers or the piece size.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from onnx import TensorProto, numpy_helper

from irc.output import OutputError
from irc.progress import SILENT, Progress
from irc.weights import read_rows, reads_rows

from backends.onnx.builder import ONNX_TYPES, Initializer, as_is

SMALL_TENSOR = 1024
ALIGN = 4096
PIECE_ELEMENTS = 8 << 20      # elements of the widest row (param or result) per piece
WHOLE_BYTES = 256 << 20       # a transposed weight up to this size is one piece
SEGMENT_BYTES = 32 << 10      # else each of its pieces writes segments at least this long
WORKERS = 2
STOP_GRACE = 0.25          # seconds an interrupted write waits for its workers' pieces


@dataclass
class Layout:
    """Where each initializer goes: ``inline`` ones in the model, ``placed`` ones
    (initializer, offset) in the data file of ``size`` bytes."""

    location: str
    inline: list = field(default_factory=list)
    placed: list = field(default_factory=list)
    size: int = 0

    def tensors(self, weights: list) -> list[TensorProto]:
        """``weights`` as the model lists them, in their order: inline ones with their data,
        placed ones as external-data references."""
        offsets = {init.name: offset for init, offset in self.placed}
        return [_external(_empty(init), self.location, offsets[init.name], init.nbytes) if init.name in offsets
                else numpy_helper.from_array(init.array(), init.name) for init in weights]


def plan(weights: list, location: str, small: int = SMALL_TENSOR) -> Layout:
    layout, offset = Layout(location), 0
    for init in weights:
        if init.nbytes < small:
            layout.inline.append(init)
            continue
        offset += -offset % ALIGN
        layout.placed.append((init, offset))
        offset += init.nbytes
    layout.size = offset
    return layout


def inline_tensors(weights: list) -> list[TensorProto]:
    return [numpy_helper.from_array(init.array(), init.name) for init in weights]


# ---- pieces ---------------------------------------------------------------------------------

def raw_bytes(array: np.ndarray, init: Initializer) -> np.ndarray:
    """The bytes ONNX stores for ``array`` (already in ``init``'s dtype) as a uint8 array."""
    if init.dtype.bits == 4:
        nibbles = array.reshape(-1).view(np.uint8) & 0x0F
        if nibbles.size % 2:
            nibbles = np.append(nibbles, np.uint8(0))
        return nibbles[0::2] | (nibbles[1::2] << 4)
    data = np.ascontiguousarray(array)
    if sys.byteorder != "little" and data.dtype.itemsize > 1:
        data = data.byteswap()
    return data.reshape(-1).view(np.uint8)


def _step(init: Initializer, rows_total: int, even: bool) -> int:
    """Rows of the params per piece: about ``PIECE_ELEMENTS`` elements of the widest row (of a
    param, of what a derived param is computed from, or of the result). A transposed weight
    is one piece up to ``WHOLE_BYTES`` (when its params are read, not computed), else pieces
    whose segments (one per row of the result) are ``SEGMENT_BYTES`` or more, as long as a
    piece's params stay under 4 x ``PIECE_ELEMENTS`` (``PIECE_ELEMENTS`` when computed: a
    quantizer's temporaries are several times its input)."""
    source = _param_row_elements(init)
    step = PIECE_ELEMENTS // max(_row_elements(init), 1)
    if init.chunking == "columns":
        computed = any(getattr(p.data, "row_elements", None) for p in init.params)
        limit = (1 if computed else 4) * PIECE_ELEMENTS // max(source, 1)
        if init.nbytes <= WHOLE_BYTES and not computed and rows_total * source <= 8 * PIECE_ELEMENTS:
            step = rows_total
        else:
            step = max(step, min(SEGMENT_BYTES * 8 // init.dtype.bits, limit))
    step = max(1, min(rows_total, step))
    if even and step % 2 and step < rows_total:
        step += 1
    return step


def _param_row_elements(init: Initializer) -> int:
    return max(getattr(p.data, "row_elements", None) or int(np.prod(p.shape[1:], dtype=np.int64))
               for p in init.params)


def _row_elements(init: Initializer) -> int:
    """The widest row a piece touches: a param's (or its source's), or the result's (for a
    transposed weight, a piece holds every row of the [K, N] result)."""
    result = init.shape[0] if init.chunking == "columns" else int(np.prod(init.shape[1:], dtype=np.int64))
    return max(_param_row_elements(init), result)


def can_cut(init: Initializer) -> bool:
    """Can ``init`` be written in pieces (else: one piece)?"""
    if init.chunking not in ("rows", "columns") or not init.params:
        return False
    if not all(reads_rows(p.data) and p.shape[0] == init.params[0].shape[0] for p in init.params):
        return False
    if init.chunking == "rows":  # 4-bit: pieces start at even rows (``_step``), so on whole bytes
        return init.shape[0] == init.params[0].shape[0]
    return len(init.shape) == 2 and init.shape[1] == init.params[0].shape[0] and \
        (init.dtype.bits != 4 or init.shape[1] % 2 == 0)  # 4-bit: every segment starts on a byte


@dataclass
class Piece:
    """Rows [start, stop) of ``init``'s params, to be written at ``offset``."""

    init: Initializer
    offset: int
    start: int
    stop: int
    whole: bool
    last: bool

    def write(self, fd: int) -> int:
        """Compute the piece and write it into the file; returns the bytes written."""
        init = self.init
        if self.whole:
            data = raw_bytes(init.array(), init)
            _pwrite_all(fd, data, self.offset)
            return data.size
        arrays = [read_rows(p, self.start, self.stop) for p in init.params]
        data = raw_bytes(init.convert(init.load(*arrays)), init)
        bits = init.dtype.bits
        if init.chunking == "rows":
            row = int(np.prod(init.shape[1:], dtype=np.int64))
            _pwrite_all(fd, data, self.offset + self.start * row * bits // 8)
            return data.size
        rows, width = init.shape  # columns [start, stop) of a [K, N] result: a segment per row
        if self.start == 0 and self.stop == width:
            _pwrite_all(fd, data, self.offset)
            return data.size
        segment = data.reshape(rows, -1)
        for row in range(rows):
            _pwrite_all(fd, segment[row], self.offset + (row * width + self.start) * bits // 8)
        return data.size


def pieces(layout: Layout) -> list[list[Piece]]:
    """The layout's pieces as tasks, each a list of pieces one worker runs in order, largest
    tasks first. Initializers whose params share a ``share`` key form one task: all their
    pieces, row block by row block (their common source is then computed once per block, and
    never by two threads at once); any other initializer gives one task per piece."""
    groups: dict = {}
    for init, offset in (unit for placed in layout.placed for unit in segments(*placed)):
        key = _share(init)
        groups.setdefault(("share", key) if key is not None else ("own", init.name), []).append((init, offset))
    tasks = []
    for (kind, _), group in groups.items():
        total = group[0][0].params[0].shape[0] if group[0][0].params else 0
        cut = all(can_cut(init) and init.params[0].shape[0] == total for init, _ in group)
        if not cut:
            whole = [[Piece(init, offset, 0, 0, True, True)] for init, offset in group]
            tasks += [sum(whole, [])] if kind == "share" else whole
            continue
        even = any(init.dtype.bits == 4 for init, _ in group)
        step = min(_step(init, total, even) for init, _ in group)
        blocks = [[Piece(init, offset, start, min(total, start + step), False, start + step >= total)
                   for init, offset in group] for start in range(0, total, step)]
        tasks += [sum(blocks, [])] if kind == "share" else blocks
    return sorted(tasks, key=_longest_first)


def segments(init: Initializer, offset: int) -> list:
    """[(initializer, offset)] that together write ``init``: a ``"stacked"`` one (its params'
    rows one after another, ``quant_pack``'s packed q|k|v codes) as one ``"rows"``
    initializer per param at that param's place, so each is streamed by rows like a lone
    weight (and with the other parts of its quantized weight, which share its source);
    any other as itself. Stays whole when a param's place would not start on a byte."""
    if init.chunking != "stacked":
        return [(init, offset)]
    row_bits = int(np.prod(init.shape[1:], dtype=np.int64)) * init.dtype.bits
    starts = np.cumsum([0] + [p.shape[0] for p in init.params[:-1]])
    if any(start * row_bits % 8 for start in starts):
        return [(init, offset)]
    return [(Initializer(f"{init.name}[{p.name}]", init.dtype, (p.shape[0], *init.shape[1:]), (p,), as_is, "rows"),
             offset + int(start) * row_bits // 8) for p, start in zip(init.params, starts)]


def _longest_first(task: list) -> int:
    """Sort key: tasks of several pieces (a quantized weight) by size, largest first, so the
    last to finish is a short one; the other tasks after them in layout order."""
    if len(task) == 1:
        return 0
    return -sum(piece.init.nbytes if piece.whole else piece.init.nbytes * (piece.stop - piece.start)
                // piece.init.params[0].shape[0] for piece in task)


def _share(init: Initializer):
    keys = {getattr(p.data, "share", None) for p in init.params}
    return keys.pop() if len(keys) == 1 and init.params else None


# ---- the file -------------------------------------------------------------------------------

def write_data(layout: Layout, path: str, progress: Progress = SILENT, workers: int = WORKERS) -> None:
    """Write the placed initializers of ``layout`` into a new file at ``path``. An exception
    in the calling thread (Ctrl-C, SIGTERM) stops the workers at their next piece and is
    raised after at most ``STOP_GRACE`` seconds, whether or not they have ended."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
    pool = _Workers(fd, progress, workers)
    try:
        _reserve(fd, layout.size, path)
        tasks = pieces(layout)
        with progress.weights(sum(init.nbytes for init, _ in layout.placed), len(layout.placed)):
            pool.run(tasks)
    finally:
        if pool.ended():  # else a worker may still write: the descriptor stays open (until exit),
            os.close(fd)  # so its number cannot go to a file that the worker would then write into


def _reserve(fd: int, size: int, path: str) -> None:
    if size == 0:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno in (28, 122):  # ENOSPC, EDQUOT
            raise OutputError(f"not enough room on the disk for {size:,} bytes of weights", location=path,
                              hint="free some space or write the output to another disk") from None
        os.ftruncate(fd, size)  # a file system without fallocate: a sparse file of the right size


class _Workers:
    """``count`` daemon threads taking tasks in order from one list (one count runs them in
    the calling thread); each checks ``stop`` before every piece. The first error stops them
    all and is raised once they have ended. Daemon threads: a process that exits (after
    Ctrl-C) does not wait for a piece in progress."""

    def __init__(self, fd: int, progress: Progress, count: int):
        self.fd, self.progress, self.count = fd, progress, count
        self.stop, self.lock, self.errors = threading.Event(), threading.Lock(), []
        self.done = threading.Condition(self.lock)
        self.tasks: list = []
        self.threads: list = []
        self.running = 0

    def run(self, tasks: list) -> None:
        self.tasks = list(reversed(tasks))
        if self.count <= 1:
            self._work()
        else:
            self._start_and_wait()
        if self.errors:
            raise self.errors[0]

    def ended(self) -> bool:
        return not any(thread.is_alive() for thread in self.threads)

    def _start_and_wait(self) -> None:
        self.running = self.count
        self.threads = [threading.Thread(target=self._guarded, name=f"irc-writer-{i}", daemon=True)
                        for i in range(self.count)]
        for thread in self.threads:
            thread.start()
        try:
            with self.lock:
                while self.running:
                    self.done.wait()  # a signal's exception is raised here, in the calling thread
        except BaseException:
            self.stop.set()
            end = time.monotonic() + STOP_GRACE
            for thread in self.threads:
                thread.join(timeout=max(0.0, end - time.monotonic()))
            raise

    def _guarded(self) -> None:
        try:
            self._work()
        except BaseException as err:  # handed to the waiting thread, which raises it
            with self.lock:
                self.errors.append(err)
            self.stop.set()
        finally:
            with self.lock:
                self.running -= 1
                self.done.notify_all()

    def _work(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                if not self.tasks:
                    return
                task = self.tasks.pop()
            for piece in task:
                if self.stop.is_set():
                    return
                self.progress.wrote(piece.write(self.fd), tensor_done=piece.last)


def _pwrite_all(fd: int, data: np.ndarray, offset: int) -> None:
    view = memoryview(data)
    while view.nbytes:
        try:
            done = os.pwrite(fd, view, offset)
        except OSError as err:
            if err.errno in (28, 122):
                raise OutputError("the disk filled up while the weights were written",
                                  hint="free some space or write the output to another disk") from None
            raise
        view, offset = view[done:], offset + done


# ---- references -----------------------------------------------------------------------------

def _external(tensor: TensorProto, location: str, offset: int, length: int) -> TensorProto:
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = TensorProto.EXTERNAL
    return tensor


def _empty(init: Initializer) -> TensorProto:
    tensor = TensorProto()
    tensor.name, tensor.data_type = init.name, ONNX_TYPES[init.dtype]
    tensor.dims.extend(init.shape)
    return tensor

