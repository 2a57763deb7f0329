"""Flash attention kernels: causal, online softmax, grouped KV heads read once per group.

One program owns one KV head (or, for MLA, the single latent "head") and a tile of query
rows made of BLOCK_G query heads of that head's group times BLOCK_T query positions, so
each K/V tile is loaded once for the whole group: GQA/MQA without repeated K/V. Scores
run through the running max/sum of the online softmax in fp32; a row that sees no key
ends as zeros, never NaN (``irc.ops.attention.masked_softmax``).

Visibility, as ``irc.ops.attention.visible_keys``: query t sits at cache index P + t; key
j is visible iff j < S, j <= P + t (CAUSAL), j > P + t - WINDOW (WINDOW > 0) and
mask[b, j] != 0 (HAS_MASK); with a ``blocks_ptr`` [B, T] key j of the chunk (j >= P) is, without
CAUSAL, visible iff its block id equals the query's (block-diagonal attention over packed
images: Qwen-VL's frames and windows), and with CAUSAL also visible past the causal frontier
when it is a token of the query's image (equal ids >= 0: Gemma 3's image tokens, which see
each other both ways; the prefill loop then runs to S). SOFTCAP > 0 caps the scaled scores (Gemma 2) before masking;
with a ``slope_ptr`` [H] (f32, ALiBi) slope_h · (j − (P + t)) is added to them after the cap;
with CHUNK > 0 (and a ``pad_ptr`` [B]: each row's left padding) key j is visible only in the
query's chunk, ⌊(j − pad)/CHUNK⌋ = ⌊(P + t − pad)/CHUNK⌋ (Llama-4).
WINDOW and SOFTCAP are compile-time options; the code for them is generated only when the
graph has a windowed or soft-capped attention.

Sinks (GPT-OSS, ``irc.ops.attention``): with a ``sink_ptr`` [H] operand the online softmax
starts from the head's sink logit instead of an empty row: running max m = sink, running
sum l = exp(sink - sink) = 1, no value. The key tiles then rescale it like any earlier
tile, so the result is exactly softmax over [scores, sink] with the sink column's weight
dropped (a row seeing no key outputs zeros: acc stays 0 while l = 1). Split-KV decode
seeds only split 0, so ``combine`` counts the sink once.

Variants (same math):
- ``prefill``: grid (query tiles, B * kv heads, head chunks); the key loop stops at the
  causal frontier and starts at the window's edge.
- ``decode`` (T = 1): split-KV (flash-decoding): grid (B * kv heads, splits, head chunks);
  each split writes its partial (max, sum, weighted values) and ``combine`` merges them;
  with one split the kernel normalises and stores directly.
- ``mla``: the key is two parts read from two caches, the latent c_kv [B, 1, S, d_c] and
  the RoPE key [B, 1, S, R]; scores are q_latent . c_kv + q_rope . k_rope and the values
  are the latent tile already loaded (``backends.triton.kernels.mla``).
"""
from __future__ import annotations

from dataclasses import dataclass

from irc.dtypes import DType

from backends.triton.kernels import Kernel, docstring, dot, indent, mixed_type, parameter_lines, signature_type


@dataclass
class AttentionFeatures:
    """What the generated text handles (flags from the graph's attention nodes)."""

    softcap: bool = False
    window: bool = False
    mla: bool = False
    sinks: bool = False
    blocks: bool = False  # equal block ids: bidirectional restricted to them, causal opened by them
    alibi: bool = False  # per-head slopes times key minus query index added to the scores (BLOOM, MPT)
    chunk: bool = False  # a query sees its chunk's keys only, counted from the row's first real token (Llama-4)


