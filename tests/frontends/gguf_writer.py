"""Small GGUF files for the GGUF frontend's tests, written with ``gguf.GGUFWriter``.

``write_model(path, model, arch, ...)`` converts a tiny random transformers model the way
llama.cpp's converter does, independently of ``frontends.gguf``: tensor names come from
the ``gguf`` package's own HF -> GGUF table (``gguf.get_tensor_name_map``), and the
converter's changes are made here as its code makes them: Llama's Q/K rows permuted to
interleaved pairs, Gemma's norm weights stored as 1 + w, MoE experts stacked [E, ...],
DeepSeek's ``kv_b`` split into ``k_b`` (transposed per head) and ``v_b`` on request, the
Qwen2-MoE shared-expert gate as a vector, Llama 3 RoPE scaling as a ``rope_freqs`` table.
Mamba, Mamba-2 and Jamba as ``MambaModel`` / ``Mamba2Model`` / ``JambaModel`` write them:
``ssm_a`` = -exp(A_log), the conv weight squeezed to [C, K], Mamba-2's A and D as [H, 1],
its ``dt_bias`` renamed ``dt_proj.bias`` (so ``ssm_dt.bias``) and its norm as
[groups, d_inner / groups]; Jamba's ``head_count_kv`` one entry a layer.
Hyperparameters go under the keys the converter writes (``ssm_keys`` for the state-space
ones). ``write_hybrid`` converts a saved checkpoint of Granite-4.0-H / Bamba, Nemotron-H or
Falcon-H1 from its safetensors (the names on disk, as the converter reads them) the way
``GraniteHybridModel``, ``NemotronHModel`` and ``FalconH1Model`` do (``hybrid_keys``,
``hybrid_converted``; ``falcon_h1_folded`` is Falcon-H1's multiplier folding alone).
``qtype`` quantizes every weight of rank >= 2 whose rows fit whole blocks with
``gguf.quants.quantize``, except what the converter keeps in float32 (``ssm_conv1d`` and
tensors whose name does not end in ``.weight``, such as ``ssm_a`` and ``ssm_d``).
"""
from __future__ import annotations

import math

import gguf
import numpy as np

ARCHS = {"llama": "LLAMA", "qwen2": "QWEN2", "qwen3": "QWEN3", "qwen2moe": "QWEN2MOE", "qwen3moe": "QWEN3MOE",
         "gemma": "GEMMA", "granite": "GRANITE", "granitemoe": "GRANITE_MOE", "smollm3": "SMOLLM3", "gemma2": "GEMMA2", "gemma3": "GEMMA3", "phi3": "PHI3", "deepseek2": "DEEPSEEK2", "mamba": "MAMBA",
         "mamba2": "MAMBA2", "jamba": "JAMBA"}
SSM = ("mamba", "mamba2", "jamba")  # archs whose A_log and conv1d the converter transforms
LLAMA_CONVERTED = ("llama", "granite", "granitemoe", "smollm3")  # LlamaModel and its subclasses: Q/K permuted


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: rotate-half pairs -> interleaved pairs, per head."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_freqs(dim: int, base: float, rope: dict) -> np.ndarray:
    """``LlamaModel.generate_extra_tensors``: the per-frequency divisors of Llama 3 scaling."""
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _tensors(model, arch: str, kv_split: bool):
    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[ARCHS[arch]], config.num_hidden_layers)
    for key, value in model.state_dict().items():
        data = value.detach().float().numpy().copy()
        block = key.split(".")[2] if key.startswith(("model.layers.", "backbone.layers.")) else None
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if arch in SSM:
            key, data = _ssm_tensor(key, value.detach().float(), config, arch)
        if key.endswith("experts.gate_up_proj"):
            half = data.shape[1] // 2
            yield f"blk.{block}.ffn_gate_exps.weight", data[:, :half]
            yield f"blk.{block}.ffn_up_exps.weight", data[:, half:]
            continue
        if key.endswith("experts.down_proj"):
            yield f"blk.{block}.ffn_down_exps.weight", data
            continue
        if key.endswith("e_score_correction_bias"):
            yield f"blk.{block}.exp_probs_b.bias", data
            continue
        if arch == "granitemoe" and key.endswith("block_sparse_moe.router.weight"):  # router.layer on disk
            yield f"blk.{block}.ffn_gate_inp.weight", data
            continue
        if arch in LLAMA_CONVERTED and (".q_proj." in key or ".k_proj." in key):
            heads = config.num_attention_heads if ".q_proj." in key else config.num_key_value_heads
            data = permute(data, heads)
        if arch.startswith("gemma") and key.endswith("norm.weight"):
            data = data + 1
        if key.endswith("shared_expert_gate.weight"):
            data = data.reshape(-1)
        if kv_split and key.endswith("kv_b_proj.weight"):
            nope, v = config.qk_nope_head_dim, config.v_head_dim
            kv_b = data.reshape(config.num_attention_heads, nope + v, data.shape[-1])
            yield f"blk.{block}.attn_k_b.weight", np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1))
            yield f"blk.{block}.attn_v_b.weight", np.ascontiguousarray(kv_b[:, nope:])
            continue
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        assert name is not None, key
        yield name, data


