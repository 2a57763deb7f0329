"""GGUF twins of Gemma-3n (``gemma3n``) and Gemma-4's dense text model (``gemma4``), written
from a tiny transformers Gemma3nForCausalLM / Gemma4ForCausalLM the way llama.cpp's
``convert_hf_to_gguf.py`` writes them (``Gemma3NModel`` and ``Gemma4Model``, both
``Gemma3Model``s; llama.cpp registers ``Gemma4Model`` for the multimodal
Gemma4ForConditionalGeneration, whose text model is this one under ``model.language_model.``),
independently of ``frontends.gguf``. Gemma-4's keys and tensors: ``gemma4_keys``,
``gemma4_converted``.

Keys: ``TextModel.set_gguf_parameters``' (``gguf_convert.base_keys``: widths, heads, the
per-layer ``intermediate_size`` list as ``feed_forward_length``, the full-attention RoPE base
and scaling, the sliding layers' base as ``rope.freq_base_swa``), ``Gemma3Model``'s
(``final_logit_softcapping``, ``attention.sliding_window``), then ``Gemma3NModel``'s:
``altup.active_idx``, ``altup.num_inputs``, ``embedding_length_per_layer_input``,
``attention.shared_kv_layers``, ``activation_sparsity_scale`` (per layer the standard
normal's icdf of the sparsity, in float32 with torch as the converter computes it: -inf where
the sparsity is 0) and ``attention.sliding_window_pattern`` (one bool per layer, true where
sliding). Nothing says ``vocab_size_per_layer_input`` or ``altup_correct_scale``.

Tensors: gguf's own HF -> GGUF name table; norms unshifted (``norm_shift`` 0); names
ending ``_scale`` get ``.weight`` (``altup.correct_output_scale``); ``altup_projections.{j}``
and ``altup_unembed_projections.{j}`` stacked into one [n - 1, d, d] tensor each
(``altup_proj``, ``altup_unembd_proj``); ``embed_tokens`` and ``embed_tokens_per_layer``
padded with zero rows to ``vocab_size``; a tied head left out (the checkpoint has none).
The converter asserts four AltUp streams; the twins have four.
"""
from __future__ import annotations

import gguf
import numpy as np

from gguf_convert import base_keys
from gguf_writer import write_file


def gemma3n_keys(config) -> dict:
    import torch

    hparams = config.to_dict()
    keys = base_keys(hparams)
    keys.update({"context_length": config.max_position_embeddings, "attention.head_count": config.num_attention_heads,
                 "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
                 "attention.key_length": config.head_dim, "attention.value_length": config.head_dim,
                 "rope.freq_base": float(hparams["rope_parameters"]["full_attention"].get("rope_theta", 1e6)),
                 "attention.sliding_window": config.sliding_window,
                 "attention.head_count_kv": config.num_key_value_heads,
                 "altup.active_idx": config.altup_active_idx, "altup.num_inputs": config.altup_num_inputs,
                 "embedding_length_per_layer_input": config.hidden_size_per_layer_input,
                 "attention.shared_kv_layers": config.num_kv_shared_layers,
                 "activation_sparsity_scale": [
                     float(torch.distributions.normal.Normal(0, 1).icdf(torch.tensor(p, dtype=torch.float32)).item())
                     for p in config.activation_sparsity_pattern],
                 "attention.sliding_window_pattern": [t == "sliding_attention" for t in config.layer_types]})
    if config.final_logit_softcapping:
        keys["final_logit_softcapping"] = float(config.final_logit_softcapping)
    return {f"gemma3n.{key}": value for key, value in keys.items()}


def gemma3n_converted(model) -> dict:
    """{GGUF name: float32 array} as ``Gemma3NModel.modify_tensors`` writes the checkpoint."""
    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3N, config.num_hidden_layers)
    out, stacks = {}, {"altup_projections": {}, "altup_unembed_projections": {}}
    for key, value in model.state_dict().items():
        data = value.detach().float().numpy().copy()
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue
        group = next((g for g in stacks if f".{g}." in key), None)
        if group:
            stacks[group][int(key.split(".")[-2])] = data
            continue
        if "embed_tokens.weight" in key or "embed_tokens_per_layer" in key:
            pad = config.vocab_size - data.shape[0]
            data = np.concatenate([data, np.zeros((pad, data.shape[1]), data.dtype)]) if pad > 0 else data
        if key.endswith("_scale"):
            key += ".weight"
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        assert name is not None, key
        out[name] = data
    for group, found in stacks.items():
        name = names.get_name(f"model.{group}.weight", try_suffixes=(".weight",))
        assert name is not None, group
        out[name] = np.stack([found[j] for j in range(len(found))])
    return {name: np.ascontiguousarray(data, dtype=np.float32) for name, data in out.items()}


