"""The gated delta rule (``irc.ops.delta``) in ONNX, for both targets, and the portable
chunked form of ``ssd`` (Mamba-2), which shares the chunked pieces.

The form follows the op's ``chunk`` attribute (set by the ``scan-chunk`` pass, in both
targets' default pipelines): without it the portable target builds the token Scan alone;
with it an ``If`` on T between the chunked form (chunks of ``chunk`` tokens, T padded with
frozen steps) and the token Scan, which short inputs and decode steps take. onnx-ort
passes it to ``LinearAttention`` as ``chunk_size`` (a tuning hint of its CPU kernel,
default 64; measured on a loaded host, 16, 64 and 256 were within the noise of leaving it
out at 1,024 and 4,096 tokens on both benchmark stacks: ``benchmarks/scan_chunk.py
--sizes 16,64,256``).

Shared by both: float32 inside; q and k L2-normalised per head (x / sqrt(Σx² + 1e-6)), q
times the scale; the log decay g = -exp(A_log)·softplus(a + dt_bias) and β = sigmoid(b),
both set to 0 at padded tokens (``backends.onnx.ssm.real_tokens``: the step is frozen,
decay 1 and no write), and the output of a padded token set to 0. The state is the
graph's ``past_key_values.{i}.recurrent_state`` [B, H_v, d_k, d_v], key-major.

- onnx-ort: ``com.microsoft.LinearAttention`` with ``update_rule="gated_delta"``,
  ``q_num_heads`` = H_k and ``kv_num_heads`` = H_v (its "inverse GQA": value head h reads
  query head h // (H_v / H_k), Qwen's sharing), k expanded to the H_v heads, decay g and β
  [B, T, H_v], and the scale set explicitly (d_k^-0.5 unless the op says otherwise). Its
  CPU kernel is the fastest form here at every length (below).
- portable, standard ops only: with ``chunk``, prompts (T >= ``CHUNKED_FROM``) run the
  chunked form of ``irc.ops.delta.chunked_gated_delta_rule`` and transformers'
  ``torch_chunk_gated_delta_rule``; shorter inputs run a standard ``Scan`` over tokens. The
  chunked form computes for every chunk at once the intra-chunk scores, the decays and the
  inverse of the chunk's unit-lower-triangular write system (standard ONNX has no
  triangular solve: the inverse is built by doubling blocks, six levels of small matmuls for
  C = 64, exact block substitution; so ``chunk`` must be a power of two), then a ``Scan``
  over chunks carries the state with four matmuls a chunk. A per-channel decay (Kimi) runs
  the token Scan whatever ``chunk`` says. The token Scan works on the state viewed as
  [B, H_k, H_v/H_k, d_k, d_v], so q and k are never repeated. Measured on ONNX Runtime's
  CPU provider, the op alone at Qwen3-Next's shape (16 key / 32 value heads of 128 x 128,
  batch 1, random state, 2 threads, medians of 7 interleaved rounds on a quiet machine, ms):

      T                       1      8     16     64    128   1,024
      LinearAttention (ort)   0.41   2.0    3.6    8.4   12.2    66
      chunked (portable)      1.16   7.0   11.7   12.9   20.3   120
      token Scan (portable)   0.95   6.3   11.2   26.4   48.4   385

  The two portable forms cross near 16 tokens (``CHUNKED_FROM``); from there the chunked
  form is 2.0x (64 tokens) to 3.2x (1,024) the token Scan's speed, at 1.5-1.8x
  LinearAttention's time. A decode step runs the token Scan behind the ``If``, which costs
  ~0.2 ms a layer.
- ``ssd``, portable (``lower_ssd_portable``): with ``chunk``, Mamba-2's structured masked
  attention (``irc.ops.ssm.chunked_ssd``) for every chunk at once, Y = (C·Bᵀ ⊙ L)(Δ·x) +
  exp(cum)·C·h_in with L = exp(segsum(Δ·A)) (C·Bᵀ once per group), and a Scan over chunks
  that only passes the state; behind an ``If`` (T >= ``SSD_CHUNKED_FROM``) with
  ``backends.onnx.ssm``'s token Scan. Measured on a loaded host (4 layers of 8 heads x 32,
  state 64, 2 threads): the forms are even near 8 tokens, the chunked form 1.6x the token
  Scan's speed at 256 and 1,024 tokens and 2.1x at 4,096 (0.93 s against 1.94 s;
  LinearAttention 0.80 s).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from onnx import TensorProto, helper

from irc import dims
from irc.errors import BackendError
from irc.graph import Node
from irc.ops.delta import L2_EPS, OPERANDS
from irc.ops.registry import by_name

from backends.onnx.builder import INT64_MAX, MS_DOMAIN, Builder, dim_param
from backends.onnx.ssm import (_finish, _present, _target, _zeros, as_f32, lower_ssd, masked, real_tokens,
                               scan_over_time, ssd_finish, ssd_scan_parts, ssd_token_scan)

CHUNKED_FROM = 16      # the token count from which the portable delta rule runs its chunked form (measured)
SSD_CHUNKED_FROM = 16  # the same for ssd (measured: the forms are even near 8 tokens, module docstring)


def _view(b: Builder, name: str, shape: tuple, hint: str) -> str:
    return b.op("Reshape", [name, b.shape(shape)], hint, allowzero=1)


def _l2norm(b: Builder, x: str, hint: str) -> str:
    """x / sqrt(Σ x² + eps) over the last axis."""
    square = b.op("ReduceSum", [b.op("Mul", [x, x], f"{hint}/square"), b.i64([-1])], f"{hint}/sum_square", keepdims=1)
    shifted = b.op("Add", [square, b.const(L2_EPS, np.float32, "l2_eps")], f"{hint}/sum_square_eps")
    return b.op("Div", [x, b.op("Sqrt", [shifted], f"{hint}/norm")], f"{hint}/normed")


def _parts(b: Builder, node: Node, hint: str) -> dict:
    """What both lowerings share: q̂ and k̂ [B, T, H_k, d_k] (normalised), the scale, v, the
    log decay g and β [B, T, H_v] (0 at padded tokens), the [B, T, 1] real-token mask."""
    o, a = by_name(OPERANDS, node.inputs), node.attrs
    batch, seq = o["q"].shape[:2]
    key_heads, key_dim = a["key_heads"], a["key_dim"]
    heads4 = (batch, seq, key_heads, key_dim)
    q = _view(b, as_f32(b, o["q"]), heads4, f"{hint}/q_heads")
    k = _view(b, as_f32(b, o["k"]), heads4, f"{hint}/k_heads")
    if a["l2_norm"]:
        q, k = _l2norm(b, q, f"{hint}/q_l2"), _l2norm(b, k, f"{hint}/k_l2")
    g = _log_decay(b, o, a, batch, seq, hint)
    real = real_tokens(b, o["attention_mask"], seq)
    g = masked(b, g, real, b.fresh(f"{hint}/g"))
    v = as_f32(b, o["v"])
    if a["update_rule"] == "gated_delta":
        beta = masked(b, b.op("Sigmoid", [as_f32(b, o["b"])], f"{hint}/beta"), real, b.fresh(f"{hint}/beta_masked"))
    else:  # the gated rule writes k ⊗ v: a padded token writes nothing
        beta, v = None, masked(b, v, real, b.fresh(f"{hint}/v_masked"))
    return dict(o=o, batch=batch, seq=seq, key_heads=key_heads, key_dim=key_dim, value_heads=a["value_heads"],
                value_dim=a["value_dim"], scale=float(key_dim ** -0.5 if a["scale"] is None else a["scale"]),
                q=q, k=k, v=v, g=g, beta=beta, real=real, delta=a["update_rule"] == "gated_delta",
                channel=a["decay"] == "channel")


def _log_decay(b: Builder, o: dict, a: dict, batch, seq, hint: str) -> str:
    """g [B, T, H_v] (or [B, T, H_v·d_k] with a per-channel decay) = -exp(A_log)·softplus(a +
    dt_bias); without ``a`` the constant -exp(A_log) expanded over the tokens."""
    rate = b.op("Neg", [b.op("Exp", [as_f32(b, o["A_log"])], f"{hint}/exp_A_log")], f"{hint}/A")
    if o["a"] is None:
        return b.op("Expand", [rate, b.shape((batch, seq, a["value_heads"]))], f"{hint}/log_decay")
    raw = as_f32(b, o["a"])
    if o["dt_bias"] is not None:
        raw = b.op("Add", [raw, as_f32(b, o["dt_bias"])], f"{hint}/a_biased")
    if a["decay"] == "channel":  # one rate a head, on each of its d_k channels
        per_channel = b.op("Expand", [b.op("Unsqueeze", [rate, b.i64([-1])], f"{hint}/A_heads"),
                                      b.i64([a["value_heads"], a["key_dim"]])], f"{hint}/A_channels")
        rate = b.op("Reshape", [per_channel, b.i64([-1])], f"{hint}/A_flat")
    return b.op("Mul", [rate, b.op("Softplus", [raw], f"{hint}/softplus")], f"{hint}/log_decay")


def _out(b: Builder, node: Node, outs: list, s: dict, y: str) -> None:
    """y [B, T, H_v·d_v], padded tokens' rows 0, into outs[0]."""
    out = node.outputs[0]
    target = _target(b, out, outs[0])
    if s["real"]:
        masked(b, y, s["real"], target)
    else:
        b.node("Identity", [y], [target])
    _finish(b, out, target, outs[0])


