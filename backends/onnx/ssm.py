"""State-space ops in ONNX: ``causal_conv1d``, ``selective_scan`` (Mamba-1), ``ssd`` (Mamba-2)
and ``gated_rms_norm``, for both targets.

Semantics are ``irc.ops.ssm``'s: float32 inside (another float type is cast at the op's
edges), and padding as there: the last T columns of ``attention_mask`` [B, P+T] mark the new
tokens (``real_tokens``: P+T and T read from the inputs' shapes at run time); a padded
token's input and time step are zeroed, so it leaves both states as they were, and its
output is 0. The states are the graph's ``past_key_values.{i}.conv_state`` [B, C, K-1] and
``.recurrent_state`` in the op's own layout, returned as ``present.{i}.*``.

- ``causal_conv1d``: portable: Concat(past state, masked x) along time, a depthwise ``Conv``
  (group = C, the weight [C, 1, K] as stored, its bias), SiLU; the present state is the
  window's last K-1 columns. onnx-ort: ``com.microsoft.CausalConvWithState`` with
  ``channels_last=1``, which reads x [B, T, C] as it is (only the K-1-column state is
  transposed, not the activations).
- ``selective_scan``: a standard ``Scan`` over time in both targets, one update of the
  [B, D, N] state per token (decay exp(Δ·A) computed in the step, never a [B, T, D, N]
  tensor). ``com.microsoft.LinearAttention`` can express it exactly (D heads of d_k = N,
  d_v = 1, per-key-dim decay, B expanded to every channel, q = C shared by one query head:
  ``linear_attention=True``), but it materialises k and the decay as [B, T, D·N] and its
  d_v = 1 heads are slow. Measured (``benchmarks/ssm_lowering.py``, 8 layers of
  Mamba-130m's width, 2 threads): LinearAttention takes 1.26x the Scan's time for a
  128-token prefill, 1.82x for 1,024 tokens, 1.08x for a decode step.
- ``ssd``: onnx-ort: ``com.microsoft.LinearAttention`` (``update_rule="gated"``, scale 1):
  q = C with one query head per group (its "inverse GQA": kv head h reads query head
  h // (H/G), which is Mamba-2's group of head h), k = B expanded to the heads, v = Δ·x,
  decay = Δ·A per head (log space), state [B, H, N, P] as LinearAttention keeps it; the D
  skip and the padding mask around it. On a Mamba2-130m-shaped model the Scan below takes
  2.15x LinearAttention's time for a 128-token prefill, 2.35x for 1,024, 1.15x for a decode
  step (``benchmarks/ssm_lowering.py``; ``lower_ssd_ort(linear_attention=False)`` builds the
  Scan on onnx-ort); the op's ``chunk`` (``scan-chunk``) becomes its ``chunk_size``.
  Portable: a ``Scan`` over time on the state viewed as [B, G, H/G, N, P], so B and C are
  read per group and never repeated (``lower_ssd``); with ``chunk`` set, the target's entry
  ``backends.onnx.delta.lower_ssd_portable`` puts the chunked form beside it behind an ``If``
  on T. (The standard ``LinearAttention`` is opset 27; these targets are 21-24.)
- ``gated_rms_norm``: standard ops: ``RMSNormalization`` at opset 23+ (over a
  [B, T, groups, size] view when ``group_size`` is set, the weight applied after), primitives
  before.

Scan bodies are typed and shaped (batch as ``batch_size``), read the outer graph's
constants, and take their names from the builder, so the model stays deterministic and
passes the checker and strict shape inference.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from onnx import TensorProto, helper

from irc import dims
from irc.dtypes import DType
from irc.graph import Node, Param, Value
from irc.ops.registry import by_name
from irc.ops.ssm import CONV_OPERANDS, SCAN_OPERANDS, SSD_OPERANDS

from backends.onnx.builder import INT64_MAX, MS_DOMAIN, ONNX_TYPES, Builder, dim_param
from backends.onnx.portable import silu

F32 = DType.f32


# ---- shared pieces -------------------------------------------------------------------------

def as_f32(b: Builder, value: Optional[Value]) -> str:
    """An operand in float32: "" for None, a param's initializer (cast in the graph when
    stored in another type, which ORT folds), an activation cast once when not f32."""
    if value is None:
        return ""
    if isinstance(value, Param):
        return b.weight(value, dtype=F32)
    name = b.value(value)
    if value.dtype == F32:
        return name
    return b.cached(("as-f32", value.name), lambda: b.op("Cast", [name], f"{value.name}/f32", to=TensorProto.FLOAT))


def _target(b: Builder, value: Value, out: str) -> str:
    """Where the f32 result for ``value`` is written: ``out`` itself, or a name that
    ``_finish`` casts to ``out``."""
    return out if value.dtype == F32 else b.fresh(f"{out}/f32")


def _finish(b: Builder, value: Value, target: str, out: str) -> None:
    if target != out:
        b.node("Cast", [target], [out], to=ONNX_TYPES[value.dtype])


def real_tokens(b: Builder, mask: Optional[Value], seq, rank: int = 3) -> str:
    """Bool [B, T, 1, ...] (``rank`` dims): which new tokens are real, the last T columns of
    ``attention_mask``; "" without a mask. Shared by every layer."""
    if mask is None:
        return ""

    def columns():
        first = b.op("Sub", [b.dim(mask.shape[1]), b.dim(seq)], "ssm/first_new_token")
        new = b.op("Slice", [b.value(mask), first, b.i64([INT64_MAX]), b.i64([1])], "ssm/new_tokens")
        return new if mask.dtype == DType.bool else b.op("Cast", [new], "ssm/real", to=TensorProto.BOOL)

    key = ("ssm-real", mask.name, dims.canonical(seq))
    return b.cached(key + (rank,), lambda: b.op("Unsqueeze", [b.cached(key, columns), b.i64(list(range(2, rank)))],
                                                f"ssm/real{rank}"))


def masked(b: Builder, x: str, real: str, out: str) -> str:
    """``x`` with padded tokens' rows set to 0 (``x`` itself without a mask)."""
    if not real:
        return x
    return b.node("Where", [real, x, b.const(0.0, np.float32, "zero")], [out])[0]


