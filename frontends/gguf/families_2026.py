"""llama.cpp's architectures for decoders of ``frontends.hf.families_moe_2026``,
``families_moe_2026c``, ``families_aliases``, ``families_hunyuan``, ``families_llama4`` and
``families_2026``: their keys -> the ``Arch`` those modules build from a config.json (the same
graph), their tensors -> the same irc params.

=============  ===================================================================================
exaone4        EXAONE-4.0: no pre-norms, each branch's output RMS-normed (``post_attention_norm``,
               ``post_ffw_norm``) before its residual add, per-head ``attn_q_norm`` / ``attn_k_norm``;
               with ``attention.sliding_window`` the layers ``sliding_window_pattern`` marks (one
               bool a layer; default all but every 4th) attend within the window with RoPE, the
               others are full and NoPE; without it every layer is full with RoPE
exaone-moe     K-EXAONE: EXAONE-4's attention and windows in pre-norm layers (``attn_norm``,
               ``ffn_norm``), leading dense layers, then DeepSeek-V3's MoE as glm4moe's (below); the
               last ``nextn_predict_layers`` blocks are MTP layers, as glm4moe's
glm4moe        GLM-4.5: q/k/v biases where the file has ``attn_q.bias``, per-head q/k norms where it
               has ``attn_q_norm``, RoPE on ``rope.dimension_count`` dims (rotate-half, not
               permuted), leading dense layers, then DeepSeek-V3's MoE: sigmoid scores
               (``expert_gating_func`` 2), ``exp_probs_b`` for the choice, ``expert_weights_norm``,
               ``expert_weights_scale``, ``expert_shared_count`` shared experts,
               ``expert_group_count`` groups; the MLP's norm is ``post_attention_norm``. The last
               ``nextn_predict_layers`` of ``block_count`` blocks are the multi-token-prediction
               layers: not part of the model (as transformers' causal LM leaves them); the first
               is the MTP head's (``frontends.gguf.mtp``: ``graph.parts["mtp"]``), the rest read by nothing
ernie4_5       ERNIE-4.5: Llama with interleaved RoPE (llama.cpp's normal rope; not permuted)
ernie4_5-moe   + a softmax MoE on the layers with ``ffn_gate_inp`` (the converter's
               ``leading_dense_block_count`` / ``interleave_moe_layer_step``), ``exp_probs_b`` (stored
               [E] or, from ERNIE's checkpoints, [1, E]) added for the choice, renormalised,
               ``expert_shared_count`` shared experts
hunyuan-moe    Hunyuan-A13B: q/k RMS norms per head *after* RoPE, biases where the file has them
               (q, k, v and o), every layer a renormalised softmax MoE plus one shared MLP of
               ``expert_shared_feed_forward_length``; the alpha-NTK RoPE is the converter's
               ``rope.freq_base`` (already base * alpha ^ (D / (D - 2)))
hunyuan-dense  the same attention, a SwiGLU MLP
dots1          dots.llm1: Qwen-3 attention (per-head q/k norms), leading dense layers, then
               DeepSeek-V3's MoE (sigmoid: an ``expert_gating_func`` other than 2 is refused);
               no windows (llama.cpp's dots1 has none)
seed_oss       Seed-OSS: Llama (rotate-half, not permuted) with q/k/v biases and o's where the file
               has them; the MLP's norm is ``post_attention_norm`` (the converter's name)
arcee          Arcee AFM: Llama (Q/K rows and biases un-permuted) with an ungated squared-ReLU MLP
               (``ffn_up``, ``ffn_down``, their biases where present), attention biases where present
minimax-m2     MiniMax-M2: q and k RMS-normed over their full width, RoPE on
               ``rope.dimension_count`` dims, every layer a sigmoid MoE with ``exp_probs_b``,
               renormalised (llama.cpp's fixed routing), experts of ``expert_feed_forward_length``
exaone         EXAONE 3.x: Llama (rotate-half, not permuted), biases where the file has them, RoPE over
               the whole head
minicpm3       MiniCPM3 as llama.cpp's graph runs it: MLA (``attn_q_a``, ``attn_kv_a_mqa``, ``attn_kv_b``,
               ``key_length`` = nope + rope dims, values of ``value_length`` or embedding_length /
               heads) with rotate-half RoPE on ``rope.dimension_count`` dims, a SwiGLU MLP, and its
               fixed µP (no key holds them): embeddings times 12, branches times 1.4 / sqrt(layers),
               logits times 256 / embedding_length. LongRoPE (``rope_factors_long/short``) is refused
               (the tensors have no place)
afmoe          AFMoE (Arcee Trinity) as llama.cpp's graph runs it: embeddings times sqrt(d) (µP, always),
               RMS norms before and after each branch (``post_attention_norm``, ``ffn_norm``,
               ``post_ffw_norm``), per-head q/k norms, the attention output times
               sigmoid(``attn_gate`` x) per head (``attn_q`` and ``attn_gate`` read as irc's gated
               query), layers i with (i + 1) % 4 sliding (``attention.sliding_window``) with RoPE,
               the others full and NoPE (not permuted: the converter skips Llama's permute); after
               ``ffn_gate_inp``-less dense layers a sigmoid MoE with ``exp_probs_b``,
               ``expert_weights_norm``, ``expert_weights_scale`` and ``expert_shared_count`` shared
llama4         Llama-4's text model as llama.cpp runs it (no key says it): layers i with (i + 1) % 4
               attend in chunks of 8192 with interleaved RoPE (not permuted: the converter's
               ``undo_permute`` is false) and q/k RMS-normed without a weight (not with 128 experts:
               Maverick), every 4th layer full and NoPE with the query temperature 1 + 0.1 ·
               log(1 + floor((position + 1) / 8192)); the layers with ``ffn_gate_inp`` a sigmoid
               top-k MoE weighting the experts' inputs plus a shared expert (``*_shexp``), the
               others a SwiGLU MLP of ``feed_forward_length``. ``attention.sliding_window`` (0:
               MobileLLM's all-full layout, which llama.cpp runs with its last layer NoPE) is refused
=============  ===================================================================================

stablelm, nemotron, starcoder (gpt_bigcode), jais2 and dbrx, the LayerNorm-era decoders, are
``frontends.gguf.families_2026b``'s (this module registers them and hands it their tensors).

Every refusal is a SpecError naming the file and the GGUF key (``dots1.expert_gating_func``).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Optional

import numpy as np

from frontends.gguf import families_2026b
from frontends.gguf.arch import Hparams, dense_mlp, make_arch, moe_layers, read_dims, read_rope, window_layers
from frontends.gguf.reader import GGUFFile
from frontends.gguf.tensors import TensorSource
from frontends.hf.config import Arch, Attention, LayerSpec
from irc.errors import SpecError

MODEL_TYPES = {"exaone4": "exaone4", "glm4moe": "glm4_moe", "ernie4_5": "ernie4_5", "ernie4_5-moe": "ernie4_5_moe",
               "hunyuan-moe": "hunyuan_v1_moe", "hunyuan-dense": "hunyuan_v1_dense", "dots1": "dots1",
               "seed_oss": "seed_oss", "arcee": "arcee", "minimax-m2": "minimax_m2", "exaone": "exaone",
               "llama4": "llama4_text", "exaone-moe": "exaone_moe", "afmoe": "afmoe", "minicpm3": "minicpm3"}
MINICPM3_SCALES = (12.0, 1.4, 256)  # llama.cpp's fixed MiniCPM3 µP: scale_emb, scale_depth, dim_model_base
AFMOE_PERIOD = 4  # llama.cpp's AFMoE graph: RoPE (and the window) on layers i with (i + 1) % 4, the others full NoPE
LLAMA4_CHUNK, LLAMA4_PERIOD = 8192, 4  # llama.cpp's fixed Llama-4 attention: chunks of 8192, every 4th layer NoPE
LLAMA4_TEMPERATURE = (0.1, 8192)  # ... its NoPE layers' query temperature: attn_scale, floor_scale
LLAMA4_NO_QK_NORM = 128  # ... and no q/k norms with 128 experts (Maverick), as its config says
SIGMOID = 2  # llama.cpp's expert_gating_func for sigmoid scores


def _has(hp: Hparams, tensor: str) -> bool:
    return tensor in hp.gguf.tensors


def _gqa(dims: dict, **extra) -> Attention:
    return Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], **extra)


def _biases(hp: Hparams) -> dict:
    """q/k/v and o biases as the file has them (the converter writes what the checkpoint has)."""
    return {"qkv_bias": _has(hp, "blk.0.attn_q.bias"), "out_bias": _has(hp, "blk.0.attn_output.bias")}


def _arch(hp: Hparams, name: str, dims: dict, attention: Attention, layers: list, mlp, **extra) -> Arch:
    return make_arch(hp, name, MODEL_TYPES[hp.arch], dims, attention, layers, mlp, **extra)


def _sigmoid_only(hp: Hparams) -> None:
    gating = hp.count("expert_gating_func", SIGMOID)
    if gating != SIGMOID:
        raise hp.error("expert_gating_func", f"{gating} is not supported",
                       hint=f"{hp.arch} routes on sigmoid scores (2), as transformers' model does")


def _v3_moe(hp: Hparams) -> dict:
    """DeepSeek-V3's MoE as GLM-4.5 and dots1 files describe it."""
    _sigmoid_only(hp)
    moe = {"experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count"),
           "d_ff": hp.count("expert_feed_forward_length"),
           "shared_experts": hp.count("expert_shared_count", 0, minimum=0),
           "routed_scale": hp.number("expert_weights_scale", 1.0), "scoring": "sigmoid", "router_bias": True,
           "norm_topk_prob": hp.flag("expert_weights_norm", False)}
    groups = hp.count("expert_group_count", 1)
    if groups > 1:
        moe.update(groups=groups, top_groups=hp.count("expert_group_used_count"), group_score="top2_sum")
    return _top_k_checked(hp, moe)


