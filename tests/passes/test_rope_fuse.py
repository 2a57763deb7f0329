"""rope-fuse: decomposed RoPE (rotate-half; interleaved as pairs or strided slices; cos/sin
computed from positions or gathered from tables; full or partial) back into one rope op,
and the reasons it gives when it refuses."""
import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from irc.interpreter import random_feeds
from frontends.yaml_spec import loads
from irc.build import emit, emit1
from irc.dtypes import DType
from irc.graph import Graph
from irc.ops.rope import rope_inv_freq
from irc.printer import print_graph
from irc.testing import apply_pass, assert_pass, assert_unchanged
from irc.check import compare_outputs
from passes.rope_fuse import RopeFuse

F32 = DType.f32
TOLERANCE = 1e-6
TABLE_ROWS = 64
TRIG_OPS = {"cos", "sin", "gather"}


# ---- decomposed RoPE, written the ways model code writes it ---------------------------------

def _trig(g, positions, rotary, layout, form, tables, base, name):
    """cos/sin for ``form`` ("half": cat(f, f); "strided": f repeated per pair; "pairs": f per
    pair on a trailing axis of 1), broadcastable over heads in ``layout``."""
    batch, seq = positions.shape
    half = rotary // 2
    inv_freq = rope_inv_freq(rotary, base)[0]
    if tables == "params":
        angles = np.arange(TABLE_ROWS, dtype=np.float32)[:, None] * inv_freq
        if form in ("half", "backwards"):
            angles = np.concatenate([angles, angles], axis=-1)
        elif form == "strided":
            angles = np.repeat(angles, 2, axis=-1)
        out = []
        for fn in ("cos", "sin"):
            table = g.add_param(f"{name}.{fn}_table", F32, angles.shape, getattr(np, fn)(angles).astype(np.float32))
            out.append(emit1(g, "gather", [table, positions], {"axis": 0}, f"{name}.{fn}"))
    else:
        if tables == "input":  # angles from a float input: not a position source
            freqs = g.add_input(f"{name}.angles", F32, (batch, seq, half))
        else:
            pos = emit1(g, "cast", [positions], {"to": "f32"}, f"{name}.pos")
            pos = emit1(g, "reshape", [pos], {"shape": [batch, seq, 1]}, f"{name}.pos_BT1")
            inv = emit1(g, "constant", [], {"value": inv_freq.astype(float).tolist()}, f"{name}.inv_freq")
            freqs = emit1(g, "mul", [pos, inv], None, f"{name}.freqs")
        if form in ("half", "backwards"):
            freqs = emit1(g, "concat", [freqs, freqs], {"axis": -1}, f"{name}.emb")
        elif form == "strided":
            col = emit1(g, "reshape", [freqs], {"shape": [batch, seq, half, 1]}, f"{name}.col")
            pair = emit1(g, "concat", [col, col], {"axis": -1}, f"{name}.pair")
            freqs = emit1(g, "reshape", [pair], {"shape": [batch, seq, rotary]}, f"{name}.emb")
        out = [emit1(g, fn, [freqs], None, f"{name}.{fn}") for fn in ("cos", "sin")]
    width = [half, 1] if form == "pairs" else [out[0].shape[-1]]
    shape = [batch, seq, 1] + width if layout == "BTND" else [batch, 1, seq] + width
    return [emit1(g, "reshape", [t], {"shape": shape}, f"{t.name}_heads") for t in out]


