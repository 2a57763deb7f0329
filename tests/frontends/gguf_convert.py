"""GGUF twins of gptneox, falcon, glm4, cohere2, olmo, olmoe, gpt-oss, olmo2 (OLMo-2 / OLMo-3)
and mistral3 files, written from a tiny transformers model the way llama.cpp's
``convert_hf_to_gguf.py`` writes them (``GPTNeoXModel``, ``FalconModel``, ``Glm4Model``,
``Cohere2Model``, ``OlmoModel``, ``OlmoeModel``, ``GptOssModel``, ``Olmo2Model``,
``Ministral3Model``), independently of ``frontends.gguf``; and kimi-linear's from a saved
checkpoint (``KimiLinearModel``: ``kimi_converted``).

Keys: ``TextModel.set_gguf_parameters``' (context, widths, heads, the RoPE of
``rope_parameters[full_attention]`` or the top level: base, linear or YaRN scaling, the sliding
layers' base as ``rope.freq_base_swa``; the norm epsilon by its HF key; expert counts;
``head_dim`` as key/value length), then each converter's own; GPT-NeoX and Falcon write
theirs alone (no RoPE base: llama.cpp's default 10000). Falcon's kv heads are read as the
Hub's config.json gives them (``multi_query`` without ``num_kv_heads``: 1).

Tensors: gguf's own HF -> GGUF name table, with each converter's changes made as it makes
them: OLMo-1's and Ministral-3's Q/K rows permuted as Llama's; GPT-NeoX's per-head q | k | v rows regrouped
into all q | all k | all v; Falcon's per kv group [q_0 .. q_r, k, v] likewise; OLMoE's
experts stacked [E, ...]; GPT-OSS's ``gate_up_proj`` [E, d, 2F] transposed and split (gate =
rows ::2, up = rows 1::2, the bias likewise), ``down_proj`` transposed, ``sinks`` renamed
``sinks.weight``; a tied head left out.
``mxfp4=True`` writes GPT-OSS's experts as the converter writes a released checkpoint's:
from the checkpoint's MXFP4 ``_blocks`` / ``_scales`` (made here in OpenAI's layout: two
e2m1 codes a byte, the even element in the low nibble; one e8m0 scale per 32), repacked by
``GptOssModel.repack_mxfp4`` (scale byte first, ``transform_nibble_layout``).
"""
from __future__ import annotations

import gguf
import numpy as np

from gguf_writer import _quantizable, permute, write_file

ARCHS = {"gptneox": "GPTNEOX", "falcon": "FALCON", "glm4": "GLM4", "cohere2": "COHERE2", "olmoe": "OLMOE",
         "gpt-oss": "GPT_OSS", "olmo2": "OLMO2", "olmo": "OLMO",
         "mistral3": "MISTRAL3"}
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      np.float32)  # OCP MX e2m1, the table transformers' dequantizer uses


def _rope(hparams: dict) -> tuple:
    params = hparams.get("rope_parameters") or {}
    return params.get("full_attention", params), params.get("sliding_attention", {})


def falcon_kv_heads(config) -> int:
    if config.new_decoder_architecture:
        return config.num_kv_heads
    return 1 if config.multi_query else config.num_attention_heads


