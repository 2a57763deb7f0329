"""The NPU cost model: DRAM traffic, SRAM footprint and cycles of a tiled loop nest, the
I/O lower bounds they are held against, and the tiling search.

Every formula is elementwise arithmetic on NumPy arrays, so the search scores thousands
of candidate tilings in one call and the plan records the winner through the same
functions (on 0-d arrays): one model serves both.

**Loop nests.** A GEMM C[M,N] = A[M,K] B[K,N] (B stored [N,K], as checkpoints store
linear weights, or [K,N]) is cut into Tm x Tn x Tk tiles and run as three nested loops in
one of six orders. Attention is a two-loop nest, query blocks x key blocks (flash-style:
the block's scores, its running max and sum and its output stay in SRAM). Each operand is
a *stream*: its tile is fetched when its index changes between consecutive iterations,
so a loop nested inside the innermost loop that indexes an operand reuses its tile (loops
of one trip never change anything). For a stream X, with p the innermost position of a
loop that indexes X and runs more than once,

    runs(X)   = product of the trip counts of the loops at positions <= p
    traffic(X) = runs(X) / tiles(X) * (DMA bytes of one pass over X's tiles)

An output revisited v = runs/tiles times (its reduction loop sits outside it) spills its
partial sums at accumulator width v - 1 times and reloads them v - 1 times; its final
store is at output width. Operands of fused epilogues are read once, with the final store.
DMA moves rows of a tile in whole bursts (``alignment_bytes``), so edge tiles and odd
widths cost what the DMA really moves; the executor counts the same bytes tile by tile.

**SRAM.** One buffer per stream sized for its largest tile (two when double-buffered and
the stream is refetched), the output's accumulators (one copy: its store is not
overlapped, and the output is converted in place), a strip of ``rows`` rows for each
fused-epilogue operand (the epilogue and the store walk the finished tile strip by strip)
and attention's score block; each rounded up to the alignment.

**Cycles** (a roofline per step, with pipeline fill). The MAC array takes
ceil(tm/rows) * ceil(tn/cols) * tk / rate cycles per tile. Steps are grouped by the
outermost loop that advances; each group fetches the streams that change there (their
average tile). Double-buffered: cycles = latency + first fetch + sum over steps of
max(compute, next fetch) + last compute + output stores (serialised); single-buffered:
the same with compute + fetch. A step's transfers are spread over the DMA channels: they
move at the DRAM rate, or at channels x channel rate when that is lower.
Softmax and other elementwise work is not counted in cycles.

**Lower bounds** (``gemm_lower_bound``, ``attention_lower_bound``): see their docstrings.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from irc.errors import BackendError
from irc.npu.target import Machine, ceil_div, round_up

GEMM_ORDERS = [tuple(p) for p in itertools.permutations("mnk")]
ATTENTION_ORDERS = [("q", "kv"), ("kv", "q")]
# the search keeps every tiling within this fraction of the least traffic, then takes the fewest cycles
TRAFFIC_SLACK = 0.01
SOFTMAX_BYTES = 4   # the softmax state (running output, max, sum) is fp32


@dataclass(frozen=True)
class GemmShape:
    """One GEMM instance: A[M,K] times ``weights`` B operands that share A (2: a fused
    gate/up pair, whose epilogue act(gate) * up writes one [M,N] output)."""

    M: int
    K: int
    N: int
    weights: int = 1
    b_layout: str = "nk"      # "nk": B stored [N,K] (linear weights); "kn": [K,N] (matmul)
    tile_operands: int = 0    # fused epilogue operands of the output's shape (a residual)
    row_operands: int = 0     # fused epilogue operands broadcast over rows (a bias [N])

    @property
    def macs(self) -> int:
        return self.M * self.N * self.K * self.weights

    def to_json(self) -> dict:
        return {"M": self.M, "K": self.K, "N": self.N, "weights": self.weights, "b_layout": self.b_layout,
                "tile_operands": self.tile_operands, "row_operands": self.row_operands}


@dataclass(frozen=True)
class AttentionShape:
    """One attention group: M query rows (the query heads sharing a KV head, times the new
    tokens) over S keys with key width Dk and value width Dv; ``sinks`` > 0: that many sink
    logits (one per query head of the group, GPT-OSS) join the softmax, read once per group
    as fp32 into a resident buffer (``attention_nest``); ``alibi`` > 0: that many ALiBi
    slopes (one per query head), read the same way, each score biased by its head's slope
    times key minus query index, computed on chip."""

    M: int
    S: int
    Dk: int
    Dv: int
    sinks: int = 0
    alibi: int = 0

    @property
    def macs(self) -> int:
        return self.M * self.S * (self.Dk + self.Dv)

    def to_json(self) -> dict:
        data = {"M": self.M, "S": self.S, "Dk": self.Dk, "Dv": self.Dv}
        return {**data, **{name: count for name, count in (("sinks", self.sinks), ("alibi", self.alibi)) if count}}


@dataclass
class Stream:
    name: str
    loops: tuple
    bytes: Any            # DMA bytes of one pass over all its tiles
    buffer: Any           # SRAM bytes of its largest tile
    role: str = "in"      # "in" | "out" (accumulates over the other loops) | "epilogue"
    partial: Any = 0      # "out": bytes of one spill of the accumulator state


@dataclass
class Nest:
    trips: dict           # loop name -> trip count
    streams: list
    scratch: dict         # other SRAM buffers, name -> bytes
    compute: Any          # MAC-array cycles of the whole nest


def row_bytes(cols, width, align):
    return round_up(cols * width, align)


def tiled_rows(total, tile, width, align):
    """DMA bytes of one row of ``total`` elements cut into tiles of ``tile``."""
    full = total // tile
    return full * row_bytes(tile, width, align) + row_bytes(total - full * tile, width, align)


def array_passes(total, tile, unit):
    """Sum over the tiles of ``total`` of ceil(tile / unit): MAC-array passes along a dim."""
    full = total // tile
    return full * ceil_div(tile, unit) + ceil_div(total - full * tile, unit)


# ---- nests -------------------------------------------------------------------------------

def gemm_nest(shape: GemmShape, m: Machine, tm, tn, tk) -> Nest:
    M, K, N, W = shape.M, shape.K, shape.N, shape.weights
    ob, acc, align = m.op_bytes, m.acc_bytes, m.align
    em, en, ek = np.minimum(tm, M), np.minimum(tn, N), np.minimum(tk, K)
    trips = {"m": ceil_div(M, tm), "n": ceil_div(N, tn), "k": ceil_div(K, tk)}
    k_rows = tiled_rows(K, tk, ob, align)
    if shape.b_layout == "nk":
        b_bytes, b_buffer = W * N * k_rows, W * en * row_bytes(ek, ob, align)
    else:
        b_bytes, b_buffer = W * K * tiled_rows(N, tn, ob, align), W * ek * row_bytes(en, ob, align)
    streams = [
        Stream("a", ("m", "k"), M * k_rows, em * row_bytes(ek, ob, align)),
        Stream("b", ("n", "k"), b_bytes, b_buffer),
        Stream("c", ("m", "n"), M * tiled_rows(N, tn, m.out_bytes, align), W * em * row_bytes(en, acc, align),
               role="out", partial=W * M * tiled_rows(N, tn, acc, align)),
    ]
    if shape.tile_operands or shape.row_operands:
        n_rows = tiled_rows(N, tn, ob, align)
        strip = np.minimum(em, m.rows)
        streams.append(Stream("epilogue", ("m", "n"),
                              shape.tile_operands * M * n_rows + shape.row_operands * trips["m"] * n_rows,
                              (shape.tile_operands * strip + shape.row_operands) * row_bytes(en, ob, align),
                              role="epilogue"))
    compute = array_passes(M, tm, m.rows) * array_passes(N, tn, m.cols) * K * W / m.rate
    return Nest(trips, streams, {}, compute)


def attention_nest(shape: AttentionShape, m: Machine, tq, tkv) -> Nest:
    M, S, Dk, Dv = shape.M, shape.S, shape.Dk, shape.Dv
    ob, align = m.op_bytes, m.align
    eq, ekv = np.minimum(tq, M), np.minimum(tkv, S)
    state = row_bytes(Dv, SOFTMAX_BYTES, align) + row_bytes(2, SOFTMAX_BYTES, align)
    streams = [
        Stream("q", ("q",), M * row_bytes(Dk, ob, align), eq * row_bytes(Dk, ob, align)),
        Stream("k", ("kv",), S * row_bytes(Dk, ob, align), ekv * row_bytes(Dk, ob, align)),
        Stream("v", ("kv",), S * row_bytes(Dv, ob, align), ekv * row_bytes(Dv, ob, align)),
        Stream("o", ("q",), M * row_bytes(Dv, m.out_bytes, align), eq * state, role="out", partial=M * state),
    ]
    if shape.sinks:  # no loop: loaded once, resident while every tile of the group runs
        sinks = row_bytes(shape.sinks, SOFTMAX_BYTES, align)
        streams.append(Stream("sinks", (), sinks, sinks))
    if shape.alibi:  # the same: the slopes, resident
        slopes = row_bytes(shape.alibi, SOFTMAX_BYTES, align)
        streams.append(Stream("slopes", (), slopes, slopes))
    scores = eq * row_bytes(ekv, max(m.acc_bytes, SOFTMAX_BYTES), align)
    compute = array_passes(M, tq, m.rows) * (array_passes(S, tkv, m.cols) * Dk + ceil_div(Dv, m.cols) * S) / m.rate
    return Nest({"q": ceil_div(M, tq), "kv": ceil_div(S, tkv)}, streams, {"s": scores}, compute)


# ---- evaluation --------------------------------------------------------------------------

def _transfer(m: Machine, by_stream: dict):
    """Cycles to move ``by_stream`` bytes: a step's transfers are spread over the DMA
    channels, so the DRAM port or all channels together, the slower, set the rate."""
    return sum(by_stream.values()) / min(m.dram_bw, m.dma_channels * m.dma_bw)


def evaluate(nest: Nest, order: tuple, double_buffer: bool, m: Machine) -> dict:
    """Traffic per stream, SRAM buffers, cycles and their split for one loop order."""
    trips = [np.asarray(nest.trips[name]) for name in order]
    position = {name: i + 1 for i, name in enumerate(order)}
    inner, runs, traffic, buffers = {}, {}, {}, {}
    for s in nest.streams:
        p = 0
        for name in s.loops:
            p = np.maximum(p, np.where(np.asarray(nest.trips[name]) > 1, position[name], 0))
        r = 1
        for i, t in enumerate(trips, start=1):
            r = r * np.where(i <= p, t, 1)
        visits = r // math.prod(np.asarray(nest.trips[name]) for name in s.loops)
        inner[s.name], runs[s.name] = p, r
        if s.role == "in":
            traffic[s.name] = visits * s.bytes
        elif s.role == "out":
            traffic[s.name] = s.bytes + (visits - 1) * 2 * s.partial
        else:
            traffic[s.name] = s.bytes + 0 * r
        copies = np.where(double_buffer and s.role == "in", np.where(r > 1, 2, 1), 1)
        buffers[s.name] = (round_up(s.buffer, m.align) + 0 * r, copies + 0 * r)
    for name, nbytes in nest.scratch.items():
        buffers[name] = (round_up(nbytes, m.align), 1)
    sram = sum(size * copies for size, copies in buffers.values())

    steps = math.prod(trips)
    per_step = nest.compute / steps
    inputs = [s.name for s in nest.streams if s.role == "in"]
    average = {name: traffic[name] / runs[name] for name in inputs}
    cycles = m.latency + _transfer(m, average) + per_step
    outer = 1
    for level, t in enumerate(trips, start=1):
        count = outer * (t - 1)
        fetch = _transfer(m, {n: np.where(inner[n] >= level, average[n], 0) for n in inputs})
        cycles = cycles + count * (np.maximum(per_step, fetch) if double_buffer else per_step + fetch)
        outer = outer * t
    serial = {s.name: traffic[s.name] for s in nest.streams if s.role != "in"}
    cycles = cycles + _transfer(m, serial)
    return {"dram": traffic, "dram_bytes": sum(traffic.values()), "buffers": buffers, "sram_bytes": sram,
            "cycles": cycles, "compute_cycles": nest.compute + 0 * cycles,
            "transfer_cycles": _transfer(m, traffic), "steps": steps}


# ---- lower bounds ------------------------------------------------------------------------

def gemm_lower_bound(shape: GemmShape, m: Machine) -> dict:
    """The lower bound (bytes of DRAM traffic) a plan for this GEMM is held against.

    Counts are bytes: A and B elements at operand width, C at output width, fused epilogue
    operands at operand width; S is the SRAM in *accumulator words*, SRAM bytes /
    accumulator bytes (int8 operands, int32 accumulators: S = SRAM / 4). The plan's SRAM
    and traffic are counted with the same widths.

    - compulsory: every input read once, every output written once (MK + KN + MN).
    - pebbling: the red-blue pebbling bound for matmul (Kwasniewski et al., "Red-blue
      pebbling revisited", SC'19), 2MNK/sqrt(S) + MN, streamed elements at operand width.
      It describes schedules whose resident set is the block of partial sums, which the
      SRAM holds at accumulator width; hence S in accumulator words.
    - panel: a schedule that instead keeps whole K-panels of one operand resident never
      holds partial sums across reduction steps, and the pebbling argument with S in
      accumulator words does not cover it (it can undercut that term when K is small,
      e.g. MLA's kv_b with K = 512). Its traffic is bounded by the panel count: A panels
      hold at most (SRAM - one cols-wide B tile) / (K + cols accumulators) rows, and each
      of the ceil(M / rows) panels streams all of B (symmetrically for B panels).

    bound = max(compulsory, min(pebbling, panel_a, panel_b)). It bounds those two families
    of schedules, which cover the planner's tilings (partial sums in SRAM, or spilled,
    which only costs more); it is not a proof over every conceivable schedule. The tests
    check that no plan of the example models goes below it.

    ``whole_tiles`` is not a bound but the explanation when a plan sits far above it: the
    least traffic of output-stationary tilings in *whole* tiles (Mt x Nt blocks whose
    accumulators fill the SRAM beside single burst-deep A and B tiles) or of panel
    tilings. The pebbling term is the continuous optimum of square sqrt(S) blocks; a dim
    that is not a multiple of the block (DeepSeek-V2's kv_a, N = 576 against sqrt(S) = 362
    on the U55) or an operand that cannot stay resident when the compulsory term
    dominates costs whole extra passes.
    """
    M, K, N, W = shape.M, shape.K, shape.N, shape.weights
    ob, acc, sram = m.op_bytes, m.acc_bytes, m.sram_bytes
    extra = shape.tile_operands * M * N * ob + shape.row_operands * N * ob
    out = M * N * m.out_bytes + extra
    a_all, b_all = M * K * ob, W * K * N * ob
    words = sram // acc
    compulsory = a_all + b_all + out
    pebbling = 2 * M * N * W * K * ob / math.sqrt(words) + out
    rows = (sram - m.cols * W * K * ob) / (K * ob + m.cols * W * acc)
    cols = (sram - m.rows * K * ob) / (W * K * ob + m.rows * W * acc)
    panel_a = a_all + b_all * math.ceil(M / rows) + out if rows > 0 else math.inf
    panel_b = b_all + a_all * math.ceil(N / cols) + out if cols > 0 else math.inf
    bound = max(compulsory, min(pebbling, panel_a, panel_b))
    # whole tiles: output-stationary blocks of ceil(M / Mt) rows whose accumulators, with
    # one burst-deep A and B tile beside them, fill the SRAM; each A row is re-read once per
    # block column and B once per block row
    blocks = np.arange(1, M + 1)
    rows_per_block = ceil_div(M, blocks)
    burst = m.k_align * ob
    cols_per_block = (sram - rows_per_block * burst) // (rows_per_block * W * acc + W * burst)
    ok = cols_per_block > 0
    stationary = np.where(ok, a_all * ceil_div(N, np.maximum(cols_per_block, 1)) + b_all * blocks + out, np.inf)
    whole = max(compulsory, min(float(stationary.min()), panel_a, panel_b))
    return {"bytes": math.ceil(bound), "compulsory": compulsory, "pebbling": math.ceil(pebbling),
            "panel": math.ceil(min(panel_a, panel_b)) if min(panel_a, panel_b) < math.inf else None,
            "whole_tiles": math.ceil(whole), "words": words}


def attention_lower_bound(shape: AttentionShape, m: Machine) -> dict:
    """The lower bound a flash-style plan of one attention group is held against.

    The pebbling term of a GEMM does not apply: the scores never leave the SRAM, and the
    2MNK/sqrt(S) + MN bound of the score GEMM is dominated by writing the scores, which a
    fused schedule never does. What remains:

    - compulsory: Q, K and V (and the sink logits and ALiBi slopes, fp32) read once, the output
      written once;
    - query-stationary: query rows keep Q (operand width) and the fp32 softmax state
      (output row, max, sum) in SRAM next to at least one cols-wide block of keys and its
      scores; K and V are streamed once per block of rows: (K + V) * ceil(M / rows);
    - key-stationary: key blocks resident, at least rows query rows at a time; each of the
      ceil(S / keys) key blocks reads Q, and every block past the first spills and reloads
      the softmax state of every row.

    bound = max(compulsory, min(query-stationary, key-stationary)).
    """
    M, S, Dk, Dv = shape.M, shape.S, shape.Dk, shape.Dv
    ob, sram = m.op_bytes, m.sram_bytes
    q_all, k_all, v_all, o_all = M * Dk * ob, S * Dk * ob, S * Dv * ob, M * Dv * m.out_bytes
    once = o_all + (shape.sinks + shape.alibi) * SOFTMAX_BYTES  # moved once in every schedule: output, sinks, slopes
    state = Dv * SOFTMAX_BYTES + 2 * SOFTMAX_BYTES
    score = max(m.acc_bytes, SOFTMAX_BYTES)
    compulsory = q_all + k_all + v_all + once
    rows = (sram - m.cols * (Dk + Dv) * ob) / (Dk * ob + state + m.cols * score)
    keys = (sram - m.rows * (Dk * ob + state)) / ((Dk + Dv) * ob + m.rows * score)
    by_rows = q_all + once + (k_all + v_all) * math.ceil(M / rows) if rows > 0 else math.inf
    blocks = math.ceil(S / keys) if keys > 0 else math.inf
    by_keys = k_all + v_all + once + q_all * blocks + 2 * M * state * (blocks - 1)
    bound = max(compulsory, min(by_rows, by_keys))
    return {"bytes": math.ceil(bound), "compulsory": compulsory, "pebbling": None,
            "panel": math.ceil(min(by_rows, by_keys)), "whole_tiles": math.ceil(bound), "words": sram // m.acc_bytes}


# ---- search ------------------------------------------------------------------------------

def tile_candidates(size: int, step: int, parts: int = 16, ratio: float = 1.25) -> np.ndarray:
    """Tile sizes for a dim of ``size`` in multiples of ``step``: a geometric ladder (each
    ``ratio`` times the last), the sizes that cut the dim into 2..``parts`` near-equal
    tiles, and the whole dim."""
    top = round_up(size, step)
    values = {top}
    value = step
    while value < top:
        values.add(value)
        value = round_up(max(value + step, int(value * ratio)), step)
    for count in range(2, parts + 1):
        values.add(round_up(ceil_div(size, count), step))
    return np.array(sorted(values), dtype=np.int64)


@dataclass
class Choice:
    tile: dict            # loop name -> tile size
    order: tuple
    double_buffer: bool
    cost: dict            # ``evaluate`` on scalars
    bound: dict


def shape_from_json(kind: str, data: dict):
    return GemmShape(**data) if kind == "gemm" else AttentionShape(**data)


def nest_for(shape, m: Machine, tile: dict) -> Nest:
    if isinstance(shape, GemmShape):
        return gemm_nest(shape, m, tile["m"], tile["n"], tile["k"])
    return attention_nest(shape, m, tile["q"], tile["kv"])


def lower_bound(shape, m: Machine) -> dict:
    return gemm_lower_bound(shape, m) if isinstance(shape, GemmShape) else attention_lower_bound(shape, m)


def choose(shape, m: Machine, tile: dict, order: tuple, double_buffer: bool) -> Choice:
    """Score one given tiling (the naive baseline, or a tiling a test wants to run)."""
    scalar = {name: np.int64(size) for name, size in tile.items()}
    cost = evaluate(nest_for(shape, m, scalar), tuple(order), double_buffer, m)
    return Choice(dict(tile), tuple(order), double_buffer, cost, lower_bound(shape, m))


def search(shape, m: Machine, what: str = "op") -> Choice:
    """The tiling with the least DRAM traffic (within TRAFFIC_SLACK), then the fewest
    cycles, then the least SRAM, that fits the SRAM. Deterministic."""
    if isinstance(shape, GemmShape):
        axes = {"m": tile_candidates(shape.M, m.rows), "n": tile_candidates(shape.N, m.cols),
                "k": tile_candidates(shape.K, m.k_align, parts=4, ratio=2.0)}
        orders = GEMM_ORDERS
    else:
        axes = {"q": tile_candidates(shape.M, m.rows), "kv": tile_candidates(shape.S, math.lcm(m.cols, m.k_align))}
        orders = ATTENTION_ORDERS
    grid = dict(zip(axes, (g.ravel() for g in np.meshgrid(*axes.values(), indexing="ij"))))
    size = len(next(iter(grid.values())))
    nest = nest_for(shape, m, grid)
    variants = [(order, db) for order in orders for db in (True, False)]
    parts: dict = {"bytes": [], "cycles": [], "sram": [], "variant": [], "index": []}
    for number, (order, db) in enumerate(variants):
        cost = evaluate(nest, order, db, m)
        columns = {key: np.broadcast_to(cost[name], (size,)) for key, name in
                   (("bytes", "dram_bytes"), ("cycles", "cycles"), ("sram", "sram_bytes"))}
        fits = np.nonzero(columns["sram"] <= m.sram_bytes)[0]
        for key, values in columns.items():
            parts[key].append(values[fits])
        parts["variant"].append(np.full(len(fits), number))
        parts["index"].append(fits)
    table = {key: np.concatenate(values) for key, values in parts.items()}
    if not len(table["bytes"]):
        raise BackendError(f"{what}: no tiling fits the {m.sram_bytes:,}-byte SRAM of {m.target} "
                           f"({_smallest_need(shape, m)})", hint="a target with more SRAM, or a smaller MAC array")
    least = int(table["bytes"].min())
    keep = np.nonzero(table["bytes"] * 100 <= least * (100 + 100 * TRAFFIC_SLACK))[0]
    pick = keep[np.lexsort((table["index"][keep], table["variant"][keep], table["sram"][keep],
                            table["cycles"][keep]))[0]]
    order, db = variants[int(table["variant"][pick])]
    tile = {name: int(grid[name][table["index"][pick]]) for name in axes}
    return choose(shape, m, tile, order, db)


def _smallest_need(shape, m: Machine) -> str:
    tile = {"m": m.rows, "n": m.cols, "k": m.k_align} if isinstance(shape, GemmShape) else \
        {"q": m.rows, "kv": math.lcm(m.cols, m.k_align)}
    cost = choose(shape, m, tile, GEMM_ORDERS[0] if "m" in tile else ATTENTION_ORDERS[0], False).cost
    parts = " + ".join(f"{name} {int(size * copies):,}" for name, (size, copies) in cost["buffers"].items())
    return f"the smallest tiling, {'x'.join(str(v) for v in tile.values())}, needs {parts} = {int(cost['sram_bytes']):,} bytes"


def naive(shape, m: Machine) -> Choice:
    """The baseline: fixed 16x16x16 tiles (16 x 16 query x key blocks), loops in the
    textbook order, double-buffered when that fits."""
    if isinstance(shape, GemmShape):
        tile, order = {"m": 16, "n": 16, "k": 16}, ("m", "n", "k")
    else:
        tile, order = {"q": 16, "kv": 16}, ("q", "kv")
    best = choose(shape, m, tile, order, True)
    return best if best.cost["sram_bytes"] <= m.sram_bytes else choose(shape, m, tile, order, False)
