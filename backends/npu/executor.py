"""The tiled executor: runs one planned op tile by tile in NumPy, the way the plan says.

The SRAM is one ``uint8`` array of the target's size. Every buffer the plan lists is
carved from it (aligned, double where the plan double-buffers) and tiles live in it row
by row, each row padded to whole DMA bursts, so a buffer too small for its tile, or
buffers past the end of the SRAM, raise ``BackendError``. DMA copies tiles between the
DRAM arrays and those buffers and counts, per stream, the bytes it moves (rows x whole
bursts); ``execute`` returns the outputs and those counts, which equal the plan's
``dram`` entries for every op (the tests hold them to it).

The loop nest follows the record: ``loop_order`` outermost first, a stream's tile is
fetched only when its index changes (ping-pong between copies when double-buffered), an
output tile left before its reduction is complete spills its accumulators to DRAM and
reloads them on the next visit, and a finished output tile runs its epilogue strip by
strip (``rows`` rows at a time, reading fused operands) and is stored.

Numbers (``Numbers``): float dtypes compute in fp32; integer dtypes multiply exactly into
integer accumulators, then ``finish`` dequantizes (``acc_scale``), runs the epilogue in
fp32 and quantizes the output (``out_scale``, round half to even, saturating).
``reference`` computes the same op untiled with the same ``finish``, so GEMM outputs
match exactly for integers and to rounding for floats. Recurrent layers (a record of kind
``scan``) run in ``backends.npu.recurrent``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional

import numpy as np

from irc.errors import BackendError
from irc.ops.moe import MOE_ACTIVATIONS, glu
from irc.ops.primitives import gelu, rsqrt, sigmoid, silu
from irc.npu.target import Machine, ceil_div, round_up
from backends.npu.memory import NUMPY, Buffer, Dma, Numbers, Sram, store_as
from backends.npu.recurrent import reference_scan, run_scan


def _glu(step: dict, gate, up):
    """The gated MLP's hidden units as the ``moe`` op computes them (``irc.ops.moe.glu``:
    act(gate) * up, or GPT-OSS's clamped ``swiglu_oai`` with the step's alpha and limit)."""
    if step["activation"] not in MOE_ACTIVATIONS:
        raise BackendError(f"unknown epilogue activation {step['activation']!r}")
    return glu(gate, up, step["activation"], step.get("alpha", 1.702), step.get("limit", 7.0))


def _unary(step: dict, x):
    op = step["op"]
    if op in _UNARY:
        return _UNARY[op](x)
    if op == "gelu":
        return gelu(x, step.get("approximate", "none"))
    if op == "softcap":
        return np.float32(step["cap"]) * np.tanh(x / np.float32(step["cap"]))
    if op == "cast":
        return x
    raise BackendError(f"unknown epilogue op {op!r}")


_UNARY = {"silu": silu, "sigmoid": sigmoid, "tanh": np.tanh, "exp": np.exp, "neg": np.negative, "sqrt": np.sqrt,
          "rsqrt": rsqrt, "cos": np.cos, "sin": np.sin, "log": np.log}
_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum}


def finish(accumulators: list, steps: list, operands: list, machine: Machine, numbers: Numbers) -> np.ndarray:
    """Output values from the accumulators of one weight each: dequantize, the epilogue
    (``bias`` rows added to one weight's values, ``glu``, then fused ops reading ``operands``
    in order), quantize. Elementwise, so a tile gives the same numbers as the whole matrix."""
    values = [np.ascontiguousarray(acc, dtype=np.float32) * np.float32(numbers.acc_scale) for acc in accumulators]
    y = values[0]
    operands = iter(operands)
    for step in steps:
        other = None if "operand" not in step else \
            np.asarray(next(operands), np.float32) * np.float32(numbers.operand_scale)
        if step["op"] == "glu":  # gate and up, or up alone (an ungated relu2 expert)
            y = _glu(step, values[0] if len(values) > 1 else None, values[-1]).astype(np.float32)
        elif step["op"] == "bias":  # before the GLU (GPT-OSS's expert biases)
            values[step["weight"]] = values[step["weight"]] + other
            y = values[0]
        elif other is not None:
            y = _BINARY[step["op"]](*((other, y) if step["swap"] else (y, other))).astype(np.float32)
        else:
            y = np.asarray(_unary(step, y), dtype=np.float32)
    return store_as(y, machine, numbers)


def _acc_dtype(machine: Machine):
    return np.float32 if machine.is_float else (np.int32 if machine.acc_bytes <= 4 else np.int64)


def _multiply(a_tile, b_tile, layout: str, machine: Machine):
    acc = _acc_dtype(machine)
    b = b_tile.T if layout == "nk" else b_tile
    return a_tile.astype(acc) @ b.astype(acc)


# ---- GEMM --------------------------------------------------------------------------------

def run_gemm(record: dict, machine: Machine, a, bs: list, operands: list, numbers: Numbers, sram: Sram,
             dma: Dma) -> np.ndarray:
    """One GEMM instance. ``a`` [M,K]; ``bs`` the weights ([N,K] or [K,N]); ``operands``
    the fused epilogue operands in step order ([M,N] tiles or [N] rows)."""
    shape, tile, order = record["shape"], record["tile"], record["loop_order"]
    M, K, N, layout = shape["M"], shape["K"], shape["N"], shape["b_layout"]
    steps = record["epilogue"]
    tiles = {"m": tile["m"], "n": tile["n"], "k": tile["k"]}
    trips = {"m": ceil_div(M, tiles["m"]), "n": ceil_div(N, tiles["n"]), "k": ceil_div(K, tiles["k"])}
    buffers = {name: Buffer(sram, name, entry) for name, entry in record["buffers"].items()}
    dtype, acc_dtype = np.dtype(NUMPY[machine.dtype]), _acc_dtype(machine)
    out = np.zeros((M, N), dtype=dtype)

    def span(axis, index):
        start = index * tiles[axis]
        return slice(start, min(start + tiles[axis], {"m": M, "n": N, "k": K}[axis]))

    resident = {"a": None, "b": None}
    views: dict = {}
    spilled: dict = {}
    done: dict = {}
    current = None

    def enter(key):
        rows, cols = span("m", key[0]), span("n", key[1])
        views["c"] = buffers["c"].place((len(bs), rows.stop - rows.start, cols.stop - cols.start), acc_dtype)
        if key in spilled:
            dma.load("c", spilled.pop(key), views["c"])
        else:
            views["c"][...] = 0

    def leave(key):
        rows, cols = span("m", key[0]), span("n", key[1])
        if done.get(key, 0) < trips["k"]:
            spilled[key] = np.empty_like(views["c"])
            dma.store("c", views["c"], spilled[key], machine.acc_bytes)
            return
        _store_tile(views["c"], rows, cols, steps, operands, buffers.get("epilogue"), dma, machine, numbers, out)

    for index in itertools.product(*(range(trips[axis]) for axis in order)):
        at = dict(zip(order, index))
        key = (at["m"], at["n"])
        if key != current:
            if current is not None:
                leave(current)
            current = key
            enter(key)
        rows, cols, depth = span("m", at["m"]), span("n", at["n"]), span("k", at["k"])
        if resident["a"] != (at["m"], at["k"]):
            resident["a"] = (at["m"], at["k"])
            source = a[rows, depth]
            views["a"] = dma.load("a", source, buffers["a"].place(source.shape, dtype, buffers["a"].next_copy()))
        if resident["b"] != (at["n"], at["k"]):
            resident["b"] = (at["n"], at["k"])
            sources = np.stack([b[cols, depth] if layout == "nk" else b[depth, cols] for b in bs])
            views["b"] = dma.load("b", sources, buffers["b"].place(sources.shape, dtype, buffers["b"].next_copy()))
        for w in range(len(bs)):
            views["c"][w] += _multiply(views["a"], views["b"][w], layout, machine).astype(acc_dtype)
        done[key] = done.get(key, 0) + 1
    leave(current)
    return out


def _store_tile(acc, rows: slice, cols: slice, steps: list, operands: list, epilogue, dma: Dma, machine: Machine,
                numbers: Numbers, out: np.ndarray) -> None:
    """A finished output tile of ``out``: its epilogue operands loaded into the ``epilogue``
    buffer (row vectors once, residual tiles strip by strip), ``finish`` run strip by strip
    on the accumulators ``acc`` [weights, rows, cols], each strip converted in place and stored."""
    dtype = out.dtype
    fused = [s["operand"] for s in steps if "operand" in s]
    pitch = round_up((cols.stop - cols.start) * dtype.itemsize, machine.align)
    bias = {}                                          # row operands: once per tile
    for i, kind in enumerate(fused):
        if kind == "row":
            view = epilogue.place((1, cols.stop - cols.start), dtype, offset=len(bias) * pitch)
            bias[i] = dma.load("epilogue", operands[i][None, cols], view)
    for start in range(0, rows.stop - rows.start, machine.rows):   # the epilogue walks strips
        strip = slice(start, min(start + machine.rows, rows.stop - rows.start))
        global_rows = slice(rows.start + strip.start, rows.start + strip.stop)
        loaded, offset = [], len(bias) * pitch
        for i, kind in enumerate(fused):
            if kind == "row":
                loaded.append(bias[i])
                continue
            view = epilogue.place((strip.stop - strip.start, cols.stop - cols.start), dtype, offset=offset)
            offset += view.shape[0] * pitch
            loaded.append(dma.load("epilogue", operands[i][global_rows, cols], view))
        values = finish([part[strip] for part in acc], steps, loaded, machine, numbers)
        result = acc[0, strip].view(np.uint8)[:, :values.shape[1] * dtype.itemsize].view(dtype)
        result[...] = values                           # converted in place, then stored
        dma.store("c", result, out[global_rows, cols], machine.out_bytes)


def reference_gemm(record: dict, machine: Machine, a, bs: list, operands: list, numbers: Numbers) -> np.ndarray:
    """The same GEMM untiled: whole-matrix products, the same ``finish``."""
    layout = record["shape"]["b_layout"]
    rows = [op if step["operand"] == "tile" else np.asarray(op)[None, :]
            for step, op in zip([s for s in record["epilogue"] if "operand" in s], operands)]
    return finish([_multiply(a, b, layout, machine) for b in bs], record["epilogue"], rows, machine, numbers)


# ---- attention ---------------------------------------------------------------------------

def logits(scores, info: dict, numbers: Numbers) -> np.ndarray:
    """Scaled (and soft-capped) scores in fp32; elementwise, so blocks match the whole."""
    x = np.asarray(scores).astype(np.float32) * np.float32(info["scale"] * numbers.acc_scale)
    if info.get("softcap"):
        x = np.float32(info["softcap"]) * np.tanh(x / np.float32(info["softcap"]))
    return x


def _block_update(state, scores, visible, value, numbers: Numbers):
    """One flash step: fold a block of scores into the running output, max and sum."""
    output, peak, total = state
    masked = np.where(visible, scores, -np.inf).astype(np.float32)
    new_peak = np.maximum(peak, masked.max(axis=1))
    base = np.where(np.isfinite(new_peak), new_peak, 0).astype(np.float32)
    weights = np.where(visible, np.exp(masked - base[:, None]), 0).astype(np.float32)
    rescale = np.where(np.isfinite(peak), np.exp(peak - base), 0).astype(np.float32)
    values = np.asarray(value, dtype=np.float32) * np.float32(numbers.v_scale)
    output[...] = output * rescale[:, None] + weights @ values
    total[...] = total * rescale + weights.sum(axis=1)
    peak[...] = new_peak


def per_row(record: dict, values) -> Optional[np.ndarray]:
    """Each query row's value of a per-head [G] (a sink logit, an ALiBi slope) as [M, 1]
    (row r is head r // T of the group), or None."""
    return None if values is None else np.repeat(np.asarray(values, np.float32), record["attention"]["tokens"])[:, None]


def alibi(record: dict, slopes, rows: slice, keys: slice):
    """ALiBi's bias of a block (0 without ``slopes``, [M, 1]): slope times key index minus the
    row's query index past + r mod T (``irc.ops.alibi``)."""
    if slopes is None:
        return np.float32(0)
    info = record["attention"]
    query = info["past"] + np.arange(rows.start, rows.stop)[:, None] % info["tokens"]
    return (slopes[rows] * (np.arange(keys.start, keys.stop)[None, :] - query)).astype(np.float32)


def run_attention(record: dict, machine: Machine, q, k, v, visible, numbers: Numbers, sram: Sram,
                  dma: Dma, sinks=None, slopes=None) -> np.ndarray:
    """One attention group: q [M,Dk], k [S,Dk], v [S,Dv], visible bool [M,S]; ``sinks`` [G]
    fp32 (a record whose shape has sinks) are loaded once and seed each row's running max
    (the sink) and sum (1), as ``irc.ops.attention.masked_softmax`` counts them; ALiBi
    ``slopes`` [G] fp32 are loaded once and bias each block's scores (``alibi``)."""
    shape, tile, order = record["shape"], record["tile"], record["loop_order"]
    M, S, Dv = shape["M"], shape["S"], shape["Dv"]
    trips = {"q": ceil_div(M, tile["q"]), "kv": ceil_div(S, tile["kv"])}
    buffers = {name: Buffer(sram, name, entry) for name, entry in record["buffers"].items()}
    dtype, acc_dtype = np.dtype(NUMPY[machine.dtype]), _acc_dtype(machine)
    out = np.zeros((M, Dv), dtype=dtype)
    pitch = round_up(Dv * 4, machine.align)
    seeds = None
    if shape.get("sinks"):
        group = np.asarray(sinks, np.float32)[None, :]
        resident = dma.load("sinks", group, buffers["sinks"].place(group.shape, np.float32))
        seeds = per_row(record, resident[0])
    if shape.get("alibi"):
        group = np.asarray(slopes, np.float32)[None, :]
        slopes = per_row(record, dma.load("slopes", group, buffers["slopes"].place(group.shape, np.float32))[0])

    def span(axis, index, size):
        return slice(index * tile[axis], min((index + 1) * tile[axis], size))

    resident = {"q": None, "kv": None}
    views, spilled, done = {}, {}, {}
    current = None

    def enter(block):
        rows = span("q", block, M)
        n = rows.stop - rows.start
        state = (buffers["o"].place((n, Dv), np.float32), buffers["o"].place((n, 2), np.float32, offset=n * pitch))
        if block in spilled:
            dma.load("o", spilled[block][0], state[0])
            dma.load("o", spilled.pop(block)[1], state[1])
        else:  # fresh; with sinks the sink is a first key of weight exp(0) = 1 and no value
            state[0][...] = 0
            state[1][:, 0], state[1][:, 1] = (-np.inf, 0) if seeds is None else (seeds[rows, 0], 1)
        views["o"] = state

    def leave(block):
        rows = span("q", block, M)
        output, stats = views["o"]
        if done.get(block, 0) < trips["kv"]:
            spilled[block] = (np.empty_like(output), np.empty_like(stats))
            dma.store("o", output, spilled[block][0], 4)
            dma.store("o", stats, spilled[block][1], 4)
            return
        result = np.where(stats[:, 1:] > 0, output / np.where(stats[:, 1:] > 0, stats[:, 1:], 1), 0)
        dma.store("o", store_as(result.astype(np.float32), machine, numbers), out[rows], machine.out_bytes)

    for index in itertools.product(*(range(trips[axis]) for axis in order)):
        at = dict(zip(order, index))
        if at["q"] != current:
            if current is not None:
                leave(current)
            current = at["q"]
            enter(current)
        rows, keys = span("q", at["q"], M), span("kv", at["kv"], S)
        if resident["q"] != at["q"]:
            resident["q"] = at["q"]
            views["q"] = dma.load("q", q[rows], buffers["q"].place(q[rows].shape, dtype, buffers["q"].next_copy()))
        if resident["kv"] != at["kv"]:
            resident["kv"] = at["kv"]
            views["k"] = dma.load("k", k[keys], buffers["k"].place(k[keys].shape, dtype, buffers["k"].next_copy()))
            views["v"] = dma.load("v", v[keys], buffers["v"].place(v[keys].shape, dtype, buffers["v"].next_copy()))
        scores = buffers["s"].place((rows.stop - rows.start, keys.stop - keys.start), acc_dtype)
        scores[...] = _multiply(views["q"], views["k"], "nk", machine)
        output, stats = views["o"]
        peak, total = stats[:, 0].copy(), stats[:, 1].copy()
        _block_update((output, peak, total), logits(scores, record["attention"], numbers)
                      + alibi(record, slopes, rows, keys), visible[rows, keys], views["v"], numbers)
        stats[:, 0], stats[:, 1] = peak, total
        done[at["q"]] = done.get(at["q"], 0) + 1
    leave(current)
    return out


def reference_attention(record: dict, machine: Machine, q, k, v, visible, numbers: Numbers,
                        sinks=None, slopes=None) -> np.ndarray:
    """Untiled: all scores (ALiBi's bias added), a masked softmax
    (``irc.ops.attention.masked_softmax``, the sinks in its denominators), one product."""
    from irc.ops.attention import masked_softmax

    bias = alibi(record, per_row(record, slopes), slice(0, q.shape[0]), slice(0, k.shape[0]))
    weights = masked_softmax(logits(_multiply(q, k, "nk", machine), record["attention"], numbers) + bias, visible,
                             per_row(record, sinks))
    values = np.asarray(v, dtype=np.float32) * np.float32(numbers.v_scale)
    return store_as((weights @ values).astype(np.float32), machine, numbers)


# ---- entry points ------------------------------------------------------------------------

@dataclass
class Result:
    outputs: np.ndarray        # [count, ...] one output per instance
    dram: dict                 # stream -> bytes moved, all instances
    sram_bytes: int            # SRAM allocated by one instance
    states: Optional[np.ndarray] = None   # a scan: [count, ...] the present state per instance

    @property
    def dram_bytes(self) -> int:
        return sum(self.dram.values())


def execute(record: dict, machine: Machine, operands: dict, numbers: Numbers = Numbers()) -> Result:
    """Run every instance of a planned op tile by tile. ``operands`` holds, per instance
    (leading axis ``count``): GEMM ``a``, ``b`` ([weights, ...]) and ``epilogue`` (a list);
    attention ``q``, ``k``, ``v``, ``visible`` and, with sinks, ``sinks`` [G] fp32 (with ALiBi,
    ``slopes`` [G] fp32); a scan the op's operands by name (``backends.npu.recurrent``)."""
    dma, outputs, states, used = Dma(machine), [], [], 0
    sinks, slopes = (operands.get(name, [None] * record["count"]) for name in ("sinks", "slopes"))
    for i in range(record["count"]):
        sram = Sram(machine)
        if record["kind"] == "scan":
            y, state = run_scan(record, machine, {k: v[i] for k, v in operands.items()}, numbers, sram, dma)
            outputs.append(y)
            states.append(state)
        elif record["kind"] == "gemm":
            outputs.append(run_gemm(record, machine, operands["a"][i], list(operands["b"][i]),
                                    [op[i] for op in operands.get("epilogue", [])], numbers, sram, dma))
        else:
            outputs.append(run_attention(record, machine, operands["q"][i], operands["k"][i], operands["v"][i],
                                         operands["visible"][i], numbers, sram, dma, sinks[i], slopes[i]))
        used = sram.used
    return Result(np.stack(outputs), dma.bytes, used, np.stack(states) if states else None)


def reference(record: dict, machine: Machine, operands: dict, numbers: Numbers = Numbers()) -> np.ndarray:
    """Every instance of the op, untiled."""
    outputs = []
    sinks, slopes = (operands.get(name, [None] * record["count"]) for name in ("sinks", "slopes"))
    for i in range(record["count"]):
        if record["kind"] == "scan":
            outputs.append(reference_scan(record, machine, {k: v[i] for k, v in operands.items()}, numbers)[0])
        elif record["kind"] == "gemm":
            outputs.append(reference_gemm(record, machine, operands["a"][i], list(operands["b"][i]),
                                          [op[i] for op in operands.get("epilogue", [])], numbers))
        else:
            outputs.append(reference_attention(record, machine, operands["q"][i], operands["k"][i], operands["v"][i],
                                               operands["visible"][i], numbers, sinks[i], slopes[i]))
    return np.stack(outputs)
