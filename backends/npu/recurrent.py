"""The tiled executor of a planned scan (``irc.npu.scan``): a recurrent layer run unit tile
by unit tile and token chunk by chunk against the explicit SRAM, as the plan says.

Every buffer of the record is carved from the SRAM (``executor.Sram``). A unit tile's state
and parameters are loaded once and stay resident; each token chunk's inputs and shared
rows are loaded into their buffers (ping-pong when double-buffered), the chunk advances the
resident state, and its outputs are stored; the state is stored once at the end of the
tile. The DMA counts bytes per stream with ``irc.npu.scan.block_bytes`` (a tile spanning a
tensor's whole width is one contiguous run), so the counts equal the plan's ``dram``.

A chunk is advanced by the op's own reference function (``irc.ops.ssm.ssd``,
``irc.ops.delta.gated_delta_rule``, ``irc.ops.ssm.causal_conv1d``) on the chunk's tiles,
from the resident state: the op's recurrence is associative over chunks and separable over
units (a head tile reads its group's B and C, or q and k), so the result equals the
untiled reference up to float rounding. Integer dtypes hold codes: inputs are dequantized
with ``operand_scale``, outputs quantized with ``out_scale`` (``executor.store_as``); the
state is float at accumulator width.
"""
from __future__ import annotations

import numpy as np

from backends.npu.memory import NUMPY, Buffer, store_as
from irc.npu.scan import ScanShape, block_bytes, shared_reads, spans
from irc.npu.target import Machine, round_up
from irc.ops.delta import gated_delta_rule
from irc.ops.ssm import causal_conv1d, ssd

PER_UNIT = {"ssd": ("x", "dt"), "gated_delta_rule": ("v", "a", "b"), "causal_conv1d": ("x",)}
SHARED = {"ssd": ("B", "C"), "gated_delta_rule": ("q", "k"), "causal_conv1d": ()}
PARAMS = {"ssd": ("A_log", "D", "dt_bias"), "gated_delta_rule": ("A_log", "dt_bias"),
          "causal_conv1d": ("weight", "bias")}


def _state_dtype(machine: Machine):
    return np.float32 if machine.acc_bytes <= 4 else np.float64


def _present(record: dict, names) -> list:
    return [name for name in names if name in record["scan"]["operands"]]


def advance(record: dict, tiles: dict, state, units: int, groups: int):
    """(outputs [t, units·out], new state [units, ...]) of one chunk, floats."""
    op, a = record["scan"]["op"], record["scan"]["attrs"]
    one = {name: (value[None] if value.ndim == 2 else value) for name, value in tiles.items()}
    if op == "ssd":
        y, h = ssd(one["x"], one["dt"], one["A_log"], one["B"], one["C"], one.get("D"), one.get("dt_bias"),
                   past_state=state[None], **{**a, "heads": units, "groups": groups})
    elif op == "gated_delta_rule":
        y, h = gated_delta_rule(one["q"], one["k"], one["v"], one.get("a"), one.get("b"), one["A_log"],
                                one.get("dt_bias"), past_state=state[None],
                                **{**a, "value_heads": units, "key_heads": groups})
    else:
        weight = one["weight"].reshape(units, 1, -1)
        y, h = causal_conv1d(one["x"], weight, one.get("bias"), state[None], activation=a["activation"])
    return y[0], h[0]


def _state_shape(record: dict, units: int) -> tuple:
    op, a = record["scan"]["op"], record["scan"]["attrs"]
    if op == "ssd":
        return (units, a["state_size"], a["head_dim"])
    if op == "gated_delta_rule":
        return (units, a["key_dim"], a["value_dim"])
    return (units, record["shape"]["state"])


