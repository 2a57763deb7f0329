"""``quantize{method=awq}``: AWQ (Lin et al. 2023, "AWQ: Activation-aware Weight Quantization
for LLM Compression and Acceleration"), as AutoAWQ's ``_search_best_scale`` does it, folded
exactly into the graph's params; the codes are then the ``ort`` codes of the scaled weights.

Groups: the ``linear`` nodes that read one activation x (q|k|v after the attention norm,
gate|up after the MLP norm, down after the up projection's product, each only after
``lower-mlp``; fused MLP nodes are not grouped). A group is scaled when x's producer can take
1/s exactly and nothing but the group reads x:

- ``rms_norm`` / ``layer_norm`` whose weight (and bias) only it reads: w' = (w + o) / s - o
  (o the norm's ``offset``: 1 for Gemma's (1 + w) norm, else 0), b' = b / s;
- ``mul`` (the MLP's act(gate) * up) with an operand from a ``linear`` whose weight (and bias)
  only it reads and whose output only the mul reads: that linear's rows (and bias) / s.

Not scaled (their weights get plain ``ort`` codes; the pass's notes say which and why): the
output projection after ``attention`` (1/s in v's rows would also scale the present V cache,
a graph output, and with GQA v's width is not o's: AutoAWQ skips v->o there too); the LM head
and anything tied to the embedding table (AutoAWQ leaves the head alone; its search would run
vocabulary-wide outputs ``GRID`` times); any x with another reader, a producer that is not one
of the above, or a weight some other node reads too.

Search (``search_scale``), per group, on the calibration activations X [T, K] (all windows):
x̄ = mean_t |X| per input channel; for α = i / ``GRID``, i = 0 .. GRID-1 (AutoAWQ's grid,
without its ``duo_scaling`` weight term, as the paper writes it), s = max(x̄^α, 1e-4),
normalised s / sqrt(max(s) min(s)); the loss is the mean squared difference between X W^T and
X (Q(W s) / s)^T over every output of the group's weights, Q the ``ort`` blockwise quantizer
of the pass's bits / block / symmetry, applied to W s rounded to the param's dtype exactly as
the folded param is later computed. The α with the smallest loss is kept (the first on a tie).
α = 0 is s = 1, plain ``ort``: so on the calibration activations no group's output error is
ever larger than ``ort``'s.

Then AutoAWQ's second step, the clipping search (``passes.quantize_awq_clip``), on by
default (``awq_fold(clip=False)`` skips it): every linear weight but the query / key
projections and the LM head gets, per output row and block, the max-abs shrink (1, 0.95,
..., 0.55) whose clamp, quantized by the same ``ort`` codes, has the smallest block output
error on its input x / s, searched once the weight's data is final (up's rows / s of the down
group included); a row whose whole output error would grow keeps no clip, so the guarantee
above still holds after the clip.

Folds are lazy (``irc.weights.Derived`` over ``Folded``, by rows), so the float graph with
the scales folded computes the same function (up to float rounding) and a shape-only graph
is never materialised. Calibration streams like GPTQ's (``passes.quantize_calibrate``'s
layerwise run, on the float graph: AWQ's activations are the float model's, as AutoAWQ's
are): memory is the live activations (calibration_tokens x width each, all windows) plus one
group's search: X, and per chunk of ``CHUNK_ELEMENTS`` weights its rows, their scaled and
quantized copy and two [T, rows] outputs (the clip's: ``passes.quantize_awq_clip``; an input
x / s waits, copied, for its weight's last fold, at most until the next group). It grows with
calibration_tokens x d_ff, not with the model's depth or size beyond its widest layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Optional

import numpy as np

from irc.dtypes import DType
from irc.errors import PassError
from irc.evaluate import windows
from irc.graph import Graph, Param, Value
from irc.ops.nn import f32
from irc.ops.quant import dequantize_blocks
from irc.rewrite.edit import is_graph_output
from irc.weights import Derived, convert, read_rows

from passes.quantize_awq_clip import clip as apply_clip, plan_clips, search_clip
from passes.quantize_calibrate import _Layerwise
from passes.quantize_methods import is_embedding_or_head
from passes.quantize_ort import ort_blocks

GRID = 20            # α candidates, i / GRID for i in range(GRID) (AutoAWQ's n_grid)
MIN_SCALE = 1e-4     # AutoAWQ's clamp of x̄^α
CHUNK_ELEMENTS = 1 << 21  # weights searched at once (8 MiB of float32)
NORMS = ("rms_norm", "layer_norm")
FUSED_MLPS = {"swiglu", "geglu", "gelu_mlp"}


def candidate_scales(x_mean: np.ndarray, grid: int = GRID) -> list:
    """[(α, s float32 [K])] for α = i / grid (module docstring); α = 0 gives s = 1."""
    x_mean = np.asarray(x_mean, np.float32)
    out = []
    for i in range(grid):
        s = np.maximum(np.power(x_mean, np.float32(i / grid)), np.float32(MIN_SCALE))
        s = s / np.sqrt(s.max() * s.min())
        s[~np.isfinite(s)] = 1
        out.append((i / grid, s.astype(np.float32)))
    return out


def scaled_rows(rows: np.ndarray, scale: np.ndarray, dtype: DType) -> np.ndarray:
    """W s (columns times ``scale``), in float32 then rounded to ``dtype``: the folded weight."""
    return convert(f32(rows) * scale, dtype)


def fake_quantized(weight: np.ndarray, scale: np.ndarray, bits: int, block_size: int, symmetric: bool,
                   dtype: DType) -> np.ndarray:
    """Q(W s) / s, float32: what the group's weight computes once folded and quantized."""
    scaled = scaled_rows(weight, scale, dtype)
    parts = ort_blocks(scaled, bits=bits, block_size=block_size, symmetric=symmetric, scale_dtype=dtype.numpy.name)
    return dequantize_blocks(*parts, bits=bits, block_size=block_size, k=weight.shape[-1]) / scale