def lower_gated_delta_rule(b: Builder, node: Node, outs: list[str], chunked_from: int = CHUNKED_FROM) -> None:
    """The portable lowering (module docstring): with ``chunk`` set, an ``If`` on the token
    count between the chunked form (T >= ``chunked_from``) and the token Scan; without it
    (or with a per-channel decay) the token Scan alone."""
    hint, chunk = outs[0], node.attrs["chunk"]
    s = _parts(b, node, hint)
    batch, key_heads, key_dim, value_dim = s["batch"], s["key_heads"], s["key_dim"], s["value_dim"]
    group = s["value_heads"] // key_heads
    grouped = (batch, key_heads, group, key_dim, value_dim)
    past = s["o"]["past_state"]
    past = _zeros(b, grouped, f"{hint}/zero_state") if past is None else _view(b, as_f32(b, past), grouped,
                                                                                f"{hint}/past_groups")
    out_shape = node.outputs[0].shape
    if chunk is None or s["channel"]:  # a per-channel decay runs the token Scan (module docstring)
        y, final = _token_scan(b, s, past, hint, _token_shapes(b, s, out_shape))
    else:
        _power_of_two(chunk, node)
        shapes, chunk_shapes = _token_shapes(b, s, out_shape), _chunk_shapes(b, s, chunk)  # made outside the If
        y, final = by_length(b, s["seq"], chunked_from, lambda: _chunked(b, s, past, hint, chunk, chunk_shapes),
                             lambda: _token_scan(b, s, past, hint, shapes), [out_shape, grouped], hint)
    _present(b, node, outs, _view(b, final, (batch, s["value_heads"], key_dim, value_dim), f"{hint}/final_state"))
    _out(b, node, outs, s, y)


