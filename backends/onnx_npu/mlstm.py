"""xLSTM's mLSTM recurrence (``irc.ops.mlstm``) on onnx-npu: the call's T tokens (a static
count: the chunk graph's ``--chunk``, 1 in the decode graph) unrolled, one update of the
fixed-size state each, as ``backends.onnx_npu.recurrent_steps`` does for RWKV-4 and the RG-LRU.

For all tokens at once: q (times dk^-0.5), k, v heads first [1, H, T, d], the gates
[1, H, T, 1] and logsigmoid(f) = -Softplus(-f). The state C [1, H, dk, dv], n as [1, H, 1, dk]
and m as [1, H, 1, 1]; per token, in the reference's order::

    m_t = Max(f' + m, i);  a = Exp(f' + m - m_t);  b = Exp(i - m_t)
    C = a · C + b · (kᵀ v);  n = a · n + b · k
    h = MatMul(q, C) / (Max(Max(q·n, -q·n), Exp(-m_t)) + eps)

Elementwise ops, small MatMuls and a ReduceSum, rank 4 or less, no Scan, Loop or If. Every
token of a call is real (the host feeds whole chunks). In fp16, Exp(-m_t) overflows where the
stabilizer m_t falls below about -11 (an input gate soft-capped near -15 can take it there):
the quotient is then 0 where float32 keeps a tiny value.
"""
from __future__ import annotations

import numpy as np

from irc.graph import Node
from irc.ops.mlstm import OPERANDS
from irc.ops.registry import by_name

from backends.onnx.ssm import as_f32
from backends.onnx_npu import recurrent
from backends.onnx_npu.lower import NpuBuilder
from backends.onnx_npu.recurrent import finish, heads_first, per_token, tokens_last


def _token(b: NpuBuilder, x: str, t: int, axis: int, hint: str) -> str:
    """Token ``t`` of ``x`` along ``axis`` (kept as a length-1 axis)."""
    return b.op("Slice", [x, b.i64([t]), b.i64([t + 1]), b.i64([axis])], f"{hint}{t}")


def _prepared(b: NpuBuilder, o: dict, heads: int, tokens: int, hint: str) -> dict:
    """Every token's operands, heads first (module docstring)."""
    dk, dv = b.size(o["q"].shape[2]) // heads, b.size(o["v"].shape[2]) // heads
    q = heads_first(b, as_f32(b, o["q"]), tokens, heads, dk, f"{hint}/q")
    k = heads_first(b, as_f32(b, o["k"]), tokens, heads, dk, f"{hint}/k")
    f = per_token(b, as_f32(b, o["fgate"]), f"{hint}/f")
    minus = b.const(-1.0, np.float32, f"{hint}/minus_one")
    return {"q": b.op("Mul", [q, b.const(dk ** -0.5, np.float32, f"{hint}/scale")], f"{hint}/q_scaled"), "k": k,
            "k_cols": b.op("Transpose", [k], f"{hint}/k_cols", perm=[0, 1, 3, 2]),
            "v": heads_first(b, as_f32(b, o["v"]), tokens, heads, dv, f"{hint}/v"),
            "i": per_token(b, as_f32(b, o["igate"]), f"{hint}/i"),
            "f": b.op("Mul", [b.op("Softplus", [b.op("Mul", [f, minus], f"{hint}/minus_f")], f"{hint}/softplus"),
                              minus], f"{hint}/logsigmoid_f"), "dk": dk, "dv": dv}


def lower_mlstm(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    """The mLSTM: its operands for all tokens, then one state update a token (module docstring)."""
    o = by_name(OPERANDS, node.inputs)
    recurrent._need_state(node, o["past_state"])
    heads, hint = node.attrs["heads"], outs[0]
    tokens = b.size(o["q"].shape[1])
    p = _prepared(b, o, heads, tokens, hint)
    c = as_f32(b, o["past_state"])
    n = b.op("Reshape", [as_f32(b, o["past_normalizer"]), b.i64([1, heads, 1, p["dk"]])], f"{hint}/n0")
    m = b.op("Reshape", [as_f32(b, o["past_max"]), b.i64([1, heads, 1, 1])], f"{hint}/m0")
    eps, minus = b.const(float(node.attrs["eps"]), np.float32, f"{hint}/eps"), b.const(-1.0, np.float32)
    ys = []
    for t in range(tokens):
        i_t, q_t, k_t = (_token(b, p[x], t, 2, f"{hint}/{x}_") for x in ("i", "q", "k"))
        decayed = b.op("Add", [_token(b, p["f"], t, 2, f"{hint}/f_"), m], f"{hint}/f_m{t}")
        m_new = b.op("Max", [decayed, i_t], f"{hint}/m{t}")
        a = b.op("Exp", [b.op("Sub", [decayed, m_new], f"{hint}/a_log{t}")], f"{hint}/a{t}")
        e = b.op("Exp", [b.op("Sub", [i_t, m_new], f"{hint}/b_log{t}")], f"{hint}/b{t}")
        kv = b.op("Mul", [_token(b, p["k_cols"], t, 3, f"{hint}/k_col_"), _token(b, p["v"], t, 2, f"{hint}/v_")],
                  f"{hint}/kv{t}")
        c = b.op("Add", [b.op("Mul", [a, c], f"{hint}/c_kept{t}"), b.op("Mul", [e, kv], f"{hint}/c_in{t}")],
                 f"{hint}/c{t}")
        n = b.op("Add", [b.op("Mul", [a, n], f"{hint}/n_kept{t}"), b.op("Mul", [e, k_t], f"{hint}/n_in{t}")],
                 f"{hint}/n{t}")
        qn = b.op("ReduceSum", [b.op("Mul", [q_t, n], f"{hint}/q_n{t}"), b.i64([3])], f"{hint}/qn{t}", keepdims=1)
        size = b.op("Max", [qn, b.op("Mul", [qn, minus], f"{hint}/minus_qn{t}")], f"{hint}/abs_qn{t}")
        floor = b.op("Exp", [b.op("Mul", [m_new, minus], f"{hint}/minus_m{t}")], f"{hint}/floor{t}")
        denominator = b.op("Add", [b.op("Max", [size, floor], f"{hint}/max{t}"), eps], f"{hint}/denominator{t}")
        ys.append(b.op("Div", [b.op("MatMul", [q_t, c], f"{hint}/qc{t}"), denominator], f"{hint}/h{t}"))
        m = m_new
    y = ys[0] if tokens == 1 else b.op("Concat", ys, f"{hint}/y", axis=2)
    finish(b, node.outputs[0], tokens_last(b, y, tokens, heads * p["dv"], f"{hint}/y"), outs[0])
    finish(b, node.outputs[1], c, outs[1])
    finish(b, node.outputs[2], b.op("Reshape", [n, b.i64([1, heads, p["dk"]])], f"{hint}/n_state"), outs[2])
    finish(b, node.outputs[3], b.op("Reshape", [m, b.i64([1, heads, 1])], f"{hint}/m_state"), outs[3])


LOWERINGS = {"mlstm": lower_mlstm}

__all__ = ["LOWERINGS", "lower_mlstm"]
