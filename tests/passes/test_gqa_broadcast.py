"""gqa-broadcast: grouped attention as primitives, K/V broadcast (default) or repeated
(materialize=true), equal to the attention op's reference in every mode it has."""
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from irc.interpreter import random_feeds
from frontends.yaml_spec import load, loads
from irc.build import emit
from irc.dtypes import DType
from irc.graph import Graph
from irc.passmanager import parse_pipeline
from irc.printer import print_graph
from irc.testing import apply_pass, assert_pass, assert_unchanged
from irc.check import compare_outputs, run_reference
from passes.gqa_broadcast import GqaBroadcast

F32 = DType.f32
TOLERANCE = 1e-5

QWEN3_LIKE = """
model:
  name: tiny-qwen3
  vocab_size: 128
  d_model: 32
  n_layers: 2
  norm: {kind: rms, eps: 1.0e-6}
  attention:
    kind: gqa
    n_heads: 4
    n_kv_heads: 1
    head_dim: 16
    qk_norm: true
    rope: {base: 1000000, convention: half}
  mlp: {kind: swiglu, d_ff: 64}
"""

MODELS = {
    "llama3": lambda: load("examples/tiny-llama3.yaml"),
    "mistral-window": lambda: load("examples/tiny-mistral-7b.yaml"),
    "gemma2-softcap-window": lambda: load("examples/tiny-gemma2-9b.yaml"),
    "qwen3-qk-norm-mqa": lambda: loads(QWEN3_LIKE),
}


def attention_graph(heads=4, kv_heads=2, head_dim=4, window=None, softcap=None, scale=None, causal=True,
                    mask=True, past=True) -> Graph:
    """q/k/v inputs [B,T,*] into one attention op, with mask and past caches when asked."""
    g = Graph("attention")
    q = g.add_input("q", F32, ("B", "T", heads * head_dim))
    k = g.add_input("k", F32, ("B", "T", kv_heads * head_dim))
    v = g.add_input("v", F32, ("B", "T", kv_heads * head_dim))
    inputs = [q, k, v, g.add_input("attention_mask", DType.i64, ("B", "P+T" if past else "T")) if mask else None]
    names = ["out"]
    if past:
        inputs += [g.add_input(f"past_key_values.0.{n}", F32, ("B", kv_heads, "P", head_dim)) for n in ("key", "value")]
        names += ["present.0.key", "present.0.value"]
    attrs = {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "window": window, "softcap": softcap,
             "scale": scale, "causal": causal}
    g.outputs = emit(g, "attention", inputs, attrs, names)
    return g


def feeds_for(graph, batch=2, tokens=5, past=3, left_pad=0, seed=0):
    """Seeded inputs; the last row's first ``left_pad`` cache slots are padding."""
    return random_feeds(graph, batch=batch, tokens=tokens, past=past, seed=seed, left_pad=left_pad)


# ---- golden dumps, changed both ways, idempotence ----------------------------------------

def test_gqa_broadcast_golden():
    graph = attention_graph(heads=4, kv_heads=2, head_dim=4, window=3, softcap=20.0)
    assert assert_pass(GqaBroadcast(), graph, golden="gqa-broadcast", feeds=feeds_for(graph, left_pad=4))


def test_gqa_broadcast_materialize_golden():
    graph = attention_graph(heads=4, kv_heads=2, head_dim=4)
    assert assert_pass(GqaBroadcast(materialize=True), graph, golden="gqa-broadcast-materialize",
                       feeds=feeds_for(graph, left_pad=2))


def test_mha_is_left_alone():
    assert_unchanged(GqaBroadcast(), attention_graph(heads=4, kv_heads=4))
    assert_unchanged(GqaBroadcast(materialize=True), load("examples/tiny-llama2-7b.yaml"))


def test_alibi_attention_is_left_to_the_emitter():
    """GQA with ALiBi slopes (tests/backends/test_alibi_targets.py's model): the backends lower
    the slopes themselves, so the pass leaves it unchanged rather than dropping them."""
    from tests.backends.test_alibi_targets import alibi_model

    assert_unchanged(GqaBroadcast(), alibi_model())


