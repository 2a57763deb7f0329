"""Llama-3.2-Vision (``mllama``) from Hugging Face folders: a tiled vision tower and a Llama
decoder with gated cross-attention layers (the seeds' Flamingo bridge).

=================  ===================================================================================
``vision_config``  ``mllama_vision_model``: ``hidden_size`` wide, ``num_hidden_layers`` local and
                   ``num_global_layers`` gated layers of ``attention_heads``, GELU MLPs
                   (``intermediate_size``, ``hidden_act`` gelu), tiles of ``image_size`` pixels in
                   ``patch_size`` patches, up to ``max_num_tiles`` per image, one tile embedding
                   per ``supported_aspect_ratios`` arrangement, the outputs of
                   ``intermediate_layers_indices`` kept (``vision_output_dim`` = width x (1 + their
                   count)): ``frontends.dsl_mllama``; the projector ``multi_modal_projector``
                   (a linear with a bias) to the text model's width
``text_config``    ``mllama_text_model``: a Llama decoder (RoPE with ``rope_parameters``, llama3
                   scaling in the checkpoints) whose ``cross_attention_layers`` are gated
                   cross-attention layers over the image states (``frontends.dsl_cross``), the
                   token table ``vocab_size`` + 8 rows (the LM head ``vocab_size``)
=================  ===================================================================================

The decoder takes ``image_features`` [B, I, d] (the vision model's rows of a step's images,
I = 0 without one) and ``cross_attention_mask`` [B, T, V+I] beside the usual inputs; each cross
layer's image keys are a cache of their own (``past_key_values.{i}.*``, [B, K, V, D]). The
prompt keeps ``<|image|>`` (``image_token_index``) as one token per image; the processor's
mask says which images each token sees (``irc_cli.images_mllama``). Weights: transformers 5's
``model.language_model.`` / ``model.vision_model.`` / ``model.multi_modal_projector.`` /
``lm_head.``, or 4.x's ``language_model.model.`` / ``language_model.lm_head.`` /
``vision_model.`` / ``multi_modal_projector.``.
"""
from __future__ import annotations

import functools
import os

from frontends.dsl import ArgError, Model
from frontends.dsl_cross import cross_block, cross_inputs
from frontends.dsl_mllama import MllamaVisionSpec, build_mllama_vision
from frontends.hf.build import _attention, _mlp, attach_weights, build_graph
from frontends.hf.config import Config, NestedConfig, int_list
from frontends.hf.families import checkpoint_source, describe
from frontends.hf.generation import generation_meta
from frontends.hf.weights import Checkpoint, PrefixView, Tensor, attach_sources
from irc.graph import Graph
from irc.yamlloc import Bad, boolean, non_negative_int, positive_int, positive_number, string

EXTRA_ROWS = 8  # the token table's rows past the vocabulary (MllamaTextModel's embed_tokens)
RATIOS = [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]]
DEFAULTS = {"image_token_index": 128256, "tie_word_embeddings": False}  # transformers 5.25's MllamaConfig
TOWER_DEFAULTS = {"model_type": "mllama_vision_model", "hidden_size": 1280, "hidden_act": "gelu",
                  "num_hidden_layers": 32, "num_global_layers": 8, "attention_heads": 16, "num_channels": 3,
                  "intermediate_size": 5120, "vision_output_dim": 7680, "image_size": 448, "patch_size": 14,
                  "norm_eps": 1e-5, "max_num_tiles": 4, "intermediate_layers_indices": [3, 7, 15, 23, 30],
                  "supported_aspect_ratios": RATIOS}
TEXT_DEFAULTS = {"model_type": "mllama_text_model", "vocab_size": 128256, "hidden_size": 4096, "hidden_act": "silu",
                 "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "intermediate_size": 14336, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
                 "tie_word_embeddings": False, "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38],
                 "rope_theta": 500000.0}
TEXT_NAMES = [("model.", "model.language_model."), ("lm_head.", "lm_head."), ("model.", "language_model.model."),
              ("lm_head.", "language_model.lm_head.")]
TOWER_NAMES = [("", "model.vision_model."), ("", "vision_model."), ("projector.", "model.multi_modal_projector."),
               ("projector.", "multi_modal_projector.")]
