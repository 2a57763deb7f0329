"""Keeping freed memory in the process: ``keep_freed_memory()`` before a compile streams
weights.

A compile reads, converts and quantizes every weight a piece at a time, so NumPy buffers of
tens of MB are allocated and freed thousands of times. glibc's malloc serves such sizes with
``mmap`` and gives them back with ``munmap`` (and trims its heap top past 128 KB), so each
new buffer is fresh memory: every 4 KB page faults and is zeroed by the kernel on first
touch. On the Llama-3-8B-shaped checkpoint that was most of the time spent reading the
shards (cProfile of a 2-layer compile: ``readinto`` 5.8 s of 15.5; with freed memory kept,
0.8 s). Raising the mmap threshold to 1 GB and the trim threshold to 2 GB keeps freed
buffers in the heap for the next piece; the process holds at most what it held at its peak,
which the streaming writer bounds (peak RSS unchanged, ``benchmarks/big_checkpoint.py``).

A tuning, not a feature: where the C library has no ``mallopt`` (not glibc), nothing changes
and nothing is reported; the compile is the same, only slower.
"""
from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = (1 << 31) - 1


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed buffers for reuse (module docstring); True when it took it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


__all__ = ["keep_freed_memory"]