def test_pipeline_option():
    (p,) = parse_pipeline("gqa-broadcast{materialize=true}")
    assert isinstance(p, GqaBroadcast) and p.config["materialize"] is True
    assert repr(p) == "gqa-broadcast{materialize=True}"


# ---- whole models: prefill, decode, left padding ------------------------------------------

@pytest.mark.parametrize("materialize", [False, True], ids=["broadcast", "materialize"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_tiny_models_match(model, materialize):
    graph = MODELS[model]()
    after, changed = apply_pass(GqaBroadcast(materialize=materialize), graph)
    assert changed and not any(n.op == "attention" for n in after.nodes)
    assert [v.name for v in after.outputs] == [v.name for v in graph.outputs]
    cases = {"prefill": dict(past=0, tokens=5), "decode": dict(past=4, tokens=1),
             "chunk": dict(past=3, tokens=4), "left-padded prefill": dict(past=0, tokens=6, left_pad=3),
             "left-padded decode": dict(past=5, tokens=2, left_pad=4)}
    for case, sizes in cases.items():
        error = compare_outputs(graph, after, feeds_for(graph, **sizes))
        assert error <= TOLERANCE, f"{model} {case}: {error:.3g}"


def test_no_visible_key_gives_zeros():
    """A padded query row that sees only padding outputs zeros, as the op does."""
    graph = attention_graph(heads=2, kv_heads=1, head_dim=4, past=False)
    after, _ = apply_pass(GqaBroadcast(), graph)
    feeds = feeds_for(graph, batch=1, tokens=4, past=0, left_pad=2)
    (expected,), (actual,) = run_reference(graph, feeds), run_reference(after, feeds)
    assert np.all(expected[0, :2] == 0) and np.all(actual[0, :2] == 0)
    assert np.allclose(actual, expected, atol=1e-6)


# ---- no repeated K/V unless asked ---------------------------------------------------------

def _shapes(text: str) -> set:
    return set(re.findall(r"f32\[([^\]]*)\]", text))


def test_default_form_never_materialises_repeated_kv():
    graph = load("examples/tiny-llama3.yaml")  # H = 4 query heads, K = 2 kv heads, D = 16
    broadcast = _shapes(print_graph(apply_pass(GqaBroadcast(), graph)[0]))
    repeated = {"B,4,P,16", "B,4,P+T,16"}
    assert not broadcast & repeated
    assert "B,2,1,P+T,16" in broadcast  # K/V as [B, K, 1, S, D] against queries [B, K, G, T, D]
    assert "B,2,2,T,16" in broadcast
    materialized = _shapes(print_graph(apply_pass(GqaBroadcast(materialize=True), graph)[0]))
    assert "B,4,P+T,16" in materialized


# ---- random shapes ------------------------------------------------------------------------

@settings(max_examples=15, deadline=None)
@given(kv_heads=st.integers(1, 3), group=st.integers(2, 3), head_dim=st.sampled_from([2, 4, 6]),
       window=st.one_of(st.none(), st.integers(1, 6)), softcap=st.one_of(st.none(), st.just(5.0)),
       tokens=st.integers(1, 5), past=st.integers(0, 4), left_pad=st.integers(0, 4), causal=st.booleans(),
       mask=st.booleans(), materialize=st.booleans())
def test_random_shapes(kv_heads, group, head_dim, window, softcap, tokens, past, left_pad, causal, mask,
                       materialize):
    graph = attention_graph(kv_heads * group, kv_heads, head_dim, window, softcap, causal=causal, mask=mask)
    after, changed = apply_pass(GqaBroadcast(materialize=materialize), graph)
    assert changed
    feeds = feeds_for(graph, tokens=tokens, past=past, left_pad=min(left_pad, past + tokens))
    assert compare_outputs(graph, after, feeds) <= TOLERANCE
