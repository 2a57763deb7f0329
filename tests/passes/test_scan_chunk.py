"""scan-chunk: every ssd and gated_delta_rule node gets ``chunk``, and the reference
interpreter then computes its prefill in chunks; held equal to the sequential form on
prefills that are and are not a multiple of the chunk, over non-zero states, with left
padding; decode (T = 1) is the step form to the bit; Mamba-1 is left with a note; the
``changed`` flag both ways; every tiny example with recurrent layers under the numeric check."""
import os

import numpy as np
import pytest

import passes  # noqa: F401  (registers the passes)
from backends.onnx.targets import TARGETS
from frontends import load_spec
from irc.build import emit
from irc.check import compare_outputs, run_reference
from irc.dtypes import DType
from irc.errors import PassError
from irc.graph import Graph
from irc.interpreter import random_feeds
from irc.parser import parse_graph
from irc.passmanager import PassManager, parse_pipeline
from irc.printer import print_graph
from irc.testing import apply_pass, assert_pass, assert_unchanged
from passes.scan_chunk import ScanChunk

F32 = DType.f32
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
RECURRENT = ["tiny-falcon-h1-7b.yaml", "tiny-granite-4.0-h-small.yaml", "tiny-jamba-1.5-mini.yaml",
             "tiny-lfm2-1.2b.yaml", "tiny-mamba2-2.7b.yaml", "tiny-nemotron-h-8b.yaml", "tiny-qwen3-next-80b-a3b.yaml"]
RTOL = 1e-5


def hybrid() -> Graph:
    """One Mamba-2 ssd (groups 2 of 2 heads), one gated delta rule (2 value heads on 1 key
    head) and one Mamba-1 selective_scan, each over its own inputs and past state, one mask."""
    g = Graph("hybrid")
    mask = g.add_input("attention_mask", DType.i64, ("B", "P+T"))

    def activation(name, width):
        return g.add_input(name, F32, ("B", "T", width))

    def state(i, shape):
        return g.add_input(f"past_key_values.{i}.recurrent_state", F32, ("B",) + shape)

    def params(layer, **shapes):
        return [g.add_param(f"layers.{layer}.{name}", F32, shape) for name, shape in shapes.items()]

    ssd_in = [activation("x", 16), activation("dt", 4), *params(0, A_log=(4,)), activation("B", 8), activation("C", 8),
              *params(0, D=(4,), dt_bias=(4,)), state(0, (4, 4, 4)), mask]
    ssd = emit(g, "ssd", ssd_in, {"heads": 4, "head_dim": 4, "groups": 2, "state_size": 4, "dt_max": 2.0},
               ["y0", "present.0.recurrent_state"])
    delta_in = [activation("q", 4), activation("k", 4), activation("v", 8), activation("a", 2), activation("b", 2),
                *params(1, A_log=(2,), dt_bias=(2,)), state(1, (2, 4, 4)), mask]
    delta = emit(g, "gated_delta_rule", delta_in, {"key_heads": 1, "value_heads": 2, "key_dim": 4, "value_dim": 4},
                 ["y1", "present.1.recurrent_state"])
    scan_in = [activation("x2", 4), activation("dt2", 4), *params(2, A_log=(4, 4)), activation("B2", 4),
               activation("C2", 4), *params(2, D=(4,)), None, state(2, (4, 4)), mask]
    scan = emit(g, "selective_scan", scan_in, {}, ["y2", "present.2.recurrent_state"])
    g.outputs = [*ssd, *delta, *scan]
    return g


def feeds(graph: Graph, tokens: int, past: int = 3, left_pad: int = 0, seed: int = 0) -> dict:
    """Random inputs and non-zero past states; the last row's first ``left_pad`` columns padding."""
    out = random_feeds(graph, batch=2, tokens=tokens, past=past, seed=seed, left_pad=left_pad)
    for name in ("b", "a"):  # moderate gates, so the decay and the writes both matter
        if name in out:
            out[name] = (0.5 * out[name]).astype(np.float32)
    return out


def test_scan_chunk_golden_and_numbers():
    """64-token chunks on 70 tokens (a full chunk and 6), a left-padded row, past states."""
    graph = hybrid()
    assert assert_pass(ScanChunk(), graph, golden="scan-chunk", feeds=feeds(graph, 70, left_pad=20), rtol=RTOL)