def scan_over_time(b: Builder, hint: str, states: list, sequences: list, outputs: list,
                   step: Callable[[list, list], tuple]) -> tuple[list, list]:
    """A standard ``Scan`` along axis 1 (time): ``states`` [(initial name, shape [B, ...])]
    are carried, ``sequences`` [(name [B, T, ...], step shape [B, ...])] are read one step at
    a time, ``outputs`` are the step results' shapes. ``step(state names, step names)``
    writes the body's nodes through ``b`` (``b.op`` and constants only: no cached subgraph)
    and returns (new state names, step result names). Returns (final state names,
    stacked results [B, T, ...])."""
    state_in = [b.fresh(f"{hint}/state") for _ in states]
    step_in = [b.fresh(f"{hint}/step") for _ in sequences]
    outer, b.nodes = b.nodes, []
    try:
        new_states, results = step(state_in, step_in)
        body_nodes = b.nodes
    finally:
        b.nodes = outer

    def info(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [dim_param(d) for d in shape])

    body = helper.make_graph(
        body_nodes, f"{hint}/step",
        [info(n, s) for n, (_, s) in zip(state_in, states)] + [info(n, s) for n, (_, s) in zip(step_in, sequences)],
        [info(n, s) for n, (_, s) in zip(new_states, states)] + [info(n, s) for n, s in zip(results, outputs)])
    finals = [b.fresh(f"{hint}/final_state") for _ in states]
    stacked = [b.fresh(f"{hint}/stacked") for _ in outputs]
    b.node("Scan", [name for name, _ in states] + [name for name, _ in sequences], finals + stacked, body=body,
           num_scan_inputs=len(sequences), scan_input_axes=[1] * len(sequences), scan_output_axes=[1] * len(outputs))
    return finals, stacked


def _zeros(b: Builder, shape: tuple, hint: str) -> str:
    return b.op("ConstantOfShape", [b.shape(shape)], hint, value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0]))


def _present(b: Builder, node: Node, outs: list, state: str) -> None:
    """Write the f32 final ``state`` as the node's present state (when it has one)."""
    if len(node.outputs) < 2:
        return
    if node.outputs[1].dtype == F32:
        b.node("Identity", [state], [outs[1]])
    else:
        b.node("Cast", [state], [outs[1]], to=ONNX_TYPES[node.outputs[1].dtype])