def _power_of_two(chunk: int, node: Node) -> None:
    if chunk & (chunk - 1):
        raise BackendError(f"{node.op} chunk={chunk}: the portable chunked form inverts its triangular system by "
                           "doubling blocks, so the chunk must be a power of two",
                           hint="run scan-chunk{size=64} (or another power of two)")


# ---- pieces both chunked forms (the delta rule's, ssd's) share --------------------------------

def branch(b: Builder, name: str, build: Callable[[], list], shapes: list):
    """A subgraph of the nodes ``build()`` writes; its outputs (the names it returns) typed
    float32 with ``shapes``. It may read outer values, constants and cached shapes made
    before it, never cache a subgraph of its own."""
    outer, b.nodes = b.nodes, []
    try:
        results = build()
        nodes = b.nodes
    finally:
        b.nodes = outer
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [dim_param(d) for d in shape])
               for n, shape in zip(results, shapes)]
    return helper.make_graph(nodes, name, [], outputs)


def by_length(b: Builder, seq, threshold: int, long_form: Callable[[], list], short_form: Callable[[], list],
              shapes: list, hint: str) -> list:
    """An ``If`` on the token count: ``long_form()`` (a chunked form) when T >= ``threshold``,
    else ``short_form()`` (the token Scan, which a decode step takes); both return float32
    results of ``shapes``."""
    many = b.cached(("chunked-from", dims.canonical(seq), threshold),
                    lambda: b.op("GreaterOrEqual", [b.dim(seq), b.i64([threshold])], "chunk/long_enough"))
    graphs = {key: branch(b, f"{hint}/{key}", build, shapes)
              for key, build in (("then_branch", long_form), ("else_branch", short_form))}
    results = [b.fresh(f"{hint}/{role}") for role in ("y", "final")]
    b.node("If", [many], results, **graphs)
    return results