def _ssm_tensor(key: str, value, config, arch: str) -> tuple:
    """``MambaModel`` / ``Mamba2Model`` / ``JambaModel``'s renaming and ``modify_tensors``
    (in torch, as there)."""
    import torch

    if key.endswith(".dt_bias"):  # Mamba2Model.filter_tensors
        key = key[:-len(".dt_bias")] + ".dt_proj.bias"
    if key.endswith("conv1d.weight"):
        value = value.squeeze()
    elif arch == "mamba2" and key.endswith((".A_log", ".D")):
        value = value.reshape(*value.shape, 1)
    elif arch == "mamba2" and key.endswith("mixer.norm.weight"):
        value = value.reshape(config.n_groups, -1)
    if key.endswith(".A_log"):
        value = -torch.exp(value)
    return key, value.numpy().copy()


def ssm_keys(config, arch: str) -> dict:
    """The keys ``MambaModel`` / ``Mamba2Model`` / ``JambaModel.set_gguf_parameters`` write,
    by full name."""
    if arch == "jamba":
        return _jamba_keys(config)
    d = config.hidden_size
    d_inner = getattr(config, "intermediate_size", None) or 2 * d
    keys = {"context_length": 2 ** 20, "embedding_length": d, "feed_forward_length": 0,
            "attention.head_count": 0, "block_count": config.num_hidden_layers,
            "ssm.conv_kernel": config.conv_kernel, "ssm.inner_size": d_inner, "ssm.state_size": config.state_size}
    if arch == "mamba":
        keys["ssm.time_step_rank"] = config.time_step_rank
    else:
        keys["ssm.time_step_rank"] = d_inner // config.head_dim
        keys["ssm.group_count"] = config.n_groups
    keys["attention.layer_norm_rms_epsilon"] = float(config.layer_norm_epsilon)
    if arch == "mamba":
        keys["ssm.dt_b_c_rms"] = config.model_type == "falcon_mamba"
    return {f"{arch}.{key}": value for key, value in keys.items()}


def _jamba_keys(config) -> dict:
    """Jamba: ``head_count_kv`` one entry a layer, 0 on the Mamba layers."""
    d, n = config.hidden_size, config.num_hidden_layers
    offset, period = config.attn_layer_offset, config.attn_layer_period
    kv = [0] * offset + [config.num_key_value_heads if (i - offset) % period == 0 else 0 for i in range(offset, n)]
    keys = {"block_count": n, "context_length": config.max_position_embeddings, "embedding_length": d,
            "feed_forward_length": config.intermediate_size, "attention.head_count": config.num_attention_heads,
            "attention.head_count_kv": kv, "ssm.conv_kernel": config.mamba_d_conv,
            "ssm.inner_size": config.mamba_expand * d, "ssm.state_size": config.mamba_d_state,
            "ssm.time_step_rank": config.mamba_dt_rank, "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
            "expert_count": config.num_experts, "expert_used_count": config.num_experts_per_tok}
    return {f"jamba.{key}": value for key, value in keys.items()}


def converted(model, arch: str, kv_split: bool = False) -> dict:
    """{GGUF name: float32 array} of ``model`` as the converter writes it."""
    return {name: data.astype(np.float32) for name, data in _tensors(model, arch, kv_split)}


def _rope_params(config) -> dict:
    params = getattr(config, "rope_parameters", None) or {}
    return params.get("full_attention", params)