# ---- causal_conv1d -------------------------------------------------------------------------

def _conv_parts(b: Builder, node: Node, outs: list) -> tuple:
    o = by_name(CONV_OPERANDS, node.inputs)
    x = o["x"]
    real = real_tokens(b, o["attention_mask"], x.shape[1])
    inputs = masked(b, as_f32(b, x), real, b.fresh(f"{outs[0]}/x"))
    return o, real, inputs


def _conv_out(b: Builder, node: Node, outs: list, y: str, real: str) -> None:
    """Activation and padding mask on y [B, T, C], written to outs[0]."""
    out = node.outputs[0]
    target = _target(b, out, outs[0])
    if node.attrs["activation"] == "silu":
        y = silu(b, y, b.fresh(f"{outs[0]}/silu") if real else target)
    if real:
        masked(b, y, real, target)
    elif y != target:
        b.node("Identity", [y], [target])
    _finish(b, out, target, outs[0])


def lower_causal_conv1d(b: Builder, node: Node, outs: list[str]) -> None:
    """Concat(past state, x) along time -> depthwise Conv (+ bias) -> SiLU; the present
    state is the window's last K-1 columns (from column T on, so K = 1 is empty too)."""
    o, real, x = _conv_parts(b, node, outs)
    channels, kernel = o["weight"].shape[0], o["weight"].shape[2]
    x_bct = b.op("Transpose", [x], f"{outs[0]}/channels_first", perm=[0, 2, 1])
    conv = dict(group=channels, kernel_shape=[kernel])
    if o["past_state"] is not None:
        window = b.op("Concat", [as_f32(b, o["past_state"]), x_bct], f"{outs[0]}/window", axis=2)
        if len(node.outputs) > 1:  # written as the present state itself (_target), cast when not f32
            state = _target(b, node.outputs[1], outs[1])
            b.node("Slice", [window, b.dim(o["x"].shape[1]), b.i64([INT64_MAX]), b.i64([2])], [state])
            _finish(b, node.outputs[1], state, outs[1])
    else:
        window, conv["pads"] = x_bct, [kernel - 1, 0]
    y = b.op("Conv", [window, as_f32(b, o["weight"]), as_f32(b, o["bias"])], f"{outs[0]}/conv", **conv)
    _conv_out(b, node, outs, b.op("Transpose", [y], f"{outs[0]}/tokens_first", perm=[0, 2, 1]), real)


def lower_causal_conv1d_ort(b: Builder, node: Node, outs: list[str]) -> None:
    """``com.microsoft.CausalConvWithState`` on x [B, T, C] (channels_last: its state is
    [B, K-1, C], so ours is transposed in and out), SiLU fused in the op. x is masked (a
    padded token leaves the state as it was); the output at a padded position is left as
    computed, not zeroed: no real token reads it (the next conv masks its input, attention
    its keys), as GQA leaves a padded query row."""
    if node.inputs[1].shape[2] == 1:
        lower_causal_conv1d(b, node, outs)  # no state to carry
        return
    o, _, x = _conv_parts(b, node, outs)  # x masked; the output is not (docstring)
    past = "" if o["past_state"] is None else b.op("Transpose", [as_f32(b, o["past_state"])],
                                                    f"{outs[0]}/past_state", perm=[0, 2, 1])
    target, state = _target(b, node.outputs[0], outs[0]), b.fresh(f"{outs[0]}/present")
    b.node("CausalConvWithState", [x, as_f32(b, o["weight"]), as_f32(b, o["bias"]), past], [target, state],
           domain=MS_DOMAIN, channels_last=1, activation="silu" if node.attrs["activation"] == "silu" else None)
    if o["past_state"] is not None and len(node.outputs) > 1:
        present = _target(b, node.outputs[1], outs[1])
        b.node("Transpose", [state], [present], perm=[0, 2, 1])
        _finish(b, node.outputs[1], present, outs[1])
    _finish(b, node.outputs[0], target, outs[0])


# ---- selective_scan (Mamba-1) ----------------------------------------------------------------

