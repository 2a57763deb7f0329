"""Mistral-3 (Mistral-Small-3.1/3.2, Ministral with vision) from Hugging Face folders: its Pixtral
tower and projector (``frontends.dsl_pixtral``) beside a Mistral text model.

``vision_config`` (``pixtral``): ``hidden_size``, ``num_hidden_layers`` of
``num_attention_heads`` (``head_dim``), gated MLPs of ``intermediate_size`` with ``hidden_act``
(silu or gelu), ``patch_size``, RoPE ``rope_parameters.rope_theta`` (10,000); the hidden state
``vision_feature_layer`` (one index) through the projector: RMSNorm with the text model's
``rms_norm_eps``, the ``spatial_merge_size`` patch merger, ``linear_1``, ``projector_hidden_act``
(GELU), ``linear_2`` (biases with ``multimodal_projector_bias``). An image is resized by the
processor to whole merged blocks (``irc_cli.images_pixtral``); its rows of [IMG] tokens end in
[IMG_BREAK], the last in [IMG_END], and only the [IMG] rows take features. Weights: the tower
under ``model.vision_tower.`` / ``vision_tower.``, the projector under
``model.multi_modal_projector.`` / ``multi_modal_projector.``.
"""
from __future__ import annotations

from frontends.dsl import ArgError, Model
from frontends.dsl_pixtral import PixtralSpec, build_pixtral
from frontends.hf.config import Config
from frontends.hf.weights import Checkpoint, Tensor, attach_sources
from irc.graph import Graph
from irc.yamlloc import boolean, positive_int, positive_number, string

DEFAULTS = {"image_token_index": 10, "projector_hidden_act": "gelu", "vision_feature_layer": -1,
            "multimodal_projector_bias": False, "spatial_merge_size": 2, "tie_word_embeddings": True}
BREAKS = {"image_break": 12, "image_end": 13}  # Mistral's tekken ids of [IMG_BREAK] and [IMG_END]
TEXT_DEFAULTS = {"head_dim": 128, "hidden_size": 5120, "intermediate_size": 32768, "max_position_embeddings": 131072,
                 "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
                 "rope_theta": 1e9, "sliding_window": None, "vocab_size": 131072}
TOWER_DEFAULTS = {"model_type": "pixtral", "intermediate_size": 4096, "hidden_size": 1024, "patch_size": 14,
                  "image_size": 1540, "num_hidden_layers": 24, "num_attention_heads": 16, "head_dim": 64,
                  "hidden_act": "gelu", "num_channels": 3}
NAMES = ([("model.", "model.language_model."), ("lm_head.", "lm_head."), ("model.", "language_model.model."),
          ("lm_head.", "language_model.lm_head.")],
         [("tower.", "model.vision_tower."), ("tower.", "vision_tower."),
          ("projector.", "model.multi_modal_projector."), ("projector.", "multi_modal_projector.")], [])
_LAYER = {"attn_norm": "attention_norm.weight", "mlp_norm": "ffn_norm.weight",
          **{f"attn.w{x}": f"attention.{x}_proj.weight" for x in "qkvo"},
          **{f"mlp.w_{x}": f"feed_forward.{x}_proj.weight" for x in ("gate", "up", "down")}}
_TOP = {"patch_embed": "tower.patch_conv.weight", "pre_norm": "tower.ln_pre.weight",
        "projector.norm": "projector.norm.weight", "projector.merge": "projector.patch_merger.merging_layer.weight",
        **{f"projector.linear_{i}{b}": f"projector.linear_{i}.{'bias' if b else 'weight'}" for i in (1, 2)
           for b in ("", ".bias")}}


