"""Pipeline stages for ``shard{pp=P}`` (``passes/shard.py``): the layers split into P runs of
equal length, rank s running stage s.

Every node takes the stage of the layer it belongs to (its output's or its params' names,
``layers.{i}.``); nodes before the first layer (the embedding) are stage 0's, nodes after a
layer stay with that layer's stage (the final norm and the head: the last stage's). A value
one stage makes and a later stage reads crosses in a ``pipe {src, dst}`` node (the residual
stream at each boundary, and whatever else a later layer reads: RoPE tables, the mask's
expansion), so every rank reads only values its own nodes or pipes made. The map (node name
-> stage) goes to ``graph.meta["shard"]["stages"]``; ``irc.world`` runs each rank's share.
"""
from __future__ import annotations

import re
from typing import Optional

from irc.build import emit1
from irc.errors import PassError
from irc.graph import Graph, Node, Param

LAYER = re.compile(r"layers\.(\d+)\.")


def node_layer(node: Node) -> Optional[int]:
    """The layer a node belongs to, by its outputs' or params' names; None if neither says."""
    for value in list(node.outputs) + [v for v in node.inputs if isinstance(v, Param)]:
        match = LAYER.match(value.name)
        if match:
            return int(match.group(1))
    return None


def assign(graph: Graph, pp: int) -> dict:
    """node name -> stage (module docstring)."""
    layers = graph.meta.get("n_layers") or 0
    if layers < pp or layers % pp:
        raise PassError(f"shard: {layers} layers (n_layers), which {pp} pipeline stages do not divide")
    per, stage, stages = layers // pp, 0, {}
    for node in graph.nodes:
        layer = node_layer(node)
        if layer is not None:
            stage = layer // per
        stages[node.name] = stage
    return stages


def split(graph: Graph, pp: int) -> tuple[dict, list]:
    """Assign stages and put a pipe on every edge that crosses one; (stages, notes)."""
    stages = assign(graph, pp)
    piped: dict = {}  # (value id, dst) -> the pipe's output
    for node in list(graph.nodes):
        dst = stages[node.name]
        for i, value in enumerate(node.inputs):
            if value is None or isinstance(value, Param) or value.producer is None:
                continue
            src = stages[value.producer.name]
            if src == dst:
                continue
            if src > dst:
                raise PassError(f"shard: node %{node.name} (stage {dst}) reads %{value.name} from the later stage "
                                f"{src}", location=node.origin)
            key = (id(value), dst)
            if key not in piped:
                piped[key] = emit1(graph, "pipe", [value], {"src": src, "dst": dst}, f"{value.name}.to{dst}",
                                   before=node, origin=node.origin)
                stages[piped[key].producer.name] = dst
            node.set_input(i, piped[key])
    boundary = sum(1 for (_, dst) in piped)
    return stages, [f"shard: {pp} pipeline stages of {graph.meta['n_layers'] // pp} layers, {boundary} values "
                    "crossing their boundaries (pipe)"]
