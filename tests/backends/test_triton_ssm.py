"""The recurrent ops on the triton target (state-space ops, the gated delta rule): generated
kernels, run by Triton's interpreter against the reference interpreter.

Each op alone in a graph (left padding in the last row, past state in, present state out,
optional operands left off, Mamba-2's Δ clamp and groups, grouped delta-rule heads, the
gated rule with a constant decay, a decay per key channel) is emitted and run: the step
kernels (no ``chunk``), and for ssd and gated_delta_rule the chunked kernels (``chunk``
set) on prefills that are and are not a multiple of the chunk, from a non-zero state, and
a decode step (T = 1: the step kernel even with ``chunk``). A recurrent model's Session
starts from zero states and feeds each present state back as forward() does; a left-padded
prefill of a Mamba-2 model matches the reference, logits and states. (Every recurrent tiny
example runs prefill + 8 decode steps unchunked in test_triton_models, the chunked models
in test_triton_ssm_chunked.)
"""
from __future__ import annotations

from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("triton")  # the optional `triton` extra

from backends.triton.emit import emit_module, load_module  # noqa: E402
from irc.build import emit  # noqa: E402
from irc.check import relative_error  # noqa: E402
from irc.dtypes import DType  # noqa: E402
from irc.graph import Graph  # noqa: E402
from irc.interpreter import Interpreter, past_inputs, present_name, random_feeds  # noqa: E402

from test_triton_models import as_numpy, compile_example  # noqa: E402

BATCH, TOKENS, PAST = 2, 5, 3
PAD = 5   # the last row's first 5 mask columns: 3 past slots and the first 2 new tokens


def operand(graph: Graph, kind: str, name: str, shape, rng):
    """A float graph input (activation, state: [B, ...]) or a param with seeded data."""
    if kind == "param":
        return graph.add_param(name, DType.f32, shape, rng.standard_normal(shape).astype(np.float32) * 0.5)
    return graph.add_input(name, DType.f32, shape)


