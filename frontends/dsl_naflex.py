"""SigLIP 2's NaFlex vision tower in the DSL: each image at about its own aspect ratio, as a
padded row of flattened patches, the learned position grid resized to it.

    spec = VisionSpec(image_size=16, patch=4, layers=2, heads=4, d_ff=48, eps=1e-6, activation="tanh",
                      class_token=False, pooler="attention")
    m = Model("tiny-naflex", vocab=None, d_model=32, encoder=True)
    build_naflex(m, spec)      # last_hidden_state [B, L, 32], pooler_output [B, 32]

The graph takes what SigLIP 2's processor gives (``irc_cli.images_siglip2``): ``pixel_values``
f32 [B, L, p·p·C] (each image's h x w patches row by row, each patch its pixels row by row with
the channels innermost, then zero rows up to L), ``pixel_attention_mask`` i64 [B, L] (1 for the
image's h·w patches) and ``spatial_shapes`` i64 [B, 2] (h, w). L, the processor's
``max_num_patches``, is a symbol: one graph takes any; ``irc show`` counts one image of the
grid's own S x S patches.

The patches are projected by ``@patch_embed`` [d, p·p·C] (with ``@patch_embed.bias``:
transformers' ``nn.Linear``); the learned positions ``@position_embeddings`` [S², d]
(S = image_size / patch; as float32, like every param the activations meet outside a linear)
are resized to each image's h x w and added (``resize_positions``: antialiased bilinear; the
padding rows take position 0). The layers are ``vit_layers``, their
attention over the image's patches only (the mask is the model's attention mask: padding patches
are never keys, as transformers' bidirectional mask has it); ``@norm`` (post_layernorm) gives
``last_hidden_state`` (padding rows included, as transformers returns them), and with
``pooler: attention`` the pooling head reads the image's patches only (``attention_pool``'s mask).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from frontends.dsl_vision import ACTIVATIONS, VisionSpec, vit_layers
from irc.dtypes import DType

if TYPE_CHECKING:
    from frontends.dsl import Model, Tensor

PIXELS, MASK, SHAPES = "pixel_values", "pixel_attention_mask", "spatial_shapes"
LENGTH = "L"  # patches per image row of the batch (the processor's max_num_patches)


def _refuse(m: "Model", spec: VisionSpec) -> int:
    """The position grid's side S, or an error naming the setting NaFlex does not have."""
    for flag, wanted in (("class_token", False), ("registers", 0), ("pre_norm", False), ("layer_scale", False),
                         ("final_norm", True)):
        if getattr(spec, flag) != wanted:
            raise m.error(flag, f"SigLIP 2's NaFlex tower has {flag} {wanted!r}, got {getattr(spec, flag)!r}")
    if spec.pooler not in ("attention", "none"):
        raise m.error("pooler", f"expected attention or none, got {spec.pooler!r}")
    if spec.activation not in ACTIVATIONS:
        raise m.error("activation", f"expected one of {', '.join(ACTIVATIONS)}, got {spec.activation!r}")
    side = spec.image_size // spec.patch
    if side < 1 or side * spec.patch != spec.image_size:
        raise m.error("image_size", f"{spec.image_size} is not a whole number of {spec.patch}-pixel patches")
    if m.meta.get("vision") is not None or m._mask is not None:
        raise m.error("spec", "the model's inputs are already declared")
    return side


def build_naflex(m: "Model", spec: VisionSpec) -> Optional["Tensor"]:
    """The tower ``spec`` describes, built into ``m`` (``Model(vocab=None, encoder=True)``);
    returns ``pooler_output`` (None without the pooling head)."""
    from frontends.dsl import Tensor

    side = _refuse(m, spec)
    d, width, graph = m.d_model, spec.channels * spec.patch * spec.patch, m._graph
    pixels = Tensor(m, graph.add_input(PIXELS, DType.f32, ("B", LENGTH, width)))
    mask = Tensor(m, graph.add_input(MASK, DType.i64, ("B", LENGTH)))
    shapes = Tensor(m, graph.add_input(SHAPES, DType.i64, ("B", 2)))
    m.meta.pop("vocab_size", None)  # no vocabulary
    bias = m.param("patch_embed.bias", (d,)) if spec.patch_bias else None
    x = m.emit("linear", [pixels, m.param("patch_embed", (d, width)), bias], None, "patches")[0]
    table = m._added_param("position_embeddings", (side * side, d))  # float32, as the activations
    x = m.add(x, m.emit("resize_positions", [table, shapes, pixels], {"side": side}, "positions")[0], "embeddings")
    m._mask = mask.value  # every attention built now reads it (Model._context)
    x = vit_layers(m, x, spec)[-1]
    # declared after the layers: a vision encoder's attention reads no mask (Model._context)
    m.meta["vision"] = {"channels": spec.channels, "image_size": [spec.image_size] * 2, "patch": spec.patch,
                        "patches": side * side, "tokens": side * side, "bindings": {LENGTH: side * side}}
    h = m.last_hidden_state(m.layer_norm(x, "norm", spec.eps))
    if spec.pooler == "none":
        return None
    return m.pooler_output(m.attention_pool(h, spec.heads, spec.d_ff, spec.eps, mask=mask))