def lower_selective_scan(b: Builder, node: Node, outs: list[str], linear_attention: bool = False) -> None:
    """Δ = softplus(dt) and x masked, then h_t = exp(Δ_t A) h + (Δ_t x_t) B_t, y_t = h_t C_t
    over time (a Scan, or LinearAttention with ``linear_attention``), then the D skip, the
    silu(z) gate and the mask."""
    o = by_name(SCAN_OPERANDS, node.inputs)
    x, hint = o["x"], outs[0]
    batch, seq, channels = x.shape
    state = o["A_log"].shape[1]
    real = real_tokens(b, o["attention_mask"], seq)
    xs = masked(b, as_f32(b, x), real, b.fresh(f"{hint}/x"))
    delta = masked(b, b.op("Softplus", [as_f32(b, o["dt"])], f"{hint}/softplus"), real, b.fresh(f"{hint}/delta"))
    dx = b.op("Mul", [delta, xs], f"{hint}/delta_x")
    A = b.op("Neg", [b.op("Exp", [as_f32(b, o["A_log"])], f"{hint}/exp_A_log")], f"{hint}/A")  # [D, N]
    past = as_f32(b, o["past_state"]) or _zeros(b, (batch, channels, state), f"{hint}/zero_state")
    if linear_attention:
        y, final = _selective_linear_attention(b, hint, o, delta, dx, A, past, (batch, seq, channels, state))
    else:
        y, final = _selective_scan_steps(b, hint, o, delta, dx, A, past, (batch, seq, channels, state))
    _present(b, node, outs, final)
    if o["D"] is not None:
        y = b.op("Add", [y, b.op("Mul", [xs, as_f32(b, o["D"])], f"{hint}/skip")], f"{hint}/with_skip")
    if o["z"] is not None:
        y = b.op("Mul", [y, silu(b, as_f32(b, o["z"]), b.fresh(f"{hint}/gate"))], f"{hint}/gated")
    out = node.outputs[0]
    target = _target(b, out, outs[0])
    if real:
        masked(b, y, real, target)
    else:
        b.node("Identity", [y], [target])
    _finish(b, out, target, outs[0])


def _selective_scan_steps(b: Builder, hint: str, o: dict, delta: str, dx: str, A: str, past: str,
                          sizes: tuple) -> tuple[str, str]:
    """The Scan: steps read Δ and Δ·x [B, D, 1], B [B, 1, N] and C [B, N, 1]; returns
    (y [B, T, D], final state [B, D, N])."""
    batch, seq, channels, state = sizes
    column, row = b.i64([-1]), b.i64([2])
    sequences = [(b.op("Unsqueeze", [delta, column], f"{hint}/delta4"), (batch, channels, 1)),
                 (b.op("Unsqueeze", [dx, column], f"{hint}/delta_x4"), (batch, channels, 1)),
                 (b.op("Unsqueeze", [as_f32(b, o["B"]), row], f"{hint}/B4"), (batch, 1, state)),
                 (b.op("Unsqueeze", [as_f32(b, o["C"]), column], f"{hint}/C4"), (batch, state, 1))]

    def step(states, steps):
        (h,), (delta_t, dx_t, B_t, C_t) = states, steps
        decay = b.op("Exp", [b.op("Mul", [delta_t, A], f"{hint}/step_delta_A")], f"{hint}/step_decay")
        kept = b.op("Mul", [decay, h], f"{hint}/step_kept")
        h = b.op("Add", [kept, b.op("Mul", [dx_t, B_t], f"{hint}/step_update")], f"{hint}/step_state")
        return [h], [b.op("MatMul", [h, C_t], f"{hint}/step_y")]

    (final,), (ys,) = scan_over_time(b, f"{hint}/scan", [(past, (batch, channels, state))], sequences,
                                     [(batch, channels, 1)], step)
    return b.op("Squeeze", [ys, column], f"{hint}/y"), final


