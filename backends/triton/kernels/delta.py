"""The gated delta rule (``irc.ops.delta.gated_delta_rule``): a sequential scan for decode
(every form), and the chunked form for prefill with a per-head decay.

Per batch row b and value head h (key head h // (H_v/H_k); state S [d_k, d_v]; q̂, k̂
L2-normalised in the kernel when ``L2_NORM``, q̂ scaled):

- ``delta_scan``: one token at a time, S of a d_v block in registers: S = exp(g) S (g per
  head, or per key channel: a row of S), then S += k̂ ⊗ β (v - Sᵀk̂) (the gated rule:
  S += k̂ ⊗ v), o = Sᵀ q̂. Decode (T = 1), unchunked prefills, and ``decay="channel"``
  (its pair decays exp(cum_i - cum_j) differ per key channel: no [L, L] matrix to multiply).
- chunked (chunk L; cum the in-chunk cumulative log decay; a padded token g = β = 0),
  as ``irc.ops.delta.chunked_gated_delta_rule``:
  1. ``delta_chunk_solve`` (the delta rule only; parallel over chunks): the inverse of the
     unit-lower-triangular I + A, A_ij = β_i (k̂_i · k̂_j) exp(cum_i - cum_j) (j < i), by
     forward substitution, one row per step (the WY / UT transform);
  2. ``delta_chunk_scan`` (sequential over chunks; a d_v block per program): the
     corrections U = T⁻¹(β V) - T⁻¹(β exp(cum) K̂) S (the gated rule: U = β V), the output
     O = (exp(cum) Q̂) S + ((Q̂ K̂ᵀ) ⊙ L) U, and S = exp(cum_L) S + (exp(cum_L - cum) K̂)ᵀ U:
     matmuls with tiles of at least 16 (tensor cores with MIXED on).
"""
from __future__ import annotations

from irc.dtypes import DType

from backends.triton.kernels import Kernel, mixed_type
from backends.triton.kernels.recurrent import jit_kernel, pointers, product, sigmoid, softplus

SCALARS = {"T": "i32", "KEY_HEADS": "i32", "VALUE_HEADS": "i32", "KEY_DIM": "i32", "VALUE_DIM": "i32",
           "scale": "fp32"}
FLAGS = {"HAS_A": "constexpr", "HAS_BIAS": "constexpr", "HAS_PAST": "constexpr", "L2_NORM": "constexpr",
         "DELTA": "constexpr", "CHANNEL": "constexpr", "BLOCK_K": "constexpr", "BLOCK_V": "constexpr"}
CHUNKED = {"CHUNKS": "i32", "CHUNK": "constexpr", "BLOCK_L": "constexpr", "PRECISION": "constexpr",
           "MIXED": "constexpr"}
COMPILE_SIZES = {"HAS_A": True, "HAS_BIAS": True, "HAS_PAST": True, "L2_NORM": True, "DELTA": True,
                 "CHANNEL": False, "BLOCK_K": 32, "BLOCK_V": 32, "CHUNK": 32, "BLOCK_L": 32, "PRECISION": "ieee",
                 "MIXED": False}


STORE_STATE = "tl.store(present_ptr + state, S.to(present_ptr.dtype.element_ty), mask=tile_ok)"


def _operands(x: DType, weight: DType, state: DType, *names: str) -> dict:
    kinds = {"q": x, "k": x, "v": x, "a": x, "b": x, "a_log": weight, "bias": weight, "real": DType.f32,
             "solve": DType.f32, "past": state, "present": state, "o": x}
    return pointers(**{name: kinds[name] for name in names})


def _head(v_axis: int) -> list[str]:
    return ["pid = tl.program_id(0)",
            "b = pid // VALUE_HEADS",
            "h = pid % VALUE_HEADS",
            "kh = h // (VALUE_HEADS // KEY_HEADS)",
            "kd = tl.arange(0, BLOCK_K)",
            f"vd = tl.program_id({v_axis}) * BLOCK_V + tl.arange(0, BLOCK_V)",
            "k_ok = kd < KEY_DIM",
            "v_ok = vd < VALUE_DIM",
            "tile_ok = k_ok[:, None] & v_ok[None, :]",
            "state = ((b * VALUE_HEADS + h) * KEY_DIM + kd[:, None]) * VALUE_DIM + vd[None, :]",
            "rate = tl.exp(tl.load(a_log_ptr + h).to(tl.float32))"]


def _load_state() -> list[str]:
    return ["if HAS_PAST:",
            "    S = tl.load(past_ptr + state, mask=tile_ok, other=0.0).to(tl.float32)",
            "else:",
            "    S = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)"]