def write_gemma3n(path, model, qtype=None) -> str:
    """``model`` as the converter's ``gemma3n`` file at ``path`` (``qtype``: weights of rank
    >= 2 whose rows fit whole blocks quantized, ``gguf_writer``'s rule)."""
    from gguf_writer import _quantizable

    tensors = {name: (gguf.quants.quantize(data, qtype), qtype) if _quantizable(name, data, qtype) else data
               for name, data in gemma3n_converted(model).items()}
    return write_file(path, "gemma3n", gemma3n_keys(model.config), tensors)


# ---- Gemma4Model (gemma4): the dense text model --------------------------------------------

def gemma4_keys(config, global_head_dim: int, global_kv_heads=None) -> dict:
    """``Gemma4Model.set_gguf_parameters`` (after ``Gemma3Model``'s and ``TextModel``'s), by
    full name. ``global_head_dim`` and ``num_global_key_value_heads`` as the Hub's config.json
    gives them (transformers 5.24 saves them as ``per_layer_config`` instead)."""
    hparams = config.to_dict()
    rope = hparams["rope_parameters"]
    keys = base_keys(hparams)
    n, shared = config.num_hidden_layers, config.num_kv_shared_layers
    swa = [t == "sliding_attention" for t in config.layer_types]
    keys.update({"context_length": config.max_position_embeddings, "attention.head_count": config.num_attention_heads,
                 "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
                 "rope.freq_base": float(rope["full_attention"]["rope_theta"]),
                 "attention.sliding_window": config.sliding_window,
                 "attention.head_count_kv": hparams["num_key_value_heads"],
                 "attention.shared_kv_layers": shared,
                 "embedding_length_per_layer_input": config.hidden_size_per_layer_input or 0,
                 "attention.sliding_window_pattern": swa,
                 "attention.key_length": global_head_dim, "attention.value_length": global_head_dim,
                 "attention.key_length_swa": hparams["head_dim"], "attention.value_length_swa": hparams["head_dim"],
                 "rope.dimension_count": global_head_dim,
                 "rope.dimension_count_swa": int(hparams["head_dim"] * (hparams.get("partial_rotary_factor") or 1.0))})
    if config.final_logit_softcapping:
        keys["final_logit_softcapping"] = float(config.final_logit_softcapping)
    if config.use_double_wide_mlp:
        keys["feed_forward_length"] = [config.intermediate_size * (1 if i < n - shared else 2) for i in range(n)]
    if global_kv_heads is not None:
        keys["attention.head_count_kv"] = [hparams["num_key_value_heads"] if s else global_kv_heads for s in swa]
    return {f"gemma4.{key}": value for key, value in keys.items()}


def gemma4_converted(model, global_head_dim: int) -> dict:
    """{GGUF name: float32 array}: gguf's name table (``layer_scalar`` as
    ``layer_output_scale.weight``), norms unshifted, and ``rope_freqs`` from
    ``generate_extra_tensors``: 1 for the full layers' rotated frequency pairs, 1e30 for the
    rest."""
    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, config.num_hidden_layers)
    out = {}
    for key, value in model.state_dict().items():
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if key.endswith(("per_dim_scale", "layer_scalar")):
            key += ".weight"
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        assert name is not None, key
        out[name] = value.detach().float().numpy()
    full = config.to_dict()["rope_parameters"]["full_attention"]
    assert full["rope_type"] == "proportional"
    rotated = int(global_head_dim * full["partial_rotary_factor"] / 2)
    out["rope_freqs.weight"] = np.array([1.0] * rotated + [1e30] * (global_head_dim // 2 - rotated), np.float32)
    return {name: np.ascontiguousarray(data, dtype=np.float32) for name, data in out.items()}