def chunk_padding(b: Builder, seq, chunk: int) -> dict:
    """{rank: Pad's pads for a [B, T, ...] tensor of rank 3 or 4}: T padded up to a multiple
    of ``chunk`` (the padded steps are frozen: log decay 0, nothing written). Shared by every
    layer; made outside any ``If``."""
    def make():
        length = b.dim(seq)
        pad = b.op("Mod", [b.op("Sub", [b.i64([chunk]), b.op("Mod", [length, b.i64([chunk])], "chunk/seq_mod")],
                                "chunk/pad_rest"), b.i64([chunk])], "chunk/pad")
        return {rank: b.op("Concat", [b.i64([0] * (rank + 1)), pad, b.i64([0] * (rank - 2))], f"chunk/pads{rank}",
                           axis=0) for rank in (4, 3)}

    return b.cached(("chunk-pads", dims.canonical(seq), chunk), make)


def decay_pairs(b: Builder, cum: str, chunk: int, hint: str) -> str:
    """[..., C, C]: exp(cum_i − cum_j) for j <= i and 0 above the diagonal (exp(segsum)),
    from the cumulative log decay ``cum`` [..., C]; the upper half is clamped to 0 before
    the Exp, so it cannot overflow."""
    diff = b.op("Sub", [b.op("Unsqueeze", [cum, b.i64([-1])], f"{hint}/cum_i"),
                        b.op("Unsqueeze", [cum, b.i64([-2])], f"{hint}/cum_j")], f"{hint}/cum_diff")
    causal = b.const(np.tril(np.ones((chunk, chunk), np.float32)), np.float32, f"causal{chunk}")
    return b.op("Mul", [b.op("Exp", [b.op("Min", [diff, b.const(0.0, np.float32, "zero")], f"{hint}/cum_diff_le0")],
                             f"{hint}/pair_decay"), causal], f"{hint}/pair")


def _token_shapes(b: Builder, s: dict, out_shape: tuple) -> dict:
    batch, seq, key_heads, key_dim = s["batch"], s["seq"], s["key_heads"], s["key_dim"]
    group = s["value_heads"] // key_heads
    steps = {"gates": (batch, key_heads, group, 1, 1), "rows": (batch, key_heads, 1, 1, key_dim),
             "decays": (batch, key_heads, group, key_dim if s["channel"] else 1, 1),
             "columns": (batch, key_heads, 1, key_dim, 1), "values": (batch, key_heads, group, 1, s["value_dim"])}
    return {"steps": steps, "out": b.shape(out_shape),
            **{role: b.shape((batch, seq) + shape[1:]) for role, shape in steps.items()}}


def _token_scan(b: Builder, s: dict, past: str, hint: str, shapes: dict) -> tuple[str, str]:
    """(y [B, T, H_v·d_v], final state [B, H_k, r, d_k, d_v]): one Scan step a token, S' =
    exp(g)·S (g per head, or per key channel: per row of S), S = S' + k ⊗ β(v − S'ᵀk) (the
    gated rule: S' + k ⊗ v), o = Sᵀq."""
    decay = b.op("Exp", [s["g"]], f"{hint}/decay")
    query = b.op("Mul", [s["q"], b.const(s["scale"], np.float32, f"{hint}/scale")], f"{hint}/q_scaled")
    roles = ["decays", "rows", "columns", "rows", "values"] + (["gates"] if s["delta"] else [])
    names = [decay, s["k"], s["k"], query, s["v"]] + ([s["beta"]] if s["delta"] else [])
    sequences = [(b.op("Reshape", [name, shapes[role]], f"{hint}/{role}", allowzero=1), shapes["steps"][role])
                 for name, role in zip(names, roles)]

    def step(states, steps):
        (S,), (decay_t, k_row, k_column, q_row, v_t, *beta_t) = states, steps
        kept = b.op("Mul", [decay_t, S], f"{hint}/step_kept")
        correction = v_t
        if beta_t:
            recalled = b.op("MatMul", [k_row, kept], f"{hint}/step_recalled")          # [B, H_k, r, 1, d_v]
            correction = b.op("Mul", [b.op("Sub", [v_t, recalled], f"{hint}/step_error"), beta_t[0]],
                              f"{hint}/step_correction")
        S = b.op("Add", [kept, b.op("Mul", [k_column, correction], f"{hint}/step_write")], f"{hint}/step_state")
        return [S], [b.op("MatMul", [q_row, S], f"{hint}/step_y")]

    grouped = shapes["steps"]["values"][:3] + (s["key_dim"], s["value_dim"])
    (final,), (ys,) = scan_over_time(b, f"{hint}/scan", [(past, grouped)], sequences, [shapes["steps"]["values"]],
                                     step)
    return b.op("Reshape", [ys, shapes["out"]], f"{hint}/token_y", allowzero=1), final