def _top_k_checked(hp: Hparams, moe: dict) -> dict:
    if moe["top_k"] > moe["experts"]:
        raise hp.error("expert_used_count", f"{moe['top_k']} exceeds the {moe['experts']} experts (expert_count)")
    return moe


def describe_exaone4(hp: Hparams, name: str) -> Arch:
    """EXAONE-4.0 (the module docstring)."""
    from frontends.hf.families_moe_2026 import _post_norm_expand

    dims = read_dims(hp)
    n = dims["layers"]
    return _arch(hp, name, dims, _gqa(dims, qk_norm=True), _exaone_layers(hp, dims, [False] * n),
                 dense_mlp(hp, [False] * n), expand=_post_norm_expand)


def _exaone_layers(hp: Hparams, dims: dict, flags: list) -> list:
    """EXAONE-4's layers: with ``attention.sliding_window``, the pattern's sliding layers with
    RoPE and the others full and NoPE; without, every layer full with RoPE."""
    n, rope = dims["layers"], read_rope(hp, dims["head_dim"])
    window = hp.count("attention.sliding_window", None)
    local = window_layers(hp, n, 4) if window else [False] * n
    return [LayerSpec(window if is_local else None, rope if is_local or not window else None, is_moe)
            for is_local, is_moe in zip(local, flags)]


