"""Collective ops of a sharded graph (``passes/shard.py``): the graph is one rank's program,
the same on every rank of a world of ``world`` ranks, and these ops exchange with the others.

- ``all_reduce(x) {world}``: the sum of every rank's ``x``, on every rank (after a
  row-parallel projection: each rank holds a partial sum).
- ``all_gather(x) {world, axis}``: every rank's ``x`` joined along ``axis`` in rank order (the
  vocabulary-parallel head's logits).
- ``pipe(x) {src, dst}``: x sent from pipeline stage ``src``'s rank to stage ``dst``'s (the
  activation crossing a stage boundary); the rank of ``dst`` reads what ``src`` sent.
- ``vocab_embedding(ids, table) {world, scale}``: this rank's rows of a vocabulary split in
  ``world`` equal blocks: the embedding of the ids in its block, zero for the others (an
  ``all_reduce`` then gives every id its row).

Their references need the rank and the other ranks: ``irc.world.run_world`` runs a world's
ranks in one process, each in a thread that knows its rank (``CONTEXT``), the collectives
meeting at a barrier in program order. Outside such a run they raise.

Cost (bytes over the links, per rank, as a ring does it): an all-reduce of n bytes moves
2 (N - 1) / N x n, an all-gather of an n-byte result (N - 1) / N x n, a pipe n
(``link_bytes``).
"""
from __future__ import annotations

import threading

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.errors import IRCError
from irc.ops.registry import REQUIRED, Cost, OpDef, TensorType, axis_index, expect, register

CONTEXT = threading.local()  # .rank and .world (irc.world.World) inside a world run


def current():
    world = getattr(CONTEXT, "world", None)
    if world is None:
        raise IRCError("a collective op runs inside a world of ranks (irc.world.run_world); this graph was "
                       "sharded by the shard pass", hint="run the sharded graph through irc.world.run_world")
    return CONTEXT.rank, world


def link_bytes(op: str, nbytes: int, world: int) -> int:
    """Bytes one rank sends for a collective whose full result is ``nbytes`` (a ring)."""
    if world <= 1:
        return 0
    if op == "pipe":
        return nbytes
    factor = 2 * (world - 1) if op == "all_reduce" else (world - 1)
    return nbytes * factor // world


def _same_infer(inputs, attrs):
    expect(attrs["world"] >= 1, f"world must be at least 1, got {attrs['world']}")
    return [TensorType(inputs[0].dtype, inputs[0].shape)]


def _all_reduce_reference(inputs, attrs):
    """The sum over the world's ranks of each rank's x, in rank order."""
    rank, world = current()
    parts = world.exchange(rank, np.asarray(inputs[0]))
    total = parts[0].astype(np.float32)
    for part in parts[1:]:
        total = total + part.astype(np.float32)
    return [total.astype(inputs[0].dtype)]


def _gather_infer(inputs, attrs):
    x = inputs[0]
    expect(attrs["world"] >= 1, f"world must be at least 1, got {attrs['world']}")
    axis = axis_index(attrs["axis"], x.rank, "all_gather")
    shape = list(x.shape)
    shape[axis] = dims.mul(attrs["world"], shape[axis])
    return [TensorType(x.dtype, tuple(shape))]


def _all_gather_reference(inputs, attrs):
    """Every rank's x joined along ``axis`` in rank order."""
    rank, world = current()
    return [np.concatenate(world.exchange(rank, np.asarray(inputs[0])), axis=attrs["axis"])]


def _collective_cost(inputs, outputs, attrs, op: str) -> Cost:
    nbytes = outputs[0].nbytes
    return Cost(bytes_read=inputs[0].nbytes + link_bytes(op, nbytes, attrs["world"]), bytes_written=nbytes)


def _all_reduce_cost(inputs, outputs, attrs):
    return _collective_cost(inputs, outputs, attrs, "all_reduce")


def _all_gather_cost(inputs, outputs, attrs):
    return _collective_cost(inputs, outputs, attrs, "all_gather")


def _vocab_infer(inputs, attrs):
    ids, table = inputs
    expect(ids.dtype in (DType.i64, DType.i32), f"vocab_embedding: ids must be integer, got {ids.dtype}")
    expect(table.rank == 2, f"vocab_embedding: table must be [rows, d], got {dims.format_shape(table.shape)}")
    return [TensorType(table.dtype if table.dtype.is_float else DType.f32, ids.shape + (table.shape[1],))]


def _vocab_reference(inputs, attrs):
    """This rank's block of rows (rows r x n .. (r + 1) x n): each id's row there, zero for ids
    outside it; times ``scale`` when set."""
    ids, table = inputs
    rank, _ = current()
    rows = table.shape[0]
    local = np.asarray(ids) - rank * rows
    inside = (local >= 0) & (local < rows)
    out = np.take(table.astype(np.float32), np.where(inside, local, 0), axis=0) * inside[..., None]
    if attrs["scale"] is not None:
        out = out * np.float32(attrs["scale"])
    return [out.astype(table.dtype if table.dtype.kind == "f" else np.float32)]


def _vocab_cost(inputs, outputs, attrs):
    return Cost(bytes_read=inputs[0].nbytes + outputs[0].nbytes, bytes_written=outputs[0].nbytes)


register(OpDef("all_reduce", ("x",), {"world": REQUIRED}, _same_infer, _all_reduce_reference, _all_reduce_cost,
               foldable=False))
register(OpDef("all_gather", ("x",), {"world": REQUIRED, "axis": -1}, _gather_infer, _all_gather_reference,
               _all_gather_cost, foldable=False))
register(OpDef("vocab_embedding", ("ids", "table"), {"world": REQUIRED, "scale": None}, _vocab_infer,
               _vocab_reference, _vocab_cost, level="model", foldable=False))

def _pipe_infer(inputs, attrs):
    expect(attrs["src"] != attrs["dst"], f"pipe: src and dst are both stage {attrs['src']}")
    return [TensorType(inputs[0].dtype, inputs[0].shape)]


def _pipe_reference(inputs, attrs):
    """x from pipeline stage ``src``'s rank to stage ``dst``'s (send there, receive here)."""
    rank, world = current()
    if rank == attrs["src"]:
        world.send(attrs["dst"], np.asarray(inputs[0]))
        return [np.asarray(inputs[0])]
    return [world.recv(attrs["src"], rank)]


def _pipe_cost(inputs, outputs, attrs):
    return Cost(bytes_read=inputs[0].nbytes + outputs[0].nbytes, bytes_written=outputs[0].nbytes)


register(OpDef("pipe", ("x",), {"src": REQUIRED, "dst": REQUIRED}, _pipe_infer, _pipe_reference, _pipe_cost,
               foldable=False))

COLLECTIVES = ("all_reduce", "all_gather", "pipe")
