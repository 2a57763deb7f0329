"""Tiny random twins with a multi-token-prediction head, and transformers 5.25's own
``MtpModel`` (``modeling_layers``) as the reference for the head's logits.

transformers' ``save_pretrained`` writes the decoder alone (its causal LM has no MTP layer), so
the head's tensors are written here as the released checkpoints hold them: the block's names
come from the same class's model one layer deeper (its layer n saved as transformers writes a
layer, per-expert names included), the head's own params (``enorm``, ``hnorm``, ``eh_proj``,
the post norm) under the family's names (``frontends.hf.mtp.FORMS``)."""
from __future__ import annotations

import copy
import json
import os

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file, save_file
from transformers.modeling_layers import MtpModel

from tests.frontends.test_hf_models import MLA, SMALL, randomize, save_twin, twin_seed

DEEPSEEK_NAMES = {"enorm": "enorm.weight", "hnorm": "hnorm.weight", "eh_proj": "eh_proj.weight",
                  "post_norm": "shared_head.norm.weight"}
QWEN_NAMES = {"enorm": "pre_fc_norm_embedding.weight", "hnorm": "pre_fc_norm_hidden.weight",
              "eh_proj": "fc.weight", "post_norm": "norm.weight"}
QWEN = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, max_position_embeddings=64, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=8, linear_value_head_dim=6, num_hidden_layers=3,
            layer_types=["linear_attention", "linear_attention", "full_attention"])  # the last: MtpModel takes its norm class
EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
CASES = {  # name: (config class, settings, form: deepseek (model.layers.{n}.) or qwen (mtp.))
    "deepseek-v3": ("DeepseekV3Config", dict(SMALL, **MLA, q_lora_rank=16, n_routed_experts=4, num_experts_per_tok=2,
                                             n_group=2, topk_group=1, rope_interleave=True), "deepseek"),
    "glm4-moe": ("Glm4MoeConfig", dict(SMALL, head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
                                       moe_intermediate_size=16, first_k_dense_replace=1, attention_bias=True,
                                       partial_rotary_factor=0.5), "deepseek"),
    "qwen3.5-moe": ("Qwen3_5MoeTextConfig", dict(QWEN, **EXPERTS), "qwen"),
    "qwen3.5-dense": ("Qwen3_5TextConfig", dict(QWEN), "qwen"),
    "qwen3-next": ("Qwen3NextConfig", dict(QWEN, **EXPERTS), "qwen"),
}


def build_mtp_twin(name: str, folder):
    """(transformers model, its MtpModel, folder) for ``CASES[name]``."""
    class_name, settings, form = CASES[name]
    config = getattr(transformers, class_name)(**settings)
    config.num_mtp_layers = 1
    if form == "qwen":
        config.mtp_layer_types = ["full_attention"]
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    qwen_norm = form == "qwen"
    randomize(model, seed=twin_seed(name), norm_centre=0.0 if qwen_norm else 1.0)  # Qwen3.5 norms are (1 + w)
    _plain_gated_norms(model)
    save_twin(model, folder)
    mtp = MtpModel(model, 1).eval()
    head = {n: p for n, p in mtp.named_parameters() if n.startswith("layers.")}  # not the shared embed / head
    _randomize_head(mtp, head, twin_seed(name + "-mtp"), 0.0 if qwen_norm else 1.0)
    _write_head(model, mtp, folder, form)
    return model, mtp, folder


def _plain_gated_norms(model) -> None:
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith("linear_attn.norm.weight"):  # the gated DeltaNet norm is plain w
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=generator))


def _randomize_head(mtp, params: dict, seed: int, centre: float) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in params.items():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(centre + 0.2 * noise if p.ndim == 1 and "norm" in name else
                    0.2 * noise if p.ndim == 1 else noise * p.shape[-1] ** -0.5)
        for name, b in mtp.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.2 * torch.randn(b.shape, generator=generator))


def _write_head(model, mtp, folder, form: str) -> None:
    """The head's tensors into ``folder/mtp.safetensors`` under the checkpoint's names."""
    n = model.config.num_hidden_layers
    deeper = copy.deepcopy(model.config)
    deeper.num_hidden_layers = n + 1
    if getattr(deeper, "layer_types", None) is not None:
        deeper.layer_types = list(deeper.layer_types) + ["full_attention"]
    host = type(model)(deeper).eval()
    host.model.layers[n].load_state_dict(mtp.layers[0].mtp_block.state_dict())
    scratch = os.path.join(str(folder), "_host")
    host.save_pretrained(scratch)
    saved = load_file(os.path.join(scratch, "model.safetensors"))
    prefix, names = (f"model.layers.{n}.", DEEPSEEK_NAMES) if form == "deepseek" else ("mtp.", QWEN_NAMES)
    block = "" if form == "deepseek" else "layers.0."
    tensors = {prefix + block + key[len(f"model.layers.{n}."):]: value for key, value in saved.items()
               if key.startswith(f"model.layers.{n}.")}
    layer = mtp.layers[0]
    for part, checkpoint_name in names.items():
        tensors[prefix + checkpoint_name] = getattr(layer, part).weight.detach().float().numpy()
    save_file(tensors, os.path.join(str(folder), "mtp.safetensors"))
    for leftover in os.listdir(scratch):
        os.remove(os.path.join(scratch, leftover))
    os.rmdir(scratch)
    if form == "qwen":  # Qwen3-Next / 3.5 name the head's depth so
        path = os.path.join(str(folder), "config.json")
        with open(path) as f:
            data = json.load(f)
        data["mtp_num_hidden_layers"] = 1
        with open(path, "w") as f:
            json.dump(data, f, indent=2)


def hf_hidden(model, ids: np.ndarray) -> np.ndarray:
    """The decoder's last hidden states (the LM head's input), as ``MTPCandidateGenerator`` reads them."""
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), output_hidden_states=True)
    return out.hidden_states[-1].float().numpy()


def hf_head(mtp, ids: np.ndarray, hidden: np.ndarray, positions: np.ndarray) -> tuple:
    """transformers' MTP layer 0 over ``ids`` at ``positions`` with the decoder's ``hidden``:
    (logits, the post-normed hidden state the next draft step takes)."""
    with torch.no_grad():
        h = mtp.forward_layer(0, torch.from_numpy(hidden), torch.from_numpy(positions), None,
                              input_ids=torch.from_numpy(ids))
        logits = mtp._project_to_logits(h)
    return logits.float().numpy(), h.float().numpy()
