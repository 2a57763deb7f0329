"""Kimi-Linear and MiniMax (``frontends.hf.families_linear``): irc does not build their
linear-attention layers yet, so every form of their config.json is one SpecError naming
config.json, the key at its line and what is missing; the CLI exits 2 and writes nothing."""
import json

import pytest

from frontends import load_spec
from irc.errors import SpecError

try:
    import transformers
except ImportError:  # the hand-written configs below need no transformers
    transformers = None

KIMI_CHECKPOINT = {  # the form of moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json, shrunk
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "vocab_size": 128, "hidden_size": 32,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 48,
    "moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_token": 2, "first_k_dense_replace": 1,
    "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
    "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3], "head_dim": 8, "num_heads": 4,
                           "short_conv_kernel_size": 4}}
MINIMAX = {"architectures": ["MiniMaxForCausalLM"], "model_type": "minimax", "vocab_size": 128, "hidden_size": 32,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
           "intermediate_size": 48, "num_local_experts": 4, "num_experts_per_tok": 2, "block_size": 16,
           "layer_types": ["linear_attention", "full_attention"] * 2}
CASES = {  # name: (config.json, the key named, a fragment of what is missing)
    "kimi-checkpoint": (KIMI_CHECKPOINT, "linear_attn_config", "per key channel"),
    "kimi-layer-types": ({**{k: v for k, v in KIMI_CHECKPOINT.items() if k != "linear_attn_config"},
                          "layer_types": ["linear_attention"] * 3 + ["full_attention"]}, "layer_types",
                         "Kimi Delta Attention"),
    "kimi-bare": ({k: v for k, v in KIMI_CHECKPOINT.items() if k != "linear_attn_config"}, "model_type",
                  "Kimi Delta Attention"),
    "minimax": (MINIMAX, "layer_types", "constant per-head decay"),
    "minimax-bare": ({k: v for k, v in MINIMAX.items() if k != "layer_types"}, "model_type", "lightning attention"),
}


def folder_with(tmp_path, config: dict):
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    return tmp_path


def assert_names_the_key(folder, message: str, key: str) -> None:
    assert f"{folder / 'config.json'}:" in message and f"{key}: " in message, message
    line = int(message.split("config.json:")[1].split(":")[0])
    assert f'"{key}"' in (folder / "config.json").read_text().splitlines()[line - 1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_linear_hybrid_is_one_error_naming_config_json_the_key_and_what_is_missing(tmp_path, name):
    config, key, fragment = CASES[name]
    folder = folder_with(tmp_path, config)
    with pytest.raises(SpecError) as caught:
        load_spec(folder)
    message = str(caught.value)
    assert fragment in message and "not supported" in message, message
    assert_names_the_key(folder, message, key)


@pytest.mark.skipif(transformers is None, reason="needs transformers")
@pytest.mark.parametrize("class_name", ["KimiLinearConfig", "MiniMaxConfig"])
def test_the_config_transformers_writes_is_refused_at_layer_types(tmp_path, class_name):
    """The tiny twins' config.json as ``save_pretrained`` writes it (layer_types filled in)."""
    settings = dict(vocab_size=128, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=48)
    getattr(transformers, class_name)(**settings).save_pretrained(tmp_path)
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path)
    assert_names_the_key(tmp_path, str(caught.value), "layer_types")


@pytest.mark.parametrize("command", ["show", "compile"])
def test_the_cli_refuses_with_exit_2_and_writes_nothing(tmp_path, capsys, command):
    from irc_cli import main

    (tmp_path / "model").mkdir()
    folder = folder_with(tmp_path / "model", MINIMAX)
    out = tmp_path / "out"
    args = [str(folder)] if command == "show" else [str(folder), "--target", "onnx", "-o", str(out / "model.onnx"),
                                                    "--quiet"]
    assert main([command] + args) == 2
    err = capsys.readouterr().err
    assert "config.json" in err and "layer_types" in err and "lightning attention" in err
    assert not out.exists()
