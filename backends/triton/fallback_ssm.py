"""Recurrent ops as torch code in the Triton launcher: the state-space ops ``causal_conv1d``,
``selective_scan`` (Mamba-1), ``ssd`` (Mamba-2) and ``gated_rms_norm`` (``irc.ops.ssm``), and
the gated delta rule (``irc.ops.delta``: Qwen3-Next's linear attention).

Each helper computes what the op's NumPy reference computes, in float32, one token at a
time (the recurrences are sequential over T, as the references are): a padded token (0 in
the last T columns of ``attention_mask``) has its input zeroed, its step frozen (Δ = 0; the
delta rule's decay 1 and β 0) and its output 0; Mamba-2's Δ is clamped to [dt_min, dt_max];
the D skip reads the masked input. The past state comes in as a graph input and the present state goes out as a
graph output (``past_key_values.{i}.conv_state`` / ``.recurrent_state`` -> ``present.*``), in
the state's dtype; outputs are in the activation's dtype.

These are not generated kernels: a fused conv, chunked scan, SSD and delta-rule kernels are
issue 27's work. Until then this is the exact, slow path (T torch steps per layer on a prefill).
"""
from __future__ import annotations

from irc.ops.registry import get_op

HELPERS = {
    "ssm_new_tokens": '''def ssm_new_tokens(attention_mask, batch, seq):
    """Bool [B, T]: which new tokens are real (the last T columns of the mask)."""
    if attention_mask is None:
        return torch.ones((batch, seq), dtype=torch.bool, device=DEVICE)
    return attention_mask[:, attention_mask.shape[1] - seq:] != 0''',
    "ssm_state_out": '''def ssm_state_out(state, past_state, like):
    """The present state in the past state's dtype (``like``'s when there is no past)."""
    return state.to(like.dtype if past_state is None else past_state.dtype).contiguous()''',
    "ssm_silu": '''def ssm_silu(x):
    """x / (1 + exp(-x)), as irc.ops.primitives.silu."""
    return x / (1.0 + torch.exp(-x))''',
    "ssm_softplus": '''def ssm_softplus(x):
    """log(1 + exp(x)), stable for large |x| (irc.ops.ssm.softplus)."""
    return torch.logaddexp(torch.zeros_like(x), x)''',
    "ssm_causal_conv1d": '''def ssm_causal_conv1d(x, weight, bias, past_state, attention_mask, activation):
    """irc.ops.ssm.causal_conv1d in torch (fp32): (y [B, T, C], present state [B, C, K-1],
    the last K-1 inputs, oldest first)."""
    batch, seq, channels = x.shape
    kernel = weight.shape[-1]
    real = ssm_new_tokens(attention_mask, batch, seq)
    x32 = torch.where(real[..., None], x.float(), 0.0)
    if past_state is None:
        past = torch.zeros((batch, channels, kernel - 1), device=x.device, dtype=torch.float32)
    else:
        past = past_state.float()
    window = torch.cat([past, x32.transpose(1, 2)], dim=2)  # [B, C, K-1+T]
    w = weight.float().reshape(channels, kernel)
    y = torch.zeros((batch, channels, seq), device=x.device, dtype=torch.float32)
    for k in range(kernel):
        y = y + w[None, :, k, None] * window[:, :, k:k + seq]
    if bias is not None:
        y = y + bias.float()[None, :, None]
    if activation == "silu":
        y = ssm_silu(y)
    y = torch.where(real[:, None, :], y, 0.0).transpose(1, 2)
    state = window[:, :, seq:]
    return y.to(x.dtype).contiguous(), ssm_state_out(state, past_state, x)''',
    "ssm_selective_scan": '''def ssm_selective_scan(x, dt, A_log, B, C, D, z, past_state, attention_mask):
    """irc.ops.ssm.selective_scan (Mamba-1) in torch, one token at a time (fp32): (y [B, T, D],
    present state [B, D, N])."""
    batch, seq, channels = x.shape
    real = ssm_new_tokens(attention_mask, batch, seq)[..., None]
    x32 = torch.where(real, x.float(), 0.0)
    delta = torch.where(real, ssm_softplus(dt.float()), 0.0)
    A = -torch.exp(A_log.float())                           # [D, N]
    Bm, Cm = B.float(), C.float()                           # [B, T, N]
    if past_state is None:
        h = torch.zeros((batch, channels, A.shape[1]), device=x.device, dtype=torch.float32)
    else:
        h = past_state.float()
    ys = torch.zeros((batch, seq, channels), device=x.device, dtype=torch.float32)
    for t in range(seq):
        step = delta[:, t, :, None]                         # [B, D, 1]
        h = torch.exp(step * A) * h + (step * x32[:, t, :, None]) * Bm[:, t, None, :]
        ys[:, t] = torch.einsum("bdn,bn->bd", h, Cm[:, t])
    if D is not None:
        ys = ys + x32 * D.float()
    if z is not None:
        ys = ys * ssm_silu(z.float())
    ys = torch.where(real, ys, 0.0)
    return ys.to(x.dtype), ssm_state_out(h, past_state, x)''',
    "ssm_ssd": '''def ssm_ssd(x, dt, A_log, B, C, D, dt_bias, past_state, attention_mask, *, heads, head_dim, groups,
            state_size, dt_min, dt_max):
    """irc.ops.ssm.ssd (Mamba-2) in torch, one token at a time (fp32): (y [B, T, H*P], present
    state [B, H, N, P]); head h reads group h // (H / G) of B and C."""
    batch, seq = x.shape[:2]
    xs = x.float().reshape(batch, seq, heads, head_dim)
    raw = dt.float() if dt_bias is None else dt.float() + dt_bias.float()
    delta = torch.clamp(ssm_softplus(raw), min=dt_min, max=dt_max)
    real = ssm_new_tokens(attention_mask, batch, seq)
    delta = torch.where(real[..., None], delta, 0.0)                              # [B, T, H]
    xs = torch.where(real[..., None, None], xs, 0.0)
    per_group = heads // groups
    Bm = B.float().reshape(batch, seq, groups, state_size).repeat_interleave(per_group, dim=2)  # [B, T, H, N]
    Cm = C.float().reshape(batch, seq, groups, state_size).repeat_interleave(per_group, dim=2)
    A = -torch.exp(A_log.float())                                                 # [H]
    if past_state is None:
        h = torch.zeros((batch, heads, state_size, head_dim), device=x.device, dtype=torch.float32)
    else:
        h = past_state.float()
    ys = torch.zeros((batch, seq, heads, head_dim), device=x.device, dtype=torch.float32)
    for t in range(seq):
        decay = torch.exp(delta[:, t] * A)[..., None, None]                       # [B, H, 1, 1]
        update = Bm[:, t, :, :, None] * (delta[:, t, :, None] * xs[:, t])[:, :, None, :]
        h = decay * h + update
        ys[:, t] = torch.einsum("bhnp,bhn->bhp", h, Cm[:, t])
    if D is not None:
        ys = ys + xs * D.float()[:, None]
    ys = torch.where(real[..., None, None], ys, 0.0)                              # a padded token's output is 0
    return ys.reshape(batch, seq, heads * head_dim).to(x.dtype), ssm_state_out(h, past_state, x)''',
    "ssm_gated_rms_norm": '''def ssm_gated_rms_norm(x, z, weight, *, eps, group_size, norm_before_gate):
    """irc.ops.ssm.gated_rms_norm in torch (fp32): RMS norm of x * silu(z) per group of
    features, times weight (norm_before_gate: norm(x) * weight * silu(z))."""
    x32, gate = x.float(), ssm_silu(z.float())
    if not norm_before_gate:
        x32 = x32 * gate
    features = x32.shape[-1]
    size = features if group_size is None else group_size
    grouped = x32.reshape(x32.shape[:-1] + (features // size, size))
    normed = grouped / torch.sqrt((grouped * grouped).mean(dim=-1, keepdim=True) + eps)
    out = normed.reshape(x32.shape) * weight.float()
    return (out * gate if norm_before_gate else out).to(x.dtype)''',
    "ssm_l2norm": '''def ssm_l2norm(x):
    """x / sqrt(sum(x^2) + 1e-6) over the last axis (irc.ops.delta.l2norm)."""
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)''',
    "ssm_gated_delta_rule": '''def ssm_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, past_state, attention_mask, *,
                         key_heads, value_heads, key_dim, value_dim, l2_norm, scale, update_rule, decay):
    """irc.ops.delta.gated_delta_rule in torch, one token at a time (fp32): (o [B, T, H_v*d_v],
    present state [B, H_v, d_k, d_v]); value head h reads key head h // (H_v / H_k); the decay
    per head or per key channel (a absent: constant, -exp(A_log)); the gated rule writes k v."""
    batch, seq = q.shape[:2]
    group = value_heads // key_heads
    qs = q.float().reshape(batch, seq, key_heads, key_dim)
    ks = k.float().reshape(batch, seq, key_heads, key_dim)
    if l2_norm:
        qs, ks = ssm_l2norm(qs), ssm_l2norm(ks)
    qs = qs * (key_dim ** -0.5 if scale is None else scale)
    qs, ks = qs.repeat_interleave(group, dim=2), ks.repeat_interleave(group, dim=2)   # [B, T, H_v, d_k]
    vs = v.float().reshape(batch, seq, value_heads, value_dim)
    rate = torch.exp(A_log.float())
    if a is None:
        g = (-rate).expand(batch, seq, value_heads)
    else:
        raw = a.float() if dt_bias is None else a.float() + dt_bias.float()
        if decay == "channel":
            rate = rate.repeat_interleave(key_dim)
        g = -rate * ssm_softplus(raw)
    g = g.reshape(batch, seq, value_heads, -1).expand(batch, seq, value_heads, key_dim)  # log decay per channel
    real = ssm_new_tokens(attention_mask, batch, seq)[..., None]
    g = torch.where(real[..., None], g, 0.0)
    beta = torch.ones_like(vs[..., 0]) if update_rule == "gated" else 1.0 / (1.0 + torch.exp(-b.float()))
    beta = torch.where(real, beta, 0.0)
    if past_state is None:
        S = torch.zeros((batch, value_heads, key_dim, value_dim), device=q.device, dtype=torch.float32)
    else:
        S = past_state.float()
    out = torch.zeros((batch, seq, value_heads, value_dim), device=q.device, dtype=torch.float32)
    for t in range(seq):
        S = S * torch.exp(g[:, t])[..., None]
        k_t = ks[:, t]                                                                # [B, H_v, d_k]
        recalled = 0.0 if update_rule == "gated" else torch.einsum("bhkv,bhk->bhv", S, k_t)
        correction = (vs[:, t] - recalled) * beta[:, t, :, None]
        S = S + k_t[..., None] * correction[:, :, None, :]
        out[:, t] = torch.einsum("bhkv,bhk->bhv", S, qs[:, t])
    out = torch.where(real[..., None], out, 0.0)
    return out.reshape(batch, seq, value_heads * value_dim).to(v.dtype), ssm_state_out(S, past_state, v)''',
}