def _chunk_shapes(b: Builder, s: dict, chunk: int) -> dict:
    """The int64 tensors the chunked form reshapes and pads with (0 in a Reshape copies
    that dim: B, N and H_k need no symbol)."""
    key_heads, group = s["key_heads"], s["value_heads"] // s["key_heads"]
    pads = chunk_padding(b, s["seq"], chunk)
    return {"seq": b.dim(s["seq"]), "pads4": pads[4], "pads3": pads[3],
            "qk": b.i64([0, -1, chunk, key_heads, 1, s["key_dim"]]),
            "v": b.i64([0, -1, chunk, key_heads, group, s["value_dim"]]),
            "gates": b.i64([0, -1, chunk, key_heads, group]), "out": b.i64([0, -1, s["value_heads"] * s["value_dim"]])}


def _chunked(b: Builder, s: dict, past: str, hint: str, chunk: int, shapes: dict) -> tuple[str, str]:
    """(y, final state) in chunks of ``chunk`` tokens (T padded with frozen steps): per chunk
    the writes solve one unit-lower-triangular system (``_unit_lower_inverse``), computed for
    every chunk at once; a Scan over chunks carries the state (transformers'
    ``torch_chunk_gated_delta_rule``). Layout [B, N, H_k, r, C, ·]."""
    def chunks(x, pads, shape, perm, role):
        padded = b.op("Pad", [x, shapes[pads]], f"{hint}/{role}_padded")
        return b.op("Transpose", [b.op("Reshape", [padded, shapes[shape]], f"{hint}/{role}_chunks")],
                    f"{hint}/{role}_by_chunk", perm=perm)

    heads_first, gates_first = [0, 1, 3, 4, 2, 5], [0, 1, 3, 4, 2]
    q = chunks(s["q"], "pads4", "qk", heads_first, "q")                               # [B, N, H_k, 1, C, d_k]
    k = chunks(s["k"], "pads4", "qk", heads_first, "k")
    v = chunks(b.op("Reshape", [s["v"], b.i64([0, 0, s["key_heads"], -1])], f"{hint}/v_heads"), "pads4", "v",
               heads_first, "v")                                                       # [B, N, H_k, r, C, d_v]
    g = chunks(s["g"], "pads3", "gates", gates_first, "g")
    cum = b.op("CumSum", [g, b.i64(-1)], f"{hint}/cum")                                 # [B, N, H_k, r, C]
    last = b.op("Slice", [cum, b.i64([-1]), b.i64([INT64_MAX]), b.i64([-1])], f"{hint}/cum_last")
    column = b.i64([-1])
    pair = decay_pairs(b, cum, chunk, hint)
    swap = [0, 1, 2, 3, 5, 4]
    q = b.op("Mul", [q, b.const(s["scale"], np.float32, f"{hint}/scale")], f"{hint}/q_scaled")
    scores = b.op("MatMul", [q, b.op("Transpose", [k], f"{hint}/k_t", perm=swap)], f"{hint}/scores")
    intra = b.op("Mul", [scores, pair], f"{hint}/intra")                                # [B, N, H_k, r, C, C]
    to_end, from_start = (b.op("Unsqueeze", [b.op("Exp", [x], f"{hint}/{role}"), column], f"{hint}/{role}4")
                          for x, role in ((b.op("Sub", [last, cum], f"{hint}/cum_rest"), "decay_to_end"),
                                          (cum, "decay_from_start")))
    values, reads = v, None  # the gated rule writes v as it is
    if s["delta"]:
        beta = chunks(s["beta"], "pads3", "gates", gates_first, "beta")
        inverse = _unit_lower_inverse(b, k, cum, beta, chunk, s["key_dim"], hint)
        beta4 = b.op("Unsqueeze", [beta, column], f"{hint}/beta4")
        values = b.op("MatMul", [inverse, b.op("Mul", [v, beta4], f"{hint}/v_beta")], f"{hint}/new_values")
        reads = b.op("MatMul", [inverse, b.op("Mul", [k, b.op("Mul", [beta4, from_start], f"{hint}/beta_decay")],
                                                     f"{hint}/k_beta_decay")], f"{hint}/k_cumdecay")
    queries = b.op("Mul", [q, from_start], f"{hint}/q_decayed")
    writes = b.op("Transpose", [b.op("Mul", [k, to_end], f"{hint}/k_to_end")], f"{hint}/k_to_end_t", perm=swap)
    chunk_decay = b.op("Unsqueeze", [b.op("Exp", [last], f"{hint}/chunk_decay"), column], f"{hint}/chunk_decay6")
    final, ys = _chunk_scan(b, s, past, hint, chunk, [values, reads, queries, intra, writes, chunk_decay])
    y = b.op("Reshape", [b.op("Transpose", [ys], f"{hint}/y_tokens", perm=[0, 1, 4, 2, 3, 5]), shapes["out"]],
             f"{hint}/y_padded")
    return b.op("Slice", [y, b.i64([0]), shapes["seq"], b.i64([1])], f"{hint}/chunked_y"), final


