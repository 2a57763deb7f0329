"""The recurrences whose decay differs per channel, on onnx-npu: Mamba-1's ``selective_scan``
(a decay per channel and state index), the gated delta rule with a per-key-channel decay
(``decay="channel"``, Kimi Delta Attention), RWKV-4's WKV and token shift and RecurrentGemma's
RG-LRU, as the call's T tokens unrolled step by step.

The chunk form of ``backends.onnx_npu.recurrent`` turns a per-head decay into [T, T] pair
matrices; with a decay per channel those matrices grow by the channels (Mamba-1: D·N·T² numbers
a layer, 84 MB at D = 5120, N = 16, T = 16), so here each of the T tokens (a static count: the
chunk graph's ``--chunk``, 1 in the decode graph) is one update of the fixed-size state, the
recurrence exactly as ``irc.ops.ssm.selective_scan`` and ``irc.ops.delta.gated_delta_rule``
write it. Every step is elementwise ops and small MatMuls, rank 4 or less, no Scan, Loop or
If; the graph grows by a few nodes per token and layer. Every token of a call is real (the host
feeds whole chunks), so no padding mask is read.

- ``selective_scan`` (state [1, D, N]): Δ = softplus(dt); all T decays exp(Δ·A) and writes
  Δ·x ⊗ B at once ([1, T, D, N]); per token h = decay_t ⊙ h + write_t; the T states
  stacked, y = Σ_n h ⊙ C (+ D·x, × silu(z)).
- ``gated_delta_rule`` with ``decay="channel"`` (state [1, H, d_k, d_v]): q̂, k̂, v, the
  per-channel log decay g = -exp(A_log)·softplus(a + dt_bias) [1, H, T, d_k] and β per head
  prepared for all tokens; per token S ← exp(g_t)ᵀ ⊙ S, S ← S + k̂_tᵀ (β_t (v_t − k̂_t S))
  (the gated rule writes v_t), o_t = q̂_t S. A per-head decay takes the chunk form.
- ``token_shift`` (RWKV, state [1, d]): the past token then the call's tokens but the last;
  the present is the last token.
- ``rwkv4_wkv`` (RWKV-4, state [1, 3, A]: num, den, max): per token the stabilised update of
  ``irc.ops.rwkv``. An empty channel (den 0; after any token den >= 1, its largest term being
  e^0) reads its max as -60000 rather than the reference's -1e38, which fp16 cannot hold;
  both make e^(max - m) exactly 0, so the numbers are the same.
- ``rg_lru`` (RecurrentGemma, state [1, W]): the gates of ``irc.ops.rglru`` for all tokens
  (a token at position 0 resets: reset = relu(1 - position), exact on integers), then per
  token h = a'_t ⊙ h + n_t.
"""
from __future__ import annotations

import numpy as np

from irc.dtypes import DType
from irc.graph import Node, Param
from irc.ops.delta import OPERANDS as DELTA_OPERANDS
from irc.ops.registry import by_name
from irc.ops.rglru import C as RGLRU_C, OPERANDS as RGLRU_OPERANDS
from irc.ops.rwkv import SHIFT_OPERANDS, WKV_OPERANDS
from irc.ops.ssm import SCAN_OPERANDS

from backends.onnx.portable import silu
from backends.onnx.rwkv import wkv_step
from backends.onnx.ssm import as_f32
from backends.onnx_npu import recurrent
from backends.onnx_npu.lower import NpuBuilder
from backends.onnx_npu.recurrent import delta_qkv, finish, heads_first, per_token, tokens_last


def _step(b: NpuBuilder, x: str, t: int, axis: int, hint: str) -> str:
    """Token ``t`` of ``x`` along ``axis`` (kept as a length-1 axis)."""
    return b.op("Slice", [x, b.i64([t]), b.i64([t + 1]), b.i64([axis])], f"{hint}{t}")


# ---- selective_scan (Mamba-1) -----------------------------------------------------------------

def _negative_rate(A_log) -> np.ndarray:
    """-exp(A_log) [1, 1, D, N] float32."""
    A = -np.exp(np.asarray(A_log, np.float32))
    return A.reshape(1, 1, *A.shape)


def _scan_rate(b: NpuBuilder, A_log) -> str:
    if isinstance(A_log, Param):
        return b.derived(f"{A_log.name}.scan_rate", DType.f32, (1, 1, *A_log.shape), (A_log,), _negative_rate)
    shape = b.i64([1, 1, *(b.size(d) for d in A_log.shape)])
    return b.op("Neg", [b.op("Exp", [b.op("Reshape", [as_f32(b, A_log), shape], f"{A_log.name}/rows")],
                              f"{A_log.name}/exp")], f"{A_log.name}/scan_rate")


