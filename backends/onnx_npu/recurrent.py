"""Recurrent layers on onnx-npu: the short convolution, Mamba-2's SSD and the gated delta
rule as static graphs of ops the HTP places (no Scan, Loop or If).

Each call runs T tokens (the chunk graph's ``--chunk``, or 1 for decode) from a fixed-size
state in to a fixed-size state out (``past_key_values.{i}.*`` -> ``present.{i}.*``): the T
tokens are *one chunk* of the chunked form, so the recurrence becomes matmuls against
constant masks, and T = 1 is the same graph (the decode step). Every token of a call is
real: the host (``backends.onnx_npu.host``) feeds the chunk graph whole chunks only and the
remainder of a prompt one token at a time, so the ops read no padding mask.

Inside a layer the math is float32 (the operands are cast at its edges, as
``backends.onnx.ssm`` does; the HTP runs it at fp16). Per head, with a_t the log decay of
token t, three constant 0/1 matrices turn it into sums: ``segments`` [T·T, T] gives
Σ_{j<k≤i} a_k for every pair (i, j) (the decay from token j to token i, summed directly
rather than as a difference of running sums, which loses the small segments of a long
chunk in fp16), ``inclusive`` [T, T] the decay from the chunk's start to token i, and
``after`` [T, T] from token i to the chunk's end.

- ``causal_conv1d``: Concat(past state, x) along time, a depthwise ``Conv`` (group = C),
  SiLU; the present state is the window's last K-1 columns.
- ``ssd`` (state [1, H, N, P]): Δ = clamp(softplus(dt + dt_bias)), a = Δ·A;
  y = (L ⊙ C Bᵀ)(Δx) + exp(cum) ⊙ (C h₀) + D x with L[i, j] = exp(Σ_{j<k≤i} a_k) for j ≤ i;
  h = exp(Σa) h₀ + (B ⊙ exp(after))ᵀ (Δx). B and C of a group are gathered to its heads.
- ``gated_delta_rule`` (state [1, H_v, d_k, d_v], a per-head decay): the chunk's writes
  solve the unit lower-triangular system (I + A) u = β v - β exp(cum) k S₀ with
  A = strict_lower(β k kᵀ ⊙ Γ); (I + A)⁻¹ = Σ_{n<T} (-A)ⁿ, applied by doubling (u += Nᵐ u for
  m = 1, 2, 4, ... with N = -A: log₂T squarings and products, exact because A is nilpotent);
  o = exp(cum) q S₀ + (Γ ⊙ q kᵀ) u; S = exp(Σg) S₀ + (k ⊙ exp(after))ᵀ u.
- ``gated_rms_norm``: the ONNX backend's primitive form (static reshapes here).

Every tensor is rank 4 or less. Mamba-1's ``selective_scan`` (a decay per channel and state
index) and the delta rule's per-channel decay (``decay="channel"``) are lowered a token at a
time in ``backends.onnx_npu.recurrent_steps``, which hands a per-head decay to this module.
"""
from __future__ import annotations

import functools

import numpy as np

from irc.dtypes import DType
from irc.errors import BackendError
from irc.graph import Node, Param
from irc.ops.delta import L2_EPS, OPERANDS as DELTA_OPERANDS
from irc.ops.registry import by_name
from irc.ops.ssm import CONV_OPERANDS, SSD_OPERANDS

from backends.onnx.builder import ONNX_TYPES
from backends.onnx.portable import silu
from backends.onnx.ssm import as_f32, lower_gated_rms_norm
from backends.onnx_npu.lower import NpuBuilder


# ---- the constant masks ----------------------------------------------------------------------

def segments(tokens: int) -> np.ndarray:
    """[T·T, T]: row i·T + j has ones at k with j < k <= i (empty for j >= i)."""
    i, j, k = np.meshgrid(np.arange(tokens), np.arange(tokens), np.arange(tokens), indexing="ij")
    return ((j < k) & (k <= i)).reshape(tokens * tokens, tokens).astype(np.float32)


def inclusive(tokens: int) -> np.ndarray:
    """[T, T]: ones at k <= i (the decay from the chunk's start through token i)."""
    return np.tril(np.ones((tokens, tokens), np.float32))


def after(tokens: int) -> np.ndarray:
    """[T, T]: ones at k > i (the decay after token i to the chunk's end)."""
    return np.triu(np.ones((tokens, tokens), np.float32), 1)