def decomposed_rope(g, x, positions, heads, head_dim, form, rotary=None, tables="computed", layout="BTND",
                    base=10000.0, table_form=None, trig=None):
    """x [B,T,N*D] rotated by primitives; ``form`` half | pairs | strided | backwards."""
    name = x.name + "_rope"
    batch, seq = x.shape[:2]
    rotary = rotary or head_dim
    half = rotary // 2

    def e(op, inputs, attrs, role):
        return emit1(g, op, inputs, attrs, f"{name}.{role}")

    cos, sin = trig or _trig(g, positions, rotary, layout, table_form or form, tables, base, name)
    split = e("reshape", [x], {"shape": [batch, seq, heads, head_dim]}, "heads")
    if layout == "BNTD":
        split = e("transpose", [split], {"perm": [0, 2, 1, 3]}, "heads_first")
    part = split if rotary == head_dim else e("slice", [split], {"axis": -1, "end": rotary}, "rotary")
    if form in ("half", "backwards"):
        x1, x2 = e("slice", [part], {"axis": -1, "end": half}, "x1"), e("slice", [part], {"axis": -1, "start": half}, "x2")
        if form == "half":
            rotated = e("concat", [e("neg", [x2], None, "neg"), x1], {"axis": -1}, "rotated")
        else:
            rotated = e("concat", [x2, e("neg", [x1], None, "neg")], {"axis": -1}, "rotated")
    elif form == "pairs":
        part = e("reshape", [part], {"shape": list(part.shape[:-1]) + [half, 2]}, "pairs")
        even, odd = e("slice", [part], {"axis": -1, "end": 1}, "even"), e("slice", [part], {"axis": -1, "start": 1}, "odd")
        rotated = e("concat", [e("neg", [odd], None, "neg"), even], {"axis": -1}, "rotated")
    else:
        column = list(part.shape[:-1]) + [half, 1]
        even = e("strided_slice", [part], {"axis": -1, "start": 0, "step": 2}, "even")
        odd = e("strided_slice", [part], {"axis": -1, "start": 1, "step": 2}, "odd")
        stack = e("concat", [e("reshape", [e("neg", [odd], None, "neg")], {"shape": column}, "odd_col"),
                             e("reshape", [even], {"shape": column}, "even_col")], {"axis": -1}, "stack")
        rotated = e("reshape", [stack], {"shape": list(part.shape)}, "rotated")
    out = e("add", [e("mul", [part, cos], None, "cos_part"), e("mul", [sin, rotated], None, "sin_part")], None, "sum")
    if form == "pairs":
        out = e("reshape", [out], {"shape": list(split.shape[:-1]) + [rotary]}, "unpaired")
    if rotary < head_dim:
        out = e("concat", [out, e("slice", [split], {"axis": -1, "start": rotary}, "pass")], {"axis": -1}, "joined")
    if layout == "BNTD":
        out = e("transpose", [out], {"perm": [0, 2, 1, 3]}, "heads_last")
    return emit1(g, "reshape", [out], {"shape": [batch, seq, heads * head_dim]}, name)


def rope_graph(q_form="half", k_form=None, v_form=None, heads=4, kv_heads=2, head_dim=8, **options) -> Graph:
    """q/k/v inputs, decomposed RoPE on q and k (k_form defaults to q's), attention."""
    g = Graph("rope")
    positions = g.add_input("position_ids", DType.i64, ("B", "T"))
    q = g.add_input("q", F32, ("B", "T", heads * head_dim))
    k = g.add_input("k", F32, ("B", "T", kv_heads * head_dim))
    v = g.add_input("v", F32, ("B", "T", kv_heads * head_dim))
    q = decomposed_rope(g, q, positions, heads, head_dim, q_form, **options)
    k = decomposed_rope(g, k, positions, kv_heads, head_dim, k_form or q_form, **options)
    if v_form:
        v = decomposed_rope(g, v, positions, kv_heads, head_dim, v_form, **options)
    g.outputs = emit(g, "attention", [q, k, v], {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim}, "out")
    return g


def feeds_for(graph, tokens=4, past=3, seed=0):
    return random_feeds(graph, batch=2, tokens=tokens, past=past, seed=seed)


def fuse(graph, **kw):
    """assert_pass (golden, numbers at 1e-6, idempotence); returns the fused graph."""
    assert assert_pass(RopeFuse(), graph, rtol=TOLERANCE, feeds=feeds_for(graph), **kw)
    after, _ = apply_pass(RopeFuse(), graph)
    assert not {n.op for n in after.nodes} & TRIG_OPS
    return after


def ropes(graph) -> list:
    return [n.attrs for n in graph.nodes if n.op == "rope"]


