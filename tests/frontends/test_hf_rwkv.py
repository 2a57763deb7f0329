"""RWKV-4 (``frontends.hf.families_rwkv``) against transformers' ``RwkvForCausalLM``: tiny random
twins (rows of the twin harness, test_hf_twins.py, held as ``unmasked`` holds them) saved
with save_pretrained and loaded with load_spec(folder) give transformers' logits and its 16
greedy tokens (the token shifts and the WKV state fed back step by step) through
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

import pytest

from frontends import load_spec
from tests.frontends.twins import ALONE, GREEDY_ALONE, ONNX_ALONE, PADDED_AS_HF, family, models_fixture
from tests.frontends.unmasked import assert_onnx_npu_generates, assert_triton_and_numpy_match, plain_causal_lm

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


# saved before any forward (``build``): transformers rescales its weights in place then
TWINS = family("RwkvConfig", SMALL, ALL_CASES, checks=(ALONE, PADDED_AS_HF, GREEDY_ALONE, ONNX_ALONE),
               make=plain_causal_lm, randomizer=randomize, rows={"rwkv-attention-size": dict(checks=(ALONE,),
                                                                                             hf_cache=False)})


models = models_fixture(TWINS)


def test_triton_and_numpy_match_the_reference(models, tmp_path):
    """The RWKV ops as torch fallbacks under Triton; the NumPy module bit for bit."""
    _, folder = models("rwkv-rescale-tied")
    assert_triton_and_numpy_match(folder, tmp_path, "rwkv")


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
