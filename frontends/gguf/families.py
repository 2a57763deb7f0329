"""GGUF metadata -> the normalised ``Arch`` the Hugging Face frontend builds.

``describe(gguf, name)`` reads ``general.architecture`` and that architecture's keys
(``{arch}.block_count``, ``{arch}.attention.head_count``, ...) into the same description
``frontends.hf.families`` makes from a config.json, so both frontends build one graph
for one model. Where GGUF is silent, llama.cpp's own choices (what its runtime does with
the file) decide:

=========  ================================================================================
llama      GQA + SwiGLU; Q/K rows un-permuted on load; ``rope_freqs`` of Llama 3 scaling
           read back as llama3 RoPE; with ``expert_count``, Mixtral's MoE; a
           ``sliding_window`` key applies to every layer (Mistral)
qwen2      + q/k/v biases; windows ignored (as llama.cpp and HF's default do)
qwen3      + per-head q/k RMS norms
qwen2moe   Qwen2 attention, MoE + one shared expert behind a sigmoid gate, no renormalisation
qwen3moe   Qwen3 attention, MoE renormalised (llama.cpp's ``norm_w``), no shared expert
gemma2     (1 + w) norms (stored as 1 + w), sandwich, sqrt(d) embedding scale, GeGLU (tanh),
           softcaps, local/global layers (even layers local, or ``sliding_window_pattern``);
           attention scale 1/sqrt(head_dim), or 1/sqrt(d/H) for the 27B (46 layers), as
           llama.cpp has it (or ``attention.scale``)
gemma3     Gemma 2 + q/k norms, local layers at ``rope.freq_base_swa`` (default 10000)
           unscaled, global ones at ``rope.freq_base`` with the file's scaling; 5 local to 1
           global unless ``sliding_window_pattern`` says; 27B is 62 layers
phi3       fused qkv and gate/up split on load, partial rotary (``rope.dimension_count``),
           LongRoPE from ``rope_factors_long/short.weight`` (``frontends.gguf.longrope``),
           ``sliding_window`` on every layer (HF's semantics; llama.cpp disables it)
deepseek2  MLA (q_lora or direct q; ``key_length_mla``/``value_length_mla``, or the older
           ``key_length``/``value_length``), interleaved RoPE, YaRN with
           ``yarn_log_multiplier`` = 0.1 * mscale_all_dim (= mscale), dense layers where a
           block has no router; softmax gating (DeepSeek-V2) or sigmoid + ``exp_probs_b``
           (DeepSeek-V3), ``expert_weights_norm``, ``expert_weights_scale``, groups
gemma      Gemma 1: (1 + w) norms (stored as 1 + w), sqrt(d) embedding scale, GeGLU (tanh),
           attention scale 1/sqrt(head_dim)
granite,   Llama (Q/K permuted) with ``embedding_scale``, ``attention.scale`` (the softmax
granitemoe scale), ``residual_scale`` and ``logit_scale`` (the logits divided by it); granitemoe
           a softmax top-k MoE, renormalised, on every layer; with ``ffn_*_shexp`` one shared
           SwiGLU expert of ``expert_shared_feed_forward_length`` (Granite-MoE-Shared)
smollm3    Llama (Q/K permuted) with every fourth layer NoPE (llama.cpp's fixed
           ``n_no_rope_layer_step``: no key holds it)
olmo2 ...  olmo2 (and OLMo-3), starcoder2, command-r, cohere2, gpt2, phi2, gptneox, falcon, glm4,
           olmoe, gpt-oss, bloom, mpt (their own layer forms): ``frontends.gguf.classic``
mamba ...  Mamba-1 (Falcon-Mamba with ``ssm.dt_b_c_rms``), mamba2, jamba: ``frontends.gguf.ssm``
hybrids    granitehybrid (Granite-4.0-H and Bamba), nemotron_h, falcon-h1: ``frontends.gguf.hybrid``
linear     lfm2, lfm2moe (short convolutions), qwen3next, qwen35, qwen35moe (gated DeltaNet): ``frontends.gguf.linear``
kimi-...   kimi-linear (Kimi Delta Attention beside MLA, DeepSeek-V3 MoE): ``frontends.gguf.kimi``
gemma3n    Gemma-3n's text model (AltUp, LAuReL, per-layer embeddings, KV sharing): ``frontends.gguf.gemma3n``
phimoe     Phi-3.5-MoE (LayerNorms with bias, sparsemixer routing as transformers): ``frontends.gguf.phimoe``
gemma4     Gemma-4's dense text model (per-type head sizes, k = v, proportional RoPE): ``frontends.gguf.gemma4``
2026 ...   exaone4, exaone-moe, glm4moe, ernie4_5(-moe), hunyuan-moe/-dense, dots1, seed_oss, arcee,
           minimax-m2, exaone, llama4 (text, llama.cpp's fixed chunks), afmoe, minicpm3:
           ``frontends.gguf.families_2026``; stablelm, nemotron, starcoder, jais2, dbrx: ``families_2026b``
=========  ================================================================================

A layer is MoE exactly when its block has ``ffn_gate_inp``. Every error is a SpecError
naming the file and the GGUF key (``llama.attention.head_count: missing required key``).
"""
from __future__ import annotations

