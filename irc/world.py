"""A sharded graph's ranks run in one process: the reference for tensor parallelism.

The shard pass (``passes/shard.py``) leaves one rank's program and, in
``graph.meta["shard"]``, how each sharded param, input and output is cut: ``{"axis", "block",
"rep"}`` — rank r holds elements [i x block, (i + 1) x block) of the full tensor along
``axis``, i = r // rep (``rep`` > 1 where ranks share a block: KV heads replicated when there
are fewer than ranks). An axis made of concatenated ``segments`` (a fused projection's
z | x | B | C | dt rows, a convolution's x | B | C channels) is cut segment by segment, rank r
taking its share of each; ``ways`` (with ``world``) where the segments split differently (B and C
replicated beside heads cut N ways). A block with ``owner`` is that rank's alone, zeros on the
others (a bias the ranks' partial sums would otherwise add N times). A sharded param's data is a ``Shard`` of the full weight.

``run_world(graph, feeds)`` takes the unsharded graph's feeds (full caches), cuts each rank's
inputs, runs every rank's program in its own thread (``irc.ops.collective.CONTEXT`` tells the
collectives their rank; they meet at a barrier in program order) and joins each output back
(a replicated output is rank 0's, checked equal on every rank; a cut one is the ranks'
blocks joined in order, one rank per block), so a sharded graph has its unsharded graph's
contract and the interpreter runs it wherever it runs the original (``irc.interpreter``).
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Optional

import numpy as np

from irc.errors import IRCError
from irc.graph import Graph, Value
from irc.ops import collective
from irc.weights import SeededInit, load_data

KEY = "shard"
RECV_TIMEOUT = 600  # seconds a stage waits for the one before it (a failed rank stops the others sooner)


class Shard:
    """Lazy data of one rank's block of a full weight (``data``, absent: seeded by the full
    weight's name and shape, as the unsharded graph would be). Only ``for_rank`` reads it."""

    def __init__(self, data, name: str, shape: tuple, dtype, cut: dict):
        self.data, self.name, self.shape, self.dtype, self.cut = data, name, tuple(shape), dtype, dict(cut)

    def full(self, seed: int = 0, centre: float = 1.0) -> np.ndarray:
        data = self.data if self.data is not None else SeededInit(self.name, self.shape, self.dtype, seed,
                                                                  centre=centre)
        return np.asarray(load_data(data))

    def for_rank(self, rank: int, seed: int = 0, centre: float = 1.0) -> np.ndarray:
        return block(self.full(seed, centre), self.cut, rank)

    def load(self) -> np.ndarray:
        raise IRCError(f"@{self.name} is sharded: read one rank's block (irc.world)",
                       hint="run the sharded graph through irc.world.run_world")