def _normed(var: str, axis: int, scaled: bool) -> list[str]:
    lines = ["if L2_NORM:",
             f"    {var} = {var} / tl.sqrt_rn(tl.sum({var} * {var}, axis={axis}) + 1e-6)"
             + ("[:, None]" if axis == 1 else "")]
    return lines + ([f"{var} = {var} * scale"] if scaled else [])


def scan_kernel(name: str, x: DType, weight: DType, state: DType) -> Kernel:
    sig = {**_operands(x, weight, state, "q", "k", "v", "a", "b", "a_log", "bias", "real", "past", "present", "o"),
           **SCALARS, **FLAGS}
    decay = ["if HAS_A:",
             "    if CHANNEL:",
             "        raw = tl.load(a_ptr + (row * VALUE_HEADS + h) * KEY_DIM + kd, mask=k_ok, "
             "other=0.0).to(tl.float32)",
             "        if HAS_BIAS:",
             "            raw += tl.load(bias_ptr + h * KEY_DIM + kd, mask=k_ok, other=0.0).to(tl.float32)",
             "    else:",
             "        raw = tl.zeros([BLOCK_K], dtype=tl.float32) + "
             "tl.load(a_ptr + row * VALUE_HEADS + h).to(tl.float32)",
             "        if HAS_BIAS:",
             "            raw += tl.load(bias_ptr + h).to(tl.float32)",
             f"    g = -rate * {softplus('raw')}",
             "else:",
             "    g = tl.zeros([BLOCK_K], dtype=tl.float32) - rate",
             "g = tl.where(real, g, 0.0)",
             "if DELTA:",
             f"    beta = tl.where(real, {sigmoid('tl.load(b_ptr + row * VALUE_HEADS + h).to(tl.float32)')}, 0.0)",
             "else:",
             "    beta = tl.where(real, 1.0, 0.0)"]
    step = ["row = b * T + t",
            "real = tl.load(real_ptr + row) != 0",
            "qv = tl.load(q_ptr + (row * KEY_HEADS + kh) * KEY_DIM + kd, mask=k_ok, other=0.0).to(tl.float32)",
            "kv = tl.load(k_ptr + (row * KEY_HEADS + kh) * KEY_DIM + kd, mask=k_ok, other=0.0).to(tl.float32)",
            *_normed("qv", 0, True), *_normed("kv", 0, False),
            "vv = tl.load(v_ptr + (row * VALUE_HEADS + h) * VALUE_DIM + vd, mask=v_ok, other=0.0).to(tl.float32)",
            *decay,
            "S = S * tl.exp(g)[:, None]",
            "if DELTA:",
            "    vv = vv - tl.sum(S * kv[:, None], axis=0)",
            "S = S + kv[:, None] * (vv * beta)[None, :]",
            "ov = tl.sum(S * qv[:, None], axis=0)",
            "tl.store(o_ptr + (row * VALUE_HEADS + h) * VALUE_DIM + vd,",
            "         tl.where(real, ov, 0.0).to(o_ptr.dtype.element_ty), mask=v_ok)"]
    body = _head(1) + _load_state() + ["for t in range(T):", *["    " + line for line in step], STORE_STATE]
    details = ["q, k [B, T, H_k*d_k]; v, o [B, T, H_v*d_v]; a [B, T, H_v] or [B, T, H_v*d_k] (CHANNEL); b [B, T, H_v];",
               "past, present [B, H_v, d_k, d_v]. Programs: (B*H_v, d_v blocks); a loop over the T tokens."]
    return jit_kernel(name, "delta", "Gated delta rule, one token at a time (decode, unchunked prefill).", details,
                      sig, body, {k: COMPILE_SIZES[k] for k in FLAGS})


def _chunk_steps() -> list[str]:
    """Chunk c's rows: the padding mask, β, the cumulative log decay (per head) and K̂ [L, d_k]."""
    return ["i = tl.arange(0, BLOCK_L)",
            "t = c * CHUNK + i",
            "t_ok = (i < CHUNK) & (t < T)",
            "row = b * T + t",
            "real = tl.load(real_ptr + row, mask=t_ok, other=0.0) != 0",
            "if HAS_A:",
            "    raw = tl.load(a_ptr + row * VALUE_HEADS + h, mask=t_ok, other=0.0).to(tl.float32)",
            "    if HAS_BIAS:",
            "        raw += tl.load(bias_ptr + h).to(tl.float32)",
            f"    g = -rate * {softplus('raw')}",
            "else:",
            "    g = tl.zeros([BLOCK_L], dtype=tl.float32) - rate",
            "g = tl.where(real, g, 0.0)",
            "if DELTA:",
            "    raw_b = tl.load(b_ptr + row * VALUE_HEADS + h, mask=t_ok, other=0.0).to(tl.float32)",
            f"    beta = tl.where(real, {sigmoid('raw_b')}, 0.0)",
            "else:",
            "    beta = tl.where(real, 1.0, 0.0)",
            "cum = tl.cumsum(g, axis=0)",
            "rows_k = t_ok[:, None] & k_ok[None, :]",
            "kt = tl.load(k_ptr + ((row * KEY_HEADS + kh) * KEY_DIM)[:, None] + kd[None, :], mask=rows_k, "
            "other=0.0).to(tl.float32)",
            *_normed("kt", 1, False)]