# op -> (its helper, the attributes passed as keyword arguments, helpers it calls)
OPS = {
    "causal_conv1d": ("ssm_causal_conv1d", (), {"ssm_new_tokens", "ssm_silu", "ssm_state_out"}),
    "selective_scan": ("ssm_selective_scan", (), {"ssm_new_tokens", "ssm_softplus", "ssm_silu", "ssm_state_out"}),
    "ssd": ("ssm_ssd", ("heads", "head_dim", "groups", "state_size", "dt_min", "dt_max"),
            {"ssm_new_tokens", "ssm_softplus", "ssm_state_out"}),
    "gated_rms_norm": ("ssm_gated_rms_norm", ("eps", "group_size", "norm_before_gate"), {"ssm_silu"}),
    "gated_delta_rule": ("ssm_gated_delta_rule", ("key_heads", "value_heads", "key_dim", "value_dim", "l2_norm",
                                                  "scale", "update_rule", "decay"),
                         {"ssm_new_tokens", "ssm_softplus", "ssm_l2norm", "ssm_state_out"}),
}
STATEFUL = ("causal_conv1d", "selective_scan", "ssd", "gated_delta_rule")   # (y, present state) with a past


def ssm_line(op: str, attrs: dict, args: list[str], outputs: list) -> tuple[str, set]:
    """(the launcher line's right-hand side, helper names), as ``fallback.fallback_line``;
    KeyError for an op not in ``OPS``. Omitted optional operands are passed as None; a node
    without a past state returns only its first output."""
    helper, keywords, calls = OPS[op]
    operands = [spec for spec in get_op(op).operands if not spec.startswith("*")]
    args = list(args) + ["None"] * (len(operands) - len(args))
    if op == "causal_conv1d":
        args.append(repr(attrs["activation"]))
    args += [f"{name}={attrs[name]!r}" for name in keywords]
    text = f"{helper}({', '.join(args)})"
    if op in STATEFUL and len(outputs) == 1:
        text += "[0]"
    return text, {helper} | calls
