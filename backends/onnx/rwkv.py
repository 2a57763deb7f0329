"""RWKV-4's ops in ONNX (``irc.ops.rwkv``), the same standard ops for both targets.

- ``token_shift``: Concat(past state as one token, x without its last token) along time;
  the present state is x's last token (Slice from -1, Squeeze). Without a past state the
  first token's is zeros.
- ``rwkv4_wkv``: a standard ``Scan`` over time carrying (num, den, max) [B, A] each, whose
  step writes transformers' ``rwkv_linear_attention_cpu`` update as Max / Exp / Mul / Add /
  Div nodes in the same order (float32); w' = -exp(time_decay) is computed once outside it.
  The past state [B, 3, A] is split into the three before (a channel with den 0 takes max
  -1e38: the empty state, as in the reference) and the finals stacked back into the present.

The shifted tokens and the WKV output take the op's output type (float32 inside).
"""
from __future__ import annotations

import numpy as np

from irc.graph import Node
from irc.ops.registry import by_name
from irc.ops.rwkv import EMPTY_MAX, SHIFT_OPERANDS, WKV_OPERANDS

from backends.onnx.builder import INT64_MAX, Builder
from backends.onnx.ssm import _finish, _present, _target, _zeros, as_f32, scan_over_time


def lower_token_shift(b: Builder, node: Node, outs: list[str]) -> None:
    """shifted = Concat(past[:, None], x[:, :-1]) along time; present = x[:, -1]."""
    o = by_name(SHIFT_OPERANDS, node.inputs)
    x, hint = o["x"], outs[0]
    batch, _, width = x.shape
    xs = as_f32(b, x)
    past = as_f32(b, o["past_state"]) or _zeros(b, (batch, width), f"{hint}/zero_state")
    axis = b.i64([1])
    first = b.op("Unsqueeze", [past, axis], f"{hint}/past_token")
    rest = b.op("Slice", [xs, b.i64([0]), b.i64([-1]), axis], f"{hint}/earlier_tokens")
    target = _target(b, node.outputs[0], outs[0])
    b.node("Concat", [first, rest], [target], axis=1)
    _finish(b, node.outputs[0], target, outs[0])
    if o["past_state"] is not None:
        last = b.op("Slice", [xs, b.i64([-1]), b.i64([INT64_MAX]), axis], f"{hint}/last_token")
        _present(b, node, outs, b.op("Squeeze", [last, axis], f"{hint}/present"))


def wkv_step(b: Builder, hint: str, u: str, w: str, num: str, den: str, mx: str, k: str, v: str) -> tuple:
    """One token of the WKV update, in ``irc.ops.rwkv``'s order of operations: (wkv, num,
    den, max) from the stabilised state (num, den, max), the token's k and v, the bonus u and
    the log decay w = -exp(time_decay). The ONNX Scan body and onnx-npu's unrolled steps
    (``backends.onnx_npu.recurrent_steps``) both emit it."""
    ku = b.op("Add", [k, u], f"{hint}/step_k_u")
    m = b.op("Max", [mx, ku], f"{hint}/step_out_max")
    e1 = b.op("Exp", [b.op("Sub", [mx, m], f"{hint}/step_d1")], f"{hint}/step_e1")
    e2 = b.op("Exp", [b.op("Sub", [ku, m], f"{hint}/step_d2")], f"{hint}/step_e2")
    numer = b.op("Add", [b.op("Mul", [e1, num], f"{hint}/step_n1"), b.op("Mul", [e2, v], f"{hint}/step_n2")],
                 f"{hint}/step_numerator")
    denom = b.op("Add", [b.op("Mul", [e1, den], f"{hint}/step_m1"), e2], f"{hint}/step_denominator")
    out = b.op("Div", [numer, denom], f"{hint}/step_wkv")
    decayed = b.op("Add", [mx, w], f"{hint}/step_decayed")
    m2 = b.op("Max", [decayed, k], f"{hint}/step_state_max")
    f1 = b.op("Exp", [b.op("Sub", [decayed, m2], f"{hint}/step_d3")], f"{hint}/step_f1")
    f2 = b.op("Exp", [b.op("Sub", [k, m2], f"{hint}/step_d4")], f"{hint}/step_f2")
    new_num = b.op("Add", [b.op("Mul", [f1, num], f"{hint}/step_s1"), b.op("Mul", [f2, v], f"{hint}/step_s2")],
                   f"{hint}/step_num")
    new_den = b.op("Add", [b.op("Mul", [f1, den], f"{hint}/step_s3"), f2], f"{hint}/step_den")
    return out, new_num, new_den, m2


def lower_rwkv4_wkv(b: Builder, node: Node, outs: list[str]) -> None:
    """The WKV recurrence as a Scan over time (see the module docstring)."""
    o = by_name(WKV_OPERANDS, node.inputs)
    k, hint = o["k"], outs[0]
    batch, _, channels = k.shape
    u = as_f32(b, o["time_first"])
    w = b.op("Neg", [b.op("Exp", [as_f32(b, o["time_decay"])], f"{hint}/exp_decay")], f"{hint}/decay")
    past = as_f32(b, o["past_state"]) or _zeros(b, (batch, 3, channels), f"{hint}/zero_state")
    num, den, mx = (b.op("Gather", [past, b.i64(j, f"{hint}/part")], f"{hint}/past_{name}", axis=1)
                    for j, name in enumerate(("num", "den", "max")))
    empty = b.op("Equal", [den, b.const(0.0, np.float32, "zero")], f"{hint}/empty")
    mx = b.op("Where", [empty, b.const(EMPTY_MAX, np.float32, "rwkv_empty_max"), mx], f"{hint}/past_max_or_empty")
    row = (batch, channels)

    def step(states, steps):
        out, *state = wkv_step(b, hint, u, w, *states, *steps)
        return state, [out]

    finals, (wkv,) = scan_over_time(b, f"{hint}/scan", [(num, row), (den, row), (mx, row)],
                                    [(as_f32(b, k), row), (as_f32(b, o["v"]), row)], [row], step)
    target = _target(b, node.outputs[0], outs[0])
    b.node("Identity", [wkv], [target])
    _finish(b, node.outputs[0], target, outs[0])
    if o["past_state"] is not None:
        axis = b.i64([1])
        parts = [b.op("Unsqueeze", [f, axis], f"{hint}/present_part") for f in finals]
        _present(b, node, outs, b.op("Concat", parts, f"{hint}/present", axis=1))


LOWERINGS = {"token_shift": lower_token_shift, "rwkv4_wkv": lower_rwkv4_wkv}