def chunk_solve_kernel(name: str, x: DType, weight: DType) -> Kernel:
    sig = {**_operands(x, weight, x, "k", "a", "b", "a_log", "bias", "real", "solve"), **SCALARS, **FLAGS, **CHUNKED}
    mix = mixed_type(x)
    body = _head(1)[:5] + ["k_ok = kd < KEY_DIM", "rate = tl.exp(tl.load(a_log_ptr + h).to(tl.float32))",
                           "c = tl.program_id(1)", "slot = pid * CHUNKS + c"] + _chunk_steps() + [
        *product("gram", "kt", "tl.trans(kt)", "BLOCK_L, BLOCK_L", mix),
        "strict = i[:, None] > i[None, :]",
        "pair = tl.exp(tl.where(strict, cum[:, None] - cum[None, :], 0.0))",
        "lower = tl.where(strict, gram * pair, 0.0) * beta[:, None]",
        "inverse = (i[:, None] == i[None, :]).to(tl.float32)",
        "for r in range(1, BLOCK_L):  # row r of (I + lower)^-1 from the rows above it",
        "    lower_r = tl.sum(tl.where(i[:, None] == r, lower, 0.0), axis=0)",
        "    update = tl.sum(lower_r[:, None] * inverse, axis=0)",
        "    inverse = tl.where(i[:, None] == r, inverse - update[None, :], inverse)",
        "tl.store(solve_ptr + (slot * BLOCK_L + i[:, None]) * BLOCK_L + i[None, :], inverse)"]
    details = ["solve [B, H_v, CHUNKS, BLOCK_L, BLOCK_L] fp32: (I + A)^-1 per chunk (padded rows: identity).",
               "Programs: (B*H_v, CHUNKS)."]
    return jit_kernel(name, "delta", "Gated delta rule: the chunk's unit-lower-triangular solve.", details, sig,
                      body, {k: COMPILE_SIZES[k] for k in sig if sig[k] == "constexpr"}, tensor_cores=True)


def chunk_scan_kernel(name: str, x: DType, weight: DType, state: DType) -> Kernel:
    sig = {**_operands(x, weight, state, "q", "k", "v", "a", "b", "a_log", "bias", "real", "solve", "past",
                       "present", "o"), **SCALARS, **FLAGS, **CHUNKED}
    mix = mixed_type(x)
    step = ["slot = pid * CHUNKS + c", *_chunk_steps(),
            "qt = tl.load(q_ptr + ((row * KEY_HEADS + kh) * KEY_DIM)[:, None] + kd[None, :], mask=rows_k, "
            "other=0.0).to(tl.float32)",
            *_normed("qt", 1, True),
            "vt = tl.load(v_ptr + ((row * VALUE_HEADS + h) * VALUE_DIM)[:, None] + vd[None, :], "
            "mask=t_ok[:, None] & v_ok[None, :], other=0.0).to(tl.float32)",
            "last = tl.sum(g, axis=0)",
            "if DELTA:",
            "    solve = tl.load(solve_ptr + (slot * BLOCK_L + i[:, None]) * BLOCK_L + i[None, :])",
            *["    " + line for line in product("fresh", "solve", "vt * beta[:, None]", "BLOCK_L, BLOCK_V", mix)],
            *["    " + line for line in product("w", "solve", "kt * (beta * tl.exp(cum))[:, None]", "BLOCK_L, BLOCK_K",
                                              mix)],
            *["    " + line for line in product("recalled", "w", "S", "BLOCK_L, BLOCK_V", mix)],
            "    fresh = fresh - recalled",
            "else:",
            "    fresh = vt * beta[:, None]",
            *product("scores", "qt", "tl.trans(kt)", "BLOCK_L, BLOCK_L", mix),
            "causal = i[:, None] >= i[None, :]",
            "scores = tl.where(causal, scores * tl.exp(tl.where(causal, cum[:, None] - cum[None, :], 0.0)), 0.0)",
            *product("ot", "qt * tl.exp(cum)[:, None]", "S", "BLOCK_L, BLOCK_V", mix),
            *product("ot", "scores", "fresh", "BLOCK_L, BLOCK_V", mix)[1:],
            "tl.store(o_ptr + ((row * VALUE_HEADS + h) * VALUE_DIM)[:, None] + vd[None, :],",
            "         tl.where(real[:, None], ot, 0.0).to(o_ptr.dtype.element_ty), mask=t_ok[:, None] & v_ok[None, :])",
            *product("written", "tl.trans(kt * tl.exp(last - cum)[:, None])", "fresh", "BLOCK_K, BLOCK_V", mix),
            "S = S * tl.exp(last) + written"]
    body = _head(1) + _load_state() + ["for c in range(CHUNKS):", *["    " + line for line in step], STORE_STATE]
    details = ["Per chunk: U = T^-1 (beta V) - T^-1 (beta exp(cum) K) S (gated rule: beta V); O = (exp(cum) Q) S",
               "+ ((Q K^T) * L) U; S = exp(cum_L) S + (exp(cum_L - cum) K)^T U. Programs: (B*H_v, d_v blocks)."]
    return jit_kernel(name, "delta", "Gated delta rule, chunked (matmuls per chunk, state carried).", details, sig,
                      body, {k: COMPILE_SIZES[k] for k in sig if sig[k] == "constexpr"}, tensor_cores=True)