def _signature(dtype: DType, features: AttentionFeatures, decode: bool) -> dict:
    ptr = "*" + signature_type(dtype)
    sig = {"q_ptr": ptr, "k_ptr": ptr}
    sig["r_ptr" if features.mla else "v_ptr"] = ptr
    sig.update({"o_ptr": ptr, "mask_ptr": "*i64"})
    if features.sinks:
        sig["sink_ptr"] = ptr
    if features.blocks:
        sig["blocks_ptr"] = "*i64"
    if features.alibi:
        sig["slope_ptr"] = "*fp32"
    if features.chunk:
        sig["pad_ptr"] = "*i64"
    if decode:
        sig.update({"part_ptr": "*fp32", "ml_ptr": "*fp32"})
    names = ["stride_qb", "stride_qt", "stride_qh", "stride_kb", "stride_kh", "stride_ks"]
    names += ["stride_rb", "stride_rs"] if features.mla else ["stride_vb", "stride_vh", "stride_vs"]
    names += ["stride_ob", "stride_ot", "stride_oh", "stride_mb"] + (["stride_blk"] if features.blocks else [])
    names += ["T", "S", "P", "KV_HEADS", "D", "DV"]
    if features.mla:
        names.append("DR")
    if decode:
        names += ["KEYS_PER_SPLIT", "SPLITS"]
    sig.update({name: "i32" for name in names})
    sig["scale"] = "fp32"
    constexprs = ["GROUP", "BLOCK_G", "BLOCK_T", "BLOCK_N", "BLOCK_D", "BLOCK_DV", "CAUSAL", "WINDOW", "SOFTCAP",
                  "HAS_MASK", "PRECISION", "MIXED"] + (["CHUNK"] if features.chunk else [])
    if features.mla:
        constexprs.append("BLOCK_DR")
    if decode:
        constexprs.append("SPLIT")
    sig.update({name: "constexpr" for name in constexprs})
    return sig


def _key_loop(features: AttentionFeatures, mix: str) -> list[str]:
    """The body of the loop over key tiles [start, start + BLOCK_N), keys below ``hi``."""
    lines = ["j = start + tl.arange(0, BLOCK_N)",
             "j_ok = j < hi",
             "k = tl.load(k_ptr + b * stride_kb + kh * stride_kh + j[:, None] * stride_ks + d[None, :], "
             "mask=j_ok[:, None] & (d < D)[None, :], other=0.0)",
             "s = tl.zeros([BLOCK_G * BLOCK_T, BLOCK_N], tl.float32)",
             *dot("q", "tl.trans(k)", "s", mix)]
    if features.mla:
        lines += ["kr = tl.load(r_ptr + b * stride_rb + j[:, None] * stride_rs + dr[None, :], "
                  "mask=j_ok[:, None] & (dr < DR)[None, :], other=0.0)",
                  *dot("qr", "tl.trans(kr)", "s", mix)]
    lines.append("s = s * scale")
    if features.softcap:
        lines += ["if SOFTCAP > 0:", "    s = SOFTCAP * tanh_f32(s / SOFTCAP)"]
    if features.alibi:
        lines.append("s = s + slope[:, None] * (j[None, :] - qpos[:, None]).to(tl.float32)  # ALiBi")
    lines.append("visible = j_ok[None, :]")
    if features.blocks:  # the block of each key of this chunk (-2: a past key, in no block)
        lines += ["kblock = tl.load(blocks_ptr + b * stride_blk + (j - P), mask=j_ok & (j >= P), other=-2)",
                  "same = kblock[None, :] == qblock[:, None]",
                  "if CAUSAL:  # or one image's tokens, both ways (Gemma 3)",
                  "    visible = visible & ((j[None, :] <= qpos[:, None]) | (same & (qblock[:, None] >= 0)))",
                  "else:  # only the query's own block (block-diagonal)",
                  "    visible = visible & same"]
    else:
        lines += ["if CAUSAL:", "    visible = visible & (j[None, :] <= qpos[:, None])"]
    if features.window:
        lines += ["if WINDOW > 0:", "    visible = visible & (j[None, :] > qpos[:, None] - WINDOW)"]
    if features.chunk:  # Llama-4's chunks, from the row's first real token
        lines += ["if CHUNK > 0:",
                  "    visible = visible & ((j[None, :] - row_pad) // CHUNK == (qpos[:, None] - row_pad) // CHUNK)"]
    lines += ["if HAS_MASK:",
              "    keep = tl.load(mask_ptr + b * stride_mb + j, mask=j_ok, other=0)",
              "    visible = visible & (keep != 0)[None, :]",
              's = tl.where(visible, s, float("-inf"))',
              "m_new = tl.maximum(m_i, tl.max(s, axis=1))",
              'm_safe = tl.where(m_new == float("-inf"), 0.0, m_new)',
              "alpha = tl.exp(m_i - m_safe)",
              "p = tl.exp(s - m_safe[:, None])",
              "l_i = l_i * alpha + tl.sum(p, axis=1)"]
    if features.mla:
        lines.append("v = k  # the latent is both key part and value")
    else:
        lines.append("v = tl.load(v_ptr + b * stride_vb + kh * stride_vh + j[:, None] * stride_vs + dv[None, :], "
                     "mask=j_ok[:, None] & (dv < DV)[None, :], other=0.0)")
    lines += ["acc = acc * alpha[:, None]", *dot("p.to(v.dtype)", "v", "acc", mix), "m_i = m_new"]
    return lines


