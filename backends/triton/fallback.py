"""Ops the Triton generator leaves to torch: one launcher line per node, each computing what
the op's NumPy reference computes (float math in fp32, results in the value's dtype).

These are data movement (reshape, gather, scatter_add, ...), integer bookkeeping (MoE
routing and dispatch, top-k, sorts) and the rare primitive with a broadcast the row
kernel does not take. The emitted module's docstring lists every node that runs here.
An op in neither this table nor the kernel generators is refused (``BackendError``).
"""
from __future__ import annotations

from irc.dtypes import DType
from irc.text import literal, shape_text

from backends.triton.kernels import torch_type

# helper functions the emitted module defines when a fallback line calls them
HELPERS = {
    "take": '''def take(data, indices, axis):
    """numpy.take: data indexed by integer indices along ``axis``."""
    picked = torch.index_select(data, axis, indices.reshape(-1))
    return picked.reshape(data.shape[:axis] + indices.shape + data.shape[axis + 1:])''',
    "top_indices": '''def top_indices(values, k, largest=True):
    """Indices of the k largest (smallest) along the last axis, ties to the lower index."""
    return torch.sort(-values if largest else values, dim=-1, stable=True).indices[..., :k]''',
    "dequantize_blocks": '''def dequantize_blocks(qweight, scales, zero_points, bits, block_size, k):
    """The float weight [..., N, K] of blocked codes (irc.ops.quant.dequantize_blocks), in
    the scales' dtype."""
    codes = qweight.to(torch.int32)
    if bits == 4:
        codes = torch.stack([codes & 15, codes >> 4], dim=-1).reshape(codes.shape[:-1] + (-1,))
    nb = scales.shape[-1]
    if zero_points is None:
        zero = float(2 ** (bits - 1))
    elif zero_points.is_floating_point():  # one float zero point per block
        zero = zero_points.float()[..., None]
    else:
        zero = zero_points.to(torch.int32)
        if bits == 4:
            zero = torch.stack([zero & 15, zero >> 4], dim=-1).reshape(zero.shape[:-1] + (-1,))
        zero = zero[..., :nb].float()[..., None]
    weight = (codes.float() - zero) * scales.float()[..., None]
    return weight.reshape(weight.shape[:-2] + (-1,))[..., :k].to(scales.dtype)''',
    "quantize_kv": '''def quantize_kv(x):
    """int8 codes and fp32 scales (max|x| / 127 per row) of a cache [..., S, D]."""
    x = x.float()
    scale = x.abs().amax(dim=-1) / 127.0
    step = scale[..., None]
    codes = torch.where(step > 0, x / torch.where(step > 0, step, 1.0), torch.zeros_like(x))
    return torch.clamp(torch.round(codes), -127, 127).to(torch.int8), scale''',
    "patch_grid": '''def patch_grid(grid, count, merge, window):
    """irc.ops.vision.patch_grid: i64 [6, count], each flattened patch's row, column, frame,
    window and frame height and width, the images' grid rows (t, h, w) one after another."""
    rows, frames = [], 0
    for t, h, w in grid.reshape(-1, 3).tolist():
        block_row, block_col, inner_row, inner_col = torch.meshgrid(
            torch.arange(h // merge), torch.arange(w // merge), torch.arange(merge), torch.arange(merge), indexing="ij")
        height, width = (block_row * merge + inner_row).reshape(-1), (block_col * merge + inner_col).reshape(-1)
        cell = (block_row.reshape(-1) // window) * 1024 + block_col.reshape(-1) // window if window else 0
        for frame in range(frames, frames + t):
            ids = torch.full((h * w,), frame)
            rows.append(torch.stack([height, width, ids, ids * (1 << 20) + cell if window else ids,
                                     torch.full((h * w,), h), torch.full((h * w,), w)]))
        frames += t
    out = torch.cat(rows, dim=1) if rows else torch.zeros((6, 0), dtype=torch.int64)
    if out.shape[1] != count:
        raise ValueError(f"patch_grid: the image grids hold {out.shape[1]} patches but pixel_values has {count} rows")
    return out.to(device=grid.device, dtype=torch.int64)''',
    "resample_positions": '''def resample_positions(table, where, side):
    """irc.ops.vision.resample_positions: each patch's position, the side x side table resampled
    bilinearly (corners aligned) to its frame's grid."""
    def taps(index, size):
        source = index.float() * float(side - 1) / torch.clamp(size.float() - 1, min=1.0)
        floor = torch.floor(source)
        low = floor.to(torch.int64)
        return (low, torch.clamp(low + 1, max=side - 1)), (1 - (source - floor), source - floor)
    (r0, r1), (wr0, wr1) = taps(where[0], where[4])
    (c0, c1), (wc0, wc1) = taps(where[1], where[5])
    values = table.float()
    out = sum(values[r * side + c] * (wr * wc)[:, None]
              for r, wr in ((r0, wr0), (r1, wr1)) for c, wc in ((c0, wc0), (c1, wc1)))
    return out.to(table.dtype)''',
    "resize_positions": '''def resize_positions(table, shapes, length, side):
    """irc.ops.vision.resize_positions: the side x side table resized to each image's (h, w) by
    antialiased bilinear weights per axis (fp32), rows past h * w repeating row 0."""
    sizes = shapes.to(torch.int64)
    index = torch.arange(length, device=table.device)[None, :]
    height, width = sizes[:, :1], sizes[:, 1:]
    row = torch.div(index, width, rounding_mode="floor")
    inside = index < height * width
    lines = torch.arange(side, device=table.device, dtype=torch.float32)

    def weights(place, size):
        scale = side / size.float()
        center = (torch.where(inside, place, 0).float() + 0.5) * scale - 0.5
        reach = (lines - center[..., None]).abs() / torch.clamp(scale, min=1.0)[..., None]
        triangle = torch.clamp(1 - reach, min=0.0)
        return triangle / triangle.sum(-1, keepdim=True)
    outer = weights(row, height)[..., :, None] * weights(index - row * width, width)[..., None, :]
    return (outer.flatten(-2) @ table.float()).to(table.dtype)''',
    "merge_tokens": '''def merge_tokens(embeds, ids, features, token):
    """irc.ops.vision.merge_tokens: the placeholder rows of embeds replaced, in order, by the
    feature rows (none on a step without an image)."""
    if features.shape[0] == 0:
        return embeds.clone()
    mask = ids == token
    if int(mask.sum()) != features.shape[0]:
        raise ValueError(f"merge_tokens: {int(mask.sum())} placeholder tokens (id {token}) but {features.shape[0]} "
                         "feature rows")
    out = embeds.clone()
    out[mask] = features.to(out.dtype)
    return out''',
    "image_blocks": '''def image_blocks(ids, token, prefix):
    """irc.ops.attention.image_blocks: each run of ``token`` numbered 0, 1, ... along the row,
    -1 elsewhere; with ``prefix``, block 0 over a whole row holding the token (else -1)."""
    image = ids == token
    if prefix:
        return torch.where(image.any(dim=1, keepdim=True), 0, -1).expand(ids.shape).to(torch.int64)
    starts = image & ~torch.nn.functional.pad(image, (1, 0))[:, :-1]
    return torch.where(image, torch.cumsum(starts.to(torch.int64), dim=1) - 1, -1)''',
    "topk": '''def topk(values, k, largest=True):
    """The k largest (smallest) values along the last axis and their indices, sorted."""
    order = top_indices(values, k, largest)
    return torch.gather(values, -1, order), order''',
    "topk_mask": '''def topk_mask(scores, attention_mask, k, causal):
    """irc.ops.sparse_index.topk_mask: each row's k best visible keys, bool [B, T, S]."""
    total, seq = scores.shape[-1], scores.shape[-2]
    key = torch.arange(total, device=scores.device)
    visible = (key[None, :] <= key[total - seq:, None]) if causal else torch.ones(seq, total, dtype=torch.bool,
                                                                                  device=scores.device)
    visible = visible[None].expand(scores.shape)
    if attention_mask is not None:
        visible = visible & (attention_mask != 0)[:, None, :]
    ranked = torch.where(visible, scores.float(), float("-inf"))
    chosen = torch.zeros_like(visible).scatter(-1, top_indices(ranked, min(k, total)), True)
    return chosen & visible''',
    "block_topk_mask": '''def block_topk_mask(scores, positions, attention_mask, block, k, local):
    """irc.ops.sparse_index.block_topk_mask: MiniMax-M3's taken blocks' visible keys, bool [B, H, T, S]."""
    total, seq = scores.shape[-1], scores.shape[-2]
    key = torch.arange(total, device=scores.device)
    position = positions.to(torch.int64)[:, None, :, None]
    ranked = torch.where(key > position, float("-inf"), scores.float())
    blocks = -(-total // block)
    ranked = torch.nn.functional.pad(ranked, (0, blocks * block - total), value=float("-inf"))
    pooled = ranked.reshape(ranked.shape[:3] + (blocks, block)).amax(-1)
    index = torch.arange(blocks, device=scores.device)
    for step in range(local):
        pooled = torch.where(index == (position // block - step).clamp(min=0), float("inf"), pooled)
    taken = top_indices(pooled, min(k, blocks))
    finite = torch.gather(pooled, -1, taken) > float("-inf")
    chosen = torch.zeros_like(pooled, dtype=torch.bool).scatter(-1, taken, finite)
    visible = (key[None, :] <= key[total - seq:, None])[None, None]
    if attention_mask is not None:
        visible = visible & (attention_mask != 0)[:, None, None, :]
    return chosen[..., key // block] & visible''',
    "moe_route": '''def moe_route(x, router, router_bias, logit_bias, *, experts, top_k, scoring, norm_topk_prob,
              routed_scale, n_group, topk_group, group_score, jitter_eps):
    """irc.ops.moe.route in torch: (expert_ids [N, k] i64, weights [N, k] f32)."""
    tokens = x.float().reshape(-1, router.shape[1])
    logits = tokens @ router.float().T
    if logit_bias is not None:
        logits = logits + logit_bias.float()
    if scoring == "sparsemixer":
        scores, chosen, kept_weights = logits, [], []
        for _ in range(2):
            best = torch.argmax(scores, dim=-1, keepdim=True)
            top = torch.gather(scores, -1, best)
            far = (top - logits) / torch.maximum(logits.abs(), top) > 2.0 * jitter_eps
            probs = torch.softmax(torch.where(far, torch.full_like(scores, float("-inf")), scores), dim=-1)
            chosen.append(best)
            kept_weights.append(torch.gather(probs, -1, best))
            scores = scores.scatter(-1, best, float("-inf"))
        expert_ids, weights = torch.cat(chosen, dim=-1), torch.cat(kept_weights, dim=-1)
        if norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return expert_ids, (weights * routed_scale).float()
    if scoring == "softmax":
        exp = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)
        scores = exp / exp.sum(dim=-1, keepdim=True)
    else:
        scores = 1.0 / (1.0 + torch.exp(-logits))
    choice = logits if scoring == "sigmoid_logits" else scores  # Kolibri-1 selects on the logits
    choice = choice if router_bias is None else choice + router_bias.float()
    if n_group is not None:
        grouped = choice.reshape(len(choice), n_group, experts // n_group)
        if group_score == "max":
            per_group = grouped.max(dim=-1).values
        else:
            per_group = torch.sort(grouped, dim=-1, descending=True).values[..., :2].sum(dim=-1)
        keep = torch.zeros_like(per_group, dtype=torch.bool)
        keep.scatter_(-1, top_indices(per_group, topk_group), True)
        keep = keep.repeat_interleave(experts // n_group, dim=-1)
        choice = torch.where(keep, choice, torch.full_like(choice, float("-inf")))
    expert_ids = top_indices(choice, top_k)
    weights = torch.gather(scores, -1, expert_ids)
    if norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return expert_ids, (weights * routed_scale).float()''',
    "moe_dispatch": '''def moe_dispatch(expert_ids, *, experts, capacity_factor):
    """irc.ops.moe_sorted.dispatch in torch: token-slot pairs stably sorted by expert
    (token_index, slot_index [N*k], indptr [E+1]); over capacity, dropped pairs go last."""
    tokens, top_k = expert_ids.shape
    by_priority = expert_ids.T.reshape(-1)
    order = torch.sort(by_priority, stable=True).indices
    counts = torch.bincount(by_priority, minlength=experts)
    slot_index = (order % max(tokens, 1)) * top_k + order // max(tokens, 1)
    if capacity_factor is not None:
        capacity = math.ceil(capacity_factor * tokens * top_k / experts)
        rank = torch.arange(len(order), device=order.device) - torch.repeat_interleave(
            torch.cumsum(counts, 0) - counts, counts)
        kept = rank < capacity
        slot_index = torch.cat([slot_index[kept], slot_index[~kept]])
        counts = torch.clamp(counts, max=capacity)
    indptr = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
    return slot_index // top_k, slot_index, indptr''',
    "token_shift": '''def token_shift(x, past=None):
    """irc.ops.rwkv.token_shift: (x one token later, the first from ``past``; the last token)."""
    first = torch.zeros_like(x[:, :1]) if past is None else past[:, None].to(x.dtype)
    present = x[:, -1] if past is None else x[:, -1].to(past.dtype)
    return torch.cat([first, x[:, :-1]], dim=1), present.contiguous()''',
    "rwkv4_wkv": '''def rwkv4_wkv(k, v, time_decay, time_first, past=None):
    """irc.ops.rwkv.rwkv4_wkv in torch, float32: (wkv [B, T, A], present (num, den, max) [B, 3, A])."""
    k32, v32, u = k.float(), v.float(), time_first.float()
    w = -torch.exp(time_decay.float())
    state = torch.zeros(k.shape[0], 3, k.shape[2], device=k.device) if past is None else past.float()
    num, den, mx = state[:, 0], state[:, 1], state[:, 2]
    mx = torch.where(den == 0, torch.full_like(mx, -1e38), mx)
    out = torch.empty_like(k32)
    for t in range(k.shape[1]):
        k_t, v_t = k32[:, t], v32[:, t]
        ku = k_t + u
        m = torch.maximum(mx, ku)
        e1, e2 = torch.exp(mx - m), torch.exp(ku - m)
        out[:, t] = (e1 * num + e2 * v_t) / (e1 * den + e2)
        decayed = mx + w
        m = torch.maximum(decayed, k_t)
        e1, e2 = torch.exp(decayed - m), torch.exp(k_t - m)
        num, den, mx = e1 * num + e2 * v_t, e1 * den + e2, m
    present = torch.stack([num, den, mx], dim=1)
    return out.to(v.dtype), (present if past is None else present.to(past.dtype))''',
    "rg_lru": '''def rg_lru(x, a_param, input_gate, recurrence_gate, position_ids=None, past=None):
    """irc.ops.rglru.rg_lru in torch, float32: (y [B, T, W], present [B, W])."""
    log_a = (-8.0 * recurrence_gate.float()) * torch.nn.functional.softplus(a_param.float())
    a, multiplier = torch.exp(log_a), torch.sqrt(1.0 - torch.exp(2.0 * log_a))
    if position_ids is not None:
        reset = (position_ids == 0)[:, :, None]
        multiplier, a = torch.where(reset, torch.ones_like(multiplier), multiplier), a * ~reset
    n = (x.float() * input_gate.float()) * multiplier
    h = torch.zeros(x.shape[0], x.shape[2], device=x.device) if past is None else past.float()
    out = torch.empty_like(n)
    for t in range(x.shape[1]):
        h = a[:, t] * h + n[:, t]
        out[:, t] = h
    return out.to(x.dtype), (h if past is None else h.to(past.dtype))''',
    "ngram_hash": '''def ngram_hash(ids, mask=None, past=None, eos=0, multipliers=(), primes=(), offsets=(), heads=1):
    """irc.ops.ngram.ngram_hash in torch, int64: (ids [B, T, G], present [B, C] or None)."""
    ids, context, seq = ids.long(), len(multipliers) - 1, ids.shape[1]
    if mask is not None:
        ids = torch.where(mask[:, mask.shape[1] - seq:] != 0, ids, eos)
    if past is None:
        before = torch.full((ids.shape[0], context), eos, dtype=torch.long, device=ids.device)
    else:
        stored = torch.round(past.float()).long()
        before = torch.where(stored > 0, stored - 1, eos)
    history = torch.cat([before, ids], dim=1)
    valid, mixed, out = torch.ones_like(ids, dtype=torch.bool), torch.zeros_like(ids), []
    for shift, multiplier in enumerate(multipliers):
        shifted = history[:, context - shift:context - shift + seq]
        valid = valid & (shifted != eos) if shift else valid
        mixed = mixed ^ (torch.where(valid, shifted, eos) * multiplier)
        out += [torch.remainder(mixed, primes[h]) + offsets[h] for h in range(max(shift - 1, 0) * heads, shift * heads)]
    present = None if past is None else (history[:, history.shape[1] - context:] + 1).to(past.dtype)
    return torch.stack(out, dim=-1), present''',
    "sinusoidal_positions": '''def sinusoidal_positions(position_ids, dim, offset, padding_idx, spacing="fairseq"):
    """irc.ops.positions.sinusoidal_positions: the rows at position_ids + offset, sines |
    cosines (a zero column for an odd dim), the padding_idx row zeros; float32 [..., dim]."""
    half = dim // 2
    index = torch.arange(half, device=position_ids.device).float()
    if spacing == "transformer":  # CTRL's: 1 / 10000^(2i / dim)
        frequencies = 1.0 / torch.pow(10000.0, index * 2 / dim)
    else:  # fairseq's: exp(-i log(10000) / (half - 1))
        frequencies = torch.exp(index * -(9.210340371976184 / (half - 1)))
    rows = position_ids.to(torch.int64) + offset
    angles = rows.float()[..., None] * frequencies
    pad = [torch.zeros_like(angles[..., :1])] if dim % 2 else []
    out = torch.cat([torch.sin(angles), torch.cos(angles)] + pad, dim=-1)
    return out if padding_idx is None else torch.where((rows == padding_idx)[..., None], 0.0, out)''',
}

BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
COMPARE = {"less": "<", "less_equal": "<=", "equal": "=="}
UNARY = {"log": "torch.log", "exp": "torch.exp", "tanh": "torch.tanh", "sqrt": "torch.sqrt", "rsqrt": "torch.rsqrt",
         "sigmoid": "torch.sigmoid", "silu": "torch.nn.functional.silu", "cos": "torch.cos", "sin": "torch.sin",
         "neg": "torch.neg"}
REDUCE = {"reduce_sum": "sum", "reduce_mean": "mean", "reduce_max": "amax"}
# op -> the line's right-hand side: {0}, {1}, ... the operands, {dtype} the result's torch
# dtype, {attrs[...]} an attribute as Python writes it
TEMPLATES = {
    "cast": "{0}.to({dtype})",
    "gather": "take({0}, {1}, {attrs[axis]})",
    "scatter_add": "{0}.float().index_add(0, {1}, {2}.float()).to({dtype})",
    "softmax": "torch.softmax({0}.float(), dim={attrs[axis]}).to({dtype})",
    "matmul": "torch.matmul({0}.float(), {1}.float()).to({dtype})",
    "where": "torch.where({0}, {1}, {2})",
    "maximum": "torch.maximum({0}.float(), {1}.float()).to({dtype})",
    "logical_and": "torch.logical_and({0}, {1})",
    "argsort": "torch.sort({0}, dim={attrs[axis]}, stable=True).indices",
    "quantize_kv": "quantize_kv({0})",
    "dequantize_kv": "({0}.float() * {1}.float()[..., None])",
    "sinusoidal_positions": ("sinusoidal_positions({0}, {attrs[dim]}, {attrs[offset]}, "  # irc.ops.positions
                             "{attrs[padding_idx]}, {attrs[frequencies]!r})"),
    **{op: f"({{0}}.float() {symbol} {{1}}.float()).to({{dtype}})" for op, symbol in BINARY.items()},
    **{op: f"({{0}} {symbol} {{1}})" for op, symbol in COMPARE.items()},
    **{op: f"{function}({{0}}.float()).to({{dtype}})" for op, function in UNARY.items()},
}
TEMPLATE_HELPERS = {"gather": {"take"}, "quantize_kv": {"quantize_kv"},
                    "sinusoidal_positions": {"sinusoidal_positions"}}