def causal(tokens: int, strict: bool = False) -> np.ndarray:
    return np.tril(np.ones((tokens, tokens), np.float32), -1 if strict else 0)


def _mask(b: NpuBuilder, make, tokens: int, hint: str) -> str:
    return b.const(make(tokens), np.float32, f"recurrent/{hint}{tokens}")


def log_decay(b: NpuBuilder, a: str, tokens: int, heads: int, hint: str) -> dict:
    """From the log decay a [1, H, T, 1]: ``pairs`` [1, H, T, T] (exp(Σ_{j<k≤i} a_k) for
    j <= i, else 0), ``start`` [1, H, T, 1] (exp of the decay through token i), ``rest``
    [1, H, T, 1] (exp of the decay after token i) and ``whole`` [1, H, 1, 1]."""
    seg = b.op("MatMul", [_mask(b, segments, tokens, "segments"), a], f"{hint}/segment_sums")
    seg = b.op("Reshape", [seg, b.i64([1, heads, tokens, tokens])], f"{hint}/pair_sums")
    pairs = b.op("Mul", [b.op("Exp", [seg], f"{hint}/pair_decay"), _mask(b, causal, tokens, "causal")],
                 f"{hint}/pairs")
    start = b.op("Exp", [b.op("MatMul", [_mask(b, inclusive, tokens, "inclusive"), a], f"{hint}/cum")],
                 f"{hint}/start")
    rest = b.op("Exp", [b.op("MatMul", [_mask(b, after, tokens, "after"), a], f"{hint}/tail")], f"{hint}/rest")
    whole = b.op("Exp", [b.op("ReduceSum", [a, b.i64([2])], f"{hint}/total", keepdims=1)], f"{hint}/whole")
    return {"pairs": pairs, "start": start, "rest": rest, "whole": whole}


# ---- shared pieces ----------------------------------------------------------------------------

def heads_first(b: NpuBuilder, x: str, tokens: int, heads: int, width: int, hint: str) -> str:
    """[1, T, heads·width] -> [1, heads, T, width]."""
    x4 = b.op("Reshape", [x, b.i64([1, tokens, heads, width])], f"{hint}/split")
    return b.op("Transpose", [x4], f"{hint}/heads", perm=[0, 2, 1, 3])


