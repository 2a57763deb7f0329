"""The RG-LRU recurrence in ONNX (``irc.ops.rglru``), the same standard ops for both targets.

The per-token gates are elementwise and computed for all tokens at once outside the loop, in
transformers' order (float32): log_a = (-8 · r) · Softplus(Λ), a = Exp(log_a),
m = Sqrt(1 - Exp(2 · log_a)) (1 at a reset token: ``position_ids`` == 0), n = (x · i) · m,
a' = a · (not reset). A standard ``Scan`` over time then carries h [B, W]:
h = a'_t · h + n_t, each step's h the output. Without a past state the scan starts from
zeros; the output takes the op's output type.
"""
from __future__ import annotations

import numpy as np

from irc.graph import Node
from irc.ops.rglru import C, OPERANDS
from irc.ops.registry import by_name

from backends.onnx.builder import Builder
from backends.onnx.ssm import _finish, _present, _target, _zeros, as_f32, scan_over_time


def lower_rg_lru(b: Builder, node: Node, outs: list[str]) -> None:
    """Gates for every token, then the linear recurrence as a Scan over time."""
    o = by_name(OPERANDS, node.inputs)
    x, hint = o["x"], outs[0]
    batch, _, width = x.shape
    r, i = as_f32(b, o["recurrence_gate"]), as_f32(b, o["input_gate"])
    soft = b.op("Softplus", [as_f32(b, o["a_param"])], f"{hint}/softplus")
    log_a = b.op("Mul", [b.op("Mul", [b.const(-C, np.float32, "rglru_minus_c"), r], f"{hint}/minus_c_r"), soft],
                 f"{hint}/log_a")
    a = b.op("Exp", [log_a], f"{hint}/a")
    a_square = b.op("Exp", [b.op("Mul", [b.const(2.0, np.float32, "two"), log_a], f"{hint}/two_log_a")],
                    f"{hint}/a_square")
    one = b.const(1.0, np.float32, "one")
    multiplier = b.op("Sqrt", [b.op("Sub", [one, a_square], f"{hint}/one_minus_a2")], f"{hint}/multiplier")
    if o["position_ids"] is not None:
        reset = b.op("Unsqueeze", [b.op("Equal", [b.op("Cast", [b.value(o["position_ids"])], f"{hint}/pos64", to=7),
                                                  b.const(0, np.int64, "zero_i64")], f"{hint}/reset_bt"),
                                   b.i64([2])], f"{hint}/reset")
        multiplier = b.op("Where", [reset, one, multiplier], f"{hint}/multiplier_reset")
        keep = b.op("Cast", [b.op("Not", [reset], f"{hint}/not_reset")], f"{hint}/keep", to=1)
        a = b.op("Mul", [a, keep], f"{hint}/a_kept")
    gated = b.op("Mul", [as_f32(b, x), i], f"{hint}/gated")
    normalized = b.op("Mul", [gated, multiplier], f"{hint}/normalized")
    past = as_f32(b, o["past_state"]) or _zeros(b, (batch, width), f"{hint}/zero_state")
    row = (batch, width)

    def step(states, steps):
        (h,), (a_t, n_t) = states, steps
        new = b.op("Add", [b.op("Mul", [a_t, h], f"{hint}/step_decayed"), n_t], f"{hint}/step_h")
        return [new], [b.op("Identity", [new], f"{hint}/step_y")]  # a graph output may not repeat a name

    (final,), (y,) = scan_over_time(b, f"{hint}/scan", [(past, row)], [(a, row), (normalized, row)], [row], step)
    target = _target(b, node.outputs[0], outs[0])
    b.node("Identity", [y], [target])
    _finish(b, node.outputs[0], target, outs[0])
    if o["past_state"] is not None:
        _present(b, node, outs, final)


LOWERINGS = {"rg_lru": lower_rg_lru}
