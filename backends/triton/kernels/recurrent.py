"""Kernels of the recurrent layers' small ops, and what the recurrent kernel modules share.

- ``conv``: ``irc.ops.ssm.causal_conv1d``, the depthwise causal convolution with state. One
  program holds BLOCK_T tokens x BLOCK_C channels of one row; tap k of output t reads
  window position t + k of [the K-1 carried inputs, then the T new tokens] (the past state
  for positions < K-1). The programs of the first token tile also write the present state,
  the window's last K-1 positions. Prefill and decode (T = 1) are the same kernel.
- ``selective_scan`` (Mamba-1): sequential over T, a [BLOCK_D, N] state per program in
  registers. Its decay exp(Δ·A) is per (channel, state index), so the chunked matmul form
  SSD uses does not apply (Δ·A is no scalar per head); the scan stays a loop over tokens.
- ``gated_norm``: ``irc.ops.ssm.gated_rms_norm``, BLOCK_R groups of one row per program.

Every kernel loads its operands in fp32 and stores in the output's dtype, reads the new
tokens' mask as ``real`` [B, T] fp32 (1 real, 0 padded; the launcher's ``ssm_new_tokens``),
and follows the references' padding rules: a padded token's input is zeroed, its step
frozen, its output 0. Operands are contiguous (the launchers make them so).
"""
from __future__ import annotations

from irc.dtypes import DType

from backends.triton.kernels import Kernel, docstring, dot, indent, parameter_lines, signature_type


def softplus(x: str) -> str:
    """log(1 + exp(x)) without overflow (irc.ops.ssm.softplus: logaddexp(0, x))."""
    return f"(tl.maximum({x}, 0.0) + tl.log(1.0 + tl.exp(-tl.abs({x}))))"


def sigmoid(x: str) -> str:
    return f"(1.0 / (1.0 + tl.exp(-({x}))))"


def pointers(**dtypes: DType) -> dict:
    """Pointer parameters of a signature: name -> "*fp32" (by each operand's dtype)."""
    return {f"{name}_ptr": "*" + signature_type(dtype) for name, dtype in dtypes.items()}


def product(out: str, a: str, b: str, shape: str, mix: str) -> list[str]:
    """Lines computing ``out = a @ b`` ([M, N] = ``shape``) with tl.dot, fp32 accumulation."""
    wrap = [text if text.replace("_", "").isalnum() else f"({text})" for text in (a, b)]
    return [f"{out} = tl.zeros([{shape}], dtype=tl.float32)"] + dot(*wrap, out, mix)


def jit_kernel(name: str, family: str, summary: str, details: list[str], sig: dict, body: list[str],
               constexprs: dict, launcher: str = "", tensor_cores: bool = False) -> Kernel:
    """A ``Kernel`` from its signature and body lines (indented into the def here)."""
    source = "\n".join(["@triton.jit", f"def {name}(", *indent(parameter_lines(sig), 1), "):",
                        docstring(summary, details), *indent(body, 1)])
    return Kernel(name, family, source, launcher, sig, constexprs, tensor_cores=tensor_cores)


def _window(j: str, ok: str) -> str:
    """The window tile at positions ``j`` [n] (rows ``ok``): [n, BLOCK_C] fp32, the past state
    below K-1, the new tokens (padded ones zeroed) from there."""
    past = (f"tl.load(past_ptr + (b * CHANNELS + c[None, :]) * (KERNEL - 1) + {j}[:, None], "
            f"mask=({ok} & ({j} < KERNEL - 1))[:, None] & c_ok[None, :], other=0.0).to(tl.float32)")
    new = (f"tl.load(x_ptr + (b * T + {j}[:, None] - (KERNEL - 1)) * CHANNELS + c[None, :], "
           f"mask=({ok} & ({j} >= KERNEL - 1))[:, None] & c_ok[None, :], other=0.0).to(tl.float32)")
    real = f"tl.load(real_ptr + b * T + {j} - (KERNEL - 1), mask={ok} & ({j} >= KERNEL - 1), other=0.0)"
    return f"({past} + {new} * {real}[:, None])"