# op, attrs, operands as (kind, name, shape) or None (left off), in the op's operand order
CASES = {
    "conv_silu_state": ("causal_conv1d", {"activation": "silu"}, [
        ("input", "x", ("B", "T", 6)), ("param", "w", (6, 1, 4)), ("param", "bias", (6,)),
        ("input", "past", ("B", 6, 3)), ("mask",)]),
    "conv_plain_no_bias": ("causal_conv1d", {"activation": None}, [
        ("input", "x", ("B", "T", 6)), ("param", "w", (6, 1, 3)), None, ("input", "past", ("B", 6, 2)), ("mask",)]),
    "conv_no_state": ("causal_conv1d", {"activation": "silu"}, [
        ("input", "x", ("B", "T", 6)), ("param", "w", (6, 1, 4)), ("param", "bias", (6,))]),
    "scan_d_z_state": ("selective_scan", {}, [
        ("input", "x", ("B", "T", 6)), ("input", "dt", ("B", "T", 6)), ("param", "A_log", (6, 4)),
        ("input", "Bm", ("B", "T", 4)), ("input", "Cm", ("B", "T", 4)), ("param", "D", (6,)),
        ("input", "z", ("B", "T", 6)), ("input", "past", ("B", 6, 4)), ("mask",)]),
    "scan_bare": ("selective_scan", {}, [
        ("input", "x", ("B", "T", 6)), ("input", "dt", ("B", "T", 6)), ("param", "A_log", (6, 4)),
        ("input", "Bm", ("B", "T", 4)), ("input", "Cm", ("B", "T", 4)), None, None,
        ("input", "past", ("B", 6, 4)), ("mask",)]),
    "ssd_groups_clamp": ("ssd", {"heads": 4, "head_dim": 3, "groups": 2, "state_size": 5, "dt_min": 0.3,
                                 "dt_max": 1.2}, [
        ("input", "x", ("B", "T", 12)), ("input", "dt", ("B", "T", 4)), ("param", "A_log", (4,)),
        ("input", "Bm", ("B", "T", 10)), ("input", "Cm", ("B", "T", 10)), ("param", "D", (4,)),
        ("param", "dt_bias", (4,)), ("input", "past", ("B", 4, 5, 3)), ("mask",)]),
    "ssd_no_state": ("ssd", {"heads": 4, "head_dim": 3, "state_size": 5}, [
        ("input", "x", ("B", "T", 12)), ("input", "dt", ("B", "T", 4)), ("param", "A_log", (4,)),
        ("input", "Bm", ("B", "T", 5)), ("input", "Cm", ("B", "T", 5))]),
    "delta_rule_state": ("gated_delta_rule", {"key_heads": 2, "value_heads": 4, "key_dim": 3, "value_dim": 2}, [
        ("input", "q", ("B", "T", 6)), ("input", "k", ("B", "T", 6)), ("input", "v", ("B", "T", 8)),
        ("input", "a", ("B", "T", 4)), ("input", "b", ("B", "T", 4)), ("param", "A_log", (4,)),
        ("param", "dt_bias", (4,)), ("input", "past", ("B", 4, 3, 2)), ("mask",)]),
    "delta_rule_no_state": ("gated_delta_rule", {"key_heads": 2, "value_heads": 2, "key_dim": 3, "value_dim": 2,
                                                 "l2_norm": False, "scale": 0.25}, [
        ("input", "q", ("B", "T", 6)), ("input", "k", ("B", "T", 6)), ("input", "v", ("B", "T", 4)),
        ("input", "a", ("B", "T", 2)), ("input", "b", ("B", "T", 2)), ("param", "A_log", (2,))]),
    "delta_gated_constant_decay": ("gated_delta_rule", {"key_heads": 1, "value_heads": 2, "key_dim": 4,
                                                        "value_dim": 3, "update_rule": "gated"}, [
        ("input", "q", ("B", "T", 4)), ("input", "k", ("B", "T", 4)), ("input", "v", ("B", "T", 6)), None, None,
        ("param", "A_log", (2,)), None, ("input", "past", ("B", 2, 4, 3)), ("mask",)]),
    "delta_channel_decay": ("gated_delta_rule", {"key_heads": 2, "value_heads": 2, "key_dim": 3, "value_dim": 2,
                                                 "decay": "channel"}, [
        ("input", "q", ("B", "T", 6)), ("input", "k", ("B", "T", 6)), ("input", "v", ("B", "T", 4)),
        ("input", "a", ("B", "T", 6)), ("input", "b", ("B", "T", 2)), ("param", "A_log", (2,)),
        ("param", "dt_bias", (6,)), ("input", "past", ("B", 2, 3, 2)), ("mask",)]),
    "gated_norm_groups": ("gated_rms_norm", {"eps": 1e-5, "group_size": 4}, [
        ("input", "x", ("B", "T", 12)), ("input", "z", ("B", "T", 12)), ("param", "weight", (12,))]),
    "gated_norm_before_gate": ("gated_rms_norm", {"eps": 1e-6, "norm_before_gate": True}, [
        ("input", "x", ("B", "T", 12)), ("input", "z", ("B", "T", 12)), ("param", "weight", (12,))]),
}


def one_node_graph(case: str, chunk=None) -> Graph:
    op, attrs, specs = CASES[case]
    graph, rng = Graph(case), np.random.default_rng(3)
    inputs = []
    for spec in specs:
        if spec is None:
            inputs.append(None)
        elif spec[0] == "mask":
            inputs.append(graph.add_input("attention_mask", DType.i64, ("B", "P+T")))
        else:
            inputs.append(operand(graph, *spec, rng))
    graph.outputs = emit(graph, op, inputs, attrs, ["y", "present"])
    if chunk is not None:
        graph.nodes[-1].attrs["chunk"] = chunk
    return graph


def feeds_for(graph: Graph, tokens: int = TOKENS) -> dict:
    feeds = random_feeds(graph, batch=BATCH, tokens=tokens, past=PAST, seed=4)
    if "attention_mask" in feeds:
        feeds["attention_mask"][-1, :PAD] = 0
    if "dt" in feeds:
        feeds["dt"] = feeds["dt"] * 2.0  # softplus spread across the ssd clamp
    return feeds


def run_both(graph: Graph, path, tokens: int = TOKENS):
    """The emitted module, after checking its outputs against the reference's on
    ``feeds_for(graph, tokens)`` (1e-5 relative; padded tokens' outputs 0)."""
    emit_module(graph, str(path))
    module = load_module(str(path))
    feeds = feeds_for(graph, tokens)
    expected = Interpreter(graph).run(feeds)
    actual = module.forward(module.load_weights(), **feeds)
    assert sorted(actual) == sorted(expected)
    for name, want in expected.items():
        got = as_numpy(actual[name])
        assert got.shape == want.shape and got.dtype == want.dtype, name
        assert relative_error(got, want) <= 1e-5, name
    if "attention_mask" in feeds and tokens > PAD - PAST:  # the padded tokens' outputs are 0
        assert not as_numpy(actual["y"])[-1, :PAD - PAST].any()
    return module