# ---- fusions --------------------------------------------------------------------------------

def test_rotate_half_golden():
    after = fuse(rope_graph("half", heads=2, kv_heads=1, head_dim=8), golden="rope-fuse")
    assert [a["convention"] for a in ropes(after)] == ["half", "half"]


def test_interleaved_pairs_golden():
    after = fuse(rope_graph("pairs", heads=2, kv_heads=1, head_dim=8), golden="rope-fuse-interleaved")
    assert [a["convention"] for a in ropes(after)] == ["interleaved", "interleaved"]


@pytest.mark.parametrize("form,convention", [("half", "half"), ("pairs", "interleaved"), ("strided", "interleaved")])
@pytest.mark.parametrize("tables", ["computed", "params"])
@pytest.mark.parametrize("layout", ["BTND", "BNTD"])
def test_forms_tables_layouts(form, convention, tables, layout):
    after = fuse(rope_graph(form, tables=tables, layout=layout, rotary=4, base=500000.0))
    assert ropes(after) == [{"base": 500000.0, "convention": convention, "head_dim": 8, "mrope": None,
                             "rotary_dim": 4, "scaling": None}] * 2
    assert not after.params  # the tables went with the decomposition


def test_partial_rotary_fuses_into_the_activation():
    after = fuse(rope_graph("half", rotary=4))
    text = print_graph(after)
    assert "slice" not in text and "concat" not in text and "reshape" not in text


# ---- refusals, with reasons -----------------------------------------------------------------

def refused(graph, caplog) -> list:
    with caplog.at_level(logging.DEBUG, logger="irc.passes.rope_fuse"):
        p = RopeFuse()
        assert_unchanged(p, graph)
    assert p.notes and all(n in caplog.text for n in p.notes)
    return p.notes


def test_rope_on_v_is_refused(caplog):
    graph = rope_graph("half", v_form="half")
    notes = []
    with caplog.at_level(logging.DEBUG, logger="irc.passes.rope_fuse"):
        p = RopeFuse()
        after, changed = apply_pass(p, graph)
        notes = p.notes
    assert changed and len(ropes(after)) == 2  # q and k fuse; v is left as written
    assert len(notes) == 1 and "RoPE applied to V" in notes[0] and notes[0] in caplog.text
    assert compare_outputs(graph, after, feeds_for(graph)) <= TOLERANCE


def test_mismatched_q_k_conventions_are_refused(caplog):
    notes = refused(rope_graph("half", k_form="pairs"), caplog)
    assert len(notes) == 2 and all("different rope settings" in n and "convention" in n for n in notes)


def test_backwards_rotation_is_wrong_convention(caplog):
    (note, _) = refused(rope_graph("backwards"), caplog)
    assert "wrong convention" in note and "cat(x2, -x1)" in note


def test_rotation_and_table_layouts_disagree(caplog):
    notes = refused(rope_graph("half", table_form="strided"), caplog)
    assert "wrong convention" in notes[0] and "laid out for interleaved pairs" in notes[0]


def test_position_source_not_recognised(caplog):
    notes = refused(rope_graph("half", tables="input"), caplog)
    assert "position source not recognised" in notes[0]


def test_odd_dimension(caplog):
    g = Graph("odd")
    positions = g.add_input("position_ids", DType.i64, ("B", "T"))
    x = g.add_input("x", F32, ("B", "T", 5))
    pos = emit1(g, "reshape", [emit1(g, "cast", [positions], {"to": "f32"})], {"shape": ["B", "T", 1]})
    angles = emit1(g, "mul", [pos, emit1(g, "constant", [], {"value": [1.0, 0.1, 0.01, 0.1, 0.01]})])
    trig = [emit1(g, "reshape", [emit1(g, fn, [angles])], {"shape": ["B", "T", 1, 5]}) for fn in ("cos", "sin")]
    g.outputs = [decomposed_rope(g, x, positions, 1, 5, "half", trig=trig)]
    assert "odd dimension" in refused(g, caplog)[0]