def conv_kernel(name: str, x: DType, weight: DType, state: DType) -> Kernel:
    sig = {**pointers(x=x, w=weight, bias=weight, real=DType.f32, past=state, present=state, y=x),
           "T": "i32", "CHANNELS": "i32", "KERNEL": "constexpr", "HAS_BIAS": "constexpr", "SILU": "constexpr",
           "BLOCK_T": "constexpr", "BLOCK_C": "constexpr", "BLOCK_K": "constexpr"}
    body = ["b = tl.program_id(0)",
            "c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)",
            "t = tl.program_id(2) * BLOCK_T + tl.arange(0, BLOCK_T)",
            "c_ok = c < CHANNELS",
            "t_ok = t < T",
            "acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)",
            "for k in tl.static_range(KERNEL):",
            "    tap = tl.load(w_ptr + c * KERNEL + k, mask=c_ok, other=0.0).to(tl.float32)",
            f"    acc += tap[None, :] * {_window('(t + k)', 't_ok')}",
            "if HAS_BIAS:",
            "    acc += tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]",
            "if SILU:",
            "    acc = acc / (1.0 + tl.exp(-acc))",
            "real = tl.load(real_ptr + b * T + t, mask=t_ok, other=0.0) != 0",
            "y = tl.where(real[:, None], acc, 0.0)",
            "tl.store(y_ptr + (b * T + t[:, None]) * CHANNELS + c[None, :], y.to(y_ptr.dtype.element_ty), "
            "mask=t_ok[:, None] & c_ok[None, :])",
            "if tl.program_id(2) == 0:  # the present state: window positions T .. T+K-2",
            "    i = tl.arange(0, BLOCK_K)",
            "    i_ok = i < KERNEL - 1",
            f"    kept = {_window('(T + i)', 'i_ok')}",
            "    tl.store(present_ptr + (b * CHANNELS + c[None, :]) * (KERNEL - 1) + i[:, None], "
            "kept.to(present_ptr.dtype.element_ty), mask=i_ok[:, None] & c_ok[None, :])"]
    details = ["x, y [B, T, C]; w [C, 1, K]; bias [C]; past, present [B, C, K-1] (oldest first; the",
               "launcher passes zeros for no past). y[t] = act(bias + sum_k w[k] window[t + k]),",
               "window = [past, x (padded tokens zeroed)]."]
    return jit_kernel(name, "conv", "Depthwise causal convolution with state (prefill or decode).", details, sig,
                      body, {"KERNEL": 4, "HAS_BIAS": True, "SILU": True, "BLOCK_T": 16, "BLOCK_C": 64,
                             "BLOCK_K": 4}, conv_launcher(name))


