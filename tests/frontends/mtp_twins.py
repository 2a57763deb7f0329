"""Tiny random twins with a multi-token-prediction head, and transformers 5.25's own
``MtpModel`` (``modeling_layers``) as the reference for the head's logits.

transformers' ``save_pretrained`` writes the decoder alone (its causal LM has no MTP layer), so
the head's tensors are written here as the released checkpoints hold them: the block's names
come from the same class's model of the head's own config (``get_mtp_config``: its layer 0 saved
as transformers writes a layer, per-expert names included) moved to the block's prefix, the
head's own params (``enorm``, ``hnorm``, ``eh_proj``, the post norm) under the family's names
(``FORMS`` here, ``frontends.hf.mtp_forms.FORMS`` there)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file
from transformers.modeling_layers import MtpModel

from tests.frontends.test_hf_models import MLA, SMALL, built_once, randomize, save_twin, twin_seed

FC_NAMES = {"enorm": "mtp.pre_fc_norm_embedding.weight", "hnorm": "mtp.pre_fc_norm_hidden.weight",
            "eh_proj": "mtp.fc.weight", "post_norm": "mtp.norm.weight"}
FORMS = {  # form: (the block's prefix, the head's own params' names, the config.json key of the head's depth);
    # {n}: num_hidden_layers. A name the decoder's checkpoint holds already is the decoder's tensor (ERNIE's norm)
    "deepseek": ("model.layers.{n}.", {"enorm": "model.layers.{n}.enorm.weight", "hnorm": "model.layers.{n}.hnorm.weight",
                                      "eh_proj": "model.layers.{n}.eh_proj.weight",
                                      "post_norm": "model.layers.{n}.shared_head.norm.weight"},
                 "num_nextn_predict_layers"),
    "qwen": ("mtp.layers.0.", FC_NAMES, "mtp_num_hidden_layers"),
    "mellum": ("mtp.layers.0.", FC_NAMES, "num_nextn_predict_layers"),
    "ernie": ("model.mtp_block.0.", {"enorm": "model.mtp_emb_norm.0.weight", "hnorm": "model.mtp_hidden_norm.0.weight",
                                     "eh_proj": "model.mtp_linear_proj.0.weight", "post_norm": "model.norm.weight"},
              "num_nextn_predict_layers"),
}
QWEN = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, max_position_embeddings=64, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=8, linear_value_head_dim=6, num_hidden_layers=3,
            layer_types=["linear_attention", "linear_attention", "full_attention"])  # the last: MtpModel takes its norm class
EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
GQA_MOE = dict(SMALL, head_dim=8, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
CASES = {  # name: (config class, settings, form (FORMS)); each also gets num_mtp_layers=1
    "deepseek-v3": ("DeepseekV3Config", dict(SMALL, **MLA, q_lora_rank=16, n_routed_experts=4, num_experts_per_tok=2,
                                             n_group=2, topk_group=1, rope_interleave=True), "deepseek"),
    "glm4-moe": ("Glm4MoeConfig", dict(GQA_MOE, first_k_dense_replace=1, attention_bias=True,
                                       partial_rotary_factor=0.5), "deepseek"),
    "glm4-moe-lite": ("Glm4MoeLiteConfig", dict(SMALL, **MLA, q_lora_rank=16, n_routed_experts=4, num_experts_per_tok=2,
                                                n_group=2, topk_group=1, mtp_mlp_layer_types=["sparse"]), "deepseek"),
    "sarvam-mla": ("SarvamMLAConfig", dict(SMALL, **MLA, n_routed_experts=4, num_experts_per_tok=2), "deepseek"),
    "param2moe": ("Param2MoeConfig", dict(GQA_MOE, n_shared_experts=1, attention_bias=True, first_k_dense_replace=1,
                                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                           "partial_rotary_factor": 0.5}), "deepseek"),
    "sarvam-moe": ("SarvamMoEConfig", dict(GQA_MOE, n_group=2, topk_group=1, attention_bias=True), "deepseek"),
    "mellum": ("MellumConfig", dict(SMALL, num_hidden_layers=3, head_dim=8, sliding_window=4, num_experts=4,
                                    num_experts_per_tok=2, moe_intermediate_size=16,
                                    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                    mlp_layer_types=["dense", "sparse", "sparse"], rope_parameters={
                                        "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                                        "sliding_attention": {"rope_type": "linear", "rope_theta": 10000.0,
                                                              "factor": 2.0}}), "mellum"),
    "ernie4.5-moe-dense-block": ("Ernie4_5_MoeConfig", dict(SMALL, moe_num_experts=4, moe_k=2, moe_intermediate_size=16,
                                                            moe_num_shared_experts=1), "ernie"),
    "ernie4.5-moe-sparse-block": ("Ernie4_5_MoeConfig", dict(SMALL, moe_num_experts=4, moe_k=2,
                                                             moe_intermediate_size=16, moe_num_shared_experts=0,
                                                             moe_layer_start_index=0, tie_word_embeddings=False),
                                  "ernie"),
    "qwen3.5-moe": ("Qwen3_5MoeTextConfig", dict(QWEN, **EXPERTS, mtp_layer_types=["full_attention"]), "qwen"),
    "qwen3.5-dense": ("Qwen3_5TextConfig", dict(QWEN, mtp_layer_types=["full_attention"]), "qwen"),
    "qwen3-next": ("Qwen3NextConfig", dict(QWEN, **EXPERTS, mtp_layer_types=["full_attention"]), "qwen"),
}


@pytest.fixture(scope="module", name="twins")
def twins_fixture(tmp_path_factory):
    """name -> (transformers model, its MtpModel, folder), each built once per module."""
    return built_once(build_mtp_twin, tmp_path_factory)


def build_mtp_twin(name: str, folder):
    """(transformers model, its MtpModel, folder) for ``CASES[name]``."""
    class_name, settings, form = CASES[name]
    config = getattr(transformers, class_name)(**settings, num_mtp_layers=1)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    centre = 0.0 if form == "qwen" else 1.0  # Qwen3.5 norms are (1 + w)
    randomize(model, seed=twin_seed(name), norm_centre=centre)
    _plain_gated_norms(model)
    save_twin(model, folder)
    mtp = MtpModel(model, 1).eval()
    head = {n: p for n, p in mtp.named_parameters() if n.startswith("layers.")}  # not the shared embed / head
    _randomize_head(mtp, head, twin_seed(name + "-mtp"), centre)
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
    """The head's tensors into ``folder/mtp.safetensors`` under the checkpoint's names (``FORMS``):
    the block as transformers writes a layer 0 of the head's own config (per-expert names
    included), the head's own params; one the decoder's checkpoint holds is the decoder's, and
    the MtpModel takes it. Then config.json names the head's depth."""
    block, names, depth_key = FORMS[form]
    n = model.config.num_hidden_layers
    host = type(model)(mtp.config).eval()
    host.model.layers[0].load_state_dict(mtp.layers[0].mtp_block.state_dict())
    scratch = os.path.join(str(folder), "_host")
    host.save_pretrained(scratch)
    saved = load_file(os.path.join(scratch, "model.safetensors"))
    tensors = {block.format(n=n) + key[len("model.layers.0."):]: value for key, value in saved.items()
               if key.startswith("model.layers.0.")}
    decoder = load_file(os.path.join(str(folder), "model.safetensors"))
    layer = mtp.layers[0]
    for part, checkpoint_name in names.items():
        checkpoint_name = checkpoint_name.format(n=n)
        if checkpoint_name in decoder:
            with torch.no_grad():
                getattr(layer, part).weight.copy_(torch.from_numpy(decoder[checkpoint_name]))
        else:
            tensors[checkpoint_name] = getattr(layer, part).weight.detach().float().numpy()
    save_file(tensors, os.path.join(str(folder), "mtp.safetensors"))
    for leftover in os.listdir(scratch):
        os.remove(os.path.join(scratch, leftover))
    os.rmdir(scratch)
    path = os.path.join(str(folder), "config.json")
    with open(path) as f:
        data = json.load(f)
    data[depth_key] = 1
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
