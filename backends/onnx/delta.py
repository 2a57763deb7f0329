"""The gated delta rule (``irc.ops.delta``) in ONNX, for both targets.

Shared by both: float32 inside; q and k L2-normalised per head (x / sqrt(Σx² + 1e-6)), q
times the scale; the log decay g = -exp(A_log)·softplus(a + dt_bias) and β = sigmoid(b),
both set to 0 at padded tokens (``backends.onnx.ssm.real_tokens``: the step is frozen,
decay 1 and no write), and the output of a padded token set to 0. The state is the
graph's ``past_key_values.{i}.recurrent_state`` [B, H_v, d_k, d_v], key-major.

- onnx-ort: ``com.microsoft.LinearAttention`` with ``update_rule="gated_delta"``,
  ``q_num_heads`` = H_k and ``kv_num_heads`` = H_v (its "inverse GQA": value head h reads
  query head h // (H_v / H_k), Qwen's sharing), k expanded to the H_v heads, decay g and β
  [B, T, H_v], and the scale set explicitly (d_k^-0.5 unless the op says otherwise). Its
  CPU kernel (``chunk_size``, default 64, is a tuning hint) is the fastest form here at
  every length (below).
- portable, standard ops only: prompts (T >= ``CHUNKED_FROM``) run the chunked form of
  ``irc.ops.delta.chunked_gated_delta_rule`` and transformers' ``torch_chunk_gated_delta_rule``
  (chunks of 64 tokens, T padded with frozen steps); shorter inputs, decode steps among
  them, run a standard ``Scan`` over tokens; an ``If`` on T picks one at run time. The chunked form computes for
  every chunk at once the intra-chunk scores, the decays and the inverse of the chunk's
  unit-lower-triangular write system (standard ONNX has no triangular solve: the inverse is
  built by doubling blocks, six levels of small matmuls, exact block substitution), then a
  ``Scan`` over chunks carries the state with four matmuls a chunk. The token Scan works on
  the state viewed as [B, H_k, H_v/H_k, d_k, d_v], so q and k are never repeated. Measured
  on ONNX Runtime's CPU provider, the op alone at Qwen3-Next's shape (16 key / 32 value
  heads of 128 x 128, batch 1, random state, 2 threads, medians of 7 interleaved rounds on a
  quiet machine, ms):

      T                       1      8     16     64    128   1,024
      LinearAttention (ort)   0.41   2.0    3.6    8.4   12.2    66
      chunked (portable)      1.16   7.0   11.7   12.9   20.3   120
      token Scan (portable)   0.95   6.3   11.2   26.4   48.4   385

  The two portable forms cross near 16 tokens (``CHUNKED_FROM``); from there the chunked
  form is 2.0x (64 tokens) to 3.2x (1,024) the token Scan's speed, at 1.5-1.8x
  LinearAttention's time. A decode step runs the token Scan behind the ``If``, which costs
  ~0.2 ms a layer. ``lower_gated_delta_rule(chunk=None)`` builds the token Scan alone.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from onnx import TensorProto, helper

from irc.graph import Node
from irc.ops.delta import L2_EPS, OPERANDS
from irc.ops.registry import by_name

from backends.onnx.builder import INT64_MAX, MS_DOMAIN, Builder, dim_param
from backends.onnx.ssm import _finish, _present, _target, _zeros, as_f32, masked, real_tokens, scan_over_time

CHUNK = 64          # tokens a chunk (transformers' and fla's)
CHUNKED_FROM = 16   # the token count from which the portable target runs the chunked form (measured)


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


def lower_gated_delta_rule(b: Builder, node: Node, outs: list[str], chunk: Optional[int] = CHUNK,
                           chunked_from: int = CHUNKED_FROM) -> None:
    """The portable lowering (module docstring): an ``If`` on the token count between the
    chunked form (T >= ``chunked_from``) and the token Scan; ``chunk`` None builds the
    token Scan alone."""
    hint = outs[0]
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
        shapes, chunk_shapes = _token_shapes(b, s, out_shape), _chunk_shapes(b, s, chunk)  # made outside the If
        many = b.op("GreaterOrEqual", [b.dim(s["seq"]), b.i64([chunked_from])], f"{hint}/chunked")
        branches = {"then_branch": lambda: _chunked(b, s, past, hint, chunk, chunk_shapes),
                    "else_branch": lambda: _token_scan(b, s, past, hint, shapes)}
        graphs = {key: _branch(b, f"{hint}/{key}", build, [out_shape, grouped]) for key, build in branches.items()}
        y, final = b.fresh(f"{hint}/y"), b.fresh(f"{hint}/final")
        b.node("If", [many], [y, final], **graphs)
    _present(b, node, outs, _view(b, final, (batch, s["value_heads"], key_dim, value_dim), f"{hint}/final_state"))
    _out(b, node, outs, s, y)


def _branch(b: Builder, name: str, build, shapes: list):
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
    seq = b.dim(s["seq"])
    pad = b.op("Mod", [b.op("Sub", [b.i64([chunk]), b.op("Mod", [seq, b.i64([chunk])], "delta/seq_mod")],
                            "delta/pad_rest"), b.i64([chunk])], "delta/pad")
    return {"seq": seq, "pads4": b.op("Concat", [b.i64([0] * 5), pad, b.i64([0, 0])], "delta/pads4", axis=0),
            "pads3": b.op("Concat", [b.i64([0] * 4), pad, b.i64([0])], "delta/pads3", axis=0),
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
    column, row = b.i64([-1]), b.i64([-2])
    diff = b.op("Sub", [b.op("Unsqueeze", [cum, column], f"{hint}/cum_i"),
                        b.op("Unsqueeze", [cum, row], f"{hint}/cum_j")], f"{hint}/cum_diff")  # cum_i - cum_j
    causal = b.const(np.tril(np.ones((chunk, chunk), np.float32)), np.float32, f"causal{chunk}")
    pair = b.op("Mul", [b.op("Exp", [b.op("Min", [diff, b.const(0.0, np.float32, "zero")], f"{hint}/cum_diff_le0")],
                             f"{hint}/pair_decay"), causal], f"{hint}/pair")
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
           update_rule=node.attrs["update_rule"], scale=s["scale"])
    _present(b, node, outs, state)
    _out(b, node, outs, s, y)


LOWERINGS = {"gated_delta_rule": lower_gated_delta_rule}
ORT_OVERRIDES = {"gated_delta_rule": lower_gated_delta_rule_ort}