def lower_selective_scan(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    """Mamba-1's scan over the call's tokens, one state update a token (module docstring)."""
    o = by_name(SCAN_OPERANDS, node.inputs)
    recurrent._need_state(node, o["past_state"])
    tokens, hint = b.size(o["x"].shape[1]), outs[0]
    channels, size = b.size(o["x"].shape[2]), b.size(o["A_log"].shape[1])
    x = as_f32(b, o["x"])
    delta = b.op("Softplus", [as_f32(b, o["dt"])], f"{hint}/delta")                          # [1, T, D]
    column = b.i64([1, tokens, channels, 1])
    decays = b.op("Exp", [b.op("Mul", [b.op("Reshape", [delta, column], f"{hint}/delta_col"),
                                       _scan_rate(b, o["A_log"])], f"{hint}/log_decay")], f"{hint}/decay")
    row = b.i64([1, tokens, 1, size])
    dx = b.op("Reshape", [b.op("Mul", [delta, x], f"{hint}/dx"), column], f"{hint}/dx_col")
    writes = b.op("Mul", [dx, b.op("Reshape", [as_f32(b, o["B"]), row], f"{hint}/B_row")], f"{hint}/writes")
    h = b.op("Reshape", [as_f32(b, o["past_state"]), b.i64([1, 1, channels, size])], f"{hint}/h0")
    states = []
    for t in range(tokens):                                                           # [1, 1, D, N] each
        h = b.op("Add", [b.op("Mul", [h, _step(b, decays, t, 1, f"{hint}/decay_")], f"{hint}/kept{t}"),
                         _step(b, writes, t, 1, f"{hint}/write_")], f"{hint}/h{t}")
        states.append(h)
    stacked = states[0] if tokens == 1 else b.op("Concat", states, f"{hint}/states", axis=1)
    read = b.op("Mul", [stacked, b.op("Reshape", [as_f32(b, o["C"]), row], f"{hint}/C_row")], f"{hint}/read")
    y = b.op("ReduceSum", [read, b.i64([3])], f"{hint}/y", keepdims=0)                    # [1, T, D]
    if o["D"] is not None:
        y = b.op("Add", [y, b.op("Mul", [x, as_f32(b, o["D"])], f"{hint}/skip")], f"{hint}/y_skip")
    if o["z"] is not None:
        y = b.op("Mul", [y, silu(b, as_f32(b, o["z"]), b.fresh(f"{hint}/gate"))], f"{hint}/y_gated")
    finish(b, node.outputs[1], b.op("Reshape", [h, b.i64([1, channels, size])], f"{hint}/state"), outs[1])
    finish(b, node.outputs[0], y, outs[0])


# ---- gated_delta_rule with a per-key-channel decay (Kimi) ---------------------------------------

def _channel_rate(A_log) -> np.ndarray:
    return -np.exp(np.asarray(A_log, np.float32))


def _channel_log_decay(b: NpuBuilder, o: dict, tokens: int, heads: int, key_dim: int, hint: str) -> str:
    """g [1, H, T, d_k]: -exp(A_log)·softplus(a + dt_bias), A_log per head or per channel."""
    raw = as_f32(b, o["a"])
    if o["dt_bias"] is not None:
        raw = b.op("Add", [raw, as_f32(b, o["dt_bias"])], f"{hint}/a_raw")
    soft = heads_first(b, b.op("Softplus", [raw], f"{hint}/a_soft"), tokens, heads, key_dim, f"{hint}/a")
    A_log = o["A_log"]
    per_channel = b.size(A_log.shape[0]) == heads * key_dim
    shape = (1, heads, 1, key_dim if per_channel else 1)
    if isinstance(A_log, Param):
        rate = b.derived(f"{A_log.name}.channel_rate", DType.f32, shape, (A_log,),
                         lambda v: _channel_rate(v).reshape(shape))
    else:
        rate = b.op("Neg", [b.op("Exp", [b.op("Reshape", [as_f32(b, A_log), b.i64(list(shape))], f"{hint}/A_rows")],
                                 f"{hint}/A_exp")], f"{hint}/rate")
    return b.op("Mul", [soft, rate], f"{hint}/g")


def lower_gated_delta_rule(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    """The gated delta rule: a per-head decay in the chunk form (``recurrent``), a per-key-
    channel one a token at a time (module docstring)."""
    o, a = by_name(DELTA_OPERANDS, node.inputs), node.attrs
    if a["decay"] == "head" or o["a"] is None:
        return recurrent.lower_gated_delta_rule(b, node, outs)
    recurrent._need_state(node, o["past_state"])
    heads, key_dim, value_dim = a["value_heads"], a["key_dim"], a["value_dim"]
    tokens, hint = b.size(o["q"].shape[1]), outs[0]
    q, k, v = delta_qkv(b, o, a, tokens, hint)
    decays = b.op("Exp", [_channel_log_decay(b, o, tokens, heads, key_dim, hint)], f"{hint}/decay")
    beta = None
    if a["update_rule"] == "gated_delta":
        beta = per_token(b, b.op("Sigmoid", [as_f32(b, o["b"])], f"{hint}/beta_rows"), f"{hint}/beta")
    S, outputs = as_f32(b, o["past_state"]), []                                               # [1, H, d_k, d_v]
    for t in range(tokens):
        k_t = _step(b, k, t, 2, f"{hint}/k_")                                                 # [1, H, 1, d_k]
        k_col = b.op("Transpose", [k_t], f"{hint}/k_col{t}", perm=[0, 1, 3, 2])
        decay = b.op("Transpose", [_step(b, decays, t, 2, f"{hint}/decay_")], f"{hint}/decay_col{t}",
                     perm=[0, 1, 3, 2])
        S = b.op("Mul", [S, decay], f"{hint}/S_kept{t}")
        write = _step(b, v, t, 2, f"{hint}/v_")
        if beta is not None:
            recalled = b.op("MatMul", [k_t, S], f"{hint}/recalled{t}")
            write = b.op("Mul", [b.op("Sub", [write, recalled], f"{hint}/error{t}"),
                                 _step(b, beta, t, 2, f"{hint}/beta_")], f"{hint}/write{t}")
        S = b.op("Add", [S, b.op("MatMul", [k_col, write], f"{hint}/written{t}")], f"{hint}/S{t}")
        outputs.append(b.op("MatMul", [_step(b, q, t, 2, f"{hint}/q_"), S], f"{hint}/o{t}"))
    out = outputs[0] if tokens == 1 else b.op("Concat", outputs, f"{hint}/o", axis=2)         # [1, H, T, d_v]
    finish(b, node.outputs[1], S, outs[1])
    finish(b, node.outputs[0], tokens_last(b, out, tokens, heads * value_dim, f"{hint}/o"), outs[0])


# ---- RWKV-4: token_shift and rwkv4_wkv ----------------------------------------------------------

EMPTY_MAX = -60000.0  # an empty channel's max (module docstring): e^(max - m) is 0, and fp16 holds it


def lower_token_shift(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    """The previous token of each of the call's tokens, the first's from the state."""
    o = by_name(SHIFT_OPERANDS, node.inputs)
    recurrent._need_state(node, o["past_state"])
    tokens, width, hint = b.size(o["x"].shape[1]), b.size(o["x"].shape[2]), outs[0]
    x = as_f32(b, o["x"])
    past = b.op("Reshape", [as_f32(b, o["past_state"]), b.i64([1, 1, width])], f"{hint}/past")
    shifted = past if tokens == 1 else b.op(
        "Concat", [past, b.op("Slice", [x, b.i64([0]), b.i64([tokens - 1]), b.i64([1])], f"{hint}/earlier")],
        f"{hint}/shifted", axis=1)
    last = b.op("Reshape", [_step(b, x, tokens - 1, 1, f"{hint}/last"), b.i64([1, width])], f"{hint}/present")
    finish(b, node.outputs[1], last, outs[1])
    finish(b, node.outputs[0], shifted, outs[0])


def _negative_exp(w) -> np.ndarray:
    return (-np.exp(np.asarray(w, np.float32))).reshape(1, 1, -1)


def lower_rwkv4_wkv(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    """RWKV-4's WKV a token at a time (module docstring)."""
    o = by_name(WKV_OPERANDS, node.inputs)
    recurrent._need_state(node, o["past_state"])
    tokens, width, hint = b.size(o["k"].shape[1]), b.size(o["k"].shape[2]), outs[0]
    k, v = as_f32(b, o["k"]), as_f32(b, o["v"])
    w, u = o["time_decay"], o["time_first"]
    decay = b.derived(f"{w.name}.rate", DType.f32, (1, 1, width), (w,), _negative_exp) if isinstance(w, Param) \
        else b.op("Neg", [b.op("Exp", [as_f32(b, w)], f"{hint}/w_exp")], f"{hint}/w")
    state = as_f32(b, o["past_state"])                                                     # [1, 3, A]
    num, den, mx = (_step(b, state, j, 1, f"{hint}/state_") for j in range(3))           # [1, 1, A] each
    one = b.const(1.0, np.float32, f"{hint}/one")
    empty = b.op("Sub", [one, b.op("Min", [den, one], f"{hint}/den_capped")], f"{hint}/empty")
    mx = b.op("Add", [mx, b.op("Mul", [empty, b.op("Sub", [b.const(EMPTY_MAX, np.float32, f"{hint}/empty_max"), mx],
                                                       f"{hint}/to_empty")], f"{hint}/empty_shift")], f"{hint}/max0")
    outputs, u = [], as_f32(b, u)
    for t in range(tokens):
        out, num, den, mx = wkv_step(b, hint, u, decay, num, den, mx, _step(b, k, t, 1, f"{hint}/k_"),
                                     _step(b, v, t, 1, f"{hint}/v_"))
        outputs.append(out)
    out = outputs[0] if tokens == 1 else b.op("Concat", outputs, f"{hint}/wkv", axis=1)
    finish(b, node.outputs[1], b.op("Concat", [num, den, mx], f"{hint}/state", axis=1), outs[1])
    finish(b, node.outputs[0], out, outs[0])


# ---- rg_lru (RecurrentGemma) --------------------------------------------------------------------

def _log_rate(a_param) -> np.ndarray:
    """-8·softplus(Λ) [1, 1, W] float32 (log a per unit of the recurrence gate)."""
    lam = np.asarray(a_param, np.float32)
    return (np.float32(-RGLRU_C) * (np.log1p(np.exp(-np.abs(lam))) + np.maximum(lam, 0))).reshape(1, 1, -1)


def lower_rg_lru(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    """The RG-LRU: its gates for all tokens, then one state update a token (module docstring)."""
    o = by_name(RGLRU_OPERANDS, node.inputs)
    recurrent._need_state(node, o["past_state"])
    tokens, width, hint = b.size(o["x"].shape[1]), b.size(o["x"].shape[2]), outs[0]
    lam = o["a_param"]
    if isinstance(lam, Param):
        rate = b.derived(f"{lam.name}.log_rate", DType.f32, (1, 1, width), (lam,), _log_rate)
    else:
        rate = b.op("Mul", [b.op("Softplus", [as_f32(b, lam)], f"{hint}/softplus"),
                            b.const(-RGLRU_C, np.float32, f"{hint}/c")], f"{hint}/rate")
    log_a = b.op("Mul", [as_f32(b, o["recurrence_gate"]), rate], f"{hint}/log_a")
    a = b.op("Exp", [log_a], f"{hint}/a")
    a_square = b.op("Exp", [b.op("Mul", [log_a, b.const(2.0, np.float32, f"{hint}/two")], f"{hint}/log_a2")],
                    f"{hint}/a2")
    one = b.const(1.0, np.float32, f"{hint}/one")
    multiplier = b.op("Sqrt", [b.op("Sub", [one, a_square], f"{hint}/rest")], f"{hint}/multiplier")
    if o["position_ids"] is not None:
        positions = b.op("Reshape", [as_f32(b, o["position_ids"]), b.i64([1, tokens, 1])], f"{hint}/positions")
        reset = b.op("Relu", [b.op("Sub", [one, positions], f"{hint}/before_one")], f"{hint}/reset")
        multiplier = b.op("Add", [multiplier, b.op("Mul", [reset, b.op("Sub", [one, multiplier], f"{hint}/to_one")],
                                                   f"{hint}/reset_shift")], f"{hint}/multiplier_reset")
        a = b.op("Mul", [a, b.op("Sub", [one, reset], f"{hint}/kept")], f"{hint}/a_reset")
    n = b.op("Mul", [b.op("Mul", [as_f32(b, o["x"]), as_f32(b, o["input_gate"])], f"{hint}/xi"), multiplier],
             f"{hint}/n")
    h = b.op("Reshape", [as_f32(b, o["past_state"]), b.i64([1, 1, width])], f"{hint}/h0")
    states = []
    for t in range(tokens):
        h = b.op("Add", [b.op("Mul", [_step(b, a, t, 1, f"{hint}/a_"), h], f"{hint}/kept{t}"),
                         _step(b, n, t, 1, f"{hint}/n_")], f"{hint}/h{t}")
        states.append(h)
    y = states[0] if tokens == 1 else b.op("Concat", states, f"{hint}/y", axis=1)
    finish(b, node.outputs[1], b.op("Reshape", [h, b.i64([1, width])], f"{hint}/state"), outs[1])
    finish(b, node.outputs[0], y, outs[0])


LOWERINGS = {"selective_scan": lower_selective_scan, "gated_delta_rule": lower_gated_delta_rule,
             "token_shift": lower_token_shift, "rwkv4_wkv": lower_rwkv4_wkv, "rg_lru": lower_rg_lru}

__all__ = ["EMPTY_MAX", "LOWERINGS", "lower_gated_delta_rule", "lower_rg_lru", "lower_rwkv4_wkv",
           "lower_selective_scan", "lower_token_shift"]
