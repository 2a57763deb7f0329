"""Lazy weight data: seeded initializers and derived params.

A ``Param.data`` is present (an array), absent (None) or lazy: any object with
``load() -> np.ndarray``. ``SeededInit`` gives every param deterministic random data from
its name alone, so two runs (and the graph before and after a pass) see the same weights.
"""
from __future__ import annotations

import hashlib
from typing import Callable

import numpy as np

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
    """A param computed from others on demand (a pass's folded weight)."""

    def __init__(self, compute: Callable[[], np.ndarray], description: str):
        self.compute, self.description = compute, description

    def load(self) -> np.ndarray:
        return self.compute()

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


def materialize(param: Param) -> np.ndarray:
    data = param.array()
    if data is None:
        raise ValueError(f"param @{param.name} has no data (shape-only compile)")
    return data
