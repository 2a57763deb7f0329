"""Graph pictures laid out in Python: which boxes a picture shows, and where they go.

``picture`` turns (part of) a Graph into boxes and edges: one box per shown node (op,
short name, result type, key attributes and weights), faded boxes for the neighbours that
give it context, and one box per layer for the layers it collapses, so a thousand-node
graph stays a few dozen boxes. ``place`` lays the boxes out top to bottom, Sugiyama style:
longest-path layers (a box sits one row below its latest producer), long edges broken
into dummy points so they run between boxes instead of through them, barycentre sweeps
to order each row, and a few relaxation sweeps to pull boxes over their neighbours.
Edges into an ``add`` of their own type from two or more rows up are residual edges, drawn apart.

Everything is deterministic (ties break on graph order) and needs no Graphviz.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

from irc import ops
from irc.analysis import cache_inputs, elements_per_sequence, layer_of, state_inputs
from irc.graph import Graph, Node, Param

CHAR_W = 6.6        # width of one character of the 11px monospace labels
LINE_H = 14.0
PAD_X, PAD_Y = 8.0, 5.0
GAP_X, GAP_Y = 18.0, 34.0
DUMMY_W = 10.0
MAX_LABEL = 44      # characters per label line


@dataclass
class Box:
    id: str
    lines: list                       # label lines; the first is the op, drawn bold
    kind: str = "op"                  # op | io | group | context
    op: str = ""
    type: str = ""                    # the first result's type, to tell residual adds
    href: Optional[str] = None
    title: str = ""
    order: int = 0                    # graph order, for ties
    x: float = 0.0                    # centre
    y: float = 0.0                    # top
    w: float = 0.0
    h: float = 0.0
    rank: int = 0
    row_top: float = 0.0
    row_bottom: float = 0.0
    role: str = ""                    # an io box that is a recurrent "state" or a KV "cache"


@dataclass
class Edge:
    src: str
    dst: str
    residual: bool = False
    count: int = 1
    points: list = field(default_factory=list)   # (x, y) from src bottom to dst top
    chain: list = field(default_factory=list)    # src, the dummy boxes between, dst


@dataclass
class Picture:
    boxes: list
    edges: list
    width: float = 0.0
    height: float = 0.0
    note: str = ""                    # what was left out, in words


def _clip(text: str, limit: int = MAX_LABEL) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def short_name(name: str) -> str:
    """``layers.3.attn_norm_out`` -> ``attn_norm_out``: the layer is said once, by the picture."""
    layer = layer_of(name)
    return name.split(".", 2)[2] if layer is not None and name.count(".") >= 2 else name


def key_attrs(node: Node, limit: int = 3) -> str:
    """Attributes that differ from the op's defaults, short values in full, long ones elided."""
    spec = ops.get_op(node.op).attrs if node.op in ops.OPS else {}
    shown = []
    for key, value in sorted(node.attrs.items()):
        default = spec.get(key)
        if key in spec and type(value) is type(default) and value == default:
            continue
        text = json.dumps(value, sort_keys=True, separators=(",", ":"))
        shown.append(f"{key}={text if len(text) <= 18 else '{…}' if isinstance(value, dict) else '…'}")
    return " ".join(shown[:limit]) + (" …" if len(shown) > limit else "")


def node_lines(node: Node) -> list[str]:
    lines = [node.op, short_name(node.name), ", ".join(v.type_str() for v in node.outputs)]
    attrs = key_attrs(node)
    if attrs:
        lines.append(attrs)
    weights = [short_name(v.name) for v in node.inputs if isinstance(v, Param)]
    if weights:
        lines.append("@" + ", @".join(weights[:2]) + (f" +{len(weights) - 2}" if len(weights) > 2 else ""))
    return [_clip(line) for line in lines]


def _group_id(group) -> str:
    return "g_" + "".join(c if c.isalnum() else "_" for c in str(group))