def build_tower(cfg: Config, tower: Config, name: str, d_text: int) -> Graph:
    """pixel_values [B, C, s·Y, s·X] -> Pixtral -> the projector -> image_features."""
    tower.defaults = TOWER_DEFAULTS
    if tower.get("model_type", string) != "pixtral":
        raise tower.unsupported("model_type", tower.get("model_type", string), hint="mistral3 vision towers: pixtral")
    act = tower.get("hidden_act", string)
    if act not in ("silu", "gelu"):
        raise tower.unsupported("hidden_act", act, hint="irc builds Pixtral's silu and gelu gated MLPs")
    if cfg.get("projector_hidden_act", string) != "gelu":
        raise cfg.unsupported("projector_hidden_act", cfg.get("projector_hidden_act", string),
                              hint="irc builds Mistral-3's GELU projector")
    layer = cfg.raw("vision_feature_layer")
    if not isinstance(layer, int) or isinstance(layer, bool):
        raise cfg.unsupported("vision_feature_layer", layer, hint="irc reads one hidden state")
    d = tower.get("hidden_size", positive_int)
    heads = tower.get("num_attention_heads", positive_int)
    if tower.get("head_dim", positive_int) * heads != d:
        raise tower.error("head_dim", f"{heads} heads of {tower.get('head_dim', positive_int)} are not hidden_size {d}")
    theta = float(tower.data.get("rope_theta", 10000.0))  # 4.x's key; transformers 5's rope_parameters
    rope = tower.data.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        theta = float(rope["rope_theta"])
    text_eps = (cfg.data.get("text_config") or {}).get("rms_norm_eps", TEXT_DEFAULTS["rms_norm_eps"])
    spec = PixtralSpec(layers=tower.get("num_hidden_layers", positive_int), width=d, heads=heads,
                       d_ff=tower.get("intermediate_size", positive_int), out=d_text,
                       patch=tower.get("patch_size", positive_int), merge=cfg.get("spatial_merge_size", positive_int),
                       channels=tower.get("num_channels", positive_int), act=act, theta=theta, layer=layer,
                       norm_eps=positive_number(text_eps), bias=cfg.get("multimodal_projector_bias", boolean),
                       reference_size=tower.get("image_size", positive_int))
    m = Model(f"{name}-vision", vocab=None, d_model=d, dtype=cfg.dtype(), encoder=True)
    with m.at(cfg.path):
        try:
            build_pixtral(m, spec)
        except ArgError as err:
            raise cfg.error({"layer": "vision_feature_layer"}.get(err.arg, err.arg), err.detail, hint=err.hint) from None
    graph = m.graph
    graph.meta["model_type"] = "pixtral"
    graph.meta["n_layers"] = spec.layers
    return graph


def _source(name: str, shape: tuple) -> Tensor:
    """The tower's or projector's tensor (in the view's names) behind a param."""
    if name.startswith("layers."):
        index, rest = name[len("layers."):].split(".", 1)
        return Tensor(f"tower.transformer.layers.{index}.{_LAYER[rest]}")
    if name == "patch_embed":  # the Conv2d [d, C, p, p], flattened
        from frontends.hf.vision import Reshaped
        return Reshaped(_TOP[name], shape)
    return Tensor(_TOP[name])


def attach_tower(vision: Graph, view: Checkpoint) -> None:
    """Every tower and projector param from its tensor (shapes checked); a tensor of either left
    over is an error, but for the tower's layers past the hidden state read."""
    built = sum(1 for name in vision.params if name.endswith(".attn_norm"))
    attach_sources(vision.params.values(), view, _source, what="the vision model",
                   spare=lambda n: n.startswith("tower.transformer.layers.") and int(n.split(".")[3]) >= built)


def image_prompt(image_token: int, tokens: dict, merge: int) -> dict:
    """How PixtralProcessor lays an image out: [IMG] x columns + [IMG_BREAK] per row, the last
    row's [IMG_BREAK] an [IMG_END] (``tokens``: their ids, read from the tokenizer at run time
    when not in config.json)."""
    return {"kind": "rows", "placeholder": image_token, "before": [], "after": [], "around": "", "merge": merge,
            **tokens}
