"""Mamba-2 (``ssd``: Mamba-2, Codestral-Mamba, Nemotron-H, Falcon-H1, Granite-4, Zamba2)
split by heads for ``shard{tp=N}`` (``passes/shard.py``), as vLLM's ``MambaMixer2`` splits it:
rank r keeps heads r·H/N .., so every rank runs the same scan on fewer heads, and the output
projection's partial sums meet in an all-reduce.

The mixer is built from primitives (``frontends.dsl_ssm``): one ``in_proj`` whose rows are
z | x | B | C | dt, sliced; a causal convolution over x | B | C, sliced again; the scan; a
gated RMS norm with z; ``out_proj``. Each rank takes its share of every segment
(``irc.world``'s ``segments`` / ``ways``):

- z, x and dt, ``A_log``, ``D``, ``dt_bias``, the recurrent state, the norm's weight and
  ``out_proj``'s columns by heads, N ways;
- B and C by groups: G / N a rank where N divides G; where G < N (G divides N), the group a
  rank's heads read, every rank of a group holding it (vLLM replicates them too; said in the
  note), and the convolution's channels and state with them;
- the slices re-aimed at a rank's segments, the scan's head and group counts its share.

The gated norm: groups within a rank's features stay a local norm; a group over several
ranks' features (transformers' Mamba-2 normalises all d_inner at once; Nemotron-H's groups at
tp above n_groups) becomes its primitives with the sum of squares all-reduced (a [B, T, 1]
value per token for one group, what vLLM's ``Mixer2RMSNormGated`` reduces; [B, T, G] for G
groups, each rank's sum in its group's slot).

Refused (naming the node): heads N does not divide, groups (of B and C, or of the norm) and
ranks neither dividing the other, and anything else between the projection and the scan.
"""
from __future__ import annotations

from irc.errors import PassError
from irc.graph import Node, Param, Value
from passes.shard_norm import world_norm


