"""The HF frontend's composite-layer families (Falcon-H1, Zamba2) against transformers: tiny
random models, saved with save_pretrained and loaded with load_spec(folder), give the same
logits on a left-padded batch of two uneven prompts (each padded row also held against the
row run alone) and the same 16-token greedy continuation through the reference interpreter
(KV caches and Mamba-2 states fed back)."""
import pytest

from frontends import load_spec
from tests.frontends.refusals import refused_change
from tests.frontends.test_hf_models import (NEW_TOKENS, TOLERANCE, assert_greedy_matches, built_once, hf_logits,
                                            irc_logits, prompts, randomize, relative_error)
from tests.frontends.test_hf_ssm import unpadded_logits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=128, hidden_size=32, num_attention_heads=4, pad_token_id=0, bos_token_id=0, eos_token_id=0,
             max_position_embeddings=64)
FALCON = dict(SMALL, num_hidden_layers=2, intermediate_size=48, num_key_value_heads=2, head_dim=16, mamba_d_state=8,
              mamba_d_conv=4, mamba_chunk_size=4, mamba_n_groups=2)
ZAMBA = dict(SMALL, num_hidden_layers=4, intermediate_size=48, mamba_d_state=8, n_mamba_heads=4, mamba_ngroups=2,
             chunk_size=4)
CASES = {  # name: (config class, settings)
    "falcon-h1-multipliers": ("FalconH1Config", dict(
        FALCON, mamba_d_ssm=48, mamba_n_heads=6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        embedding_multiplier=1.5, lm_head_multiplier=0.7, attention_in_multiplier=0.8,
        attention_out_multiplier=1.2, key_multiplier=0.6, ssm_in_multiplier=1.3, ssm_out_multiplier=0.9,
        ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 2.0], mlp_multipliers=[0.7, 1.3])),
    "falcon-h1-gated-norm-biases-tied": ("FalconH1Config", dict(
        FALCON, mamba_d_ssm=None, mamba_n_heads=8, mamba_rms_norm=True, mamba_norm_before_gate=False,
        mamba_proj_bias=True, projectors_bias=True, mlp_multipliers=[1.0, 0.5], tie_word_embeddings=True,
        num_key_value_heads=4, head_dim=8)),
    "falcon-h1-norm-before-gate-3-layers": ("FalconH1Config", dict(
        FALCON, num_hidden_layers=3, mamba_d_ssm=32, mamba_n_heads=4, mamba_n_groups=1, mamba_rms_norm=True,
        mamba_conv_bias=False, num_key_value_heads=1, key_multiplier=1.7, ssm_multipliers=[1.0, 1.0, 0.5, 0.5, 1.0])),
    "zamba2-one-block-adapters-rope": ("Zamba2Config", dict(
        ZAMBA, layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], num_mem_blocks=1,
        use_shared_attention_adapter=True, adapter_rank=4, use_mem_rope=True)),
    "zamba2-two-blocks-gqa-biases": ("Zamba2Config", dict(
        ZAMBA, layers_block_type=["hybrid", "mamba", "hybrid", "hybrid"], num_mem_blocks=2, num_key_value_heads=2,
        add_bias_linear=True, hidden_act="gelu_pytorch_tanh", adapter_rank=3)),
    # untied, transformers shares no block: here each is used once, so nothing is lost
    "zamba2-untied-silu-3-layers": ("Zamba2Config", dict(
        ZAMBA, num_hidden_layers=3, layers_block_type=["hybrid", "mamba", "hybrid"], num_mem_blocks=2,
        hidden_act="silu", use_shared_attention_adapter=True, adapter_rank=2, use_mem_rope=True,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
}


def build_case(name: str, folder):
    class_name, settings = CASES[name]
    config = getattr(transformers, class_name)(**settings)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=sorted(CASES).index(name), norm_centre=1.0)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder)
    return model, folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return built_once(build_case, tmp_path_factory)


def has_in_proj_bias(model) -> bool:
    return bool(getattr(model.config, "mamba_proj_bias", False) or getattr(model.config, "add_bias_linear", False))


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_on_a_left_padded_batch(models, name):
    model, folder = models(name)
    graph = load_spec(folder)
    ids, mask, positions = prompts()
    got = irc_logits(graph, ids, mask, positions)
    real = mask.astype(bool)
    assert relative_error(got[real], unpadded_logits(model, ids, mask)[real]) <= TOLERANCE
    if not has_in_proj_bias(model):  # transformers' padded batch agrees where it is right (see unpadded_logits)
        assert relative_error(got[real], hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_generation_matches(models, name):
    model, folder = models(name)
    graph = load_spec(folder)
    prompt = prompts()[0][0].tolist()
    assert_greedy_matches(graph, model, prompt, NEW_TOKENS)


def test_zamba2_shares_the_block_weights_and_caches_per_layer(models):
    model, folder = models("zamba2-two-blocks-gqa-biases")
    graph = load_spec(folder)
    shared = [name for name in graph.params if ".shared." in name and ".adapter." not in name]
    assert {name.split(".")[1] for name in shared} == {"0", "2"}  # blocks 0 and 1 live at hybrid layers 0 and 2
    wq = graph.params["layers.0.shared.attn.wq"]
    readers = [node for node in graph.nodes if wq in node.inputs]
    assert len(readers) == 2  # hybrid layers 0 and 3 (uses 0 and 2 of block 0)
    assert {f"layers.0.shared.adapter.{j}.mlp_down" for j in (0, 2)} <= set(graph.params)
    names = {v.name for v in graph.inputs}
    for i in (0, 2, 3):
        assert {f"past_key_values.{i}.{k}" for k in ("key", "value", "conv_state", "recurrent_state")} <= names
    assert "past_key_values.1.key" not in names and "past_key_values.1.conv_state" in names
    assert sum(p.numel for p in graph.params.values()) == sum(p.numel() for p in model.parameters())


def test_falcon_h1_layer_carries_key_value_and_both_states(models):
    _, folder = models("falcon-h1-multipliers")
    graph = load_spec(folder)
    names = {v.name for v in graph.inputs}
    for i in range(2):
        assert {f"past_key_values.{i}.{k}" for k in ("key", "value", "conv_state", "recurrent_state")} <= names
    assert graph.meta["layer_kinds"] == ["mamba2+attention"] * 2


@pytest.mark.parametrize("key, value, message", [
    ("hidden_act", "gelu", "hidden_act: \"gelu\" is not supported"),
    ("attention_bias", True, "attention_bias: true is not supported"),
    ("ssm_multipliers", [1.0, 2.0], "ssm_multipliers: expected a list of 5 numbers"),
])
def test_falcon_h1_refusals_name_the_key(models, tmp_path, key, value, message):
    refused_change(models("falcon-h1-multipliers")[1], tmp_path, key, value, message)


@pytest.mark.parametrize("key, value, message", [
    ("hidden_act", "relu", "hidden_act: \"relu\" is not supported"),
    ("num_hidden_layers", 5, "num_hidden_layers: 5 layers, but layers_block_type gives 4"),
    ("layers_block_type", ["mamba", "hybrid", "attention", "hybrid"], "layers_block_type: \"attention\""),
    ("tie_word_embeddings", False, "tie_word_embeddings: false is not supported"),
])
def test_zamba2_refusals_name_the_key(models, tmp_path, key, value, message):
    refused_change(models("zamba2-one-block-adapters-rope")[1], tmp_path, key, value, message)
