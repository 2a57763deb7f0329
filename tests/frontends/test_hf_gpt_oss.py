"""GPT-OSS from Hugging Face against transformers 5.24: tiny random models (sinks, q/k/v/o
biases, alternating sliding/full layers, YaRN, the biased clamped-SwiGLU MoE) rows of
the twin harness (test_hf_twins.py: the left-padded batch and each row alone, 16 greedy
tokens, both ONNX targets and onnxruntime-genai); the features are live; onnx-ort's MoE; the
full-size structure; config.json mistakes."""
import json

import numpy as np
import pytest

from frontends import load_spec
from irc.errors import SpecError
from tests.frontends.refusals import pointed_line, refused
from tests.frontends.test_hf_models import prompts
from tests.frontends.twins import CHECKS, GENAI, family, models_fixture, twin_build

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
             max_position_embeddings=64, pad_token_id=0)
CASES = {  # name: overrides of SMALL
    "gpt-oss-alternating-yarn": dict(rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}),
    "gpt-oss-mqa-no-bias-types-top1": dict(attention_bias=False, num_key_value_heads=1, num_experts_per_tok=1,
                                           layer_types=["full_attention", "sliding_attention", "sliding_attention"],
                                           swiglu_limit=2.0, swiglu_alpha=1.2, sliding_window=3),
}
SCALES = {"gpt-oss-alternating-yarn": 3.0}  # of the expert gate/up weights: large enough that the clamps bite


def sharpen(model, name: str) -> None:
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.mul_(10.0)  # sinks of order 1-2: they move the softmax
            layer.mlp.experts.gate_up_proj.mul_(SCALES.get(name, 1.0))


TWINS = family("GptOssConfig", SMALL, CASES, tweak=sharpen,
               rows={"gpt-oss-alternating-yarn": dict(checks=CHECKS + (GENAI,))})
build = twin_build(TWINS)


models = models_fixture(TWINS)


def test_the_twins_exercise_sinks_windows_and_clamps(models):
    """The features are live: the longer prompt outruns the windows, the sinks take weight,
    and some gate and up activations pass the clamp limit."""
    model, _ = models("gpt-oss-alternating-yarn")
    ids, mask, _ = prompts()
    assert mask.sum(axis=1).max() > SMALL["sliding_window"]
    sinks = model.model.layers[0].self_attn.sinks.detach().numpy()
    assert np.abs(sinks).max() > 1.0
    seen = {}
    hook = model.model.layers[0].mlp.experts.register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))
    with torch.no_grad():
        model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    hook.remove()
    with torch.no_grad():
        gate_up = torch.einsum("nd,edf->nef", seen["x"], model.model.layers[0].mlp.experts.gate_up_proj)
    assert (gate_up[..., ::2] > 7).any() and (gate_up[..., 1::2].abs() > 7).any()


def test_onnx_ort_runs_the_moe_as_com_microsoft_moe(models, tmp_path):
    import onnx

    from backends.onnx import emit

    _, folder = models("gpt-oss-alternating-yarn")
    path = tmp_path / "model.onnx"
    emit.emit_model(load_spec(folder), str(path), target="onnx-ort", genai=False, context=64)
    kinds = [node.op_type for node in onnx.load(str(path)).graph.node]
    assert kinds.count("MoE") == SMALL["num_hidden_layers"]


def test_gpt_oss_20b_structure_compiles_without_weights(tmp_path):
    """transformers' defaults with gpt-oss-20b's 24 layers and 32 experts: 20.9B params and
    3.6B active per token besides the embedding table (OpenAI's model card: 21B and 3.6B;
    irc's active count includes the 0.58B table)."""
    from frontends.hf import load_hf
    from irc.analysis import analyze

    config = transformers.GptOssConfig(num_hidden_layers=24, num_local_experts=32).to_dict()
    (tmp_path / "config.json").write_text(json.dumps(config))
    graph = load_hf(tmp_path, weights=False)
    stats = analyze(graph)
    assert round(stats["params_total"] / 1e9, 1) == 20.9
    embedding = graph.params["embed"].numel
    assert round((stats["params_active"] - embedding) / 1e9, 1) == 3.6
    windows = [n.attrs["window"] for n in graph.nodes if n.op == "attention"]
    assert windows == [128, None] * 12


BASE = {"model_type": "gpt_oss", **{k: v for k, v in SMALL.items() if k != "pad_token_id"}}
BAD = [  # (config.json, the key named, a fragment of the message)
    ({**BASE, "layer_types": ["sliding_attention", "full_attention"]}, "layer_types", "2 entries for 3"),
    ({**BASE, "layer_types": ["sliding_attention", "full_attention", "chunked_attention"]}, "layer_types",
     '"chunked_attention" is not supported'),
    ({**BASE, "num_experts_per_tok": 5}, "num_experts_per_tok", "exceeds 4 experts"),
    ({**BASE, "swiglu_limit": 0}, "swiglu_limit", "positive"),
    ({**BASE, "rope_parameters": {"sliding_attention": {"rope_type": "default"}}}, "rope_parameters",
     "per-layer-type"),
]


@pytest.mark.parametrize("config, key, fragment", BAD)
def test_bad_configs_name_the_key(tmp_path, config, key, fragment):
    assert f'"{key}"' in pointed_line(tmp_path, refused(tmp_path, key, fragment, config))


def test_mxfp4_checkpoints_are_refused_naming_quantization_config(models, tmp_path):
    """The released checkpoints carry ``quantization_config`` (MXFP4 experts): refused when
    their weights are read, naming the key."""
    _, folder = models("gpt-oss-alternating-yarn")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    (tmp_path / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(SpecError, match="quantization_config: quantized checkpoints are not supported") as err:
        load_spec(tmp_path)
    assert f"{tmp_path / 'config.json'}:" in str(err.value)
