"""Gemma-3n from Hugging Face against transformers 5.24: tiny random Gemma3nForCausalLM twins
(AltUp with 3 or 2 streams and a non-zero active stream, LAuReL, per-layer embeddings with a
per-layer table smaller than the vocabulary, KV-sharing layers, activation sparsity, per-layer
MLP widths, local/global windows and RoPE), rows of the twin harness (test_hf_twins.py: the
left-padded batch and each row alone, 16 greedy tokens, both ONNX targets, each emitted alike
twice); onnxruntime-genai and ``irc run``; the multimodal checkpoint layout (text model under
``model.language_model.``, towers left aside); the full-size E4B structure and its KV cache;
config.json mistakes."""
import json

import numpy as np
import pytest

from frontends import load_spec
from irc.errors import SpecError
from tests.frontends.refusals import pointed_line, refused
from tests.frontends.test_hf_models import NEW_TOKENS, assert_rows_match, hf_greedy_tokens, prompts
from tests.frontends.twins import family, models_fixture

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, laurel_rank=4, hidden_size_per_layer_input=8,
             max_position_embeddings=64, pad_token_id=0, num_kv_shared_layers=0, altup_num_inputs=2)
CASES = {
    # 6 layers: the last two reuse layers 2 (sliding) and 3 (full); sparse MLPs on three layers
    "gemma3n-shared-sparse": dict(
        num_hidden_layers=6, num_kv_shared_layers=2, altup_num_inputs=3, altup_active_idx=1, sliding_window=4,
        vocab_size_per_layer_input=100, intermediate_size=[48, 40, 48, 32, 48, 48],
        layer_types=["sliding_attention", "full_attention"] * 3,
        activation_sparsity_pattern=[0.95, 0.5, 0.0, 0.0, 0.9, 0.0],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0}}),
    # benchmarks/breadth.py's twin, without the output scale of the corrected stream
    "gemma3n-breadth-unscaled": dict(altup_correct_scale=False, vocab_size_per_layer_input=128),
}
SHARED = "gemma3n-shared-sparse"


TWINS = family("Gemma3nTextConfig", SMALL, CASES, emits_alike=True)  # norm centre 1: plain weights, not 1 + w


models = models_fixture(TWINS)


def test_the_twin_exercises_sharing_sparsity_windows_and_the_per_layer_table(models):
    """The features are live: the shared layers have no K/V weights in the checkpoint and
    no cache in the graph, the 0.95 layer zeroes most gate activations, the longer prompt
    outruns the window, and prompt ids reach past the per-layer table."""
    model, folder = models(SHARED)
    graph = load_spec(folder)
    assert not hasattr(model.model.layers[4].self_attn, "k_proj")
    assert [v.name for v in graph.inputs if v.name.endswith(".key")] == [f"past_key_values.{i}.key" for i in range(4)]
    assert [v.name for v in graph.outputs][1:] == [f"present.{i}.{kv}" for i in range(4) for kv in ("key", "value")]
    ids, mask, _ = prompts()
    assert mask.sum(axis=1).max() > CASES[SHARED]["sliding_window"]
    assert (ids >= CASES[SHARED]["vocab_size_per_layer_input"]).any()
    seen = {}
    hook = model.model.layers[0].mlp.act_fn.register_forward_pre_hook(lambda m, args: seen.update(gate=args[0]))
    with torch.no_grad():
        model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    hook.remove()
    assert 0.85 < float((seen["gate"] == 0).float().mean()) < 1.0


