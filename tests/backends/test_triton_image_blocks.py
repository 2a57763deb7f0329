"""Gemma 3's image tokens in the Triton attention kernels (run by Triton's interpreter on CPU
against the reference op): in a causal attention an image's tokens also see its later tokens
(equal block ids >= 0 of the current chunk), past the causal frontier a prefill tile would
otherwise stop at; with a past cache, a sliding window, left padding and an image that spans
several query tiles, in fp32 (1e-5 relative) and fp16 (2e-2)."""
from __future__ import annotations

from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("triton")  # the optional `triton` extra

from irc.dtypes import DType  # noqa: E402
from irc.interpreter import random_feeds, run  # noqa: E402
from tests.backends.test_triton_kernels import DTYPES, cached_attention_graph, check  # noqa: E402


def blocks_graph(name, dtype, heads=4, kv_heads=2, head_dim=16, window=None):
    """One causal attention with a past cache, a padding mask and image blocks [B, T]."""
    def extra(g):
        return [None, g.add_input("blocks", DType.i64, ("B", "T"))]
    return cached_attention_graph(name, dtype, heads, kv_heads, head_dim, {"window": window}, extra)


def image_feeds(g, batch=2, tokens=12, past=3):
    """Row 0: an image of 7 tokens at 2..8 (past a query tile of 4 or 8); row 1, left-padded by
    2, two images (3..5 and 8..10)."""
    feeds = random_feeds(g, batch=batch, tokens=tokens, past=past, seed=3)
    feeds["attention_mask"][1, :2] = 0
    blocks = np.full((batch, tokens), -1, np.int64)
    blocks[0, 2:9] = 0
    blocks[1, 3:6], blocks[1, 8:11] = 0, 1
    feeds["blocks"] = blocks
    return feeds


@DTYPES
@pytest.mark.parametrize("window", [None, 5], ids=["full", "window5"])
def test_an_images_tokens_see_each_other(tmp_path, dtype, window):
    g = blocks_graph(f"image_blocks_{window}", dtype, window=window)
    feeds = image_feeds(g)
    module = check(g, tmp_path, feeds, dtype)
    assert "same & (qblock[:, None] >= 0)" in open(module.__file__).read()
    plain = dict(feeds, blocks=np.full_like(feeds["blocks"], -1))
    assert np.abs(run(g, feeds)["out"] - run(g, plain)["out"]).max() > 1e-3  # the blocks open the mask
