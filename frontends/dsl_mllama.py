"""Llama-3.2-Vision's tiled vision tower in the DSL (transformers' ``MllamaVisionModel``), as
primitives every target lowers.

    spec = MllamaVisionSpec(width=32, layers=4, global_layers=2, heads=4, d_ff=64, image=16,
                            patch=4, tiles=4, ratios=8, intermediate=(1, 3), out=48)
    m = Model("tiny-mllama-vision", vocab=None, d_model=32, encoder=True)
    build_mllama_vision(m, spec)        # image_features [N, tiles·(patches + 1), 48]

Inputs (the processor's: ``irc_cli.images_mllama``): ``pixel_values`` f32 [N, tiles, C, S, S]
(N images, each cut into up to ``tiles`` tiles of S x S pixels, unused tiles zero),
``aspect_ratio_ids`` i64 [N] (1 + the index of the image's tile arrangement in the supported
ratios; 0 for none) and ``aspect_ratio_mask`` i64 [N, tiles] (1 for a used tile).

Per image, as transformers computes it:

    x = patches(tiles) + tanh(pre_tile.gate) · pre_tile.embedding[ratio]          [tiles, Q, d]
    x = [class_embedding; x] + (1 - tanh(g)) · positions + tanh(g) · tile_positions[ratio]
    x = layernorm_pre(x), each tile padded with zero tokens to L, a multiple of 8
    x = transformer(x) over all tiles' tokens at once (tiles·L of them), the outputs of the
        ``intermediate`` layers kept
    x = layernorm_post(x) + tanh(post_tile.gate) · post_tile.embedding[ratio]
    x = global_transformer(x)   (its layers gate attention and MLP by tanh(gate_attn / gate_ffn))
    features = projector([x, the kept outputs interleaved]) without the padding tokens

Attention masks a pair of tokens only when both are padding (a pad token of a tile, or any
token of an unused tile): transformers' ``_prepare_aspect_ratio_attention_mask`` forms the mask
as m mᵀ. The feature columns are transformers' too: the final state's d, then the kept
outputs stacked on a last axis and flattened (column c·k + j is layer j's feature c).
Params carry the checkpoint's names under ``vision_model.`` (``frontends.hf.vlm_mllama``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from frontends.dsl_args import positive
from frontends.dsl_cross import gate_tanh
from irc import dims
from irc.dtypes import DType
from irc.ops.vision import FEATURES

if TYPE_CHECKING:
    from frontends.dsl import Model, Tensor

PIXELS, RATIO_IDS, RATIO_MASK = "pixel_values", "aspect_ratio_ids", "aspect_ratio_mask"
IMAGES = "N"
LOWEST = float(np.finfo(np.float32).min)


@dataclass
class MllamaVisionSpec:
    """A tiled tower: ``width`` features, ``layers`` local and ``global_layers`` gated layers
    of ``heads``, MLP ``d_ff`` (GELU), tiles of ``image`` pixels in ``patch`` patches, up to
    ``tiles`` tiles per image and ``ratios`` tile arrangements; the outputs of the
    ``intermediate`` local layers kept; projected to ``out`` (the text model's width)."""
    width: int
    layers: int
    global_layers: int
    heads: int
    d_ff: int
    image: int
    patch: int
    tiles: int
    ratios: int
    intermediate: tuple
    out: int
    channels: int = 3
    eps: float = 1e-5

    @property
    def tokens(self) -> int:
        """Tokens per tile: the patches and the class token."""
        return (self.image // self.patch) ** 2 + 1


def build_mllama_vision(m: "Model", spec: MllamaVisionSpec) -> "Tensor":
    """The tower ``spec`` describes, into ``m`` (``Model(vocab=None, encoder=True)``); returns
    ``image_features`` [N, tiles·tokens, out]."""
    from frontends.dsl import Tensor
    where = m.origin()
    for arg in ("width", "layers", "global_layers", "heads", "d_ff", "image", "patch", "tiles", "ratios", "out"):
        positive(arg, getattr(spec, arg), where)
    if spec.width % spec.heads or spec.image % spec.patch:
        raise m.error("heads" if spec.width % spec.heads else "patch",
                      f"{spec.width} features in {spec.heads} heads, {spec.image}-px tiles in {spec.patch}-px patches")
    if len(set(spec.intermediate)) != len(spec.intermediate) or any(
            not 0 <= i < spec.layers for i in spec.intermediate):
        raise m.error("intermediate", f"{list(spec.intermediate)} are not distinct layers of the {spec.layers}-layer "
                                      "tower")
    if m.meta.get("vision") is not None:
        raise m.error("spec", "the image input is already declared")
    g, d, tiles, tokens = m._graph, spec.width, spec.tiles, spec.tokens
    patches, length = tokens - 1, tokens + (8 - tokens % 8) % 8
    pixels = Tensor(m, g.add_input(PIXELS, DType.f32, (IMAGES, tiles, spec.channels, spec.image, spec.image)))
    ratio = Tensor(m, g.add_input(RATIO_IDS, DType.i64, (IMAGES,)))
    used = Tensor(m, g.add_input(RATIO_MASK, DType.i64, (IMAGES, tiles)))
    m.meta["vision"] = {"channels": spec.channels, "image_size": [spec.image] * 2, "patch": spec.patch,
                        "patches": patches, "tokens": tiles * tokens, "tiles": tiles, "bindings": {IMAGES: 1}}
    m.meta.pop("vocab_size", None)
    flat = m.emit("reshape", [pixels], {"shape": [dims.mul(tiles, IMAGES), spec.channels, spec.image, spec.image]},
                  "tile_pixels")[0]
    x = m.emit("patch_embed", [flat, m.param("patch_embedding.weight", (d, spec.channels, spec.patch, spec.patch))],
               {"patch": spec.patch}, "patches")[0]
    x = _reshape(m, x, [IMAGES, tiles, patches, d], "tile_patches")
    x = x + _tile_embedding(m, ratio, spec, "pre_tile_positional_embedding", 1)
    cls = _reshape(m, m._added_param("class_embedding", (d,)), [1, 1, 1, d], "class_token")
    cls = m.emit("expand", [cls], {"shape": [IMAGES, tiles, 1, d]}, "class_tokens")[0]
    x = m.emit("concat", [cls, x], {"axis": 2}, "tile_tokens")[0]
    x = _positions(m, x, ratio, spec)
    x = m.norm(x, "layernorm_pre", "layer", 1e-5)
    if length > tokens:
        zero = m.emit("constant", [], {"value": 0.0}, "pad_zero")[0]
        pad = m.emit("expand", [zero], {"shape": [IMAGES, tiles, length - tokens, d]}, "pad_tokens")[0]
        x = m.emit("concat", [x, pad], {"axis": 2}, "tiles_padded")[0]
    sequence = [IMAGES, tiles * length, d]
    x = _reshape(m, x, sequence, "image_tokens")
    bias = _pair_mask(m, used, spec, length)
    kept = {}
    for i in range(spec.layers):
        x = _layer(m, x, bias, spec, f"transformer.layers.{i}.", gated=False)
        if i in spec.intermediate:
            kept[i] = x
    x = m.norm(x, "layernorm_post", "layer", 1e-5)
    x = _reshape(m, x, [IMAGES, tiles, length, d], "post_tiles")
    x = x + _tile_embedding(m, ratio, spec, "post_tile_positional_embedding", 1)
    x = _reshape(m, x, sequence, "global_tokens")
    for i in range(spec.global_layers):
        x = _layer(m, x, bias, spec, f"global_transformer.layers.{i}.", gated=True)
    levels = []
    for i in spec.intermediate:  # each a last axis of its own, then flattened: transformers' stack(dim=-1)
        unpadded = _unpad(m, kept[i], spec, length, tokens, f"kept_{i}")
        levels.append(_reshape(m, unpadded, [IMAGES, tiles, tokens, d, 1], f"kept_{i}_column"))
    stacked = m.emit("concat", levels, {"axis": -1}, "kept_stacked")[0] if len(levels) > 1 else levels[0]
    stacked = _reshape(m, stacked, [IMAGES, tiles, tokens, d * len(levels)], "kept_features")
    final = _unpad(m, x, spec, length, tokens, "final")
    joined = m.emit("concat", [final, stacked], {"axis": -1}, "vision_output")[0]
    width = d * (1 + len(spec.intermediate))
    proj = m.emit("linear", [joined, m.param("projector.weight", (spec.out, width)),
                             m.param("projector.bias", (spec.out,))], None, "projected")[0]
    features = _reshape(m, proj, [IMAGES, tiles * tokens, spec.out], FEATURES)
    g.outputs.append(features.value)
    return features


def _reshape(m: "Model", x, shape: list, name: str) -> "Tensor":
    return m.emit("reshape", [x], {"shape": shape}, name)[0]


def _gated(m: "Model", x: "Tensor", gate: str, name: str) -> "Tensor":
    return m.emit("mul", [x, gate_tanh(m, gate)], None, name)[0]


def _per_ratio(m: "Model", ratio: "Tensor", spec: MllamaVisionSpec, table: str, rows: int) -> "Tensor":
    """``@{table}``'s row for each image's tile arrangement, as float32 [N, tiles, rows, d]."""
    weights = m.param(table, (spec.ratios + 1, spec.tiles * rows * spec.width))
    picked = m.emit("embedding", [ratio, weights], None, f"{table}_rows")[0]
    if picked.dtype != DType.f32:  # a bf16 checkpoint's rows meet float32 activations
        picked = m.emit("cast", [picked], {"to": "f32"}, f"{table}_rows_f32")[0]
    return _reshape(m, picked, [IMAGES, spec.tiles, rows, spec.width], f"{table}_tiles")


def _tile_embedding(m: "Model", ratio: "Tensor", spec: MllamaVisionSpec, name: str, rows: int) -> "Tensor":
    """tanh(gate) · ``{name}.embedding``[ratio] as [N, tiles, rows, d] (rows 1: one per tile)."""
    return _gated(m, _per_ratio(m, ratio, spec, f"{name}.embedding.weight", rows), f"{name}.gate", f"{name}_gated")


def _positions(m: "Model", x: "Tensor", ratio: "Tensor", spec: MllamaVisionSpec) -> "Tensor":
    """x + (1 - tanh(g)) · positions + tanh(g) · tile positions[ratio]
    (``gated_positional_embedding``)."""
    name, tokens, d = "gated_positional_embedding", spec.tokens, spec.width
    tanh = gate_tanh(m, f"{name}.gate")
    one = m.emit("constant", [], {"value": 1.0}, "positions_one")[0]
    keep = m.emit("sub", [one, tanh], None, "positions_keep")[0]
    table = _reshape(m, m._added_param(f"{name}.embedding", (tokens, d)), [1, 1, tokens, d], "positions")
    x = x + m.emit("mul", [table, keep], None, "positions_gated")[0]
    picked = _per_ratio(m, ratio, spec, f"{name}.tile_embedding.weight", tokens)
    return x + m.emit("mul", [picked, tanh], None, "tile_positions_gated")[0]


def _pair_mask(m: "Model", used: "Tensor", spec: MllamaVisionSpec, length: int) -> "Tensor":
    """The additive bias [N, 1, S, S]: lowest where query and key are both padding."""
    span = spec.tiles * length
    real = m.emit("cast", [used], {"to": "f32"}, "tiles_used")[0]
    real = _reshape(m, real, [IMAGES, spec.tiles, 1], "tiles_used_column")
    pattern = m.emit("constant", [], {"value": [[[1.0] * spec.tokens + [0.0] * (length - spec.tokens)]]},
                     "tile_token_pattern")[0]
    real = m.emit("mul", [real, pattern], None, "tokens_real")[0]  # [N, tiles, L]
    one = m.emit("constant", [], {"value": 1.0}, "mask_one")[0]
    pad = m.emit("sub", [one, real], None, "tokens_pad")[0]
    rows = _reshape(m, pad, [IMAGES, span, 1], "pad_rows")
    cols = _reshape(m, pad, [IMAGES, 1, span], "pad_columns")
    both = m.emit("mul", [rows, cols], None, "pad_pairs")[0]
    lowest = m.emit("constant", [], {"value": LOWEST}, "mask_lowest")[0]
    bias = m.emit("mul", [both, lowest], None, "pad_bias")[0]
    return _reshape(m, bias, [IMAGES, 1, span, span], "tower_bias")


def _layer(m: "Model", x: "Tensor", bias: "Tensor", spec: MllamaVisionSpec, p: str, gated: bool) -> "Tensor":
    """Pre-LayerNorm attention and GELU MLP (gated by tanh(gate_attn), tanh(gate_ffn))."""
    h = m.norm(x, f"{p}input_layernorm", "layer", spec.eps)
    a = _attention(m, h, bias, spec, p)
    x = x + (_gated(m, a, f"{p}gate_attn", f"{p}attn_gated") if gated else a)
    h = m.norm(x, f"{p}post_attention_layernorm", "layer", spec.eps)
    d = spec.width
    up = m.emit("linear", [h, m.param(f"{p}mlp.fc1.weight", (spec.d_ff, d)), m.param(f"{p}mlp.fc1.bias", (spec.d_ff,))],
                None, f"{p}fc1")[0]
    up = m.emit("gelu", [up], {"approximate": "none"}, f"{p}fc1_gelu")[0]
    f = m.emit("linear", [up, m.param(f"{p}mlp.fc2.weight", (d, spec.d_ff)), m.param(f"{p}mlp.fc2.bias", (d,))],
               None, f"{p}fc2")[0]
    return x + (_gated(m, f, f"{p}gate_ffn", f"{p}mlp_gated") if gated else f)


def _attention(m: "Model", h: "Tensor", bias: "Tensor", spec: MllamaVisionSpec, p: str) -> "Tensor":
    """softmax(q kᵀ / sqrt(D) + bias) v per head, the projections without biases."""
    d, heads = spec.width, spec.heads
    head_dim, span = d // heads, h.shape[1]

    def split(which: str) -> "Tensor":
        t = m.emit("linear", [h, m.param(f"{p}self_attn.{which}_proj.weight", (d, d)), None], None,
                   f"{p}{which}")[0]
        t = _reshape(m, t, [IMAGES, span, heads, head_dim], f"{p}{which}_heads")
        return m.emit("transpose", [t], {"perm": [0, 2, 1, 3]}, f"{p}{which}_by_head")[0]

    q, k, v = split("q"), split("k"), split("v")
    keys = m.emit("transpose", [k], {"perm": [0, 1, 3, 2]}, f"{p}k_t")[0]
    scores = m.emit("matmul", [q, keys], None, f"{p}scores")[0]
    scale = m.emit("constant", [], {"value": head_dim ** -0.5}, f"{p}scale")[0]
    scores = m.emit("add", [m.emit("mul", [scores, scale], None, f"{p}scaled")[0], bias], None, f"{p}masked")[0]
    weights = m.emit("softmax", [scores], {"axis": -1}, f"{p}weights")[0]
    out = m.emit("matmul", [weights, v], None, f"{p}values")[0]
    out = m.emit("transpose", [out], {"perm": [0, 2, 1, 3]}, f"{p}by_token")[0]
    out = _reshape(m, out, [IMAGES, span, d], f"{p}attn_rows")
    return m.emit("linear", [out, m.param(f"{p}self_attn.o_proj.weight", (d, d)), None], None, f"{p}attn_out")[0]


def _unpad(m: "Model", x: "Tensor", spec: MllamaVisionSpec, length: int, tokens: int, name: str) -> "Tensor":
    """[N, tiles·L, d] -> [N, tiles, tokens, d] without each tile's padding."""
    x = _reshape(m, x, [IMAGES, spec.tiles, length, spec.width], f"{name}_tiles")
    if length == tokens:
        return x
    return m.emit("slice", [x], {"axis": 2, "start": 0, "end": tokens}, f"{name}_unpadded")[0]


__all__ = ["MllamaVisionSpec", "build_mllama_vision", "PIXELS", "RATIO_IDS", "RATIO_MASK"]