def selective_scan_kernel(name: str, x: DType, a_log: DType, state: DType) -> Kernel:
    sig = {**pointers(x=x, dt=x, a_log=a_log, b=x, c=x, d=a_log, z=x, real=DType.f32, past=state, present=state,
                      y=x),
           "T": "i32", "CHANNELS": "i32", "STATE": "i32", "HAS_D": "constexpr", "HAS_Z": "constexpr",
           "HAS_PAST": "constexpr", "BLOCK_D": "constexpr", "BLOCK_N": "constexpr"}
    body = ["b = tl.program_id(0)",
            "d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)",
            "n = tl.arange(0, BLOCK_N)",
            "d_ok = d < CHANNELS",
            "n_ok = n < STATE",
            "tile_ok = d_ok[:, None] & n_ok[None, :]",
            "tile = (b * CHANNELS + d[:, None]) * STATE + n[None, :]",
            "A = -tl.exp(tl.load(a_log_ptr + d[:, None] * STATE + n[None, :], mask=tile_ok, other=0.0).to(tl.float32))",
            "if HAS_PAST:",
            "    h = tl.load(past_ptr + tile, mask=tile_ok, other=0.0).to(tl.float32)",
            "else:",
            "    h = tl.zeros([BLOCK_D, BLOCK_N], dtype=tl.float32)",
            "skip = tl.zeros([BLOCK_D], dtype=tl.float32)",
            "if HAS_D:",
            "    skip = tl.load(d_ptr + d, mask=d_ok, other=0.0).to(tl.float32)",
            "for t in range(T):",
            "    row = b * T + t",
            "    real = tl.load(real_ptr + row) != 0",
            "    xv = tl.where(real, tl.load(x_ptr + row * CHANNELS + d, mask=d_ok, other=0.0).to(tl.float32), 0.0)",
            "    raw = tl.load(dt_ptr + row * CHANNELS + d, mask=d_ok, other=0.0).to(tl.float32)",
            f"    delta = tl.where(real, {softplus('raw')}, 0.0)",
            "    bv = tl.load(b_ptr + row * STATE + n, mask=n_ok, other=0.0).to(tl.float32)",
            "    cv = tl.load(c_ptr + row * STATE + n, mask=n_ok, other=0.0).to(tl.float32)",
            "    h = tl.exp(delta[:, None] * A) * h + (delta * xv)[:, None] * bv[None, :]",
            "    yv = tl.sum(h * cv[None, :], axis=1) + xv * skip",
            "    if HAS_Z:",
            "        zv = tl.load(z_ptr + row * CHANNELS + d, mask=d_ok, other=0.0).to(tl.float32)",
            "        yv = yv * (zv / (1.0 + tl.exp(-zv)))",
            "    tl.store(y_ptr + row * CHANNELS + d, tl.where(real, yv, 0.0).to(y_ptr.dtype.element_ty), mask=d_ok)",
            "tl.store(present_ptr + tile, h.to(present_ptr.dtype.element_ty), mask=tile_ok)"]
    details = ["x, dt, z, y [B, T, D]; A_log [D, N]; B, C [B, T, N]; past, present [B, D, N].",
               "Sequential over T: the decay exp(delta A) is per (channel, state index), no matmul form."]
    return jit_kernel(name, "scan", "Mamba-1 selective scan, one token at a time, state in registers.", details, sig,
                      body, {"HAS_D": True, "HAS_Z": True, "HAS_PAST": True, "BLOCK_D": 32, "BLOCK_N": 16},
                      selective_scan_launcher(name))


def gated_norm_kernel(name: str, x: DType, z: DType, weight: DType) -> Kernel:
    sig = {**pointers(x=x, z=z, w=weight, y=x), "ROWS": "i32", "GROUPS": "i32", "SIZE": "i32", "eps": "fp32",
           "BEFORE_GATE": "constexpr", "BLOCK_R": "constexpr", "BLOCK_S": "constexpr"}
    body = ["r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)",
            "s = tl.arange(0, BLOCK_S)",
            "ok = (r < ROWS)[:, None] & (s < SIZE)[None, :]",
            "offs = r[:, None] * SIZE + s[None, :]",
            "xv = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)",
            "zv = tl.load(z_ptr + offs, mask=ok, other=0.0).to(tl.float32)",
            "gate = zv / (1.0 + tl.exp(-zv))",
            "if not BEFORE_GATE:",
            "    xv = xv * gate",
            "mean = tl.sum(xv * xv, axis=1) / SIZE",
            "w = tl.load(w_ptr + (r % GROUPS)[:, None] * SIZE + s[None, :], mask=ok, other=0.0).to(tl.float32)",
            "out = xv / tl.sqrt_rn(mean + eps)[:, None] * w",
            "if BEFORE_GATE:",
            "    out = out * gate",
            "tl.store(y_ptr + offs, out.to(y_ptr.dtype.element_ty), mask=ok)"]
    details = ["x, z, y [B, T, F] as rows of SIZE features (GROUPS = F / SIZE per token); w [F].",
               "out = norm(x silu(z)) w, or with BEFORE_GATE norm(x) w silu(z)."]
    return jit_kernel(name, "gated", "Gated RMS norm over groups of features.", details, sig, body,
                      {"BEFORE_GATE": False, "BLOCK_R": 16, "BLOCK_S": 64}, gated_norm_launcher(name))


