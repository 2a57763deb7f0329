"""LongRoPE in the Triton target (Triton's interpreter on CPU): the rope tables pick the
long factors exactly when max(position_ids) + 1 > n, in the emitted module as in the
reference, for a lone rope op and for a small DSL model whose prefill and decode cross n."""
from __future__ import annotations

from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("triton")  # the optional `triton` extra

import passes  # noqa: E402,F401  (registers the passes)
from backends.triton import DEFAULT_PIPELINE  # noqa: E402
from irc.build import emit  # noqa: E402
from irc.dtypes import DType  # noqa: E402
from irc.graph import Graph  # noqa: E402
from backends.triton.emit import emit_module, load_module  # noqa: E402
from irc.check import relative_error  # noqa: E402
from irc.interpreter import past_inputs, present_name, run  # noqa: E402
from irc.passmanager import PassManager, parse_pipeline  # noqa: E402
from irc.weights import seed_absent  # noqa: E402
from tests.backends.test_triton_kernels import F32, check  # noqa: E402
from tests.backends.test_longrope_targets import ORIGINAL, SCALING, longrope_model  # noqa: E402


@pytest.mark.parametrize("longest", [ORIGINAL - 1, ORIGINAL, 30], ids=["short", "at-n", "long"])
def test_rope_op_switches_like_the_reference(tmp_path, longest):
    g = Graph(f"longrope_{longest}")
    g.meta = {"vocab_size": 50}
    x = g.add_input("x", DType.f32, ("B", "T", 3 * 8))
    positions = g.add_input("position_ids", DType.i64, ("B", "T"))
    g.outputs = list(emit(g, "rope", [x, positions], {"head_dim": 8, "base": 10000.0, "scaling": SCALING},
                          ["out"]))
    rng = np.random.default_rng(longest)
    feeds = {"x": rng.standard_normal((2, 5, 24)).astype(np.float32),
             "position_ids": np.sort(rng.integers(0, longest + 1, (2, 5)), axis=-1)}
    feeds["position_ids"][1, -1] = longest
    module = check(g, tmp_path, feeds, F32)
    assert "def longrope_inv_freq(" in open(module.__file__).read()


def test_model_prefill_and_decode_cross_the_switch(tmp_path):
    """The DSL model after the triton pipeline: a 12-token prefill (short), then decode
    steps at positions 12..17 (the long set from position n = 16 on), each side feeding its
    own caches back; logits within 1e-4 of the reference at every step."""
    graph = longrope_model()
    seed_absent(graph)
    PassManager(parse_pipeline(DEFAULT_PIPELINE)).run(graph)
    emit_module(graph, str(tmp_path / "longrope_tt.py"))
    module = load_module(str(tmp_path / "longrope_tt.py"))
    weights = module.load_weights()
    rng = np.random.default_rng(0)
    caches = past_inputs(graph)
    ids = rng.integers(1, 64, (2, 12))
    feeds = {"input_ids": ids, "attention_mask": np.ones((2, 12), np.int64),
             "position_ids": np.tile(np.arange(12), (2, 1)),
             **{v.name: np.zeros((2, 2, 0, 8), np.float32) for v in caches}}
    mine = dict(feeds)
    for step in range(7):
        want = run(graph, feeds)
        got = {name: value.cpu().float().numpy() for name, value in module.forward(weights, **mine).items()}
        assert relative_error(got["logits"], want["logits"]) <= 1e-4, f"step {step}"
        past = feeds["attention_mask"].shape[1]
        token = rng.integers(1, 64, (2, 1))
        common = {"input_ids": token, "attention_mask": np.ones((2, past + 1), np.int64),
                  "position_ids": np.full((2, 1), past)}
        feeds = {**common, **{v.name: want[present_name(v.name)] for v in caches}}
        mine = {**common, **{v.name: got[present_name(v.name)] for v in caches}}
