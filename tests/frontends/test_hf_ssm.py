"""The HF frontend's state-space families against transformers: tiny random models of every
family, saved with save_pretrained and loaded with load_spec(folder), give the same logits
on a left-padded batch of two uneven prompts and the same 16-token greedy continuation (the
conv and recurrent states fed back), through the reference interpreter and both ONNX
targets in ONNX Runtime (the greedy decode there runs on the left-padded batch)."""
import numpy as np
import pytest

from frontends import load_spec
from irc.interpreter import generate
from tests.frontends.test_hf_models import (NEW_TOKENS, TOLERANCE, built_once, hf_logits, irc_logits, prompts,
                                            randomize, relative_error)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, pad_token_id=0, bos_token_id=0, eos_token_id=0)
CASES = {  # name: (config class, overrides of SMALL)
    "mamba": ("MambaConfig", dict(state_size=8, conv_kernel=4, expand=2)),
    "mamba-bias-rank-5": ("MambaConfig", dict(state_size=4, conv_kernel=3, use_bias=True, time_step_rank=5,
                                             tie_word_embeddings=False, num_hidden_layers=3)),
    "falcon-mamba": ("FalconMambaConfig", dict(state_size=8, conv_kernel=4)),
    "mamba2-groups": ("Mamba2Config", dict(num_heads=8, head_dim=8, state_size=8, n_groups=2, conv_kernel=4,
                                           chunk_size=8)),
    "mamba2-one-group-no-conv-bias": ("Mamba2Config", dict(num_heads=4, head_dim=16, state_size=12, n_groups=1,
                                                           conv_kernel=3, use_conv_bias=False, chunk_size=4,
                                                           tie_word_embeddings=True)),
}


def build_case(name: str, folder):
    class_name, overrides = CASES[name]
    config = getattr(transformers, class_name)(**{**SMALL, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    randomize(model, seed=sorted(CASES).index(name), norm_centre=1.0)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return built_once(build_case, tmp_path_factory)


def unpadded_logits(model, ids, mask) -> np.ndarray:
    """transformers' logits of each row run alone without its padding, placed where the
    row's real tokens sit: what a left-padded row must give. (transformers' own padded row
    differs when in_proj has a bias: in_proj(0) = bias enters the convolution at the padded
    positions; irc's padded positions change neither state.)"""
    want = np.zeros(ids.shape + (model.config.vocab_size,), np.float32)
    for row in range(len(ids)):
        real = mask[row].astype(bool)
        short = ids[row][real][None, :]
        ones = np.ones_like(short)
        want[row, real] = hf_logits(model, short, ones, np.cumsum(ones, axis=1) - 1)[0]
    return want


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_on_a_left_padded_batch(models, name):
    model, folder = models(name)
    graph = load_spec(folder)
    ids, mask, positions = prompts()
    got, want = irc_logits(graph, ids, mask, positions), unpadded_logits(model, ids, mask)
    real = mask.astype(bool)
    assert relative_error(got[real], want[real]) <= TOLERANCE
    if not model.config.use_bias:  # transformers' padded batch agrees where it is right
        assert relative_error(got[real], hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_generation_matches(models, name):
    model, folder = models(name)
    graph = load_spec(folder)
    prompt = prompts()[0][0].tolist()
    tokens, _ = generate(graph, prompt, NEW_TOKENS)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=NEW_TOKENS, do_sample=False)
    assert tokens == out[0, len(prompt):].tolist()
