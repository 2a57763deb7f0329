"""The mLSTM recurrence in ONNX (``irc.ops.mlstm``), the same standard ops for both targets.

Outside the loop, for every token at once (float32): q, k, v reshaped to [B, T, H, d], q
times dk^-0.5, the gates to [B, T, H, 1] and logsigmoid(f) = -Softplus(-f). A standard
``Scan`` over time then carries C [B, H, dk, dv], n [B, H, dk] and m [B, H, 1], its step
writing the reference's update in its order::

    m_t = Max(f' + m, i);  a = Exp(f' + m - m_t);  b = Exp(i - m_t)
    C = a · C + b · (k ⊗ v);  n = a · n + b · k
    h = MatMul(q, C) / (Max(|ReduceSum(q · n)|, Exp(-m_t)) + eps)

and the stacked h [B, T, H, dv] is reshaped to [B, T, H·dv]. Without a past state the scan
starts from zeros; the outputs take the op's output types.
"""
from __future__ import annotations

import numpy as np

from irc.dtypes import DType
from irc.graph import Node
from irc.ops.mlstm import OPERANDS
from irc.ops.registry import by_name

from backends.onnx.builder import ONNX_TYPES, Builder
from backends.onnx.ssm import _finish, _target, _zeros, as_f32, scan_over_time


def _heads(b: Builder, value, heads: int, hint: str) -> str:
    """[B, T, H·d] -> [B, T, H, d] in float32."""
    return b.op("Reshape", [as_f32(b, value), b.i64([0, 0, heads, -1])], hint)


def _write(b: Builder, value, name: str, out: str) -> None:
    """The f32 ``name`` as output ``out`` of ``value``'s type."""
    if value.dtype == DType.f32:
        b.node("Identity", [name], [out])
    else:
        b.node("Cast", [name], [out], to=ONNX_TYPES[value.dtype])


def _step(b: Builder, hint: str, eps: str, axes: dict):
    """The Scan body's writer: states (C, n, m), steps (q, k, v, i, f') -> new states, h."""

    def step(states, steps):
        (c, n, m), (q, k, v, i, f) = states, steps
        decayed = b.op("Add", [f, m], f"{hint}/step_f_m")
        m_new = b.op("Max", [decayed, i], f"{hint}/step_m")
        a = b.op("Exp", [b.op("Sub", [decayed, m_new], f"{hint}/step_f_m_minus")], f"{hint}/step_a")
        e = b.op("Exp", [b.op("Sub", [i, m_new], f"{hint}/step_i_minus")], f"{hint}/step_b")
        kv = b.op("Mul", [b.op("Unsqueeze", [k, axes["3"]], f"{hint}/step_k_col"),
                          b.op("Unsqueeze", [v, axes["2"]], f"{hint}/step_v_row")], f"{hint}/step_kv")
        a4, e4 = (b.op("Unsqueeze", [x, axes["3"]], f"{hint}/step_gate4") for x in (a, e))
        c_new = b.op("Add", [b.op("Mul", [a4, c], f"{hint}/step_c_kept"), b.op("Mul", [e4, kv], f"{hint}/step_c_in")],
                     f"{hint}/step_c")
        n_new = b.op("Add", [b.op("Mul", [a, n], f"{hint}/step_n_kept"), b.op("Mul", [e, k], f"{hint}/step_n_in")],
                     f"{hint}/step_n")
        q_row = b.op("Unsqueeze", [q, axes["2"]], f"{hint}/step_q_row")
        numerator = b.op("Squeeze", [b.op("MatMul", [q_row, c_new], f"{hint}/step_qc"), axes["2"]],
                         f"{hint}/step_numerator")
        qn = b.op("ReduceSum", [b.op("Mul", [q, n_new], f"{hint}/step_q_n"), axes["-1"]], f"{hint}/step_qn",
                  keepdims=1)
        floor = b.op("Exp", [b.op("Neg", [m_new], f"{hint}/step_minus_m")], f"{hint}/step_floor")
        denominator = b.op("Add", [b.op("Max", [b.op("Abs", [qn], f"{hint}/step_abs_qn"), floor], f"{hint}/step_max"),
                                   eps], f"{hint}/step_denominator")
        h = b.op("Div", [numerator, denominator], f"{hint}/step_h")
        return [c_new, n_new, m_new], [h]

    return step


def lower_mlstm(b: Builder, node: Node, outs: list[str]) -> None:
    """Per-token preparation, then the recurrence as a Scan over time (see the module
    docstring)."""
    o = by_name(OPERANDS, node.inputs)
    heads, hint = node.attrs["heads"], outs[0]
    batch, _, qk = o["q"].shape
    dk, dv = qk // heads, o["v"].shape[2] // heads
    q = b.op("Mul", [_heads(b, o["q"], heads, f"{hint}/q"), b.const(dk ** -0.5, np.float32, f"{hint}/scale")],
             f"{hint}/q_scaled")
    k, v = _heads(b, o["k"], heads, f"{hint}/k"), _heads(b, o["v"], heads, f"{hint}/v")
    axes = {"2": b.i64([2]), "3": b.i64([3]), "-1": b.i64([-1])}
    i = b.op("Unsqueeze", [as_f32(b, o["igate"]), axes["3"]], f"{hint}/i")
    f = b.op("Unsqueeze", [as_f32(b, o["fgate"]), axes["3"]], f"{hint}/f")
    f_log = b.op("Neg", [b.op("Softplus", [b.op("Neg", [f], f"{hint}/minus_f")], f"{hint}/softplus_minus_f")],
                 f"{hint}/logsigmoid_f")
    shapes = ((batch, heads, dk, dv), (batch, heads, dk), (batch, heads, 1))
    given = o["past_state"] is not None
    pasts = [as_f32(b, o[name]) if given else _zeros(b, shape, f"{hint}/zero_{name}")
             for name, shape in zip(("past_state", "past_normalizer", "past_max"), shapes)]
    eps = b.const(float(node.attrs["eps"]), np.float32, f"{hint}/eps")
    rows = [(batch, heads, dk), (batch, heads, dk), (batch, heads, dv), (batch, heads, 1), (batch, heads, 1)]
    finals, (h,) = scan_over_time(b, f"{hint}/scan", list(zip(pasts, shapes)), list(zip((q, k, v, i, f_log), rows)),
                                  [(batch, heads, dv)], _step(b, hint, eps, axes))
    target = _target(b, node.outputs[0], outs[0])
    b.node("Reshape", [h, b.i64([0, 0, heads * dv])], [target])
    _finish(b, node.outputs[0], target, outs[0])
    if given:
        for value, final, out in zip(node.outputs[1:], finals, outs[1:]):
            _write(b, value, final, out)


LOWERINGS = {"mlstm": lower_mlstm}