def _selective_linear_attention(b: Builder, hint: str, o: dict, delta: str, dx: str, A: str, past: str,
                                sizes: tuple) -> tuple[str, str]:
    """LinearAttention with D heads of d_k = N, d_v = 1: k = B on every channel, decay = Δ·A
    per (channel, n), v = Δ·x, q = C read by every head (one query head)."""
    batch, seq, channels, state = sizes
    flat = b.shape((batch, seq, channels * state))
    B4 = b.op("Unsqueeze", [as_f32(b, o["B"]), b.i64([2])], f"{hint}/B4")
    keys = b.op("Reshape", [b.op("Expand", [B4, b.shape((batch, seq, channels, state))], f"{hint}/B_per_channel"),
                            flat], f"{hint}/keys", allowzero=1)
    delta4 = b.op("Unsqueeze", [delta, b.i64([-1])], f"{hint}/delta4")
    decay = b.op("Reshape", [b.op("Mul", [delta4, A], f"{hint}/delta_A"), flat], f"{hint}/decay", allowzero=1)
    past4 = b.op("Reshape", [past, b.shape((batch, channels, state, 1))], f"{hint}/past4", allowzero=1)
    y, present4 = b.fresh(f"{hint}/y"), b.fresh(f"{hint}/present4")
    b.node("LinearAttention", [as_f32(b, o["C"]), keys, dx, past4, decay], [y, present4], domain=MS_DOMAIN,
           q_num_heads=1, kv_num_heads=channels, update_rule="gated", scale=1.0)
    return y, b.op("Reshape", [present4, b.shape((batch, channels, state))], f"{hint}/final_state", allowzero=1)


# ---- ssd (Mamba-2) -------------------------------------------------------------------------

def _ssd_parts(b: Builder, node: Node, hint: str) -> dict:
    """What both lowerings share: the mask, x masked [B, T, H, P], Δ [B, T, H]
    (softplus(dt + dt_bias), clamped, masked), Δ·x, A [H]."""
    o, a = by_name(SSD_OPERANDS, node.inputs), node.attrs
    batch, seq = o["x"].shape[:2]
    heads, head_dim = a["heads"], a["head_dim"]
    real4 = real_tokens(b, o["attention_mask"], seq, rank=4)
    x4 = b.op("Reshape", [as_f32(b, o["x"]), b.shape((batch, seq, heads, head_dim))], f"{hint}/x_heads", allowzero=1)
    x4 = masked(b, x4, real4, b.fresh(f"{hint}/x"))
    raw = as_f32(b, o["dt"])
    if o["dt_bias"] is not None:
        raw = b.op("Add", [raw, as_f32(b, o["dt_bias"])], f"{hint}/dt")
    delta = b.op("Softplus", [raw], f"{hint}/softplus")
    if a["dt_min"] or a["dt_max"] is not None:
        high = "" if a["dt_max"] is None else b.const(a["dt_max"], np.float32, f"{hint}/dt_max")
        delta = b.op("Clip", [delta, b.const(a["dt_min"], np.float32, f"{hint}/dt_min"), high], f"{hint}/clamped")
    delta = masked(b, delta, real_tokens(b, o["attention_mask"], seq), b.fresh(f"{hint}/delta"))
    dx = b.op("Mul", [b.op("Unsqueeze", [delta, b.i64([-1])], f"{hint}/delta4"), x4], f"{hint}/delta_x")
    A = b.op("Neg", [b.op("Exp", [as_f32(b, o["A_log"])], f"{hint}/exp_A_log")], f"{hint}/A")
    return dict(o=o, batch=batch, seq=seq, heads=heads, head_dim=head_dim, groups=a["groups"],
                state=a["state_size"], real4=real4, x4=x4, delta=delta, dx=dx, A=A)


def _ssd_out(b: Builder, node: Node, outs: list, s: dict, y4: str) -> None:
    """y [B, T, H, P] + D·x, masked, as [B, T, H·P] in outs[0]."""
    hint, D = outs[0], s["o"]["D"]
    if D is not None:
        per_head = b.op("Unsqueeze", [as_f32(b, D), b.i64([-1])], f"{hint}/D")
        y4 = b.op("Add", [y4, b.op("Mul", [s["x4"], per_head], f"{hint}/skip")], f"{hint}/with_skip")
    y4 = masked(b, y4, s["real4"], b.fresh(f"{hint}/masked"))
    out = node.outputs[0]
    target = _target(b, out, outs[0])
    b.node("Reshape", [y4, b.shape(out.shape)], [target], allowzero=1)
    _finish(b, out, target, outs[0])