def _prologue(features: AttentionFeatures, decode: bool) -> list[str]:
    if decode:
        lines = ["pid_bk = tl.program_id(0)",
                 "split = tl.program_id(1)",
                 "pid_g = tl.program_id(2)",
                 "r = tl.arange(0, BLOCK_G * BLOCK_T)  # BLOCK_T = 1: one query per head",
                 "g = pid_g * BLOCK_G + r",
                 "t = r * 0"]
    else:
        lines = ["pid_t = tl.program_id(0)",
                 "pid_bk = tl.program_id(1)",
                 "pid_g = tl.program_id(2)",
                 "r = tl.arange(0, BLOCK_G * BLOCK_T)",
                 "g = pid_g * BLOCK_G + r // BLOCK_T",
                 "t = pid_t * BLOCK_T + r % BLOCK_T"]
    lines += ["b = pid_bk // KV_HEADS",
              "kh = pid_bk % KV_HEADS",
              "row_ok = (g < GROUP) & (t < T)",
              "head = kh * GROUP + g",
              "qpos = P + t",
              "d = tl.arange(0, BLOCK_D)",
              "dv = tl.arange(0, BLOCK_DV)",
              "q_row = q_ptr + b * stride_qb + t * stride_qt + head * stride_qh",
              "q = tl.load(q_row[:, None] + d[None, :], mask=row_ok[:, None] & (d < D)[None, :], other=0.0)"]
    if features.blocks:
        lines.append("qblock = tl.load(blocks_ptr + b * stride_blk + t, mask=row_ok, other=-1)")
    if features.alibi:
        lines.append("slope = tl.load(slope_ptr + head, mask=row_ok, other=0.0)")
    if features.chunk:
        lines.append("row_pad = tl.load(pad_ptr + b)")
    if features.mla:
        lines += ["dr = tl.arange(0, BLOCK_DR)",
                  "qr = tl.load(q_row[:, None] + D + dr[None, :], mask=row_ok[:, None] & (dr < DR)[None, :], "
                  "other=0.0)"]
    lines += ['m_i = tl.full([BLOCK_G * BLOCK_T], float("-inf"), tl.float32)',
              "l_i = tl.zeros([BLOCK_G * BLOCK_T], tl.float32)",
              "acc = tl.zeros([BLOCK_G * BLOCK_T, BLOCK_DV], tl.float32)"]
    if features.sinks:  # the sink as the first 'key': running max sink, sum exp(0) = 1, no value
        lines.append("sink = tl.load(sink_ptr + head, mask=row_ok, other=0.0).to(tl.float32)")
        if decode:
            lines += ["m_i = tl.where(split == 0, sink, m_i)  # one split carries the sink",
                      "l_i = tl.where(split == 0, l_i + 1.0, l_i)"]
        else:
            lines += ["m_i = sink", "l_i = l_i + 1.0"]
    if decode:
        lines += ["lo = split * KEYS_PER_SPLIT",
                  "hi = tl.minimum(S, lo + KEYS_PER_SPLIT)"]
        if features.window:
            lines += ["if WINDOW > 0:",
                      "    lo = tl.maximum(lo, tl.maximum(P - WINDOW + 1, 0) // BLOCK_N * BLOCK_N)"]
    else:
        lines += ["lo = 0", "hi = S"]
        if not features.blocks:  # (an image's later tokens are visible to its earlier ones)
            lines += ["if CAUSAL:  # keys past the tile's last query are never visible",
                      "    hi = tl.minimum(S, P + (pid_t + 1) * BLOCK_T)"]
        if features.window:
            lines += ["if WINDOW > 0:",
                      "    lo = tl.maximum(P + pid_t * BLOCK_T - WINDOW + 1, 0) // BLOCK_N * BLOCK_N"]
    return lines


