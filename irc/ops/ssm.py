"""State-space ops: the causal convolution with state, Mamba-1's selective scan, Mamba-2's
SSD recurrence, and the gated RMS norm that follows it.

Layouts: activations [B, T, features]; the recurrent state is graph-visible, as the KV cache
is: an op given a past state returns the present one (``present = f(past, new tokens)``).

- ``causal_conv1d``: x [B, T, C], depthwise weight [C, 1, K] (PyTorch's and ONNX's Conv
  layout), bias [C]; conv state [B, C, K-1], the last K-1 inputs (oldest first), as ONNX
  Runtime's ``CausalConvWithState`` and llama.cpp keep it.
- ``selective_scan`` (Mamba-1): per channel and state index a decay exp(Δ·A), A = -exp(A_log)
  [D, N]; state [B, D, N] (transformers' ``ssm_states``).
- ``ssd`` (Mamba-2): one scalar A per head, B and C shared by the heads of a group;
  state [B, H, N, P] with N = state_size and P = head_dim: one linear-attention state per
  head, key-major ([d_k, d_v], k = B, v = Δ·x, q = C), the layout of ONNX Runtime's
  ``LinearAttention`` (transformers keeps it transposed, [B, H, P, N]).

Sequential semantics, one update per token (the chunked form is a rewrite of it; the
``scan-chunk`` pass sets ``ssd``'s ``chunk`` attribute, and the reference then computes a
prefill with ``chunked_ssd``, the same numbers; Mamba-1's decay per (channel, state) has
no such matmul form):

    Δ_t = softplus(dt_t [+ dt_bias]) (Mamba-2: clamped to [dt_min, dt_max])
    h_t = exp(Δ_t · A) ⊙ h_{t-1} + Δ_t · B_t ⊗ x_t ;   y_t = C_t · h_t + D ⊙ x_t

Padding: ``attention_mask`` [B, P+T] (the one attention reads; its last T columns mark the
new tokens) is optional. A padded token's input is zeroed and its step frozen (Δ = 0: decay
1, no update), and its output is 0, so a padded position changes neither state: a
left-padded prefill from a zero state ends in the state of the unpadded prompt.

The math lives in module-level functions (``causal_conv1d``, ``selective_scan``, ``ssd``,
``chunked_ssd``, ``gated_rms_norm``) that the backends' tests and later passes reuse; the
registrations at the bottom wire them to the registry.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from irc import dims
from irc.dtypes import DType
from irc.ops.nn import f32
from irc.ops.primitives import silu
from irc.ops.registry import REQUIRED, Cost, OpDef, TensorType, by_name, expect, expect_shape, register, same_dims

ACTIVATIONS = (None, "silu")


# ---- shared math -----------------------------------------------------------------------

def new_token_mask(attention_mask, batch: int, seq: int) -> np.ndarray:
    """Bool [B, T]: which new tokens are real (the last T columns of the mask)."""
    if attention_mask is None:
        return np.ones((batch, seq), dtype=bool)
    return np.asarray(attention_mask)[:, -seq:] != 0 if seq else np.zeros((batch, 0), dtype=bool)


def softplus(x) -> np.ndarray:
    """log(1 + exp(x)), stable for large |x|."""
    return np.logaddexp(np.float32(0.0), x).astype(np.float32)


def causal_conv1d(x, weight, bias=None, past_state=None, attention_mask=None, *,
                  activation: Optional[str] = None) -> tuple[np.ndarray, np.ndarray]:
    """(y [B, T, C], present_state [B, C, K-1]): a depthwise causal convolution over the
    past state followed by the new tokens, float32."""
    x32 = f32(x)
    batch, seq, channels = x32.shape
    kernel = weight.shape[-1]
    real = new_token_mask(attention_mask, batch, seq)
    x32 = np.where(real[..., None], x32, np.float32(0.0))
    past = np.zeros((batch, channels, kernel - 1), np.float32) if past_state is None else f32(past_state)
    window = np.concatenate([past, x32.transpose(0, 2, 1)], axis=2)  # [B, C, K-1+T]
    w = f32(weight).reshape(channels, kernel)
    y = np.zeros((batch, channels, seq), np.float32)
    for k in range(kernel):
        y += w[None, :, k, None] * window[:, :, k:k + seq]
    if bias is not None:
        y += f32(bias)[None, :, None]
    if activation == "silu":
        y = silu(y)
    y = np.where(real[:, None, :], y, np.float32(0.0)).transpose(0, 2, 1)
    return np.ascontiguousarray(y, dtype=np.float32), np.ascontiguousarray(window[:, :, seq:])


def selective_scan(x, dt, A_log, B, C, D=None, z=None, past_state=None, attention_mask=None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Mamba-1: (y [B, T, D], present_state [B, D, N]), float32. ``dt`` [B, T, D] is the
    time step before softplus (dt_proj's output, bias included); y is gated by silu(z)."""
    x32, delta = f32(x), softplus(f32(dt))
    batch, seq, channels = x32.shape
    real = new_token_mask(attention_mask, batch, seq)[..., None]
    x32 = np.where(real, x32, np.float32(0.0))
    delta = np.where(real, delta, np.float32(0.0))
    A = -np.exp(f32(A_log))                        # [D, N]
    Bm, Cm = f32(B), f32(C)                        # [B, T, N]
    h = np.zeros((batch, channels, A.shape[1]), np.float32) if past_state is None else f32(past_state)
    ys = np.zeros((batch, seq, channels), np.float32)
    for t in range(seq):
        step = delta[:, t, :, None]                # [B, D, 1]
        h = np.exp(step * A) * h + (step * x32[:, t, :, None]) * Bm[:, t, None, :]
        ys[:, t] = np.einsum("bdn,bn->bd", h, Cm[:, t])
    if D is not None:
        ys += x32 * f32(D)
    if z is not None:
        ys *= silu(f32(z))
    return np.where(real, ys, np.float32(0.0)), h.astype(np.float32)


