"""``frontends.hf.families_moe_2026`` beyond the tiny twins (those are ``test_hf_models.CASES``'
``glm4-moe-*``, ``minimax-m2-*``, ``ernie4-5-moe-*``, ``dots1-*`` and ``exaone4-*``, held there
against transformers through the interpreter and both ONNX targets, and in ``test_hf_breadth``
through onnxruntime-genai): GLM-4.5-Air's full-size parameter count against transformers on the
meta device; the multi-token-prediction weights of GLM-4.5 and ERNIE-4.5 checkpoints left
aside, as transformers' causal LM leaves them; experts stored fused read as the per-expert ones;
the rotary width each config form gives, as transformers resolves it."""
import json
from pathlib import Path

import numpy as np
import pytest

from frontends import load_spec
from frontends.hf import read_arch
from irc.analysis import analyze
from irc.errors import SpecError
from tests.frontends.test_hf_models import (TOLERANCE, hf_logits, irc_logits, models,  # noqa: F401 (a fixture)
                                            prompts, relative_error)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "hf"


def test_glm_4_5_air_counts_transformers_parameters():
    """GLM-4.5-Air (zai-org's config.json): irc counts 106,852,251,264 parameters, transformers'
    Glm4MoeForCausalLM on the meta device holds 106,852,245,504 as parameters and the 45 MoE
    layers' 128 e_score_correction_bias values as buffers (irc's @moe.router_bias params);
    12.2B of the 13.4B active per token are not the embedding and head (zai-org: 106B total,
    12B active)."""
    config = transformers.AutoConfig.from_pretrained(EXAMPLES / "glm-4.5-air")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    biases = sum(b.numel() for name, b in model.named_buffers() if name.endswith("e_score_correction_bias"))
    stats = analyze(load_spec(EXAMPLES / "glm-4.5-air"))
    assert biases == 45 * 128
    assert stats["params_total"] == params + biases == 106_852_251_264
    assert round((stats["params_active"] - 2 * 151552 * 4096) / 1e9, 1) == 12.2


def test_minimax_m2_counts_transformers_parameters():
    """MiniMax-M2 (MiniMaxAI's config.json: 62 layers of 256 experts, 8 a token): irc counts
    228,689,764,864 parameters, transformers' parameters plus the 62 x 256 correction-bias
    buffers; 11.0B active a token with the embedding and head (MiniMax: 230B total, 10B active)."""
    config = transformers.AutoConfig.from_pretrained(EXAMPLES / "minimax-m2")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    biases = sum(b.numel() for name, b in model.named_buffers() if name.endswith("e_score_correction_bias"))
    stats = analyze(load_spec(EXAMPLES / "minimax-m2"))
    assert biases == 62 * 256
    assert stats["params_total"] == params + biases == 228_689_764_864
    assert round(stats["params_active"] / 1e9, 1) == 11.0


def test_glm_4_5_air_leaves_the_mtp_layer_out():
    """num_nextn_predict_layers: 1 names a 47th layer the checkpoint holds (model.layers.46);
    transformers' causal LM does not build it, nor does irc."""
    graph = load_spec(EXAMPLES / "glm-4.5-air")
    assert graph.meta["n_layers"] == 46 and not any(name.startswith("layers.46.") for name in graph.params)


def _resave(model_folder: Path, folder: Path, change) -> Path:
    """The twin's config.json and its tensors as ``change(tensors)`` leaves them, in ``folder``."""
    tensors = safetensors_numpy.load_file(model_folder / "model.safetensors")
    change(tensors)
    folder.mkdir()
    safetensors_numpy.save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text((model_folder / "config.json").read_text())
    return folder


def _copy_layer(tensors, source: str, target: str) -> None:
    """Every tensor under ``source`` again under ``target`` (a whole block for the MTP head)."""
    for name in [n for n in tensors if n.startswith(source)]:
        tensors[target + name[len(source):]] = tensors[name].copy()


def _glm_mtp(tensors):  # GLM-4.5's layout: the MTP layer after the last decoder layer
    d = tensors["model.norm.weight"].shape[0]
    for name in ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
        shape = (d, 2 * d) if name == "eh_proj.weight" else (d,)
        tensors[f"model.layers.2.{name}"] = np.ones(shape, np.float32)
    _copy_layer(tensors, "model.layers.1.", "model.layers.2.")


def _ernie_mtp(tensors):  # ERNIE-4.5's layout: model.mtp_{part}.{k}
    d = tensors["model.norm.weight"].shape[0]
    for name, shape in (("mtp_emb_norm.0.weight", (d,)), ("mtp_hidden_norm.0.weight", (d,)),
                        ("mtp_linear_proj.0.weight", (d, 2 * d))):
        tensors[f"model.{name}"] = np.ones(shape, np.float32)
    last = max(int(n.split(".")[2]) for n in tensors if n.startswith("model.layers."))
    _copy_layer(tensors, f"model.layers.{last}.", "model.mtp_block.0.")