def test_an_unapplied_output_scale_is_left_aside(models):
    """With ``altup_correct_scale: false`` transformers keeps altup.correct_output_scale
    unused; irc builds no param for it and leaves the checkpoint tensor aside."""
    from frontends.hf.weights import Checkpoint

    _, folder = models("gemma3n-breadth-unscaled")
    graph = load_spec(folder)
    assert "model.layers.0.altup.correct_output_scale" in Checkpoint.find(str(folder)).files
    assert not any(name.endswith("correct_output_scale") for name in graph.params)
    assert "layers.0.altup.correct_output_scale" in load_spec(models(SHARED)[1]).params


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_genai_and_irc_run_generate_transformers_tokens(models, tmp_path, capsys, target):
    """onnxruntime-genai 0.18 runs the KV-sharing folder: its config counts the 4 layers
    that hold a cache; ``irc run`` runs the same folder to the same tokens."""
    og = pytest.importorskip("onnxruntime_genai")
    from backends.onnx import emit
    from irc_cli import main
    from tests.frontends.test_hf_ssm_onnx import genai_greedy

    model, folder = models(SHARED)
    emitted = emit.emit_model(load_spec(folder), str(tmp_path / "model.onnx"), target=target, context=64)
    assert emitted.genai_config, emitted.genai_note
    config = json.loads((tmp_path / "genai_config.json").read_text())
    assert config["model"]["decoder"]["num_hidden_layers"] == 4
    prompt = prompts()[0][0]
    want = hf_greedy_tokens(model, prompt.tolist())
    assert genai_greedy(og, tmp_path, prompt, NEW_TOKENS) == want
    capsys.readouterr()
    ids = ",".join(str(t) for t in prompt)
    assert main(["run", str(tmp_path), "--prompt-ids", ids, "--max-new-tokens", str(NEW_TOKENS), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == want


def multimodal_folder(folder, target):
    """The twin as Gemma3nForConditionalGeneration saves its text model: config.json with
    ``text_config``, tensors under ``model.language_model.``, plus a vision and an audio
    tensor and the k/v projections of a shared layer (which transformers ignores)."""
    from safetensors.numpy import load_file, save_file

    text = json.loads((folder / "config.json").read_text())
    config = {"model_type": "gemma3n", "architectures": ["Gemma3nForConditionalGeneration"],
              "text_config": text, "tie_word_embeddings": True, "dtype": "float32"}
    (target / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {k.replace("model.", "model.language_model.", 1): v
               for k, v in load_file(str(folder / "model.safetensors")).items()}
    tensors["model.vision_tower.timm_model.conv_stem.weight"] = np.ones((4, 3), np.float32)
    tensors["model.audio_tower.subsample_conv_projection.weight"] = np.ones((2, 2), np.float32)
    tensors["model.language_model.layers.5.self_attn.k_proj.weight"] = np.ones((16, 32), np.float32)
    save_file(tensors, str(target / "model.safetensors"))
    return target


def test_the_multimodal_layout_reads_the_text_model(models, tmp_path):
    model, folder = models(SHARED)
    graph = load_spec(multimodal_folder(folder, tmp_path))
    assert_rows_match(graph, model)


def test_an_unknown_checkpoint_tensor_is_still_refused(models, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, folder = models(SHARED)
    multimodal_folder(folder, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["model.language_model.layers.0.self_attn.o_proj.bias"] = np.ones((32,), np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(SpecError, match="o_proj.bias has no place"):
        load_spec(tmp_path)


def test_sparsity_multipliers_are_the_normal_icdf():
    from frontends.hf.config import Config
    from frontends.hf.families_gemma3n import TEXT, sparsity_multipliers

    cfg = Config({"activation_sparsity_pattern": [0.95, 0.0, 0.6]}, "config.json", defaults=TEXT)
    normal = torch.distributions.normal.Normal(0, 1)
    want = [float(normal.icdf(torch.tensor(p, dtype=torch.float64))) for p in (0.95, 0.6)]
    got = sparsity_multipliers(cfg, 3)
    assert got[1] is None and np.allclose([got[0], got[2]], want, rtol=1e-12)
    default = sparsity_multipliers(Config({}, "config.json", defaults=TEXT), 12)
    assert default[:10] == [got[0]] * 10 and default[10:] == [None, None]


def test_gemma_3n_e4b_structure_counts_what_transformers_counts(tmp_path):
    """transformers' defaults are E4B's text model: 6.84B params on the meta device, and
    irc's graph has as many; 20 of 35 layers hold a cache (the last 15 share), windows of
    512 on the local layers."""
    from frontends.hf import load_hf
    from irc.analysis import analyze

    config = transformers.Gemma3nTextConfig()
    with torch.device("meta"):
        reference = transformers.Gemma3nForCausalLM(config)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    graph = load_hf(tmp_path, weights=False)
    stats = analyze(graph, cache_dtype=None)
    assert stats["params_total"] == sum(p.numel() for p in reference.parameters()) == 6_835_235_568
    caches = [v for v in graph.inputs if v.name.startswith("past_key_values.")]
    assert len(caches) == 2 * 20
    assert [layer["kv_cache_elements_per_token"] for layer in stats["layers"]] == [2 * 2 * 256] * 20 + [0] * 15
    assert stats["kv_cache_elements_per_token"] == 20 * 2 * 2 * 256
    assert stats["kv_cache_bytes_mha_equivalent_per_token"] == 20 * 2 * 8 * 256 * 4
    windows = [n.attrs["window"] for n in graph.nodes if n.op == "attention"]
    assert windows == ([512] * 4 + [None]) * 7
    multimodal = tmp_path / "multimodal"
    multimodal.mkdir()
    (multimodal / "config.json").write_text(json.dumps({"model_type": "gemma3n", "text_config": config.to_dict()}))
    assert analyze(load_hf(multimodal, weights=False))["params_total"] == stats["params_total"]


TEXT_BASE = {"model_type": "gemma3n_text", **{k: v for k, v in SMALL.items() if k != "pad_token_id"}}
FOUR = {**TEXT_BASE, "num_hidden_layers": 4}
BAD = [  # (config.json, the key named, a fragment of the message)
    ({**TEXT_BASE, "layer_types": ["sliding_attention"]}, "layer_types", "1 entries for 2"),
    ({**TEXT_BASE, "layer_types": ["sliding_attention", "chunked_attention"]}, "layer_types",
     '"chunked_attention" is not supported'),
    ({**FOUR, "num_kv_shared_layers": 1, "layer_types": ["sliding_attention"] * 3 + ["full_attention"]},
     "num_kv_shared_layers", "layer 3 (full_attention) shares the keys and values of an earlier"),
    ({**TEXT_BASE, "num_kv_shared_layers": 2}, "num_kv_shared_layers", "2 shared layers of 2: no layer computes"),
    ({**TEXT_BASE, "altup_active_idx": 2}, "altup_active_idx", "not one of the 2 streams"),
    ({**TEXT_BASE, "activation_sparsity_pattern": [0.9]}, "activation_sparsity_pattern", "1 entries for 2"),
    ({**TEXT_BASE, "activation_sparsity_pattern": [0.9, 1.0]}, "activation_sparsity_pattern", "outside [0, 1)"),
    ({**TEXT_BASE, "activation_sparsity_pattern": 0.9}, "activation_sparsity_pattern", "a list of 2 numbers"),
    ({**TEXT_BASE, "intermediate_size": [48, 48, 48]}, "intermediate_size", "3 entries for 2"),
    ({**TEXT_BASE, "attention_bias": True}, "attention_bias", "true is not supported"),
    ({**TEXT_BASE, "hidden_activation": "silu"}, "hidden_activation", '"silu" is not supported'),
    ({**TEXT_BASE, "laurel_rank": 0}, "laurel_rank", "positive"),
    ({"model_type": "gemma3n", "text_config": [1]}, "text_config", "expected the text model's settings"),
    ({"model_type": "gemma3n", "text_config": {**TEXT_BASE, "model_type": "gemma3_text"}}, "text_config.model_type",
     '"gemma3_text" is not supported'),
    ({"model_type": "gemma3n", "text_config": {**TEXT_BASE, "altup_active_idx": 5}}, "text_config.altup_active_idx",
     "not one of the 2 streams"),
]


@pytest.mark.parametrize("config, key, fragment", BAD)
def test_bad_configs_name_the_key(tmp_path, capsys, config, key, fragment):
    """One message naming config.json, its line and the key; ``irc compile`` exits 2 and
    writes nothing."""
    from irc_cli import main

    assert f'"{key.split(".")[-1]}"' in pointed_line(tmp_path, refused(tmp_path, key, fragment, config))
    out = tmp_path / "out"
    assert main(["compile", str(tmp_path), "--target", "onnx", "-o", str(out / "model.onnx")]) == 2
    assert fragment in capsys.readouterr().err and not out.exists()