def _chunk_scan(b: Builder, s: dict, past: str, hint: str, chunk: int, sequences: list) -> tuple[str, str]:
    """The Scan over chunks: u = values − reads·S (values alone where reads is None: the
    gated rule); o = queries·S + intra·u; S = S·decay + writes·u."""
    batch, key_heads, key_dim, value_dim = s["batch"], s["key_heads"], s["key_dim"], s["value_dim"]
    group = s["value_heads"] // key_heads
    lead = (batch, key_heads, group)
    shapes = [lead + (chunk, value_dim), lead + (chunk, key_dim), lead + (chunk, key_dim), lead + (chunk, chunk),
              lead + (key_dim, chunk), lead + (1, 1)]
    read = sequences[1] is not None
    sequences, shapes = zip(*[(x, shape) for x, shape in zip(sequences, shapes) if x is not None])

    def step(states, steps):
        (S,), steps = states, list(steps)
        values, reads = steps.pop(0), steps.pop(0) if read else None
        queries, intra, writes, decay = steps
        u = values if reads is None else b.op("Sub", [values, b.op("MatMul", [reads, S], f"{hint}/chunk_read")],
                                              f"{hint}/chunk_u")
        o = b.op("Add", [b.op("MatMul", [queries, S], f"{hint}/chunk_inter"),
                         b.op("MatMul", [intra, u], f"{hint}/chunk_intra")], f"{hint}/chunk_y")
        S = b.op("Add", [b.op("Mul", [S, decay], f"{hint}/chunk_kept"),
                         b.op("MatMul", [writes, u], f"{hint}/chunk_write")], f"{hint}/chunk_state")
        return [S], [o]

    (final,), (ys,) = scan_over_time(b, f"{hint}/chunks", [(past, lead + (key_dim, value_dim))],
                                     list(zip(sequences, shapes)), [lead + (chunk, value_dim)], step)
    return final, ys


def _unit_lower_inverse(b: Builder, k: str, cum: str, beta: str, chunk: int, key_dim: int, hint: str) -> str:
    """(I + L)⁻¹ [B, N, H_k, r, C, C], L_ij = β_i·exp(cum_i − cum_j)·k_i·k_j for j < i, by
    doubling: the inverses of the diagonal blocks of size s give those of size 2s as
    [[A⁻¹, 0], [−D⁻¹·L_21·A⁻¹, D⁻¹]] (L_21 from the keys of the two halves). Exact block
    substitution, six levels for C = 64: no loop, and as stable as forward substitution
    (a Neumann-series product is not, for correlated keys)."""
    ones = b.op("Expand", [b.const(np.ones((1, 1), np.float32), np.float32, "ones11"),
                           b.op("Concat", [b.op("Shape", [beta], f"{hint}/gates_shape"), b.i64([1, 1])],
                                f"{hint}/unit_blocks_shape", axis=0)], f"{hint}/unit_blocks")
    inverse, size = ones, 1                                                            # [B, N, H_k, r, C/s, s, s]
    while size < chunk:
        n = chunk // (2 * size)
        halves = {}
        for name, x, tail in (("k", k, [size, key_dim]), ("cum", cum, [size]), ("beta", beta, [size]),
                              ("inv", inverse, [size, size])):
            split = b.op("Reshape", [x, b.i64([0, 0, 0, 0, n, 2] + tail)], f"{hint}/{name}_halves{size}")
            halves[name] = [b.op("Slice", [split, b.i64([i]), b.i64([i + 1]), b.i64([5])], f"{hint}/{name}_{i}_{size}")
                            for i in (0, 1)]
        (k_lo, k_hi), (c_lo, c_hi), (_, beta_hi), (A, D) = (halves[n_] for n_ in ("k", "cum", "beta", "inv"))
        dots = b.op("MatMul", [k_hi, b.op("Transpose", [k_lo], f"{hint}/k_lo_t{size}", perm=[0, 1, 2, 3, 4, 5, 7, 6])],
                    f"{hint}/k_dots{size}")
        decay = b.op("Exp", [b.op("Sub", [b.op("Unsqueeze", [c_hi, b.i64([-1])], f"{hint}/c_hi{size}"),
                                          b.op("Unsqueeze", [c_lo, b.i64([-2])], f"{hint}/c_lo{size}")],
                                  f"{hint}/c_diff{size}")], f"{hint}/block_decay{size}")
        lower = b.op("Mul", [b.op("Mul", [dots, decay], f"{hint}/block_decayed{size}"),
                             b.op("Unsqueeze", [beta_hi, b.i64([-1])], f"{hint}/beta_hi{size}")], f"{hint}/block{size}")
        d_l = b.op("MatMul", [D, lower], f"{hint}/d_l{size}")
        corner = b.op("Neg", [b.op("MatMul", [d_l, A], f"{hint}/d_l_a{size}")], f"{hint}/corner{size}")
        zeros = b.op("Mul", [A, b.const(0.0, np.float32, "zero")], f"{hint}/zeros{size}")
        top = b.op("Concat", [A, zeros], f"{hint}/top{size}", axis=-1)
        bottom = b.op("Concat", [corner, D], f"{hint}/bottom{size}", axis=-1)
        doubled = b.op("Concat", [top, bottom], f"{hint}/doubled{size}", axis=-2)     # [.., n, 1, 2s, 2s]
        size *= 2
        inverse = b.op("Reshape", [doubled, b.i64([0, 0, 0, 0, n, size, size])], f"{hint}/inverse{size}")
    return b.op("Reshape", [inverse, b.i64([0, 0, 0, 0, chunk, chunk])], f"{hint}/inverse")