def describe_exaone_moe(hp: Hparams, name: str) -> Arch:
    """K-EXAONE (the module docstring)."""
    dims = read_dims(hp)
    dims["layers"] = main_layers(hp)
    flags = moe_layers(hp, dims["layers"])
    return _arch(hp, name, dims, _gqa(dims, qk_norm=True), _exaone_layers(hp, dims, flags), dense_mlp(hp, flags),
                 moe=_v3_moe(hp) if any(flags) else None)


def main_layers(hp: Hparams) -> int:
    """``block_count`` less the multi-token-prediction blocks (``nextn_predict_layers``)."""
    total, nextn = hp.count("block_count"), hp.count("nextn_predict_layers", 0, minimum=0)
    if nextn >= total:
        raise hp.error("nextn_predict_layers", f"{nextn} leaves none of the {total} blocks (block_count) to the model")
    return total - nextn


def describe_glm4moe(hp: Hparams, name: str) -> Arch:
    """GLM-4.5 (the module docstring)."""
    dims = read_dims(hp)
    n = dims["layers"] = main_layers(hp)
    rope = read_rope(hp, dims["head_dim"])
    attention = _gqa(dims, qkv_bias=_has(hp, "blk.0.attn_q.bias"), qk_norm=_has(hp, "blk.0.attn_q_norm.weight"))
    flags = moe_layers(hp, n)
    return _arch(hp, name, dims, attention, [LayerSpec(None, rope, f) for f in flags], dense_mlp(hp, flags),
                 moe=_v3_moe(hp) if any(flags) else None)