def search_scale(x: np.ndarray, weights: list, *, bits: int, block_size: int, symmetric: bool,
                 grid: int = GRID) -> tuple:
    """(α, s [K] float32, losses [grid] float64) for one group: ``x`` [..., K] the calibration
    activations, ``weights`` [(read(start, stop) -> rows [r, K], row count, DType)], each read
    ``CHUNK_ELEMENTS`` weights at a time (module docstring)."""
    x = f32(x).reshape(-1, np.shape(x)[-1])
    k = x.shape[1]
    candidates = candidate_scales(np.abs(x).mean(axis=0, dtype=np.float64), grid)
    losses = np.zeros(len(candidates))
    outputs = 0
    for read, count, dtype in weights:
        step = max(1, CHUNK_ELEMENTS // k)
        for start in range(0, count, step):
            rows = np.asarray(read(start, min(start + step, count)))
            exact = x @ f32(rows).T
            for i, (_, s) in enumerate(candidates):
                diff = x @ fake_quantized(rows, s, bits, block_size, symmetric, dtype).T
                diff -= exact
                losses[i] += float(np.einsum("tn,tn->", diff, diff, dtype=np.float64))
            outputs += rows.shape[0]
    losses /= max(outputs * x.shape[0], 1)
    best = int(np.argmin(losses))
    return candidates[best][0], candidates[best][1], losses


class Folded:
    """Lazy data of a param with a scale folded in (``irc.weights.Derived``'s compute): the
    source's rows [start, stop) in float32, plus ``offset``, times ``multiply`` along the last
    axis, divided by ``divide`` along the first, minus ``offset``, rounded to the param's dtype."""

    def __init__(self, source: Param, multiply: Optional[np.ndarray] = None, divide: Optional[np.ndarray] = None,
                 offset: float = 0.0):
        self.source, self.multiply, self.divide, self.offset = source, multiply, divide, np.float32(offset)

    def __call__(self) -> np.ndarray:
        return self.rows(0, self.source.shape[0])

    def rows(self, start: int, stop: int) -> np.ndarray:
        a = np.array(read_rows(self.source, start, stop), np.float32)  # one float32 copy, then in place
        if self.offset:
            a += self.offset
        if self.multiply is not None:
            a *= self.multiply
        if self.divide is not None:
            a /= self.divide[start:stop].reshape((-1,) + (1,) * (a.ndim - 1))
        if self.offset:
            a -= self.offset
        return convert(a, self.source.dtype)

    @property
    def row_elements(self) -> int:
        return self.source.numel // max(self.source.shape[0], 1)


def fold(param: Param, what: str, **scales) -> None:
    """Replace ``param``'s data by ``Folded`` over its current data (folds compose)."""
    source = Param(param.name, param.dtype, param.shape, param.data)
    param.data = Derived(Folded(source, **scales), f"awq @{param.name}: {what}")


@dataclass
class Group:
    """Linears reading one activation, and where 1/s goes: [(param, offset)] divided by rows."""
    index: int
    x: Value
    weights: list
    divided: list = field(default_factory=list)


def _only_reader(graph: Graph, value, node) -> bool:
    """``node`` is the only reader of ``value``, and the value is no graph output."""
    return all(user is node for user in graph.users(value)) and not is_graph_output(graph, value)


def _divisible(graph: Graph, x: Value) -> tuple:
    """([(param, offset)] that take 1/s for x's producer, None) or (None, why not)."""
    producer = x.producer
    if producer is None:
        return None, f"%{x.name} is a graph input"
    if producer.op in NORMS:
        offset = float(producer.attrs.get("offset", 0.0) or 0.0) if producer.op == "rms_norm" else 0.0
        params = [v for v in producer.inputs[1:] if v is not None]
        if not all(isinstance(p, Param) and _only_reader(graph, p, producer) for p in params):
            return None, f"the weight of %{producer.name} ({producer.op}) is shared or computed"
        return [(params[0], offset)] + [(p, 0.0) for p in params[1:]], None
    if producer.op == "mul":
        for operand in reversed(producer.inputs):
            linear = operand.producer if isinstance(operand, Value) and not isinstance(operand, Param) else None
            if linear is None or linear.op != "linear" or not _only_reader(graph, operand, producer) \
                    or producer.inputs.count(operand) > 1:
                continue
            params = [v for v in linear.inputs[1:] if v is not None]
            if all(isinstance(p, Param) and _only_reader(graph, p, linear) for p in params):
                return [(p, 0.0) for p in params], None
        return None, f"%{x.name} is a product (mul) with no operand from a linear whose rows only it reads"
    if producer.op == "attention":
        return None, (f"it reads the output of %{producer.name} (attention): 1/s in v's rows would also scale "
                      f"the present V cache, a graph output (and with GQA v is narrower than o's input)")
    return None, f"%{x.name} comes from {producer.op}, which cannot take 1/s exactly"


def plan_groups(graph: Graph, wanted: set) -> tuple:
    """([Group] in graph order, {weight name: why it is not scaled})."""
    found, skipped = {}, {}
    for index, node in enumerate(graph.nodes):
        weight = node.inputs[1] if node.op == "linear" else None
        if isinstance(weight, Param) and weight.name in wanted:
            found.setdefault(id(node.inputs[0]), (index, node.inputs[0], []))[2].append(node)
    groups = []
    for index, x, linears in found.values():
        weights = [n.inputs[1] for n in linears]
        readers = graph.users(x)
        why = None
        if any(is_embedding_or_head(w) for w in weights):
            why = "the LM head (and a table tied to it) keeps ort codes, as AutoAWQ leaves the head"
        elif is_graph_output(graph, x):
            why = f"%{x.name} is a graph output"
        elif any(n not in linears for n in readers) or any(n.inputs.count(x) > 1 for n in linears):
            other = next((n for n in readers if n not in linears), linears[0])
            why = f"%{x.name} is also read by %{other.name} ({other.op})"
        elif any(len(graph.users(w)) > 1 for w in weights):
            why = "a weight of the group has another reader"
        divided = None
        if why is None:
            divided, why = _divisible(graph, x)
        if why is None:
            groups.append(Group(index, x, weights, divided))
        else:
            skipped.update({w.name: why for w in weights})
    grouped = {w.name for g in groups for w in g.weights} | set(skipped)
    for name in sorted(wanted - grouped):
        readers = sorted({n.op for n in graph.users(graph.params[name])})
        hint = " (run lower-mlp first to scale a fused MLP)" if set(readers) & FUSED_MLPS else ""
        skipped[name] = f"read by {', '.join(readers)}, not a linear{hint}"
    return groups, skipped


def awq_fold(graph: Graph, tokens: list, params: list, config: dict, block_size, bits_of=None, window: int = 512,
             seed: int = 0, clip: bool = True) -> tuple:
    """Search and fold every scalable group of ``params`` in ``graph``, then (``clip``) search
    and apply the clip of every clippable linear weight (``passes.quantize_awq_clip``), once
    its data is final (after the group that divides its rows, if any), on its input / s, at
    ``bits_of(name)`` (default ``config["bits"]``: a ``mixed`` recipe's 8-bit weights).
    Returns ({weight name: α} for the searched weights (α = 0: nothing folded),
    {weight name: why not scaled}, notes). PassError when the text gives fewer than
    ``calibration_tokens`` tokens."""
    if len(tokens) < config["calibration_tokens"]:
        raise PassError(f"quantize: the calibration text gives {len(tokens)} tokens, method=awq asks for "
                        f"calibration_tokens={config['calibration_tokens']}", location=config["calibration"],
                        hint=f"give a longer text, or calibration_tokens={len(tokens)}")
    wanted = {p.name for p in params}
    groups, skipped = plan_groups(graph, wanted)
    clips, unclipped = plan_clips(graph, wanted) if clip else ({}, {})
    alphas, notes, scales, pending = {}, [], {}, []
    if not groups and not clips:
        return alphas, skipped, notes
    ready = {w.name: index for index, w in clips.items()}
    for group in groups:
        for param, _ in group.divided:
            if param.name in ready:
                ready[param.name] = max(ready[param.name], group.index)
    clone = graph.clone()
    run = _Layerwise(clone, windows(tokens, window), seed)
    stop = max([g.index for g in groups] + list(clips))
    by_index = {group.index: group for group in groups}  # a group sits at its first linear: one an index
    for index, node in enumerate(clone.nodes[:stop + 1]):
        x = None
        if index in by_index:
            group = by_index[index]
            x = run.rows(node.inputs[0])
            alpha, s = _scale_group(group, x, config, block_size, notes)
            alphas.update({w.name: alpha for w in group.weights})
            scales.update({w.name: s for w in group.weights if alpha > 0})
        if index in clips:
            weight = clips[index]
            if x is None:
                x = run.rows(node.inputs[0])
            pending.append((ready[weight.name], weight, x / scales[weight.name] if weight.name in scales else x))
        del x
        for _, weight, x_scaled in [job for job in pending if job[0] <= index]:
            _clip_weight(weight, x_scaled, config, block_size, bits_of, notes)
        pending = [job for job in pending if job[0] > index]
        if index < stop:
            run.run(index, node, {})
    for why in sorted(set(unclipped.values())):
        names = [f"@{n}" for n, w in sorted(unclipped.items()) if w == why]
        notes.append(f"quantize: awq leaves {len(names)} weight(s) unclipped: {why}: {', '.join(names[:4])}"
                     f"{', ...' if len(names) > 4 else ''}")
    return alphas, skipped, notes


def _scale_group(group: Group, x: np.ndarray, config: dict, block_size, notes: list) -> tuple:
    """Search ``group``'s scale on ``x`` [T, K] and fold it when α > 0; (α, s)."""
    sources = [(partial(read_rows, w), w.shape[0], w.dtype) for w in group.weights]
    alpha, s, losses = search_scale(x, sources, bits=config["bits"], block_size=block_size(x.shape[1]),
                                    symmetric=config["symmetric"])
    names = [w.name for w in group.weights]
    if alpha > 0:
        for weight in group.weights:
            fold(weight, f"columns times s (alpha={alpha:.2f})", multiply=s)
        for param, offset in group.divided:
            fold(param, f"divided by s of {', '.join(names)} (alpha={alpha:.2f})", divide=s, offset=offset)
    notes.append(f"quantize: awq {', '.join('@' + n for n in names)}: alpha={alpha:.2f}, output error "
                 f"{losses.min() / losses[0] if losses[0] > 0 else 1.0:.3f} of ort's")
    return alpha, s


def _clip_weight(weight: Param, x: np.ndarray, config: dict, block_size, bits_of, notes: list) -> None:
    """Search ``weight``'s clip on its input ``x`` [T, K] (already / s) and apply it when any block shrinks."""
    bits = bits_of(weight.name) if bits_of else config["bits"]
    block = block_size(weight.shape[-1], bits)
    choice, (before, after) = search_clip(x, partial(read_rows, weight), weight.shape[0], weight.dtype,
                                          bits=bits, block_size=block, symmetric=config["symmetric"])
    if choice.any():
        apply_clip(weight, choice, block)
    notes.append(f"quantize: awq clip @{weight.name}: {np.mean(choice > 0):.0%} of blocks shrunk, output error "
                 f"{after / before if before > 0 else 1.0:.3f} of unclipped")


__all__ = ["GRID", "candidate_scales", "search_scale", "fake_quantized", "scaled_rows", "Folded", "plan_groups",
           "awq_fold"]
