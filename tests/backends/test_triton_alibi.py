"""ALiBi in the Triton attention kernels, run by Triton's interpreter on CPU against the
reference op: GQA and MQA, sliding windows and full layers, left padding, prefill over a
past, decode with one program per KV head and split-KV decode (each split biasing its own
keys), in fp32 (1e-5 relative) and fp16 (2e-2); the variants compile for sm_90 and sm_80."""
from __future__ import annotations

from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("triton")  # the optional `triton` extra

from backends.triton.emit import emit_module, load_module  # noqa: E402
from irc.build import emit  # noqa: E402
from irc.dtypes import DType  # noqa: E402
from irc.interpreter import random_feeds  # noqa: E402
from irc.ops.alibi import alibi_bias, bloom_slopes, mpt_slopes  # noqa: E402
from irc.ops.attention import attend, visible_keys  # noqa: E402
from tests.backends.test_triton_kernels import DTYPES, F32, cached_attention_graph, check  # noqa: E402


def alibi_graph(name, dtype, heads, kv_heads, head_dim, window=None):
    """One attention with a past cache, a padding mask and MPT's slopes for ``heads``."""
    def extra(g):
        return [None, None, *emit(g, "constant", [], {"value": mpt_slopes(heads).tolist(), "dtype": "f32"},
                                  ["alibi_slopes"])]
    return cached_attention_graph(name, dtype, heads, kv_heads, head_dim, {"window": window}, extra)


@DTYPES
@pytest.mark.parametrize("window", [None, 4], ids=["full", "window4"])
def test_prefill_with_alibi_over_a_past(tmp_path, dtype, window):
    """GQA (6 heads over 2): T = 5 new tokens after 7, the second row left-padded by 3."""
    g = alibi_graph(f"alibi_prefill_{window}", dtype, 6, 2, 16, window)
    feeds = random_feeds(g, batch=2, tokens=5, past=7)
    feeds["attention_mask"][1, :3] = 0
    module = check(g, tmp_path, feeds, dtype)
    text = open(module.__file__).read()
    assert "def attention_prefill_window_alibi(" in text or "def attention_prefill_alibi(" in text


@DTYPES
@pytest.mark.parametrize("heads,kv_heads,window,batch", [(3, 1, 16, 1), (6, 2, None, 2)])
def test_decode_with_alibi(tmp_path, dtype, heads, kv_heads, window, batch):
    """T = 1 over a 40-token past: MQA at B = 1 runs split-KV programs merged by
    attention_combine; GQA one program per KV head."""
    g = alibi_graph(f"alibi_decode_{kv_heads}", dtype, heads, kv_heads, 32, window)
    check(g, tmp_path, random_feeds(g, batch=batch, tokens=1, past=40), dtype)


def test_split_counts_agree_and_the_slopes_move_the_result(tmp_path):
    """One, two and three splits give the same output, equal to the reference, and
    different from the same attention without slopes."""
    import torch

    g = alibi_graph("alibi_splits", F32, 3, 1, 32)
    emit_module(g, str(tmp_path / "splits.py"))
    module = load_module(str(tmp_path / "splits.py"))
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((1, 1, 3, 32), (1, 1, 45, 32),
                                                                            (1, 1, 45, 32)))
    mask = np.ones((1, 45), np.int64)
    mask[0, :4] = 0
    slopes = bloom_slopes(3)
    visible = visible_keys(1, 1, 44, mask)
    want = attend(q.transpose(0, 2, 1, 3), k, v, visible, 0.2, bias=alibi_bias(slopes, 1, 45))
    plain = attend(q.transpose(0, 2, 1, 3), k, v, visible, 0.2)
    for splits in (1, 2, 3):
        out = torch.empty((1, 1, 3, 32))
        module.launch_attention_alibi(*(torch.from_numpy(a) for a in (q, k, v)), out, torch.from_numpy(mask), 0.2,
                                      torch.from_numpy(slopes), splits=splits)
        np.testing.assert_allclose(out.numpy().transpose(0, 2, 1, 3), want, rtol=1e-5, atol=1e-6)
    assert np.abs(want - plain).max() > 1e-2


def test_alibi_kernels_compile_for_sm90_and_sm80_on_tensor_cores(tmp_path):
    """The ALiBi variants (windowed GQA: prefill, split-KV decode) compile as the other
    kernels do (``test_triton_compile``), with 16-bit dots on sm_90 to tensor-core PTX."""
    from tests.backends.test_triton_compile import compile_all

    paths = []
    for dtype in (F32, DType.f16):
        g = alibi_graph(f"alibi_{dtype.name}", dtype, 8, 2, 64, window=16)
        paths.append(str(tmp_path / f"alibi_{dtype.name}.py"))
        emit_module(g, paths[-1])
    compiled = compile_all(paths, ["90:0,90:1", "80:0"])
    for job in ("90:0", "90:1", "80:0"):
        names = {name.rsplit(":", 1)[1] for name in compiled[job]}
        assert {"attention_prefill_window_alibi", "attention_decode_window_alibi"} <= names, (job, names)
    assert all(result["mma"] for name, result in compiled["90:1"].items() if "_alibi" in name), compiled["90:1"]


def test_an_alibi_model_prefill_and_decode_match_the_reference(tmp_path):
    """The two-layer ALiBi model of test_alibi_targets (a sliding layer and a full one): a
    prefill and 8 decode steps, each side feeding its own cache back, within 1e-4."""
    from backends.triton import DEFAULT_PIPELINE
    from irc.passmanager import PassManager, parse_pipeline
    from irc.weights import seed_absent
    from tests.backends.test_alibi_targets import alibi_model
    from tests.backends.test_triton_models import check_prefill_and_decode

    graph = alibi_model()
    seed_absent(graph)
    PassManager(parse_pipeline(DEFAULT_PIPELINE)).run(graph)
    emit_module(graph, str(tmp_path / "alibi_tt.py"))
    check_prefill_and_decode(graph, load_module(str(tmp_path / "alibi_tt.py")), prompt=7)