def _ssd_inputs(x, dt, A_log, B, C, dt_bias, attention_mask, heads: int, head_dim: int, groups: int,
                state_size: int, dt_min: float, dt_max: Optional[float]) -> tuple:
    """(x masked [B, T, H, P], Δ [B, T, H] (clamped, 0 at padded tokens), B and C repeated
    to the heads [B, T, H, N], A [H], real tokens [B, T]), float32."""
    x32 = f32(x)
    batch, seq = x32.shape[:2]
    xs = x32.reshape(batch, seq, heads, head_dim)
    raw = f32(dt) + (0.0 if dt_bias is None else f32(dt_bias))
    delta = np.clip(softplus(raw), dt_min, np.inf if dt_max is None else dt_max).astype(np.float32)
    real = new_token_mask(attention_mask, batch, seq)
    delta = np.where(real[..., None], delta, np.float32(0.0))
    xs = np.where(real[..., None, None], xs, np.float32(0.0))
    per_group = heads // groups
    Bm = np.repeat(f32(B).reshape(batch, seq, groups, state_size), per_group, axis=2)
    Cm = np.repeat(f32(C).reshape(batch, seq, groups, state_size), per_group, axis=2)
    return xs, delta, Bm, Cm, -np.exp(f32(A_log)), real


def _ssd_output(ys, xs, D, real) -> np.ndarray:
    """y [B, T, H, P] plus the D skip, 0 at padded tokens, as [B, T, H·P] float32."""
    batch, seq, heads, head_dim = xs.shape
    if D is not None:
        ys = ys + xs * f32(D)[:, None]
    ys = np.where(real[..., None, None], ys, 0.0)                              # a padded token's output is 0
    return ys.reshape(batch, seq, heads * head_dim).astype(np.float32)


