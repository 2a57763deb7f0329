"""Pixtral's vision tower and Mistral-3's projector in the DSL: images of any size (whole merged
blocks), 2-D RoPE, and the learned patch merger.

    spec = PixtralSpec(layers=2, width=32, heads=4, d_ff=48, out=48)
    m = Model("tiny-pixtral", vocab=None, d_model=32, encoder=True)
    build_pixtral(m, spec)            # image_features [B·Y·X, 48]

The model takes ``pixel_values`` f32 [B, C, s·Y, s·X], s = patch · merge (the processor resizes
every image to whole s x s blocks; a batch holds images of one size), and returns one row per
merged block, row by row. The patches are transformers' Conv2d with kernel = stride = p, a
matmul by the flattened weight (``@patch_embed`` [d, C·p·p]) over the patches taken row by row;
``@pre_norm`` (RMSNorm) follows. Each layer is pre-norm (RMSNorm, eps 1e-5): attention without
biases over the image's patches, rotated by their (row, column) (``Rope(mrope=alternating)``:
PixtralVisionRotaryEmbedding's even frequencies by the row, odd ones by the column), then a
gated MLP (``act`` "silu": SwiGLU, "gelu": GeGLU exact). The hidden state ``layer`` (-1 the last)
goes through Mistral-3's projector: ``@projector.norm`` (RMSNorm, ``norm_eps``), the patch merger
(each merge x merge block's patches side by side, channel-major as ``torch.nn.functional.unfold``
lays them, through ``@projector.merge`` [d, merge²·d]), ``@projector.linear_1``, GELU,
``@projector.linear_2`` (biases with ``bias``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from frontends.dsl_args import positive
from frontends.dsl_rope import Rope
from frontends.dsl_vision import PIXELS
from irc import dims
from irc.dtypes import DType
from irc.ops.vision import FEATURES

if TYPE_CHECKING:
    from frontends.dsl import Model, Tensor

ACTS = ("silu", "gelu")
ROWS, COLUMNS = "Y", "X"  # merged blocks down and across an image


@dataclass
class PixtralSpec:
    """A Pixtral tower of ``layers`` x ``width`` (``heads``, gated MLP ``d_ff`` with ``act``)
    and Mistral-3's projector to ``out`` features; patches of ``patch`` pixels merged
    ``merge`` x ``merge``; hidden state ``layer`` (transformers' index, -1 the last)."""
    layers: int
    width: int
    heads: int
    d_ff: int
    out: int
    patch: int = 14
    merge: int = 2
    channels: int = 3
    act: str = "silu"
    theta: float = 10000.0
    layer: int = -1
    norm_eps: float = 1e-5
    bias: bool = False
    reference_size: int = 1024  # the image side ``irc show`` counts tokens and FLOPs at


def build_pixtral(m: "Model", spec: PixtralSpec) -> "Tensor":
    """The tower and projector ``spec`` describes, built into ``m`` (``Model(vocab=None,
    encoder=True)``); returns ``image_features``."""
    from frontends.dsl import Tensor
    for arg in ("layers", "width", "heads", "d_ff", "out", "patch", "merge", "channels"):
        positive(arg, getattr(spec, arg), m.origin())
    if spec.act not in ACTS:
        raise m.error("act", f"expected one of {', '.join(ACTS)}, got {spec.act!r}")
    head_dim = spec.width // spec.heads
    if spec.width % spec.heads or head_dim % 4:
        raise m.error("heads", f"{spec.width} features in {spec.heads} heads: 2-D RoPE needs heads of a multiple of "
                               "4 dims")
    depth = spec.layer if spec.layer >= 0 else spec.layers + 1 + spec.layer
    if not 0 <= depth <= spec.layers:
        raise m.error("layer", f"{spec.layer} is not a hidden state of the {spec.layers}-layer tower")
    p, k, c, d = spec.patch, spec.merge, spec.channels, spec.width
    block = p * k
    pixels = Tensor(m, m._graph.add_input(PIXELS, DType.f32, ("B", c, dims.mul(block, ROWS), dims.mul(block, COLUMNS))))
    side = spec.reference_size // block
    m.meta["vision"] = {"channels": c, "image_size": [side * block] * 2, "patch": p, "patches": (side * k) ** 2,
                        "tokens": side * side, "merge": k, "bindings": {ROWS: side, COLUMNS: side}}
    m.meta.pop("vocab_size", None)
    high, wide = dims.mul(k, ROWS), dims.mul(k, COLUMNS)  # patches down and across
    count = dims.mul(high, wide)

    def op(kind: str, inputs: list, attrs, name: str) -> "Tensor":
        return m.emit(kind, inputs, attrs, name)[0]

    cut = op("reshape", [pixels], {"shape": ["B", c, high, p, wide, p]}, "patch_cut")
    cut = op("transpose", [cut], {"perm": [0, 2, 4, 1, 3, 5]}, "patch_rows")
    flat = op("reshape", [cut], {"shape": ["B", count, c * p * p]}, "patch_pixels")
    x = op("linear", [flat, m.param("patch_embed", (d, c * p * p)), None], None, "patches")
    x = m.rms_norm(x, "pre_norm", 1e-5)
    grid = op("reshape", [x], {"shape": ["B", high, wide, d]}, "patch_grid_states")
    axes = []
    for axis, name in ((1, "row"), (2, "column")):
        index = op("range_like", [grid], {"axis": axis}, f"patch_{name}_index")
        shape = [high, 1] if axis == 1 else [1, wide]
        index = op("expand", [op("reshape", [index], {"shape": shape}, f"patch_{name}_2d")], {"shape": [high, wide]},
                   f"patch_{name}_grid")
        axes.append(op("expand", [op("reshape", [index], {"shape": [1, 1, count]}, f"patch_{name}_row")],
                       {"shape": [1, "B", count]}, f"patch_{name}s"))
    m._positions = op("concat", axes, {"axis": 0}, "rope_positions").value
    quarter = head_dim // 4
    rope = Rope(base=spec.theta, mrope={"sections": [quarter, quarter], "layout": "alternating"})
    for layer in m.layers(depth):
        x = x + layer.attention(layer.rms_norm(x, "attn_norm", 1e-5), heads=spec.heads, rope=rope, causal=False)
        h = layer.rms_norm(x, "mlp_norm", 1e-5)
        x = x + (layer.swiglu(h, spec.d_ff) if spec.act == "silu" else layer.geglu(h, spec.d_ff, approximate="none"))
    x = m.rms_norm(x, "projector.norm", spec.norm_eps)
    x = op("reshape", [x], {"shape": ["B", ROWS, k, COLUMNS, k, d]}, "merge_cut")
    x = op("transpose", [x], {"perm": [0, 1, 3, 5, 2, 4]}, "merge_blocks")  # unfold's (channel, row, column)
    x = op("reshape", [x], {"shape": [dims.product(["B", ROWS, COLUMNS]), d * k * k]}, "merge_joined")
    x = op("linear", [x, m.param("projector.merge", (d, d * k * k)), None], None, "merged")
    for i in (1, 2):
        width = spec.out
        bias = m.param(f"projector.linear_{i}.bias", (width,)) if spec.bias else None
        x = op("linear", [x, m.param(f"projector.linear_{i}", (width, m._features(x))), bias], None,
               f"projector_{i}")
        if i == 1:
            x = op("gelu", [x], {"approximate": "none"}, "projector_act")
    features = op("reshape", [x], {"shape": list(x.shape)}, FEATURES)
    m._graph.outputs.append(features.value)
    return features
