"""The GGUF frontend's classic archs (olmo2, starcoder2, command-r, gpt2, phi2) against
transformers: tiny random twins written as llama.cpp's converters write them
(``gguf_writer.write_classic``), read back with ``load_spec``: the logits of a left-padded
batch equal transformers' on the real tokens, the greedy tokens equal, and every param is
the checkpoint's."""
import numpy as np
import pytest

from frontends import load_spec
from frontends.gguf import load_gguf
from gguf_writer import write_classic
from test_hf_models import (SMALL, TOLERANCE, assert_greedy_matches, build_case, built_once, hf_logits, irc_logits,
                            prompts, relative_error)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NEW_TOKENS = 8
CASES = {"olmo2-post-norms": "olmo2", "starcoder2-biases-window": "starcoder2",
         "cohere-parallel-logit-scale": "command-r", "cohere-qk-norm": "command-r", "gpt2-learned-positions": "gpt2",
         "phi-parallel-head-bias": "phi2"}  # test_hf_models' twin -> its GGUF architecture


def build(name: str, folder):
    model, hf_folder = build_case(name, folder)
    return model, hf_folder, write_classic(folder / f"{name}.gguf", model, CASES[name])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return built_once(build, tmp_path_factory)


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