def ssd(x, dt, A_log, B, C, D=None, dt_bias=None, past_state=None, attention_mask=None, *, heads: int,
        head_dim: int, groups: int, state_size: int, dt_min: float = 0.0, dt_max: Optional[float] = None
        ) -> tuple[np.ndarray, np.ndarray]:
    """Mamba-2: (y [B, T, H*P], present_state [B, H, N, P]), float32. ``dt`` [B, T, H] is
    the raw time step; head h reads group h // (H / G) of B and C [B, T, G*N]."""
    xs, delta, Bm, Cm, A, real = _ssd_inputs(x, dt, A_log, B, C, dt_bias, attention_mask, heads, head_dim, groups,
                                             state_size, dt_min, dt_max)
    batch, seq = xs.shape[:2]
    h = (np.zeros((batch, heads, state_size, head_dim), np.float32) if past_state is None
         else f32(past_state))
    ys = np.zeros((batch, seq, heads, head_dim), np.float32)
    for t in range(seq):
        decay = np.exp(delta[:, t] * A)[..., None, None]                       # [B, H, 1, 1]
        update = Bm[:, t, :, :, None] * (delta[:, t, :, None] * xs[:, t])[:, :, None, :]
        h = decay * h + update
        ys[:, t] = np.einsum("bhnp,bhn->bhp", h, Cm[:, t])
    return _ssd_output(ys, xs, D, real), h.astype(np.float32)