@pytest.mark.parametrize("name, add, head", [("glm4-moe-groups-qkv-bias-partial", _glm_mtp, True),
                                             ("ernie4-5-moe-shared-interleaved", _ernie_mtp, False)])
def test_mtp_weights_leave_the_decoder_as_transformers_has_it(models, tmp_path, name, add, head):  # noqa: F811
    """A checkpoint holding its MTP head: transformers' causal LM and irc's decoder give the
    logits they gave without it; irc builds the head beside the decoder (frontends.hf.mtp)
    where config.json declares it (the GLM twin's num_nextn_predict_layers; the ERNIE twin
    declares none, so its head's tensors are left aside)."""
    model, folder = models(name)
    resaved = _resave(folder, tmp_path / "with-mtp", add)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(resaved, attn_implementation="eager").eval()
    ids, mask, positions = prompts()
    want = hf_logits(model, ids, mask, positions)
    np.testing.assert_array_equal(hf_logits(reloaded, ids, mask, positions), want)
    graph = load_spec(resaved)
    assert ("mtp" in graph.parts) == head
    got = irc_logits(graph, ids, mask, positions)
    assert relative_error(got[mask.astype(bool)], want[mask.astype(bool)]) <= TOLERANCE


def _fuse_experts(tensors):
    """Per-expert gate/up/down as transformers holds them in memory: gate_up_proj [E, 2F, d]
    (gate rows first), down_proj [E, d, F]."""
    layers = sorted({name.split(".experts.")[0] for name in tensors if ".mlp.experts." in name})
    for layer in layers:
        count = len([n for n in tensors if n.startswith(f"{layer}.experts.") and n.endswith("gate_proj.weight")])
        part = {x: [tensors.pop(f"{layer}.experts.{e}.{x}_proj.weight") for e in range(count)]
                for x in ("gate", "up", "down")}
        tensors[f"{layer}.experts.gate_up_proj"] = np.stack(
            [np.concatenate([g, u]) for g, u in zip(part["gate"], part["up"])])
        tensors[f"{layer}.experts.down_proj"] = np.stack(part["down"])


@pytest.mark.parametrize("name", ["glm4-moe-groups-qkv-bias-partial", "dots1-windows-v3-moe",
                                  "ernie4-5-moe-shared-interleaved"])
def test_fused_experts_read_as_the_per_expert_ones(models, tmp_path, name):  # noqa: F811
    model, folder = models(name)
    fused = _resave(folder, tmp_path / "fused", _fuse_experts)
    assert any(n.endswith("experts.gate_up_proj") for n in safetensors_numpy.load_file(fused / "model.safetensors"))
    ids, mask, positions = prompts()
    want = hf_logits(model, ids, mask, positions)
    got = irc_logits(load_spec(fused), ids, mask, positions)
    assert relative_error(got[mask.astype(bool)], want[mask.astype(bool)]) <= TOLERANCE


SMALL = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
GLM = {"model_type": "glm4_moe", **SMALL, "n_routed_experts": 4, "num_experts_per_tok": 2}
MINIMAX = {"model_type": "minimax_m2", **SMALL, "num_local_experts": 4, "num_experts_per_tok": 2}
ROPE_FORMS = {  # name: (config.json, the rotary width transformers gives)
    "glm-default-half": (GLM, 8),
    "glm-top-level": ({**GLM, "partial_rotary_factor": 0.25}, 4),
    "glm-null-whole-head": ({**GLM, "partial_rotary_factor": None}, 16),
    "glm-rope-parameters-win": ({**GLM, "partial_rotary_factor": 0.25, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75}}, 12),
    "minimax-whole-head": (MINIMAX, 16),
    "minimax-rotary-dim": ({**MINIMAX, "rotary_dim": 8}, 8),
    "minimax-factor-wins": ({**MINIMAX, "rotary_dim": 8, "partial_rotary_factor": 0.25}, 4),
}


@pytest.mark.parametrize("name", sorted(ROPE_FORMS))
def test_the_rotary_width_is_transformers(tmp_path, name):
    config, width = ROPE_FORMS[name]
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    assert int(hf.head_dim * hf.rope_parameters.get("partial_rotary_factor", 1.0)) == width
    rope = read_arch(tmp_path)[0].layers[0].rope
    assert (rope.rotary_dim or SMALL["head_dim"]) == width


def test_dots1_needs_its_shared_expert_count(tmp_path):
    """Dots1Config has no default for n_shared_experts (transformers fails on None)."""
    config = {"model_type": "dots1", **SMALL, "n_routed_experts": 4, "num_experts_per_tok": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SpecError, match="n_shared_experts: missing required key"):
        load_spec(tmp_path)
