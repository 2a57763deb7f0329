"""The text tower of a CLIP or SigLIP dual encoder, and how its embeddings meet the image's.

======  ======================================================================================
clip    token + learned position embeddings, pre-LayerNorm layers with causal attention (and the
        padding mask), quick_gelu MLPs, ``final_layer_norm``; the state at each row's first
        ``eos_token_id`` (transformers' legacy rule when that id is 2: at the row's largest id)
        through ``text_projection`` (no bias): ``text_embeds`` [N, projection_dim]
siglip  the same embeddings and layers with bidirectional attention and GELU (tanh) MLPs; the
        last position's state through ``head`` (with a bias). SigLIP 2's (``siglip2``) is this
        tower: transformers' ``Siglip2TextModel`` subclasses ``SiglipTextModel`` unchanged
======  ======================================================================================

The tower is ``graph.parts["text"]`` of the image tower's graph (``frontends.hf.vision``): it
takes ``input_ids`` and ``attention_mask`` [N, T] (a batch of its own) and returns
``text_embeds``. The checkpoint's ``logit_scale`` (and SigLIP's ``logit_bias``) are read when the
weights are, as ``meta["logit_scale"]`` = exp(logit_scale) and ``meta["logit_bias"]``:
``similarity`` makes transformers' ``logits_per_image`` from the two towers' embeddings. A row
without an eos token pools zeros (transformers reads its first token).
"""
from __future__ import annotations

import numpy as np

from frontends.dsl import Model
from frontends.hf.config import Config, NestedConfig
from frontends.hf.weights import Checkpoint, Tensor, attach_sources
from irc.errors import SpecError
from irc.graph import Graph
from irc.yamlloc import non_negative_int, positive_int, positive_number, string

TEXT_DEFAULTS = {  # transformers 5.25's CLIPTextConfig and SiglipTextConfig
    "clip": {"vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
             "num_attention_heads": 8, "max_position_embeddings": 77, "hidden_act": "quick_gelu",
             "layer_norm_eps": 1e-5, "eos_token_id": 49407, "projection_dim": 512},
    "siglip": {"vocab_size": 32000, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
               "num_attention_heads": 12, "max_position_embeddings": 64, "hidden_act": "gelu_pytorch_tanh",
               "layer_norm_eps": 1e-6},
}
TEXT_DEFAULTS["siglip2"] = TEXT_DEFAULTS["siglip"]  # Siglip2TextConfig is SiglipTextConfig
ACTIVATIONS = {"quick_gelu": "quick", "gelu_pytorch_tanh": "tanh", "gelu": "none"}
_LAYER = {**{f"attn.w{x}": f"self_attn.{x}_proj.weight" for x in "qkv"},
          **{f"attn.b{x}": f"self_attn.{x}_proj.bias" for x in "qkv"},
          "attn.wo": "self_attn.out_proj.weight", "attn.bo": "self_attn.out_proj.bias",
          "attn_norm": "layer_norm1.weight", "attn_norm.bias": "layer_norm1.bias",
          "mlp_norm": "layer_norm2.weight", "mlp_norm.bias": "layer_norm2.bias",
          "mlp.w_up": "mlp.fc1.weight", "mlp.b_up": "mlp.fc1.bias", "mlp.w_down": "mlp.fc2.weight",
          "mlp.b_down": "mlp.fc2.bias"}
_TOP = {"embed": "text_model.embeddings.token_embedding.weight",
        "embed_positions": "text_model.embeddings.position_embedding.weight",
        "final_norm": "text_model.final_layer_norm.weight", "final_norm.bias": "text_model.final_layer_norm.bias",
        "projection": "text_projection.weight", "head": "text_model.head.weight",
        "head.bias": "text_model.head.bias"}


