"""The recurrent-depth families (``frontends.hf.families_loops``) and Zamba's details against
transformers: Dory's tiny twins (their nGPT scales drawn near their initial values, as trained
ones are: drawn like every other vector, (s · 2.4 / 0.0177)² saturates every gate), rows of the
twin harness (test_hf_twins.py: transformers' logits on a left-padded batch and its 16 greedy
tokens through the reference interpreter and both ONNX targets), and genai's tokens; the
unrolled graphs share each layer's weights between its invocations and give each invocation its
own KV cache (Dory's "last_loop" mode: one per layer, the earlier loops reading it); a Zamba
with in_proj biases holds each padded row against the row run alone; and config.json mistakes
name their key."""
import json

import numpy as np
import pytest

from frontends import load_spec
from irc.errors import SpecError
from tests.frontends.test_hf_models import (NEW_TOKENS, SMALL, TOLERANCE, assert_greedy_matches, irc_logits, prompts,
                                            relative_error)
from tests.frontends.test_hf_ssm import unpadded_logits
from tests.frontends.twins import GREEDY, LOGITS, ONNX, Twin, family, models_fixture

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DORY = dict(SMALL, head_dim=8, pad_token_id=0, eos_token_id=2)
NGPT_SCALES = ("sqk", "s_gate", "lambda_1", "lambda_2", "logit_scale")
CASES = {  # name: (config class, settings)
    # 1 input, 2 recurrent layers looped twice (a cache per loop), 1 output; local / global layers
    "dory-per-loop-windows": ("DoryConfig", dict(DORY, num_hidden_layers=4, n_input_layers=1, n_output_layers=1,
                                                 n_recurrent_loops=2, sliding_window=3, layer_types=[
        "sliding_attention", "full_attention", "sliding_attention", "full_attention"])),
    # three loops over 2 layers, one cache each (written by the last loop), MQA, tied
    "dory-last-loop-mqa-tied": ("DoryConfig", dict(DORY, num_hidden_layers=3, n_input_layers=1, n_output_layers=0,
                                                   n_recurrent_loops=3, recurrent_kv_cache_mode="last_loop",
                                                   sliding_window=4, num_key_value_heads=1,
                                                   tie_word_embeddings=True)),
}
ZAMBA_BIAS = ("ZambaConfig", dict(SMALL, num_hidden_layers=3, n_mamba_heads=2, mamba_d_state=4, mamba_proj_bias=True,
                                  layers_block_type=["hybrid", "mamba", "hybrid"], pad_token_id=0, eos_token_id=0))


def ngpt_scales(model, name: str) -> None:
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.rsplit(".", 1)[-1] in NGPT_SCALES:
                p.copy_(model.config.initializer_range * (1 + 0.2 * torch.randn(p.shape, generator=generator)))


TWINS = {**family(None, {}, CASES, checks=(LOGITS, GREEDY, ONNX), context=None, tweak=ngpt_scales),
         "zamba-biases": Twin(*ZAMBA_BIAS, seed=7, name="zamba-biases", checks=(), tweak=ngpt_scales)}


models = models_fixture(TWINS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_genai_generates_transformers_tokens(models, tmp_path, name):
    """onnxruntime-genai 0.18 runs the folder irc writes (one KV cache per invocation in
    "per_loop", caches read but not written by the earlier loops in "last_loop")."""
    from tests.frontends.test_hf_ssm_onnx import assert_genai_generates, emit_genai_folder

    model, folder = models(name)
    emit_genai_folder(load_spec(folder), tmp_path, "onnx-ort")
    prompt = prompts()[0][0]
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt.tolist()]), max_new_tokens=NEW_TOKENS, do_sample=False)
    assert_genai_generates(tmp_path, out[0, len(prompt):].tolist())


def test_dory_loops_share_weights_and_cache_per_invocation(models):
    _, folder = models("dory-per-loop-windows")
    graph = load_spec(folder)
    keys = sorted(v.name for v in graph.inputs if v.name.endswith(".key"))
    assert len(keys) == 1 + 2 * 2 + 1  # the recurrent layers' caches once per loop
    wq = graph.params["layers.1.attn.wq"]
    assert len([node for node in graph.nodes if wq in node.inputs]) == 2
    _, folder = models("dory-last-loop-mqa-tied")
    graph = load_spec(folder)
    assert sorted(v.name for v in graph.inputs if v.name.endswith(".key")) == [
        f"past_key_values.{i}.key" for i in range(3)]
    past = next(v for v in graph.inputs if v.name == "past_key_values.1.key")
    assert len(past.uses) == 3  # read by all three loops, written by the last


def test_hrm_stacks_are_read_by_every_cycle(tmp_path):
    config = transformers.HrmTextConfig(**dict(SMALL, num_hidden_layers=1, head_dim=8, H_cycles=2, L_cycles=2))
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path)
    graph = load_spec(tmp_path)
    assert sum(v.name.endswith(".key") for v in graph.inputs) == 2 * (2 + 1)
    low, high = graph.params["L_module.layers.0.attn.w_gqkv"], graph.params["H_module.layers.0.attn.w_gqkv"]
    assert [sum(p in node.inputs for node in graph.nodes) for p in (low, high)] == [4, 2]
    assert sum(p.numel for p in graph.params.values()) == sum(p.numel() for p in model.parameters())


def test_zamba_with_in_proj_biases_matches_each_row_alone(models):
    """transformers runs in_proj's bias on padded tokens too (their inputs zeroed, not their
    outputs): its padded batch differs from the rows run alone, and irc equals the latter."""
    model, folder = models("zamba-biases")  # two hybrid layers: transformers cannot tie one to itself
    graph = load_spec(folder)
    ids, mask, positions = prompts()
    got = irc_logits(graph, ids, mask, positions)
    real = mask.astype(bool)
    assert relative_error(got[real], unpadded_logits(model, ids, mask)[real]) <= TOLERANCE
    assert_greedy_matches(graph, model, prompts()[0][0].tolist(), NEW_TOKENS)
    assert tuple(graph.params["layers.1.ssm.in_proj"].shape) == (128, 32)
    x_rows = graph.params["layers.1.ssm.in_proj"].array()[:64]
    stored = model.model.layers[1].mamba.in_proj.weight.detach().numpy()
    np.testing.assert_array_equal(x_rows, stored[0::2])  # transformers' x is the even rows


@pytest.mark.parametrize("model_type, key, value, message", [
    ("hrm_text", "num_layers_per_stack", 2, "num_hidden_layers: 6 is not num_layers_per_stack"),
    ("hrm_text", "hidden_act", "gelu", 'hidden_act: "gelu" is not supported'),
    ("dory", "recurrent_kv_cache_mode", "none", 'recurrent_kv_cache_mode: "none" is not supported'),
    ("dory", "n_input_layers", 6, "n_recurrent_layers"),
])
def test_refusals_name_the_key(models, tmp_path, model_type, key, value, message):
    if model_type == "dory":
        folder = models("dory-per-loop-windows")[1]
        config = json.loads((folder / "config.json").read_text())
    else:
        config = transformers.HrmTextConfig(**dict(SMALL, num_hidden_layers=1, head_dim=8, H_cycles=2,
                                                   L_cycles=2)).to_dict()
    config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    with pytest.raises(SpecError, match=message) as err:
        load_spec(tmp_path)
    assert "config.json" in str(err.value)