@pytest.mark.parametrize("tokens", [2, 8, 16, 21, 48])  # within a chunk, whole chunks, whole chunks and a rest
@pytest.mark.parametrize("left_pad", [0, 5])
def test_chunked_equals_sequential(tokens, left_pad):
    graph = hybrid()
    after, changed = apply_pass(ScanChunk(size=8), graph)
    assert changed
    assert {n.op: n.attrs.get("chunk") for n in after.nodes} == {"ssd": 8, "gated_delta_rule": 8,
                                                                  "selective_scan": None}
    assert compare_outputs(graph, after, feeds(graph, tokens, left_pad=left_pad, seed=tokens)) <= RTOL


def test_the_chunked_form_is_what_runs():
    """The chunked references compute the numbers (float64 inside): a prefill differs from the
    float32 recurrence in its last bits, and a decode step is the recurrence's exactly."""
    graph = hybrid()
    after, _ = apply_pass(ScanChunk(size=4), graph)
    prefill = feeds(graph, 12)
    sequential, chunked = run_reference(graph, prefill), run_reference(after, prefill)
    assert any(not np.array_equal(a, b) for a, b in zip(sequential[:4], chunked[:4]))
    np.testing.assert_array_equal(sequential[4], chunked[4])  # selective_scan: untouched
    step = feeds(graph, 1, past=7, seed=1)
    for a, b in zip(run_reference(graph, step), run_reference(after, step)):
        np.testing.assert_array_equal(a, b)


def test_mamba1_keeps_its_step_form_with_a_note():
    graph = hybrid()
    pass_ = ScanChunk()
    after, _ = apply_pass(pass_, graph)
    assert len(pass_.notes) == 1 and "%y2 (selective_scan, Mamba-1) keeps its step form" in pass_.notes[0]
    assert pass_.report(after) == {"chunk": 64, "chunked": {"ssd": 1, "gated_delta_rule": 1}, "step_only": 1}


def test_unchanged_without_chunkable_layers(tiny_llama):
    assert_unchanged(ScanChunk(), tiny_llama)
    assert_unchanged(ScanChunk(), load_spec(os.path.join(EXAMPLES, "tiny-jamba-1.5-mini.yaml")))  # Mamba-1 only


def test_another_size_is_overwritten_then_idempotent():
    graph, _ = apply_pass(ScanChunk(size=32), hybrid())
    after, changed = apply_pass(ScanChunk(size=64), graph)
    assert changed and all(n.attrs["chunk"] == 64 for n in after.nodes if n.op != "selective_scan")
    assert apply_pass(ScanChunk(size=64), after)[1] is False


def test_the_attribute_round_trips_through_the_text_form():
    after, _ = apply_pass(ScanChunk(size=16), hybrid())
    text = print_graph(after)
    assert text.count("chunk=16") == 2
    assert print_graph(parse_graph(text)) == text


@pytest.mark.parametrize("size", [0, 48, -64, "64", True])
def test_a_size_that_is_not_a_power_of_two_is_refused(size):
    with pytest.raises(PassError, match="size must be a power of two"):
        ScanChunk(size=size)


@pytest.mark.parametrize("text", ["48", "0", "sixty-four", "true", "64.0"])
def test_a_bad_size_in_a_pipeline_is_refused(text):
    with pytest.raises(PassError, match="size must be a power of two"):
        parse_pipeline(f"dce,scan-chunk{{size={text}}}")


def test_the_default_onnx_pipelines_chunk():
    for target in TARGETS.values():
        for opset in (21, 23):
            assert [repr(p) for p in parse_pipeline(target.pipeline(opset))][-1] == "scan-chunk"


@pytest.mark.parametrize("name", RECURRENT)
def test_every_tiny_recurrent_example_under_the_check(name):
    """The pass in a pipeline with the interpreter check, on a prefill of 21 tokens in chunks
    of 8 over random states and a left-padded row."""
    graph = load_spec(os.path.join(EXAMPLES, name))
    inputs = feeds(graph, 21, left_pad=4, seed=2)
    manager = PassManager(parse_pipeline("scan-chunk{size=8}"), checker=lambda a, b: compare_outputs(a, b, inputs))
    manager.run(graph)
    (record,) = manager.records
    chunkable = [n for n in graph.nodes if n.op in ("ssd", "gated_delta_rule")]
    assert record.changed == bool(chunkable) and all(n.attrs["chunk"] == 8 for n in chunkable)
    assert record.check_error <= RTOL, f"{name}: outputs moved by {record.check_error:.3g}"