def build_text_tower(cfg: Config, name: str) -> Graph:
    """The text tower of the dual encoder ``cfg`` describes (its ``text_config``)."""
    kind = cfg.data["model_type"]
    text = NestedConfig(cfg, "text_config", TEXT_DEFAULTS[kind], "the text tower's settings",
                        hint=f"a {kind} config holds its text tower's settings under text_config")
    act = text.get("hidden_act", string)
    if act not in ACTIVATIONS:
        raise text.unsupported("hidden_act", act, hint=f"activations: {', '.join(ACTIVATIONS)}")
    d, eps = text.get("hidden_size", positive_int), text.get("layer_norm_eps", positive_number)
    heads = text.get("num_attention_heads", positive_int)
    if d % heads:
        raise text.error("num_attention_heads", f"{heads} heads do not divide hidden_size {d}")
    m = Model(f"{name}-text", vocab=text.get("vocab_size", positive_int), d_model=d, dtype=cfg.dtype(), encoder=True)
    with m.at(cfg.path):
        ids = m.input_ids()
        x = m.embed_positions(m.embed(ids), text.get("max_position_embeddings", positive_int))
        d_ff = text.get("intermediate_size", positive_int)
        for layer in m.layers(text.get("num_hidden_layers", positive_int)):
            x = x + layer.attention(layer.layer_norm(x, eps=eps), heads=heads, qkv_bias=True, out_bias=True,
                                    causal=kind == "clip")
            h = layer.layer_norm(x, eps=eps)
            x = x + (layer.quick_gelu_mlp(h, d_ff) if ACTIVATIONS[act] == "quick" else
                     layer.gelu_mlp(h, d_ff, bias=True, approximate=ACTIVATIONS[act]))
        h = m.last_hidden_state(m.layer_norm(x, "final_norm", eps))
        if kind == "clip":
            eos = text.get("eos_token_id", non_negative_int)
            pooled = m.pick_token(h, ids, None if eos == 2 else eos)
            embeds = m.dense(pooled, cfg.get("projection_dim", positive_int), name="projection")
        else:
            pooled = m.pick_token(h, None, None)
            embeds = m.dense(pooled, text.get("projection_size", positive_int, d), bias=True, name="head")
        m.text_embeds(embeds)
    graph = m.graph
    graph.meta["model_type"] = f"{kind}_text_model"
    # how its processor pads a batch of texts (irc_cli.run_dual): SigLIP's to the whole length
    graph.meta["pad_token_id"] = text.data.get("pad_token_id", 1)
    graph.meta["pad_to"] = text.get("max_position_embeddings", positive_int) if kind != "clip" else None
    return graph


def attach_text_weights(text: Graph, checkpoint: Checkpoint, kind: str, meta: dict) -> None:
    """Every text tower param from its tensor (shapes checked); the logit scale (and bias)
    into ``meta``."""
    def source(name: str, shape: tuple) -> Tensor:
        if name.startswith("layers."):
            index, rest = name[len("layers."):].split(".", 1)
            return Tensor(f"text_model.encoder.layers.{index}.{_LAYER[rest]}")
        return Tensor(_TOP[name])

    tower = [n for n in checkpoint.files if n.startswith("text_model.") or n == "text_projection.weight"]
    attach_sources(text.params.values(), checkpoint, source, what="the text tower",
                   spare=lambda n: n not in tower)
    for key in ("logit_scale", "logit_bias") if kind != "clip" else ("logit_scale",):
        if key not in checkpoint.files:
            raise SpecError(f"the checkpoint has no tensor {key}", location=checkpoint.folder)
        value = float(np.asarray(checkpoint.read(key), np.float32).reshape(-1)[0])
        meta[key] = float(np.exp(np.float32(value))) if key == "logit_scale" else value


def similarity(image_embeds: np.ndarray, text_embeds: np.ndarray, scale: float, bias: float = 0.0) -> np.ndarray:
    """transformers' ``logits_per_image`` [images, texts]: both embeddings L2-normalised, their
    dot products times exp(logit_scale) (``scale``), plus SigLIP's logit_bias."""
    image = np.asarray(image_embeds, np.float32)
    text = np.asarray(text_embeds, np.float32)
    image = image / np.linalg.norm(image, axis=-1, keepdims=True)
    text = text / np.linalg.norm(text, axis=-1, keepdims=True)
    return (image @ text.T * np.float32(scale) + np.float32(bias)).astype(np.float32)