def conv_launcher(name: str) -> str:
    return "\n".join([
        f"def launch_{name}(x, weight, bias, past_state, attention_mask, activation):",
        '    """irc.ops.ssm.causal_conv1d: (y [B, T, C] in x\'s dtype, present state [B, C, K-1] in the',
        "    past state's dtype (x's without one)).\"\"\"",
        "    batch, seq, channels = x.shape",
        "    kernel = weight.shape[-1]",
        "    x = x.contiguous()",
        "    real = ssm_new_tokens(attention_mask, batch, seq).to(torch.float32)",
        "    if past_state is None:",
        "        past_state = torch.zeros((batch, channels, kernel - 1), device=x.device, dtype=x.dtype)",
        "    past = past_state.contiguous()",
        "    y = torch.empty_like(x)",
        "    present = torch.empty_like(past)",
        "    block_t = min(triton.next_power_of_2(max(seq, 1)), 16)",
        "    block_c = min(triton.next_power_of_2(channels), 128)",
        f"    {name}[(batch, triton.cdiv(channels, block_c), max(triton.cdiv(seq, block_t), 1))](",
        "        x, weight, weight if bias is None else bias, real, past, present, y, seq, channels, KERNEL=kernel,",
        '        HAS_BIAS=bias is not None, SILU=activation == "silu", BLOCK_T=block_t, BLOCK_C=block_c,',
        "        BLOCK_K=triton.next_power_of_2(max(kernel - 1, 1)))",
        "    return y, present"])


def selective_scan_launcher(name: str) -> str:
    return "\n".join([
        f"def launch_{name}(x, dt, A_log, B, C, D, z, past_state, attention_mask):",
        '    """irc.ops.ssm.selective_scan (Mamba-1): (y [B, T, D] in x\'s dtype, present state [B, D, N]',
        "    in the past state's dtype (x's without one)).\"\"\"",
        "    batch, seq, channels = x.shape",
        "    state = A_log.shape[1]",
        "    x, dt, B, C = x.contiguous(), dt.contiguous(), B.contiguous(), C.contiguous()",
        "    real = ssm_new_tokens(attention_mask, batch, seq).to(torch.float32)",
        "    y = torch.empty_like(x)",
        "    present = torch.empty((batch, channels, state), device=x.device,",
        "                          dtype=x.dtype if past_state is None else past_state.dtype)",
        "    past = present if past_state is None else past_state.contiguous()",
        "    block_d = min(triton.next_power_of_2(channels), 32)",
        f"    {name}[(batch, triton.cdiv(channels, block_d))](",
        "        x, dt, A_log, B, C, A_log if D is None else D, x if z is None else z.contiguous(), real, past,",
        "        present, y, seq, channels, state, HAS_D=D is not None, HAS_Z=z is not None,",
        "        HAS_PAST=past_state is not None, BLOCK_D=block_d, BLOCK_N=triton.next_power_of_2(state))",
        "    return y, present"])


def gated_norm_launcher(name: str) -> str:
    return "\n".join([
        f"def launch_{name}(x, z, weight, *, eps, group_size, norm_before_gate):",
        '    """irc.ops.ssm.gated_rms_norm: y [B, T, F] in x\'s dtype."""',
        "    features = x.shape[-1]",
        "    size = features if group_size is None else group_size",
        "    x, z = x.contiguous(), z.contiguous()",
        "    y = torch.empty_like(x)",
        "    rows = x.numel() // size",
        "    block_s = triton.next_power_of_2(size)",
        "    block_r = max(1, min(64, ROW_TILE // block_s))",
        "    if rows:",
        f"        {name}[(triton.cdiv(rows, block_r),)](x, z, weight, y, rows, features // size, size, float(eps),",
        "            BEFORE_GATE=norm_before_gate, BLOCK_R=block_r, BLOCK_S=block_s)",
        "    return y"])