_RAW = ("class_embedding", "gated_positional_embedding.embedding")  # nn.Parameters: stored under their own names


def tower_spec(tower: Config, d_text: int) -> MllamaVisionSpec:
    """The tower ``vision_config`` describes (transformers' defaults for missing keys)."""
    tower.defaults = TOWER_DEFAULTS
    kind = tower.get("model_type", string)
    if kind != "mllama_vision_model":
        raise tower.unsupported("model_type", kind, hint="mllama's tower is mllama_vision_model")
    if tower.get("hidden_act", string) != "gelu":
        raise tower.unsupported("hidden_act", tower.get("hidden_act", string), hint="Mllama's tower MLPs are GELU")
    heads_key = "attention_heads" if tower.has("attention_heads") or not tower.has("num_attention_heads") else \
        "num_attention_heads"
    image, patch = (tower.get(k, _square) for k in ("image_size", "patch_size"))
    ratios = tower.get("supported_aspect_ratios", _ratios)
    tiles = tower.get("max_num_tiles", positive_int)
    if any(w * h > tiles for w, h in ratios):
        raise tower.error("supported_aspect_ratios", f"{ratios} holds an arrangement of more than max_num_tiles "
                                                     f"({tiles}) tiles")
    spec = MllamaVisionSpec(width=tower.get("hidden_size", positive_int), layers=tower.get("num_hidden_layers", positive_int),
                            global_layers=tower.get("num_global_layers", positive_int),
                            heads=tower.get(heads_key, positive_int), d_ff=tower.get("intermediate_size", positive_int),
                            image=image, patch=patch, tiles=tiles, ratios=len(ratios),
                            intermediate=tuple(tower.get("intermediate_layers_indices", int_list)), out=d_text,
                            channels=tower.get("num_channels", positive_int), eps=tower.get("norm_eps", positive_number))
    out = tower.get("vision_output_dim", positive_int)
    if out != spec.width * (1 + len(spec.intermediate)):
        raise tower.error("vision_output_dim", f"{out} is not hidden_size x (1 + the "
                                               f"{len(spec.intermediate)} intermediate layers)")
    return spec


def _square(value) -> int:
    """An int, or a [h, w] pair of equal ints (image_size / patch_size)."""
    if isinstance(value, list) and len(value) == 2 and value[0] == value[1]:
        value = value[0]
    return positive_int(value)


def _ratios(value) -> list:
    if not isinstance(value, list) or not value or any(
            not isinstance(r, list) or len(r) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0
                                                          for v in r) for r in value):
        raise Bad(f"expected [rows, columns] pairs of tiles, got {value!r}")
    return value


# DSL argument -> the vision_config key behind it
ARGS = {"intermediate": "intermediate_layers_indices", "heads": "attention_heads", "patch": "patch_size"}


def build_tower(spec: MllamaVisionSpec, tower: Config, name: str, dtype: str) -> Graph:
    """The vision model of ``spec``; a DSL refusal names ``tower``'s key behind the argument."""
    m = Model(f"{name}-vision", vocab=None, d_model=spec.width, dtype=dtype, encoder=True)
    with m.at(tower.path):
        try:
            build_mllama_vision(m, spec)
        except ArgError as err:
            raise tower.error(ARGS.get(err.arg, err.arg), err.detail, hint=err.hint) from None
    graph = m.graph
    graph.meta["model_type"] = "mllama_vision_model"
    return graph


def _tower_source(name: str, shape: tuple) -> Tensor:
    stored = name if name.endswith((".weight", ".bias", "gate", "gate_attn", "gate_ffn")) or name in _RAW \
        else name + ".weight"
    return Tensor(stored)


