"""Gated DeltaNet (``gated_delta_rule``: Qwen3-Next, Qwen3.5) split by key heads for
``shard{tp=N}`` (``passes/shard.py``), as vLLM splits it: rank r keeps key heads
r·H_k/N .. and the value heads that belong to them, so every rank runs the same rule on
fewer heads, and the output projection's partial sums meet in an all-reduce.

The mixer is built from primitives (``frontends.dsl_delta``), so its feature axes are
concatenations of per-head blocks. Each rank takes its 1/N of every block:

- the projections' rows: whole key-head groups where the checkpoint groups them (Qwen3-Next's
  ``in_proj_qkvz`` / ``in_proj_ba``, read through a reshape to heads), the q | k | v segments
  of Qwen3.5's ``in_proj_qkv`` (it feeds the convolution directly), a block of ``in_proj_z``,
  ``in_proj_b``, ``in_proj_a``;
- the convolution's channels (its weight, bias, state and present) in q | k | v segments;
  ``A_log``, ``dt_bias``, the recurrent state by value heads; ``out_proj``'s columns;
- attributes: a reshape's head count or flat width, a slice of a flat axis (its bounds, as
  every segment shrinks alike; a slice within a head is kept), the expanded norm weight's
  head count, the rule's head counts.

Refused (the caller names the node): a gated norm across heads (``group_size`` other than
the value head width), key heads N does not divide, and anything else on the way.
"""
from __future__ import annotations

from irc.graph import Node, Param, Value

FLAT_OPS = ("reshape", "slice", "concat", "expand")


def plan_delta(plan, node: Node) -> None:
    """Record the cuts, attribute changes and the all-reduce of one ``gated_delta_rule``."""
    a = node.attrs
    kh, vh, dk, dv = a["key_heads"], a["value_heads"], a["key_dim"], a["value_dim"]
    n = plan.tp
    plan.divide(node, kh, "the key heads")
    q, k, v, alpha, beta, a_log, dt_bias = node.inputs[:7]
    for param in (a_log, dt_bias):
        plan.cut(node, param, 0, vh // n)
    if len(node.inputs) > 7 and node.inputs[7] is not None:
        plan.state(node.inputs[7], node.outputs[1], 1, vh // n)
    plan.attrs.append((node, {"key_heads": kh // n, "value_heads": vh // n}))
    walker = _Walker(plan, node, n)
    segments = [kh * dk, kh * dk, vh * dv]
    conv = _conv_of(plan, node, q, k, v)
    walker.conv(conv, segments)
    for value in (alpha, beta):
        walker.back(value)
    norm = _single_user(plan, node, node.outputs[0], "gated_rms_norm")
    if norm.attrs["group_size"] != dv:
        raise plan.error(norm, f"its groups of {norm.attrs['group_size']} span value heads of {dv}: no split")
    walker.back(norm.inputs[1])  # the gate z
    walker.back(norm.inputs[2])  # the expanded norm weight
    plan.row_parallel(_single_user(plan, node, norm.outputs[0], "linear"), vh * dv // n)


def _conv_of(plan, node: Node, *values: Value) -> Node:
    """The causal convolution q, k and v are sliced from."""
    convs = {id(v.producer.inputs[0].producer): v.producer.inputs[0].producer for v in values
             if v.producer is not None and v.producer.op == "slice" and v.producer.inputs[0].producer is not None}
    conv = next(iter(convs.values()), None) if len(convs) == 1 else None
    if conv is None or conv.op != "causal_conv1d":
        raise plan.error(node, "q, k and v are not slices of one causal convolution (the DeltaNet layout irc builds)")
    return conv


def _single_user(plan, node: Node, value: Value, op: str) -> Node:
    users = plan.graph.users(value)
    if len(users) != 1 or users[0].op != op:
        raise plan.error(node, f"%{value.name} is not read by one {op}")
    return users[0]


class _Walker:
    """Walks from the rule's operands back to the projections, re-aiming attributes at a
    rank's share and cutting the projections' rows."""

    def __init__(self, plan, node: Node, n: int):
        self.plan, self.node, self.n = plan, node, n
        self.done: set = set()

    def conv(self, conv: Node, segments: list) -> None:
        plan, n = self.plan, self.n
        block = sum(segments) // n
        plan.conv(conv, block, segments=segments)
        for user in plan.graph.users(conv.outputs[0]):
            self.adjust(user)
        source = conv.inputs[0]
        if source.producer is not None and source.producer.op == "linear":  # Qwen3.5: q | k | v rows
            plan.cut(source.producer, source.producer.inputs[1], 0, block, segments=segments)
            self.done.add(id(source.producer))
        else:
            self.back(source)

    def back(self, value: Value) -> None:
        """Up through reshapes, slices, concats and expands to the projections (or params)."""
        if isinstance(value, Param) or value is None:
            return
        node = value.producer
        if node is None or id(node) in self.done:
            return
        self.done.add(id(node))
        if node.op == "linear":
            if not isinstance(node.inputs[1], Param):
                raise self.plan.error(self.node, f"%{node.name} projects with a computed weight")
            self.plan.cut(node, node.inputs[1], 0, node.inputs[1].shape[0] // self.n)
            return
        if node.op not in FLAT_OPS:
            raise self.plan.error(self.node, f"%{node.name} ({node.op}) sits between a projection and the rule")
        self.adjust(node)
        for source in node.inputs:
            self.back(source)

    def adjust(self, node: Node) -> None:
        """A reshape's or expand's first size, a flat slice's bounds: a rank's share."""
        n, attrs = self.n, node.attrs
        if node.op in ("reshape", "expand"):
            shape = list(attrs["shape"])
            first = next(i for i, d in enumerate(shape) if isinstance(d, int))
            shape[first] //= n
            self.plan.attrs.append((node, {"shape": shape}))
        elif node.op == "slice" and node.inputs[0].rank == 3:  # a flat axis of concatenated segments
            self.plan.attrs.append((node, {key: attrs[key] // n for key in ("start", "end")
                                           if isinstance(attrs.get(key), int)}))
        elif node.op not in ("slice", "concat"):
            raise self.plan.error(self.node, f"%{node.name} ({node.op}) sits between the convolution and the rule")
