"""Vision ops: ``patch_embed``, a ViT's patch projection.

``patch_embed(pixel_values [B, C, H, W], weight [d, C, p, p], bias? [d]) {patch: p}`` ->
[B, ⌊H/p⌋·⌊W/p⌋, d]: the image cut into non-overlapping p x p patches, row by row (patch
(i, j) is row i·⌊W/p⌋ + j), each flattened channel-major (c, y, x) and projected by the
weight flattened the same way. It is the Conv2d with kernel = stride = p that ViT, CLIP,
SigLIP and DINOv2 checkpoints hold, followed by transformers' ``flatten(2).transpose(1, 2)``;
like that convolution it drops the last H mod p rows and W mod p columns (SigLIP-so400m's 384
pixels in patches of 14 give 27 x 27). Without overlap the convolution is a matmul of the
patches by the flattened weight (the seeds' identity), which ``lower-patch-embed`` writes out
with slice, reshape, transpose and ``linear`` for the targets. H and W are ints, at least p.
"""
from __future__ import annotations

import numpy as np

from irc import dims
from irc.ops.nn import f32
from irc.ops.registry import REQUIRED, Cost, OpDef, TensorType, expect, pad_inputs, register


def patches(pixel_values, patch: int) -> np.ndarray:
    """[B, C, H, W] -> [B, ⌊H/p⌋⌊W/p⌋, C·p·p]: the patches row by row, each channel-major (a
    remainder of rows or columns dropped)."""
    batch, channels, height, width = pixel_values.shape
    height, width = height - height % patch, width - width % patch
    grid = pixel_values[:, :, :height, :width].reshape(batch, channels, height // patch, patch, width // patch, patch)
    return grid.transpose(0, 2, 4, 1, 3, 5).reshape(batch, (height // patch) * (width // patch),
                                                    channels * patch * patch)


def _infer(inputs, attrs):
    pixels, weight, bias = pad_inputs(inputs, 3)
    patch = attrs["patch"]
    expect(isinstance(patch, int) and not isinstance(patch, bool) and patch > 0,
           f"patch_embed: patch must be a positive int, got {patch!r}")
    expect(pixels.dtype.is_float and pixels.rank == 4,
           f"patch_embed: pixel_values must be float [B, C, H, W], got {pixels.dtype}{dims.format_shape(pixels.shape)}")
    _, channels, height, width = pixels.shape
    expect(isinstance(height, int) and isinstance(width, int) and height >= patch and width >= patch,
           f"patch_embed: the image {height}x{width} must be ints of at least patch {patch}")
    expect(weight.rank == 4 and weight.shape[1:] == (channels, patch, patch),
           f"patch_embed: weight must be [d, {channels}, {patch}, {patch}], got {dims.format_shape(weight.shape)}")
    if bias is not None:
        expect(bias.shape == weight.shape[:1], f"patch_embed: bias must be [{weight.shape[0]}]")
    return [TensorType(pixels.dtype, (pixels.shape[0], (height // patch) * (width // patch), weight.shape[0]))]


def _reference(inputs, attrs):
    """Non-overlapping p x p patches, each projected: Conv2d(kernel = stride = p) flattened."""
    pixels, weight, bias = pad_inputs(inputs, 3)
    out = patches(f32(pixels), attrs["patch"]) @ f32(weight).reshape(weight.shape[0], -1).T
    if bias is not None:
        out = out + f32(bias)
    return [out.astype(pixels.dtype)]


def _cost(inputs, outputs, attrs):
    """2 FLOPs per weight per patch (the projection's matmul work)."""
    _, weight, bias = pad_inputs(inputs, 3)
    patch_count = outputs[0].shape[0] * outputs[0].shape[1]
    read = sum(t.nbytes for t in inputs if t is not None)
    bias_adds = patch_count * weight.shape[0] if bias is not None else 0
    return Cost(flops=2 * patch_count * weight.numel, other_flops=bias_adds,
                bytes_read=read, bytes_written=outputs[0].nbytes)


register(OpDef("patch_embed", ("pixel_values", "weight", "bias?"), {"patch": REQUIRED}, _infer, _reference, _cost,
               level="model"))