def _hparams(w, config, arch: str) -> None:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(config.num_hidden_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(getattr(config, "num_key_value_heads", heads))
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_vocab_size(config.vocab_size)
    rope = _rope_params(config)
    w.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    if arch in ("llama", "qwen3", "qwen3moe", "gemma", "gemma2", "gemma3"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch in LLAMA_CONVERTED:
        w.add_rope_dimension_count(head_dim)
    if arch in ("granite", "granitemoe"):  # GraniteModel: the multipliers as *_scale keys
        w.add_attention_scale(config.attention_multiplier)
        w.add_embedding_scale(config.embedding_multiplier)
        w.add_residual_scale(config.residual_multiplier)
        w.add_logit_scale(config.logits_scaling)
    if arch == "phi3":
        w.add_rope_dimension_count(int(head_dim * getattr(config, "partial_rotary_factor", 1.0)))
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if getattr(config, "sliding_window", None) and arch in ("llama", "phi3", "gemma2", "gemma3"):
        w.add_sliding_window(config.sliding_window)
    if arch.startswith("gemma"):
        if getattr(config, "attn_logit_softcapping", None):
            w.add_attn_logit_softcapping(config.attn_logit_softcapping)
        if getattr(config, "final_logit_softcapping", None):
            w.add_final_logit_softcapping(config.final_logit_softcapping)
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    if experts and arch != "deepseek2":
        w.add_expert_count(experts)
        w.add_expert_used_count(config.num_experts_per_tok)
    if arch in ("qwen2moe", "qwen3moe"):
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    if arch == "deepseek2":
        _deepseek(w, config, rope)


def _deepseek(w, config, rope: dict) -> None:
    """``DeepseekV2Model.set_gguf_parameters`` (MLA as MQA over the latent)."""
    w.add_head_count_kv(1)
    w.add_leading_dense_block_count(config.first_k_dense_replace)
    if config.q_lora_rank is not None:
        w.add_q_lora_rank(config.q_lora_rank)
    w.add_kv_lora_rank(config.kv_lora_rank)
    w.add_key_length(config.kv_lora_rank + config.qk_rope_head_dim)
    w.add_value_length(config.kv_lora_rank)
    w.add_key_length_mla(config.qk_nope_head_dim + config.qk_rope_head_dim)
    w.add_value_length_mla(config.v_head_dim)
    w.add_rope_dimension_count(config.qk_rope_head_dim)
    w.add_expert_feed_forward_length(config.moe_intermediate_size)
    w.add_expert_count(config.n_routed_experts)
    w.add_expert_used_count(config.num_experts_per_tok)
    w.add_expert_shared_count(config.n_shared_experts)
    w.add_expert_weights_scale(config.routed_scaling_factor)
    v3 = config.model_type == "deepseek_v3"
    if v3 and config.norm_topk_prob:
        w.add_expert_weights_norm(True)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if v3 else gguf.ExpertGatingFuncType.SOFTMAX)
    if getattr(config, "n_group", None) and (v3 or config.topk_method == "group_limited_greedy"):
        w.add_expert_group_count(config.n_group)
        w.add_expert_group_used_count(config.topk_group)
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def _quantizable(name: str, data: np.ndarray, qtype) -> bool:
    if qtype is None or data.ndim < 2 or "norm" in name or "ssm_conv1d" in name or not name.endswith(".weight"):
        return False
    return data.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0


def write_model(path, model, arch: str, *, qtype=None, kv_split: bool = False, extra=None) -> str:
    """``model`` (a transformers causal LM) as a GGUF file at ``path``; ``extra(writer)``
    may add keys or tensors."""
    config = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    if arch in SSM:
        _add_keys(w, ssm_keys(config, arch))
    else:
        _hparams(w, config, arch)
    rope = _rope_params(config)
    if rope.get("rope_type") == "llama3":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        w.add_tensor("rope_freqs.weight", llama3_rope_freqs(head_dim, rope["rope_theta"], rope))
    for name, data in _tensors(model, arch, kv_split):
        if _quantizable(name, data, qtype):
            raw = gguf.quants.quantize(data.astype(np.float32), qtype)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        else:
            w.add_tensor(name, data.astype(np.float32))
    if extra is not None:
        extra(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def write_file(path, arch: str, keys: dict, tensors: dict) -> str:
    """A GGUF from explicit keys ({key: value}, typed by value) and tensors ({name: array or
    (raw bytes array, ggml type)})."""
    w = gguf.GGUFWriter(str(path), arch)
    _add_keys(w, keys)
    for name, data in tensors.items():
        if isinstance(data, tuple):
            raw, qtype = data
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        else:
            w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _add_keys(w, keys: dict) -> None:
    """{key: value} typed by value: bool, uint32, float32, string, array."""
    for key, value in keys.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)


# ---- hybrids: GraniteHybridModel (granitehybrid), NemotronHModel (nemotron_h), FalconH1Model (falcon-h1) ----

HYBRID = {"granitehybrid": "GRANITE_HYBRID", "nemotron_h": "NEMOTRON_H", "falcon-h1": "FALCON_H1"}
# FalconH1Model.modify_tensors: the first rule whose text is in the checkpoint name folds its factor in
FALCON_H1_FOLDS = (("down_proj", ("mlp_multipliers", 1)), ("gate_proj", ("mlp_multipliers", 0)),
                   ("k_proj", "key_multiplier", "attention_in_multiplier"), ("q_proj", "attention_in_multiplier"),
                   ("v_proj", "attention_in_multiplier"), ("o_proj", "attention_out_multiplier"),
                   ("out_proj", "ssm_out_multiplier"), ("in_proj", "ssm_in_multiplier"),
                   ("lm_head", "lm_head_multiplier"), ("embed_tokens", "embedding_multiplier"))


def layer_kinds(config) -> list[str]:
    """"attention", "mamba" or "mlp" per layer, as the converter reads them from the Hub's
    config.json (Granite's ``layer_types``, Bamba's ``attn_layer_indices``, Nemotron-H's
    ``hybrid_override_pattern``; transformers 5.24 names them full_attention /
    linear_attention, the Hub's files attention / mamba and M * -)."""
    if config.model_type == "falcon_h1":
        return ["attention+mamba"] * config.num_hidden_layers
    if config.model_type == "nemotron_h":
        names = config.layers_block_type
    elif getattr(config, "layer_types", None):
        names = config.layer_types
    else:
        names = ["attention" if i in (config.attn_layer_indices or []) else "mamba"
                 for i in range(config.num_hidden_layers)]
    return [{"full_attention": "attention", "linear_attention": "mamba"}.get(k, k) for k in names]


def hybrid_keys(config, arch: str) -> dict:
    """The keys ``set_gguf_parameters`` writes, by full name (``GraniteHybridModel``,
    ``NemotronHModel``, ``FalconH1Model``). Bamba's rotary width is the ``attn_rotary_emb``
    its Hub config.json carries (transformers 5.24 no longer writes it: head_dim x
    partial_rotary_factor); Nemotron-H's ``rms_norm_eps`` likewise (= layer_norm_epsilon)."""
    d, n, heads = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
    kinds = layer_kinds(config)
    rope = _rope_params(config)
    if arch == "falcon-h1":
        d_ssm = config.mamba_d_ssm
        keys = {"context_length": config.max_position_embeddings, "embedding_length": d,
                "feed_forward_length": config.intermediate_size, "attention.head_count": heads, "block_count": n,
                "ssm.conv_kernel": config.mamba_d_conv, "ssm.inner_size": d_ssm,
                "ssm.state_size": config.mamba_d_state, "ssm.time_step_rank": d_ssm // config.mamba_d_head,
                "ssm.group_count": config.mamba_n_groups,
                "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps), "vocab_size": config.vocab_size,
                "attention.head_count_kv": config.num_key_value_heads,
                "attention.key_length": config.head_dim, "attention.value_length": config.head_dim,
                "rope.freq_base": float(rope["rope_theta"])}
        return {f"{arch}.{key}": value for key, value in keys.items()}
    nemotron = arch == "nemotron_h"
    use_rope = config.model_type == "bamba" or "mamba" not in kinds
    keys = {"block_count": n, "context_length": config.max_position_embeddings if use_rope else 2 ** 20,
            "embedding_length": d, "feed_forward_length": config.intermediate_size, "attention.head_count": heads,
            "attention.layer_norm_rms_epsilon": float(getattr(config, "rms_norm_eps", None)
                                                      or config.layer_norm_epsilon),
            "vocab_size": config.vocab_size, "rope.dimension_count": d // heads,
            "attention.head_count_kv": [config.num_key_value_heads if k == "attention" else 0 for k in kinds],
            "rope.scaling.finetuned": use_rope}
    if "rope_theta" in rope:
        keys["rope.freq_base"] = float(rope["rope_theta"])
    if config.model_type == "bamba":
        keys["rope.dimension_count"] = int(d // heads * rope.get("partial_rotary_factor", 1.0))
    if nemotron:
        keys.update({"attention.layer_norm_epsilon": float(config.layer_norm_epsilon),
                     "attention.key_length": config.head_dim, "attention.value_length": config.head_dim,
                     "feed_forward_length": [config.intermediate_size if k == "mlp" else 0 for k in kinds],
                     "ssm.conv_kernel": config.conv_kernel, "ssm.state_size": config.ssm_state_size,
                     "ssm.group_count": config.n_groups,
                     "ssm.inner_size": config.mamba_num_heads * config.mamba_head_dim,
                     "ssm.time_step_rank": config.mamba_num_heads})
    else:
        keys.update({"ssm.conv_kernel": config.mamba_d_conv, "ssm.state_size": config.mamba_d_state,
                     "ssm.group_count": config.mamba_n_groups, "ssm.inner_size": config.mamba_expand * d,
                     "ssm.time_step_rank": config.mamba_n_heads})
        for key, name in (("expert_count", "num_local_experts"), ("expert_used_count", "num_experts_per_tok")):
            if getattr(config, name, None) is not None:
                keys[key] = getattr(config, name)
        for key, name in (("attention.scale", "attention_multiplier"), ("embedding_scale", "embedding_multiplier"),
                          ("residual_scale", "residual_multiplier"), ("logit_scale", "logits_scaling")):
            if getattr(config, name, None):  # GraniteModel writes the truthy ones
                keys[key] = float(getattr(config, name))
        if getattr(config, "shared_intermediate_size", None):
            keys["expert_shared_feed_forward_length"] = config.shared_intermediate_size
    return {f"{arch}.{key}": value for key, value in keys.items()}


def _checkpoint(folder) -> dict:
    """{name on disk: float32 torch tensor} of a save_pretrained folder."""
    from safetensors.torch import load_file

    return {name: tensor.float() for name, tensor in load_file(str(folder / "model.safetensors")).items()}


def falcon_h1_folded(config, tensors: dict) -> dict:
    """``FalconH1Model.modify_tensors``' multiplier folding alone, on checkpoint names (in
    torch, in its order): every multiplier into its weight, ssm_multipliers into in_proj's
    z, x, B, C and dt rows."""
    out = {}
    for name, tensor in tensors.items():
        for text, *factors in FALCON_H1_FOLDS:
            if text not in name:
                continue
            for factor in factors:
                key, index = factor if isinstance(factor, tuple) else (factor, None)
                value = getattr(config, key)
                tensor = tensor * (value[index] if index is not None else value)
            if text == "in_proj":
                d_ssm, bc = config.mamba_d_ssm, config.mamba_n_groups * config.mamba_d_state
                bounds = (0, d_ssm, 2 * d_ssm, 2 * d_ssm + bc, 2 * d_ssm + 2 * bc, tensor.shape[0])
                for part, m in enumerate(config.ssm_multipliers):
                    tensor[bounds[part]:bounds[part + 1], :] *= m
            break
        out[name] = tensor
    return out


def hybrid_converted(config, folder, arch: str) -> dict:
    """{GGUF name: float32 array} of the checkpoint saved in ``folder`` as the converter
    writes it: Mamba-2 layers as ``Mamba2Model`` (dt_bias renamed dt_proj.bias, conv
    squeezed, A and D [H, 1], A = -exp(A_log), norm [groups, d_inner / groups]); attention
    layers of granitehybrid and nemotron_h with Q and K permuted (``undo_permute``);
    Granite's fused input_linear split into gate and up; Falcon-H1's multipliers folded."""
    import torch

    n = config.num_hidden_layers
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[HYBRID[arch]], n)
    kinds = layer_kinds(config)
    tensors = _checkpoint(folder)
    if arch == "falcon-h1":
        tensors = falcon_h1_folded(config, tensors)
        d_inner, groups = config.mamba_d_ssm, config.mamba_n_groups
    elif arch == "nemotron_h":
        d_inner, groups = config.mamba_num_heads * config.mamba_head_dim, config.n_groups
    else:
        d_inner, groups = config.mamba_expand * config.hidden_size, config.mamba_n_groups
    out = {}
    for key, value in tensors.items():
        key = key[:-len(".dt_bias")] + ".dt_proj.bias" if key.endswith(".dt_bias") else key  # filter_tensors
        parts = key.split(".")
        block = int(parts[2]) if parts[1] == "layers" else None
        kind = kinds[block] if block is not None else None
        if key.endswith("input_linear.weight"):  # GraniteMoeModel: the fused gate|up, split by rows
            width = config.intermediate_size if "block_sparse_moe" in key else config.shared_intermediate_size
            gate, up = value.split(width, dim=-2)
            suffix = "exps" if "block_sparse_moe" in key else "shexp" if config.num_local_experts else None
            for part, half in (("gate", gate), ("up", up)):
                out[f"blk.{block}.ffn_{part}{'_' + suffix if suffix else ''}.weight"] = half.numpy().copy()
            continue
        if key.endswith("shared_mlp.output_linear.weight") and not config.num_local_experts:
            out[f"blk.{block}.ffn_down.weight"] = value.numpy().copy()
            continue
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        assert name is not None, key
        if "mamba" in (kind or ""):
            if ".ssm_conv1d." in name + ".":
                value = value.squeeze()
            elif name.endswith((".ssm_a", ".ssm_d")):
                value = value.reshape(*value.shape, 1)
            elif name.endswith(".ssm_norm.weight"):
                value = value.reshape(groups, d_inner // groups)
            if key.endswith(".A_log"):
                value = -torch.exp(value)
        if kind == "attention" and arch != "falcon-h1" and key.endswith(("q_proj.weight", "q_proj.bias",
                                                                         "k_proj.weight", "k_proj.bias")):
            heads = config.num_attention_heads if ".q_proj." in key else config.num_key_value_heads
            value = torch.from_numpy(permute(value.numpy(), heads))
        out[name] = value.numpy().copy()
    return out


def write_hybrid(path, model, folder, arch: str, *, qtype=None) -> str:
    """``model``'s checkpoint saved in ``folder`` as a ``arch`` GGUF file at ``path``."""
    tensors = {}
    for name, data in hybrid_converted(model.config, folder, arch).items():
        if _quantizable(name, data, qtype):
            raw = gguf.quants.quantize(data.astype(np.float32), qtype)
            tensors[name] = (raw, qtype)
        else:
            tensors[name] = data.astype(np.float32)
    return write_file(path, arch, {"general.name": "tiny", **hybrid_keys(model.config, arch)}, tensors)


# ---- LFM2Model (lfm2), Qwen3NextModel (qwen3next), Qwen3_5TextModel / Qwen3_5MoeTextModel (qwen35, qwen35moe) ----

LINEAR = {"lfm2": "LFM2", "lfm2moe": "LFM2MOE", "qwen3next": "QWEN3NEXT", "qwen35": "QWEN35", "qwen35moe": "QWEN35MOE"}


def lfm2_ff_dim(config) -> int:
    """``LFM2Model._add_feed_forward_length``."""
    ff_dim = getattr(config, "block_ff_dim", None) or config.intermediate_size
    if config.block_auto_adjust_ff_dim:
        ff_dim = int(2 * ff_dim / 3)
        if config.block_ffn_dim_multiplier is not None:
            ff_dim = int(config.block_ffn_dim_multiplier * ff_dim)
        ff_dim = config.block_multiple_of * ((ff_dim + config.block_multiple_of - 1) // config.block_multiple_of)
    return ff_dim


def linear_keys(config, arch: str) -> dict:
    """The keys ``LFM2Model`` / ``Qwen3NextModel`` (and Qwen3.5's classes) write, by full name."""
    heads, d = config.num_attention_heads, config.hidden_size
    rope = _rope_params(config)
    keys = {"block_count": config.num_hidden_layers, "context_length": config.max_position_embeddings,
            "embedding_length": d, "attention.head_count": heads, "rope.freq_base": float(rope.get("rope_theta", 1e4)),
            "vocab_size": config.vocab_size}
    if arch in ("lfm2", "lfm2moe"):
        keys.update({"shortconv.l_cache": config.conv_L_cache, "attention.layer_norm_rms_epsilon": float(config.norm_eps),
                     "attention.head_count_kv": [config.num_key_value_heads if kind != "conv" else 0
                                                 for kind in config.layer_types]})
        if arch == "lfm2":
            keys["feed_forward_length"] = lfm2_ff_dim(config)
        else:  # LFM2MoeModel: the TextModel keys, the expert keys, sigmoid gating (2)
            keys.update({"feed_forward_length": config.intermediate_size, "expert_count": config.num_experts,
                         "expert_used_count": config.num_experts_per_tok,
                         "expert_feed_forward_length": config.moe_intermediate_size,
                         "leading_dense_block_count": config.num_dense_layers, "expert_gating_func": 2})
        return {f"{arch}.{key}": value for key, value in keys.items()}
    head_dim = getattr(config, "head_dim", None) or d // heads
    keys.update({"attention.head_count_kv": config.num_key_value_heads, "key_length": head_dim,
                 "value_length": head_dim, "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
                 "ssm.conv_kernel": config.linear_conv_kernel_dim, "ssm.state_size": config.linear_key_head_dim,
                 "ssm.group_count": config.linear_num_key_heads, "ssm.time_step_rank": config.linear_num_value_heads,
                 "ssm.inner_size": config.linear_value_head_dim * config.linear_num_value_heads,
                 "full_attention_interval": getattr(config, "full_attention_interval", 4),
                 "rope.dimension_count": int(head_dim * rope.get("partial_rotary_factor", 0.25))})
    keys["attention.key_length"], keys["attention.value_length"] = keys.pop("key_length"), keys.pop("value_length")
    if getattr(config, "intermediate_size", None):
        keys["feed_forward_length"] = config.intermediate_size
    if getattr(config, "num_experts", None):
        keys.update({"expert_count": config.num_experts, "expert_used_count": config.num_experts_per_tok,
                     "expert_feed_forward_length": config.moe_intermediate_size,
                     "expert_shared_feed_forward_length": config.shared_expert_intermediate_size})
    if arch != "qwen3next":
        keys["rope.dimension_sections"] = list(rope.get("mrope_section", [11, 11, 10])) + [0]
    return {f"{arch}.{key}": value for key, value in keys.items()}


def reorder_v_heads(data: np.ndarray, axis: int, key_heads: int, per_key: int, width: int) -> np.ndarray:
    """``_LinearAttentionVReorderBase._reorder_v_heads``: value heads grouped by key head ->
    tiled (head i of every key head together), along ``axis``."""
    data = np.moveaxis(data, axis, 0)
    shape = data.shape
    tiled = data.reshape(key_heads, per_key, width, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.ascontiguousarray(np.moveaxis(tiled, 0, axis))


def _v_reorder(key: str, data: np.ndarray, config) -> np.ndarray:
    k_heads, v_heads = config.linear_num_key_heads, config.linear_num_value_heads
    if k_heads == v_heads or "linear_attn." not in key:
        return data
    k_dim, v_dim, per_key = config.linear_key_head_dim, config.linear_value_head_dim, v_heads // k_heads
    qk = 2 * k_heads * k_dim
    if ".in_proj_qkv." in key:
        return np.concatenate([data[:qk], reorder_v_heads(data[qk:], 0, k_heads, per_key, v_dim)])
    if ".in_proj_z." in key:
        return reorder_v_heads(data, 0, k_heads, per_key, v_dim)
    if ".in_proj_b." in key or ".in_proj_a." in key or key.endswith((".A_log", ".dt_bias")):
        return reorder_v_heads(data, 0, k_heads, per_key, 1)
    if ".conv1d" in key:
        data = data.squeeze()
        return np.concatenate([data[:qk], reorder_v_heads(data[qk:], 0, k_heads, per_key, v_dim)])
    if ".out_proj." in key:
        return reorder_v_heads(data, 1, k_heads, per_key, v_dim)
    return data


def _linear_tensors(model, arch: str, fused: bool):
    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[LINEAR[arch]], config.num_hidden_layers)
    for key, value in model.state_dict().items():
        data = value.detach().float().numpy().copy()
        block = key.split(".")[2] if key.startswith("model.layers.") else None
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if arch in ("lfm2", "lfm2moe"):
            if "conv.conv" in key and data.ndim == 3:  # the converter's squeeze(1) (its bias, 1-D, would fail there)
                data = data.squeeze(1)
            if key.endswith("experts.gate_up_proj"):  # the per-expert w1 | w3 the converter stacks
                half = data.shape[1] // 2
                yield f"blk.{block}.ffn_gate_exps.weight", data[:, :half]
                yield f"blk.{block}.ffn_up_exps.weight", data[:, half:]
            elif key.endswith("experts.down_proj"):
                yield f"blk.{block}.ffn_down_exps.weight", data
            elif key.endswith(".expert_bias"):  # filter_tensors: .expert_bias -> .expert_bias.bias
                yield f"blk.{block}.exp_probs_b.bias", data
            else:
                yield names.get_name(key, try_suffixes=(".weight", ".bias")), data
            continue
        if arch != "qwen3next":
            data = _v_reorder(key, data, config)
        if key.endswith(".A_log"):
            data = -np.exp(data.astype(np.float64)).astype(np.float32)
        elif key.endswith(".dt_bias"):
            key = key[:-len(".dt_bias")] + ".dt_proj.bias"
        elif "conv1d" in key:
            data = data.squeeze()
        elif key.endswith("norm.weight") and not key.endswith("linear_attn.norm.weight"):
            data = data + 1
        if key.endswith("experts.gate_up_proj"):
            half = data.shape[1] // 2
            yield f"blk.{block}.ffn_gate_exps.weight", data[:, :half]
            yield f"blk.{block}.ffn_up_exps.weight", data[:, half:]
            continue
        if key.endswith("experts.down_proj"):
            yield f"blk.{block}.ffn_down_exps.weight", data
            continue
        if key.endswith("shared_expert_gate.weight"):
            data = data.reshape(-1)
        if "in_proj_qkvz.weight" in key and not fused:  # per key head [q, k, v, z] -> all q | all k | all v, z
            k_dim, v_dim = config.linear_key_head_dim, config.linear_value_head_dim
            k_heads, v_heads = config.linear_num_key_heads, config.linear_num_value_heads
            split = np.cumsum([k_dim, k_dim, v_heads // k_heads * v_dim])
            q, k, v, z = np.split(data.T.reshape(-1, k_heads, data.shape[0] // k_heads), split, axis=-1)
            flat = [part.reshape(data.shape[1], -1) for part in (q, k, v, z)]
            yield f"blk.{block}.attn_qkv.weight", np.ascontiguousarray(np.concatenate(flat[:3], axis=-1).T)
            yield f"blk.{block}.attn_gate.weight", np.ascontiguousarray(flat[3].T)
            continue
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        assert name is not None, key
        yield name, data


def linear_converted(model, arch: str, fused: bool = False) -> dict:
    """{GGUF name: float32 array} of an LFM2 / Qwen3-Next / Qwen3.5 model as the converter
    writes it (``fused``: an older Qwen3-Next file, in_proj_qkvz kept as ``ssm_in``)."""
    return {name: data.astype(np.float32) for name, data in _linear_tensors(model, arch, fused)}


def write_linear(path, model, arch: str, *, qtype=None, fused: bool = False) -> str:
    """``model`` as a GGUF file of ``arch`` (lfm2, lfm2moe, qwen3next, qwen35, qwen35moe)."""
    tensors = {}
    for name, data in linear_converted(model, arch, fused).items():
        if _quantizable(name, data, qtype) and "ssm_a" not in name:
            raw = gguf.quants.quantize(data, qtype)
            tensors[name] = (raw, qtype)
        else:
            tensors[name] = data
    return write_file(path, arch, linear_keys(model.config, arch), tensors)


# ---- Olmo2Model, StarCoder2Model, CommandRModel, GPT2Model, Phi2Model, BloomModel, MPTModel ----

CLASSIC = {"olmo2": "OLMO2", "starcoder2": "STARCODER2", "command-r": "COMMAND_R", "gpt2": "GPT2", "phi2": "PHI2",
           "bloom": "BLOOM", "mpt": "MPT"}
CONV1D = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")


def _alibi_keys(config, arch: str) -> dict:
    """``BloomModel`` / ``MPTModel.set_gguf_parameters`` (they write no vocab_size), by
    full name; from the config.json the converter reads (``config.to_dict()``)."""
    hparams = config.to_dict()
    if arch == "bloom":
        d, heads = hparams.get("hidden_size", hparams.get("n_embed")), hparams["n_head"]
        keys = {"context_length": hparams.get("seq_length", d), "embedding_length": d, "feed_forward_length": 4 * d,
                "block_count": hparams["n_layer"], "attention.head_count": heads, "attention.head_count_kv": heads,
                "attention.layer_norm_epsilon": float(hparams["layer_norm_epsilon"])}
        return {f"bloom.{key}": value for key, value in keys.items()}
    attn = hparams["attn_config"]
    keys = {"context_length": hparams["max_seq_len"], "embedding_length": hparams["d_model"],
            "block_count": hparams["n_layers"], "feed_forward_length": 4 * hparams["d_model"],
            "attention.head_count": hparams["n_heads"]}
    if attn.get("kv_n_heads"):
        keys["attention.head_count_kv"] = attn["kv_n_heads"]
    keys["attention.layer_norm_epsilon"] = 1e-5  # the converter's constant, not the config's
    if attn["clip_qkv"] is not None:
        keys["attention.clamp_kqv"] = float(attn["clip_qkv"])
    keys["attention.max_alibi_bias"] = float(attn["alibi_bias_max"]) if attn["alibi"] else 0.0
    return {f"mpt.{key}": value for key, value in keys.items()}


def classic_keys(config, arch: str) -> dict:
    """The keys those converters write (TextModel's, GPT2Model's, Phi2Model's, BloomModel's
    and MPTModel's own), by full name."""
    if arch in ("bloom", "mpt"):
        return _alibi_keys(config, arch)
    d, heads = config.hidden_size, config.num_attention_heads
    keys = {"block_count": config.num_hidden_layers, "embedding_length": d, "attention.head_count": heads,
            "vocab_size": config.vocab_size}
    if arch == "gpt2":
        keys.update({"context_length": config.n_positions, "feed_forward_length": config.n_inner or 4 * d,
                     "attention.layer_norm_epsilon": float(config.layer_norm_epsilon)})
        return {f"{arch}.{key}": value for key, value in keys.items()}
    rope = _rope_params(config)
    keys.update({"context_length": config.max_position_embeddings, "feed_forward_length": config.intermediate_size,
                 "attention.head_count_kv": getattr(config, "num_key_value_heads", None) or heads,
                 "rope.freq_base": float(rope.get("rope_theta", 1e4))})
    if arch == "olmo2":
        keys["attention.layer_norm_rms_epsilon"] = float(config.rms_norm_eps)
    else:
        eps = next(getattr(config, k) for k in ("layer_norm_eps", "norm_epsilon") if hasattr(config, k))
        keys["attention.layer_norm_epsilon"] = float(eps)
    if arch == "starcoder2" and config.sliding_window:
        keys["attention.sliding_window"] = config.sliding_window
    if arch == "command-r":
        keys["logit_scale"] = float(config.logit_scale)
    if arch == "phi2":
        keys["rope.dimension_count"] = int(rope.get("partial_rotary_factor", 0.5) * (d // heads))
    return {f"{arch}.{key}": value for key, value in keys.items()}


def bloom_qkv(data: np.ndarray, heads: int) -> np.ndarray:
    """``BloomModel.modify_tensors``: ``query_key_value``'s per-head q | k | v rows (weight
    [3d, d] or bias [3d]) regrouped into all q | all k | all v."""
    per_head = data.reshape(heads, 3, data.shape[0] // heads // 3, *data.shape[1:])
    return np.concatenate([per_head[:, part].reshape(-1, *data.shape[1:]) for part in range(3)])


def classic_tensors(model, arch: str, output_copy: bool = False) -> dict:
    """{GGUF name: float32 array} of ``model`` as those converters write it: gguf's name
    table, GPT-2's Conv1D weights transposed, BLOOM's names without ``transformer.`` and
    its q | k | v regrouped, a tied head left out; ``output_copy``: BLOOM's ``output.weight``,
    a copy of ``token_embd``, as older converters wrote it for a checkpoint without a head."""
    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[CLASSIC[arch]], config.num_hidden_layers)
    tensors = {}
    for key, value in model.state_dict().items():
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = value.detach().float().numpy()
        if arch == "gpt2" and key.endswith(CONV1D):
            data = data.T
        if arch == "bloom":
            key = key.replace("transformer.", "")
            if "self_attention.query_key_value" in key:
                data = bloom_qkv(data, config.n_head)
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        assert name is not None, key
        tensors[name] = np.ascontiguousarray(data, dtype=np.float32)
    if output_copy:
        tensors["output.weight"] = tensors["token_embd.weight"].copy()
    return tensors


def write_classic(path, model, arch: str, keys=None, tensors=None, output_copy: bool = False) -> str:
    """``model`` as a GGUF file of ``arch`` (olmo2, starcoder2, command-r, gpt2, phi2, bloom,
    mpt; ``classic_tensors``), with ``keys`` changed and ``tensors`` added or replaced."""
    return write_file(path, arch, {**classic_keys(model.config, arch), **(keys or {})},
                      {**classic_tensors(model, arch, output_copy), **(tensors or {})})