def ssd_scan_parts(b: Builder, node: Node, hint: str) -> tuple[dict, str]:
    """``_ssd_parts`` plus what the portable forms read, all made outside any ``If``: the log
    decay Δ·A, B and C in float32, the state viewed as [B, G, H/G, N, P] (so B and C are
    read per group, never repeated; zeros without a past state), the token Scan's step
    shapes and token-major views. Returns (parts, initial state)."""
    s = _ssd_parts(b, node, hint)
    batch, seq, heads, groups, state, head_dim = (s[k] for k in ("batch", "seq", "heads", "groups", "state",
                                                                 "head_dim"))
    grouped = (batch, groups, heads // groups, state, head_dim)
    past = s["o"]["past_state"]
    past = _zeros(b, grouped, f"{hint}/zero_state") if past is None else b.op(
        "Reshape", [as_f32(b, past), b.shape(grouped)], f"{hint}/past_groups", allowzero=1)
    steps = [(batch, groups, heads // groups, 1, 1), (batch, groups, heads // groups, 1, head_dim),
             (batch, groups, 1, state, 1), (batch, groups, 1, 1, state)]
    s.update(grouped=grouped, step_shapes=steps, log_decay=b.op("Mul", [s["delta"], s["A"]], f"{hint}/delta_A"),
             B=as_f32(b, s["o"]["B"]), C=as_f32(b, s["o"]["C"]),
             token_shapes=[b.shape((batch, seq) + shape[1:]) for shape in steps]
             + [b.shape((batch, seq, heads, head_dim))])
    return s, past


def ssd_token_scan(b: Builder, s: dict, past: str, hint: str) -> tuple[str, str]:
    """(y [B, T, H, P], final state [B, G, H/G, N, P]): a Scan over tokens whose steps read
    the decay [B, G, H/G, 1, 1], Δ·x [B, G, H/G, 1, P], B [B, G, 1, N, 1] and C [B, G, 1, 1, N]."""
    decay = b.op("Exp", [s["log_decay"]], f"{hint}/decay")
    names = [decay, s["dx"], s["B"], s["C"]]
    sequences = [(b.op("Reshape", [name, shape], f"{hint}/{role}", allowzero=1), step) for name, shape, step, role in
                 zip(names, s["token_shapes"], s["step_shapes"], ["decay6", "delta_x6", "B6", "C6"])]

    def step(states, steps):
        (h,), (decay_t, dx_t, B_t, C_t) = states, steps
        kept = b.op("Mul", [decay_t, h], f"{hint}/step_kept")
        h = b.op("Add", [kept, b.op("Mul", [B_t, dx_t], f"{hint}/step_update")], f"{hint}/step_state")
        return [h], [b.op("MatMul", [C_t, h], f"{hint}/step_y")]

    (final,), (ys,) = scan_over_time(b, f"{hint}/scan", [(past, s["grouped"])], sequences, [s["step_shapes"][1]],
                                     step)
    return b.op("Reshape", [ys, s["token_shapes"][-1]], f"{hint}/y_heads", allowzero=1), final


def ssd_finish(b: Builder, node: Node, outs: list, s: dict, y4: str, final: str) -> None:
    """The present state (``final`` [B, G, H/G, N, P] as [B, H, N, P]) and y [B, T, H, P]
    with the D skip and the mask, into the node's outputs."""
    shape = (s["batch"], s["heads"], s["state"], s["head_dim"])
    _present(b, node, outs, b.op("Reshape", [final, b.shape(shape)], f"{outs[0]}/final_state", allowzero=1))
    _ssd_out(b, node, outs, s, y4)


def lower_ssd(b: Builder, node: Node, outs: list[str]) -> None:
    """The token Scan alone (the portable target's form without ``chunk``; with it,
    ``backends.onnx.delta.lower_ssd_portable`` adds the chunked form)."""
    s, past = ssd_scan_parts(b, node, outs[0])
    ssd_finish(b, node, outs, s, *ssd_token_scan(b, s, past, outs[0]))


def lower_ssd_ort(b: Builder, node: Node, outs: list[str], linear_attention: bool = True) -> None:
    """``com.microsoft.LinearAttention`` (gated, scale 1; see the module docstring), or the
    portable Scan when ``linear_attention`` is False."""
    if not linear_attention:
        lower_ssd(b, node, outs)
        return
    hint = outs[0]
    s = _ssd_parts(b, node, hint)
    batch, seq, heads, groups, state = s["batch"], s["seq"], s["heads"], s["groups"], s["state"]
    o = s["o"]
    keys = as_f32(b, o["B"])
    if groups != heads:
        grouped = b.op("Reshape", [keys, b.shape((batch, seq, groups, 1, state))], f"{hint}/B_groups", allowzero=1)
        wide = b.op("Expand", [grouped, b.shape((batch, seq, groups, heads // groups, state))], f"{hint}/B_heads")
        keys = b.op("Reshape", [wide, b.shape((batch, seq, heads * state))], f"{hint}/keys", allowzero=1)
    values = b.op("Reshape", [s["dx"], b.shape(o["x"].shape)], f"{hint}/values", allowzero=1)
    decay = b.op("Mul", [s["delta"], s["A"]], f"{hint}/log_decay")
    y, state_out = b.fresh(f"{hint}/y"), b.fresh(f"{hint}/present")
    b.node("LinearAttention", [as_f32(b, o["C"]), keys, values, as_f32(b, o["past_state"]), decay], [y, state_out],
           domain=MS_DOMAIN, q_num_heads=groups, kv_num_heads=heads, update_rule="gated", scale=1.0,
           chunk_size=node.attrs["chunk"])
    _present(b, node, outs, state_out)
    y4 = b.op("Reshape", [y, b.shape((batch, seq, heads, s["head_dim"]))], f"{hint}/y_heads", allowzero=1)
    _ssd_out(b, node, outs, s, y4)


# ---- gated_rms_norm ------------------------------------------------------------------------

def lower_gated_rms_norm(b: Builder, node: Node, outs: list[str]) -> None:
    """RMS norm of x·silu(z) (or of x, gated after, with ``norm_before_gate``) per group of
    features, times the weight."""
    x, z, weight = node.inputs
    a, hint = node.attrs, outs[0]
    batch, seq, features = x.shape
    gate = silu(b, as_f32(b, z), b.fresh(f"{hint}/gate"))
    v = as_f32(b, x)
    if not a["norm_before_gate"]:
        v = b.op("Mul", [v, gate], f"{hint}/gated")
    size = features if a["group_size"] is None else a["group_size"]
    grouped = size != features
    if grouped:
        v = b.op("Reshape", [v, b.shape((batch, seq, features // size, size))], f"{hint}/groups", allowzero=1)
    factors = ([] if b.opset >= 23 and not grouped else [as_f32(b, weight)]) + ([gate] if a["norm_before_gate"] else [])
    out = node.outputs[0]
    target = _target(b, out, outs[0])
    normed = target if not factors else b.fresh(f"{hint}/normed")
    if b.opset >= 23:
        scale = b.const(np.ones(size, np.float32), np.float32, f"ones{size}") if grouped else as_f32(b, weight)
        b.node("RMSNormalization", [v, scale], [normed], axis=-1, epsilon=float(a["eps"]), stash_type=1)
    else:
        mean = b.op("ReduceMean", [b.op("Mul", [v, v], f"{hint}/square"), b.i64([-1])], f"{hint}/mean_square",
                    keepdims=1)
        shifted = b.op("Add", [mean, b.const(a["eps"], np.float32, f"{hint}/eps")], f"{hint}/mean_square_eps")
        b.node("Div", [v, b.op("Sqrt", [shifted], f"{hint}/rms")], [normed])
    if grouped:
        normed = b.op("Reshape", [normed, b.shape(x.shape)], f"{hint}/features", allowzero=1)
    for i, factor in enumerate(factors):
        normed = b.node("Mul", [normed, factor], [target if i == len(factors) - 1 else b.fresh(f"{hint}/scaled")])[0]
    _finish(b, out, target, outs[0])


# ssd's portable entry is backends.onnx.delta.lower_ssd_portable: its chunked form shares the delta rule's pieces
LOWERINGS = {"causal_conv1d": lower_causal_conv1d, "selective_scan": lower_selective_scan,
             "gated_rms_norm": lower_gated_rms_norm}
ORT_OVERRIDES = {"causal_conv1d": lower_causal_conv1d_ort, "ssd": lower_ssd_ort}
