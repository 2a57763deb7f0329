"""Mamba-2's SSD (``irc.ops.ssm.ssd``): a sequential scan for decode, and the chunked form
for prefill, split as Mamba-2's and TensorRT-LLM's kernels split it.

Per batch row b and head h (scalar decay a_t = Δ_t·A, A = -exp(A_log); head h reads group
g = h // (H/G) of B and C; state [N, P], N = state_size, P = head_dim):

- ``ssd_scan``: one token at a time, the state of a P-block in registers:
  h = exp(a_t) h + B_t ⊗ Δ_t x_t, y_t = C_t · h + D x_t. Decode (T = 1) and prefills of
  nodes without a ``chunk`` attribute.
- chunked (chunk L, cum_i the in-chunk cumulative sum of a, padded tokens a = 0):
  1. ``ssd_chunk_state`` (parallel over chunks): S_c = Bᵀ (exp(cum_L - cum) Δ ⊙ X), a matmul
     [N, L] x [L, P], and the chunk's total log decay cum_L;
  2. ``ssd_state_passing`` (sequential over chunks): the state entering chunk c,
     h_c = exp(cum_L(c-1)) h_{c-1} + S_{c-1} from the past state; the last is the present;
  3. ``ssd_chunk_scan`` (parallel over chunks): Y = ((C Bᵀ) ⊙ L ⊙ Δ) X + exp(cum) ⊙ (C h_c)
     + D X with L_ij = exp(cum_i - cum_j) for j <= i: three matmuls.

The chunked kernels' tl.dot tiles are at least 16 on each side (BLOCK_L, BLOCK_N, BLOCK_P
padded up), so they take tensor cores with the MIXED constexpr on (16-bit operands).
"""
from __future__ import annotations

from irc.dtypes import DType

from backends.triton.kernels import Kernel, mixed_type
from backends.triton.kernels.recurrent import jit_kernel, pointers, product, softplus

SCALARS = {"T": "i32", "HEADS": "i32", "HEAD_DIM": "i32", "GROUPS": "i32", "STATE": "i32", "dt_min": "fp32",
           "dt_max": "fp32"}
FLAGS = {"HAS_D": "constexpr", "HAS_BIAS": "constexpr", "HAS_PAST": "constexpr", "BLOCK_N": "constexpr",
         "BLOCK_P": "constexpr"}
CHUNKED = {"CHUNKS": "i32", "CHUNK": "constexpr", "BLOCK_L": "constexpr", "PRECISION": "constexpr",
           "MIXED": "constexpr"}
COMPILE_SIZES = {"HAS_D": True, "HAS_BIAS": True, "HAS_PAST": True, "BLOCK_N": 32, "BLOCK_P": 32, "CHUNK": 32,
                 "BLOCK_L": 32, "PRECISION": "ieee", "MIXED": False}


def _head(chunk_axis: bool) -> list[str]:
    """Program ids, the head's group, index vectors and the head's scalars."""
    p_axis = 2 if chunk_axis else 1
    lines = ["pid = tl.program_id(0)",
             "b = pid // HEADS",
             "h = pid % HEADS",
             "g = h // (HEADS // GROUPS)",
             "n = tl.arange(0, BLOCK_N)",
             f"p = tl.program_id({p_axis}) * BLOCK_P + tl.arange(0, BLOCK_P)",
             "n_ok = n < STATE",
             "p_ok = p < HEAD_DIM",
             "tile_ok = n_ok[:, None] & p_ok[None, :]",
             "A = -tl.exp(tl.load(a_log_ptr + h).to(tl.float32))",
             "bias = 0.0",
             "if HAS_BIAS:",
             "    bias = tl.load(bias_ptr + h).to(tl.float32)"]
    if chunk_axis:
        lines += ["c = tl.program_id(1)", "slot = pid * CHUNKS + c"]
    return lines