def launcher(scan: str, chunked: tuple | None) -> str:
    """``launch_delta``: the scan kernel for T <= 1, without a chunk size, or with a decay per
    key channel; else the chunked kernels (``chunked`` = (solve, scan) names; None: none in
    the module)."""
    lines = [
        "def launch_delta(q, k, v, a, b, A_log, dt_bias, past_state, attention_mask, *, key_heads, value_heads,",
        "                 key_dim, value_dim, l2_norm, scale, update_rule, decay, chunk=None):",
        '    """irc.ops.delta.gated_delta_rule: (o [B, T, H_v*d_v] in v\'s dtype, present state',
        "    [B, H_v, d_k, d_v] in the past state's dtype (v's without one)). A prefill with ``chunk``",
        "    set and a per-head decay runs chunked; a per-channel decay always runs the scan (its",
        '    in-chunk pair decays differ per key channel: no [L, L] matrix for the matmul form)."""',
        "    batch, seq = q.shape[:2]",
        "    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()",
        "    real = ssm_new_tokens(attention_mask, batch, seq).to(torch.float32)",
        "    o = torch.empty_like(v)",
        "    present = torch.empty((batch, value_heads, key_dim, value_dim), device=v.device,",
        "                          dtype=v.dtype if past_state is None else past_state.dtype)",
        "    block_v = min(triton.next_power_of_2(max(value_dim, 16)), 64)",
        "    flags = dict(HAS_A=a is not None, HAS_BIAS=dt_bias is not None, HAS_PAST=past_state is not None,",
        '                 L2_NORM=l2_norm, DELTA=update_rule == "gated_delta", CHANNEL=decay == "channel",',
        "                 BLOCK_K=triton.next_power_of_2(max(key_dim, 16)), BLOCK_V=block_v)",
        "    a = A_log if a is None else a.contiguous()",
        "    b = A_log if b is None else b.contiguous()",
        "    dt_bias = A_log if dt_bias is None else dt_bias",
        "    past = present if past_state is None else past_state.contiguous()",
        "    scale = float(key_dim ** -0.5 if scale is None else scale)",
        "    sizes = (seq, key_heads, value_heads, key_dim, value_dim, scale)",
        "    grid = (batch * value_heads, triton.cdiv(value_dim, block_v))",
        '    if chunk is not None and seq > 1 and decay == "head":']
    if chunked is None:
        lines += ['        raise RuntimeError("this module was generated without the chunked delta-rule kernels")']
    else:
        solve, scan_chunks = chunked
        lines += [
            "        chunks, block_l = triton.cdiv(seq, chunk), triton.next_power_of_2(max(chunk, 16))",
            "        tiles = dict(CHUNKS=chunks, CHUNK=chunk, BLOCK_L=block_l, PRECISION=DOT_PRECISION,",
            "                     MIXED=MIXED_DOT)",
            "        solve = real",
            '        if flags["DELTA"]:  # the gated rule writes beta v as it is: no solve',
            "            solve = torch.empty((batch, value_heads, chunks, block_l, block_l), device=v.device,",
            "                                dtype=torch.float32)",
            f"            {solve}[(batch * value_heads, chunks)](k, a, b, A_log, dt_bias, real, solve, *sizes,",
            "                **flags, **tiles)",
            f"        {scan_chunks}[grid](q, k, v, a, b, A_log, dt_bias, real, solve, past, present, o, *sizes,",
            "            **flags, **tiles)",
            "        return o, present"]
    lines += [f"    {scan}[grid](q, k, v, a, b, A_log, dt_bias, real, past, present, o, *sizes, **flags)",
              "    return o, present"]
    return "\n".join(lines)