def _shares(cut: dict) -> list:
    """Each of the cut axis's ``segments``: (start, size, blocks it is cut into, ranks holding
    each block): ``ways`` / ``world`` where the segments differ (Mamba-2's B and C groups
    replicated beside heads split N ways), else N / ``rep`` blocks of ``rep`` ranks each."""
    segments = cut["segments"]
    starts = np.cumsum([0] + list(segments[:-1]))
    if cut.get("ways"):
        split = [(ways, cut["world"] // ways) for ways in cut["ways"]]
    else:
        split = [(sum(segments) // cut["block"], cut.get("rep", 1))] * len(segments)
    return [(int(start), int(n), ways, every) for start, n, (ways, every) in zip(starts, segments, split)]


def block(array: np.ndarray, cut: dict, rank: int) -> np.ndarray:
    """Rank ``rank``'s block of ``array`` (module docstring); with ``segments``, its share of
    each segment, joined."""
    if "owner" in cut and rank != cut["owner"]:  # held by one rank (a bias added once), zeros elsewhere
        return np.zeros_like(block(array, {k: v for k, v in cut.items() if k != "owner"}, rank))
    if not cut.get("segments"):
        size, index = cut["block"], rank // cut.get("rep", 1)
        return np.ascontiguousarray(np.take(array, np.arange(index * size, (index + 1) * size), axis=cut["axis"]))
    rows = [np.arange(start + rank // every * n // ways, start + (rank // every + 1) * n // ways)
            for start, n, ways, every in _shares(cut)]
    return np.ascontiguousarray(np.take(array, np.concatenate(rows), axis=cut["axis"]))


def join(parts: list, cut: dict) -> np.ndarray:
    """The full tensor from every rank's block (one rank per block)."""
    if not cut.get("segments"):
        return np.concatenate(parts[::cut.get("rep", 1)], axis=cut["axis"])
    axis, pieces, offset = cut["axis"], [], 0
    for _, n, ways, every in _shares(cut):
        share = n // ways
        pieces += [np.take(part, np.arange(offset, offset + share), axis=axis) for part in parts[::every]]
        offset += share
    return np.concatenate(pieces, axis=axis)


def full_size(cut: dict, world: int) -> int:
    """The length of a cut axis in the unsharded tensor."""
    if cut.get("segments"):
        return sum(cut["segments"])
    return cut["block"] * world // cut.get("rep", 1)


class World:
    """The ranks' meeting point: ``exchange(rank, x)`` returns every rank's x, in rank order,
    once all have arrived; ``send(dst, x)`` / ``recv(src, rank)`` pass one array from one rank
    to another (pipeline stages)."""

    def __init__(self, size: int):
        self.size, self.barrier = size, threading.Barrier(size)
        self.slots: list = [None] * size
        self.mail = {(a, b): queue.Queue() for a in range(size) for b in range(size) if a != b}

    def send(self, dst: int, array: np.ndarray) -> None:
        self.mail[(collective.CONTEXT.rank, dst)].put(array)

    def recv(self, src: int, rank: int) -> np.ndarray:
        try:
            return self.mail[(src, rank)].get(timeout=RECV_TIMEOUT)
        except queue.Empty:
            raise IRCError(f"rank {rank} waited {RECV_TIMEOUT} s for stage {src}'s activation") from None

    def exchange(self, rank: int, array: np.ndarray) -> list:
        self.slots[rank] = array
        self.barrier.wait()
        parts = list(self.slots)
        self.barrier.wait()  # nobody writes the next exchange before everyone has read this one
        return parts


def full_view(graph: Graph, values) -> list:
    """``values`` (a sharded graph's inputs or outputs) as the unsharded graph has them: copies
    whose cut axis has every rank's blocks (what ``run_world`` takes and returns)."""
    spec = graph.meta.get(KEY)
    if not spec:
        return list(values)
    cuts = {**spec.get("inputs", {}), **spec.get("outputs", {})}
    viewed = []
    for value in values:
        cut = cuts.get(value.name)
        if cut is None:
            viewed.append(value)
            continue
        shape = list(value.shape)
        shape[cut["axis"]] = full_size(cut, spec["tp"])
        viewed.append(Value(value.name, value.dtype, shape))
    return viewed


def world_size(graph: Graph) -> Optional[int]:
    spec = graph.meta.get(KEY)
    return None if not spec else spec["tp"] * spec.get("pp", 1)


def runs_on(graph: Graph, rank: Optional[int]):
    """``node -> bool``: whether ``rank`` runs the node (a pipeline stage runs its own nodes,
    and a pipe it sends or receives; without stages, every rank runs every node)."""
    stages = (graph.meta.get(KEY) or {}).get("stages")
    if rank is None or not stages:
        return lambda node: True

    def runs(node) -> bool:
        if node.op == "pipe":
            return rank in (node.attrs["src"], node.attrs["dst"])
        return stages.get(node.name, rank) == rank
    return runs


def run_world(interpreter, feeds: Mapping[str, np.ndarray]) -> dict:
    """The outputs of ``interpreter.graph``, sharded, from the unsharded graph's ``feeds``."""
    graph: Graph = interpreter.graph
    spec = graph.meta[KEY]
    size = world_size(graph)
    world = World(size)
    cuts_in, cuts_out = spec.get("inputs", {}), spec.get("outputs", {})

    def rank_run(rank: int) -> dict:
        collective.CONTEXT.rank, collective.CONTEXT.world = rank, world
        try:
            fed = {name: block(np.asarray(a), cuts_in[name], rank) if name in cuts_in else a
                   for name, a in feeds.items()}
            return interpreter.run_rank(fed, rank)
        except BaseException:
            world.barrier.abort()  # the others stop at their next collective
            raise
        finally:
            collective.CONTEXT.world = None

    with ThreadPoolExecutor(max_workers=size) as pool:
        futures = [pool.submit(rank_run, rank) for rank in range(size)]
    errors = [f.exception() for f in futures if f.exception() is not None]
    first = next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0] if errors else None)
    if first is not None:
        raise first  # the rank that failed, not the ones its failure stopped
    results = [f.result() for f in futures]
    joined = {}
    for value in graph.outputs:
        parts = [r[value.name] for r in results if value.name in r]  # pipeline stages: the rank that made it
        if value.name in cuts_out:
            joined[value.name] = join(parts, cuts_out[value.name])
        else:
            if any(not np.array_equal(parts[0], p) for p in parts[1:]):
                raise IRCError(f"output %{value.name} differs between ranks, but the shard pass says it is "
                               "replicated", location=f"graph {graph.name}")
            joined[value.name] = parts[0]
    return joined


__all__ = ["KEY", "Shard", "World", "block", "full_size", "full_view", "join", "run_world", "runs_on", "world_size"]
