"""MLA over the latent cache: the launch plan of one ``mla_absorbed_attention`` (folded
weights) or ``mla_latent_attention`` (absorbed at run time, ``mla-absorb``'s default) node,
its attention kernel over the latent cache, and the per-head GEMM of run-time absorption.

The node runs as (B batch, T new tokens, H heads, d_c latent width, R RoPE width):

1. q = q_b(rms_norm(q_a(x))) (or wq(x)): matmuls and a row kernel, [B, T, H, W] with
   W = d_c + R folded (``q_b_absorbed``), W = nope + R at run time;
2. kv = kv_a(x) [B, T, d_c + R]; the RMSNorm of its first d_c columns is written by a row
   kernel straight into the present latent cache [B, 1, P+T, d_c] at rows P..P+T-1;
3. RoPE rotates q's last R columns of every head (in place when folded; at run time into
   the latent query's last R columns, whose first d_c columns the head GEMM fills with
   q_nope_h W^UK_h, one launch over all heads) and writes the rotated k_rope (kv's last R
   columns) into the present RoPE cache [B, 1, P+T, R];
4. the attention kernel (``attention.attention_kernel`` with the ``mla`` feature): every
   head shares the one latent "KV head", so a program holds a block of heads and reads
   each latent tile once for all of them, scores = q_latent . c_kv + q_rope . k_rope,
   values = the same c_kv tile; decode (T = 1) splits the cache over programs
   (flash-decoding) as FlashMLA does; output [B, T, H, d_c];
5. folded: out = wo_absorbed(o); at run time the head GEMM maps o back out per head,
   o_h W^UV_h^T [B, T, H, v] (W^UV read in place from its [H, v, d_c] view), then out = wo(.).
"""
from __future__ import annotations

from irc.dtypes import DType
from irc.graph import Node
from irc.ops.attention import mla_softmax_scale
from irc.ops.mla import OPERANDS
from irc.ops.mla_latent import OPERANDS as LATENT_OPERANDS
from irc.ops.registry import by_name

from backends.triton.kernels import (Kernel, attention, dequant, docstring, dot, elementwise, indent, mixed_type,
                                     norm, parameter_lines, signature_type)

def norm_kernel(planner, dtype, eps: float, nodes: list[Node]) -> str:
    """The single-RMSNorm row kernel (shared with plain ``rms_norm`` nodes of the same eps)."""
    inputs = [elementwise.RowInput("x0", "rows", dtype), elementwise.RowInput("x1", "vector", dtype)]
    steps = norm.norm_lines("rms_norm", {"eps": eps, "offset": 0.0}, "v0", ["x0", "x1"], dtype)
    return planner.row_kernel(["rms_norm"], inputs, steps, [elementwise.RowOutput("v0", dtype)], nodes)


