"""Ergo and ZAYA1 beyond their test_hf_models twins: Ergo's config.json in the released
checkpoints' form (flat RoPE settings, ``local_attention_window``, derived layer types) and
ZAYA1's skip expert actually chosen (a zero expert), its recurrent CCA states as graph I/O."""
import json

import numpy as np
import pytest

from frontends import load_spec
from tests.frontends.test_hf_models import (CASES, NEW_TOKENS, SMALL, assert_greedy_matches, assert_logits_match,
                                            assert_ort_run_matches, hf_logits, models, prompts, randomize,
                                            save_twin)  # noqa: F401 (fixture)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_ergo_reads_the_released_config_form(models, tmp_path):  # noqa: F811
    """The twin's config.json rewritten as the hub's: flat rope_parameters, the window as
    local_attention_window, layer_types and mlp_layer_types left to be derived."""
    model, folder = models("ergo-dense-then-moe-scaled-full")
    config = json.loads((folder / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    assert config["mlp_layer_types"] == ["dense", "sparse", "sparse"]
    for key in ("layer_types", "mlp_layer_types"):
        del config[key]
    config["rope_parameters"] = config["rope_parameters"]["sliding_attention"]
    config["local_attention_window"] = config.pop("sliding_window")
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    graph = load_spec(tmp_path)
    assert_logits_match(graph, model)


def _zaya_with_skips(folder):
    """A ZAYA twin whose skip class has a balancing bias of -0.1 (not the -1 of its init), so
    that about a third of the routes take it."""
    class_name, overrides = CASES["zaya-cca-two-taps-tied"]
    config = getattr(transformers, class_name)(**{**SMALL, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=7, norm_centre=1.0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.balancing_biases.copy_(torch.tensor([0.0, 0.0, 0.0, -0.1]))
    return save_twin(model, folder)


def _skip_share(model) -> float:
    """The share of (token, layer) routes that pick the skip class on the prompts."""
    ids, mask, _ = prompts()
    with torch.no_grad():
        out = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), output_router_logits=True)
    picks = []
    for layer, logits in zip(model.model.layers, out.router_logits):
        probs = torch.softmax(logits.float(), dim=-1) + layer.mlp.gate.balancing_biases
        picks.append((probs.argmax(-1) == probs.shape[-1] - 1).reshape(ids.shape)[torch.from_numpy(mask) == 1])
    return float(torch.cat(picks).float().mean())


@pytest.mark.parametrize("target", [None, "onnx"])
def test_zaya_skip_expert_is_a_zero_expert(tmp_path, target):
    """Transformers' logits and greedy tokens with about a third of the routes skipped:
    through the interpreter, and through ONNX Runtime (the left-padded batch)."""
    model, folder = _zaya_with_skips(tmp_path / "twin")
    assert 0.1 < _skip_share(model) < 0.9  # both kinds of route are taken
    graph = load_spec(folder)
    if target is None:
        assert_logits_match(graph, model)
        assert_greedy_matches(graph, model, prompts()[0][0].tolist(), NEW_TOKENS)
        return
    from backends.onnx import emit

    ids, mask, positions = prompts()
    with torch.no_grad():
        tokens = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                                max_new_tokens=NEW_TOKENS, do_sample=False)[:, ids.shape[1]:].numpy()
    path = str(tmp_path / "model.onnx")
    emit.emit_model(graph, path, target=target, genai=False)
    assert_ort_run_matches(path, graph, hf_logits(model, ids, mask, positions), tokens)


def test_zaya_states_are_graph_inputs_and_outputs(models):  # noqa: F811
    """Each layer's conv, shift and value states enter as past_key_values.{i}.* and leave as
    present.{i}.* beside its KV cache: q|k of (4 + 1) heads of 8 (40 channels), cca_time0 3
    (two past inputs), cca_time1 3 (two chained shifts), values 1·8/2 wide."""
    _, folder = models("zaya-three-taps-windows-mqa-head-bias")
    graph = load_spec(folder)
    inputs = {v.name: v.shape for v in graph.inputs}
    outputs = {v.name for v in graph.outputs}
    for i in range(3):
        for kind, shape in (("conv_state", (40, 2)), ("shift_state_1", (40,)), ("shift_state_2", (40,)),
                            ("value_state", (4, 1))):
            assert tuple(inputs[f"past_key_values.{i}.{kind}"])[1:] == shape
            assert f"present.{i}.{kind}" in outputs
        assert {f"present.{i}.key", f"present.{i}.value"} <= outputs
    assert np.isfinite(graph.params["layers.0.cca.conv_tap0"].array()).all()
