"""fix-image-grid: a Qwen-VL tower (its patches placed from image_grid_thw, a learned 4 x 4
position grid resampled to the image, 2-D RoPE, one image's frame as the attention block) at
its reference image of 8 x 8 pixels in patches of 2: golden dumps before and after, the same
features through the reference interpreter (the original fed the grid [[1, 4, 4]], the fixed
graph pixel values alone), the changed flag both ways, idempotence; with fold and dce after
it the positions, blocks and resampled grid are params."""
import numpy as np

from frontends.dsl import Model
from frontends.dsl_qwen_vision import QwenVisionSpec, build_qwen_vision
from irc.interpreter import run
from irc.passmanager import PassManager, parse_pipeline
from irc.printer import print_graph
from irc.testing import apply_pass, assert_unchanged, check_golden
from irc.weights import seed_absent
from passes.fix_image_grid import FixImageGrid

SPEC = QwenVisionSpec(depth=1, width=16, heads=2, d_ff=24, out=16, patch=2, temporal=2, merge=2, norm="layer",
                      mlp="gelu", patch_bias=True, positions=16, reference_size=8)


def tower():
    m = Model("tiny-qwen-vision", vocab=None, d_model=16, encoder=True)
    build_qwen_vision(m, SPEC)
    graph = m.graph
    seed_absent(graph)
    return graph


def test_the_tower_at_its_reference_image():
    graph = tower()
    fixed, changed = apply_pass(FixImageGrid(), graph)
    assert changed
    check_golden("fix-image-grid.before.ir", print_graph(graph))
    check_golden("fix-image-grid.after.ir", print_graph(fixed))
    assert [(v.name, v.shape) for v in fixed.inputs] == [("pixel_values", (16, 24))]
    assert fixed.meta["vision"]["fixed_grid"] == [1, 4, 4]
    pixels = np.random.default_rng(0).standard_normal((16, 24)).astype(np.float32)
    want = run(graph, {"pixel_values": pixels, "image_grid_thw": np.array([[1, 4, 4]])})["image_features"]
    got = run(fixed, {"pixel_values": pixels})["image_features"]
    np.testing.assert_array_equal(got, want)
    text = print_graph(fixed)
    assert FixImageGrid().run(fixed) is False and print_graph(fixed) == text  # idempotent


def test_fold_and_dce_after_it_leave_a_static_vit():
    graph = PassManager(parse_pipeline("fix-image-grid,fold,dce")).run(tower())
    assert not {"patch_grid", "resample_positions", "range_like"} & {n.op for n in graph.nodes}
    assert all(isinstance(d, int) for v in graph.values() for d in v.shape)


def test_a_graph_without_an_image_grid_is_unchanged(tiny_llama):
    assert_unchanged(FixImageGrid(), tiny_llama)


def test_the_numeric_check_feeds_the_original_the_bound_grid():
    """--check compares the tower fed the grid the pass bound (``meta["bound_inputs"]``) and the
    fixed tower's pixel values with the fixed one: equal (it reported an infinite error when
    each got its own random inputs)."""
    from irc.check import compare_outputs

    manager = PassManager(parse_pipeline("fix-image-grid"), checker=compare_outputs)
    fixed = manager.run(tower())
    assert fixed.meta["bound_inputs"] == {"image_grid_thw": [[1, 4, 4]]}
    assert manager.records[0].check_error == 0.0
