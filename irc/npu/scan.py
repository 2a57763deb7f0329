"""The NPU cost of a recurrent layer: the short convolution, Mamba-2's SSD and the gated
delta rule as a *scan*, a two-loop nest over unit tiles (heads, or channels for the
convolution) and token chunks.

A ``ScanShape`` describes one sequence: T tokens over H units. Per token each unit reads
``unit_inputs`` elements (ssd: x and dt; the delta rule: v, a and b; the convolution: x),
each group of ``group`` units shares ``shared`` elements (ssd: B and C; the delta rule: q
and k), each unit writes ``outputs`` elements and keeps ``state`` elements (ssd [N, P], the
delta rule [d_k, d_v], the convolution its K-1 inputs) and ``params`` fp32 parameters
(A_log, D, dt_bias; the convolution's weights and bias).

**Schedule** (the loop order is fixed, ``h`` outside ``t``: state-stationary). A tile of
``h`` units keeps their state in SRAM for the whole call, loaded once and stored once,
while the token chunks of ``t`` tokens stream through: the chunk's inputs in, its outputs
out, one [t, t] block per unit of the chunked form's scores (SSD's L ⊙ C Bᵀ, the delta
rule's k kᵀ and its triangular solve) in SRAM. A tile that covers whole groups reads each
shared row once; a tile inside a group re-reads the group's shared rows once per tile.

**Traffic.** Operands at operand width, outputs at output width, the state at accumulator
width (it accumulates), parameters as fp32. A tile whose rows span a tensor's whole width
is one contiguous block (one DMA run, rounded up to whole bursts); a narrower one moves row
by row, each row in whole bursts (``alignment_bytes``). The executor
(``backends.npu.recurrent``) moves the same bytes.

**Lower bound** (``scan_lower_bound``): compulsory traffic (every input once, every output
once, the state in and out once, the parameters once); when the SRAM cannot hold the
state of a whole group beside one token's buffers, a state-stationary schedule re-reads
the shared rows once per resident tile (``ceil(group / resident)`` times) and a
token-stationary one spills and reloads the state at every token: the bound is the least
of the two, as the attention bound takes the least of its two families.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from irc.errors import BackendError
from irc.npu.target import Machine, ceil_div, round_up

PARAM_BYTES = 4


@dataclass(frozen=True)
class ScanShape:
    T: int
    H: int
    group: int           # units sharing one group's shared rows (1: none shared)
    unit_inputs: tuple   # per token and unit, elements of each per-unit input
    shared: tuple        # per token and group, elements of each shared input
    outputs: int         # per token and unit
    state: int           # per unit
    params: tuple        # per unit, fp32 elements of each parameter
    macs_per_token: int  # per unit, the chunked form's multiply-accumulates (for cycles)
    chunked: bool = True  # a [t, t] score block per unit (not the convolution)

    def to_json(self) -> dict:
        return {"T": self.T, "H": self.H, "group": self.group, "unit_inputs": list(self.unit_inputs),
                "shared": list(self.shared), "outputs": self.outputs, "state": self.state,
                "params": list(self.params), "macs_per_token": self.macs_per_token,
                "chunked": self.chunked}

    @staticmethod
    def from_json(data: dict) -> "ScanShape":
        return ScanShape(data["T"], data["H"], data["group"], tuple(data["unit_inputs"]), tuple(data["shared"]),
                         data["outputs"], data["state"], tuple(data["params"]), data["macs_per_token"],
                         data["chunked"])

    @property
    def macs(self) -> int:
        return self.T * self.H * self.macs_per_token


def block_bytes(rows: int, cols: int, total_cols: int, width: int, align: int) -> int:
    """DMA bytes of a [rows, cols] tile of a tensor ``total_cols`` wide: one contiguous run
    when it spans the whole width, else whole bursts per row."""
    if cols == total_cols:
        return round_up(rows * cols * width, align)
    return rows * round_up(cols * width, align)


def spans(total: int, tile: int) -> list:
    """(start, size) of the tiles of ``total`` cut in ``tile``."""
    return [(start, min(tile, total - start)) for start in range(0, total, tile)]


def sizes(total: int, tile: int) -> list:
    """(size, how many tiles) of the tiles of ``total`` cut in ``tile``."""
    full, rest = divmod(total, tile)
    return [(tile, full)] * bool(full) + [(rest, 1)] * bool(rest)


def shared_reads(shape: ScanShape, h: int) -> list:
    """Per unit tile: (first group, groups) of the shared rows it reads."""
    return [(start // shape.group, ceil_div(start + size, shape.group) - start // shape.group)
            for start, size in spans(shape.H, h)]


def _shared_groups(shape: ScanShape, h: int) -> list:
    """(groups a tile reads, how many tiles), tiles of whole groups or inside one group."""
    if h >= shape.group:
        return [(ceil_div(units, shape.group), n) for units, n in sizes(shape.H, h)]
    return [(1, ceil_div(shape.H, h))]


def traffic(shape: ScanShape, m: Machine, h: int, t: int) -> dict:
    """DRAM bytes per stream of the state-stationary schedule with tiles of h units x t tokens."""
    ob, acc, align = m.op_bytes, m.acc_bytes, m.align
    groups = ceil_div(shape.H, shape.group)
    dram = {"inputs": 0, "shared": 0, "outputs": 0, "state": 0, "params": 0}
    chunks = sizes(shape.T, t)
    for units, n in sizes(shape.H, h):
        for tokens, k in chunks:
            dram["inputs"] += n * k * sum(block_bytes(tokens, units * w, shape.H * w, ob, align)
                                          for w in shape.unit_inputs)
            dram["outputs"] += n * k * block_bytes(tokens, units * shape.outputs, shape.H * shape.outputs,
                                                   m.out_bytes, align)
        dram["state"] += n * 2 * round_up(units * shape.state * acc, align)
        dram["params"] += n * sum(round_up(units * p * PARAM_BYTES, align) for p in shape.params)
    for count, n in _shared_groups(shape, h):
        for tokens, k in chunks:
            dram["shared"] += n * k * sum(block_bytes(tokens, count * w, groups * w, ob, align) for w in shape.shared)
    return dram


def buffers(shape: ScanShape, m: Machine, h: int, t: int) -> dict:
    """SRAM per buffer (bytes, copies): the resident state and parameters, the chunk's
    inputs (double-buffered when there is more than one chunk), outputs, shared rows and
    score blocks."""
    ob, acc, align = m.op_bytes, m.acc_bytes, m.align
    units, tokens = min(h, shape.H), min(t, shape.T)
    copies = 2 if shape.T > tokens else 1
    groups = max(count for count, _ in _shared_groups(shape, h))
    out = {"state": (round_up(units * shape.state * acc, align), 1),
           "params": (sum(round_up(units * p * PARAM_BYTES, align) for p in shape.params), 1),
           "inputs": (sum(tokens * round_up(units * w * ob, align) for w in shape.unit_inputs), copies),
           "outputs": (tokens * round_up(units * shape.outputs * m.out_bytes, align), 1)}
    if shape.chunked:
        out["scores"] = (units * tokens * round_up(tokens * acc, align), 1)
    if shape.shared:
        out["shared"] = (sum(tokens * round_up(groups * w * ob, align) for w in shape.shared), copies)
    return out


def sram_bytes(entries: dict) -> int:
    return sum(size * copies for size, copies in entries.values())


def cycles(shape: ScanShape, m: Machine, h: int, t: int, dram: dict) -> dict:
    """A roofline per unit tile: compute (the chunked form's MACs on the array) against
    the transfers, with the DRAM latency once per tile."""
    compute = shape.macs / m.peak_macs
    transfer = sum(dram.values()) / min(m.dram_bw, m.dma_channels * m.dma_bw)
    tiles = ceil_div(shape.H, h)
    return {"compute_cycles": math.ceil(compute), "transfer_cycles": math.ceil(transfer),
            "cycles": math.ceil(max(compute, transfer) + tiles * m.latency), "steps": tiles * ceil_div(shape.T, t)}


def scan_lower_bound(shape: ScanShape, m: Machine) -> dict:
    """The bound of the module docstring, in bytes."""
    ob, acc = m.op_bytes, m.acc_bytes
    groups = ceil_div(shape.H, shape.group)
    inputs = shape.T * shape.H * sum(shape.unit_inputs) * ob
    shared = shape.T * groups * sum(shape.shared) * ob
    outputs = shape.T * shape.H * shape.outputs * m.out_bytes
    state = 2 * shape.H * shape.state * acc
    params = shape.H * sum(shape.params) * PARAM_BYTES
    compulsory = inputs + shared + outputs + state + params
    least = buffers(shape, m, 1, 1)
    room = m.sram_bytes - sram_bytes({k: v for k, v in least.items() if k != "state"})
    resident = room // max(1, shape.state * acc)
    bound = compulsory
    if shape.shared and resident < shape.group:
        rereads = shared * (ceil_div(shape.group, max(resident, 1)) - 1) if resident > 0 else math.inf
        spills = state * (shape.T - 1)
        bound = compulsory + min(rereads, spills)
    return {"bytes": math.ceil(bound), "compulsory": compulsory, "pebbling": None, "panel": None,
            "whole_tiles": math.ceil(bound), "words": m.sram_bytes // acc, "resident_units": int(resident)}


def candidates(total: int, group: int) -> list:
    """Unit tiles: the divisors of the group (up to 64 of them), then whole multiples of it
    that cut the groups into 1..16 near-equal parts or climb a doubling ladder."""
    inside = [d for d in range(1, group + 1) if group % d == 0][:64] + [group]
    groups = ceil_div(total, group)
    counts = {ceil_div(groups, parts) for parts in range(1, 17)}
    value = 1
    while value < groups:
        counts.add(value)
        value *= 2
    return sorted(set(inside) | {min(total, group * c) for c in counts})


def token_candidates(total: int) -> list:
    values, value = {total}, 1
    while value < total:
        values.add(value)
        value *= 2
    return sorted(values)


def evaluate(shape: ScanShape, m: Machine, h: int, t: int) -> dict:
    entries = buffers(shape, m, h, t)
    dram = traffic(shape, m, h, t)
    return {"dram": dram, "dram_bytes": sum(dram.values()), "buffers": entries, "sram_bytes": sram_bytes(entries),
            **cycles(shape, m, h, t, dram)}


def search_scan(shape: ScanShape, m: Machine, what: str = "op"):
    """The tiling with the least traffic, then the fewest cycles, then the least SRAM, that
    fits; a BackendError naming what the smallest tiling needs when none does."""
    from irc.npu.cost import Choice

    best = None
    for h in candidates(shape.H, shape.group):
        for t in token_candidates(shape.T):
            c = evaluate(shape, m, h, t)
            if c["sram_bytes"] > m.sram_bytes:
                continue
            key = (c["dram_bytes"], c["cycles"], c["sram_bytes"], -t, h)
            if best is None or key < best[0]:
                best = (key, h, t, c)
    if best is None:
        need = evaluate(shape, m, 1, 1)
        raise BackendError(f"{what}: no scan tiling fits the {m.sram_bytes:,}-byte SRAM of {m.target} (one unit "
                           f"and one token need {need['sram_bytes']:,} bytes)", hint="a target with more SRAM")
    _, h, t, c = best
    return Choice({"h": h, "t": t}, ("h", "t"), c["buffers"]["inputs"][1] == 2, c, scan_lower_bound(shape, m))
