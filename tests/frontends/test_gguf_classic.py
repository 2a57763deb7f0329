"""The GGUF frontend's classic archs (olmo2, starcoder2, command-r, gpt2, phi2, bloom, mpt)
against transformers: tiny random twins written as llama.cpp's converters write them
(``gguf_writer.write_classic``), read back with ``load_spec``: the logits of a left-padded
batch equal transformers' on the real tokens, the greedy tokens equal, and every param is
the checkpoint's.

MPT's twin is ``mpt-alibi-6-heads``: ``mpt-alibi-clip-scale`` sets ``softmax_scale``, which no
GGUF key carries (llama.cpp scales by head_dim^-0.5), so its clamp is held here with the
model's scale set to llama.cpp's (``test_mpt_clamp_kqv_...``)."""
import math

import numpy as np
import pytest

from frontends import load_spec
from frontends.gguf import load_gguf
from frontends.gguf.families import describe
from frontends.gguf.reader import GGUFFile
from gguf_writer import write_classic
from irc.errors import SpecError
from test_hf_models import (SMALL, TOLERANCE, assert_greedy_matches, build_case, hf_logits, irc_logits, prompts,
                            relative_error)
from twin_fixtures import once_fixture

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NEW_TOKENS = 8
CASES = {"olmo2-post-norms": "olmo2", "starcoder2-biases-window": "starcoder2",
         "cohere-parallel-logit-scale": "command-r", "cohere-qk-norm": "command-r", "gpt2-learned-positions": "gpt2",
         "phi-parallel-head-bias": "phi2", "bloom-alibi-6-heads": "bloom",
         "mpt-alibi-6-heads": "mpt"}  # test_hf_models' twin -> its GGUF architecture


def build(name: str, folder):
    model, hf_folder = build_case(name, folder)
    return model, hf_folder, write_classic(folder / f"{name}.gguf", model, CASES[name])


models = once_fixture(build)


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_greedy_tokens_and_params_match(models, name):
    model, hf_folder, path = models(name)
    graph = load_spec(path)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    got = irc_logits(graph, ids, mask, positions)
    assert relative_error(got[real], hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE
    prompt = ids[0].tolist()
    assert_greedy_matches(graph, model, prompt, NEW_TOKENS)
    from_gguf, from_hf = load_gguf(path, weights="float"), load_spec(hf_folder)
    assert {n: p.shape for n, p in from_gguf.params.items()} == {n: p.shape for n, p in from_hf.params.items()}
    for param in from_hf.params:
        np.testing.assert_allclose(from_gguf.params[param].array(), from_hf.params[param].array(), rtol=0, atol=1e-6,
                                   err_msg=param)


def _logits_match(model, path) -> None:
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    got = irc_logits(load_spec(path), ids, mask, positions)
    assert relative_error(got[real], hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE


def test_bloom_output_copy_of_older_converters_is_an_untied_head(models, tmp_path):
    """Older ``BloomModel`` converters wrote ``output.weight``, a copy of ``token_embd``:
    read as llama.cpp reads it, an untied head holding the embedding's values."""
    model = models("bloom-alibi-6-heads")[0]
    path = write_classic(tmp_path / "copy.gguf", model, "bloom", output_copy=True)
    graph = load_gguf(path, weights="float")
    np.testing.assert_array_equal(graph.params["lm_head"].array(), graph.params["embed"].array())
    _logits_match(model, path)


def test_mpt_clamp_kqv_clamps_q_k_and_v(tmp_path):
    """``mpt.attention.clamp_kqv`` is transformers' ``clip_qkv``: the clip-scale twin with its
    clamp tightened until it bites and its softmax scale set to llama.cpp's head_dim^-0.5
    (what the file cannot carry), against the same file."""
    model = build_case("mpt-alibi-clip-scale", tmp_path / "hf")[0]
    ids, mask, positions = prompts()
    unclamped = hf_logits(model, ids, mask, positions)
    for block in model.transformer.blocks:
        block.attn.softmax_scale = 1 / math.sqrt(model.config.d_model / model.config.n_heads)
        block.attn.clip_qkv = 0.5
    assert relative_error(hf_logits(model, ids, mask, positions), unclamped) > 0.05  # the clamp bites
    path = write_classic(tmp_path / "clamp.gguf", model, "mpt", keys={"mpt.attention.clamp_kqv": 0.5})
    assert describe(GGUFFile.open(path), "clamp").attention.clip_qkv == 0.5
    _logits_match(model, path)


@pytest.mark.parametrize("keys, tensors, words", [
    ({"mpt.attention.max_alibi_bias": 16.0}, {}, "mpt.attention.max_alibi_bias: 16 is not 8"),
    ({"mpt.attention.max_alibi_bias": 0.0}, {}, "mpt.attention.max_alibi_bias: 0 is not 8"),
    ({}, {"blk.0.attn_q_norm.weight": np.ones(48, np.float32), "blk.0.attn_k_norm.weight": np.ones(48, np.float32)},
     "blk.0.attn_q_norm.weight: MPT's q/k LayerNorms (attn_config.qk_ln) are not supported"),
    ({}, {"blk.1.attn_qkv.bias": np.zeros(144, np.float32)}, "blk.1.attn_qkv.bias: MPT's biases (no_bias false)"),
    ({}, {"position_embd.weight": np.zeros((64, 48), np.float32)}, "position_embd.weight: MPT's learned positions"),
])
def test_mpt_settings_transformers_lacks_are_refused_naming_the_key(models, tmp_path, keys, tensors, words):
    model = models("mpt-alibi-6-heads")[0]
    path = write_classic(tmp_path / "refused.gguf", model, "mpt", keys=keys, tensors=tensors)
    with pytest.raises(SpecError) as err:
        load_gguf(path)
    assert words in str(err.value), str(err.value)
