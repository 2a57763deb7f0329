"""The onnx-ort speed options against the reference interpreter: every tied-head layout,
RoPE and q|k|v inside GroupQueryAttention or not, and last-position logits, on a
left-padded batch and a greedy decode with the KV cache (``test_onnx_models`` helpers).
Their speed is measured in ``benchmarks/cpu_speed.py``; their graphs are held by
``test_onnx_op_histogram``, and each tied-head layout's reader of the table here."""
import numpy as np
import onnx
import pytest

import passes  # noqa: F401  (registers the passes)
from backends.onnx.emit import emit_model
from backends.onnx.runtime import greedy, ort_engine
from backends.onnx.targets import postlude, resolve_tied_head, resolve_unfused, whole_pipeline
from frontends import load_spec
from irc.check import relative_error
from irc.errors import BackendError
from irc.passmanager import PassManager, parse_pipeline
from tests.backends.test_onnx_models import NEW_TOKENS, PROMPTS, RTOL, assert_matches, reference

TIED = "examples/tiny-gemma2-9b.yaml"   # tied head, softcaps, windows
LLAMA = "examples/tiny-llama3.yaml"


ALL = {"logits": "all"}  # every position compared with the reference


def run(spec, target, tmp_path, options, **emit_options):
    graph = load_spec(spec)
    PassManager(parse_pipeline(whole_pipeline(target, options))).run(graph)
    path = tmp_path / f"{target}-{len(list(tmp_path.iterdir()))}.onnx"
    emit_model(graph, str(path), target=target, context=64, **emit_options)
    return greedy(ort_engine(str(path)), graph, PROMPTS, NEW_TOKENS)


@pytest.mark.parametrize("target,layout", [("onnx-ort", "fused"), ("onnx-ort", "gemm"), ("onnx-ort", "transpose"),
                                           ("onnx", "gemm"), ("onnx", "transpose")])
def test_tied_head_layouts_match_the_reference(tmp_path, target, layout):
    assert_matches(run(TIED, target, tmp_path, ALL, tied_head=layout), reference(TIED))
    assert head_reader(next(tmp_path.glob("*.onnx"))) == HEAD_READER[layout]


HEAD_READER = {"fused": "FusedMatMul", "gemm": "Gemm", "transpose": "Transpose"}  # the layout asked for


def head_reader(path) -> str:
    """The op that reads the embedding table as the head: each ``--tied-head`` layout has its
    own (a layout silently replaced by another would still match the reference)."""
    model = onnx.load(str(path), load_external_data=False)
    table = next(n.input[0] for n in model.graph.node if n.op_type == "Gather" and n.input[1] == "input_ids")
    readers = {n.op_type for n in model.graph.node if table in n.input and n.op_type != "Gather"}
    assert len(readers) == 1, readers
    return readers.pop()


@pytest.mark.parametrize("unfused", [frozenset({"gqa-rope"}), frozenset({"pack-qkv"})])
def test_gqa_fusions_off_match_the_reference(tmp_path, unfused):
    assert_matches(run(LLAMA, "onnx-ort", tmp_path, ALL, unfused=unfused), reference(LLAMA))


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_last_logits_are_the_default_and_give_the_last_row(tmp_path, target):
    ours, ref = run(TIED, target, tmp_path, {}), reference(TIED)
    assert ours["prefill"]["logits"].shape[1] == 1
    assert relative_error(ours["prefill"]["logits"][:, 0], ref["prefill"]["logits"][:, -1]) <= RTOL
    np.testing.assert_array_equal(ours["tokens"], ref["tokens"])
    assert max(relative_error(a, b) for a, b in zip(ours["steps"], ref["steps"])) <= RTOL


def test_bad_speed_options_are_one_message():
    with pytest.raises(BackendError, match="FusedMatMul"):
        resolve_tied_head("onnx", {"tied_head": "fused"})
    with pytest.raises(BackendError, match="not a fusion"):
        resolve_unfused({"unfuse": "gqa-rope,qkv"})
    with pytest.raises(BackendError, match="--logits"):
        postlude({"logits": "first"})
