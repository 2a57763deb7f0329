"""lower-patch-embed: patch_embed -> reshape/transpose to the patches, then linear; and the
op itself: its reference against torch's conv2d, its shape errors."""
import numpy as np
import pytest

from irc import ops
from irc.build import emit1
from irc.dtypes import DType
from irc.errors import ShapeError
from irc.graph import Graph, Value
from irc.check import compare_outputs
from irc.interpreter import random_feeds
from irc.passmanager import PassManager, parse_pipeline
from irc.testing import apply_pass, assert_pass, assert_unchanged, run_op
from irc.weights import Derived, seed_absent
from passes.lower_patch_embed import LowerPatchEmbed

F32 = DType.f32


def patch_graph(batch="B", channels=3, height=8, width=12, patch=4, width_d=16, bias=True) -> Graph:
    """pixel_values [batch, C, H, W] -> patch_embed {patch} -> embeddings [batch, N, d]."""
    g = Graph("vit_patches")
    pixels = g.add_input("pixel_values", F32, (batch, channels, height, width))
    weight = g.add_param("patch.weight", F32, (width_d, channels, patch, patch))
    operands = [pixels, weight] + ([g.add_param("patch.bias", F32, (width_d,))] if bias else [])
    g.outputs = [emit1(g, "patch_embed", operands, {"patch": patch}, "embeddings")]
    seed_absent(g)
    return g


def test_lower_patch_embed():
    """Non-square 8x12 image, symbolic batch (bound to 2), bias."""
    g = patch_graph()
    assert assert_pass(LowerPatchEmbed(), g, golden="lower-patch-embed", feeds=random_feeds(g, batch=2))


@pytest.mark.parametrize("batch,height,width,patch,bias", [("B", 8, 12, 4, False), (1, 6, 6, 3, True),
                                                          (2, 4, 8, 2, False), ("B", 9, 11, 4, True)])
def test_lower_patch_embed_numbers(batch, height, width, patch, bias):
    g = patch_graph(batch, height=height, width=width, patch=patch, bias=bias)
    assert assert_pass(LowerPatchEmbed(), g, feeds=random_feeds(g, batch=2, seed=1))


def test_every_value_has_rank_at_most_5():
    lowered, _ = apply_pass(LowerPatchEmbed(), patch_graph())
    assert {n.op for n in lowered.nodes} == {"reshape", "transpose", "linear"}
    assert max(v.rank for v in lowered.values()) <= 5
    cropped, _ = apply_pass(LowerPatchEmbed(), patch_graph(height=9, width=11))
    assert [n.op for n in cropped.nodes][:2] == ["slice", "slice"]


def test_fold_makes_the_flat_weight_a_param():
    """After fold the weight [d, C, p, p] is read as the derived param @patch.weight.flat."""
    g = patch_graph()
    original = g.params["patch.weight"].array()
    manager = PassManager(parse_pipeline("lower-patch-embed,fold,dce"), checker=compare_outputs)
    graph = manager.run(g)
    assert [r.changed for r in manager.records] == [True, True, True]
    assert all(r.check_error <= 1e-5 for r in manager.records)
    flat = graph.params["patch.weight.flat"]
    assert isinstance(flat.data, Derived) and "patch.weight" not in graph.params
    np.testing.assert_array_equal(flat.array(), original.reshape(16, 48))


def test_lower_patch_embed_without_patch_embed(tiny_llama):
    assert_unchanged(LowerPatchEmbed(), tiny_llama)


# ---- the op ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bias,height,width", [(True, 8, 12), (False, 8, 12), (True, 10, 13)])
def test_reference_is_conv2d_flattened(bias, height, width):
    """A remainder of rows and columns (10 x 13 in patches of 4) is dropped, as Conv2d does."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    pixels = rng.standard_normal((2, 3, height, width)).astype(np.float32)
    weight = rng.standard_normal((16, 3, 4, 4)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32) if bias else None
    (got,) = run_op("patch_embed", [pixels, weight] + ([b] if bias else []), {"patch": 4})
    want = torch.nn.functional.conv2d(torch.from_numpy(pixels), torch.from_numpy(weight),
                                      None if b is None else torch.from_numpy(b), stride=4)
    np.testing.assert_allclose(got, want.flatten(2).transpose(1, 2).numpy(), rtol=1e-5, atol=1e-5)


def infer(pixels_shape, weight_shape, patch=4, bias_shape=None):
    operands = [Value("pixel_values", F32, pixels_shape), Value("weight", F32, weight_shape)]
    if bias_shape is not None:
        operands.append(Value("bias", F32, bias_shape))
    return ops.infer("patch_embed", operands, ops.get_op("patch_embed").normalize_attrs({"patch": patch}))


def test_infers_patches_by_width():
    assert infer(("B", 3, 8, 12), (16, 3, 4, 4), bias_shape=(16,))[0].shape == ("B", 6, 16)


@pytest.mark.parametrize("pixels_shape,weight_shape,bias_shape,message", [
    (("B", 3, 8, 3), (16, 3, 4, 4), None, "must be ints of at least patch 4"),
    (("B", 3, "H", 8), (16, 3, 4, 4), None, "must be ints of at least patch 4"),
    (("B", 3, 8), (16, 3, 4, 4), None, "pixel_values must be float"),
    (("B", 3, 8, 12), (16, 1, 4, 4), None, r"weight must be \[d, 3, 4, 4\]"),
    (("B", 3, 8, 12), (16, 3, 2, 2), None, r"weight must be \[d, 3, 4, 4\]"),
    (("B", 3, 8, 12), (16, 3, 4, 4), (8,), r"bias must be \[16\]"),
])
def test_shape_errors(pixels_shape, weight_shape, bias_shape, message):
    with pytest.raises(ShapeError, match=message):
        infer(pixels_shape, weight_shape, bias_shape=bias_shape)


def test_patch_must_be_a_positive_int():
    with pytest.raises(ShapeError, match="patch must be a positive int"):
        infer(("B", 3, 8, 12), (16, 3, 4, 4), patch=0)
