"""``lower-patch-embed``: a ViT's patch projection to reshape, transpose and ``linear``."""
from __future__ import annotations

from irc import dims
from irc.graph import Node, Value
from irc.passmanager import register_pass
from irc.rewrite.lowering import Emitter, LoweringPass


def lower_patch_embed(e: Emitter, node: Node) -> Value:
    """The patches [B, N, C·p·p] (``irc.ops.vision.patches``' order) through ``linear``.

    With I = ⌊H/p⌋ patch rows and J = ⌊W/p⌋ patch columns (a remainder of rows or columns
    sliced off first), every step is rank 4:
    [B, C, H, W] -> [B·C·I, Y, J, X] -> [B·C·I, J, Y, X] -> [B, C, N, Y·X]
    -> [B, N, C, Y·X] -> [B, N, C·Y·X]."""
    pixels, weight, bias = e.operands.values()
    patch = node.attrs["patch"]
    batch, channels, height, width = pixels.shape
    rows, columns, width_d = height // patch, width // patch, weight.shape[0]
    for axis, size, name in ((2, height, "cropped_rows"), (3, width, "cropped")):
        if size % patch:  # the convolution's remainder, dropped
            pixels = e("slice", [pixels], name, {"axis": axis, "start": 0, "end": size - size % patch})
    count, features = rows * columns, channels * patch * patch
    grid = e("reshape", [pixels], "rows", {"shape": [dims.mul(batch, channels * rows), patch, columns, patch]})
    tiles = e("transpose", [grid], "tiles", {"perm": [0, 2, 1, 3]})
    per_channel = e("reshape", [tiles], "per_channel", {"shape": [batch, channels, count, patch * patch]})
    per_patch = e("transpose", [per_channel], "per_patch", {"perm": [0, 2, 1, 3]})
    patches = e("reshape", [per_patch], "patches", {"shape": [batch, count, features]})
    key = ("flat", weight)
    if key not in e.memo:
        e.memo[key] = e("reshape", [weight], attrs={"shape": [width_d, features]}, name=f"{weight.name}.flat")
    return e("linear", [patches, e.memo[key]] + ([bias] if bias is not None else []))


@register_pass
class LowerPatchEmbed(LoweringPass):
    """Rewrite ``patch_embed`` as reshapes, transposes and one ``linear``.

    Without overlap (kernel = stride = p) the convolution is a matmul of the patches by the
    flattened weight (the seeds' identity): the image [B, C, H, W] is cut into its patches
    [B, N, C·p·p], each flattened channel-major (c, y, x) as ``irc.ops.vision.patches``
    orders them, and ``linear`` applies the weight [d, C, p, p] read as [d, C·p·p] (a
    ``reshape`` of the param, ``@<weight>.flat`` after ``fold``) and the bias. Every
    intermediate has rank 4 (edge NPUs take rank <= 5), the batch may be symbolic, and
    values are named ``<output>.rows``, ``.tiles``, ``.per_channel``, ``.per_patch``,
    ``.patches`` (``.cropped_rows`` / ``.cropped`` where p does not divide the image: the
    convolution drops the remainder, and so does the slice). Run ``lower-linear`` afterwards to reach ``matmul``. Never refuses.
    Guarantees: the reference result up to float32 rounding; the output keeps its name.
    """

    name = "lower-patch-embed"
    lowerings = {"patch_embed": lower_patch_embed}
