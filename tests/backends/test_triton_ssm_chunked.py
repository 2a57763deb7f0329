"""Tiny models with ssd or gated_delta_rule layers, their prefill chunked (the ``chunk``
attribute set by hand, as the scan-chunk pass sets it), through the emitted Triton module
in Triton's interpreter against the reference interpreter.

Every such model's chunked prefill (6 tokens in chunks of 4: a whole chunk and a short
one, from random past states) matches the reference's logits and present states; Mamba-2,
Falcon-H1 (attention beside the SSD) and Qwen3-Next (the chunked delta rule) then decode 8
steps with each side's states fed back; a left-padded chunked prefill of Qwen3-Next ends
in the reference's states. (Granite-4.0-H and Nemotron-H decode unchunked in
test_triton_models: their decode steps are the same step kernels.)
"""
from __future__ import annotations

from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import pytest  # noqa: E402

pytest.importorskip("triton")  # the optional `triton` extra

from irc.check import relative_error  # noqa: E402
from irc.interpreter import Interpreter, past_inputs, present_name, random_feeds  # noqa: E402

from test_triton_models import BATCH, TOLERANCE, as_numpy, check_prefill_and_decode, compile_example  # noqa: E402
from test_triton_ssm import zero_states  # noqa: E402

CHUNK, PROMPT = 4, 6
MODELS = ["mamba2-2.7b", "granite-4.0-h-small", "falcon-h1-7b", "nemotron-h-8b", "qwen3-next-80b-a3b"]
DECODED = ["mamba2-2.7b", "falcon-h1-7b", "qwen3-next-80b-a3b"]


def compile_chunked(name: str, directory):
    graph, module = compile_example(name, directory, chunk=CHUNK)
    assert any(kernel.startswith(("ssd_chunk", "delta_chunk")) for kernel in module.KERNEL_SPECS)
    return graph, module


def check_prefill(graph, module, feeds: dict) -> None:
    """Logits and every present state as the reference's."""
    expected = Interpreter(graph).run(feeds)
    actual = module.forward(module.load_weights(), **feeds)
    names = ["logits"] + [present_name(v.name) for v in past_inputs(graph)]
    for name in names:
        error = relative_error(as_numpy(actual[name]), expected[name])
        assert error <= TOLERANCE, f"{name}: relative error {error:.2e}"


@pytest.mark.parametrize("name", MODELS)
def test_chunked_prefill_matches_reference(name, tmp_path):
    graph, module = compile_chunked(name, tmp_path)
    check_prefill(graph, module, random_feeds(graph, batch=BATCH, tokens=PROMPT, seed=1))
    if name in DECODED:
        check_prefill_and_decode(graph, module, prompt=PROMPT)


def test_chunked_left_padded_prefill_matches_reference(tmp_path):
    """Qwen3-Next from zero states, 3 of 7 tokens padded on the left of each row."""
    graph, module = compile_chunked("qwen3-next-80b-a3b", tmp_path)
    check_prefill(graph, module, zero_states(graph, random_feeds(graph, batch=BATCH, tokens=7, seed=1, left_pad=3)))
