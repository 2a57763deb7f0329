"""Seeded operands for a planned op, to run it through the tiled executor
(``backends.npu.executor``) and its untiled reference: integers over the dtype's range or
standard-normal floats, scales that keep integer outputs in range, and attention's
visibility and per-head extras (sinks, ALiBi slopes) as the op has them."""
from __future__ import annotations

import math

import numpy as np

from backends.npu.memory import NUMPY, Numbers
from backends.npu.recurrent import random_scan_operands


def random_operands(record: dict, machine: Machine, seed: int = 0) -> tuple[dict, Numbers]:
    """Seeded operands for a planned op (integers over the dtype's range, floats standard
    normal) and scales that keep integer outputs in range. Attention masks follow the op:
    row r is token t = r mod T of its head, at cache index past + t; causal and sliding
    window visibility as in ``irc.ops.attention.visible_keys``."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(NUMPY[machine.dtype])
    n, shape = record["count"], record["shape"]
    if record["kind"] == "scan":
        numbers = Numbers() if machine.is_float else Numbers(operand_scale=1.0 / 100, out_scale=1.0 / 32)
        return random_scan_operands(record, machine, rng), numbers

    def draw(*dims):
        if machine.is_float:
            return rng.standard_normal((n, *dims)).astype(dtype)
        return rng.integers(-100, 101, size=(n, *dims)).astype(dtype)

    if record["kind"] == "gemm":
        M, K, N = shape["M"], shape["K"], shape["N"]
        b = draw(shape["weights"], N, K) if shape["b_layout"] == "nk" else draw(shape["weights"], K, N)
        epilogue = [draw(M, N) if step["operand"] == "tile" else draw(N)
                    for step in record["epilogue"] if "operand" in step]
        numbers = Numbers() if machine.is_float else Numbers(acc_scale=1.0 / (100 * 100 * math.sqrt(K)),
                                                              operand_scale=1.0 / 100, out_scale=1.0 / 40)
        return {"a": draw(M, K), "b": b, "epilogue": epilogue}, numbers
    M, S, Dk, Dv = shape["M"], shape["S"], shape["Dk"], shape["Dv"]
    info = record["attention"]
    query = info["past"] + np.arange(M)[:, None] % info["tokens"]
    key = np.arange(S)[None, :]
    visible = np.ones((M, S), dtype=bool)
    if info["causal"]:
        visible &= key <= query
    if info.get("window"):  # symmetric without causal, as the attention op's
        visible &= (key > query - info["window"]) if info["causal"] else (np.abs(key - query) < info["window"])
    if info.get("chunk"):  # Llama-4's chunks, in the record's frame of keys
        visible &= key // info["chunk"] == query // info["chunk"]
    numbers = Numbers() if machine.is_float else Numbers(acc_scale=1.0 / (100 * 100), v_scale=1.0 / 100,
                                                          out_scale=1.0 / 100)
    operands = {"q": draw(M, Dk), "k": draw(S, Dk), "v": draw(S, Dv), "visible": np.broadcast_to(visible, (n, M, S))}
    if shape.get("sinks"):  # logits in real units, like the scaled scores they join: of order one
        operands["sinks"] = (2.0 * rng.standard_normal((n, shape["sinks"]))).astype(np.float32)
    if shape.get("alibi"):  # BLOOM-like slopes: 2^-1 .. 2^-8 over the group
        operands["slopes"] = np.tile(2.0 ** -np.linspace(1, 8, shape["alibi"]), (n, 1)).astype(np.float32)
    return operands, numbers
