"""RWKV-4 (``frontends.hf.families_rwkv``) against transformers' ``RwkvForCausalLM``: tiny random
twins saved with save_pretrained and loaded with load_spec(folder) give transformers' logits
and its 16 greedy tokens (the token shifts and the WKV state fed back step by step) through
the reference interpreter and both ONNX targets in ONNX Runtime; Triton (in its interpreter)
and the NumPy emitter against the reference interpreter; onnx-npu gives transformers' greedy tokens; the
full-size example counts transformers' parameters.

transformers' RWKV ignores ``attention_mask`` (it warns), so a left-padded row is not the
unpadded prompt there: the twins run unpadded rows one at a time and a batch of rows of
equal length, and the left-padded batch is held against transformers' own padded batch
(irc ignores the mask too). transformers' cache is [B, hidden_size] per WKV entry, so a
model with ``attention_hidden_size`` other than ``hidden_size`` fails in transformers with
``use_cache``: that twin is held on prefill logits without a cache."""
from pathlib import Path

import numpy as np
import pytest

from frontends import load_spec
from irc.interpreter import Interpreter
from tests.frontends.test_hf_models import (NEW_TOKENS, TOLERANCE, built_once, hf_greedy_tokens, prompts,
                                            relative_error, save_twin)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hf"
SMALL = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, context_length=64, bos_token_id=0, eos_token_id=0,
             pad_token_id=0)
CASES = {  # name: overrides of SMALL
    "rwkv": dict(intermediate_size=48),
    # every layer rescaled (2^-i on output and value, the stream halved after each), tied head; eps 0.05 makes
    # the rescale visible (LayerNorm is scale-invariant but for eps)
    "rwkv-rescale-tied": dict(num_hidden_layers=3, rescale_every=1, tie_word_embeddings=True, layer_norm_epsilon=0.05),
}
PREFILL_CASES = {"rwkv-attention-size": dict(attention_hidden_size=24, intermediate_size=40, rescale_every=0)}
ALL_CASES = {**CASES, **PREFILL_CASES}


def randomize(model, seed: int) -> None:
    """LayerNorm weights near 1, mixes in [0, 1], decays and bonuses of unit scale, matrices
    of unit-scale activations."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "time_mix" in name:
                p.copy_(torch.rand(p.shape, generator=generator))
            elif name.endswith(("time_decay", "time_first")):
                p.copy_(torch.randn(p.shape, generator=generator))
            elif p.ndim == 1:
                centre = 1.0 if name.endswith("weight") else 0.0
                p.copy_(centre + 0.2 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * p.shape[-1] ** -0.5)


def build_case(name: str, folder):
    config = transformers.RwkvConfig(**{**SMALL, **ALL_CASES[name]})
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    randomize(model, seed=sorted(ALL_CASES).index(name))
    return save_twin(model, folder)  # saved before any forward: transformers rescales its weights in place then


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return built_once(build_case, tmp_path_factory)


def rows():
    """The two prompts of ``prompts``, unpadded (11 and 6 tokens)."""
    ids, mask, _ = prompts()
    return [ids[row][mask[row] == 1].tolist() for row in range(len(ids))]


def equal_batch() -> np.ndarray:
    return np.random.default_rng(1).integers(1, 128, (2, 9))


def run_irc(graph, ids, mask=None) -> dict:
    """Prefill outputs from zero states."""
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids) if mask is None else mask}
    for value in graph.inputs:
        if value.name.startswith("past_key_values."):
            feeds[value.name] = np.zeros((len(ids),) + tuple(value.shape[1:]), np.float32)
    return Interpreter(graph).run(feeds)


def hf_logits(model, ids, mask=None, use_cache=True) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), use_cache=use_cache,
                    attention_mask=None if mask is None else torch.from_numpy(mask))
    return out.logits.float().numpy()


def assert_rows_and_batch_match(model, folder, use_cache: bool = True) -> None:
    """Each prompt alone and the equal-length batch: the reference interpreter's logits from
    zero states equal transformers'. Shared by the recurrent families without a padding mask."""
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


@pytest.mark.parametrize("name", sorted(ALL_CASES))
def test_logits_match_rows_and_an_equal_length_batch(models, name):
    assert_rows_and_batch_match(*models(name), use_cache=name in CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_left_padding_is_ignored_as_transformers_ignores_it(models, name):
    assert_padded_batch_matches(*models(name))


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_generation_matches(models, name):
    assert_greedy_rows_match(*models(name))


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_runtime_matches_transformers(models, tmp_path, name, target):
    assert_ort_rows_match(*models(name), tmp_path, target)


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


def test_triton_and_numpy_match_the_reference(models, tmp_path):
    """The RWKV ops as torch fallbacks under Triton; the NumPy module bit for bit."""
    _, folder = models("rwkv-rescale-tied")
    assert_triton_and_numpy_match(folder, tmp_path, "rwkv")


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


def test_onnx_npu_generates_transformers_tokens(models, tmp_path):
    """The token shift and the WKV a token at a time on onnx-npu (backends/onnx_npu/recurrent_steps.py)."""
    model, folder = models("rwkv")
    assert_onnx_npu_generates(model, folder, tmp_path)


def test_state_is_graph_io_in_irc_names(models):
    from irc.analysis import analyze

    graph = load_spec(models("rwkv")[1])
    names = [v.name for v in graph.inputs]
    for i in range(2):
        for kind in ("time_shift_state", "recurrent_state", "channel_shift_state"):
            assert f"past_key_values.{i}.{kind}" in names
            assert f"present.{i}.{kind}" in [v.name for v in graph.outputs]
    assert analyze(graph)["state_bytes_per_sequence"] == 2 * 4 * (32 + 32 + 3 * 32)


def test_full_size_example_counts_transformers_parameters():
    from irc.analysis import analyze

    config = transformers.AutoConfig.from_pretrained(EXAMPLES / "rwkv-4-7b")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    want = sum(p.numel() for p in model.parameters())
    got = analyze(load_spec(EXAMPLES / "rwkv-4-7b"))["params_total"]
    assert got == want and round(got / 1e9, 2) == 7.39