# softplus and xielu (irc.ops.activations: Laguna's gates, Apertus' xIELU)
HELPERS["xielu"] = '''def xielu(x, alpha_p, alpha_n, beta, eps):
    """irc.ops.activations.xielu (transformers' XIELUActivation, its Python form), float32."""
    x, beta = x.float(), beta.float()
    a_p = torch.nn.functional.softplus(alpha_p.float())
    a_n = beta + torch.nn.functional.softplus(alpha_n.float())
    negative = (torch.expm1(torch.minimum(x, eps.float())) - x) * a_n + beta * x
    return torch.where(x > 0, a_p * x * x + beta * x, negative)'''
TEMPLATES.update({"softplus": "torch.nn.functional.softplus({0}.float()).to({dtype})",
                  "xielu": "xielu({0}, {1}, {2}, {3}, {4}).to({dtype})"})
TEMPLATE_HELPERS["xielu"] = {"xielu"}
HELPERS["mlstm"] = '''def mlstm(q, k, v, igate, fgate, c=None, n=None, m=None, heads=1, eps=1e-6):
    """irc.ops.mlstm.mlstm in torch, float32: (h [B, T, H*dv], C, n, m), from zeros without a state."""
    batch, seq = q.shape[:2]
    q4, k4, v4 = (x.float().reshape(batch, seq, heads, -1) for x in (q, k, v))
    dk, dv = q4.shape[-1], v4.shape[-1]
    c_t = q4.new_zeros(batch, heads, dk, dv) if c is None else c.float()
    n_t = q4.new_zeros(batch, heads, dk) if n is None else n.float()
    m_t = q4.new_zeros(batch, heads, 1) if m is None else m.float()
    f_log, i = torch.nn.functional.logsigmoid(fgate.float())[..., None], igate.float()[..., None]
    out = q4.new_empty(batch, seq, heads, dv)
    for t in range(seq):
        m_new = torch.maximum(f_log[:, t] + m_t, i[:, t])
        a, b = torch.exp(f_log[:, t] + m_t - m_new), torch.exp(i[:, t] - m_new)
        q_t = q4[:, t] * dk ** -0.5
        c_t = a[..., None] * c_t + b[..., None] * (k4[:, t, :, :, None] * v4[:, t, :, None, :])
        n_t = a * n_t + b * k4[:, t]
        numerator = (q_t[..., None, :] @ c_t)[..., 0, :]
        qn = (q_t * n_t).sum(-1, keepdim=True)
        out[:, t] = numerator / (torch.maximum(qn.abs(), torch.exp(-m_new)) + eps)
        m_t = m_new
    states = (c_t, n_t, m_t) if c is None else (c_t.to(c.dtype), n_t.to(n.dtype), m_t.to(m.dtype))
    return (out.reshape(batch, seq, heads * dv).to(v.dtype),) + states'''