def base_keys(hparams: dict) -> dict:
    """``TextModel.set_gguf_parameters`` (without the arch prefix)."""
    keys = {"block_count": hparams["num_hidden_layers"], "embedding_length": hparams["hidden_size"],
            "feed_forward_length": hparams["intermediate_size"], "attention.head_count": hparams["num_attention_heads"]}
    if hparams.get("max_position_embeddings") is not None:
        keys["context_length"] = hparams["max_position_embeddings"]
    if hparams.get("num_key_value_heads") is not None:
        keys["attention.head_count_kv"] = hparams["num_key_value_heads"]
    full, sliding = _rope(hparams)
    if full.get("rope_type") == "linear":
        keys.update({"rope.scaling.type": "linear", "rope.scaling.factor": float(full["factor"])})
    elif full.get("rope_type") == "yarn":
        keys.update({"rope.scaling.type": "yarn", "rope.scaling.factor": float(full["factor"]),
                     "rope.scaling.original_context_length": full["original_max_position_embeddings"]})
        for key, name in (("yarn_attn_factor", "attention_factor"), ("yarn_beta_fast", "beta_fast"),
                          ("yarn_beta_slow", "beta_slow")):
            if full.get(name) is not None:
                keys[f"rope.scaling.{key}"] = float(full[name])
    if full.get("rope_theta") is not None:
        keys["rope.freq_base"] = float(full["rope_theta"])
    if sliding.get("rope_theta") is not None:
        keys["rope.freq_base_swa"] = float(sliding["rope_theta"])
    for key, names in (("attention.layer_norm_rms_epsilon", ("rms_norm_eps",)),
                       ("attention.layer_norm_epsilon", ("layer_norm_eps", "layer_norm_epsilon"))):
        name = next((n for n in names if hparams.get(n) is not None), None)
        if name:
            keys[key] = float(hparams[name])
    experts = hparams.get("num_local_experts") or hparams.get("num_experts")
    if experts:
        used = next(hparams[k] for k in ("num_experts_per_tok", "num_experts_per_token") if hparams.get(k))
        keys.update({"expert_count": experts, "expert_used_count": used})
    if hparams.get("head_dim") is not None:
        keys.update({"attention.key_length": hparams["head_dim"], "attention.value_length": hparams["head_dim"]})
    return keys


