"""RecurrentGemma (``frontends.hf.families_recurrent_gemma``) against transformers'
``RecurrentGemmaForCausalLM``: tiny random twins (rows of the twin harness, test_hf_twins.py:
unpadded rows and an equal-length batch as ``unmasked`` holds them) saved with save_pretrained
and loaded with load_spec(folder) give transformers' logits and its 16 greedy tokens (the conv and RG-LRU
states and the attention cache fed back step by step) through the reference interpreter and
both ONNX targets in ONNX Runtime; Triton (in its interpreter) and the NumPy emitter against
the reference interpreter; onnx-npu gives transformers' greedy tokens; the default config counts
transformers' parameters.

transformers' recurrent blocks ignore ``attention_mask`` (only the local attention reads it)
and reset the RG-LRU where ``position_ids`` is 0, so a left-padded row is held against
transformers given the same mask and positions (``prompts``: 0 on the padding), and unpadded
rows and a batch of equal lengths against its plain forward."""
import json

import numpy as np
import pytest

from frontends import load_spec
from tests.frontends.test_hf_models import NEW_TOKENS, TOLERANCE, hf_greedy_tokens, prompts, relative_error
from tests.frontends.twins import ALONE, family, models_fixture
from tests.frontends.unmasked import (assert_onnx_npu_generates, assert_ort_rows_match, assert_triton_and_numpy_match,
                                      hf_logits, plain_causal_lm, rows, run_irc)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=1, attention_window_size=5, bos_token_id=0, eos_token_id=0, pad_token_id=0)
CASES = {  # name: overrides of SMALL
    # MQA over a 5-token window (the 11-token prompt outruns it), partial rotary 0.5, tied head
    "recurrent-gemma": {},
    # a wider RG-LRU than the stream, GQA with q/k/v biases, every other layer attention, exact GELU,
    # a 3-wide convolution, an untied head, rotary over a quarter of each head
    "recurrent-gemma-wide": dict(lru_width=48, num_key_value_heads=2, attention_bias=True, num_hidden_layers=4,
                                 block_types=["recurrent", "attention"], hidden_activation="gelu", conv1d_width=3,
                                 tie_word_embeddings=False, logits_soft_cap=5.0,
                                 rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                                  "partial_rotary_factor": 0.25}),
}


def randomize(model, seed: int) -> None:
    """Vectors (norm weights around 0: the norms scale by 1 + w, biases, Λ) of scale 0.3,
    matrices of unit-scale activations; a tied embedding small (0.03), or each token's own
    row wins its next-token logits and greedy decoding repeats it."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight") and model.config.tie_word_embeddings:
                p.copy_(0.03 * torch.randn(p.shape, generator=generator))
            elif p.ndim == 1:
                p.copy_(0.3 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * p.shape[-1] ** -0.5)


TWINS = family("RecurrentGemmaConfig", SMALL, CASES, checks=(ALONE,), make=plain_causal_lm, randomizer=randomize)


models = models_fixture(TWINS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_left_padded_batch_matches_transformers_given_the_same_positions(models, name):
    model, folder = models(name)
    ids, mask, positions = prompts()
    got = run_irc(load_spec(folder), ids, mask, positions)["logits"]
    real = mask.astype(bool)
    assert relative_error(got[real], hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_generation_matches(models, name):
    from irc.interpreter import generate

    model, folder = models(name)
    graph = load_spec(folder)
    for prompt in rows():
        want = hf_greedy_tokens(model, prompt, NEW_TOKENS)
        assert len(set(want)) > 2  # the twin's continuation is not one token repeated
        assert generate(graph, prompt, NEW_TOKENS)[0] == want


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_runtime_matches_transformers(models, tmp_path, name, target):
    """``irc compile --target {onnx,onnx-ort}``, run in ONNX Runtime: each prompt alone and the
    equal-length batch, then the left-padded batch: prefill logits and 16 greedy tokens with
    the states and the cache fed back."""
    from backends.onnx import runtime

    model, folder = models(name)
    assert_ort_rows_match(model, folder, tmp_path, target)
    path, graph = tmp_path / "model.onnx", load_spec(folder)
    ids, mask, positions = prompts()
    _ort_padded(runtime, str(path), graph, hf_logits(model, ids, mask, positions)[:, -1:], hf_padded_greedy(model))


def hf_padded_greedy(model) -> np.ndarray:
    """transformers' greedy continuation of the left-padded batch (``prompts``): its pad tokens
    pass through the convolutions, so the short row's tokens are not its unpadded ones."""
    ids, mask, _ = prompts()
    with torch.no_grad():
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=NEW_TOKENS,
                             do_sample=False)
    return out[:, ids.shape[1]:].numpy()


def _ort_padded(runtime, path, graph, want_last, want_tokens) -> None:
    """ONNX Runtime on the two prompts as one left-padded batch (``runtime.greedy`` pads them)."""
    result = runtime.greedy(runtime.ort_engine(path), graph, rows(), NEW_TOKENS)
    assert relative_error(result["prefill"]["logits"], want_last) <= TOLERANCE
    np.testing.assert_array_equal(result["tokens"], want_tokens)


def test_triton_and_numpy_match_the_reference(models, tmp_path):
    """The RG-LRU as a torch fallback under Triton; the NumPy module bit for bit."""
    _, folder = models("recurrent-gemma-wide")
    assert_triton_and_numpy_match(folder, tmp_path, "recurrent_gemma")


def test_onnx_npu_generates_transformers_tokens(models, tmp_path):
    """The RG-LRU a token at a time on onnx-npu (backends/onnx_npu/recurrent_steps.py) beside
    the windowed MQA with partial rotary."""
    model, folder = models("recurrent-gemma")
    assert_onnx_npu_generates(model, folder, tmp_path)


def test_state_is_graph_io_in_irc_names(models):
    from irc.analysis import analyze

    graph = load_spec(models("recurrent-gemma")[1])
    inputs, outputs = [v.name for v in graph.inputs], [v.name for v in graph.outputs]
    for i in (0, 1):  # recurrent, recurrent, attention
        for kind in ("conv_state", "recurrent_state"):
            assert f"past_key_values.{i}.{kind}" in inputs and f"present.{i}.{kind}" in outputs
    assert "past_key_values.2.key" in inputs and "past_key_values.0.key" not in inputs
    layers = analyze(graph)["layers"] if "layers" in analyze(graph) else None
    assert analyze(graph)["state_bytes_per_sequence"] == 2 * 4 * (32 * 3 + 32)
    assert layers is None or [layer["mixer"] for layer in layers][:3] == ["rg_lru", "rg_lru", "attention"]


def test_default_config_counts_transformers_parameters(tmp_path):
    """RecurrentGemmaConfig's defaults (recurrentgemma-2b's sizes): irc's parameter count is
    transformers' (the head tied)."""
    from irc.analysis import analyze

    config = transformers.RecurrentGemmaConfig()
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    want = sum(p.numel() for p in model.parameters())
    assert analyze(load_spec(tmp_path))["params_total"] == want


@pytest.mark.parametrize("key, value, fragment", [
    ("hidden_activation", "silu", "hidden_activation"),
    ("block_types", ["recurrent", "mlp"], "block_types"),
    ("lru_width", 30, "lru_width"),
])
def test_refusals_name_the_key(tmp_path, key, value, fragment):
    from irc.errors import SpecError

    config = transformers.RecurrentGemmaConfig(**SMALL).to_dict()
    config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecError, match=fragment):
        load_spec(tmp_path)
