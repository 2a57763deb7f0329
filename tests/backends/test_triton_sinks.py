"""Attention sinks (GPT-OSS) in the Triton attention kernels, run by Triton's interpreter on
CPU against the reference op: GQA and MQA, sliding windows and full layers, left padding,
prefill over a past, decode with one program per KV head and split-KV decode (the sink
counted once by attention_combine), in fp32 (1e-5 relative) and fp16 (2e-2)."""
from __future__ import annotations

from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("triton")  # the optional `triton` extra

from backends.triton.emit import emit_module, load_module  # noqa: E402
from irc.dtypes import DType  # noqa: E402
from irc.interpreter import random_feeds, run  # noqa: E402
from irc.ops.attention import attend, visible_keys  # noqa: E402
from tests.backends.test_triton_kernels import DTYPES, F32, cached_attention_graph, check  # noqa: E402


def sinks_graph(name, dtype, heads, kv_heads, head_dim, sinks, window=None):
    """One attention with a past cache, a padding mask and per-head sinks [H] (given values)."""
    def extra(g):
        return [g.add_param("attn.sinks", dtype, (heads,), np.asarray(sinks, dtype.numpy))]
    return cached_attention_graph(name, dtype, heads, kv_heads, head_dim, {"window": window}, extra)


SINKS = [1.5, -0.5, 3.0, 0.25, 2.0, -2.0]


@DTYPES
@pytest.mark.parametrize("window", [None, 4], ids=["full", "window4"])
def test_prefill_with_sinks_over_a_past(tmp_path, dtype, window):
    """GQA (4 heads over 2): T = 5 new tokens after 7, the second row left-padded by 3, one row
    of which sees no key at all (it outputs zeros, sink or not)."""
    g = sinks_graph(f"sinks_prefill_{window}", dtype, 4, 2, 16, SINKS[:4], window)
    feeds = random_feeds(g, batch=2, tokens=5, past=7)
    feeds["attention_mask"][1, :3] = 0
    module = check(g, tmp_path, feeds, dtype)
    text = open(module.__file__).read()
    assert "def attention_prefill_window_sinks(" in text or "def attention_prefill_sinks(" in text
    assert "m_i = sink" in text


@DTYPES
@pytest.mark.parametrize("heads,kv_heads,window,batch", [(3, 1, 16, 1), (6, 2, None, 2), (6, 3, 8, 2)])
def test_decode_with_sinks(tmp_path, dtype, heads, kv_heads, window, batch):
    """T = 1 over a 40-token past: MQA at B = 1 runs three split-KV programs merged by
    attention_combine; GQA one program per KV head."""
    g = sinks_graph(f"sinks_decode_{kv_heads}", dtype, heads, kv_heads, 32, SINKS[:heads], window)
    module = check(g, tmp_path, random_feeds(g, batch=batch, tokens=1, past=40), dtype)
    assert "m_i = tl.where(split == 0, sink, m_i)" in open(module.__file__).read()


def test_split_counts_agree_and_the_sink_takes_weight(tmp_path):
    """One, two and three splits give the same output (the sink counted once), equal to the
    reference, and different from the same attention without sinks."""
    import torch

    g = sinks_graph("sinks_splits", F32, 3, 1, 32, SINKS[:3])
    emit_module(g, str(tmp_path / "splits.py"))
    module = load_module(str(tmp_path / "splits.py"))
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((1, 1, 3, 32), (1, 1, 45, 32),
                                                                            (1, 1, 45, 32)))
    mask = np.ones((1, 45), np.int64)
    mask[0, :4] = 0
    sinks = torch.tensor(SINKS[:3])
    outputs = []
    for splits in (1, 2, 3):
        out = torch.empty((1, 1, 3, 32))
        module.launch_attention_sinks(*(torch.from_numpy(a) for a in (q, k, v)), out, torch.from_numpy(mask), 0.2,
                                      sinks, splits=splits)
        outputs.append(out.numpy())
    visible = visible_keys(1, 1, 44, mask)
    want = attend(q.transpose(0, 2, 1, 3), k, v, visible, 0.2, sinks=np.asarray(SINKS[:3], np.float32))
    plain = attend(q.transpose(0, 2, 1, 3), k, v, visible, 0.2)
    for got in outputs:
        np.testing.assert_allclose(got.transpose(0, 2, 1, 3), want, rtol=1e-5, atol=1e-6)
    assert np.abs(want - plain).max() > 1e-2


def test_a_row_seeing_no_key_outputs_zeros(tmp_path):
    """A fully padded row: no visible key, so zeros (the sink has no value), never NaN."""
    g = sinks_graph("sinks_empty", F32, 4, 2, 16, SINKS[:4])
    feeds = random_feeds(g, batch=2, tokens=3, past=0)
    feeds["attention_mask"][1, :] = 0
    check(g, tmp_path, feeds, F32)
    assert np.all(run(g, feeds)["out"][1] == 0)


def test_sink_kernels_compile_for_sm90_and_sm80_on_tensor_cores(tmp_path):
    """The sink variants (windowed GQA: prefill, split-KV decode) compile as the other kernels
    do (``test_triton_compile``): for sm_90 and sm_80, and with 16-bit dots on sm_90 to PTX
    holding tensor-core instructions."""
    from tests.backends.test_triton_compile import compile_all

    paths = []
    for dtype in (F32, DType.f16):
        g = sinks_graph(f"sinks_{dtype.name}", dtype, 8, 2, 64, SINKS + SINKS[:2], window=16)
        paths.append(str(tmp_path / f"sinks_{dtype.name}.py"))
        emit_module(g, paths[-1])
    compiled = compile_all(paths, ["90:0,90:1", "80:0"])
    for job in ("90:0", "90:1", "80:0"):
        names = {name.rsplit(":", 1)[1] for name in compiled[job]}
        assert {"attention_prefill_window_sinks", "attention_decode_window_sinks"} <= names, (job, names)
    assert all(result["mma"] for name, result in compiled["90:1"].items() if "_sinks" in name), compiled["90:1"]


def test_a_sinks_model_prefill_and_decode_match_the_reference(tmp_path):
    """The two-layer sinks model of test_sinks_targets (a sliding layer and a full one):
    a prefill and 8 decode steps, each side feeding its own cache back, within 1e-4."""
    from backends.triton import DEFAULT_PIPELINE
    from irc.passmanager import PassManager, parse_pipeline
    from irc.weights import seed_absent
    from tests.backends.test_sinks_targets import sinks_model
    from tests.backends.test_triton_models import check_prefill_and_decode

    graph = sinks_model()
    seed_absent(graph)
    PassManager(parse_pipeline(DEFAULT_PIPELINE)).run(graph)
    emit_module(graph, str(tmp_path / "sinks_tt.py"))
    check_prefill_and_decode(graph, load_module(str(tmp_path / "sinks_tt.py")), prompt=7)