HELPERS["nvfp4_fake_quantize"] = '''def nvfp4_fake_quantize(x):
    """irc.ops.nvfp4.nvfp4_fake_quantize: x rounded to NVFP4 and back (blocks of 16), float32."""
    blocks = x.float().unflatten(-1, (-1, 16))
    scale = (blocks.abs().amax(-1, keepdim=True) / 6).clamp(2**-9, 448).to(torch.float8_e4m3fn).float()
    scaled = blocks / scale
    magnitude = scaled.abs().clamp(max=6)
    step = torch.where(magnitude < 2, 0.5, torch.where(magnitude < 4, 1.0, 2.0))
    rounded = torch.round(magnitude / step) * step
    return (torch.where(scaled < 0, -rounded, rounded) * scale).flatten(-2)'''
TEMPLATES["nvfp4_fake_quantize"] = "nvfp4_fake_quantize({0}).to({dtype})"  # Kolibri-1.1 (irc.ops.nvfp4)
TEMPLATE_HELPERS["nvfp4_fake_quantize"] = {"nvfp4_fake_quantize"}
MOE_ROUTE_ARGS = ("experts", "top_k", "scoring", "norm_topk_prob", "routed_scale", "n_group", "topk_group",
                  "group_score", "jitter_eps")


def fallback_line(op: str, attrs: dict, args: list[str], outputs: list) -> tuple[str, set]:
    """(the Python statement's right-hand side, helper names it calls), or raise KeyError.

    ``args`` are operand expressions ("None" for an omitted one), ``outputs`` the output
    Values. Constants are written by ``irc.text.literal``, shapes by ``irc.text.shape_text``,
    scalar keyword arguments by ``repr``."""
    out = outputs[0]
    dtype = torch_type(out.dtype) if out.dtype in (DType.f32, DType.f16, DType.bf16, DType.i64, DType.i32,
                                                     DType.bool, DType.i8, DType.u8) else None
    if op == "sinusoidal_positions":  # "frequencies" defaults to fairseq's (irc.ops.positions)
        attrs = {"frequencies": "fairseq", **attrs}
    if op in TEMPLATES:
        return TEMPLATES[op].format(*args, dtype=dtype, attrs=attrs), set(TEMPLATE_HELPERS.get(op, ()))
    if op in ("reshape", "expand"):
        return f"{args[0]}.{op}({shape_text(attrs['shape'])})", set()
    if op == "transpose":
        return f"{args[0]}.permute({shape_text(attrs['perm'])}).contiguous()", set()
    if op == "constant":
        return f"torch.tensor({literal(attrs['value'])}, dtype={dtype}, device=DEVICE)", set()
    if op == "slice":
        end = "" if attrs["end"] is None else str(attrs["end"])
        index = ", ".join([":"] * (attrs["axis"] % out.rank) + [f"{attrs['start']}:{end}"])
        return f"{args[0]}[{index}].contiguous()", set()
    if op == "concat":
        return f"torch.cat([{', '.join(args)}], dim={attrs['axis']})", set()
    if op in REDUCE:
        axes = shape_text(attrs["axes"])
        return (f"{args[0]}.float().{REDUCE[op]}(dim={axes}, keepdim={attrs['keepdims']}).to({dtype})", set())
    if op == "topk" and attrs["axis"] in (-1, outputs[0].rank - 1):
        return f"topk({args[0]}, {attrs['k']}, {attrs['largest']})", {"topk", "top_indices"}
    if op == "topk_mask":  # DeepSeek-V3.2's indexer selection (irc.ops.sparse_index)
        mask = args[1] if len(args) > 1 else "None"
        return f"topk_mask({args[0]}, {mask}, {attrs['k']}, {attrs['causal']})", {"topk_mask", "top_indices"}
    if op == "block_topk_mask":  # MiniMax-M3's block selection (irc.ops.sparse_index)
        mask = args[2] if len(args) > 2 else "None"
        return (f"block_topk_mask({args[0]}, {args[1]}, {mask}, {attrs['block']}, {attrs['k']}, {attrs['local']})",
                {"block_topk_mask", "top_indices"})
    if op == "merge_tokens":  # a VLM decoder's image features into its token embeddings
        return f"merge_tokens({args[0]}, {args[1]}, {args[2]}, {attrs['token']})", {"merge_tokens"}
    if op == "image_blocks":  # Gemma 3's image tokens, numbered per image (integer bookkeeping)
        return f"image_blocks({args[0]}, {attrs['token']}, {attrs['prefix']})", {"image_blocks"}
    if op == "range_like":
        return f"torch.arange({args[0]}.shape[{attrs['axis']}], device={args[0]}.device)", set()
    if op == "dim_size":
        return f"torch.tensor({args[0]}.shape[{attrs['axis']}], device={args[0]}.device)", set()
    if op == "patch_grid":  # Qwen-VL's patches placed from image_grid_thw (integer bookkeeping)
        return (f"patch_grid({args[0]}, {args[1]}.shape[0], {attrs['merge']}, {attrs['window']!r})",
                {"patch_grid"})
    if op == "resample_positions":
        return f"resample_positions({args[0]}, {args[1]}, {attrs['side']})", {"resample_positions"}
    if op == "resize_positions":  # SigLIP 2's position grid resized to each image (NaFlex)
        return (f"resize_positions({args[0]}, {args[1]}, {args[2]}.shape[1], {attrs['side']})",
                {"resize_positions"})
    if op == "moe_route":
        kwargs = ", ".join(f"{k}={attrs[k]!r}" for k in MOE_ROUTE_ARGS)
        operands = ", ".join((args + ["None"] * 4)[:4])  # x, router, router_bias, router_logit_bias
        return f"moe_route({operands}, {kwargs})", {"moe_route", "top_indices"}
    if op == "dequantize":
        return (f"dequantize_blocks({args[0]}, {args[1]}, {args[2] if len(args) > 2 else 'None'}, {attrs['bits']}, "
                f"{attrs['block_size']}, {attrs['K']})", {"dequantize_blocks"})
    if op == "dequant_embedding":  # only the looked-up rows are dequantized
        ids, zero = args[0], (f"{args[3]}[{args[0]}]" if len(args) > 3 and args[3] != "None" else "None")
        rows = (f"dequantize_blocks({args[1]}[{ids}], {args[2]}[{ids}], {zero}, {attrs['bits']}, "
                f"{attrs['block_size']}, {attrs['K']})")
        scale = attrs["scale"]
        return (rows if scale is None else f"({rows}.float() * {float(scale)!r}).to({dtype})"), {"dequantize_blocks"}
    if op in ("token_shift", "rwkv4_wkv", "rg_lru"):  # RWKV-4's and RG-LRU's recurrences, sequential in torch
        call = f"{op}({', '.join(args)})"
        return (call if len(outputs) > 1 else f"{call}[0]"), {op}
    if op == "mlstm":  # xLSTM's recurrence (irc.ops.mlstm), sequential in torch
        call = f"mlstm({', '.join(args)}, heads={attrs['heads']}, eps={float(attrs['eps'])!r})"
        return (call if len(outputs) > 1 else f"{call}[0]"), {"mlstm"}
    if op == "ngram_hash":  # Qwen4-Exp's hashed n-gram ids (irc.ops.ngram), int64 in torch
        call = (f"ngram_hash({', '.join(args)}, eos={attrs['eos']}, multipliers={list(attrs['multipliers'])}, "
                f"primes={list(attrs['primes'])}, offsets={list(attrs['offsets'])}, heads={attrs['heads_per_ngram']})")
        return (call if len(outputs) > 1 else f"{call}[0]"), {"ngram_hash"}
    if op == "moe_dispatch":
        return (f"moe_dispatch({args[0]}, experts={attrs['experts']}, "
                f"capacity_factor={attrs['capacity_factor']!r})", {"moe_dispatch"})
    raise KeyError(op)