def chunked_ssd(x, dt, A_log, B, C, D=None, dt_bias=None, past_state=None, attention_mask=None, *, heads: int,
                head_dim: int, groups: int, state_size: int, dt_min: float = 0.0, dt_max: Optional[float] = None,
                chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """``ssd``'s result in chunks of ``chunk`` tokens (float64 inside): Mamba-2's structured
    masked attention, the paper's ``ssd_minimal`` with the state carried chunk to chunk.
    With a = Δ·A and its cumulative sum c over the chunk, the decay from token j to token
    i is L_ij = exp(c_i - c_j) for j <= i (0 above the diagonal, exp(segsum(a))); then

        Y = (C Bᵀ ⊙ L) (Δ·x)  +  exp(c) ⊙ C·h          (within the chunk; h the state entering it)
        h ← exp(c_last)·h + Σ_j exp(c_last - c_j) B_j ⊗ (Δ_j x_j)     (the state passed on)

    A short last chunk is a chunk of fewer tokens; a padded token (Δ = 0) has decay 1 and
    writes nothing, as in the recurrence."""
    xs, delta, Bm, Cm, A, real = _ssd_inputs(x, dt, A_log, B, C, dt_bias, attention_mask, heads, head_dim, groups,
                                             state_size, dt_min, dt_max)
    batch, seq = xs.shape[:2]
    h = np.zeros((batch, heads, state_size, head_dim)) if past_state is None else np.asarray(past_state, np.float64)
    log_decay = (np.asarray(delta, np.float64) * A).transpose(0, 2, 1)                    # [B, H, T]
    writes = np.asarray(delta, np.float64)[..., None] * xs                                # Δ·x [B, T, H, P]
    Bm, Cm = np.asarray(Bm, np.float64), np.asarray(Cm, np.float64)
    ys = np.zeros((batch, seq, heads, head_dim))
    for start in range(0, seq, chunk):
        end = min(start + chunk, seq)
        cum = np.cumsum(log_decay[:, :, start:end], axis=-1)                              # [B, H, n]
        causal = np.tril(np.ones((end - start, end - start), bool))
        L = np.where(causal, np.exp(np.minimum(cum[..., :, None] - cum[..., None, :], 0.0)), 0.0)
        scores = np.einsum("bihn,bjhn->bhij", Cm[:, start:end], Bm[:, start:end]) * L
        within = np.einsum("bhij,bjhp->bihp", scores, writes[:, start:end])
        carried = np.einsum("bihn,bhnp->bihp", Cm[:, start:end], h) * np.exp(cum).transpose(0, 2, 1)[..., None]
        ys[:, start:end] = within + carried
        to_end = np.exp(cum[..., -1:] - cum)                                              # [B, H, n]
        h = (h * np.exp(cum[..., -1])[..., None, None]
             + np.einsum("bjhn,bhj,bjhp->bhnp", Bm[:, start:end], to_end, writes[:, start:end]))
    return _ssd_output(ys, xs, D, real), h.astype(np.float32)


def gated_rms_norm(x, z, weight, *, eps: float, group_size: Optional[int] = None,
                   norm_before_gate: bool = False) -> np.ndarray:
    """RMS norm of x * silu(z) (or of x, then times silu(z), with ``norm_before_gate``) over
    groups of ``group_size`` features (all of them when None), times ``weight``; float32."""
    x32, gate = f32(x), silu(f32(z))
    if not norm_before_gate:
        x32 = x32 * gate
    features = x32.shape[-1]
    size = features if group_size is None else group_size
    grouped = x32.reshape(x32.shape[:-1] + (features // size, size))
    normed = grouped / np.sqrt(np.mean(grouped * grouped, axis=-1, keepdims=True) + np.float32(eps))
    out = normed.reshape(x32.shape) * f32(weight)
    return (out * gate if norm_before_gate else out).astype(np.float32)


# ---- checks shared by the ops ------------------------------------------------------------

def _activation(op: str, name: str, value, batch=None, seq=None, width=None) -> tuple:
    """``value`` is float [B, T, width] (dims compared where given); returns (B, T)."""
    expect(value is not None, f"{op}: operand {name!r} is required")
    expect(value.dtype.is_float and len(value.shape) == 3,
           f"{op}: {name} must be float [B,T,features], got {value.dtype}{dims.format_shape(value.shape)}")
    want = (batch if batch is not None else value.shape[0], seq if seq is not None else value.shape[1],
            width if width is not None else value.shape[2])
    expect_shape(op, name, value, want)
    return value.shape[0], value.shape[1]


def _mask(op: str, mask, batch) -> None:
    if mask is None:
        return
    expect(mask.dtype in (DType.i64, DType.i32, DType.bool), f"{op}: attention_mask must be integer, got {mask.dtype}")
    expect(len(mask.shape) == 2 and same_dims(mask.shape[0], batch),
           f"{op}: attention_mask {dims.format_shape(mask.shape)} should be [B, P+T]")


def _state_out(op: str, past, want: tuple) -> list:
    """The present state's type when a past state is given (checked against ``want``)."""
    if past is None:
        return []
    expect_shape(op, "past_state", past, want)
    expect(past.dtype.is_float, f"{op}: past_state must be float, got {past.dtype}")
    return [TensorType(past.dtype, want)]


def _positive(op: str, attrs: dict, *names: str) -> None:
    for name in names:
        expect(isinstance(attrs[name], int) and attrs[name] > 0, f"{op}: {name} must be a positive int")


def check_chunk(op: str, attrs: dict) -> None:
    """``chunk`` (set by the ``scan-chunk`` pass) is None (the step form) or a positive int:
    the tokens a chunk when a prefill is computed in chunks; the op's result is the same."""
    chunk = attrs["chunk"]
    expect(chunk is None or (isinstance(chunk, int) and not isinstance(chunk, bool) and chunk > 0),
           f"{op}: chunk must be None or a positive int, got {chunk!r}")


def _io(inputs, outputs) -> Cost:
    return Cost(bytes_read=sum(t.nbytes for t in inputs if t is not None),
                bytes_written=sum(t.nbytes for t in outputs))


def _with_state(y, state, x, past) -> list:
    return [y.astype(x.dtype)] + ([] if past is None else [state.astype(past.dtype)])


# ---- causal_conv1d ---------------------------------------------------------------------

CONV_OPERANDS = ("x", "weight", "bias?", "past_state?", "attention_mask?")


def _conv_infer(inputs, attrs):
    ops = by_name(CONV_OPERANDS, inputs)
    x, weight, bias = ops["x"], ops["weight"], ops["bias"]
    expect(attrs["activation"] in ACTIVATIONS, f"causal_conv1d: activation must be silu or None, "
                                               f"got {attrs['activation']!r}")
    batch, seq = _activation("causal_conv1d", "x", x)
    channels = x.shape[2]
    expect(len(weight.shape) == 3 and same_dims(weight.shape[0], channels) and weight.shape[1] == 1
           and isinstance(weight.shape[2], int) and weight.shape[2] >= 1,
           f"causal_conv1d: weight {dims.format_shape(weight.shape)} should be [{channels}, 1, K] with K >= 1")
    if bias is not None:
        expect_shape("causal_conv1d", "bias", bias, (channels,))
    _mask("causal_conv1d", ops["attention_mask"], batch)
    state = _state_out("causal_conv1d", ops["past_state"], (batch, channels, weight.shape[2] - 1))
    return [TensorType(x.dtype, x.shape)] + state


def _conv_reference(inputs, attrs):
    """Depthwise causal 1-D convolution over the past state and the new tokens (optional
    bias, fused SiLU); returns the last K-1 inputs as the present state."""
    ops = by_name(CONV_OPERANDS, inputs)
    y, state = causal_conv1d(**ops, **attrs)
    return _with_state(y, state, ops["x"], ops["past_state"])


def _conv_cost(inputs, outputs, attrs):
    """2 FLOPs per weight per token (each of the C·K weights is used once per token)."""
    x, weight = inputs[0], inputs[1]
    rows = x.shape[0] * x.shape[1]
    return Cost(flops=2 * rows * weight.numel, other_flops=(4 if attrs["activation"] else 1) * x.numel) + \
        _io(inputs, outputs)


register(OpDef("causal_conv1d", CONV_OPERANDS, {"activation": None}, _conv_infer, _conv_reference, _conv_cost,
               level="model"))


# ---- selective_scan (Mamba-1) ------------------------------------------------------------

SCAN_OPERANDS = ("x", "dt", "A_log", "B", "C", "D?", "z?", "past_state?", "attention_mask?")


def _scan_infer(inputs, attrs):
    ops = by_name(SCAN_OPERANDS, inputs)
    op = "selective_scan"
    batch, seq = _activation(op, "x", ops["x"])
    channels = ops["x"].shape[2]
    _activation(op, "dt", ops["dt"], batch, seq, channels)
    A_log = ops["A_log"]
    expect(A_log is not None and len(A_log.shape) == 2 and same_dims(A_log.shape[0], channels),
           f"{op}: A_log should be [{channels}, N]")
    state = A_log.shape[1]
    _activation(op, "B", ops["B"], batch, seq, state)
    _activation(op, "C", ops["C"], batch, seq, state)
    if ops["D"] is not None:
        expect_shape(op, "D", ops["D"], (channels,))
    if ops["z"] is not None:
        _activation(op, "z", ops["z"], batch, seq, channels)
    _mask(op, ops["attention_mask"], batch)
    return [TensorType(ops["x"].dtype, ops["x"].shape)] + _state_out(op, ops["past_state"], (batch, channels, state))


def _scan_reference(inputs, attrs):
    """Mamba-1's selective scan: Δ = softplus(dt), per-channel A = -exp(A_log) [D, N],
    input-dependent B and C, the D skip, gated by silu(z)."""
    ops = by_name(SCAN_OPERANDS, inputs)
    y, state = selective_scan(**ops)
    return _with_state(y, state, ops["x"], ops["past_state"])


def scan_cost(rows: int, channels: int, state: int) -> Cost:
    """A recurrence over ``channels`` x ``state`` numbers per token: 2 FLOPs per number for
    the update (Δ·B·x accumulated) and 2 for the read-out (C·h), as attention counts 2 per
    cached number for scores and 2 for the weighted sum; the decay apart."""
    return Cost(flops=4 * rows * channels * state, other_flops=3 * rows * channels * state)


def _scan_cost(inputs, outputs, attrs):
    x, A_log = inputs[0], inputs[2]
    return scan_cost(x.shape[0] * x.shape[1], x.shape[2], A_log.shape[1]) + _io(inputs, outputs)


register(OpDef("selective_scan", SCAN_OPERANDS, {}, _scan_infer, _scan_reference, _scan_cost, level="model"))


# ---- ssd (Mamba-2) -------------------------------------------------------------------------

SSD_OPERANDS = ("x", "dt", "A_log", "B", "C", "D?", "dt_bias?", "past_state?", "attention_mask?")
SSD_ATTRS = {"heads": REQUIRED, "head_dim": REQUIRED, "groups": 1, "state_size": REQUIRED, "dt_min": 0.0,
             "dt_max": None, "chunk": None}


def _ssd_infer(inputs, attrs):
    ops = by_name(SSD_OPERANDS, inputs)
    op = "ssd"
    _positive(op, attrs, "heads", "head_dim", "groups", "state_size")
    heads, head_dim, groups, state = attrs["heads"], attrs["head_dim"], attrs["groups"], attrs["state_size"]
    expect(heads % groups == 0, f"{op}: heads ({heads}) must be a multiple of groups ({groups})")
    expect(isinstance(attrs["dt_min"], (int, float)) and attrs["dt_min"] >= 0, f"{op}: dt_min must be >= 0")
    expect(attrs["dt_max"] is None or (isinstance(attrs["dt_max"], (int, float)) and attrs["dt_max"] >= attrs["dt_min"]),
           f"{op}: dt_max must be None or >= dt_min")
    check_chunk(op, attrs)
    batch, seq = _activation(op, "x", ops["x"], width=heads * head_dim)
    _activation(op, "dt", ops["dt"], batch, seq, heads)
    expect_shape(op, "A_log", ops["A_log"], (heads,))
    _activation(op, "B", ops["B"], batch, seq, groups * state)
    _activation(op, "C", ops["C"], batch, seq, groups * state)
    for name in ("D", "dt_bias"):
        if ops[name] is not None:
            expect_shape(op, name, ops[name], (heads,))
    _mask(op, ops["attention_mask"], batch)
    return [TensorType(ops["x"].dtype, ops["x"].shape)] + _state_out(op, ops["past_state"],
                                                                     (batch, heads, state, head_dim))


def _ssd_reference(inputs, attrs):
    """Mamba-2's SSD recurrence: Δ = clamp(softplus(dt + dt_bias)), a scalar A = -exp(A_log)
    per head, B and C shared by the heads of a group, the D skip. With ``chunk`` set and
    more than one token, computed in chunks (``chunked_ssd``); one token takes the step."""
    ops = by_name(SSD_OPERANDS, inputs)
    form = {k: v for k, v in attrs.items() if k != "chunk"}
    if attrs["chunk"] is None or ops["x"].shape[1] <= 1:
        y, state = ssd(**ops, **form)
    else:
        y, state = chunked_ssd(**ops, **form, chunk=attrs["chunk"])
    return _with_state(y, state, ops["x"], ops["past_state"])


def _ssd_cost(inputs, outputs, attrs):
    x = inputs[0]
    return scan_cost(x.shape[0] * x.shape[1], x.shape[2], attrs["state_size"]) + _io(inputs, outputs)


register(OpDef("ssd", SSD_OPERANDS, SSD_ATTRS, _ssd_infer, _ssd_reference, _ssd_cost, level="model"))


# ---- gated_rms_norm ----------------------------------------------------------------------

def _gated_norm_infer(inputs, attrs):
    x, z, weight = inputs
    op = "gated_rms_norm"
    batch, seq = _activation(op, "x", x)
    _activation(op, "z", z, batch, seq, x.shape[2])
    expect_shape(op, "weight", weight, (x.shape[2],))
    size = attrs["group_size"]
    if size is not None:
        expect(isinstance(size, int) and size > 0 and isinstance(x.shape[2], int) and x.shape[2] % size == 0,
               f"{op}: group_size {size!r} must divide the {x.shape[2]} features")
    return [TensorType(x.dtype, x.shape)]


def _gated_norm_reference(inputs, attrs):
    """RMS norm of x * silu(z) per group of features, times weight (Mamba-2's
    MambaRMSNormGated); ``norm_before_gate``: norm(x) * weight * silu(z)."""
    x, z, weight = inputs
    return [gated_rms_norm(x, z, weight, **attrs).astype(x.dtype)]


def _gated_norm_cost(inputs, outputs, attrs):
    return Cost(other_flops=8 * inputs[0].numel) + _io(inputs, outputs)


register(OpDef("gated_rms_norm", ("x", "z", "weight"), {"eps": 1e-6, "group_size": None, "norm_before_gate": False},
               _gated_norm_infer, _gated_norm_reference, _gated_norm_cost, level="model"))

__all__ = ["causal_conv1d", "selective_scan", "ssd", "chunked_ssd", "gated_rms_norm", "new_token_mask", "softplus",
           "scan_cost", "check_chunk"]