def _chunk_steps() -> list[str]:
    """Δ, the padding mask and the in-chunk cumulative log decay of chunk c's BLOCK_L rows."""
    return ["i = tl.arange(0, BLOCK_L)",
            "t = c * CHUNK + i",
            "t_ok = (i < CHUNK) & (t < T)",
            "row = b * T + t",
            "real = tl.load(real_ptr + row, mask=t_ok, other=0.0) != 0",
            "raw = tl.load(dt_ptr + row * HEADS + h, mask=t_ok, other=0.0).to(tl.float32) + bias",
            f"delta = tl.where(real, tl.minimum(tl.maximum({softplus('raw')}, dt_min), dt_max), 0.0)",
            "cum = tl.cumsum(delta * A, axis=0)",
            "total = tl.sum(delta * A, axis=0)",
            "rows_n = t_ok[:, None] & n_ok[None, :]",
            "bt = tl.load(b_ptr + ((row * GROUPS + g) * STATE)[:, None] + n[None, :], mask=rows_n, "
            "other=0.0).to(tl.float32)",
            "xt = tl.load(x_ptr + ((row * HEADS + h) * HEAD_DIM)[:, None] + p[None, :], "
            "mask=real[:, None] & p_ok[None, :], other=0.0).to(tl.float32)"]


def scan_kernel(name: str, x: DType, weight: DType, state: DType) -> Kernel:
    sig = {**pointers(x=x, dt=x, a_log=weight, b=x, c=x, d=weight, bias=weight, real=DType.f32, past=state,
                      present=state, y=x), **SCALARS, **FLAGS}
    body = _head(False) + [
        "state = ((b * HEADS + h) * STATE + n[:, None]) * HEAD_DIM + p[None, :]",
        "if HAS_PAST:",
        "    hs = tl.load(past_ptr + state, mask=tile_ok, other=0.0).to(tl.float32)",
        "else:",
        "    hs = tl.zeros([BLOCK_N, BLOCK_P], dtype=tl.float32)",
        "skip = 0.0",
        "if HAS_D:",
        "    skip = tl.load(d_ptr + h).to(tl.float32)",
        "for t in range(T):",
        "    row = b * T + t",
        "    real = tl.load(real_ptr + row) != 0",
        "    raw = tl.load(dt_ptr + row * HEADS + h).to(tl.float32) + bias",
        f"    delta = tl.where(real, tl.minimum(tl.maximum({softplus('raw')}, dt_min), dt_max), 0.0)",
        "    xv = tl.load(x_ptr + (row * HEADS + h) * HEAD_DIM + p, mask=p_ok, other=0.0).to(tl.float32)",
        "    xv = tl.where(real, xv, 0.0)",
        "    bv = tl.load(b_ptr + (row * GROUPS + g) * STATE + n, mask=n_ok, other=0.0).to(tl.float32)",
        "    cv = tl.load(c_ptr + (row * GROUPS + g) * STATE + n, mask=n_ok, other=0.0).to(tl.float32)",
        "    hs = tl.exp(delta * A) * hs + bv[:, None] * (delta * xv)[None, :]",
        "    yv = tl.sum(cv[:, None] * hs, axis=0) + skip * xv",
        "    tl.store(y_ptr + (row * HEADS + h) * HEAD_DIM + p, tl.where(real, yv, 0.0).to(y_ptr.dtype.element_ty), "
        "mask=p_ok)",
        "tl.store(present_ptr + state, hs.to(present_ptr.dtype.element_ty), mask=tile_ok)"]
    details = ["x, y [B, T, H*P]; dt [B, T, H]; B, C [B, T, G*N]; past, present [B, H, N, P].",
               "Programs: (B*H, P blocks); a loop over the T tokens (decode: T = 1)."]
    return jit_kernel(name, "ssd", "Mamba-2 SSD, one token at a time (decode, unchunked prefill).", details, sig,
                      body, {k: COMPILE_SIZES[k] for k in FLAGS})


def chunk_state_kernel(name: str, x: DType, weight: DType) -> Kernel:
    sig = {**pointers(x=x, dt=x, a_log=weight, b=x, bias=weight, real=DType.f32, states=DType.f32,
                      totals=DType.f32), **SCALARS, **FLAGS, **CHUNKED}
    mix = mixed_type(x)
    body = _head(True) + _chunk_steps() + [
        "xw = xt * (tl.exp(total - cum) * delta)[:, None]",
        *product("acc", "tl.trans(bt)", "xw", "BLOCK_N, BLOCK_P", mix),
        "tl.store(states_ptr + (slot * STATE + n[:, None]) * HEAD_DIM + p[None, :], acc, mask=tile_ok)",
        "if tl.program_id(2) == 0:",
        "    tl.store(totals_ptr + slot, total)"]
    details = ["states [B, H, CHUNKS, N, P] fp32: S_c = B^T (exp(cum_L - cum) delta x) per chunk;",
               "totals [B, H, CHUNKS] fp32: the chunk's summed log decay. Programs: (B*H, CHUNKS, P blocks)."]
    return jit_kernel(name, "ssd", "Mamba-2 SSD chunk states (a matmul per chunk).", details, sig, body,
                      {k: COMPILE_SIZES[k] for k in sig if sig[k] == "constexpr"}, tensor_cores=True)


