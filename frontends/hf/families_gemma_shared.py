"""What Gemma-3n's and Gemma-4's config readers share (``frontends.hf.families_gemma3n`` and
``frontends.hf.families_gemma4`` use these; Llama-4's multimodal reader takes ``text_model``
too): the text model inside a multimodal config, the
GeGLU's GELU form, and the layer each KV-shared layer takes its keys and values from. Each
raises a ``SpecError`` naming config.json and the key."""
from __future__ import annotations

from typing import Optional

from frontends.hf.config import Config, NestedConfig
from irc.yamlloc import non_negative_int, string

GELU = {"gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu": "none"}  # hidden_activation -> approximate
# the multimodal checkpoints' towers, which irc leaves aside (LAYOUTS' ``_spare``)
TOWERS = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.")


def text_model(outer: Config, model_type: str, defaults: dict, text: str, family: str) -> Config:
    """The text model's settings of the multimodal ``model_type``'s config (``text_config``,
    read with the text model's ``defaults``; its ``model_type`` must be ``text`` where given)."""
    if not isinstance(outer.data.get("text_config"), dict):
        raise outer.error("text_config", "expected the text model's settings (an object)",
                          hint=f"irc compiles the text model of a multimodal {family} checkpoint")
    cfg = NestedConfig(outer, "text_config", defaults, "the text model's settings",
                       hint=f"irc compiles the text model of a multimodal {family} checkpoint")
    inner = cfg.get("model_type", string, text)
    if inner != text:
        raise cfg.unsupported("model_type", inner, hint=f"{model_type} holds a {text} model")
    return cfg


def gelu_approximate(cfg: Config, family: str) -> str:
    """``hidden_activation`` as the ``approximate`` of GELU ("tanh" or "none")."""
    activation = cfg.raw("hidden_activation")
    if activation not in GELU:
        raise cfg.unsupported("hidden_activation", activation,
                              hint=f"{family}'s MLP is GeGLU: gelu_pytorch_tanh or gelu")
    return GELU[activation]


def kv_sources(cfg: Config, types: list[str]) -> list[Optional[int]]:
    """Per layer the earlier layer whose keys and values it attends over (None: it computes its
    own), as transformers' Gemma-3n and Gemma-4 choose it: the last ``num_kv_shared_layers``
    layers share, each with the last layer of its own type before them."""
    n = len(types)
    shared = cfg.get("num_kv_shared_layers", non_negative_int)
    if shared >= n and shared:
        raise cfg.error("num_kv_shared_layers", f"{shared} shared layers of {n}: no layer computes the keys and "
                                                "values they would share")
    first = n - shared
    sources: list[Optional[int]] = [None] * first
    for i in range(first, n):
        producers = [j for j in range(first) if types[j] == types[i]]
        if not producers:
            raise cfg.error("num_kv_shared_layers", f"layer {i} ({types[i]}) shares the keys and values of an "
                                                    f"earlier {types[i]} layer, and the first {first} layers have "
                                                    "none (layer_types)", hint="transformers refuses this too")
        sources.append(producers[-1])
    return sources