def test_frequencies_not_recognised(caplog):
    g = rope_graph("half")
    for node in g.nodes:
        if node.op == "constant":
            node.attrs["value"] = [1.0, 0.3, 0.2, 0.01]  # not base ** (-2i/R) for any base
    assert "frequencies not recognised" in refused(g, caplog)[0]


def test_nothing_to_fuse(tiny_llama):
    p = RopeFuse()
    assert_unchanged(p, tiny_llama)
    assert_unchanged(p, loads(TINY.format(rope="{base: 10000}")))
    assert p.notes == []


# ---- whole models through the DSL's decomposed option --------------------------------------

TINY = """
model:
  name: tiny
  vocab_size: 64
  d_model: 32
  n_layers: 2
  attention:
    kind: gqa
    n_heads: 4
    n_kv_heads: 2
    head_dim: 8
    rope: {rope}
  mlp: {{kind: swiglu, d_ff: 48}}
"""


def with_decomposed(text: str) -> str:
    """The spec with ``decomposed: true`` added to its rope settings."""
    if "rope: {" in text:
        return text.replace("rope: {", "rope: {decomposed: true, ", 1)
    return text.replace("    rope:\n", "    rope:\n      decomposed: true\n", 1)


@pytest.mark.parametrize("spec", ["examples/tiny-llama3.yaml", "examples/tiny-mistral-7b.yaml",
                                  "examples/tiny-gemma2-9b.yaml", "examples/tiny-qwen2-7b.yaml"])
def test_dsl_decomposed_examples_fuse_back_to_the_plain_graph(spec):
    text = open(spec).read()
    graph = loads(with_decomposed(text))
    assert {"cos", "sin"} <= {n.op for n in graph.nodes} and not ropes(graph)
    after = fuse(graph)
    assert print_graph(after) == print_graph(loads(text))  # the DSL's own rope ops, names and all


@pytest.mark.parametrize("rope", ["{rotary_dim: 4}", "{convention: interleaved}", "{base: 500000}",
                                  "{convention: interleaved, rotary_dim: 6, scaling: {kind: linear, factor: 4}}",
                                  "{scaling: {kind: yarn, factor: 4, original_max_position: 32}}"])
def test_dsl_decomposed_variants(rope):
    text = TINY.format(rope=rope)
    after = fuse(loads(with_decomposed(text)))
    assert print_graph(after) == print_graph(loads(text))


# ---- random shapes --------------------------------------------------------------------------

@settings(max_examples=15, deadline=None)
@given(kv_heads=st.integers(1, 2), group=st.integers(1, 3), half=st.integers(1, 4), partial=st.booleans(),
       form=st.sampled_from(["half", "pairs", "strided"]), tables=st.sampled_from(["computed", "params"]),
       layout=st.sampled_from(["BTND", "BNTD"]), tokens=st.integers(1, 5), past=st.integers(0, 6))
def test_random_shapes(kv_heads, group, half, partial, form, tables, layout, tokens, past):
    head_dim = 2 * half + (2 if partial else 0)
    graph = rope_graph(form, heads=kv_heads * group, kv_heads=kv_heads, head_dim=head_dim, rotary=2 * half,
                       tables=tables, layout=layout)
    after, changed = apply_pass(RopeFuse(), graph)
    assert changed and len(ropes(after)) == 2
    assert compare_outputs(graph, after, feeds_for(graph, tokens, past)) <= TOLERANCE


def test_dsl_decomposed_option_errors():
    from frontends.dsl import ArgError, Rope
    from irc.errors import SpecError
    with pytest.raises(ArgError, match="decomposed"):
        Rope(decomposed="yes")
    dynamic = "{scaling: {kind: dynamic, factor: 2, original_max_position: 32}}"
    with pytest.raises(SpecError, match=r"rope.decomposed: dynamic scaling"):
        loads(with_decomposed(TINY.format(rope=dynamic)))
    mla = open("examples/tiny-deepseek-v2.yaml").read()
    with pytest.raises(SpecError, match=r"rope.decomposed: mla_attention"):
        loads(with_decomposed(mla))