def converter_keys(config, arch: str) -> dict:
    """The keys ``arch``'s converter writes, by full name."""
    hparams = config.to_dict()
    d, heads = config.hidden_size, config.num_attention_heads
    if arch == "gptneox":
        rotary = _rope(hparams)[0].get("partial_rotary_factor", 1.0)
        keys = {"context_length": config.max_position_embeddings, "embedding_length": d,
                "block_count": config.num_hidden_layers, "feed_forward_length": config.intermediate_size,
                "rope.dimension_count": int(rotary * (d // heads)), "attention.head_count": heads,
                "use_parallel_residual": bool(config.use_parallel_residual),
                "attention.layer_norm_epsilon": float(config.layer_norm_eps)}
    elif arch == "falcon":
        keys = {"context_length": 2048, "tensor_data_layout": "jploski", "embedding_length": d,
                "feed_forward_length": 4 * d, "block_count": config.num_hidden_layers, "attention.head_count": heads,
                "attention.head_count_kv": falcon_kv_heads(config),
                "attention.layer_norm_epsilon": float(config.layer_norm_epsilon)}
    else:
        keys = base_keys(hparams)
    head_dim = getattr(config, "head_dim", None) or d // heads
    if arch == "glm4":
        keys["rope.dimension_count"] = int(head_dim * _rope(hparams)[0].get("partial_rotary_factor", 0.5))
    if arch == "cohere2":  # the Hub's rotary_pct: 1.0
        keys.update({"logit_scale": float(config.logit_scale), "attention.sliding_window": config.sliding_window,
                     "vocab_size": config.vocab_size, "rope.dimension_count": d // heads})
    if arch == "olmoe":
        keys["attention.layer_norm_rms_epsilon"] = 1e-5
    if arch == "olmo":
        keys["attention.layer_norm_epsilon"] = 1e-5
        if config.clip_qkv is not None:
            keys["attention.clamp_kqv"] = float(config.clip_qkv)
    if arch == "olmo2" and "sliding_window" in hparams:  # OLMo-3
        keys["attention.sliding_window"] = config.sliding_window
        keys["attention.sliding_window_pattern"] = [t == "sliding_attention" for t in config.layer_types]
    if arch == "mistral3":  # LlamaModel's, then Ministral3Model's
        full = _rope(hparams)[0]
        keys.update({"vocab_size": config.vocab_size, "rope.dimension_count": head_dim,
                     "rope.scaling.yarn_log_multiplier": float(full["mscale_all_dim"]),
                     "attention.temperature_scale": float(full["llama_4_scaling_beta"])})
    if arch == "gpt-oss":
        keys.update({"attention.sliding_window": config.sliding_window,
                     "expert_feed_forward_length": config.intermediate_size})
    return {f"{arch}.{key}": value for key, value in keys.items()}


def _regroup(data: np.ndarray, groups: int, per_group: int, q_slots: int, head_dim: int) -> np.ndarray:
    """Rows [groups, per_group slots of head_dim, ...] -> all q slots | all k | all v."""
    view = data.reshape(groups, per_group, head_dim, *data.shape[1:])
    q, k, v = view[:, :q_slots], view[:, q_slots:q_slots + 1], view[:, q_slots + 1:]
    return np.concatenate([part.reshape(-1, *data.shape[1:]) for part in (q, k, v)])


def _converted(model, arch: str):
    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[ARCHS[arch]], config.num_hidden_layers)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    for key, value in model.state_dict().items():
        data = value.detach().float().numpy().copy()
        parts = key.split(".")
        block = next((parts[i + 1] for i, p in enumerate(parts) if p in ("layers", "h")), None)
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if "query_key_value" in key and arch == "gptneox":  # GPTNeoXModel.modify_tensors
            data = _regroup(data, heads, 3, 1, head_dim)
        elif "query_key_value" in key:  # FalconModel.modify_tensors
            kv = falcon_kv_heads(config)
            data = _regroup(data, kv, heads // kv + 2, heads // kv, head_dim)
        if arch in ("olmo", "mistral3") and key.endswith(("q_proj.weight", "k_proj.weight")):  # Llama's permute
            data = permute(data, heads if ".q_proj." in key else config.num_key_value_heads)
        if arch == "olmoe" and key.endswith("experts.gate_up_proj"):
            half = data.shape[1] // 2
            yield f"blk.{block}.ffn_gate_exps.weight", data[:, :half]
            yield f"blk.{block}.ffn_up_exps.weight", data[:, half:]
            continue
        if arch == "olmoe" and key.endswith("experts.down_proj"):
            yield f"blk.{block}.ffn_down_exps.weight", data
            continue
        if arch == "gpt-oss" and ".experts." in key:
            yield from _gpt_oss_experts(key, data, block)
            continue
        if arch == "gpt-oss" and key.endswith(".sinks"):  # GptOssModel.filter_tensors
            key += ".weight"
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        assert name is not None, key
        yield name, data


def _gpt_oss_experts(key: str, data: np.ndarray, block: str):
    """``GptOssModel.modify_tensors`` on the float (not MXFP4) expert tensors."""
    prefix = f"blk.{block}."
    if key.endswith("gate_up_proj_bias"):
        yield prefix + "ffn_gate_exps.bias", data[..., ::2]
        yield prefix + "ffn_up_exps.bias", data[..., 1::2]
    elif key.endswith("gate_up_proj"):
        rows = data.transpose(0, 2, 1)
        yield prefix + "ffn_gate_exps.weight", rows[:, ::2]
        yield prefix + "ffn_up_exps.weight", rows[:, 1::2]
    elif key.endswith("down_proj_bias"):
        yield prefix + "ffn_down_exps.bias", data
    else:
        yield prefix + "ffn_down_exps.weight", data.transpose(0, 2, 1)


def converted(model, arch: str) -> dict:
    """{GGUF name: float32 array} of ``model`` as the converter writes it."""
    return {name: np.ascontiguousarray(data, dtype=np.float32) for name, data in _converted(model, arch)}


def write_converted(path, model, arch: str, *, mxfp4: bool = False, tokens: bool = False, qtype=None) -> str:
    """``model`` as a GGUF file of ``arch``; ``mxfp4``: GPT-OSS's expert weights as MXFP4
    from checkpoint blocks (``mxfp4_checkpoint``; the model's experts must already hold
    their MXFP4 values: ``mxfp4_round_experts``); ``tokens``: the bos / eos ids of the config
    as the converter's ``SpecialVocab`` writes them; ``qtype``: every other weight of rank >= 2
    whose rows fit whole blocks quantized with ``gguf.quants.quantize`` (``gguf_writer``'s rule)."""
    keys = converter_keys(model.config, arch)
    if tokens:
        for name in ("bos_token_id", "eos_token_id"):
            if isinstance(getattr(model.config, name, None), int):
                keys[f"tokenizer.ggml.{name}"] = getattr(model.config, name)
    tensors = {name: (gguf.quants.quantize(data, qtype), qtype) if _quantizable(name, data, qtype) else data
               for name, data in converted(model, arch).items()}
    if mxfp4:
        for layer in range(model.config.num_hidden_layers):
            experts = model.model.layers[layer].mlp.experts
            for part, stored in (("gate_up", experts.gate_up_proj), ("down", experts.down_proj)):
                blocks, scales = mxfp4_checkpoint(stored.detach().float().numpy().transpose(0, 2, 1))
                if part == "down":
                    tensors[f"blk.{layer}.ffn_down_exps.weight"] = (repack_mxfp4(blocks, scales),
                                                                    gguf.GGMLQuantizationType.MXFP4)
                    continue
                for name, rows in (("gate", slice(0, None, 2)), ("up", slice(1, None, 2))):
                    tensors[f"blk.{layer}.ffn_{name}_exps.weight"] = (repack_mxfp4(blocks[:, rows], scales[:, rows]),
                                                                      gguf.GGMLQuantizationType.MXFP4)
    return write_file(path, arch, keys, tensors)


# ---- MXFP4: OpenAI's checkpoint layout and the converter's repacking --------------------------

def mxfp4_checkpoint(rows: np.ndarray) -> tuple:
    """Float rows [E, N, K] -> the checkpoint's (``_blocks`` uint8 [E, N, K/32, 16], ``_scales``
    uint8 [E, N, K/32]): per 32 values the e8m0 exponent floor(log2 max|x|) - 2 (biased by
    127), each value the nearest e2m1 code, two codes a byte (even element low)."""
    groups = rows.reshape(*rows.shape[:-1], rows.shape[-1] // 32, 32).astype(np.float64)
    amax = np.abs(groups).max(axis=-1)
    exponent = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - 2, 0).astype(np.int64)
    scaled = groups / np.ldexp(1.0, exponent)[..., None]
    codes = np.abs(scaled[..., None] - FP4_VALUES.astype(np.float64)).argmin(axis=-1).astype(np.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))
    return blocks, (exponent + 127).astype(np.uint8)


def mxfp4_values(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The checkpoint's MXFP4 as float32 rows [E, N, K], with transformers' own dequantizer
    (``convert_moe_packed_tensors``, which returns [E, K, N]: transposed back here)."""
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    out = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)
    return out.transpose(1, 2).numpy()


def _transform_nibble_layout(blocks: np.ndarray) -> np.ndarray:
    """``GptOssModel.transform_nibble_layout``: OpenAI's byte order (pairs) -> ggml's (element
    j low, element j + 16 high), as the converter computes it."""
    swapped = ((blocks & 0x0F) << 4) | ((blocks & 0xF0) >> 4)
    blk_a, blk_b = swapped[..., :8], swapped[..., 8:]
    blk_a = np.stack([blk_a & 0xF0, (blk_a << 4).astype(np.uint8)], axis=-1).reshape(blocks.shape)
    blk_b = np.stack([blk_b >> 4, blk_b & 0x0F], axis=-1).reshape(blocks.shape)
    out = blk_a | blk_b
    return ((out & 0xF0) >> 4) | ((out & 0x0F) << 4)


def repack_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``GptOssModel.repack_mxfp4``: per block the scale byte, then the 16 code bytes; the
    raw tensor [E, N, K/32 * 17]."""
    packed = np.concatenate([scales[..., None], _transform_nibble_layout(blocks)], axis=-1)
    return np.ascontiguousarray(packed.reshape(*packed.shape[:2], -1))


def mxfp4_round_experts(model) -> None:
    """Give the model's expert weights the values their MXFP4 checkpoint holds (transformers'
    dequantization of ``mxfp4_checkpoint``), so a twin written with ``mxfp4=True`` is the model."""
    import torch

    with torch.no_grad():
        for layer in model.model.layers:
            for param in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj):
                rows = param.detach().float().numpy().transpose(0, 2, 1)
                values = mxfp4_values(*mxfp4_checkpoint(rows))
                param.copy_(torch.from_numpy(np.ascontiguousarray(values.transpose(0, 2, 1))))


# ---- KimiLinearModel (kimi-linear), from the saved checkpoint --------------------------------

def kimi_keys(config) -> dict:
    """``KimiLinearModel.set_gguf_parameters`` on the twin's config.json (with the Hub's
    ``moe_router_activation_func: sigmoid``, which transformers 5.24 does not save), by full
    name: MLA as MQA (kv heads 1), ``head_count_kv`` 0 on the KDA layers."""
    hparams = {**config.to_dict(), "num_key_value_heads": 1}
    linear = hparams["linear_attn_config"]
    keys = base_keys(hparams)
    keys.update({"attention.head_count_kv": [1 if i + 1 in linear["full_attn_layers"] else 0
                                             for i in range(config.num_hidden_layers)],
                 "expert_group_used_count": hparams["topk_group"], "expert_gating_func": 2,
                 "vocab_size": config.vocab_size, "ssm.conv_kernel": linear["short_conv_kernel_size"],
                 "kda.head_dim": linear["head_dim"], "attention.kv_lora_rank": config.kv_lora_rank,
                 "rope.dimension_count": config.qk_rope_head_dim,
                 "attention.key_length": config.kv_lora_rank + config.qk_rope_head_dim,
                 "attention.key_length_mla": config.qk_nope_head_dim + config.qk_rope_head_dim,
                 "attention.value_length_mla": config.v_head_dim,
                 "expert_feed_forward_length": config.moe_intermediate_size,
                 "expert_shared_count": hparams["num_shared_experts"],
                 "leading_dense_block_count": config.first_k_dense_replace,
                 "expert_weights_scale": float(config.routed_scaling_factor)})
    if config.q_lora_rank is not None:
        keys["attention.q_lora_rank"] = config.q_lora_rank
    return {f"kimi-linear.{key}": value for key, value in keys.items()}


def kimi_converted(config, folder) -> dict:
    """{GGUF name: float32 array} of the checkpoint saved in ``folder`` as
    ``KimiLinearModel.modify_tensors`` writes it (in torch, as there): each conv weight
    [C, K] or [C, 1, K] as [1, C, 1, K], A_log as -exp(A_log), dt_bias renamed
    dt_proj.bias, the per-expert w1 / w2 / w3 stacked, kv_b split into k_b (transposed per
    head) and v_b. A dense layer's MLP is read under ``mlp.``, where the Hub's checkpoint
    has it (transformers 5.24 saves it under ``block_sparse_moe.``)."""
    import torch

    from gguf_writer import _checkpoint

    n = config.num_hidden_layers
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.KIMI_LINEAR, n)
    tensors, out = _checkpoint(folder), {}
    experts = config.num_experts
    for key, value in tensors.items():
        block = key.split(".")[2] if key.startswith("model.layers.") else None
        if ".experts." in key:
            if key.endswith(".experts.0.w1.weight"):
                for w, part in (("w1", "gate"), ("w2", "down"), ("w3", "up")):
                    stacked = torch.stack([tensors[key.replace(".0.w1.", f".{e}.{w}.")] for e in range(experts)])
                    out[f"blk.{block}.ffn_{part}_exps.weight"] = stacked.numpy()
            continue
        if ".block_sparse_moe." in key and key.endswith(("gate_proj.weight", "up_proj.weight", "down_proj.weight")) \
                and ".shared_experts." not in key:  # a dense layer's MLP: under mlp. in the Hub's checkpoint
            key = key.replace(".block_sparse_moe.", ".mlp.")
        if key.endswith((".q_conv1d.weight", ".k_conv1d.weight", ".v_conv1d.weight")):
            value = value.reshape(1, value.shape[0], 1, value.shape[-1])
        if key.endswith(".A_log"):
            value = -torch.exp(value)
        if key.endswith(".dt_bias"):
            key = key[:-len(".dt_bias")] + ".dt_proj.bias"
        if key.endswith("kv_b_proj.weight"):
            nope, v = config.qk_nope_head_dim, config.v_head_dim
            kv_b = value.view(config.num_attention_heads, nope + v, value.shape[-1])
            k_b, v_b = torch.split(kv_b, [nope, v], dim=1)
            out[f"blk.{block}.attn_k_b.weight"] = k_b.transpose(1, 2).contiguous().numpy()
            out[f"blk.{block}.attn_v_b.weight"] = v_b.contiguous().numpy()
            continue
        if key.endswith("e_score_correction_bias"):
            out[f"blk.{block}.exp_probs_b.bias"] = value.numpy()
            continue
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        assert name is not None, key
        out[name] = value.numpy()
    return {name: np.ascontiguousarray(data, dtype=np.float32) for name, data in out.items()}


def write_kimi(path, model, folder) -> str:
    """The Kimi-Linear twin saved in ``folder`` as a GGUF file at ``path``."""
    return write_file(path, "kimi-linear", kimi_keys(model.config), kimi_converted(model.config, folder))