def describe_dots1(hp: Hparams, name: str) -> Arch:
    """dots.llm1 (the module docstring)."""
    dims = read_dims(hp)
    rope = read_rope(hp, dims["head_dim"])
    flags = moe_layers(hp, dims["layers"])
    return _arch(hp, name, dims, _gqa(dims, qk_norm=True), [LayerSpec(None, rope, f) for f in flags],
                 dense_mlp(hp, flags), moe=_v3_moe(hp) if any(flags) else None)


def describe_ernie(hp: Hparams, name: str) -> Arch:
    """ERNIE-4.5, dense and MoE (the module docstring)."""
    dims = read_dims(hp)
    rope = read_rope(hp, dims["head_dim"], convention="interleaved")
    flags = moe_layers(hp, dims["layers"])
    moe = None
    if any(flags):
        if hp.arch != "ernie4_5-moe":
            raise hp.gguf.error(f"blk.{flags.index(True)}.ffn_gate_inp.weight", "a router in an ernie4_5 file: "
                                "ernie4_5 has no experts", hint="ERNIE-4.5's MoE is the ernie4_5-moe architecture")
        gating = hp.count("expert_gating_func", 1)
        if gating != 1:
            raise hp.error("expert_gating_func", f"{gating} is not supported",
                           hint="ERNIE-4.5's MoE routes on softmax scores (1)")
        moe = _top_k_checked(hp, {
            "experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count"),
            "d_ff": hp.count("expert_feed_forward_length"),
            "shared_experts": hp.count("expert_shared_count", 0, minimum=0), "scoring": "softmax",
            "router_bias": any(n.endswith(".exp_probs_b.bias") for n in hp.gguf.tensors), "norm_topk_prob": True})
    return _arch(hp, name, dims, _gqa(dims), [LayerSpec(None, rope, f) for f in flags], dense_mlp(hp, flags), moe=moe)


def describe_hunyuan(hp: Hparams, name: str) -> Arch:
    """Hunyuan dense and MoE (the module docstring)."""
    dims = read_dims(hp)
    n, rope = dims["layers"], read_rope(hp, dims["head_dim"])
    if rope.rotary_dim is not None:
        raise hp.error("rope.dimension_count", f"rotates {rope.rotary_dim} of {dims['head_dim']} dims",
                       hint="Hunyuan's rotary embedding spans the head")
    attention = _gqa(dims, qk_norm="head_after_rope", **_biases(hp))
    if hp.arch == "hunyuan-dense":
        return _arch(hp, name, dims, attention, [LayerSpec(None, rope)] * n, dense_mlp(hp, [False] * n))
    flags = moe_layers(hp, n)
    if not all(flags):
        raise hp.gguf.error(f"blk.{flags.index(False)}.ffn_gate_inp.weight", "missing: every Hunyuan-MoE layer "
                            "has experts")
    shared = hp.count("expert_shared_count", 1)
    if shared != 1:
        raise hp.error("expert_shared_count", f"{shared} is not supported",
                       hint="transformers' Hunyuan-MoE has one shared MLP")
    moe = _top_k_checked(hp, {"experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count"),
                              "d_ff": hp.count("expert_feed_forward_length"), "shared_experts": 1,
                              "shared_d_ff": hp.count("expert_shared_feed_forward_length"), "scoring": "softmax",
                              "norm_topk_prob": True})
    return _arch(hp, name, dims, attention, [LayerSpec(None, rope, True)] * n, None, moe=moe)