def _epilogue(decode: bool) -> list[str]:
    store = ["o_row = o_ptr + b * stride_ob + t * stride_ot + head * stride_oh",
             "out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]",
             "tl.store(o_row[:, None] + dv[None, :], out.to(o_ptr.dtype.element_ty), "
             "mask=row_ok[:, None] & (dv < DV)[None, :])"]
    if not decode:
        return store
    heads = "KV_HEADS * GROUP"
    return ["if SPLIT:  # partial results for attention_combine: [B, H, SPLITS, DV] and [B, H, SPLITS, 2]",
            f"    slot = ((b * {heads} + head) * SPLITS + split)",
            "    part_ok = row_ok[:, None] & (dv < DV)[None, :]",
            "    tl.store(part_ptr + slot[:, None] * DV + dv[None, :], acc, mask=part_ok)",
            "    tl.store(ml_ptr + slot * 2, m_i, mask=row_ok)",
            "    tl.store(ml_ptr + slot * 2 + 1, l_i, mask=row_ok)",
            "else:",
            *indent(store, 1)]


def attention_kernel(name: str, dtype: DType, features: AttentionFeatures, decode: bool) -> Kernel:
    sig = _signature(dtype, features, decode)
    body = _prologue(features, decode) + ["for start in range(lo, hi, BLOCK_N):",
                                          *indent(_key_loop(features, mixed_type(dtype)), 1)]
    body += _epilogue(decode)
    what = "absorbed MLA over the latent cache" if features.mla else "grouped-query flash attention"
    variant = "decode (T = 1, split-KV)" if decode else "prefill"
    key = ("q [B, T, H, D_c + R]; latent k [B, 1, S, D_c] (also the value); RoPE key r [B, 1, S, R]"
           if features.mla else "q [B, T, H, D]; k [B, K, S, D]; v [B, K, S, DV] (strided views)")
    source = "\n".join(["@triton.jit", f"def {name}(", *indent(parameter_lines(sig), 1), "):",
                        docstring(f"{what.capitalize()}, {variant}.",
                                  [key, "o [B, T, H, DV]; mask [B, S] (i64) when HAS_MASK.",
                                   "Rows of a program: BLOCK_G heads of one KV group x BLOCK_T queries."]),
                        *indent(body, 1)])
    # a compile check's sizes: Llama-like head dims, small tiles (fp32 FMA code compiles slowly)
    constexprs = {"GROUP": 4, "BLOCK_G": 16 if decode else 4, "BLOCK_T": 1 if decode else 4, "BLOCK_N": 32,
                  "BLOCK_D": 64, "BLOCK_DV": 64, "CAUSAL": True, "WINDOW": 4096 if features.window else 0,
                  "SOFTCAP": 50.0 if features.softcap else 0.0, "HAS_MASK": True, "PRECISION": "ieee",
                  "MIXED": False, **({"CHUNK": 8192} if features.chunk else {})}
    if features.mla:
        constexprs.update({"BLOCK_D": 128, "BLOCK_DV": 128, "BLOCK_DR": 32, "GROUP": 16, "BLOCK_G": 16,
                           "BLOCK_T": 1, "BLOCK_N": 16})
    if decode:
        constexprs["SPLIT"] = True
    return Kernel(name, "mla" if features.mla else "attention", source, "", sig, constexprs, tensor_cores=True)