# ---- ssd's chunked form (Mamba-2's structured masked attention) ----------------------------------

def lower_ssd_portable(b: Builder, node: Node, outs: list[str]) -> None:
    """The portable ``ssd``: with ``chunk`` set, an ``If`` on the token count between the
    chunked form (T >= ``SSD_CHUNKED_FROM``, ``_ssd_chunked``) and the token Scan
    (``backends.onnx.ssm.ssd_token_scan``); without it the token Scan alone."""
    chunk, hint = node.attrs["chunk"], outs[0]
    if chunk is None:
        lower_ssd(b, node, outs)
        return
    s, past = ssd_scan_parts(b, node, hint)
    s.update(pads=chunk_padding(b, s["seq"], chunk), seq_length=b.dim(s["seq"]))  # made outside the If
    y4, final = by_length(b, s["seq"], SSD_CHUNKED_FROM, lambda: _ssd_chunked(b, s, past, hint, chunk),
                          lambda: ssd_token_scan(b, s, past, hint),
                          [(s["batch"], s["seq"], s["heads"], s["head_dim"]), s["grouped"]], hint)
    ssd_finish(b, node, outs, s, y4, final)


def _ssd_chunked(b: Builder, s: dict, past: str, hint: str, chunk: int) -> tuple[str, str]:
    """(y [B, T, H, P], final state [B, G, H/G, N, P]) in chunks of ``chunk`` tokens (T padded
    with frozen steps): ``irc.ops.ssm.chunked_ssd`` for every chunk at once, in the layout
    [B, N_c, G, H/G, C, ·] (C·Bᵀ once per group): Y = (C·Bᵀ ⊙ L)(Δ·x) + exp(cum)·C·h_in;
    a Scan over chunks only passes the state, h ← exp(cum_last)·h + Bᵀ·(exp(cum_last − cum)·Δ·x)."""
    groups, per_group, state, head_dim = s["groups"], s["heads"] // s["groups"], s["state"], s["head_dim"]

    def chunks(x, rank, tail, perm, role):
        padded = b.op("Pad", [x, s["pads"][rank]], f"{hint}/{role}_padded")
        shaped = b.op("Reshape", [padded, b.i64([0, -1, chunk] + tail)], f"{hint}/{role}_chunks")
        return b.op("Transpose", [shaped], f"{hint}/{role}_by_chunk", perm=perm)

    six, column = [0, 1, 3, 4, 2, 5], b.i64([-1])
    log_decay = chunks(s["log_decay"], 3, [groups, per_group], [0, 1, 3, 4, 2], "log_decay")  # [B, N_c, G, r, C]
    X = chunks(s["dx"], 4, [groups, per_group, head_dim], six, "delta_x")                       # [B, N_c, G, r, C, P]
    Bc, Cc = (chunks(s[n], 3, [groups, 1, state], six, n) for n in "BC")         # [B, N_c, G, 1, C, N]
    cum = b.op("CumSum", [log_decay, b.i64(-1)], f"{hint}/cum")
    last = b.op("Slice", [cum, b.i64([-1]), b.i64([INT64_MAX]), b.i64([-1])], f"{hint}/cum_last")
    B_t = b.op("Transpose", [Bc], f"{hint}/B_t", perm=[0, 1, 2, 3, 5, 4])                       # [B, N_c, G, 1, N, C]
    scores = b.op("Mul", [b.op("MatMul", [Cc, B_t], f"{hint}/scores"), decay_pairs(b, cum, chunk, hint)],
                  f"{hint}/masked_scores")                                                      # [B, N_c, G, r, C, C]
    within = b.op("MatMul", [scores, X], f"{hint}/within")
    to_end = b.op("Unsqueeze", [b.op("Exp", [b.op("Sub", [last, cum], f"{hint}/cum_rest")], f"{hint}/decay_to_end"),
                                column], f"{hint}/decay_to_end6")
    writes = b.op("MatMul", [B_t, b.op("Mul", [X, to_end], f"{hint}/x_to_end")], f"{hint}/writes")  # [.., r, N, P]
    chunk_decay = b.op("Unsqueeze", [b.op("Exp", [last], f"{hint}/chunk_decay"), column], f"{hint}/chunk_decay6")
    grouped = s["grouped"]

    def step(states, steps):
        (h,), (decay, written) = states, steps
        entering = b.op("Identity", [h], f"{hint}/chunk_entering")  # the state the chunk reads
        passed = b.op("Add", [b.op("Mul", [h, decay], f"{hint}/chunk_kept"), written], f"{hint}/chunk_state")
        return [passed], [entering]

    (final,), (entering,) = scan_over_time(b, f"{hint}/chunks", [(past, grouped)],
                                           [(chunk_decay, grouped[:3] + (1, 1)), (writes, grouped)], [grouped], step)
    from_start = b.op("Unsqueeze", [b.op("Exp", [cum], f"{hint}/decay_from_start"), column],
                      f"{hint}/decay_from_start6")
    carried = b.op("Mul", [b.op("MatMul", [Cc, entering], f"{hint}/read_state"), from_start], f"{hint}/carried")
    y = b.op("Transpose", [b.op("Add", [within, carried], f"{hint}/y_chunks")], f"{hint}/y_tokens",
             perm=[0, 1, 4, 2, 3, 5])
    y = b.op("Reshape", [y, b.i64([0, -1, s["heads"], head_dim])], f"{hint}/y_padded")
    return b.op("Slice", [y, b.i64([0]), s["seq_length"], b.i64([1])], f"{hint}/chunked_y"), final


