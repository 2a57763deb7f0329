"""The YAML architecture form of an image encoder: ``model`` with a ``vision:`` section, built
through ``frontends.dsl_vision.build_vit`` (the same graph as the matching Hugging Face
folder: ``frontends.hf.vision``).

    model:
      name: clip-vit-large-patch14-336
      dtype: f16
      d_model: 1024
      n_layers: 24
      vision:
        image_size: 336               # required: square images of this many pixels
        patch_size: 14                # required (a remainder of pixels is dropped, as Conv2d does)
        channels: 3                   # [3]
        patch_bias: false             # the patch projection's bias [true]
        class_token: true             # a learned token first [true]
        registers: 0                  # DINOv2's register tokens after it [0]
        pre_norm: true                # a LayerNorm after the embeddings (CLIP) [false]
        layer_scale: false            # DINOv2's LayerScale on both branches [false]
        final_norm: false             # last_hidden_state normed [true]
        pooler: class_token_norm      # pooler_output: class_token | class_token_norm (CLIP) |
                                      # dense_tanh (ViT) | attention (SigLIP's head) | none
                                      # [class_token]
        pooler_width: null            # dense_tanh's output width [d_model]
      norm: {kind: layer, eps: 1.0e-5}          # LayerNorms with biases
      attention: {kind: mha, n_heads: 16, qkv_bias: true, out_bias: true}
      mlp: {kind: quick_gelu, d_ff: 4096}       # gelu (approximate none | tanh) or quick_gelu,
                                                # with biases

No vocabulary, no positions to give: the input is ``pixel_values`` [B, C, H, W]
(``frontends.dsl_vision``). A decoder's keys (vocab_size, layers, moe, a state-space
section, ...), attention without q/k/v or output biases, RoPE, windows and other MLP kinds
are errors naming the key.
"""
from __future__ import annotations

import json

from frontends.dsl_vision import POOLERS, PROJECTORS, Features, VisionSpec, build_image_features, build_vit
from frontends.yaml_attention import blame
from irc.graph import Graph
from irc.yamlloc import Bad, Fields, boolean, choice, layer_count, non_negative_int, optional, positive_int, \
    positive_number, string

VISION_KEYS = ("image_size", "patch_size", "channels", "patch_bias", "class_token", "registers", "pre_norm",
               "layer_scale", "final_norm", "pooler", "pooler_width")
MODEL_KEYS = ("name", "dtype", "d_model", "n_layers", "norm", "attention", "mlp", "vision")
ATTENTION_KEYS = ("kind", "n_heads", "qkv_bias", "out_bias")
NORM_KEYS = ("kind", "eps")
MLP_KEYS = ("kind", "d_ff", "approximate", "bias")
FEATURE_KEYS = ("layer", "drop_tokens", "post_norm", "pool_tokens", "pixel_shuffle", "projector", "projector_bias",
                "approximate")
IMAGE_INPUT_KEYS = ("token", "bidirectional", "vision_model")


def _always(fields: Fields, key: str, value) -> None:
    """``key`` may be left out, or written as ``value`` (the one form irc builds)."""
    if fields.has(key) and fields.data[key] != value:
        raise fields.error(key, f"a vision encoder's {key} is {json.dumps(value)} here",
                           hint="irc's image encoders are the ViT form (the module docstring)")


def build(model: Fields) -> Graph:
    """The image encoder ``model`` (with its ``vision`` section) describes."""
    m, spec, v, blamed = _read(model, MODEL_KEYS)
    with m.at(v.origin()), blame(v, blamed):
        build_vit(m, spec)
    return m.graph


def build_vision_model(model: Fields, width: int):
    """A VLM's vision model (``image_input.vision_model``: this form plus ``features``), its
    output ``image_features`` [B·tokens, width]: a ``frontends.dsl.Model``."""
    m, spec, v, blamed = _read(model, MODEL_KEYS + ("features",))
    f = model.sub("features", FEATURE_KEYS) or Fields({}, "features", FEATURE_KEYS, parent_loc=model.key_loc)
    features = Features(layers=f.get("layer", _layers, (-1,)), drop=f.get("drop_tokens", non_negative_int, 0),
                        post_norm=f.get("post_norm", boolean, False), pool=f.get("pool_tokens", optional(positive_int), None),
                        shuffle=f.get("pixel_shuffle", optional(positive_int), None),
                        projector=f.get("projector", choice(*PROJECTORS), "mlp"),
                        bias=f.get("projector_bias", boolean, True),
                        approximate=f.get("approximate", choice("none", "tanh"), "none"))
    with m.at(f.origin()), blame(f, {**blamed, "layers": (f, "layer"), "tokens": (f, "pool_tokens"),
                                     "scale": (f, "pixel_shuffle"), "count": (f, "drop_tokens")}):
        build_image_features(m, spec, features, width)
    return m


def _layers(value) -> tuple:
    """A hidden_states index (-1: the last) or a list of them, as a tuple."""
    values = value if isinstance(value, list) else [value]
    if not values or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise Bad(f"expected a hidden_states index or a list of them, got {value!r}")
    return tuple(values)


def _read(model: Fields, keys: tuple):
    """(the Model, its VisionSpec, the vision section, DSL argument -> its key) of ``model``."""
    from frontends.dsl import Model

    for key in model.data:
        if key not in keys:
            raise model.error(key, "does not apply to a vision encoder", hint=f"its keys: {', '.join(keys)}")
    v = model.sub("vision", VISION_KEYS, required=True)
    attention = model.sub("attention", ATTENTION_KEYS, required=True)
    _always(attention, "kind", "mha")
    for key in ("qkv_bias", "out_bias"):
        _always(attention, key, True)
    norm = model.sub("norm", NORM_KEYS) or Fields({}, "model.norm", NORM_KEYS, parent_loc=model.key_loc)
    _always(norm, "kind", "layer")
    mlp = model.sub("mlp", MLP_KEYS, required=True)
    kind = mlp.get("kind", choice("gelu", "quick_gelu"))
    _always(mlp, "bias", True)
    if kind == "quick_gelu" and mlp.has("approximate"):
        raise mlp.error("approximate", "applies to kind gelu only")
    d = model.get("d_model", positive_int)
    spec = VisionSpec(
        image_size=v.get("image_size", positive_int), patch=v.get("patch_size", positive_int),
        layers=model.get("n_layers", layer_count), heads=attention.get("n_heads", positive_int),
        d_ff=mlp.get("d_ff", positive_int), eps=norm.get("eps", positive_number, 1e-5),
        activation="quick" if kind == "quick_gelu" else mlp.get("approximate", choice("none", "tanh"), "none"),
        channels=v.get("channels", positive_int, 3), patch_bias=v.get("patch_bias", boolean, True),
        class_token=v.get("class_token", boolean, True), registers=v.get("registers", non_negative_int, 0),
        pre_norm=v.get("pre_norm", boolean, False), layer_scale=v.get("layer_scale", boolean, False),
        final_norm=v.get("final_norm", boolean, True), pooler=v.get("pooler", choice(*POOLERS), "class_token"),
        pooler_width=v.get("pooler_width", optional(positive_int), None))
    if spec.pooler_width is not None and spec.pooler != "dense_tanh":
        raise v.error("pooler_width", "applies to pooler dense_tanh only")
    m = Model(model.get("name", string), vocab=None, d_model=d,
              dtype=model.get("dtype", choice("f32", "bf16", "f16"), "f32"), encoder=True)
    return m, spec, v, {"patch": (v, "patch_size"), "heads": (attention, "n_heads"), "d_model": (model, "d_model"),
                        "n": (model, "n_layers")}