class _Segments:
    """An axis of concatenated segments, each cut ``ways`` ways: the cut and the local offsets."""

    def __init__(self, sizes: list, ways: list, world: int):
        self.sizes, self.ways, self.world = list(sizes), list(ways), world

    def cut(self) -> dict:
        return {"segments": self.sizes, "ways": self.ways, "world": self.world}

    @property
    def block(self) -> int:
        return sum(size // ways for size, ways in zip(self.sizes, self.ways))

    def local(self, offset):
        """A segment boundary of the full axis as the rank's offset (None stays None)."""
        if offset is None:
            return None
        full = local = 0
        for size, ways in zip(self.sizes, self.ways):
            if full == offset:
                return local
            full, local = full + size, local + size // ways
        if full == offset:
            return local
        raise ValueError(offset)


def plan_ssd(plan, node: Node) -> None:
    """Record the cuts, attribute changes, norm rewrite and all-reduce of one ``ssd``."""
    a, n = node.attrs, plan.tp
    heads, head_dim, groups, state = a["heads"], a["head_dim"], a.get("groups", 1), a["state_size"]
    local = plan.divide(node, heads, "the SSM heads")
    group_ways = _group_ways(plan, node, groups)
    d_inner, bc = heads * head_dim, groups * state
    for param in (node.inputs[2], node.inputs[5], node.inputs[6]):  # A_log, D, dt_bias
        if param is not None:
            plan.cut(node, param, 0, local)
    if len(node.inputs) > 7 and node.inputs[7] is not None:
        plan.state(node.inputs[7], node.outputs[1], 1, local)
    plan.attrs.append((node, {"heads": local, "groups": groups // group_ways}))
    conv = _source(plan, node, node.inputs[0], node.inputs[3], node.inputs[4], op="causal_conv1d")
    channels = _Segments([d_inner, bc, bc], [n, group_ways, group_ways], n)
    plan.conv(conv, channels.block, **channels.cut())
    _reaim(plan, conv, conv.outputs[0], channels)
    gate, out = _plan_norm(plan, node, d_inner)
    proj_out = _source(plan, node, conv.inputs[0], node.inputs[1], gate, op=None)
    rows = _Segments([d_inner, d_inner, bc, bc, heads], [n, n, group_ways, group_ways, n], n)
    _plan_projection(plan, node, proj_out, rows)
    plan.row_parallel(out, d_inner // n)


def plan_short_conv(plan, conv: Node) -> bool:
    """LFM2's gated short convolution (in_proj -> B | C | x, B·x, depthwise conv, C · conv,
    out_proj) split by channels: in_proj's three segments, the conv's channels and state, and
    out_proj's columns, 1/N each, then ``all_reduce``. False where the pattern does not hold (a
    convolution the scan of Mamba or a DeltaNet reads: theirs)."""
    n, channels = plan.tp, conv.inputs[1].shape[0]
    gated, users = conv.inputs[0].producer, plan.graph.users(conv.outputs[0])
    if gated is None or gated.op != "mul" or len(users) != 1 or users[0].op != "mul" or channels % n:
        return False
    out = plan.graph.users(users[0].outputs[0])
    try:
        proj_out = _source(plan, conv, *gated.inputs, *[v for v in users[0].inputs if v is not conv.outputs[0]],
                           op=None)
    except PassError:
        return False
    if len(out) != 1 or out[0].op != "linear":
        return False
    local = channels // n
    plan.conv(conv, local)
    _plan_projection(plan, conv, proj_out, _Segments([channels] * 3, [n] * 3, n), what="B | C | x")
    plan.row_parallel(out[0], local)
    return True


def _group_ways(plan, node: Node, groups: int) -> int:
    """Into how many blocks B and C are cut: N where N divides the groups, else the groups (each
    held by N / G ranks)."""
    if groups % plan.tp == 0:
        return plan.tp
    if plan.tp % groups == 0:
        note = (f"shard: the Mamba-2 mixers' {groups} group(s) of B and C for {plan.tp} ranks: each is replicated "
                f"on {plan.tp // groups} ranks (with its convolution channels and state)")
        if note not in plan.notes:
            plan.notes.append(note)
        return groups
    raise plan.error(node, f"{groups} groups of B and C and {plan.tp} ranks: neither divides the other")


def _source(plan, node: Node, *values: Value, op) -> Value:
    """The one value ``values`` are all slices of (its producer an ``op`` where given)."""
    sources = set()
    for value in values:
        if value is None or value.producer is None or value.producer.op != "slice":
            raise plan.error(node, f"%{getattr(value, 'name', None)} is not a slice of the mixer's projection "
                                   "or convolution (the Mamba-2 layout irc builds)")
        sources.add(value.producer.inputs[0])
    source = next(iter(sources))
    if len(sources) != 1 or (op is not None and (source.producer is None or source.producer.op != op)):
        raise plan.error(node, "its operands are not slices of one " + (op or "projection"))
    return source.producer if op else source


def _reaim(plan, node: Node, value: Value, segments: _Segments) -> None:
    """Every slice of ``value``'s last axis re-aimed at the rank's segments."""
    for user in plan.graph.users(value):
        if user.op != "slice" or user.attrs["axis"] not in (-1, value.rank - 1):
            raise plan.error(node, f"%{user.name} ({user.op}) reads the mixer's fused axis: no split")
        try:
            bounds = {key: segments.local(user.attrs.get(key)) for key in ("start", "end")}
        except ValueError:
            raise plan.error(node, f"%{user.name} slices within a segment of %{value.name}: no split") from None
        plan.attrs.append((user, {key: v for key, v in bounds.items() if v is not None}))


def _plan_projection(plan, node: Node, proj_out: Value, rows: _Segments, what: str = "z | x | B | C | dt") -> None:
    """``in_proj``'s rows (and a µP scale's factors between it and the slices) cut by segment."""
    _reaim(plan, node, proj_out, rows)
    producer = proj_out.producer
    if producer is not None and producer.op == "mul":  # in_scale (Falcon-H1's µP multipliers)
        scale = next((v for v in producer.inputs if isinstance(v, Param)), None)
        if scale is None:
            raise plan.error(node, f"%{producer.name} scales the projection by a computed value: no split")
        plan.cut(producer, scale, 0, rows.block, **rows.cut())
        producer = next(v for v in producer.inputs if v is not scale).producer
    if producer is None or producer.op != "linear" or not isinstance(producer.inputs[1], Param):
        raise plan.error(node, f"its {what} do not come from one in_proj (linear)")
    for param in producer.inputs[1:3]:
        if param is not None:
            plan.cut(producer, param, 0, rows.block, **rows.cut())


def _plan_norm(plan, node: Node, d_inner: int) -> tuple:
    """(the gate z, out_proj): the gated norm kept local, or all-reduced where its one group
    spans every rank's features."""
    users = plan.graph.users(node.outputs[0])
    if len(users) != 1 or users[0].op not in ("gated_rms_norm", "mul"):
        raise plan.error(node, "its output is not read by one gated norm (or SiLU gate)")
    norm, n = users[0], plan.tp
    if norm.op == "mul":  # no norm: y * silu(z)
        silu = next(v for v in norm.inputs if v is not node.outputs[0]).producer
        gate = silu.inputs[0] if silu is not None and silu.op == "silu" else None
    else:
        gate, size = norm.inputs[1], norm.attrs["group_size"] or d_inner
        plan.cut(norm, norm.inputs[2], 0, d_inner // n)
        if (d_inner // n) % size:  # a group spans ranks: its sum of squares is summed across them
            groups = d_inner // size
            if n % groups:
                raise plan.error(norm, f"its {groups} groups of {size} features and {n} ranks of {d_inner // n}: "
                                       "a group would span parts of ranks")
            plan.attrs.append((norm, {"group_size": None}))  # a rank's features, until world_norm replaces it
            plan.edits.append(lambda graph: world_norm(graph, norm, n, size, groups, plan.params))  # noqa: B023
    out = plan.graph.users(norm.outputs[0])
    if len(out) != 1 or out[0].op != "linear":
        raise plan.error(node, "its gated output is not read by one out_proj (linear)")
    return gate, out[0]


__all__ = ["plan_short_conv", "plan_ssd"]