# ---- onnx-ort -----------------------------------------------------------------------------------

def lower_gated_delta_rule_ort(b: Builder, node: Node, outs: list[str]) -> None:
    """``com.microsoft.LinearAttention`` (gated_delta; see the module docstring)."""
    hint = outs[0]
    s = _parts(b, node, hint)
    batch, seq, key_heads, key_dim, value_heads = s["batch"], s["seq"], s["key_heads"], s["key_dim"], s["value_heads"]
    keys = s["k"]
    if value_heads != key_heads:
        per_key = _view(b, keys, (batch, seq, key_heads, 1, key_dim), f"{hint}/k_groups")
        keys = b.op("Expand", [per_key, b.shape((batch, seq, key_heads, value_heads // key_heads, key_dim))],
                    f"{hint}/k_per_value_head")
    keys = _view(b, keys, (batch, seq, value_heads * key_dim), f"{hint}/keys")
    query = _view(b, s["q"], (batch, seq, key_heads * key_dim), f"{hint}/query")
    y, state = b.fresh(f"{hint}/y"), b.fresh(f"{hint}/present")
    inputs = [query, keys, s["v"], as_f32(b, s["o"]["past_state"]), s["g"]] + ([s["beta"]] if s["delta"] else [])
    b.node("LinearAttention", inputs, [y, state], domain=MS_DOMAIN, q_num_heads=key_heads, kv_num_heads=value_heads,
           update_rule=node.attrs["update_rule"], scale=s["scale"], chunk_size=node.attrs["chunk"])
    _present(b, node, outs, state)
    _out(b, node, outs, s, y)


LOWERINGS = {"gated_delta_rule": lower_gated_delta_rule, "ssd": lower_ssd_portable}
ORT_OVERRIDES = {"gated_delta_rule": lower_gated_delta_rule_ort}