def combine_kernel(name: str, dtype: DType) -> Kernel:
    """Merge the split-KV partials of a decode step: out = sum_s w_s acc_s / sum_s w_s l_s,
    w_s = exp(m_s - max_s m_s)."""
    sig = {"part_ptr": "*fp32", "ml_ptr": "*fp32", "o_ptr": "*" + signature_type(dtype), "stride_ob": "i32",
           "stride_oh": "i32", "HEADS": "i32", "SPLITS": "i32", "DV": "i32", "BLOCK_S": "constexpr",
           "BLOCK_DV": "constexpr"}
    body = ["pid = tl.program_id(0)",
            "b = pid // HEADS",
            "h = pid % HEADS",
            "s = tl.arange(0, BLOCK_S)",
            "dv = tl.arange(0, BLOCK_DV)",
            "s_ok = s < SPLITS",
            "slot = pid * SPLITS + s",
            'm = tl.load(ml_ptr + slot * 2, mask=s_ok, other=float("-inf"))',
            "l = tl.load(ml_ptr + slot * 2 + 1, mask=s_ok, other=0.0)",
            "m_max = tl.max(m, axis=0)",
            'w = tl.exp(m - tl.where(m_max == float("-inf"), 0.0, m_max))',
            "acc = tl.load(part_ptr + slot[:, None] * DV + dv[None, :], mask=s_ok[:, None] & (dv < DV)[None, :], "
            "other=0.0)",
            "total = tl.sum(l * w, axis=0)",
            "out = tl.sum(acc * w[:, None], axis=0) / tl.where(total > 0, total, 1.0)",
            "tl.store(o_ptr + b * stride_ob + h * stride_oh + dv, out.to(o_ptr.dtype.element_ty), mask=dv < DV)"]
    source = "\n".join(["@triton.jit", f"def {name}(", *indent(parameter_lines(sig), 1), "):",
                        docstring("Merge split-KV decode partials (running max, sum, weighted values) per head.",
                                  ["part [B, H, SPLITS, DV] and ml [B, H, SPLITS, 2] fp32 -> o [B, 1, H, DV]."]),
                        *indent(body, 1)])
    return Kernel(name, "attention", source, "", sig, {"BLOCK_S": 16, "BLOCK_DV": 64})