def to_heads(b: NpuBuilder, x4: str, groups: int, heads: int, hint: str) -> str:
    """[1, G, T, d] -> [1, H, T, d]: head h reads group h // (H / G)."""
    if groups == heads:
        return x4
    index = b.const(np.arange(heads, dtype=np.int32) // (heads // groups), np.int32, f"recurrent/heads{groups}to{heads}")
    return b.op("Gather", [x4, index], f"{hint}/per_head", axis=1)


def per_token(b: NpuBuilder, x: str, hint: str) -> str:
    """[1, T, H] -> [1, H, T, 1]."""
    moved = b.op("Transpose", [x], f"{hint}/heads", perm=[0, 2, 1])
    return b.op("Unsqueeze", [moved, b.i64([3])], f"{hint}/column")


def tokens_last(b: NpuBuilder, y4: str, tokens: int, width: int, hint: str) -> str:
    """[1, H, T, d] -> [1, T, H·d]."""
    moved = b.op("Transpose", [y4], f"{hint}/tokens", perm=[0, 2, 1, 3])
    return b.op("Reshape", [moved, b.i64([1, tokens, width])], f"{hint}/merged")


def finish(b: NpuBuilder, value, f32: str, out: str) -> None:
    """Write the f32 result ``f32`` as irc value ``value`` (cast when it is not f32)."""
    if value.dtype == DType.f32:
        b.node("Identity", [f32], [out])
    else:
        b.node("Cast", [f32], [out], to=ONNX_TYPES[value.dtype])


def negative_rate(A_log) -> np.ndarray:
    """-exp(A_log) [1, H, 1, 1], float32 (the log decay per unit of Δ)."""
    return (-np.exp(np.asarray(A_log, np.float32))).reshape(1, -1, 1, 1)


def rate(b: NpuBuilder, A_log) -> str:
    """-exp(A_log) [1, H, 1, 1]: computed once into the weights from a param, in the graph
    from a computed value (a folded constant, MiniMax's slopes)."""
    if isinstance(A_log, Param):
        return b.derived(f"{A_log.name}.rate", DType.f32, (1, A_log.shape[0], 1, 1), (A_log,), negative_rate)
    return b.op("Neg", [b.op("Exp", [heads_column(b, A_log)], f"{A_log.name}/exp")], f"{A_log.name}/rate")


def heads_column(b: NpuBuilder, value) -> str:
    """A per-head vector [H] as [1, H, 1, 1] float32."""
    if isinstance(value, Param):
        return b.derived(f"{value.name}.heads", DType.f32, (1, value.shape[0], 1, 1), (value,), _heads_column)
    return b.op("Reshape", [as_f32(b, value), b.i64([1, value.shape[0], 1, 1])], f"{value.name}/heads")


def _need_state(node: Node, state) -> None:
    if state is None:
        raise BackendError(f"onnx-npu runs {node.op} with its state (past_state in, present out)",
                           location=f"node %{node.name}", hint="compile a decoder spec: it carries the states")


# ---- causal_conv1d ----------------------------------------------------------------------------

def lower_causal_conv1d(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    """Concat(past state, x) along time -> depthwise Conv (+ bias) -> SiLU; the present
    state is the window's last K-1 columns."""
    o = by_name(CONV_OPERANDS, node.inputs)
    _need_state(node, o["past_state"])
    x, tokens = o["x"], b.size(o["x"].shape[1])
    channels, kernel = o["weight"].shape[0], o["weight"].shape[2]
    hint = outs[0]
    x_bct = b.op("Transpose", [as_f32(b, x)], f"{hint}/channels_first", perm=[0, 2, 1])
    window = b.op("Concat", [as_f32(b, o["past_state"]), x_bct], f"{hint}/window", axis=2)
    state = b.op("Slice", [window, b.i64([tokens]), b.i64([tokens + kernel - 1]), b.i64([2])], f"{hint}/present")
    finish(b, node.outputs[1], state, outs[1])
    inputs = [window, as_f32(b, o["weight"])] + ([as_f32(b, o["bias"])] if o["bias"] is not None else [])
    y = b.op("Conv", inputs, f"{hint}/conv", group=channels, kernel_shape=[kernel])
    if node.attrs["activation"] == "silu":
        y = silu(b, y, b.fresh(f"{hint}/silu"))
    finish(b, node.outputs[0], b.op("Transpose", [y], f"{hint}/tokens_first", perm=[0, 2, 1]), outs[0])


# ---- ssd ------------------------------------------------------------------------------------

def lower_ssd(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    """One chunk of Mamba-2's SSD (module docstring)."""
    o, a = by_name(SSD_OPERANDS, node.inputs), node.attrs
    _need_state(node, o["past_state"])
    heads, width, groups, size = a["heads"], a["head_dim"], a["groups"], a["state_size"]
    tokens, hint = b.size(o["x"].shape[1]), outs[0]
    raw = as_f32(b, o["dt"])
    if o["dt_bias"] is not None:
        raw = b.op("Add", [raw, as_f32(b, o["dt_bias"])], f"{hint}/dt_raw")
    delta = b.op("Softplus", [raw], f"{hint}/delta")
    if a["dt_min"] > 0:
        delta = b.op("Max", [delta, b.const(float(a["dt_min"]), np.float32, f"{hint}/dt_min")], f"{hint}/delta_min")
    if a["dt_max"] is not None:
        delta = b.op("Min", [delta, b.const(float(a["dt_max"]), np.float32, f"{hint}/dt_max")], f"{hint}/delta_max")
    delta = per_token(b, delta, f"{hint}/delta")                                             # [1, H, T, 1]
    decay = log_decay(b, b.op("Mul", [delta, rate(b, o["A_log"])], f"{hint}/log_decay"), tokens, heads, hint)
    x = heads_first(b, as_f32(b, o["x"]), tokens, heads, width, f"{hint}/x")                  # [1, H, T, P]
    dx = b.op("Mul", [x, delta], f"{hint}/dx")
    B = to_heads(b, heads_first(b, as_f32(b, o["B"]), tokens, groups, size, f"{hint}/B"), groups, heads, f"{hint}/B")
    C = to_heads(b, heads_first(b, as_f32(b, o["C"]), tokens, groups, size, f"{hint}/C"), groups, heads, f"{hint}/C")
    h0 = as_f32(b, o["past_state"])                                                            # [1, H, N, P]
    B_t = b.op("Transpose", [B], f"{hint}/B_t", perm=[0, 1, 3, 2])
    scores = b.op("Mul", [b.op("MatMul", [C, B_t], f"{hint}/CB"), decay["pairs"]], f"{hint}/scores")
    y = b.op("MatMul", [scores, dx], f"{hint}/y_chunk")
    carried = b.op("Mul", [b.op("MatMul", [C, h0], f"{hint}/Ch"), decay["start"]], f"{hint}/y_state")
    y = b.op("Add", [y, carried], f"{hint}/y_sum")
    if o["D"] is not None:
        y = b.op("Add", [y, b.op("Mul", [x, heads_column(b, o["D"])], f"{hint}/skip")], f"{hint}/y_skip")
    written = b.op("Transpose", [b.op("Mul", [B, decay["rest"]], f"{hint}/B_rest")], f"{hint}/B_rest_t",
                   perm=[0, 1, 3, 2])
    state = b.op("Add", [b.op("Mul", [h0, decay["whole"]], f"{hint}/h_decayed"),
                         b.op("MatMul", [written, dx], f"{hint}/h_written")], f"{hint}/state")
    finish(b, node.outputs[1], state, outs[1])
    finish(b, node.outputs[0], tokens_last(b, y, tokens, heads * width, f"{hint}/y"), outs[0])


def _heads_column(D) -> np.ndarray:
    return np.asarray(D, np.float32).reshape(1, -1, 1, 1)


# ---- gated_delta_rule ---------------------------------------------------------------------------

def l2_normalized(b: NpuBuilder, x4: str, hint: str) -> str:
    """x / sqrt(Σx² + 1e-6) over the last axis."""
    total = b.op("ReduceSum", [b.op("Mul", [x4, x4], f"{hint}/square"), b.i64([-1])], f"{hint}/sum_square",
                 keepdims=1)
    norm = b.op("Sqrt", [b.op("Add", [total, b.const(L2_EPS, np.float32, "recurrent/l2_eps")], f"{hint}/shifted")],
                f"{hint}/norm")
    return b.op("Div", [x4, norm], f"{hint}/normed")


def delta_qkv(b: NpuBuilder, o: dict, a: dict, tokens: int, hint: str) -> tuple[str, str, str]:
    """The delta rule's operands heads first, float32: q̂ (L2-normed where ``l2_norm``, scaled)
    and k̂ [1, H_v, T, d_k] (key heads repeated to the value heads), v [1, H_v, T, d_v]."""
    key_heads, heads, key_dim, value_dim = a["key_heads"], a["value_heads"], a["key_dim"], a["value_dim"]
    q = heads_first(b, as_f32(b, o["q"]), tokens, key_heads, key_dim, f"{hint}/q")
    k = heads_first(b, as_f32(b, o["k"]), tokens, key_heads, key_dim, f"{hint}/k")
    if a["l2_norm"]:
        q, k = l2_normalized(b, q, f"{hint}/q"), l2_normalized(b, k, f"{hint}/k")
    scale = key_dim ** -0.5 if a["scale"] is None else a["scale"]
    q = b.op("Mul", [q, b.const(float(scale), np.float32, f"{hint}/scale")], f"{hint}/q_scaled")
    q, k = to_heads(b, q, key_heads, heads, f"{hint}/q"), to_heads(b, k, key_heads, heads, f"{hint}/k")
    v = heads_first(b, as_f32(b, o["v"]), tokens, heads, value_dim, f"{hint}/v")               # [1, H, T, d_v]
    return q, k, v


def lower_gated_delta_rule(b: NpuBuilder, node: Node, outs: list[str]) -> None:
    """One chunk of the gated delta rule (module docstring)."""
    o, a = by_name(DELTA_OPERANDS, node.inputs), node.attrs
    _need_state(node, o["past_state"])
    if a["decay"] != "head":
        raise BackendError("onnx-npu lowers the gated delta rule with a per-head decay only (decay=head); a "
                           "per-key-channel decay (Kimi) has no lowering here", location=f"node %{node.name}",
                           hint="compile this model with --target onnx or --target onnx-ort")
    heads, value_dim = a["value_heads"], a["value_dim"]
    tokens, hint = b.size(o["q"].shape[1]), outs[0]
    q, k, v = delta_qkv(b, o, a, tokens, hint)
    g = _delta_log_decay(b, o, tokens, heads, hint)
    decay = log_decay(b, g, tokens, heads, hint)
    S0 = as_f32(b, o["past_state"])                                                            # [1, H, d_k, d_v]
    k_t = b.op("Transpose", [k], f"{hint}/k_t", perm=[0, 1, 3, 2])
    if a["update_rule"] == "gated_delta":
        beta = per_token(b, b.op("Sigmoid", [as_f32(b, o["b"])], f"{hint}/beta_rows"), f"{hint}/beta")
        u = _corrections(b, q, k, k_t, v, beta, S0, decay, tokens, hint)
    else:
        u = v
    scores = b.op("Mul", [b.op("MatMul", [q, k_t], f"{hint}/qk"), decay["pairs"]], f"{hint}/scores")
    carried = b.op("MatMul", [b.op("Mul", [q, decay["start"]], f"{hint}/q_decayed"), S0], f"{hint}/o_state")
    out = b.op("Add", [carried, b.op("MatMul", [scores, u], f"{hint}/o_chunk")], f"{hint}/o")
    written = b.op("Transpose", [b.op("Mul", [k, decay["rest"]], f"{hint}/k_rest")], f"{hint}/k_rest_t",
                   perm=[0, 1, 3, 2])
    state = b.op("Add", [b.op("Mul", [S0, decay["whole"]], f"{hint}/S_decayed"),
                         b.op("MatMul", [written, u], f"{hint}/S_written")], f"{hint}/state")
    finish(b, node.outputs[1], state, outs[1])
    finish(b, node.outputs[0], tokens_last(b, out, tokens, heads * value_dim, f"{hint}/o"), outs[0])


def _delta_log_decay(b: NpuBuilder, o: dict, tokens: int, heads: int, hint: str) -> str:
    """g [1, H_v, T, 1]: -exp(A_log)·softplus(a + dt_bias), or -exp(A_log) without ``a``."""
    A = rate(b, o["A_log"])
    if o["a"] is None:
        return b.op("Expand", [A, b.i64([1, heads, tokens, 1])], f"{hint}/g")
    raw = as_f32(b, o["a"])
    if o["dt_bias"] is not None:
        raw = b.op("Add", [raw, as_f32(b, o["dt_bias"])], f"{hint}/a_raw")
    return b.op("Mul", [per_token(b, b.op("Softplus", [raw], f"{hint}/a_soft"), f"{hint}/a"), A], f"{hint}/g")


def _corrections(b: NpuBuilder, q, k, k_t, v, beta, S0, decay: dict, tokens: int, hint: str) -> str:
    """u [1, H, T, d_v]: the chunk's writes, (I + A)⁻¹ (β v - β exp(cum) k S₀)."""
    recalled = b.op("MatMul", [b.op("Mul", [k, b.op("Mul", [beta, decay["start"]], f"{hint}/beta_start")],
                                    f"{hint}/k_start"), S0], f"{hint}/recalled")
    u = b.op("Sub", [b.op("Mul", [v, beta], f"{hint}/beta_v"), recalled], f"{hint}/rhs")
    if tokens == 1:
        return u                                                  # A is strictly lower: empty
    kk = b.op("Mul", [b.op("MatMul", [k, k_t], f"{hint}/kk"), decay["pairs"]], f"{hint}/kk_decayed")
    strict = b.op("Mul", [kk, _mask(b, functools.partial(causal, strict=True), tokens, "strict")], f"{hint}/kk_strict")
    power = b.op("Neg", [b.op("Mul", [strict, beta], f"{hint}/A")], f"{hint}/N")         # N = -A
    u = b.op("Add", [u, b.op("MatMul", [power, u], f"{hint}/Nu")], f"{hint}/u2")
    span = 2
    while span < tokens:
        power = b.op("MatMul", [power, power], f"{hint}/N{span}")
        u = b.op("Add", [u, b.op("MatMul", [power, u], f"{hint}/N{span}u")], f"{hint}/u{2 * span}")
        span *= 2
    return u


LOWERINGS = {"causal_conv1d": lower_causal_conv1d, "ssd": lower_ssd, "gated_delta_rule": lower_gated_delta_rule,
             "gated_rms_norm": lower_gated_rms_norm}