def picture(graph: Graph, shown: Callable[[Node], bool], *, collapse: Optional[Callable[[str], object]] = None,
            context: bool = False, link: Optional[Callable[[Node], tuple]] = None, max_boxes: int = 90) -> Picture:
    """Boxes for the nodes ``shown`` accepts; ``collapse(name)`` names the group box a node
    not shown (or a graph input) falls into, by its name (None: left out); ``context``
    adds the direct neighbours of shown nodes as faded boxes; ``link(node)`` gives (href,
    title) for a node's provenance; past ``max_boxes`` shown nodes the rest are left out."""
    boxes: dict[str, Box] = {}
    where: dict[str, str] = {}        # value name -> box id
    members: dict[str, list] = {}
    picked = [n for n in graph.nodes if shown(n)]
    note = ""
    if len(picked) > max_boxes:
        note = f"{max_boxes} of {len(picked)} nodes shown (the first in graph order)"
        picked = picked[:max_boxes]
    chosen = {id(n) for n in picked}
    neighbours: set = set()
    if context:
        for n in picked:
            neighbours.update(id(v.producer) for v in n.inputs if v is not None and v.producer is not None)
            neighbours.update(id(u) for v in n.outputs for u in v.uses)
        neighbours -= chosen
    for order, node in enumerate(graph.nodes):
        if id(node) in chosen or id(node) in neighbours:
            box = Box(f"n{order}", node_lines(node), "op" if id(node) in chosen else "context", node.op,
                      node.outputs[0].type_str() if node.outputs else "", order=order)
            if link is not None:
                box.href, box.title = link(node)
            boxes[box.id] = box
        else:
            group = collapse(node.name) if collapse is not None else None
            if group is None:
                continue
            gid = _group_id(group)
            if gid not in boxes:
                boxes[gid] = Box(gid, [], "group", order=order)
                members[gid] = []
            members[gid].append(node)
            box = boxes[gid]
        for v in node.outputs:
            where[v.name] = box.id
    for gid, nodes in members.items():
        counts = Counter(n.op for n in nodes).most_common(3)
        label = str(collapse(nodes[0].name))
        boxes[gid].lines = [_clip(f"{label}"), f"{len(nodes)} nodes",
                            _clip(" · ".join(f"{c} {op}" for op, c in counts))]
        boxes[gid].title = f"{label}: {len(nodes)} nodes, collapsed"
    edges: dict[tuple, Edge] = {}
    inputs = {v.name for v in graph.inputs}
    roles = {**{v.name: "cache" for v in cache_inputs(graph)}, **{v.name: "state" for v in state_inputs(graph)}}
    for node in graph.nodes:
        dst = where.get(node.outputs[0].name) if node.outputs else None
        if dst is None:
            continue
        for v in node.inputs:
            if v is None or isinstance(v, Param):
                continue
            src = where.get(v.name)
            if src is None and v.name in inputs and collapse is not None:
                group = collapse(v.name)
                src = _group_id(group) if group is not None and _group_id(group) in boxes else None
            if src is None and v.name in inputs and boxes[dst].kind != "context":
                src = "in_" + v.name
                if src not in boxes:
                    boxes[src] = _input_box(src, v, roles.get(v.name, ""))
            if src is None or src == dst or (boxes[src].kind == "context" and boxes[dst].kind == "context"):
                continue
            edges.setdefault((src, dst), Edge(src, dst, count=0)).count += 1
    kept = _thin_fan_out(boxes, list(edges.values())) if members else list(edges.values())
    ordered = sorted(boxes.values(), key=lambda b: (b.order, b.id))
    return Picture(ordered, kept, note=note)


def _input_box(box_id: str, value, role: str) -> Box:
    """A graph input's box; a recurrent state says its fixed size per sequence, a KV cache
    that it grows with the past."""
    lines = [_clip("%" + value.name), value.type_str()]
    if role == "state":
        n = elements_per_sequence(value)
        lines.append(_clip(f"state: {n:,} elements ({value.dtype.nbytes(n):,} B)/seq, fixed"))
    elif role == "cache":
        lines.append("KV cache: grows with P")
    return Box(box_id, lines, "io", type=value.type_str(), order=-1, role=role)