def attention_launcher(name: str, prefill: str, decode: str, combine: str, mla: bool, sinks: bool = False,
                       blocks: bool = False, alibi: bool = False, chunk: bool = False) -> str:
    """The launch helper choosing the prefill or decode kernel (and the split count); with
    ``sinks`` it takes the per-head sink logits [H] (``sinks=``) and hands them to both; with
    ``blocks``, the block id of each query of the chunk [B, T] (i64); with ``alibi``, the
    per-head ALiBi slopes [H] (f32); with ``chunk``, ``chunk=C`` (each row's left padding is
    counted from the mask here)."""
    if mla:
        signature = "q, latent, rope, out, mask, scale, causal=True, splits=None"
        unpack = ["    B, T, H, _ = q.shape",
                  "    S, D, DR = latent.shape[2], latent.shape[3], rope.shape[3]",
                  "    KV, DV, k, second = 1, D, latent, rope",
                  "    window, softcap = 0, 0.0",
                  "    block_g = min(triton.next_power_of_2(H), MLA_HEAD_BLOCK)",
                  "    extra = dict(BLOCK_DR=triton.next_power_of_2(max(DR, 16)))",
                  "    strides = (k.stride(0), 0, k.stride(2), rope.stride(0), rope.stride(2))",
                  "    sizes = (D, DV, DR)"]
    else:
        signature = "q, k, v, out, mask, scale, window=0, softcap=0.0, causal=True, splits=None"
        if sinks or blocks or alibi:
            signature = signature.replace("scale, ", "scale, " + "sinks, " * sinks + "blocks, " * blocks
                                          + "slopes, " * alibi)
        if chunk:
            signature = signature.replace("splits=None", "splits=None, chunk=0")
        unpack = ["    B, T, H, D = q.shape",
                  "    KV, S, DV = k.shape[1], k.shape[2], v.shape[3]",
                  "    second = v",
                  "    block_g = triton.next_power_of_2(H // KV)",
                  "    extra = {}",
                  "    strides = (k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2))",
                  "    sizes = (D, DV)"]
    operands = "q, k, second, out, mask" + ", sinks" * sinks + ", blocks" * blocks + ", slopes" * alibi \
        + ", pad" * chunk
    return "\n".join([
        f"def launch_{name}({signature}):",
        '    """out [B, T, H, DV] = attention of q over the S keys of the cache views, the T new',
        '    queries being its last T positions (see the kernels)."""',
        *unpack,
        "    group = H // KV",
        "    P = S - T  # keys before the first new query",
        "    block_d = triton.next_power_of_2(max(D, 16))",
        "    block_dv = triton.next_power_of_2(max(DV, 16))",
        "    has_mask = mask is not None",
        *(["    pad = ((mask.cumsum(1) == 0).sum(1) if has_mask else torch.zeros(B, device=q.device)).to(torch.int64)",
           "    extra = dict(extra, CHUNK=chunk)"] if chunk else []),
        "    mask = mask if has_mask else q",
        "    mask_stride = mask.stride(0) if has_mask else 0",
        "    common = (q.stride(0), q.stride(1), q.stride(2), *strides, out.stride(0), out.stride(1), out.stride(2),",
        "              mask_stride, " + "blocks.stride(0), " * blocks + "T, S, P, KV, *sizes)",
        "    options = dict(GROUP=group, BLOCK_D=block_d, BLOCK_DV=block_dv, CAUSAL=causal, WINDOW=window,",
        "                   SOFTCAP=softcap, HAS_MASK=has_mask, PRECISION=DOT_PRECISION, MIXED=MIXED_DOT, **extra)",
        "    if T == 1:",
        "        block_g = max(16, block_g)",
        "        chunks = triton.cdiv(group, block_g)",
        "        if splits is None:",
        "            wanted = triton.cdiv(DECODE_PROGRAMS, B * KV * chunks)  # enough programs to fill the GPU",
        "            splits = max(1, min(triton.cdiv(S, DECODE_MIN_KEYS), wanted))",
        "        per_split = triton.cdiv(triton.cdiv(S, splits), ATTENTION_BLOCK_N) * ATTENTION_BLOCK_N",
        "        splits = triton.cdiv(S, per_split)",
        "        part = torch.empty((B, H, splits, DV), device=q.device, dtype=torch.float32) if splits > 1 else q",
        "        ml = torch.empty((B, H, splits, 2), device=q.device, dtype=torch.float32) if splits > 1 else q",
        f"        {decode}[(B * KV, splits, chunks)](",
        f"            {operands}, part, ml, *common, per_split, splits, scale,",
        "            BLOCK_G=block_g, BLOCK_T=1, BLOCK_N=ATTENTION_BLOCK_N, SPLIT=splits > 1, **options)",
        "        if splits > 1:",
        f"            {combine}[(B * H,)](part, ml, out, out.stride(0), out.stride(2), H, splits, DV,",
        "                                BLOCK_S=triton.next_power_of_2(splits), BLOCK_DV=block_dv)",
        "        return",
        "    block_t = max(1, ATTENTION_ROWS // block_g)",
        f"    {prefill}[(triton.cdiv(T, block_t), B * KV, triton.cdiv(group, block_g))](",
        f"        {operands}, *common, scale,",
        "        BLOCK_G=block_g, BLOCK_T=block_t, BLOCK_N=ATTENTION_BLOCK_N, **options)",
    ])