def state_passing_kernel(name: str, state: DType) -> Kernel:
    sig = {**pointers(states=DType.f32, totals=DType.f32, past=state, entering=DType.f32, present=state),
           "HEAD_DIM": "i32", "STATE": "i32", "CHUNKS": "i32", "HAS_PAST": "constexpr", "BLOCK_N": "constexpr",
           "BLOCK_P": "constexpr"}
    body = ["pid = tl.program_id(0)",
            "n = tl.arange(0, BLOCK_N)",
            "p = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)",
            "tile_ok = (n < STATE)[:, None] & (p < HEAD_DIM)[None, :]",
            "tile = n[:, None] * HEAD_DIM + p[None, :]",
            "if HAS_PAST:",
            "    hs = tl.load(past_ptr + pid * STATE * HEAD_DIM + tile, mask=tile_ok, other=0.0).to(tl.float32)",
            "else:",
            "    hs = tl.zeros([BLOCK_N, BLOCK_P], dtype=tl.float32)",
            "for c in range(CHUNKS):",
            "    slot = pid * CHUNKS + c",
            "    tl.store(entering_ptr + slot * STATE * HEAD_DIM + tile, hs, mask=tile_ok)",
            "    chunk_state = tl.load(states_ptr + slot * STATE * HEAD_DIM + tile, mask=tile_ok, other=0.0)",
            "    hs = tl.exp(tl.load(totals_ptr + slot)) * hs + chunk_state",
            "tl.store(present_ptr + pid * STATE * HEAD_DIM + tile, hs.to(present_ptr.dtype.element_ty), mask=tile_ok)"]
    details = ["entering [B, H, CHUNKS, N, P] fp32: the state before each chunk; present [B, H, N, P].",
               "Programs: (B*H, P blocks); sequential over the chunks."]
    return jit_kernel(name, "ssd", "Mamba-2 SSD state passing between chunks.", details, sig, body,
                      {"HAS_PAST": True, "BLOCK_N": 32, "BLOCK_P": 32})


def chunk_scan_kernel(name: str, x: DType, weight: DType) -> Kernel:
    sig = {**pointers(x=x, dt=x, a_log=weight, b=x, c=x, d=weight, bias=weight, real=DType.f32,
                      entering=DType.f32, y=x), **SCALARS, **FLAGS, **CHUNKED}
    mix = mixed_type(x)
    body = _head(True) + _chunk_steps() + [
        "ct = tl.load(c_ptr + ((row * GROUPS + g) * STATE)[:, None] + n[None, :], mask=rows_n, "
        "other=0.0).to(tl.float32)",
        *product("scores", "ct", "tl.trans(bt)", "BLOCK_L, BLOCK_L", mix),
        "causal = i[:, None] >= i[None, :]",
        "decay = tl.exp(tl.where(causal, cum[:, None] - cum[None, :], 0.0))",
        "scores = tl.where(causal, scores * decay, 0.0) * delta[None, :]",
        *product("yt", "scores", "xt", "BLOCK_L, BLOCK_P", mix),
        "h_in = tl.load(entering_ptr + (slot * STATE + n[:, None]) * HEAD_DIM + p[None, :], mask=tile_ok, "
        "other=0.0)",
        *product("carried", "ct", "h_in", "BLOCK_L, BLOCK_P", mix),
        "yt = yt + tl.exp(cum)[:, None] * carried",
        "if HAS_D:",
        "    yt = yt + tl.load(d_ptr + h).to(tl.float32) * xt",
        "tl.store(y_ptr + ((row * HEADS + h) * HEAD_DIM)[:, None] + p[None, :],",
        "         tl.where(real[:, None], yt, 0.0).to(y_ptr.dtype.element_ty), mask=t_ok[:, None] & p_ok[None, :])"]
    details = ["y [B, T, H*P] of chunk c: ((C B^T) * L * delta) X + exp(cum) (C h_c) + D X, L the in-chunk",
               "decay exp(cum_i - cum_j), j <= i; h_c from ``entering``. Programs: (B*H, CHUNKS, P blocks)."]
    return jit_kernel(name, "ssd", "Mamba-2 SSD chunk scan (three matmuls per chunk).", details, sig, body,
                      {k: COMPILE_SIZES[k] for k in sig if sig[k] == "constexpr"}, tensor_cores=True)


