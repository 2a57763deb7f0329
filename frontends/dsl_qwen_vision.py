"""Qwen-VL's vision tower in the DSL: flattened patches of any image size, 2-D RoPE, window
attention, learned positions resampled to each image, and the patch merger (Qwen2-VL,
Qwen2.5-VL, Qwen3.5).

    spec = QwenVisionSpec(depth=2, width=32, heads=4, d_ff=64, patch=14, out=48,
                          norm="rms", mlp="swiglu", window=4, full_layers=(1,))
    m = Model("tiny-qwen-vision", vocab=None, d_model=32, encoder=True)
    build_qwen_vision(m, spec)        # image_features [P / merge², 48]

The model takes the processor's outputs as they are (``irc_cli.images_qwen``, onnxruntime-genai's
Qwen processor): ``pixel_values`` f32 [P, C·T·p·p], every image's patches one after another, each
patch its C channels x T frames x p x p pixels (an image is its frame twice), and
``image_grid_thw`` i64 [N, 3]. The patch projection is transformers' Conv3d with kernel = stride,
a matmul by the flattened weight (``@patch_embed`` [d, C·T·p·p], with ``patch_bias`` its bias).
With ``positions`` S² (Qwen3.5), a learned S x S position table (``@pos_embed``) is resampled
bilinearly to each image's grid and added (``resample_positions``). ``patch_grid`` places every
patch: its 2-D RoPE positions (row, column; ``Rope(mrope=per_axis)``: a quarter of each head's
dims rotates by the row, a quarter by the column, as ``VisionRotaryEmbedding``) and the blocks of
its attention (one packed sequence [1, P, d]: a frame for the full layers, a window of
``window`` x ``window`` merged blocks for the others, ``attention(blocks=...)``). The layers are
pre-norm (``norm``: "rms" (Qwen2.5-VL) or "layer" (Qwen2-VL)), attention with q/k/v and output
biases (``attn.qkv`` split into wq, wk, wv), and an MLP (``mlp``: "swiglu" with biases
(Qwen2.5-VL: ``mlp.w_gate``, ``w_up``, ``w_down`` and ``b_*``), "quick_gelu" (Qwen2-VL) or
"gelu" (tanh-approximated, Qwen3.5), both ``mlp.w_up``, ``w_down`` with biases). The
merger normalises (``merger.norm``), joins each merge x merge block's tokens (consecutive in the
processor's order) into one of merge²·d features, and projects them (``merger.fc1``, exact
GELU, ``merger.fc2``) to the text model's width. With ``deepstack`` (Qwen3-VL's DeepStack), the
states after each of those layers go through a merger of their own (``deepstack.{j}.*``, j the
layer's place in ``deepstack``; normalised after the join) and the features are
[I, (1 + levels)·out]: the merger's, then the levels in layer order
(``Model.merge_image_features(deepstack=...)`` takes them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from frontends.dsl_args import positive
from frontends.dsl_rope import Rope
from frontends.dsl_vision import IMAGE_ROWS
from irc.ops.vision import FEATURES
from irc import dims
from irc.dtypes import DType

if TYPE_CHECKING:
    from frontends.dsl import Model, Tensor

PIXELS, GRID = "pixel_values", "image_grid_thw"
NORMS, MLPS = ("rms", "layer"), ("swiglu", "quick_gelu", "gelu")


@dataclass
class QwenVisionSpec:
    """A Qwen-VL vision tower: ``depth`` layers of ``width`` features, ``heads``, MLP ``d_ff``;
    patches of ``patch`` pixels over ``temporal`` frames and ``channels``; ``merge`` x merge
    blocks merged into one token of ``out`` features; ``window`` (merged blocks per window
    side; None: every layer attends over its frame) except in ``full_layers``."""
    depth: int
    width: int
    heads: int
    d_ff: int
    out: int
    patch: int = 14
    temporal: int = 2
    channels: int = 3
    merge: int = 2
    norm: str = "rms"
    mlp: str = "swiglu"
    window: Optional[int] = None
    full_layers: tuple = field(default_factory=tuple)
    eps: float = 1e-6
    theta: float = 10000.0
    patch_bias: bool = False
    positions: int = 0  # S² learned positions (an S x S table resampled to each image), 0: none
    deepstack: tuple = field(default_factory=tuple)  # layers whose states DeepStack mergers also project
    reference_size: int = 448  # the image side ``irc show`` counts a tower's tokens and FLOPs at


def build_qwen_vision(m: "Model", spec: QwenVisionSpec) -> "Tensor":
    """The tower ``spec`` describes, built into ``m`` (``Model(vocab=None, encoder=True)``);
    returns its output ``image_features``."""
    from frontends.dsl import Tensor
    if spec.norm not in NORMS or spec.mlp not in MLPS:
        raise m.error("norm" if spec.norm not in NORMS else "mlp", f"expected norm in {NORMS} and mlp in {MLPS}")
    for arg in ("depth", "width", "heads", "d_ff", "out", "patch", "temporal", "channels", "merge"):
        positive(arg, getattr(spec, arg), m.origin())
    head_dim = spec.width // spec.heads
    if spec.width % spec.heads or head_dim % 4:
        raise m.error("heads", f"{spec.width} features in {spec.heads} heads: 2-D RoPE needs heads of a multiple of "
                               "4 dims")
    if len(set(spec.deepstack)) != len(spec.deepstack) or any(not 0 <= i < spec.depth for i in spec.deepstack):
        raise m.error("deepstack", f"{list(spec.deepstack)} are not distinct layers of the {spec.depth}-layer tower")
    graph = m._graph
    if m.meta.get("vision") is not None:
        raise m.error("spec", "the image input is already declared")
    flat = spec.channels * spec.temporal * spec.patch * spec.patch
    patches = dims.mul(spec.merge * spec.merge, IMAGE_ROWS)  # m² patches per visual token
    pixels = Tensor(m, graph.add_input(PIXELS, DType.f32, (patches, flat)))
    grid = Tensor(m, graph.add_input(GRID, DType.i64, ("N", 3)))
    side = spec.reference_size // spec.patch
    m.meta["vision"] = {"channels": spec.channels, "image_size": [spec.reference_size] * 2, "patch": spec.patch,
                        "patches": side * side, "tokens": side * side // spec.merge ** 2, "grid": "thw",
                        "merge": spec.merge, "temporal": spec.temporal,
                        "window_pixels": (spec.window or 0) * spec.merge * spec.patch,
                        "deepstack": len(spec.deepstack),
                        "bindings": {IMAGE_ROWS: side * side // spec.merge ** 2, "N": 1}}
    m.meta.pop("vocab_size", None)
    bias = m.param("patch_embed.bias", (spec.width,)) if spec.patch_bias else None
    x = m.emit("linear", [pixels, m.param("patch_embed", (spec.width, flat)), bias], None, "patches")[0]
    where = m.emit("patch_grid", [grid, pixels], {"merge": spec.merge, "window": spec.window}, "patch_grid")[0]
    if spec.positions:
        side = math.isqrt(spec.positions)
        if side * side != spec.positions:
            raise m.error("positions", f"{spec.positions} learned positions are not a square grid")
        table = m.param("pos_embed", (spec.positions, spec.width))
        x = x + m.emit("resample_positions", [table, where], {"side": side}, "patch_positions")[0]
    x = m.emit("reshape", [x], {"shape": [1, patches, spec.width]}, "patch_row")[0]

    def rows(start: int, stop: int, shape: list, name: str) -> Tensor:
        picked = m.emit("slice", [where], {"axis": 0, "start": start, "end": stop}, f"{name}_rows")[0]
        return m.emit("reshape", [picked], {"shape": shape}, name)[0]

    m._positions = rows(0, 2, [2, 1, patches], "rope_positions").value
    frames = rows(2, 3, [1, patches], "frame_blocks")
    windows = rows(3, 4, [1, patches], "window_blocks") if spec.window else frames
    quarter, levels = head_dim // 4, {}
    rope = Rope(base=spec.theta, mrope={"sections": [quarter, quarter], "layout": "per_axis"})
    for layer in m.layers(spec.depth):
        norm = layer.rms_norm if spec.norm == "rms" else layer.layer_norm
        blocks = frames if spec.window is None or layer.index in spec.full_layers else windows
        x = x + layer.attention(norm(x, eps=spec.eps), heads=spec.heads, rope=rope, qkv_bias=True, out_bias=True,
                                causal=False, blocks=blocks)
        h = norm(x, eps=spec.eps)
        if spec.mlp == "gelu":
            x = x + layer.gelu_mlp(h, spec.d_ff, bias=True, approximate="tanh")
        else:
            x = x + (layer.quick_gelu_mlp(h, spec.d_ff) if spec.mlp == "quick_gelu" else _swiglu_biased(layer, h, spec))
        if layer.index in spec.deepstack:
            levels[layer.index] = _merger(m, x, spec, f"deepstack.{spec.deepstack.index(layer.index)}", True)
    x = _merger(m, x, spec, "merger", False)
    if levels:  # the levels in layer order after the features (transformers' deepstack_features)
        x = m.emit("concat", [x] + [levels[i] for i in sorted(levels)], {"axis": -1}, "deepstack_features")[0]
    features = m.emit("reshape", [x], {"shape": [IMAGE_ROWS, spec.out * (1 + len(levels))]}, FEATURES)[0]
    graph.outputs.append(features.value)
    return features


def _merger(m: "Model", x: "Tensor", spec: QwenVisionSpec, name: str, joined_norm: bool) -> "Tensor":
    """Each merge x merge block's tokens (consecutive) joined into one row of merge²·d
    features, normalised (before the join, or after it: ``joined_norm``, DeepStack's), then
    ``name``.fc1, exact GELU, ``name``.fc2 -> [I, out]."""
    joined = spec.width * spec.merge ** 2
    if not joined_norm:
        x = m.rms_norm(x, f"{name}.norm", spec.eps) if spec.norm == "rms" else m.layer_norm(x, f"{name}.norm", spec.eps)
    x = m.emit("reshape", [x], {"shape": [IMAGE_ROWS, joined]}, f"{name}_joined")[0]
    if joined_norm:
        x = m.layer_norm(x, f"{name}.norm", spec.eps)
    x = m.emit("linear", [x, m.param(f"{name}.fc1", (joined, joined)), m.param(f"{name}.fc1.bias", (joined,))], None,
               f"{name}_up")[0]
    x = m.emit("gelu", [x], {"approximate": "none"}, f"{name}_act")[0]
    return m.emit("linear", [x, m.param(f"{name}.fc2", (spec.out, joined)), m.param(f"{name}.fc2.bias", (spec.out,))],
                  None, f"{name}_out")[0]


def _swiglu_biased(layer, x: "Tensor", spec: QwenVisionSpec) -> "Tensor":
    """down(silu(gate(x) + b) * (up(x) + b)) + b: Qwen2.5-VL's vision MLP, as primitives."""
    m, p = layer.model, layer.prefix
    d = m._features(x)
    layer._note_mlp("swiglu", spec.d_ff)

    def linear(t: "Tensor", which: str, rows: int, cols: int) -> "Tensor":
        return m.emit("linear", [t, m.param(f"{p}mlp.w_{which}", (rows, cols)), m.param(f"{p}mlp.b_{which}", (rows,))],
                      None, f"{p}mlp_{which}")[0]

    gate = m.emit("silu", [linear(x, "gate", spec.d_ff, d)], None, f"{p}mlp_gate_act")[0]
    hidden = m.emit("mul", [gate, linear(x, "up", spec.d_ff, d)], None, f"{p}mlp_act")[0]
    return linear(hidden, "down", d, spec.d_ff)
