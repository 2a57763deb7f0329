"""Llama-4's text model beyond its twins in ``test_hf_models.CASES`` (``llama4-*``: chunks of 4
that the prompts cross, a NoPE layer, input-weighted MoE layers, plain q/k norms, Scout's
llama3 RoPE; held there through the interpreter and both ONNX targets, in ``test_hf_targets``
through Triton, the NumPy emitter and onnx-npu, in ``test_hf_breadth`` through genai): the
attention temperature of the NoPE layers where it moves (a floor_scale of 4), Llama-4-Scout's
parameter count against transformers on the meta device, and config mistakes at the key."""
import json
from pathlib import Path

import pytest

from frontends import load_spec
from irc.analysis import analyze
from irc.errors import SpecError
from tests.frontends.test_hf_models import (SMALL, TOLERANCE, assert_greedy_matches, hf_logits, irc_logits, prompts,
                                            randomize, relative_error, save_twin)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hf"
TWIN = dict(SMALL, num_hidden_layers=4, head_dim=8, intermediate_size=24, intermediate_size_mlp=40, num_local_experts=4,
            interleave_moe_layer_step=2, attention_chunk_size=4)


def test_the_nope_layers_temperature(tmp_path):
    """floor_scale 4, attn_scale 0.5: layer 3's queries are scaled from position 3 on (1 +
    0.5·log(1 + floor((p + 1) / 4))); an unpadded prompt's logits and 16 greedy tokens equal
    transformers', and the temperature moves them."""
    config = transformers.Llama4TextConfig(**TWIN, floor_scale=4, attn_scale=0.5)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=4, norm_centre=1.0)
    _, folder = save_twin(model, tmp_path / "hf")
    graph = load_spec(folder)
    ids, mask, positions = (a[:1] for a in prompts())
    want = hf_logits(model, ids, mask, positions)
    assert relative_error(irc_logits(graph, ids, mask, positions), want) <= TOLERANCE
    assert_greedy_matches(graph, model, ids[0].tolist())
    cool = json.loads((Path(folder) / "config.json").read_text())
    (tmp_path / "cool").mkdir()
    (tmp_path / "cool" / "config.json").write_text(json.dumps({**cool, "attn_temperature_tuning": False}))
    for name in Path(folder).glob("*.safetensors"):
        (tmp_path / "cool" / name.name).write_bytes(name.read_bytes())
    assert relative_error(irc_logits(load_spec(tmp_path / "cool"), ids, mask, positions), want) > 1e-3


def test_llama_4_scout_counts_transformers_parameters():
    """examples/hf/llama-4-scout-17b-16e (Scout's text_config): 107,769,861,120 parameters,
    17,172,894,720 active (one of 16 experts and the shared one), as transformers holds them."""
    config = transformers.AutoConfig.from_pretrained(EXAMPLES / "llama-4-scout-17b-16e")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    stats = analyze(load_spec(EXAMPLES / "llama-4-scout-17b-16e"))
    assert stats["params_total"] == sum(p.numel() for p in model.parameters()) == 107_769_861_120
    assert stats["params_active"] == 17_172_894_720


LLAMA4 = {"model_type": "llama4_text", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 24,
          "intermediate_size_mlp": 40, "num_local_experts": 4}
BAD = [
    ({**LLAMA4, "no_rope_layers": [1, 1, 0]}, "no_rope_layers", "expected 4 entries"),
    ({**LLAMA4, "layer_types": ["chunked_attention"] * 3 + ["sliding_attention"]}, "layer_types",
     '"sliding_attention" is not supported'),
    ({**LLAMA4, "layer_types": ["chunked_attention"] * 4}, "layer_types", "layer 3 is chunked but has no RoPE"),
    ({**LLAMA4, "moe_layers": [1, 4]}, "moe_layers", "layer indices in 0..3"),
    ({**LLAMA4, "attention_bias": True}, "attention_bias", "no such bias"),
    ({**LLAMA4, "num_experts_per_tok": 5}, "num_experts_per_tok", "top_k 5 exceeds 4 experts"),
]


@pytest.mark.parametrize("config, key, fragment", BAD)
def test_config_mistakes_name_the_key(tmp_path, config, key, fragment):
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    with pytest.raises(SpecError) as err:
        load_spec(tmp_path)
    message = str(err.value)
    assert "config.json:" in message and f"{key}: " in message and fragment in message, message


def test_the_chunked_layers_cache_every_token_they_are_given():
    """A chunked layer's cache is the whole sequence's keys (transformers' DynamicCache keeps
    them all; a query reads only its chunk's): the KV bytes per token are every layer's."""
    graph = load_spec(EXAMPLES / "llama-4-scout-17b-16e")
    assert analyze(graph)["kv_cache_bytes_per_token"] == 48 * 2 * 8 * 128 * 2  # bf16
    chunks = [n.attrs.get("chunk") for n in graph.nodes if n.op == "attention"]
    assert chunks == [None if (i + 1) % 4 == 0 else 8192 for i in range(48)]


def test_the_multimodal_checkpoint_compiles_its_text_model(tmp_path):
    """A tiny ``llama4`` (Llama4ForConditionalGeneration: a vision model, its projector and the
    text model under ``language_model.``) saved as transformers saves Scout: irc reads the text
    model's settings from ``text_config`` and its weights under ``language_model.``, leaves the
    vision weights aside, and a text prompt's logits on the left-padded batch and 16 greedy
    tokens equal the multimodal model's; its bf16 dtype is the outer config's."""
    vision = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=28,
                  patch_size=14, vision_output_dim=32, projector_input_dim=32, projector_output_dim=32)
    config = transformers.Llama4Config(text_config=TWIN, vision_config=vision, image_token_index=127)
    model = transformers.Llama4ForConditionalGeneration(config).eval()
    randomize(model, seed=7, norm_centre=1.0)
    _, folder = save_twin(model, tmp_path / "hf")
    saved = json.loads((Path(folder) / "config.json").read_text())
    assert saved["model_type"] == "llama4" and "text_config" in saved
    graph = load_spec(folder)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    want = hf_logits(model, ids, mask, positions)
    assert relative_error(irc_logits(graph, ids, mask, positions)[real], want[real]) <= TOLERANCE
    assert_greedy_matches(graph, model, ids[0].tolist())


def test_scouts_own_config_reads_as_its_text_model(tmp_path):
    """Scout's multimodal config.json form (``llama4`` with the text settings in ``text_config``
    and the dtype outside it) counts the parameters, active parameters and KV bytes of its text
    model, which ``examples/hf/llama-4-scout-17b-16e`` holds as a ``llama4_text`` config."""
    text = json.loads((EXAMPLES / "llama-4-scout-17b-16e" / "config.json").read_text())
    outer = {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"], "torch_dtype": "bfloat16",
             "text_config": {k: v for k, v in text.items() if k not in ("torch_dtype", "architectures")},
             "vision_config": {"model_type": "llama4_vision_model"}}
    (tmp_path / "config.json").write_text(json.dumps(outer, indent=2))
    got, want = analyze(load_spec(tmp_path)), analyze(load_spec(EXAMPLES / "llama-4-scout-17b-16e"))
    for key in ("params_total", "params_active", "kv_cache_bytes_per_token"):
        assert got[key] == want[key], key
    assert got["params_total"] == 107_769_861_120