def plan_mla(planner, node: Node) -> None:
    run_time = node.op == "mla_latent_attention"
    ops = by_name(LATENT_OPERANDS if run_time else OPERANDS, node.inputs)
    attrs = node.attrs
    x, dtype = ops["x"], ops["x"].dtype
    heads, rank, rope_dim, nope = attrs["heads"], attrs["kv_lora_rank"], attrs["qk_rope_head_dim"], \
        attrs["qk_nope_head_dim"]
    batch, seq = x.shape[:2]
    name = planner.var(node.outputs[0])
    shape, empty = f"({batch}, {seq}, ", f"device=DEVICE, dtype={_torch(dtype)})"
    kernels = []
    norm_name = norm_kernel(planner, dtype, attrs["eps"], [node])

    def project(source: str, weight, target: str) -> str:
        """The launch line of target = source @ weight.T (a float or a folded quantized weight)."""
        fields, operands = dequant.weight(planner, weight)
        kernel = planner.matmul_kernel([node], dtype, fields, dtype)
        kernels.append(kernel)
        main, trailing = dequant.launch_args(planner, [operands])
        return f"launch_{kernel}({', '.join([source] + main + [target] + trailing)})"

    lines = [planner.late_caches[v.name] for v in node.outputs[1:] if v.name in planner.late_caches]
    wq, q_b = ("wq", "q_b") if run_time else ("wq_absorbed", "q_b_absorbed")
    q, q_width = f"{name}_q", (nope if run_time else rank) + rope_dim
    if ops[wq] is not None:
        lines += [f"{q} = torch.empty({shape}{heads * q_width}), {empty}", project(planner.var(x), ops[wq], q)]
    else:
        q_rank = attrs["q_lora_rank"]
        lines += [f"{name}_qa = torch.empty({shape}{q_rank}), {empty}",
                  project(planner.var(x), ops["q_a"], f"{name}_qa"),
                  f"{name}_qa_norm = torch.empty({shape}{q_rank}), {empty}",
                  f"launch_{norm_name}({batch}, {seq}, {q_rank}, {name}_qa, {planner.var(ops['q_a_norm'])}, "
                  f"{name}_qa_norm)",
                  f"{q} = torch.empty({shape}{heads * q_width}), {empty}",
                  project(f"{name}_qa_norm", ops[q_b], q)]
    kv = f"{name}_kv"
    lines += [f"{kv} = torch.empty({shape}{rank + rope_dim}), {empty}", project(planner.var(x), ops["kv_a"], kv)]
    latent, rope_cache, more = _caches(planner, node, name, batch, seq, rank, rope_dim, empty)
    lines += more + [f"launch_{norm_name}({batch}, {seq}, {rank}, {kv}[..., :{rank}], "
                     f"{planner.var(ops['kv_a_norm'])}, {latent}[:, 0, {latent}.shape[2] - {seq}:])"]
    rope_config = attrs["rope"]
    place, rotate = _placer(planner, node, ops, rope_dim, dtype)
    q_heads = f"{q}.view({batch}, {seq}, {heads}, {q_width})"
    if run_time:  # the latent query: [q_nope W^UK | rotated q_rope] per head
        gemm = planner.use_kernel("mla_head_gemm", lambda n: head_gemm_kernel(n, dtype), [node])
        kernels.append(gemm)
        query = f"{name}_q_latent"
        lines += [f"{query} = torch.empty(({batch}, {seq}, {heads}, {rank + rope_dim}), {empty}",
                  f"launch_{gemm}({q_heads}[..., :{nope}].flatten(0, 1), {planner.var(ops['w_uk'])}, "
                  f"{query}[..., :{rank}].flatten(0, 1))",
                  place(f"{q_heads}[..., {nope}:]", f"{query}[..., {rank}:]")]
    else:
        query = q_heads
        if rope_config is not None:
            lines.append(place(f"{q_heads}[..., {rank}:]", f"{q_heads}[..., {rank}:]", "  # in place"))
    lines.append(place(f"{kv}[..., {rank}:].view({batch}, {seq}, 1, {rope_dim})",
                       f"{rope_cache}[:, :, {rope_cache}.shape[2] - {seq}:].transpose(1, 2)"))
    launcher = planner.attention_kernels(dtype, attention.AttentionFeatures(mla=True), [node])
    scale = mla_softmax_scale(nope, rope_dim, rope_config, attrs["scale"])
    causal = "" if attrs["causal"] else ", causal=False"
    o = f"{name}_o"
    lines += [f"{o} = torch.empty({shape}{heads * rank}), {empty}",
              f"launch_{launcher}({query}, {latent}, {rope_cache}, {o}.view({batch}, {seq}, {heads}, {rank}), "
              f"{planner.var(ops['attention_mask'])}, {float(scale)!r}{causal})", planner.alloc(node.outputs[0])]
    if run_time:  # back out of latent space per head: o_h W^UV_h^T
        v_dim = attrs["v_head_dim"]
        lines += [f"{o}_v = torch.empty({shape}{heads * v_dim}), {empty}",
                  f"launch_{gemm}({o}.view(-1, {heads}, {rank}), "
                  f"{planner.var(ops['w_uv'])}.transpose(1, 2), {o}_v.view(-1, {heads}, {v_dim}))",
                  project(f"{o}_v", ops["wo"], name)]
    else:
        lines.append(project(o, ops["wo_absorbed"], name))
    used = [norm_name] + ([rotate] if rotate else []) + [launcher]
    planner.step([node], lines, kernels=list(dict.fromkeys(kernels + used)))


def _placer(planner, node: Node, ops: dict, rope_dim: int, dtype: DType):
    """(place(source, target, note="") -> the launcher line writing the rope columns, the
    rotate kernel): rotated, or, for MLA without RoPE (Kimi-Linear), copied as they are
    (no kernel)."""
    rope_config = node.attrs["rope"]
    if rope_config is None:
        return (lambda source, target, note="": f"{target}.copy_({source})"), None
    cos, sin = planner.cos_sin(ops["position_ids"], rope_dim, rope_config["base"], rope_config.get("scaling"))
    rotate = planner.rope_kernel(rope_config.get("convention", "half"), dtype, [node])
    return (lambda source, target, note="": f"launch_{rotate}({source}, {target}, {cos}, {sin}, {rope_dim}){note}",
            rotate)


