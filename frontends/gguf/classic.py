"""llama.cpp's architectures for the decoders of ``frontends.hf.families_olmo``,
``families_classic``, ``families_alibi``, ``families_cohere``, ``families_gpt_oss`` and
Ministral-3: their keys -> the ``Arch`` those modules build from a config.json (the same
decoder loops), their tensors -> the same irc params.

==========  =====================================================================================
olmo        OLMo-1: LayerNorms without weight or bias (``attention.layer_norm_epsilon``), Q/K rows
            un-permuted (the converter applied Llama's permute), q/k/v clamped to
            ±``attention.clamp_kqv`` where the file has it, SwiGLU
olmo2       OLMo-2: norms after attention and MLP (``post_attention_norm``, ``post_ffw_norm``),
            full-width ``attn_q_norm`` / ``attn_k_norm``, rotate-half RoPE (not permuted);
            OLMo-3's windowed layers (below)
starcoder2  LayerNorms with bias (``attention.layer_norm_epsilon``), biases on q, k, v, the
            output and the GELU MLP, ``attention.sliding_window`` on every layer
command-r   Command-R: one LayerNorm (no bias) feeding attention and MLP in parallel, adjacent
            pair RoPE, logits times ``logit_scale``; Command-R+'s per-head q/k LayerNorms
            when the file has ``attn_q_norm`` / ``attn_k_norm`` ([H, D], [K, D])
gpt2        learned positions (``position_embd``), the fused ``attn_qkv`` (the converter
            transposed every Conv1D weight: read as rows), biases, GELU (tanh)
phi2        Phi-2: one LayerNorm, attention and MLP in parallel, partial rotary
            (``rope.dimension_count``), biases, an ``output`` head with bias
gptneox     GPT-NeoX / Pythia: the fused ``attn_qkv`` (the converter regrouped HF's per-head
            q | k | v into all q | all k | all v: read as rows), LayerNorms with bias, biases,
            partial rotary (``rope.dimension_count``), exact GELU (Pythia's ``gelu``; llama.cpp
            computes ggml's tanh form), ``use_parallel_residual`` (default true) choosing
            x + attn(ln1(x)) + mlp(ln2(x)) or two sequential residual adds
falcon      Falcon: the fused ``attn_qkv`` (regrouped by the converter from HF's per-kv-group
            layout into all q | all k | all v), ``head_count_kv`` (1: Falcon-7B's multi-query);
            with ``attn_norm_2`` (Falcon-40B's ``ln_attn``, while ``attn_norm`` holds ``ln_mlp``)
            two LayerNorms in parallel, else one norm feeding attention and MLP; exact GELU;
            biases where the file has them (llama.cpp's runtime has none); tied without ``output``
glm4        GLM-4: the shared decoder with norms after attention and MLP
            (``post_attention_norm``, ``post_ffw_norm``), q/k/v biases, interleaved RoPE on
            ``rope.dimension_count`` dims (not permuted), the fused gate | up ``ffn_up`` split
            by rows (an ``attn_qkv`` likewise, where a file fuses it)
cohere2     Command-R7B: Command-R's parallel block, every layer sliding
            (``attention.sliding_window``) but each fourth (llama.cpp's fixed period 4, or
            ``attention.sliding_window_pattern``), RoPE on the sliding layers only
olmoe       OLMoE: pre-norm, ``attn_q_norm`` / ``attn_k_norm`` over the full width, rotate-half
            RoPE, a softmax top-k MoE on every layer, not renormalised (``expert_weights_norm``
            where a file has it; the converter drops HF's ``norm_topk_prob`` and ``clip_qkv``)
gpt-oss     GPT-OSS: ``attn_sinks``, q/k/v/o biases, layers alternating sliding
            (``attention.sliding_window``; even layers, llama.cpp's period 2) and full, YaRN
            (``rope.scaling.*``) with the ramp unrounded (``truncate`` false, as the model and
            transformers have it; ggml's rope rounds the ramp's ends), the MoE with a biased
            router (``ffn_gate_inp.bias``), biased experts and the clamped SwiGLU (alpha 1.702,
            limit 7: llama.cpp's constants); ``post_attention_norm`` is the norm before the MoE.
            Experts stored as MXFP4 (ggml's e2m1 codes times an e8m0 scale per 32) are
            dequantized exactly to float32 (``gguf``'s dequantizer is ggml's definition)
mistral3    Ministral-3: Llama (Q/K permuted) with YaRN and Llama-4's query scale
            (``attention.temperature_scale``; ``describe_mistral3``); its MoE form is refused
bloom       BLOOM: ALiBi with the paper's slopes (llama.cpp's fixed bias max 8), ``token_embd_norm``
            after the lookup, pre-LayerNorm layers with biases, the fused ``attn_qkv`` (regrouped
            by the converter from HF's per-head q | k | v into all q | all k | all v), biases,
            GELU (tanh); tied without ``output`` (older converters wrote ``output``, a copy of
            ``token_embd``: an untied head, as llama.cpp reads it)
mpt         MPT: ALiBi with MPT's slopes (``attention.max_alibi_bias``, which must be 8: transformers'
            MptModel always uses 8), LayerNorms without bias, ``attn_qkv`` (q | k | v), q, k and v
            clamped to ±``attention.clamp_kqv`` where the file has it, exact GELU (transformers'
            MptMLP; llama.cpp computes ggml's tanh form), no biases, tied without ``output``;
            refused, naming the tensor: ``attn_q_norm`` (qk_ln), biases, ``position_embd``
==========  =====================================================================================

OLMo-3 is ``olmo2`` with ``attention.sliding_window``: the layers ``sliding_window_pattern``
marks (one bool per layer, or a period; default every fourth layer full) attend within the
window with unscaled RoPE at ``rope.freq_base_swa`` (default ``rope.freq_base``), the others
with the file's RoPE scaling, as llama.cpp's olmo2 graph does.

Lost by the converters (the file cannot say it, so irc reads what llama.cpp runs): OLMoE's
``norm_topk_prob`` and ``clip_qkv``; GPT-OSS's ``layer_types`` other than alternating and
its ``swiglu_alpha`` / ``swiglu_limit``; Cohere-2's ``layer_types`` other than the period of
4; a sequential Falcon (``parallel_attn`` false: llama.cpp's falcon graph is parallel);
MPT's ``softmax_scale`` (llama.cpp scales by head_dim^-0.5) and ``layer_norm_epsilon`` (the
converter writes 1e-5).
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Optional

from frontends.gguf.arch import Hparams, make_arch, read_dims, read_rope, window_layers, _vocab
from frontends.gguf.reader import GGUFFile
from frontends.gguf.tensors import TensorSource
from frontends.hf.config import Arch, Attention, LayerSpec
from irc.errors import SpecError


def _arch(hp: Hparams, name: str, model_type: str, dims: dict, attention: Attention, layers: list, mlp: dict,
          eps_key: str, expand, **extra) -> Arch:
    return Arch(name=name, model_type=model_type, dtype="f32", vocab_size=_vocab(hp), d_model=dims["d"],
                n_layers=dims["layers"], norm_eps=hp.number(eps_key), attention=attention, layers=layers, mlp=mlp,
                tied="output.weight" not in hp.gguf.tensors, checkpoint=hp.arch, expand=expand, **extra)


def describe_olmo(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_olmo

    dims = read_dims(hp)
    rope = read_rope(hp, dims["head_dim"])
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"])
    return _arch(hp, name, "olmo", dims, attention, [LayerSpec(None, rope)] * dims["layers"],
                 {"kind": "swiglu", "d_ff": hp.count("feed_forward_length")}, "attention.layer_norm_epsilon",
                 partial(families_olmo._expand, "plain", hp.number("attention.clamp_kqv", None)))


def describe_olmo2(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_olmo

    dims = read_dims(hp)
    n, head_dim = dims["layers"], dims["head_dim"]
    rope = read_rope(hp, head_dim)
    window = hp.count("attention.sliding_window", 0, minimum=0)  # OLMo-3 (module docstring)
    if window:
        local_rope = read_rope(hp, head_dim, base=hp.number("rope.freq_base_swa", rope.base), scaled=False)
        layers = [LayerSpec(window, local_rope) if local else LayerSpec(None, rope)
                  for local in window_layers(hp, n, 4)]
    else:
        layers = [LayerSpec(None, rope)] * n
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], head_dim, qk_norm=True)
    return _arch(hp, name, "olmo3" if window else "olmo2", dims, attention, layers,
                 {"kind": "swiglu", "d_ff": hp.count("feed_forward_length")}, "attention.layer_norm_rms_epsilon",
                 partial(families_olmo._expand, "post", None))


def describe_starcoder2(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_olmo

    dims = read_dims(hp)
    window = hp.count("attention.sliding_window", None)
    bias = "blk.0.attn_q.bias" in hp.gguf.tensors
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qkv_bias=bias)
    mlp = {"kind": "gelu", "d_ff": hp.count("feed_forward_length"), "approximate": "tanh", "bias": bias}
    return _arch(hp, name, "starcoder2", dims, attention, [LayerSpec(window, read_rope(hp, dims["head_dim"]))]
                 * dims["layers"], mlp, "attention.layer_norm_epsilon", partial(families_olmo._expand, "layer", None))


def describe_command_r(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_cohere

    dims = read_dims(hp)
    qk_norm = "layer" if "blk.0.attn_q_norm.weight" in hp.gguf.tensors else False  # Command-R+: per head
    rope = read_rope(hp, dims["head_dim"], convention="interleaved")
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"])
    return _arch(hp, name, "cohere", dims, attention, [LayerSpec(None, rope)] * dims["layers"],
                 {"kind": "swiglu", "d_ff": hp.count("feed_forward_length")}, "attention.layer_norm_epsilon",
                 partial(families_cohere._expand, qk_norm=qk_norm), logits_scale=hp.number("logit_scale", None))


def describe_gpt2(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_classic

    dims = read_dims(hp)
    if "position_embd.weight" not in hp.gguf.tensors:
        raise hp.gguf.error("position_embd.weight", "GPT-2's learned position table is missing")
    positions = hp.gguf.tensor("position_embd.weight").shape[0]
    mlp = {"kind": "gelu", "d_ff": hp.count("feed_forward_length"), "bias": True, "approximate": "tanh",
           "positions": positions}
    attention = Attention("gqa", dims["heads"], dims["heads"], dims["head_dim"], qkv_bias=True)
    return _arch(hp, name, "gpt2", dims, attention, [LayerSpec(None, None)] * dims["layers"], mlp,
                 "attention.layer_norm_epsilon", partial(families_classic.expand, "gpt2"))


def describe_phi2(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_classic

    dims = read_dims(hp)
    mlp = {"kind": "gelu", "d_ff": hp.count("feed_forward_length"), "approximate": "tanh", "bias": True,
           "head_bias": "output.bias" in hp.gguf.tensors}
    attention = Attention("gqa", dims["heads"], dims["heads"], dims["head_dim"], qkv_bias=True)
    return _arch(hp, name, "phi", dims, attention, [LayerSpec(None, read_rope(hp, dims["head_dim"]))] * dims["layers"],
                 mlp, "attention.layer_norm_epsilon", partial(families_classic.expand, "parallel_one_norm"))


def _has(hp: Hparams, tensor: str) -> bool:
    return tensor in hp.gguf.tensors


def describe_gptneox(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_classic

    dims = read_dims(hp)
    mlp = {"kind": "gelu", "d_ff": hp.count("feed_forward_length"), "approximate": "none",
           "bias": _has(hp, "blk.0.ffn_up.bias")}
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"],
                          qkv_bias=_has(hp, "blk.0.attn_qkv.bias"))
    form = "parallel_two_norms" if hp.flag("use_parallel_residual", True) else "sequential"
    return _arch(hp, name, "gpt_neox", dims, attention, [LayerSpec(None, read_rope(hp, dims["head_dim"]))]
                 * dims["layers"], mlp, "attention.layer_norm_epsilon", partial(families_classic.expand, form))


def describe_falcon(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_classic

    dims = read_dims(hp)
    mlp = {"kind": "gelu", "d_ff": hp.count("feed_forward_length"), "approximate": "none",
           "bias": _has(hp, "blk.0.ffn_up.bias"), "head_bias": False}
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"],
                          qkv_bias=_has(hp, "blk.0.attn_qkv.bias"))
    form = "parallel_two_norms" if _has(hp, "blk.0.attn_norm_2.weight") else "parallel_one_norm"
    return _arch(hp, name, "falcon", dims, attention, [LayerSpec(None, read_rope(hp, dims["head_dim"]))]
                 * dims["layers"], mlp, "attention.layer_norm_epsilon", partial(families_classic.expand, form))


def describe_bloom(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_classic
    from irc.ops.alibi import bloom_slopes

    dims = read_dims(hp)
    if not _has(hp, "token_embd_norm.weight"):
        raise hp.gguf.error("token_embd_norm.weight", "BLOOM's LayerNorm of the embeddings is missing")
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qkv_bias=True,
                          alibi=tuple(bloom_slopes(dims["heads"]).tolist()))
    mlp = {"kind": "gelu", "d_ff": hp.count("feed_forward_length"), "bias": True, "approximate": "tanh",
           "embed_norm": True}
    return _arch(hp, name, "bloom", dims, attention, [LayerSpec(None, None)] * dims["layers"], mlp,
                 "attention.layer_norm_epsilon", partial(families_classic.expand, "sequential"))


MPT_REFUSED = {"attn_q_norm.weight": "q/k LayerNorms (attn_config.qk_ln)", "attn_qkv.bias": "biases (no_bias false)",
               "ffn_up.bias": "biases (no_bias false)", "attn_norm.bias": "biases (no_bias false)"}


def describe_mpt(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_classic
    from frontends.hf.families_alibi import MPT_BIAS_MAX  # transformers' MptModel's, whatever the config says
    from irc.ops.alibi import mpt_slopes

    dims = read_dims(hp)
    bias_max = hp.number("attention.max_alibi_bias", None, positive=False)
    if bias_max != MPT_BIAS_MAX:
        raise hp.error("attention.max_alibi_bias", "missing" if bias_max is None else f"{bias_max:g} is not 8",
                       hint="irc builds MPT's ALiBi slopes with bias max 8, as transformers' MptModel does "
                            "(0: an MPT without ALiBi, which transformers does not run either)")
    for i in range(dims["layers"]):
        for tensor, what in MPT_REFUSED.items():
            if _has(hp, f"blk.{i}.{tensor}"):
                raise hp.gguf.error(f"blk.{i}.{tensor}", f"MPT's {what} are not supported",
                                    hint="transformers' MPT has none")
    if _has(hp, "position_embd.weight"):
        raise hp.gguf.error("position_embd.weight", "MPT's learned positions (attn_config.alibi false) are not "
                            "supported", hint="transformers' MPT always adds ALiBi")
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"],
                          alibi=tuple(mpt_slopes(dims["heads"], MPT_BIAS_MAX).tolist()),
                          clip_qkv=hp.number("attention.clamp_kqv", None))
    mlp = {"kind": "gelu", "d_ff": hp.count("feed_forward_length"), "bias": False, "approximate": "none",
           "norm_bias": False, "head_bias": False}
    return _arch(hp, name, "mpt", dims, attention, [LayerSpec(None, None)] * dims["layers"], mlp,
                 "attention.layer_norm_epsilon", partial(families_classic.expand, "sequential"))


def describe_glm4(hp: Hparams, name: str) -> Arch:
    dims = read_dims(hp)
    rope = read_rope(hp, dims["head_dim"], convention="interleaved")
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"],
                          qkv_bias=_has(hp, "blk.0.attn_q.bias") or _has(hp, "blk.0.attn_qkv.bias"))
    return make_arch(hp, name, "glm4", dims, attention, [LayerSpec(None, rope)] * dims["layers"],
                     {"kind": "swiglu", "d_ff": hp.count("feed_forward_length")}, sandwich=True)


def describe_cohere2(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_cohere

    dims = read_dims(hp)
    window = hp.count("attention.sliding_window")
    rope = read_rope(hp, dims["head_dim"], convention="interleaved")
    layers = [LayerSpec(window, rope) if local else LayerSpec(None, None)
              for local in window_layers(hp, dims["layers"], 4)]
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"])
    mlp = {"kind": "swiglu", "d_ff": hp.count("feed_forward_length")}
    return _arch(hp, name, "cohere2", dims, attention, layers, mlp,
                 "attention.layer_norm_epsilon", partial(families_cohere._expand, qk_norm=False),
                 logits_scale=hp.number("logit_scale", None))


def describe_olmoe(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_olmo

    dims = read_dims(hp)
    moe = {"experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count"),
           "d_ff": hp.count("expert_feed_forward_length", None) or hp.count("feed_forward_length"),
           "norm_topk_prob": hp.flag("expert_weights_norm", False)}
    if moe["top_k"] > moe["experts"]:
        raise hp.error("expert_used_count", f"top_k {moe['top_k']} exceeds {moe['experts']} experts")
    rope = read_rope(hp, dims["head_dim"])
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qk_norm=True)
    return _arch(hp, name, "olmoe", dims, attention, [LayerSpec(None, rope, True)] * dims["layers"], None,
                 "attention.layer_norm_rms_epsilon", partial(families_olmo._expand, "pre", None), moe=moe)


def describe_mistral3(hp: Hparams, name: str) -> Arch:
    """Ministral-3 (Q/K permuted as Llama's): YaRN, where ``rope.scaling.yarn_log_multiplier``
    is mscale_all_dim itself (``Ministral3Model``; DeepSeek's file holds 0.1 x it), and
    Llama-4's query scale 1 + ``attention.temperature_scale`` x log(1 + floor(position /
    ``rope.scaling.original_context_length``))."""
    dims = read_dims(hp)
    if any(f"blk.{i}.ffn_gate_inp.weight" in hp.gguf.tensors for i in range(dims["layers"])):
        raise hp.gguf.error("blk.0.ffn_gate_inp.weight", "mistral3's MoE layers are not supported")
    rope = read_rope(hp, dims["head_dim"])
    if rope.scaling and "mscale" in rope.scaling:
        log_multiplier = hp.number("rope.scaling.yarn_log_multiplier")
        rope = replace(rope, scaling={**rope.scaling, "mscale": log_multiplier, "mscale_all_dim": log_multiplier})
    beta = hp.number("attention.temperature_scale", None)
    query_scale = None
    if beta:
        if not rope.scaling or "original_max_position" not in rope.scaling:
            raise hp.error("attention.temperature_scale", "Llama-4's query scale needs "
                           f"{hp.key('rope.scaling.original_context_length')} (YaRN's original context)")
        query_scale = (beta, rope.scaling["original_max_position"], hp.count("context_length"))
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], query_scale=query_scale)
    window = hp.count("attention.sliding_window", None)
    return make_arch(hp, name, "ministral3", dims, attention, [LayerSpec(window, rope)] * dims["layers"],
                     {"kind": "swiglu", "d_ff": hp.count("feed_forward_length")})


GPT_OSS_SWIGLU = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}  # llama.cpp's ggml_swiglu_oai constants


def describe_gpt_oss(hp: Hparams, name: str) -> Arch:
    from frontends.hf import families_gpt_oss

    dims = read_dims(hp)
    window = hp.count("attention.sliding_window")
    rope = read_rope(hp, dims["head_dim"])
    if rope.scaling and rope.scaling["kind"] == "yarn":  # the model's YaRN ramp is not rounded
        rope = replace(rope, scaling={**rope.scaling, "truncate": False})
    layers = [LayerSpec(window if local else None, rope, True) for local in window_layers(hp, dims["layers"], 2)]
    moe = {"experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count"),
           "d_ff": hp.count("expert_feed_forward_length"), "norm_topk_prob": True, "activation": "swiglu_oai",
           "router_logit_bias": _has(hp, "blk.0.ffn_gate_inp.bias"),
           "expert_bias": _has(hp, "blk.0.ffn_gate_exps.bias"), **GPT_OSS_SWIGLU}
    if moe["top_k"] > moe["experts"]:
        raise hp.error("expert_used_count", f"top_k {moe['top_k']} exceeds {moe['experts']} experts")
    if not _has(hp, "blk.0.attn_sinks.weight"):
        raise hp.gguf.error("blk.0.attn_sinks.weight", "GPT-OSS's attention sinks are missing")
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"],
                          qkv_bias=_has(hp, "blk.0.attn_q.bias"))
    return _arch(hp, name, "gpt_oss", dims, attention, layers, None, "attention.layer_norm_rms_epsilon",
                 families_gpt_oss._expand, moe=moe)


# ---- tensors -------------------------------------------------------------------------------

BIASES = {"attn_norm.bias": "attn_norm.bias", "mlp_norm.bias": "ffn_norm.bias", "attn.bo": "attn_output.bias",
          "mlp.b_up": "ffn_up.bias", "mlp.b_down": "ffn_down.bias", "mlp.w_up": "ffn_up.weight",
          "mlp.w_down": "ffn_down.weight"}
TOP = {"norm.bias": "output_norm.bias", "lm_head.bias": "output.bias", "embed_positions": "position_embd.weight",
       "embed_norm": "token_embd_norm.weight", "embed_norm.bias": "token_embd_norm.bias"}
DEPARTURES = {  # arch -> irc name under layers.{i}. -> GGUF name under blk.{i}.
    "gpt-oss": {"attn.sinks": "attn_sinks.weight", "mlp_norm": "post_attention_norm.weight",
                "moe.router_logit_bias": "ffn_gate_inp.bias", "moe.b_gate": "ffn_gate_exps.bias",
                "moe.b_up": "ffn_up_exps.bias", "moe.b_down": "ffn_down_exps.bias"},
}
# Falcon-40B: attn_norm_2 is ln_attn (irc's attn_norm), attn_norm is ln_mlp (irc's mlp_norm)
FALCON_TWO_NORMS = {"attn_norm": "attn_norm_2.weight", "attn_norm.bias": "attn_norm_2.bias",
                    "mlp_norm": "attn_norm.weight", "mlp_norm.bias": "attn_norm.bias"}
QKV = ("attn.wq", "attn.wk", "attn.wv", "attn.bq", "attn.bk", "attn.bv")
FUSED_QKV = ("gpt2", "gptneox", "falcon", "bloom", "mpt")  # archs whose files always hold one attn_qkv


def source(arch: Arch, gguf: GGUFFile, param: str, block: Optional[str], suffix: Optional[str]):
    """The tensor behind ``param`` where these archs depart from ``frontends.gguf.tensors``
    (None: the common layout holds)."""
    if param in TOP:
        return TensorSource(TOP[param])
    if gguf.arch == "falcon" and suffix in FALCON_TWO_NORMS and f"{block}attn_norm_2.weight" in gguf.tensors:
        return TensorSource(block + FALCON_TWO_NORMS[suffix])
    if gguf.arch in ("olmo", "mistral3") and suffix in ("attn.wq", "attn.wk"):  # Llama's permute
        heads = arch.attention.heads if suffix == "attn.wq" else arch.attention.kv_heads
        return TensorSource(f"{block}attn_{suffix[-1]}.weight", permute_heads=heads)
    if suffix in DEPARTURES.get(gguf.arch, {}):
        return TensorSource(block + DEPARTURES[gguf.arch][suffix])
    if suffix in ("mlp.w_gate", "mlp.w_up") and arch.mlp and arch.mlp["kind"] == "swiglu" \
            and f"{block}ffn_gate.weight" not in gguf.tensors:  # GLM-4: one ffn_up, gate rows | up rows
        d_ff = arch.mlp["d_ff"]
        return TensorSource(block + "ffn_up.weight", rows=(0, d_ff) if suffix == "mlp.w_gate" else (d_ff, 2 * d_ff))
    if suffix in BIASES:
        return TensorSource(block + BIASES[suffix])
    if suffix in QKV:
        return _fused_qkv(arch, gguf, block, suffix)
    return None


def _fused_qkv(arch: Arch, gguf: GGUFFile, block: str, suffix: str):
    """Rows of the fused ``attn_qkv`` (all q | all k | all v: GPT-2's c_attn as rows, MPT's
    Wqkv, the converter's regrouping of GPT-NeoX, Falcon and BLOOM, older Phi-2 and GLM-4
    files), or None where the file keeps q, k and v apart."""
    kind = "weight" if suffix.startswith("attn.w") else "bias"
    name = f"{block}attn_qkv.{kind}"
    if name not in gguf.tensors:
        if gguf.arch in FUSED_QKV:
            raise SpecError(f"tensor {name} is missing: {gguf.arch} keeps q, k and v fused", location=gguf.path)
        return None
    a = arch.attention
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    rows = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}[suffix[-1]]
    return TensorSource(name, rows=rows)


FAMILIES = {"olmo": describe_olmo, "olmo2": describe_olmo2, "starcoder2": describe_starcoder2,
            "command-r": describe_command_r, "cohere2": describe_cohere2, "gpt2": describe_gpt2, "phi2": describe_phi2,
            "gptneox": describe_gptneox, "falcon": describe_falcon, "glm4": describe_glm4, "olmoe": describe_olmoe,
            "gpt-oss": describe_gpt_oss, "mistral3": describe_mistral3, "bloom": describe_bloom,
            "mpt": describe_mpt}