from typing import Optional

from frontends.gguf import classic, families_2026, gemma3n, gemma4, hybrid, kimi, linear, phimoe, ssm
from frontends.gguf.arch import Hparams, dense_mlp, make_arch, moe_layers, read_dims, read_rope, window_layers
from frontends.gguf.longrope import phi3_longrope
from frontends.gguf.reader import GGUFFile
from frontends.hf.config import Arch, Attention, LayerSpec

GATING = {1: "softmax", 2: "sigmoid"}  # llama.cpp's expert_gating_func values
QK_NORM = ("qwen3", "qwen3moe")


def describe(gguf: GGUFFile, name: str) -> Arch:
    """The architecture a GGUF file describes (see the module docstring)."""
    if gguf.arch not in FAMILIES:
        raise gguf.error("general.architecture", f"{gguf.arch!r} is not supported",
                         hint=f"architectures irc reads: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[gguf.arch](Hparams(gguf), name)


def _has(hp: Hparams, tensor: str) -> bool:
    return tensor in hp.gguf.tensors


def _llama_like(hp: Hparams, name: str) -> Arch:
    """llama (and Mixtral), qwen2, qwen3, qwen2moe, qwen3moe, phi3."""
    arch = hp.arch
    dims = read_dims(hp)
    n = dims["layers"]
    windows = [None] * n
    if arch in ("llama", "phi3"):
        windows = [hp.count("attention.sliding_window", None)] * n
    moe_flags = moe_layers(hp, n)
    moe, model_type = _llama_moe(hp, moe_flags)
    qkv_bias = arch == "qwen2" or _has(hp, "blk.0.attn_q.bias")
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"], qkv_bias=qkv_bias,
                          qk_norm=arch in QK_NORM)
    rope = read_rope(hp, dims["head_dim"])
    if arch == "phi3":
        rope = phi3_longrope(hp, rope, dims["head_dim"])
    layers = [LayerSpec(window, rope, is_moe) for window, is_moe in zip(windows, moe_flags)]
    return make_arch(hp, name, model_type, dims, attention, layers, dense_mlp(hp, moe_flags), moe=moe)


def _llama_moe(hp: Hparams, moe_flags: list[bool]) -> tuple[Optional[dict], str]:
    """(the ``Layer.moe`` arguments or None, the HF model_type) of a llama-like file."""
    arch = hp.arch
    base = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe",
            "phi3": "phi3"}[arch]
    if not any(moe_flags):
        return None, base
    if arch not in ("llama", "qwen2moe", "qwen3moe"):
        raise hp.gguf.error("blk.0.ffn_gate_inp.weight", f"a router in a {arch} file: {arch} has no experts")
    moe = {"experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count")}
    if arch == "llama":  # Mixtral: softmax top-k, renormalised
        moe["d_ff"] = hp.count("expert_feed_forward_length", None) or hp.count("feed_forward_length")
        return moe, "mixtral"
    moe["d_ff"] = hp.count("expert_feed_forward_length")
    moe["norm_topk_prob"] = hp.flag("expert_weights_norm", arch == "qwen3moe")
    if arch == "qwen2moe":
        moe.update(shared_experts=1, shared_d_ff=hp.count("expert_shared_feed_forward_length"),
                   shared_expert_gate=True)
    return moe, base


