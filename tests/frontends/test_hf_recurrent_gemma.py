"""RecurrentGemma (``frontends.hf.families_recurrent_gemma``) against transformers'
``RecurrentGemmaForCausalLM``: tiny random twins saved with save_pretrained and loaded with
load_spec(folder) give transformers' logits and its 16 greedy tokens (the conv and RG-LRU
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
from irc.interpreter import Interpreter
from tests.frontends.test_hf_models import (NEW_TOKENS, TOLERANCE, built_once, hf_greedy_tokens, prompts,
                                            relative_error, save_twin)
from tests.frontends.test_hf_rwkv import assert_onnx_npu_generates, assert_triton_and_numpy_match, equal_batch, rows

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


def build_case(name: str, folder):
    config = transformers.RecurrentGemmaConfig(**{**SMALL, **CASES[name]})
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    randomize(model, seed=sorted(CASES).index(name))
    return save_twin(model, folder)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return built_once(build_case, tmp_path_factory)


def run_irc(graph, ids, mask=None, positions=None) -> dict:
    """Prefill outputs from zero states and an empty cache."""
    mask = np.ones_like(ids) if mask is None else mask
    positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape) if positions is None else positions
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": np.ascontiguousarray(positions)}
    for value in graph.inputs:
        if value.name.startswith("past_key_values."):
            shape = tuple(0 if isinstance(s, str) else s for s in value.shape[1:])
            feeds[value.name] = np.zeros((len(ids),) + shape, np.float32)
    return Interpreter(graph).run(feeds)


def hf_logits(model, ids, mask=None, positions=None) -> np.ndarray:
    def tensor(a):
        return None if a is None else torch.from_numpy(np.ascontiguousarray(a))

    with torch.no_grad():
        out = model(input_ids=tensor(ids), attention_mask=tensor(mask), position_ids=tensor(positions), use_cache=True)
    return out.logits.float().numpy()


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_rows_and_an_equal_length_batch(models, name):
    model, folder = models(name)
    graph = load_spec(folder)
    for ids in [np.asarray([row]) for row in rows()] + [equal_batch()]:
        assert relative_error(run_irc(graph, ids)["logits"], hf_logits(model, ids)) <= TOLERANCE


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
    from irc_cli.commands import main

    model, folder = models(name)
    path = tmp_path / "model.onnx"
    assert main(["compile", str(folder), "--target", target, "-o", str(path), "--quiet"]) == 0
    engine, graph = runtime.ort_engine(str(path)), load_spec(folder)
    for prompts_ in [[row] for row in rows()] + [equal_batch().tolist()]:
        result = runtime.greedy(engine, graph, prompts_, NEW_TOKENS)
        want = hf_logits(model, np.asarray(prompts_))[:, -1:]  # the compiled graph's logits: the last token's
        assert relative_error(result["prefill"]["logits"], want) <= TOLERANCE
        tokens = np.stack([hf_greedy_tokens(model, prompt, NEW_TOKENS) for prompt in prompts_])
        np.testing.assert_array_equal(result["tokens"], tokens)
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