def _thin_fan_out(boxes: dict, edges: list) -> list:
    """In a picture of layer groups, an input or group read by many later groups (a position
    input, a mask or constant shared since layer 0) keeps only its edge to the first
    reader; its box says how many more read it, instead of a ladder of long edges."""
    readers: dict[str, list] = {}
    for e in edges:
        if boxes[e.dst].kind == "group" and boxes[e.src].kind in ("io", "group"):
            readers.setdefault(e.src, []).append(e)
    dropped = set()
    for src, out in readers.items():
        if len(out) <= 1:
            continue
        out.sort(key=lambda e: (boxes[e.dst].order, e.dst))
        dropped.update(id(e) for e in out[1:])
        boxes[src].lines.append(f"(+{len(out) - 1} later layers read it)")
    return [e for e in edges if id(e) not in dropped]


# ---- placement -------------------------------------------------------------------------

def _size(box: Box) -> None:
    box.w = max(len(line) for line in box.lines) * CHAR_W + 2 * PAD_X if box.lines else DUMMY_W
    box.h = len(box.lines) * LINE_H + 2 * PAD_Y if box.lines else 0.0


def place(pic: Picture) -> Picture:
    """Give every box a position and every edge its points (in place; returns ``pic``)."""
    if not pic.boxes:
        pic.width, pic.height = 40.0, 20.0
        return pic
    by_id = {b.id: b for b in pic.boxes}
    for b in pic.boxes:
        _size(b)
    preds: dict[str, list] = {b.id: [] for b in pic.boxes}
    position = {b.id: i for i, b in enumerate(pic.boxes)}
    for e in pic.edges:
        if position[e.src] < position[e.dst]:   # graph order is topological; drop anything else
            preds[e.dst].append(e.src)
    for b in pic.boxes:                         # longest-path layering
        b.rank = 1 + max((by_id[p].rank for p in preds[b.id]), default=-1)
    succs: dict[str, list] = {b.id: [] for b in pic.boxes}
    for dst, sources in preds.items():
        for src in sources:
            succs[src].append(dst)
    constant: dict[str, bool] = {}              # no data in: constants, weights cast or transposed
    for b in pic.boxes:
        constant[b.id] = b.kind != "io" and all(constant[p] for p in preds[b.id])
    for b in reversed(pic.boxes):               # inputs and constants sit right above their first reader
        if (constant[b.id] or b.kind == "io") and succs[b.id]:
            b.rank = min(by_id[s].rank for s in succs[b.id]) - 1
    for e in pic.edges:                         # a skip into a same-shaped add: the residual stream
        src, dst = by_id[e.src], by_id[e.dst]
        e.residual = dst.op == "add" and dst.rank - src.rank >= 2 and src.type == dst.type != ""
    rows = _rows_with_dummies(pic, by_id)
    up, down = _neighbours(pic)
    _order(rows, up, down)
    _coordinates(rows, up, down)
    _route(pic, rows)
    return pic


def _rows_with_dummies(pic: Picture, by_id: dict) -> list[list]:
    n_rows = 1 + max(b.rank for b in pic.boxes)
    rows: list[list] = [[] for _ in range(n_rows)]
    for b in pic.boxes:
        rows[b.rank].append(b)
    for k, e in enumerate(pic.edges):
        src, dst = by_id[e.src], by_id[e.dst]
        chain = []
        for r in range(src.rank + 1, dst.rank):
            d = Box(f"d{k}_{r}", [], "dummy", order=src.order, rank=r)
            _size(d)
            rows[r].append(d)
            chain.append(d)
        e.chain = [src] + chain + [dst]
    return rows


