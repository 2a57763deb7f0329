"""Norms whose features a tensor-parallel split spreads over ranks (``passes/shard.py``): the
norm becomes its primitives in float32 with the sum of squares all-reduced, so every rank
normalises its features by the statistic of the whole group.

- Mamba-2's gated norm (``gated_rms_norm``) where a group spans ranks: transformers' Mamba-2
  normalises all d_inner features at once, Nemotron-H's groups span ranks above tp = n_groups
  (a [B, T, 1] all-reduce a token for one group, what vLLM's ``Mixer2RMSNormGated`` reduces;
  [B, T, G] for G groups, each rank's sum in its group's slot by a one-hot row of its own,
  ``<norm>.group_of_rank``, and read back from there);
- an RMS norm over all heads of q or k (OLMo-2, MiniMax-M2): one group over every rank's heads.
  Where KV heads are replicated, every head is counted by each of its N / H_kv ranks, and the
  sum is divided by N x the rank's width, so the mean is the whole row's.

Guarantee: the rewritten norm gives the unsharded norm's values on each rank's features (up to
float32 summation order).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph, Node, Param, Value
from irc.rewrite.edit import cast_to, constant, replace_node
from irc.world import Shard

F32 = DType.parse("f32")


def world_norm(graph: Graph, node: Node, world: int, size: int, groups: int = 1, cuts: Optional[dict] = None) -> None:
    """``gated_rms_norm`` or ``rms_norm`` (``node``) whose groups of ``size`` features (counted
    with replication) each span world / groups ranks, rewritten (module docstring)."""
    gated = node.op == "gated_rms_norm"
    y, z, w = node.inputs if gated else (node.inputs[0], None, node.inputs[1] if len(node.inputs) > 1 else None)
    name, eps = node.outputs[0].name, node.attrs["eps"]
    before_gate, offset = node.attrs.get("norm_before_gate", False), node.attrs.get("offset", 0.0)
    f32 = F32

    def op(kind: str, inputs: list, role: str, attrs=None) -> Value:
        return emit1(graph, kind, inputs, attrs, f"{name}.{role}", before=node, origin=node.origin)

    y32 = cast_to(graph, y, f32, f"{name}.y32", before=node)
    gate = op("silu", [cast_to(graph, z, f32, f"{name}.z32", before=node)], "gate") if gated else None
    x = op("mul", [y32, gate], "gated") if gated and not before_gate else y32
    squares = op("reduce_sum", [op("mul", [x, x], "squares")], "local_sum", {"axes": [-1], "keepdims": True})
    if groups > 1:
        onehot = _group_of_rank(graph, f"{name}.group_of_rank", world, groups, cuts)
        squares = op("mul", [squares, onehot], "slot")
    total = op("all_reduce", [squares], "sum", {"world": world})
    if groups > 1:
        total = op("reduce_sum", [op("mul", [total, onehot], "own")], "group_sum", {"axes": [-1], "keepdims": True})
    mean = op("mul", [total, constant(graph, 1.0 / size, f32, f"{name}.inv_features", before=node)], "mean")
    inv = op("rsqrt", [op("add", [mean, constant(graph, float(eps), f32, f"{name}.eps", before=node)], "var")],
             "inv_rms")
    out = op("mul", [x, inv], "normed")
    if w is not None:
        weight = cast_to(graph, w, f32, f"{name}.weight32", before=node)
        if offset:
            weight = op("add", [weight, constant(graph, float(offset), f32, f"{name}.offset", before=node)], "gain")
        out = op("mul", [out, weight], "scaled")
    if gated and before_gate:
        out = op("mul", [out, gate], "gated_out")
    replace_node(graph, node, [cast_to(graph, out, y.dtype, f"{name}.out", before=node)])


def _group_of_rank(graph: Graph, name: str, world: int, groups: int, cuts: dict) -> Param:
    """A param whose rank-r block is the one-hot row of the norm group r's features are in."""
    full = np.zeros((world, groups), np.float32)
    full[np.arange(world), np.arange(world) // (world // groups)] = 1.0
    cut = {"axis": 0, "block": groups, "rep": 1}
    f32 = F32
    param = Param(name, f32, (groups,), Shard(full.reshape(-1), name, (world * groups,), f32, cut))
    graph.params[name] = param
    cuts[name] = cut
    return param


__all__ = ["world_norm"]