def describe_llama_kin(hp: Hparams, name: str) -> Arch:
    """seed_oss, arcee and exaone (the module docstring)."""
    dims = read_dims(hp)
    n, rope = dims["layers"], read_rope(hp, dims["head_dim"])
    if rope.rotary_dim is not None:
        raise hp.error("rope.dimension_count", f"rotates {rope.rotary_dim} of {dims['head_dim']} dims",
                       hint=f"{hp.arch}'s rotary embedding spans the head")
    if hp.arch == "arcee":
        mlp = {"kind": "relu2", "d_ff": hp.count("feed_forward_length"), "bias": _has(hp, "blk.0.ffn_up.bias")}
        if _has(hp, "blk.0.ffn_gate.weight"):
            raise hp.gguf.error("blk.0.ffn_gate.weight", "a gate in an arcee file: Arcee's MLP is ungated")
    else:
        mlp = dense_mlp(hp, [False] * n)
    return _arch(hp, name, dims, _gqa(dims, **_biases(hp)), [LayerSpec(None, rope)] * n, mlp)


def describe_minimax_m2(hp: Hparams, name: str) -> Arch:
    """MiniMax-M2 (the module docstring)."""
    dims = read_dims(hp)
    n, rope = dims["layers"], read_rope(hp, dims["head_dim"])
    flags = moe_layers(hp, n)
    if not all(flags):
        raise hp.gguf.error(f"blk.{flags.index(False)}.ffn_gate_inp.weight", "missing: every MiniMax-M2 layer "
                            "has experts")
    _sigmoid_only(hp)
    moe = _top_k_checked(hp, {"experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count"),
                              "d_ff": hp.count("expert_feed_forward_length"), "scoring": "sigmoid",
                              "router_bias": True, "norm_topk_prob": True})
    return _arch(hp, name, dims, _gqa(dims, qk_norm="full"), [LayerSpec(None, rope, True)] * n, None, moe=moe)


def describe_llama4(hp: Hparams, name: str) -> Arch:
    """Llama-4's text model as llama.cpp runs it (the module docstring)."""
    from frontends.hf import families_llama4

    if hp.has("attention.sliding_window"):
        raise hp.error("attention.sliding_window", f"{hp.count('attention.sliding_window', minimum=0)} is not "
                       "supported", hint="irc reads Llama-4 files with llama.cpp's fixed chunked attention "
                                         f"({LLAMA4_CHUNK}; every {LLAMA4_PERIOD}th layer full, NoPE)")
    dims = read_dims(hp)
    n, rope = dims["layers"], read_rope(hp, dims["head_dim"], convention="interleaved")
    if rope.rotary_dim is not None:
        raise hp.error("rope.dimension_count", f"rotates {rope.rotary_dim} of {dims['head_dim']} dims",
                       hint="Llama-4 rotates the whole head")
    uses_rope = [(i + 1) % LLAMA4_PERIOD != 0 for i in range(n)]
    flags = moe_layers(hp, n)
    moe = _top_k_checked(hp, {"experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count"),
                              "d_ff": hp.count("expert_feed_forward_length")}) if any(flags) else None
    qk_norm = "plain" if not moe or moe["experts"] != LLAMA4_NO_QK_NORM else False
    layers = [LayerSpec(None, rope if uses_rope[i] else None, flags[i]) for i in range(n)]
    temperature = (*LLAMA4_TEMPERATURE, hp.count("context_length"), 1)
    chunks = [LLAMA4_CHUNK if r else None for r in uses_rope]
    return _arch(hp, name, dims, _gqa(dims, qk_norm=qk_norm), layers, dense_mlp(hp, flags), moe=moe,
                 expand=partial(families_llama4.expand, chunks, temperature))


