"""Every tiny example through the triton target's default pipeline and the emitted Triton
module (run by Triton's interpreter on CPU): the logits of a prefill and of 8 decode steps
match the reference interpreter's within 1e-4 relative (fp32), each side decoding with
its own KV cache and recurrent states (random at the prefill, then each side's present.*
fed back); a Session (preallocated cache on the device) matches forward(); an int4
model matches its own quantized reference.
"""
from __future__ import annotations

from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("triton")  # the optional `triton` extra

import passes  # noqa: E402,F401  (registers the passes)
from irc.interpreter import Interpreter, past_inputs, present_name, random_feeds  # noqa: E402
from backends.triton import DEFAULT_PIPELINE  # noqa: E402
from backends.triton.emit import emit_module, load_module  # noqa: E402
from frontends import load_spec  # noqa: E402
from irc.passmanager import PassManager, parse_pipeline  # noqa: E402
from irc.check import relative_error  # noqa: E402
from irc.weights import seed_absent  # noqa: E402
from irc.testing import one_graph  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# the decoders (the image encoders: tests/backends/test_vision_targets.py)
TINY = sorted(p.name[len("tiny-"):-len(".yaml")] for p in EXAMPLES.glob("tiny-*.yaml") if one_graph(p)
              if "vision" not in load_spec(str(p)).meta)
BATCH, PROMPT, DECODE_STEPS = 2, 5, 8
TOLERANCE = 1e-4


def compile_example(name: str, directory: Path, pipeline: str = DEFAULT_PIPELINE, chunk=None):
    """(graph after the pipeline, the emitted module) for examples/tiny-<name>.yaml; ``chunk``
    sets the attribute of that name on every ssd and gated_delta_rule node (a chunked
    prefill, as the scan-chunk pass would)."""
    graph = load_spec(str(EXAMPLES / f"tiny-{name}.yaml"))
    seed_absent(graph)  # weights first: mla-absorb folds them
    PassManager(parse_pipeline(pipeline)).run(graph)
    for node in graph.nodes:
        if chunk is not None and node.op in ("ssd", "gated_delta_rule"):
            node.attrs["chunk"] = chunk
    path = directory / f"{name.replace('-', '_')}_tt.py"
    emit_module(graph, str(path), source=f"examples/tiny-{name}.yaml")
    return graph, load_module(str(path))


@pytest.fixture(scope="module", params=TINY)
def compiled(request, tmp_path_factory):
    return compile_example(request.param, tmp_path_factory.mktemp("triton_models"))


def decode_feeds(graph, outputs, past: int, rng) -> dict:
    """One new random token per row after ``past`` positions, the caches and recurrent
    states from ``outputs``."""
    feeds = {"input_ids": rng.integers(0, graph.meta["vocab_size"], size=(BATCH, 1)),
             "attention_mask": np.ones((BATCH, past + 1), np.int64),
             "position_ids": np.full((BATCH, 1), past, np.int64)}
    for value in past_inputs(graph):
        feeds[value.name] = as_numpy(outputs[present_name(value.name)])
    return feeds


def as_numpy(value):
    if isinstance(value, np.ndarray):
        return value
    value = value.cpu()
    return value.float().numpy() if value.is_floating_point() else value.numpy()


def check_prefill_and_decode(graph, module, prompt: int = PROMPT) -> None:
    """A prefill of ``prompt`` random tokens and DECODE_STEPS decode steps, each side (the
    reference interpreter, the emitted module) feeding its own present caches and states
    back: the logits agree within TOLERANCE at every step."""
    weights = module.load_weights()
    reference = Interpreter(graph)
    feeds = random_feeds(graph, batch=BATCH, tokens=prompt, seed=1)
    ref_feeds, tt_feeds = feeds, dict(feeds)
    rng_ref, rng_tt = np.random.default_rng(2), np.random.default_rng(2)
    past = 0
    for step in range(DECODE_STEPS + 1):
        expected = reference.run(ref_feeds)
        actual = module.forward(weights, **tt_feeds)
        error = relative_error(as_numpy(actual["logits"]), expected["logits"])
        assert error <= TOLERANCE, f"step {step}: logits relative error {error:.2e}"
        past += ref_feeds["input_ids"].shape[1]
        ref_feeds = decode_feeds(graph, expected, past, rng_ref)
        tt_feeds = decode_feeds(graph, actual, past, rng_tt)


def test_prefill_and_decode_match_reference(compiled):
    check_prefill_and_decode(*compiled)


def test_session_holds_the_cache(tmp_path):
    """Session writes new K/V rows into its preallocated storage; forward() copies the past."""
    import torch

    graph, module = compile_example("llama3", tmp_path)
    weights = module.load_weights()
    session = module.Session(weights, batch=1, capacity=12)
    ids = np.array([[3, 1, 4, 1, 5]])
    feeds = random_feeds(graph, batch=1, tokens=5)
    feeds["input_ids"] = ids
    expected = module.forward(weights, **feeds)
    assert torch.equal(session(ids)["logits"], expected["logits"])
    for past in range(5, 8):
        token = np.array([[past]])
        feeds = decode_feeds(graph, expected, past, np.random.default_rng(0))
        feeds["input_ids"] = token
        expected = module.forward(weights, **{k: v for k, v in feeds.items()})
        got = session(token)
        assert torch.equal(got["logits"], expected["logits"])
        assert got["present.0.key"].data_ptr() == session.storage["past_key_values.0.key"].data_ptr()
    with pytest.raises(ValueError, match="capacity"):
        session(np.zeros((1, 5), np.int64))


@pytest.mark.parametrize("group", [32, 64])  # 64: d_ff 160's last block of the down projection half padding
def test_int4_model_matches_its_quantized_reference(tmp_path, group):
    graph, module = compile_example("mistral-7b", tmp_path,
                                    DEFAULT_PIPELINE + f",lower-mlp,quantize{{bits=4,group={group}}}")
    assert any(name.startswith("dequant_") for name in module.KERNEL_SPECS)
    feeds = random_feeds(graph, batch=BATCH, tokens=PROMPT, seed=1)
    expected = Interpreter(graph).run(feeds)
    actual = module.forward(module.load_weights(), **feeds)
    assert relative_error(as_numpy(actual["logits"]), expected["logits"]) <= TOLERANCE


def test_row_kernels_read_expanded_operands_as_their_values(tmp_path):
    """An operand that is a stride-0 view (expand of a scalar to rows, or to a vector) is
    read as the values it shows, not past its storage (the row kernels index dense rows)."""
    import torch

    from irc.parser import parse_graph

    graph = parse_graph("""graph t(%x: f32[64,32]) -> (%y: f32[64,32]) {
      %c = constant {value=2.0} : f32[]
      %rows = expand %c {shape=[64,32]} : f32[64,32]
      %d = constant {value=-3.0} : f32[]
      %vector = expand %d {shape=[32]} : f32[32]
      %s = add %x, %rows : f32[64,32]
      %y = mul %s, %vector : f32[64,32]
      return %y
    }""")
    emit_module(graph, str(tmp_path / "t.py"))
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    y = as_numpy(load_module(str(tmp_path / "t.py")).forward({}, x=torch.from_numpy(x))["y"])
    np.testing.assert_allclose(y, (x + 2.0) * -3.0, rtol=1e-6)
