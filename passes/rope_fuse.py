"""``rope-fuse``: decomposed rotary embeddings back into one ``rope`` op."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from irc import dims
from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph, Node, Param, Value
from irc.ops.rope import LENGTH_DEPENDENT, rope_inv_freq
from irc.passmanager import Pass, register_pass
from irc.rewrite.patterns import AnyOf, Capture, EvaluationError, Notes, Op, Rule, evaluate
from irc.rewrite.edit import is_graph_output

log = logging.getLogger("irc.passes.rope_fuse")

X, COS, SIN = Capture("x"), Capture("cos"), Capture("sin")
# cat(-x2, x1) over the last axis: halves of the rotary dims, or the two slots of a pair
ROTATE_HALF = Op("concat", Op("neg", Op("slice", X, name="upper")), Op("slice", X, name="lower"), name="rotate")
# cat(x2, -x1) turns by minus the angle: matched only to say why it is refused
ROTATE_BACKWARDS = Op("concat", Op("slice", X, name="upper"), Op("neg", Op("slice", X, name="lower")),
                      name="backwards")
# interleave(-x[..., 1::2], x[..., 0::2]): stacked on a new last axis, then flattened
_ODD, _EVEN = Op("strided_slice", X, name="odd"), Op("strided_slice", X, name="even")
ROTATE_STRIDED = Op("reshape", Op("concat", AnyOf(Op("reshape", Op("neg", _ODD)), Op("neg", Op("reshape", _ODD))),
                                  Op("reshape", _EVEN), name="stack"), name="rotate")
# x * cos + rotate(x) * sin
ROPE = Op("add", Op("mul", X, COS), Op("mul", AnyOf(ROTATE_HALF, ROTATE_STRIDED, ROTATE_BACKWARDS), SIN), name="sum")

# ops cos/sin may be computed with from positions (and constants or table params)
TABLE_OPS = {"cast", "reshape", "transpose", "expand", "slice", "strided_slice", "concat", "mul", "div", "add", "sub",
             "neg", "cos", "sin", "gather"}
VIEW_OPS = {"reshape", "transpose", "slice"}
PROBE_TOKENS, PROBE_BATCH, DEFAULT_ROWS = 8, 2, 4096


@register_pass
class RopeFuse(Pass):
    """Replace a decomposed rotary embedding ``x * cos + rotate(x) * sin`` by one ``rope``.

    Recognised: rotate-half (``cat(-x2, x1)``, convention "half") and interleaved pairs,
    either on x viewed as pairs [..., R/2, 2] or with strided slices
    (``interleave(-x[1::2], x[0::2])``), both convention "interleaved"; x a head view of an
    activation a [B, T, N*D] (reshape to [B, T, N, D], optionally transposed to
    [B, N, T, D], the first R dims sliced for a partial rotary, the rest concatenated back).
    cos and sin may be computed in-graph from integer positions [B, T] or gathered from
    table params by them; either way they must be a function of the positions alone.

    The ``rope`` op carries no table, so cos/sin are recognised numerically: they are
    evaluated on probe positions (row 0 counts from 0; later rows reach the end of a
    gathered table, else 4095), the per-pair frequencies are read off position 1, and the
    tables are held against ``rope_inv_freq`` for the model's own ``meta["rope"]`` base and
    scaling (Llama 3, YaRN, ...; never a length-dependent one, dynamic NTK or LongRoPE,
    which fixed tables cannot be) and for a base/linear factor fitted to the frequencies.
    The first candidate matching every probe (within float32 rounding of the angle) gives
    the op's ``base``/``scaling``; a table matching none is refused, never approximated.

    A match is refused, with the reason kept in ``self.notes`` and logged at debug level
    (logger ``irc.passes.rope_fuse``), when: the rotation goes the wrong way or its layout
    disagrees with the cos/sin layout (wrong convention), the rotary dim is odd, the
    position source or the frequencies are not recognised, x is not f32, the result feeds
    attention's V, or the queries and keys of one attention would get different settings.
    Fused nodes left without users (cos/sin, inv_freq constants, table params) are removed;
    the result keeps the replaced value's name. Guarantees: the reference result up to
    float32 rounding.
    """

    name = "rope-fuse"

    def run(self, graph: Graph) -> bool:
        notes = Notes(log)
        rule = RotaryRule()
        sites = []
        for node in graph.nodes:
            if node.op != "add":
                continue
            bound, reason = rule.find(graph, node)
            if reason:
                notes.add(f"rope-fuse: left %{node.name} unfused: {reason}")
            elif bound:
                sites.append(bound["site"])
        accepted = []
        for site, reason in _pair_queries_and_keys(graph, sites):
            if reason:
                notes.add(f"rope-fuse: left %{site.sum.name} unfused: {reason}")
            else:
                accepted.append(site)
        self.notes = notes.messages
        renames = [rule.rewrite(graph, site) for site in accepted]
        _sweep(graph, [n for site in accepted for n in site.nodes], [p for site in accepted for p in site.params])
        for value, name in renames:
            graph.rename(value, name)
        return bool(accepted)


@dataclass
class View:
    """How x sits in the activation a [B, T, N*D]: ``chain`` the view nodes from a to x."""

    activation: Value
    head_dim: int
    rotary: int
    pairs: bool
    chain: list


@dataclass
class Site:
    """One accepted match: the ``add`` it ends in, the settings found, where it exits."""

    sum: Node
    view: View
    positions: Value
    convention: str
    base: float
    scaling: Optional[dict]
    exit: Value = None
    undone: int = 0
    nodes: list = field(default_factory=list)
    params: list = field(default_factory=list)

    def attrs(self) -> dict:
        rotary = None if self.view.rotary == self.view.head_dim else self.view.rotary
        return {"head_dim": self.view.head_dim, "rotary_dim": rotary, "base": float(self.base),
                "convention": self.convention, "scaling": self.scaling}


class RotaryRule(Rule):
    """x * cos + rotate(x) * sin -> rope(a, positions), a the activation x is a head view of."""

    name = "rotary"
    pattern = ROPE

    def check(self, graph: Graph, bound: dict) -> Optional[str]:
        x, total = bound["x"], bound["sum"]
        if "backwards" in bound:
            return ("wrong convention: the rotation is cat(x2, -x1), which turns by minus the angle "
                    "(RoPE is cat(-x2, x1))")
        width = x.shape[-1] if x.rank else None
        if not isinstance(width, int):
            return f"the rotated dims of %{x.name} are not a fixed size ({width!r})"
        if width % 2:
            return f"odd dimension: {width} rotated dims cannot be split into pairs"
        reason = _check_rotation(bound, x, width)
        if reason:
            return reason
        view = _head_view(x)
        if isinstance(view, str):
            return view
        strided = "odd" in bound
        if strided and view.pairs:
            return "a strided rotation of an already paired view is not a RoPE layout"
        convention = "interleaved" if strided or view.pairs else "half"
        if x.dtype != DType.f32:
            return f"%{x.name} is {x.dtype}; only f32 rotations are fused exactly"
        source = _position_source([bound["cos"], bound["sin"]], view.activation)
        if isinstance(source, str):
            return source
        positions, table_nodes, params = source
        found = _identify(graph, view, x, bound["cos"], bound["sin"], positions, params, convention)
        if isinstance(found, str):
            return found
        base, scaling = found
        site = Site(total, view, positions, convention, base, scaling, params=params)
        site.exit, site.undone, exit_nodes = _exit(graph, site)
        site.nodes = _between(total, {x.name, bound["cos"].name, bound["sin"].name}) + view.chain + table_nodes
        site.nodes += exit_nodes
        bound["site"] = site
        return None

    def rewrite(self, graph: Graph, site: Site) -> tuple[Value, str]:
        """Emit rope(a, positions) (and the views still needed) before the exit's producer;
        returns (replacement, the name it takes once the old nodes are gone)."""
        z = site.exit
        before, views = z.producer, site.view.chain[:len(site.view.chain) - site.undone]
        hint = f"{site.view.activation.name}.rope" if views else f"{z.name}.fused"
        out = emit1(graph, "rope", [site.view.activation, site.positions], site.attrs(), hint, before=before)
        for node in views:
            out = emit1(graph, node.op, [out], dict(node.attrs), f"{z.name}.{node.op}", before=before)
        graph.replace_all_uses(z, out)
        return out, z.name


# ---- the checks ---------------------------------------------------------------------------

def _last_axis(node: Node) -> bool:
    rank = node.inputs[0].rank
    return node.attrs["axis"] % rank == rank - 1


def _check_rotation(bound: dict, x: Value, width: int) -> Optional[str]:
    """The slices of a rotate-half take the two halves; the strided ones the even/odd slots."""
    half = width // 2
    if "lower" in bound:
        lower, upper = bound["lower"], bound["upper"]
        if not (_last_axis(lower) and _last_axis(upper) and bound["rotate"].attrs["axis"] % x.rank == x.rank - 1):
            return "the rotation does not act on the last axis"
        spans = ((lower.attrs["start"], lower.attrs["end"]), (upper.attrs["start"], upper.attrs["end"] or width))
        if spans != ((0, half), (half, width)):
            return (f"slices x[..., {spans[0][0]}:{spans[0][1]}] and x[..., {spans[1][0]}:{spans[1][1]}] are not "
                    f"the two halves of {width} dims")
        return None
    odd, even = bound["odd"], bound["even"]
    slots = [(n.attrs["start"], n.attrs["end"] or width, n.attrs["step"]) for n in (even, odd)]
    if not (_last_axis(odd) and _last_axis(even)) or slots != [(0, width, 2), (1, width, 2)]:
        return "strided slices are not x[..., 0::2] and x[..., 1::2]"
    stack, out = bound["stack"], bound["rotate"].outputs[0]
    pieces = [v.shape for v in stack.inputs]
    if pieces[0] != x.shape[:-1] + (half, 1) or pieces[1] != pieces[0] or out.shape != x.shape:
        return "the strided halves are not interleaved back into x's layout"
    return None


def _head_view(x: Value):
    """The ``View`` of x, or the reason x is not a head view of an activation."""
    not_view = (f"%{x.name} is not a head view of an activation [B, T, N*D] (reshape to [B, T, N, D], "
                "optional transpose, rotary slice, pairs)")
    chain, value, pairs = [], x, False
    node = value.producer
    if node is not None and node.op == "reshape" and value.rank == 5 and value.shape[-1] == 2:
        pairs, source = True, node.inputs[0]
        chain.append(node)
        if source.rank == 3:  # straight from the activation: full rotary
            b, t, heads, half, _ = value.shape
            if not isinstance(heads, int) or source.shape != (b, t, heads * 2 * half):
                return not_view
            return View(source, 2 * half, 2 * half, True, chain)
        if source.shape != value.shape[:-2] + (2 * value.shape[-2],):
            return not_view
        value = source
    rotary = value.shape[-1]
    node = value.producer
    if node is not None and node.op == "slice" and _last_axis(node) and node.attrs["start"] == 0:
        chain.append(node)
        value = node.inputs[0]
    node = value.producer
    if node is not None and node.op == "transpose" and node.attrs["perm"] == [0, 2, 1, 3]:
        chain.append(node)
        value = node.inputs[0]
    node = value.producer
    if node is None or node.op != "reshape" or value.rank != 4 or node.inputs[0].rank != 3:
        return not_view
    activation = node.inputs[0]
    b, t, heads, head_dim = value.shape
    if not (isinstance(heads, int) and isinstance(head_dim, int)) or activation.shape != (b, t, heads * head_dim):
        return not_view
    chain.append(node)
    return View(activation, head_dim, rotary, pairs, list(reversed(chain)))


def _position_source(tables: list, activation: Value):
    """(positions, table nodes, table params): cos/sin must be computed from one integer
    [B, T] value with ``TABLE_OPS``, constants and params; else the reason."""
    want = activation.shape[:2]
    found: dict[str, Value] = {}
    nodes, params, seen, stack = [], [], set(), list(tables)
    while stack:
        value = stack.pop()
        if value.name in seen:
            continue
        seen.add(value.name)
        if isinstance(value, Param):
            params.append(value)
            continue
        if value.dtype in (DType.i64, DType.i32) and value.shape == want:
            found[value.name] = value
            continue
        node = value.producer
        if node is None:
            return f"position source not recognised: cos/sin read %{value.name}, not integer positions [B, T]"
        if node.op != "constant" and node.op not in TABLE_OPS:
            return f"position source not recognised: cos/sin depend on %{value.name} ({node.op})"
        nodes.append(node)
        if len(nodes) > 64:
            return "position source not recognised: cos/sin come from more than 64 nodes"
        stack.extend(v for v in node.inputs if v is not None)
    if len(found) != 1:
        what = "no integer positions [B, T]" if not found else f"several ({', '.join(sorted(found))})"
        return f"position source not recognised: cos/sin depend on {what}"
    return next(iter(found.values())), nodes, params


def _probe(view: View, positions: Value, params: list):
    """Bindings and probe positions [batch, tokens] for evaluating the tables."""
    b, t = view.activation.shape[:2]
    batch = b if isinstance(b, int) else PROBE_BATCH
    tokens = t if isinstance(t, int) else PROBE_TOKENS
    bindings = {d: n for d, n in ((b, batch), (t, tokens)) if isinstance(d, str)}
    if any(dims.symbols(d) != {d} for d in bindings):
        return None
    rows = min([p.shape[0] for p in params if p.rank >= 1] or [DEFAULT_ROWS])
    probe = np.zeros((batch, tokens), dtype=positions.dtype.numpy)
    probe[0] = np.arange(tokens) if tokens > 1 else 1
    for r in range(1, batch):
        probe[r] = np.clip(rows - r * tokens + np.arange(tokens), 0, rows - 1)
    return bindings, np.minimum(probe, rows - 1)


def _identify(graph: Graph, view: View, x: Value, cos: Value, sin: Value, positions: Value, params: list,
              convention: str):
    """(base, scaling) whose tables cos/sin are, for ``convention``; else the reason."""
    probe = _probe(view, positions, params)
    if probe is None:
        return "position source not recognised: the batch and token dims are not plain symbols"
    bindings, pos = probe
    feeds = {positions.name: pos}
    try:
        cos_value = evaluate(cos, feeds, bindings, TABLE_OPS).astype(np.float64)
        sin_value = evaluate(sin, feeds, bindings, TABLE_OPS).astype(np.float64)
        batch, tokens, features = dims.evaluate_shape(view.activation.shape, bindings)
        index = np.indices((batch, tokens, features))
        index[2] %= view.head_dim
        b_at, t_at, d_at = (evaluate(x, {view.activation.name: i}, bindings, VIEW_OPS) for i in index)
        shape = b_at.shape
        cos_value, sin_value = np.broadcast_to(cos_value, shape), np.broadcast_to(sin_value, shape)
    except EvaluationError as err:
        return f"cos/sin could not be evaluated: {err}"
    except ValueError:
        return f"cos/sin of shapes {cos.type_str()} and {sin.type_str()} do not broadcast to {x.type_str()}"
    position_at = pos[b_at, t_at]
    meta = graph.meta.get("rope") if isinstance(graph.meta.get("rope"), dict) else None
    other = "half" if convention == "interleaved" else "interleaved"
    for candidate in (convention, other):
        found = _match_tables(cos_value, sin_value, position_at, d_at, view.rotary, candidate, meta)
        if found is not None and candidate == convention:
            return found
        if found is not None:
            layout = "(i, i + R/2)" if convention == "half" else "(2i, 2i + 1)"
            return (f"wrong convention: the rotation pairs dims {layout} ({convention}) but cos/sin are laid out "
                    f"for {other} pairs")
    return ("frequencies not recognised: cos/sin do not match RoPE tables for the model's rope settings or "
            "any fitted base")


def _match_tables(cos_value, sin_value, position_at, d_at, rotary: int, convention: str, meta: Optional[dict]):
    half = rotary // 2
    pair = d_at % half if convention == "half" else d_at // 2
    angle = np.arctan2(sin_value, cos_value)
    at_one = position_at == 1
    estimate = np.zeros(half)
    for i in range(half):
        chosen = angle[at_one & (pair == i)]
        if not chosen.size:
            return None
        estimate[i] = chosen.flat[0]
    for base, scaling in _candidates(estimate, rotary, meta):
        inv_freq, factor = rope_inv_freq(rotary, base, scaling)
        angles = position_at.astype(np.float32) * inv_freq[pair]
        tolerance = 1e-6 + 4 * np.finfo(np.float32).eps * np.abs(angles) * factor
        expected_cos = (np.cos(angles) * np.float32(factor)).astype(np.float64)
        expected_sin = (np.sin(angles) * np.float32(factor)).astype(np.float64)
        if (np.abs(cos_value - expected_cos) <= tolerance).all() and (np.abs(sin_value - expected_sin) <= tolerance).all():
            return base, scaling
    return None


def _candidates(estimate: np.ndarray, rotary: int, meta: Optional[dict]):
    """The model's own rope settings first, then a base (and linear factor) fitted to the
    frequencies read at position 1, rounded to 3..7 significant digits."""
    if meta and meta.get("base") and (meta.get("scaling") or {}).get("kind") not in LENGTH_DEPENDENT:
        yield float(meta["base"]), meta.get("scaling")
    if (estimate <= 0).any():
        return
    first = float(estimate[0])
    scaling = None if abs(first - 1.0) < 1e-6 else {"factor": round(1.0 / first, 6), "kind": "linear"}
    if len(estimate) == 1:
        yield 10000.0, scaling
        return
    slope = np.polyfit(np.arange(len(estimate)), np.log(estimate), 1)[0]
    base = float(np.exp(-slope * rotary / 2))
    tried = set()
    for digits in (3, 4, 5, 6, 7):
        rounded = float(f"{base:.{digits}g}")
        if rounded not in tried:
            tried.add(rounded)
            yield rounded, scaling


def _between(root: Node, stops: set) -> list:
    """The nodes from ``root`` up to (not including) the values named in ``stops``."""
    nodes, seen, stack = [], set(), [root]
    while stack:
        node = stack.pop()
        if node.name in seen:
            continue
        seen.add(node.name)
        nodes.append(node)
        stack += [v.producer for v in node.inputs
                  if v is not None and v.name not in stops and not isinstance(v, Param) and v.producer is not None]
    return nodes


# ---- queries and keys, exits, cleanup -------------------------------------------------------

def _sole_user(graph: Graph, value: Value) -> Optional[Node]:
    users = graph.users(value)
    return users[0] if len(users) == 1 and not is_graph_output(graph, value) else None


def _exit(graph: Graph, site: Site):
    """Follow the result back out through the inverse of the entry views (pairs -> dims,
    concat with the passed-through dims, transpose back, merge heads): (exit value, how
    many views it undid, the nodes it passed)."""
    value, undone, passed = site.sum.outputs[0], 0, []
    for node in reversed(site.view.chain):
        user = _sole_user(graph, value)
        if user is None or not _undoes(user, node, value):
            break
        passed.append(user)
        if user.op == "concat":
            passed.append(user.inputs[1].producer)
        value = user.outputs[0]
        undone += 1
    return value, undone, passed


def _undoes(user: Node, node: Node, value: Value) -> bool:
    source = node.inputs[0]
    if node.op == "reshape" or node.op == "transpose":
        if user.op != node.op or user.outputs[0].shape != source.shape:
            return False
        return node.op == "reshape" or user.attrs["perm"] == [0, 2, 1, 3]
    if node.op == "slice":  # the rotary slice: concat(rotated, source[..., R:])
        if user.op != "concat" or len(user.inputs) != 2 or user.inputs[0] is not value:
            return False
        rest = user.inputs[1].producer
        return (user.attrs["axis"] % value.rank == value.rank - 1 and rest is not None and rest.op == "slice"
                and rest.inputs[0] is source and _last_axis(rest) and rest.attrs["start"] == node.attrs["end"]
                and rest.attrs["end"] in (None, source.shape[-1]))
    return False


def _attention_uses(graph: Graph, value: Value) -> list:
    """(attention node, operand index) reached from ``value`` through views."""
    found, frontier = [], [value]
    while frontier:
        current = frontier.pop()
        for user in graph.users(current):
            if user.op == "attention":
                found += [(user, i) for i, v in enumerate(user.inputs) if v is current]
            elif user.op in ("reshape", "transpose", "cast"):
                frontier.append(user.outputs[0])
    return found


def _pair_queries_and_keys(graph: Graph, sites: list) -> list:
    """Each site with None, or the reason it is refused: it feeds attention's V, or the
    queries and keys of one attention would get different rope settings."""
    by_attention: dict[str, dict[int, Site]] = {}
    reasons: dict[int, str] = {}
    for number, site in enumerate(sites):
        for attention, index in _attention_uses(graph, site.exit):
            if index == 2:
                reasons[number] = f"RoPE applied to V (the values of %{attention.name}); only q and k are rotated"
            elif index in (0, 1):
                by_attention.setdefault(attention.name, {})[index] = site
    for name, roles in by_attention.items():
        if len(roles) == 2 and roles[0].attrs() != roles[1].attrs():
            q, k = roles[0].attrs(), roles[1].attrs()
            differ = [key for key in sorted(q) if q[key] != k[key]]
            detail = ", ".join(f"{key} q: {q[key]!r}, k: {k[key]!r}" for key in differ)
            for role in (0, 1):
                reasons[sites.index(roles[role])] = f"q and k of %{name} would get different rope settings ({detail})"
    return [(site, reasons.get(number)) for number, site in enumerate(sites)]


def _sweep(graph: Graph, nodes: list, params: list) -> None:
    """Remove the given nodes (last first) once nothing reads them, then such params."""
    candidates = {id(n) for n in nodes}
    for node in reversed(list(graph.nodes)):
        if id(node) in candidates and not any(out.uses or is_graph_output(graph, out) for out in node.outputs):
            graph.remove(node)
    used = {v.name for n in graph.nodes for v in n.inputs if isinstance(v, Param)}
    for param in params:
        if param.name not in used and param.name in graph.params:
            del graph.params[param.name]