def describe_minicpm3(hp: Hparams, name: str) -> Arch:
    """MiniCPM3 as llama.cpp runs it (the module docstring)."""
    from frontends.hf import families_2026 as hf_2026

    n, heads, d = hp.count("block_count"), hp.count("attention.head_count"), hp.count("embedding_length")
    rope_dim, qk_dim = hp.count("rope.dimension_count"), hp.count("attention.key_length")
    if qk_dim <= rope_dim:
        raise hp.error("attention.key_length", f"{qk_dim} leaves no room beside {rope_dim} rotary dims")
    if not _has(hp, "blk.0.attn_q_a.weight"):
        raise hp.gguf.error("blk.0.attn_q_a.weight", "missing: llama.cpp's MiniCPM3 projects q through q_lora_rank")
    mla = {"q_lora_rank": hp.count("attention.q_lora_rank"), "kv_lora_rank": hp.count("attention.kv_lora_rank"),
           "qk_nope_head_dim": qk_dim - rope_dim, "qk_rope_head_dim": rope_dim,
           "v_head_dim": hp.count("attention.value_length", d // heads)}
    dims = {"d": d, "heads": heads, "kv_heads": heads, "head_dim": qk_dim, "layers": n}
    rope = read_rope(hp, rope_dim)
    scale_emb, depth, base = MINICPM3_SCALES
    arch = _arch(hp, name, dims, Attention("mla", heads, heads, qk_dim, mla=mla), [LayerSpec(None, rope)] * n,
                 dense_mlp(hp, [False] * n), embedding_scale=scale_emb, residual_scale=depth / n ** 0.5,
                 logits_scale=None if base == d else base / d)
    arch.expand = partial(hf_2026._expand, form={})
    return arch


def describe_afmoe(hp: Hparams, name: str) -> Arch:
    """AFMoE (the module docstring)."""
    from frontends.hf import families_2026 as hf_2026

    dims = read_dims(hp)
    n, rope = dims["layers"], read_rope(hp, dims["head_dim"])
    sliding = [(i + 1) % AFMOE_PERIOD != 0 for i in range(n)]
    window = hp.count("attention.sliding_window", None)
    if window and window_layers(hp, n, AFMOE_PERIOD) != sliding:
        raise hp.error("attention.sliding_window_pattern", "marks other layers than every 4th full",
                       hint="llama.cpp's AFMoE rotates (and windows) all but every 4th layer")
    flags = moe_layers(hp, n)
    _sigmoid_only(hp)
    moe = _top_k_checked(hp, {
        "experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count"),
        "d_ff": hp.count("expert_feed_forward_length"), "scoring": "sigmoid", "router_bias": True,
        "norm_topk_prob": hp.flag("expert_weights_norm", False), "routed_scale": hp.number("expert_weights_scale", 1.0),
        "shared_experts": hp.count("expert_shared_count", 0, minimum=0)})
    layers = [LayerSpec(window if local else None, rope if local else None, f) for local, f in zip(sliding, flags)]
    arch = _arch(hp, name, dims, _gqa(dims, qk_norm=True), layers, dense_mlp(hp, flags), moe=moe, sandwich=True,
                 embedding_scale=dims["d"] ** 0.5)
    arch.expand = partial(hf_2026._expand, form={"attention": {"output_gate": True}})
    return arch


# ---- tensors ----------------------------------------------------------------------------------

PERMUTED = {"attn.wq": ("attn_q.weight", "heads"), "attn.wk": ("attn_k.weight", "kv_heads"),
            "attn.bq": ("attn_q.bias", "heads"), "attn.bk": ("attn_k.bias", "kv_heads")}  # LlamaModel's permute
POST_ATTENTION_NORM = ("seed_oss", "glm4moe")  # whose MLP norm gguf's name table calls post_attention_norm
BIASES = {"attn.bo": "attn_output.bias", "mlp.b_up": "ffn_up.bias", "mlp.b_down": "ffn_down.bias"}


def source(arch: Arch, gguf: GGUFFile, param: str, block: Optional[str], suffix: Optional[str]):
    """The tensor behind ``param`` where these archs depart from ``frontends.gguf.tensors``
    (None: the common layout holds)."""
    if gguf.arch in families_2026b.FAMILIES:
        return families_2026b.source(arch, gguf, param, block, suffix)
    if block is None:
        return None
    if gguf.arch == "afmoe" and suffix == "attn.wq":
        return QueryGate(block + "attn_q.weight", block + "attn_gate.weight", arch.attention.head_dim)
    if gguf.arch == "arcee" and suffix in PERMUTED:
        tensor, heads = PERMUTED[suffix]
        return TensorSource(block + tensor, permute_heads=getattr(arch.attention, heads))
    if gguf.arch in POST_ATTENTION_NORM and suffix == "mlp_norm":
        return TensorSource(block + "post_attention_norm.weight")
    if suffix == "moe.router_bias":  # ERNIE's checkpoints hold it as [1, E]
        return TensorSource(block + "exp_probs_b.bias", shape=(arch.moe["experts"],))
    if suffix in BIASES:
        return TensorSource(block + BIASES[suffix])
    return None


@dataclass(frozen=True)
class QueryGate:
    """AFMoE's ``attn_q`` and ``attn_gate`` [H·D, d] as irc's gated query [H·2D, d]: per head
    its query rows, then its gate rows (always in float: the interleave crosses blocks)."""

    query: str
    gate: str
    head_dim: int

    def names(self) -> list[str]:
        return [self.query, self.gate]

    def logical_shape(self, gguf: GGUFFile) -> tuple:
        shapes = [tuple(gguf.tensor(name).shape) for name in self.names()]
        if len(shapes[0]) != 2 or shapes[0] != shapes[1]:
            raise SpecError(f"tensors {self.query} {list(shapes[0])} and {self.gate} {list(shapes[1])} are not two "
                            "equal 2-D weights", location=gguf.path)
        return 2 * shapes[0][0], shapes[0][1]

    def exact(self, gguf: GGUFFile) -> bool:
        return False

    def read_float(self, gguf: GGUFFile) -> np.ndarray:
        query, gate = (TensorSource(name).read_float(gguf) for name in self.names())
        both = np.concatenate([t.reshape(-1, self.head_dim, t.shape[-1]) for t in (query, gate)], axis=1)
        return np.ascontiguousarray(both.reshape(-1, query.shape[-1]))

    def __repr__(self) -> str:
        return f"{self.query} + {self.gate}"


def consumed(gguf: GGUFFile) -> set:
    """Tensors no param reads: GLM-4.5's and K-EXAONE's multi-token-prediction blocks."""
    if gguf.arch not in ("glm4moe", "exaone-moe"):
        return set()
    main = main_layers(Hparams(gguf))
    return {name for name in gguf.tensors if name.startswith("blk.") and int(name.split(".")[1]) >= main}


FAMILIES = {"exaone4": describe_exaone4, "glm4moe": describe_glm4moe, "ernie4_5": describe_ernie,
            "ernie4_5-moe": describe_ernie, "hunyuan-moe": describe_hunyuan, "hunyuan-dense": describe_hunyuan,
            "dots1": describe_dots1, "seed_oss": describe_llama_kin, "arcee": describe_llama_kin,
            "minimax-m2": describe_minimax_m2, "exaone": describe_llama_kin, "llama4": describe_llama4,
            "exaone-moe": describe_exaone_moe, "afmoe": describe_afmoe, "minicpm3": describe_minicpm3,
            **families_2026b.FAMILIES}