def run_scan(record: dict, machine: Machine, operands: dict, numbers, sram, dma) -> tuple:
    """One sequence: ``operands`` by name (activations [T, width], parameters flat, the
    past state [H, ...]); returns (outputs [T, H·out], present state [H, ...])."""

    shape = ScanShape.from_json(record["shape"])
    op, h, t = record["scan"]["op"], record["tile"]["h"], record["tile"]["t"]
    buffers = {name: Buffer(sram, name, entry) for name, entry in record["buffers"].items()}
    ob, align, code = machine.op_bytes, machine.align, np.dtype(NUMPY[machine.dtype])
    per_unit = list(zip(_present(record, PER_UNIT[op]), shape.unit_inputs))
    shared = list(zip(SHARED[op], shape.shared))
    params = list(zip(_present(record, PARAMS[op]), shape.params))
    groups_total = -(-shape.H // shape.group)
    out = np.zeros((shape.T, shape.H * shape.outputs), code)
    present = np.zeros_like(np.asarray(operands["past_state"], np.float32))
    scale = np.float32(1.0 if machine.is_float else numbers.operand_scale)

    def count(stream, nbytes):
        dma.bytes[stream] = dma.bytes.get(stream, 0) + int(nbytes)

    for stream in record["dram"]:   # every planned stream, those that move nothing too
        count(stream, 0)

    def load(buffer, stream, names_widths, first, units, total, rows, copy):
        tiles, offset = {}, 0
        for name, w in names_widths:
            source = operands[name][rows, first * w:(first + units) * w]
            view = buffers[buffer].place(source.shape, code, copy, offset)
            view[...] = source
            offset += source.shape[0] * round_up(source.shape[1] * ob, align)
            count(stream, block_bytes(source.shape[0], source.shape[1], total * w, ob, align))
            tiles[name] = view.astype(np.float32) * scale
        return tiles

    for (start, units), (first_group, groups) in zip(spans(shape.H, h), shared_reads(shape, h)):
        state = buffers["state"].place((1, units * shape.state), _state_dtype(machine))
        state[...] = np.asarray(operands["past_state"][start:start + units], np.float32).reshape(1, -1)
        count("state", block_bytes(1, units * shape.state, units * shape.state, machine.acc_bytes, align))
        resident, offset = {}, 0
        for name, p in params:
            view = buffers["params"].place((1, units * p), np.float32, 0, offset)
            view[...] = operands[name][start * p:(start + units) * p]
            offset += round_up(units * p * 4, align)
            count("params", block_bytes(1, units * p, units * p, 4, align))
            resident[name] = view[0]
        for begin, tokens in spans(shape.T, t):
            rows = slice(begin, begin + tokens)
            copy = buffers["inputs"].next_copy()
            tiles = load("inputs", "inputs", per_unit, start, units, shape.H, rows, copy)
            if shared:
                tiles.update(load("shared", "shared", shared, first_group, groups, groups_total, rows,
                                  buffers["shared"].next_copy()))
            y, new = advance(record, {**tiles, **resident}, state.reshape(_state_shape(record, units)), units,
                             groups)
            state[...] = new.reshape(1, -1)
            result = buffers["outputs"].place(y.shape, code)
            result[...] = store_as(np.asarray(y, np.float32), machine, numbers)
            out[rows, start * shape.outputs:(start + units) * shape.outputs] = result
            count("outputs", block_bytes(tokens, units * shape.outputs, shape.H * shape.outputs, machine.out_bytes,
                                         align))
        present[start:start + units] = state.reshape(present[start:start + units].shape)
        count("state", block_bytes(1, units * shape.state, units * shape.state, machine.acc_bytes, align))
    return out, present


def reference_scan(record: dict, machine: Machine, operands: dict, numbers) -> tuple:
    """The untiled op on the same (dequantized) operands: (outputs, present state)."""

    shape = ScanShape.from_json(record["shape"])
    op = record["scan"]["op"]
    scale = np.float32(1.0 if machine.is_float else numbers.operand_scale)
    tiles = {name: operands[name].astype(np.float32) * scale
             for name in _present(record, PER_UNIT[op]) + list(SHARED[op])}
    tiles.update({name: operands[name] for name in _present(record, PARAMS[op])})
    groups = -(-shape.H // shape.group)
    y, state = advance(record, tiles, np.asarray(operands["past_state"], np.float32), shape.H, groups)
    return store_as(np.asarray(y, np.float32), machine, numbers), state


def random_scan_operands(record: dict, machine: Machine, rng) -> dict:
    """Seeded operands for every instance (leading axis ``count``): activations as codes of
    the operand dtype (integers over [-100, 100], floats standard normal), parameters and
    the past state fp32."""

    shape, n = ScanShape.from_json(record["shape"]), record["count"]
    op = record["scan"]["op"]
    code = np.dtype(NUMPY[machine.dtype])

    def activation(width):
        if machine.is_float:
            return (0.5 * rng.standard_normal((n, shape.T, width))).astype(code)
        return rng.integers(-100, 101, size=(n, shape.T, width)).astype(code)

    groups = -(-shape.H // shape.group)
    operands = {name: activation(shape.H * w) for name, w in zip(_present(record, PER_UNIT[op]), shape.unit_inputs)}
    operands.update({name: activation(groups * w) for name, w in zip(SHARED[op], shape.shared)})
    for name, p in zip(_present(record, PARAMS[op]), shape.params):
        operands[name] = np.broadcast_to((0.5 * rng.standard_normal(shape.H * p)).astype(np.float32),
                                         (n, shape.H * p))
    state = (0.5 * rng.standard_normal((n,) + _state_shape(record, shape.H))).astype(np.float32)
    operands["past_state"] = state
    return operands