def _caches(planner, node: Node, name: str, batch, seq, rank: int, rope_dim: int, empty: str) -> tuple:
    """(latent cache var, RoPE cache var, allocation lines): the present caches, or
    buffers of the new rows alone when the node has no past."""
    if len(node.outputs) == 3:
        return planner.var(node.outputs[1]), planner.var(node.outputs[2]), []
    latent, rope_cache = f"{name}_latent", f"{name}_rope"
    return latent, rope_cache, [f"{latent} = torch.empty(({batch}, 1, {seq}, {rank}), {empty}",
                                f"{rope_cache} = torch.empty(({batch}, 1, {seq}, {rope_dim}), {empty}"]


def head_gemm_kernel(name: str, dtype: DType) -> Kernel:
    """out[m, h, :] = a[m, h, :] @ w[h] for every head h in one launch (grid: tiles x heads)."""
    ptr = "*" + signature_type(dtype)
    sig = {"a_ptr": ptr, "w_ptr": ptr, "o_ptr": ptr}
    sig.update({n: "i32" for n in ("M", "K", "N", "stride_am", "stride_ah", "stride_wh", "stride_wk", "stride_wn",
                                   "stride_om", "stride_oh")})
    sig.update({n: "constexpr" for n in ("PRECISION", "MIXED", "BLOCK_M", "BLOCK_N", "BLOCK_K")})
    body = ["pid = tl.program_id(0)",
            "h = tl.program_id(1)",
            "tiles_n = tl.cdiv(N, BLOCK_N)",
            "rm = (pid // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)",
            "rn = (pid % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)",
            "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
            "for k0 in range(0, K, BLOCK_K):",
            "    rk = k0 + tl.arange(0, BLOCK_K)",
            "    a = tl.load(a_ptr + h * stride_ah + rm[:, None] * stride_am + rk[None, :],",
            "                mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)",
            "    w = tl.load(w_ptr + h * stride_wh + rk[:, None] * stride_wk + rn[None, :] * stride_wn,",
            "                mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)",
            *indent(dot("a", "w", "acc", mixed_type(dtype)), 1),
            "tl.store(o_ptr + h * stride_oh + rm[:, None] * stride_om + rn[None, :], acc.to(o_ptr.dtype.element_ty),",
            "         mask=(rm[:, None] < M) & (rn[None, :] < N))"]
    source = "\n".join(["@triton.jit", f"def {name}(", *indent(parameter_lines(sig), 1), "):",
                        docstring("Per-head GEMM of run-time MLA absorption: out[m, h] = a[m, h] @ w[h].",
                                  ["a [M, H, K] and out [M, H, N] with unit last stride; w [H, K, N] any strides",
                                   "(W^UK [H, nope, d_c] as is; W^UV [H, v, d_c] read transposed in place)."]),
                        *indent(body, 1)])
    launcher = "\n".join([
        f"def launch_{name}(a, w, out):",
        '    """out[m, h, :] = a[m, h, :] @ w[h] for a [M, H, K], w [H, K, N], out [M, H, N] views."""',
        "    M, H, K = a.shape",
        "    N = w.shape[2]",
        "    if M == 0:",
        "        return",
        "    block_m = 16 if INTERPRETED or M <= 16 else 64",
        "    block_n = min(128, max(16, triton.next_power_of_2(N)))",
        "    block_k = min(64, max(16, triton.next_power_of_2(K)))",
        f"    {name}[(triton.cdiv(M, block_m) * triton.cdiv(N, block_n), H)](",
        "        a, w, out, M, K, N, a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), out.stride(0),",
        "        out.stride(1), PRECISION=DOT_PRECISION, MIXED=MIXED_DOT, BLOCK_M=block_m, BLOCK_N=block_n,",
        "        BLOCK_K=block_k)",
    ])
    return Kernel(name, "mla", source, launcher, sig,
                  {"PRECISION": "ieee", "MIXED": False, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64},
                  tensor_cores=True)


def _torch(dtype) -> str:
    from backends.triton.kernels import torch_type
    return torch_type(dtype)
