"""Llama-4's chunked attention in the Triton kernels, run by Triton's interpreter on CPU
against the reference op: chunks counted from each row's first real token (a left-padded row
shifts them), prefill over a past that crosses chunk edges, decode with one program per KV
head and split-KV decode, in fp32 (1e-5 relative) and fp16 (2e-2); and npu-tile's tiled
executor on a chunked layer's plan."""
from __future__ import annotations

from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("triton")  # the optional `triton` extra

from irc.interpreter import random_feeds, run  # noqa: E402
from tests.backends.test_triton_kernels import DTYPES, cached_attention_graph, check  # noqa: E402


def chunked_graph(name, dtype, heads=4, kv_heads=2, head_dim=16, chunk=4):
    """One causal attention in chunks of ``chunk``, with a past cache and a padding mask."""
    return cached_attention_graph(name, dtype, heads, kv_heads, head_dim, {"chunk": chunk})


@DTYPES
@pytest.mark.parametrize("pad", [0, 3])
def test_prefill_in_chunks_over_a_past(tmp_path, dtype, pad):
    """T = 9 after 6: row 1 left-padded by ``pad`` (its chunks start 3 later); the chunks cut
    the rows, so the result differs from full attention."""
    g = chunked_graph(f"chunked_prefill_{pad}", dtype)
    feeds = random_feeds(g, batch=2, tokens=9, past=6, seed=5)
    feeds["attention_mask"][1, :pad] = 0
    module = check(g, tmp_path, feeds, dtype)
    assert "(j[None, :] - row_pad) // CHUNK" in open(module.__file__).read()
    full = chunked_graph("full", dtype, chunk=10_000)
    assert np.abs(run(g, feeds)["out"] - run(full, feeds)["out"]).max() > 1e-3


@DTYPES
@pytest.mark.parametrize("heads,kv_heads,batch", [(3, 1, 1), (6, 2, 2)])
def test_decode_in_chunks(tmp_path, dtype, heads, kv_heads, batch):
    """T = 1 over a 40-token past in chunks of 16 (the query's chunk holds 9 keys): MQA at
    B = 1 split-KV, GQA one program per KV head; the second row left-padded by 5."""
    g = chunked_graph(f"chunked_decode_{kv_heads}", dtype, heads, kv_heads, 32, chunk=16)
    feeds = random_feeds(g, batch=batch, tokens=1, past=40, seed=6)
    if batch > 1:
        feeds["attention_mask"][1, :5] = 0
    check(g, tmp_path, feeds, dtype)


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_npu_tile_executor_runs_a_chunked_layer(dtype):
    """A chunked layer's plan: its keys capped at the chunk (as a window caps them), its
    records carrying the chunk, the tiled run equal to the untiled reference."""
    from frontends.dsl import Model, Rope
    from passes.npu_tile.plan import machine_of, plan_graph
    from tests.backends.test_npu_executor import check as check_record, mini

    m = Model("tiny-chunked", vocab=64, d_model=32)
    x = m.embed(m.input_ids())
    for layer in m.layers(1):
        x = x + layer.attention(layer.rms_norm(x, "attn_norm"), heads=4, kv_heads=2, head_dim=8,
                                rope=Rope(base=1e4, convention="interleaved"), chunk=8)
    m.logits(m.rms_norm(x, "norm"))
    plan = plan_graph(m.graph, mini(), tokens=6, past=20, dtype=dtype)
    records = [r for r in plan["ops"] if r["kind"] == "attention"]
    assert records and all(r["attention"]["chunk"] == 8 and r["shape"]["S"] <= 8 for r in records)
    for record in records:
        check_record(record, machine_of(plan))