def _gemma(hp: Hparams, name: str) -> Arch:
    """gemma2 and gemma3 (text)."""
    gemma3 = hp.arch == "gemma3"
    dims = read_dims(hp)
    n, d, heads, head_dim = dims["layers"], dims["d"], dims["heads"], dims["head_dim"]
    window = hp.count("attention.sliding_window", None)
    local = window_layers(hp, n, 6 if gemma3 else 2) if window else [False] * n
    if gemma3:
        global_rope = read_rope(hp, head_dim, base=hp.number("rope.freq_base", 1e6))
        local_rope = read_rope(hp, head_dim, base=hp.number("rope.freq_base_swa", 1e4), scaled=False)
        ropes = [local_rope if is_local else global_rope for is_local in local]
    else:
        ropes = [read_rope(hp, head_dim)] * n
    big = n == (62 if gemma3 else 46)  # llama.cpp's 27B rule: scale by d / H instead of the head size
    scale = hp.number("attention.scale", None) or ((d / heads) if big else head_dim) ** -0.5
    attention = Attention("gqa", heads, dims["kv_heads"], head_dim, qk_norm=gemma3,
                          softcap=hp.number("attn_logit_softcapping", None), scale=scale)
    layers = [LayerSpec(window if is_local else None, rope) for is_local, rope in zip(local, ropes)]
    return make_arch(hp, name, "gemma3_text" if gemma3 else "gemma2", dims, attention, layers,
                 dense_mlp(hp, [False] * n, kind="geglu"), norm_offset=1.0, sandwich=True,
                 final_softcap=hp.number("final_logit_softcapping", None), embedding_scale=d ** 0.5)


def _gemma1(hp: Hparams, name: str) -> Arch:
    """gemma: Gemma 1."""
    dims = read_dims(hp)
    n = dims["layers"]
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"])
    layers = [LayerSpec(None, read_rope(hp, dims["head_dim"]))] * n
    return make_arch(hp, name, "gemma", dims, attention, layers, dense_mlp(hp, [False] * n, kind="geglu"),
                     norm_offset=1.0, embedding_scale=dims["d"] ** 0.5)


def _scale(hp: Hparams, key: str):
    """A multiplier key, None where it is absent or 1 (nothing to multiply)."""
    value = hp.number(key, None)
    return None if value in (None, 1.0) else value


def _granite(hp: Hparams, name: str) -> Arch:
    """granite, granitemoe."""
    dims = read_dims(hp)
    n = dims["layers"]
    moe_flags = moe_layers(hp, n)
    moe = None
    if any(moe_flags):
        moe = {"experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count"),
               "d_ff": hp.count("expert_feed_forward_length", None) or hp.count("feed_forward_length"),
               "norm_topk_prob": True}
    model_type = "granitemoe" if moe else "granite"
    if moe and _has(hp, f"blk.{moe_flags.index(True)}.ffn_gate_shexp.weight"):  # Granite-MoE-Shared
        moe.update(shared_experts=1, shared_d_ff=hp.count("expert_shared_feed_forward_length"))
        model_type = "granitemoeshared"
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"],
                          scale=hp.number("attention.scale", None))
    rope = read_rope(hp, dims["head_dim"])
    layers = [LayerSpec(None, rope, is_moe) for is_moe in moe_flags]
    logit_scale = _scale(hp, "logit_scale")
    return make_arch(hp, name, model_type, dims, attention, layers,
                     dense_mlp(hp, moe_flags), moe=moe, embedding_scale=_scale(hp, "embedding_scale"),
                     residual_scale=_scale(hp, "residual_scale"),
                     logits_scale=None if logit_scale is None else 1.0 / logit_scale)


