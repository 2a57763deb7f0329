"""Absorbed MLA (``mla_absorbed_attention``, what ``mla-absorb`` leaves): the launch plan of
one node, and its attention kernel over the latent cache.

The node runs as (B batch, T new tokens, H heads, d_c latent width, R RoPE width):

1. q = q_b_absorbed(rms_norm(q_a(x))) (or wq_absorbed(x)): matmuls and a row kernel,
   [B, T, H, d_c + R];
2. kv = kv_a(x) [B, T, d_c + R]; the RMSNorm of its first d_c columns is written by a row
   kernel straight into the present latent cache [B, 1, P+T, d_c] at rows P..P+T-1;
3. RoPE rotates q's last R columns of every head in place and writes the rotated k_rope
   (kv's last R columns) into the present RoPE cache [B, 1, P+T, R];
4. the attention kernel (``attention.attention_kernel`` with the ``mla`` feature): every
   head shares the one latent "KV head", so a program holds a block of heads and reads
   each latent tile once for all of them, scores = q_latent . c_kv + q_rope . k_rope,
   values = the same c_kv tile; decode (T = 1) splits the cache over programs
   (flash-decoding) as FlashMLA does; output [B, T, H, d_c];
5. out = wo_absorbed(o) [B, T, d].
"""
from __future__ import annotations

from irc.graph import Node
from irc.ops.attention import mla_softmax_scale
from irc.ops.mla import OPERANDS
from irc.ops.registry import by_name

from backends.triton.kernels import attention, dequant, elementwise, norm

def norm_kernel(planner, dtype, eps: float, nodes: list[Node]) -> str:
    """The single-RMSNorm row kernel (shared with plain ``rms_norm`` nodes of the same eps)."""
    inputs = [elementwise.RowInput("x0", "rows", dtype), elementwise.RowInput("x1", "vector", dtype)]
    steps = norm.norm_lines("rms_norm", {"eps": eps, "offset": 0.0}, "v0", ["x0", "x1"], dtype)
    return planner.row_kernel(["rms_norm"], inputs, steps, [elementwise.RowOutput("v0", dtype)], nodes)


def plan_mla(planner, node: Node) -> None:
    ops = by_name(OPERANDS, node.inputs)
    attrs = node.attrs
    x = ops["x"]
    dtype = x.dtype
    heads, rank, rope_dim = attrs["heads"], attrs["kv_lora_rank"], attrs["qk_rope_head_dim"]
    batch, seq = x.shape[:2]
    out = node.outputs[0]
    name = planner.var(out)
    xv, W = planner.var(x), planner.var
    shape = f"({batch}, {seq}, "
    empty = f"device=DEVICE, dtype={_torch(dtype)})"
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
    q = f"{name}_q"
    if ops["wq_absorbed"] is not None:
        lines += [f"{q} = torch.empty({shape}{heads * (rank + rope_dim)}), {empty}",
                  project(xv, ops["wq_absorbed"], q)]
    else:
        q_rank = attrs["q_lora_rank"]
        lines += [f"{name}_qa = torch.empty({shape}{q_rank}), {empty}",
                  project(xv, ops["q_a"], f"{name}_qa"),
                  f"{name}_qa_norm = torch.empty({shape}{q_rank}), {empty}",
                  f"launch_{norm_name}({batch}, {seq}, {q_rank}, {name}_qa, {W(ops['q_a_norm'])}, {name}_qa_norm)",
                  f"{q} = torch.empty({shape}{heads * (rank + rope_dim)}), {empty}",
                  project(f"{name}_qa_norm", ops["q_b_absorbed"], q)]
    kv = f"{name}_kv"
    lines += [f"{kv} = torch.empty({shape}{rank + rope_dim}), {empty}", project(xv, ops["kv_a"], kv)]
    if len(node.outputs) == 3:
        latent, rope_cache = planner.var(node.outputs[1]), planner.var(node.outputs[2])
    else:
        latent, rope_cache = f"{name}_latent", f"{name}_rope"
        lines += [f"{latent} = torch.empty(({batch}, 1, {seq}, {rank}), {empty}",
                  f"{rope_cache} = torch.empty(({batch}, 1, {seq}, {rope_dim}), {empty}"]
    new_rows = f"{latent}.shape[2] - {seq}"
    lines.append(f"launch_{norm_name}({batch}, {seq}, {rank}, {kv}[..., :{rank}], {W(ops['kv_a_norm'])}, "
                 f"{latent}[:, 0, {new_rows}:])")
    rope_config = attrs["rope"]
    convention = rope_config.get("convention", "half")
    cos, sin = planner.cos_sin(ops["position_ids"], rope_dim, rope_config["base"], rope_config.get("scaling"))
    rotate = planner.rope_kernel(convention, dtype, [node])
    q_heads = f"{q}.view({batch}, {seq}, {heads}, {rank + rope_dim})"
    lines += [f"launch_{rotate}({q_heads}[..., {rank}:], {q_heads}[..., {rank}:], {cos}, {sin}, {rope_dim})"
              "  # in place",
              f"launch_{rotate}({kv}[..., {rank}:].view({batch}, {seq}, 1, {rope_dim}), "
              f"{rope_cache}[:, :, {rope_cache}.shape[2] - {seq}:].transpose(1, 2), {cos}, {sin}, {rope_dim})"]
    features = attention.AttentionFeatures(mla=True)
    launcher = planner.attention_kernels(dtype, features, [node])
    scale = mla_softmax_scale(attrs["qk_nope_head_dim"], rope_dim, rope_config, attrs["scale"])
    causal = "" if attrs["causal"] else ", causal=False"
    o = f"{name}_o"
    lines += [f"{o} = torch.empty({shape}{heads * rank}), {empty}",
              f"launch_{launcher}({q_heads}, {latent}, {rope_cache}, {o}.view({batch}, {seq}, {heads}, {rank}), "
              f"{planner.var(ops['attention_mask'])}, {float(scale)!r}{causal})",
              planner.alloc(out),
              project(o, ops["wo_absorbed"], name)]
    planner.step([node], lines, kernels=list(dict.fromkeys(kernels + [norm_name, rotate, launcher])))


def _torch(dtype) -> str:
    from backends.triton.kernels import torch_type
    return torch_type(dtype)