def launcher(scan: str, chunked: tuple | None) -> str:
    """``launch_ssd``: the scan kernel for T <= 1 or without a chunk size, else the three
    chunked kernels (``chunked`` = their names; None: the module has none)."""
    lines = [
        "def launch_ssd(x, dt, A_log, B, C, D, dt_bias, past_state, attention_mask, *, heads, head_dim, groups,",
        "               state_size, dt_min, dt_max, chunk=None):",
        '    """irc.ops.ssm.ssd: (y [B, T, H*P] in x\'s dtype, present state [B, H, N, P] in the past',
        "    state's dtype (x's without one)); chunked kernels for a prefill when ``chunk`` is set.\"\"\"",
        "    batch, seq = x.shape[:2]",
        "    x, dt, B, C = x.contiguous(), dt.contiguous(), B.contiguous(), C.contiguous()",
        "    real = ssm_new_tokens(attention_mask, batch, seq).to(torch.float32)",
        "    y = torch.empty_like(x)",
        "    present = torch.empty((batch, heads, state_size, head_dim), device=x.device,",
        "                          dtype=x.dtype if past_state is None else past_state.dtype)",
        "    block_p = min(triton.next_power_of_2(max(head_dim, 16)), 64)",
        "    flags = dict(HAS_D=D is not None, HAS_BIAS=dt_bias is not None, HAS_PAST=past_state is not None,",
        "                 BLOCK_N=triton.next_power_of_2(max(state_size, 16)), BLOCK_P=block_p)",
        "    D, dt_bias = (A_log if D is None else D), (A_log if dt_bias is None else dt_bias)",
        "    past = present if past_state is None else past_state.contiguous()",
        "    sizes = (seq, heads, head_dim, groups, state_size, float(dt_min),",
        '             float("inf") if dt_max is None else float(dt_max))',
        "    splits = triton.cdiv(head_dim, block_p)"]
    if chunked is None:
        lines += ["    if chunk is not None and seq > 1:",
                  '        raise RuntimeError("this module was generated without the chunked SSD kernels")']
    else:
        lines += ["    if chunk is not None and seq > 1:",
                  "        return y, launch_ssd_chunked(x, dt, A_log, B, C, D, dt_bias, real, past_state, past,",
                  "                                     present, y, sizes, flags, chunk, splits)"]
    lines += [f"    {scan}[(batch * heads, splits)](x, dt, A_log, B, C, D, dt_bias, real, past, present, y, *sizes,",
              "                                **flags)",
              "    return y, present"]
    if chunked is None:
        return "\n".join(lines)
    state, passing, scan_chunks = chunked
    return "\n".join(lines + ["", "", *[
        "def launch_ssd_chunked(x, dt, A_log, B, C, D, dt_bias, real, past_state, past, present, y, sizes, flags,",
        "                       chunk, splits):",
        '    """The chunked SSD: chunk states, state passing, chunk scan (writes y and present)."""',
        "    batch, seq, heads, head_dim, state_size = x.shape[0], x.shape[1], sizes[1], sizes[2], sizes[4]",
        "    chunks = triton.cdiv(seq, chunk)",
        "    states = torch.empty((batch, heads, chunks, state_size, head_dim), device=x.device, dtype=torch.float32)",
        "    entering = torch.empty_like(states)",
        "    totals = torch.empty((batch, heads, chunks), device=x.device, dtype=torch.float32)",
        "    tiles = dict(CHUNK=chunk, BLOCK_L=triton.next_power_of_2(max(chunk, 16)), PRECISION=DOT_PRECISION,",
        "                 MIXED=MIXED_DOT)",
        f"    {state}[(batch * heads, chunks, splits)](x, dt, A_log, B, dt_bias, real, states, totals, *sizes,",
        "        **flags, CHUNKS=chunks, **tiles)",
        f"    {passing}[(batch * heads, splits)](states, totals, past, entering, present, head_dim, state_size,",
        '        chunks, HAS_PAST=flags["HAS_PAST"], BLOCK_N=flags["BLOCK_N"], BLOCK_P=flags["BLOCK_P"])',
        f"    {scan_chunks}[(batch * heads, chunks, splits)](x, dt, A_log, B, C, D, dt_bias, real, entering, y,",
        "        *sizes, **flags, CHUNKS=chunks, **tiles)",
        "    return present"]])