def _neighbours(pic: Picture) -> tuple[dict, dict]:
    up: dict[str, list] = {}
    down: dict[str, list] = {}
    for e in pic.edges:
        if e.chain[0].rank >= e.chain[-1].rank:
            continue
        for a, b in zip(e.chain, e.chain[1:]):
            down.setdefault(a.id, []).append(b)
            up.setdefault(b.id, []).append(a)
    return up, down


def _order(rows: list[list], up: dict, down: dict) -> None:
    for row in rows:
        row.sort(key=lambda b: (b.order, b.id))
    for sweep in range(6):
        index = {b.id: i for row in rows for i, b in enumerate(row)}
        sequence = rows[1:] if sweep % 2 == 0 else rows[-2::-1]
        adjacent = up if sweep % 2 == 0 else down
        for row in sequence:
            def key(item):
                i, b = item
                near = adjacent.get(b.id, [])
                return (sum(index[n.id] for n in near) / len(near) if near else i, i)
            row[:] = [b for _, b in sorted(enumerate(row), key=key)]
            for i, b in enumerate(row):
                index[b.id] = i


def _coordinates(rows: list[list], up: dict, down: dict) -> None:
    y = 12.0
    for row in rows:
        height = max((b.h for b in row), default=0.0)
        for b in row:
            b.y = y + (height - b.h) / 2
            b.row_top, b.row_bottom = y, y + height
        y += height + GAP_Y
    for row in rows:                       # packed, then relaxed towards neighbours' centres
        x = 0.0
        for b in row:
            b.x = x + b.w / 2
            x += b.w + GAP_X
    for sweep in range(8):
        sequence = rows if sweep % 2 == 0 else rows[::-1]
        for row in sequence:
            wanted = []
            for b in row:
                near = up.get(b.id, []) + down.get(b.id, [])
                wanted.append(sum(n.x for n in near) / len(near) if near else b.x)
            _pack(row, wanted)
    left = min(b.x - b.w / 2 for row in rows for b in row)
    for row in rows:
        for b in row:
            b.x += 40.0 - left


def _pack(row: list, wanted: list) -> None:
    """Centres as near ``wanted`` as the order and gaps allow (a left and a right pass, averaged)."""
    right = []
    edge = -1e18
    for b, w in zip(row, wanted):
        x = max(w, edge + b.w / 2)
        right.append(x)
        edge = x + b.w / 2 + (GAP_X if b.kind != "dummy" else 4.0)
    left = []
    edge = 1e18
    for b, w in zip(reversed(row), reversed(wanted)):
        x = min(w, edge - b.w / 2)
        left.append(x)
        edge = x - b.w / 2 - (GAP_X if b.kind != "dummy" else 4.0)
    left.reverse()
    mid = [(a + c) / 2 for a, c in zip(right, left)]
    edge = -1e18
    for b, x in zip(row, mid):             # averaging can reintroduce overlap: one more left pass
        b.x = max(x, edge + b.w / 2)
        edge = b.x + b.w / 2 + (GAP_X if b.kind != "dummy" else 4.0)


def _route(pic: Picture, rows: list[list]) -> None:
    for e in pic.edges:
        chain = e.chain
        pts = [(chain[0].x, chain[0].y + chain[0].h)]
        for d in chain[1:-1]:
            pts.append((d.x, d.row_top))
            pts.append((d.x, d.row_bottom))
        pts.append((chain[-1].x, chain[-1].y))
        if e.residual:                      # leave and enter from the side, so the skip reads as one
            src, dst = chain[0], chain[-1]
            pts[0] = (src.x - src.w / 2 + 6, src.y + src.h)
            pts[-1] = (dst.x - dst.w / 2 + 6, dst.y)
        e.points = pts
        e.chain = []
    pic.width = max(b.x + b.w / 2 for row in rows for b in row) + 40.0
    pic.height = max(b.row_bottom for row in rows for b in row) + 12.0