def expand(arch, origin: str, cross: tuple) -> Graph:
    """The text decoder: ``arch``'s Llama layers, the ``cross`` ones gated cross-attention."""
    m = Model(arch.name, vocab=arch.vocab_size, d_model=arch.d_model, dtype=arch.dtype)
    eps, a = arch.norm_eps, arch.attention
    with m.at(origin):
        x = m.embed(m.input_ids(), rows=arch.vocab_size + EXTRA_ROWS)
        image = cross_inputs(m, arch.d_model)
        for layer, spec in zip(m.layers(arch.n_layers), arch.layers):
            if layer.index in cross:
                m._kinds[layer.index] = ["cross_attention"]
                x = cross_block(m, layer, x, image, a.heads, a.kv_heads, a.head_dim, eps, arch.mlp["d_ff"])
                continue
            x = x + _attention(arch, layer, spec, layer.rms_norm(x, "attn_norm", eps))
            x = x + _mlp(arch, layer, layer.rms_norm(x, "mlp_norm", eps))
        m.logits(m.rms_norm(x, "norm", eps), tied=arch.tied)
    return m.graph


def _text(cfg: Config, name: str):
    text = NestedConfig(cfg, "text_config", TEXT_DEFAULTS, "the text model's settings",
                        hint="an mllama config holds its text model's settings under text_config")
    kind = text.get("model_type", string)
    if kind != "mllama_text_model":
        raise text.unsupported("model_type", kind, hint="mllama's text model is mllama_text_model")
    layers = text.get("num_hidden_layers", positive_int)
    cross = tuple(text.get("cross_attention_layers", int_list))
    if len(set(cross)) != len(cross) or any(not 0 <= i < layers for i in cross):
        raise text.error("cross_attention_layers", f"{list(cross)} are not distinct layers of the {layers}-layer "
                                                   "text model")
    text.data = {k: v for k, v in {**TEXT_DEFAULTS, **text.data, "model_type": "llama"}.items()
                 if k not in ("cross_attention_layers", "dropout")}
    arch = describe(text, name)
    arch.expand = functools.partial(expand, cross=cross)
    arch.checkpoint = "mllama"
    arch.tied = cfg.get("tie_word_embeddings", boolean) or text.get("tie_word_embeddings", boolean)
    if not any(key in text.data for key in ("dtype", "torch_dtype")):
        arch.dtype = cfg.dtype()
    return arch, text


def load(folder: str, cfg: Config, weights: bool) -> Graph:
    """The decoder of ``folder``'s Llama-3.2-Vision, its vision model as ``graph.parts["vision"]``."""
    cfg.defaults = DEFAULTS
    name = os.path.basename(os.path.normpath(os.path.abspath(folder))) or "model"
    arch, text = _text(cfg, name)
    token = cfg.get("image_token_index" if cfg.has("image_token_index") or not cfg.has("image_token_id")
                    else "image_token_id", non_negative_int)
    if token >= arch.vocab_size + EXTRA_ROWS:
        raise cfg.error("image_token_index", f"{token} is outside the token table ({arch.vocab_size + EXTRA_ROWS} "
                                             "rows)")
    tower = NestedConfig(cfg, "vision_config", {}, "the vision tower's settings")
    spec = tower_spec(tower, arch.d_model)
    checkpoint = Checkpoint.find(folder) if weights else None
    if checkpoint is not None:
        if cfg.has("quantization_config"):
            raise cfg.error("quantization_config", "quantized checkpoints are not supported")
        arch.dtype = str(PrefixView(checkpoint, TEXT_NAMES).dtype(checkpoint_source(arch, "embed").names()[0]))
    vision = build_tower(spec, tower, name, arch.dtype)
    graph = build_graph(arch, text)
    graph.meta.update(generation_meta(folder, cfg.data))
    graph.meta.update(model_type="mllama", image_token_id=token,
                      image_prompt={"kind": "cross", "placeholder": token, "before": [], "after": [], "around": ""})
    graph.meta["cross_attention"] = {"image_tokens": vision.meta["vision"]["tokens"]}
    if checkpoint is not None:
        attach_weights(graph, arch, PrefixView(checkpoint, TEXT_NAMES))
        attach_sources(list(vision.params.values()), PrefixView(checkpoint, TOWER_NAMES), _tower_source,
                       what="the vision model")
    graph.parts["vision"] = vision
    return graph


__all__ = ["DEFAULTS", "TOWER_DEFAULTS", "TEXT_DEFAULTS", "expand", "load", "tower_spec"]