@pytest.mark.parametrize("case", sorted(CASES))
def test_recurrent_op_kernel_matches_its_reference(case, tmp_path):
    module = run_both(one_node_graph(case), tmp_path / f"{case}.py")
    generated, torch_ops = module.__doc__.split("Generated kernels")[1].split("Torch ops in the launcher")
    assert "%y" in generated and "%y" not in torch_ops, f"{CASES[case][0]} is not a generated kernel"
    assert not any(name.startswith(("ssd_chunk", "delta_chunk")) for name in module.KERNEL_SPECS)


CHUNKED = sorted(case for case, (op, _, _) in CASES.items() if op in ("ssd", "gated_delta_rule"))


@pytest.mark.parametrize("chunk, tokens", [(4, 8), (4, 11), (16, 19)])
@pytest.mark.parametrize("case", CHUNKED)
def test_chunked_prefill_matches_reference(case, chunk, tokens, tmp_path):
    """Chunks of 4 (8 tokens: two whole chunks; 11: a short last chunk) and of 16 (19 tokens),
    left padding in the last row, a past state where the case has one. A per-channel decay
    keeps the step kernel (no chunked kernel is generated for it)."""
    path = tmp_path / f"{case}.py"
    module = run_both(one_node_graph(case, chunk=chunk), path, tokens)
    assert f"chunk={chunk})" in path.read_text()
    chunked = "delta_chunk_scan" if CASES[case][0] == "gated_delta_rule" else "ssd_chunk_scan"
    assert chunked in module.KERNEL_SPECS


@pytest.mark.parametrize("case", ["ssd_groups_clamp", "delta_rule_state"])
def test_decode_step_with_chunk_set_matches_reference(case, tmp_path):
    """T = 1 runs the step kernel whatever the chunk size: one token after the past state."""
    run_both(one_node_graph(case, chunk=4), tmp_path / f"{case}.py", tokens=1)


@pytest.fixture(scope="module")
def mamba2(tmp_path_factory):
    return compile_example("mamba2-2.7b", tmp_path_factory.mktemp("triton_ssm"))


def zero_states(graph, feeds: dict) -> dict:
    return {**feeds, **{v.name: np.zeros_like(feeds[v.name]) for v in past_inputs(graph)}}


def test_session_feeds_the_states_back(mamba2):
    """A Session holds each recurrent state on the device (zeros at first) and copies the
    present state over it after each call: the same logits as forward() fed by hand."""
    import torch

    graph, module = mamba2
    weights = module.load_weights()
    session = module.Session(weights, batch=1, capacity=12)
    assert set(session.states) == {v.name for v in past_inputs(graph)} and not session.storage
    ids = np.array([[3, 1, 4, 1, 5]])
    feeds = zero_states(graph, random_feeds(graph, batch=1, tokens=5))
    feeds["input_ids"] = ids
    expected = module.forward(weights, **feeds)
    assert torch.equal(session(ids)["logits"], expected["logits"])
    for past in range(5, 8):
        token = np.array([[past]])
        feeds = {"input_ids": token, "attention_mask": np.ones((1, past + 1), np.int64),
                 **{v.name: expected[present_name(v.name)] for v in past_inputs(graph)}}
        expected = module.forward(weights, **feeds)
        got = session(token)
        assert torch.equal(got["logits"], expected["logits"])
        for value in past_inputs(graph):
            assert torch.equal(session.states[value.name], expected[present_name(value.name)])


def test_left_padded_prefill_matches_reference(mamba2):
    """Padded tokens change neither state: logits and present states as the reference's."""
    graph, module = mamba2
    feeds = zero_states(graph, random_feeds(graph, batch=BATCH, tokens=TOKENS, seed=1, left_pad=2))
    expected = Interpreter(graph).run(feeds)
    actual = module.forward(module.load_weights(), **feeds)
    for name, want in expected.items():
        assert relative_error(as_numpy(actual[name]), want) <= 1e-4, name