def _smollm3(hp: Hparams, name: str) -> Arch:
    """smollm3: Llama with NoPE on layers 3, 7, 11, ... (llama.cpp's step of 4)."""
    dims = read_dims(hp)
    rope = read_rope(hp, dims["head_dim"])
    layers = [LayerSpec(None, rope if (i + 1) % 4 else None) for i in range(dims["layers"])]
    attention = Attention("gqa", dims["heads"], dims["kv_heads"], dims["head_dim"])
    return make_arch(hp, name, "smollm3", dims, attention, layers, dense_mlp(hp, [False] * dims["layers"]))


def _deepseek(hp: Hparams, name: str) -> Arch:
    """deepseek2: MLA, leading dense layers, routed + shared experts (V2 and V3 routing)."""
    n = hp.count("block_count")
    heads = hp.count("attention.head_count")
    rope_dim = hp.count("rope.dimension_count")
    mla_keys = hp.has("attention.key_length_mla")
    key_key, value_key = ("attention.key_length_mla", "attention.value_length_mla") if mla_keys else \
        ("attention.key_length", "attention.value_length")
    qk_dim, v_dim = hp.count(key_key), hp.count(value_key)
    if qk_dim <= rope_dim:
        raise hp.error(key_key, f"{qk_dim} leaves no room beside {rope_dim} rotary dims")
    mla = {"q_lora_rank": hp.count("attention.q_lora_rank", None), "kv_lora_rank": hp.count("attention.kv_lora_rank"),
           "qk_nope_head_dim": qk_dim - rope_dim, "qk_rope_head_dim": rope_dim, "v_head_dim": v_dim}
    dims = {"d": hp.count("embedding_length"), "heads": heads, "kv_heads": heads, "head_dim": qk_dim, "layers": n}
    moe_flags = moe_layers(hp, n)
    gating = GATING.get(hp.count("expert_gating_func", 1), None)
    if gating is None:
        raise hp.error("expert_gating_func", f"{hp.count('expert_gating_func')} is not supported",
                       hint="1 (softmax) or 2 (sigmoid)")
    moe = _deepseek_moe(hp, gating) if any(moe_flags) else None
    rope = read_rope(hp, rope_dim, convention="interleaved")
    attention = Attention("mla", heads, heads, qk_dim, mla=mla)
    layers = [LayerSpec(None, rope, is_moe) for is_moe in moe_flags]
    model_type = "deepseek_v3" if gating == "sigmoid" else "deepseek_v2"
    return make_arch(hp, name, model_type, dims, attention, layers, dense_mlp(hp, moe_flags), moe=moe)


def _deepseek_moe(hp: Hparams, gating: str) -> dict:
    moe = {"experts": hp.count("expert_count"), "top_k": hp.count("expert_used_count"),
           "d_ff": hp.count("expert_feed_forward_length"),
           "shared_experts": hp.count("expert_shared_count", 0, minimum=0),
           "routed_scale": hp.number("expert_weights_scale", 1.0),
           "norm_topk_prob": hp.flag("expert_weights_norm", False)}
    if gating == "sigmoid":
        moe.update(scoring="sigmoid", router_bias=_has(hp, "blk.0.exp_probs_b.bias") or any(
            name.endswith(".exp_probs_b.bias") for name in hp.gguf.tensors))
    groups = hp.count("expert_group_count", 1)
    if groups > 1:
        moe.update(groups=groups, top_groups=hp.count("expert_group_used_count"),
                   group_score="top2_sum" if gating == "sigmoid" else "max")
    return moe


FAMILIES = {"llama": _llama_like, "qwen2": _llama_like, "qwen3": _llama_like, "qwen2moe": _llama_like,
            "qwen3moe": _llama_like, "phi3": _llama_like, "gemma": _gemma1, "gemma2": _gemma, "gemma3": _gemma,
            "granite": _granite, "granitemoe": _granite, "smollm3": _smollm3,
            "deepseek2": _deepseek, **ssm.FAMILIES, **hybrid.FAMILIES, **linear.FAMILIES, **classic.FAMILIES,
            **kimi.FAMILIES, **gemma3n.FAMILIES, **gemma4.FAMILIES, **phimoe.FAMILIES,
            **families_2026.FAMILIES}
