"""The steps shared by the recurrent twins whose transformers model ignores ``attention_mask``
(RWKV, xLSTM; RecurrentGemma's recurrent blocks): a left-padded row is not the unpadded
prompt there, so the twins run unpadded rows one at a time and a batch of rows of equal
length, and the left-padded batch is held against transformers' own padded batch (irc
ignores the mask too). ``twins.py`` runs them as the ``ALONE``, ``PADDED_AS_HF``,
``GREEDY_ALONE`` and ``ONNX_ALONE`` checks; Triton, NumPy and onnx-npu are the families' own
tests. No transformers needed to import."""
import numpy as np
import pytest

from frontends import load_spec
from irc.interpreter import Interpreter
from tests.frontends.test_hf_models import NEW_TOKENS, TOLERANCE, hf_greedy_tokens, prompts, relative_error


def plain_causal_lm(config: str, settings: dict):
    """The twin's model as ``AutoModelForCausalLM`` builds it by default (no eager attention
    asked for): a ``Twin``'s ``make``."""
    import transformers

    return transformers.AutoModelForCausalLM.from_config(getattr(transformers, config)(**settings)).eval()


def rows():
    """The two prompts of ``prompts``, unpadded (11 and 6 tokens)."""
    ids, mask, _ = prompts()
    return [ids[row][mask[row] == 1].tolist() for row in range(len(ids))]


def equal_batch() -> np.ndarray:
    return np.random.default_rng(1).integers(1, 128, (2, 9))


def run_irc(graph, ids, mask=None, positions=None) -> dict:
    """Prefill outputs from zero states and an empty cache; ``position_ids`` (0, 1, ... unless
    given) where the graph takes them."""
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids) if mask is None else mask}
    for value in graph.inputs:
        if value.name == "position_ids":
            positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape) if positions is None else positions
            feeds["position_ids"] = np.ascontiguousarray(positions)
        elif value.name.startswith("past_key_values."):
            shape = tuple(0 if isinstance(s, str) else s for s in value.shape[1:])
            feeds[value.name] = np.zeros((len(ids),) + shape, np.float32)
    return Interpreter(graph).run(feeds)


def hf_logits(model, ids, mask=None, positions=None, use_cache=True) -> np.ndarray:
    """transformers' logits; the mask and positions passed only where given."""
    import torch

    extra = {key: torch.from_numpy(np.ascontiguousarray(a))
             for key, a in (("attention_mask", mask), ("position_ids", positions)) if a is not None}
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), use_cache=use_cache, **extra)
    return out.logits.float().numpy()


def assert_rows_and_batch_match(model, folder, use_cache: bool = True) -> None:
    """Each prompt alone and the equal-length batch: the reference interpreter's logits from
    zero states equal transformers'."""
    graph = load_spec(folder)
    for ids in [np.asarray([row]) for row in rows()] + [equal_batch()]:
        got = run_irc(graph, ids)["logits"]
        assert relative_error(got, hf_logits(model, ids, use_cache=use_cache)) <= TOLERANCE


def assert_padded_batch_matches(model, folder) -> None:
    """The left-padded batch: transformers ignores the mask (pad tokens enter the state), irc
    too; the real tokens' logits equal."""
    ids, mask, _ = prompts()
    got = run_irc(load_spec(folder), ids, mask)["logits"]
    real = mask.astype(bool)
    assert relative_error(got[real], hf_logits(model, ids, mask)[real]) <= TOLERANCE


def assert_greedy_rows_match(model, folder) -> None:
    from irc.interpreter import generate

    graph = load_spec(folder)
    for prompt in rows():
        assert generate(graph, prompt, NEW_TOKENS)[0] == hf_greedy_tokens(model, prompt, NEW_TOKENS)


def assert_ort_rows_match(model, folder, tmp_path, target: str) -> None:
    """``irc compile --target {onnx,onnx-ort}``, run in ONNX Runtime: each prompt alone and the
    equal-length batch, prefill logits and 16 greedy tokens with the states fed back."""
    from backends.onnx import runtime
    from irc_cli.commands import main

    path = tmp_path / "model.onnx"
    assert main(["compile", str(folder), "--target", target, "-o", str(path), "--quiet"]) == 0
    engine, graph = runtime.ort_engine(str(path)), load_spec(folder)
    for prompts_ in [[row] for row in rows()] + [equal_batch().tolist()]:
        result = runtime.greedy(engine, graph, prompts_, NEW_TOKENS)
        want = hf_logits(model, np.asarray(prompts_))[:, -1:]  # the compiled graph's logits: the last token's
        assert relative_error(result["prefill"]["logits"], want) <= TOLERANCE
        tokens = np.stack([hf_greedy_tokens(model, prompt, NEW_TOKENS) for prompt in prompts_])
        np.testing.assert_array_equal(result["tokens"], tokens)


def assert_triton_and_numpy_match(folder, tmp_path, family) -> None:
    """Triton's default pipeline in its interpreter: prefill of the equal-length batch and 4
    greedy steps as the reference interpreter's; the NumPy module bit for bit on random states.
    Shared by the recurrent families whose ops Triton runs as torch fallbacks."""
    pytest.importorskip("triton")
    from backends.triton.interpreter import use_interpreter

    use_interpreter()
    from backends.onnx import runtime
    from irc.interpreter import random_feeds
    from tests.backends.test_numpy_emit import assert_matches_interpreter
    from tests.frontends.test_hf_targets import triton_engine

    graph, engine = triton_engine(folder, tmp_path, family)
    reference = load_spec(folder)
    names = {v.name for v in reference.inputs}
    batch = equal_batch().tolist()
    got = runtime.greedy(engine, graph, batch, 4)
    want = runtime.greedy(lambda feeds: Interpreter(reference).run({k: v for k, v in feeds.items() if k in names}),
                          reference, batch, 4)
    assert relative_error(got["prefill"]["logits"], want["prefill"]["logits"]) <= TOLERANCE
    np.testing.assert_array_equal(got["tokens"], want["tokens"])
    assert_matches_interpreter(reference, random_feeds(reference, batch=2, tokens=3, past=2, left_pad=1), tmp_path)


def assert_onnx_npu_generates(model, folder, tmp_path) -> None:
    """The twin compiled for onnx-npu in f32 (chunks of 4, a 32-slot context): its host loop
    continues each unpadded prompt with transformers' 16 greedy tokens."""
    from backends.onnx_npu.host import generate as npu_generate
    from irc_cli.commands import main

    out = tmp_path / "npu"
    assert main(["compile", str(folder), "--target", "onnx-npu", "-o", str(out), "--precision", "f32", "--context",
                 "32", "--chunk", "4", "--quiet"]) == 0
    for prompt in rows():
        assert npu_generate(str(out), prompt, NEW_TOKENS) == hf_greedy_tokens(model, prompt, NEW_TOKENS)
