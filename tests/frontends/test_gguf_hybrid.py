"""The GGUF frontend's hybrid archs (granitehybrid, nemotron_h, falcon-h1) against transformers:
tiny random Bamba, Granite-4.0-H, Nemotron-H and Falcon-H1 twins (the HF tests' cases),
saved with save_pretrained and converted from their safetensors as llama.cpp's converter
converts them (``gguf_writer.write_hybrid``: Q/K permuted, ssm_a = -exp(A_log), squeezed conv,
grouped norm, Granite's fused input_linear split, Falcon-H1's µP multipliers folded into the
weights), read back with ``load_spec(file.gguf)``: the logits of a left-padded batch and 8
greedy tokens equal transformers', the graph is the HF frontend's graph of the model llama.cpp
computes from the file, and a missing key or tensor is one SpecError naming the file and it."""
import json
import shutil

import gguf
import numpy as np
import pytest

import test_hf_hybrid as hf_hybrid
import test_hf_ssm as hf_ssm
from frontends import load_spec
from frontends.gguf import load_gguf
from gguf_writer import falcon_h1_folded, hybrid_converted, hybrid_keys, write_file, write_hybrid
from irc.errors import SpecError
from test_gguf_ssm import as_float32
from test_hf_models import TOLERANCE, assert_greedy_matches, hf_logits, irc_logits, prompts, relative_error
from test_hf_ssm import unpadded_logits
from twin_fixtures import once_fixture, random_twin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NEW_TOKENS = 8
CASES = {  # name: (HF test module, its case, overrides of that case's settings, GGUF architecture)
    "bamba-partial-rotary": (hf_ssm, "bamba-partial-rotary", {}, "granitehybrid"),
    "bamba-full-rotary-proj-bias": (hf_ssm, "bamba-full-rotary-proj-bias", {}, "granitehybrid"),
    # the converter writes every Granite-4.0-H without RoPE (rope.scaling.finetuned false)
    "granite-moe-shared-multipliers": (hf_ssm, "granite-moe-shared-rope-multipliers",
                                       {"position_embedding_type": None}, "granitehybrid"),
    "granite-dense-nope-tied": (hf_ssm, "granite-dense-nope-tied", {}, "granitehybrid"),
    "nemotron-h-pattern": (hf_ssm, "nemotron-h-pattern", {}, "nemotron_h"),
    "nemotron-h-mlp-bias-one-group": (hf_ssm, "nemotron-h-mlp-bias-one-group", {}, "nemotron_h"),
    "falcon-h1-multipliers": (hf_hybrid, "falcon-h1-multipliers", {}, "falcon-h1"),
    # llama.cpp normalises after the gate; the file cannot say mamba_norm_before_gate
    "falcon-h1-norm-after-gate-3-layers": (hf_hybrid, "falcon-h1-norm-before-gate-3-layers",
                                           {"mamba_norm_before_gate": False}, "falcon-h1"),
    # tied: one table, so embedding and lm_head multipliers 1; the converter needs mamba_d_ssm
    # and cannot fold an in_proj bias
    "falcon-h1-tied-out-bias": (hf_hybrid, "falcon-h1-gated-norm-biases-tied",
                                {"mamba_d_ssm": 64, "mamba_proj_bias": False}, "falcon-h1"),
}
UNIT = {"embedding_multiplier": 1.0, "lm_head_multiplier": 1.0, "attention_in_multiplier": 1.0,
        "attention_out_multiplier": 1.0, "key_multiplier": 1.0, "ssm_in_multiplier": 1.0, "ssm_out_multiplier": 1.0,
        "ssm_multipliers": [1.0] * 5, "mlp_multipliers": [1.0, 1.0]}


def build_case(name: str, folder):
    """The HF test's twin (its build, with the overrides), saved under ``folder/hf``, and its GGUF."""
    module, base, overrides, arch = CASES[name]
    class_name, settings = module.CASES[base]
    if module is hf_ssm:
        settings = {**hf_ssm.SMALL, **settings}
    model = random_twin(class_name, {**settings, **overrides}, sorted(CASES).index(name))
    model.save_pretrained(folder / "hf")
    getattr(module, "ON_DISK", {}).get(base, lambda _: None)(folder / "hf")
    return model, folder / "hf", write_hybrid(folder / f"{name}.gguf", model, folder / "hf", arch)


models = once_fixture(build_case)


def has_in_proj_bias(model) -> bool:
    return bool(getattr(model.config, "mamba_proj_bias", False))


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_transformers_on_a_left_padded_batch(models, name):
    model, _, path = models(name)
    graph = load_spec(path)
    ids, mask, positions = prompts()
    got, real = irc_logits(graph, ids, mask, positions), mask.astype(bool)
    assert relative_error(got[real], unpadded_logits(model, ids, mask)[real]) <= TOLERANCE
    if not has_in_proj_bias(model):  # transformers' own padded batch is right only without in_proj's bias
        assert relative_error(got[real], hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_generation_matches(models, name):
    model, _, path = models(name)
    prompt = prompts()[0][0].tolist()
    assert_greedy_matches(load_spec(path), model, prompt, NEW_TOKENS)


def as_llama_cpp_computes(model, folder, arch: str, into):
    """The checkpoint in ``folder`` as the model its GGUF describes: Falcon-H1 with its
    multipliers folded into the weights and set to 1; the others as they are (Nemotron-H's Δ
    clamp, time_step_limit, which the converter does not write, is the default (0, inf) here)."""
    if arch != "falcon-h1":
        return folder
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, into)
    config = json.loads((into / "config.json").read_text())
    tensors = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
    save_file({k: v.contiguous() for k, v in falcon_h1_folded(model.config, tensors).items()},
              str(into / "model.safetensors"))
    config.update(UNIT)
    (into / "config.json").write_text(json.dumps(config))
    return into


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_graph_is_the_hf_frontends(models, tmp_path, name):
    """Both frontends, one model (the one llama.cpp computes): the same ops, attrs, params and
    mixer arguments; every param the checkpoint's tensor (Q and K un-permuted, Falcon-H1's
    folded), A_log to 2 float32 ulps of the file's ssm_a."""
    model, folder, path = models(name)
    arch = CASES[name][3]
    from_gguf = load_gguf(path, weights="float")
    from_hf = load_spec(as_llama_cpp_computes(model, folder, arch, tmp_path / "hf"))
    assert [n.op for n in from_gguf.nodes] == [n.op for n in from_hf.nodes]
    assert [as_float32(n.attrs) for n in from_gguf.nodes] == [as_float32(n.attrs) for n in from_hf.nodes]
    assert {n: p.shape for n, p in from_gguf.params.items()} == {n: p.shape for n, p in from_hf.params.items()}
    assert as_float32(from_gguf.meta["ssm"]) == as_float32(from_hf.meta["ssm"])
    stored = hybrid_converted(model.config, folder, arch)
    for param in from_hf.params:
        got, want = from_gguf.params[param].array(), from_hf.params[param].array()
        if param.endswith("A_log"):
            ssm_a = stored[f"blk.{param.split('.')[1]}.ssm_a"].reshape(got.shape)
            assert np.max(np.abs(-np.exp(got) - ssm_a) / np.spacing(np.abs(ssm_a))) <= 2, param
            np.testing.assert_allclose(got, want, rtol=0, atol=2 ** -22, err_msg=param)
        else:
            np.testing.assert_array_equal(got, want, err_msg=param)


def test_falcon_h1_multipliers_are_in_the_weights_not_the_graph(models):
    """The converter wrote no multiplier key; irc's graph multiplies by none of them."""
    model, folder, path = models("falcon-h1-multipliers")
    assert not any("multiplier" in key for key in hybrid_keys(model.config, "falcon-h1"))
    scaled = [n.outputs[0].name for n in load_spec(folder).nodes if n.outputs[0].name.endswith(("_scaled", "_mup"))]
    assert scaled  # the HF graph multiplies ...
    assert not [n for n in load_gguf(path, weights=None).nodes if n.outputs[0].name.endswith(("_scaled", "_mup"))]


def test_q8_0_granite_keeps_blocks_and_matches_float(models, tmp_path):
    """Q8_0 projections (experts and the permuted Q/K rows included) stay 8-bit codes; the
    blocks graph gives the float graph's logits."""
    model, folder, _ = models("granite-moe-shared-multipliers")
    path = write_hybrid(tmp_path / "q8.gguf", model, folder, "granitehybrid", qtype=gguf.GGMLQuantizationType.Q8_0)
    blocks, floats = load_gguf(path), load_gguf(path, weights="float")
    kept = {p[:-len(".qweight")] for p in blocks.params if p.endswith(".qweight")}
    assert {"layers.1.attn.wq", "layers.1.attn.wk", "layers.0.moe.w_gate", "layers.0.ssm.in_proj"} <= kept
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    want = irc_logits(floats, ids, mask, positions)
    assert relative_error(irc_logits(blocks, ids, mask, positions)[real], want[real]) <= 1e-5


# ---- bad files -------------------------------------------------------------------------------

@pytest.mark.parametrize("name, key", [("granite-moe-shared-multipliers", "granitehybrid.ssm.group_count"),
                                       ("granite-dense-nope-tied", "granitehybrid.attention.head_count_kv"),
                                       ("nemotron-h-pattern", "nemotron_h.feed_forward_length"),
                                       ("nemotron-h-pattern", "nemotron_h.attention.layer_norm_rms_epsilon"),
                                       ("falcon-h1-multipliers", "falcon-h1.ssm.inner_size"),
                                       ("falcon-h1-multipliers", "falcon-h1.attention.head_count")])
def test_a_missing_key_is_one_error_naming_file_and_key(models, tmp_path, name, key):
    model, folder, _ = models(name)
    arch = CASES[name][3]
    keys = {k: v for k, v in hybrid_keys(model.config, arch).items() if k != key}
    path = write_file(tmp_path / "bad.gguf", arch, keys, hybrid_converted(model.config, folder, arch))
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert str(err.value).count(f"{key}: missing required key") == 1
    assert "bad.gguf" in str(err.value)


@pytest.mark.parametrize("name, tensor", [("granite-moe-shared-multipliers", "blk.1.attn_k.weight"),
                                          ("nemotron-h-mlp-bias-one-group", "blk.1.ssm_norm.weight"),
                                          ("falcon-h1-multipliers", "blk.0.ffn_norm")])
def test_a_missing_tensor_is_named(models, tmp_path, name, tensor):
    model, folder, _ = models(name)
    arch = CASES[name][3]
    stored = {k: v for k, v in hybrid_converted(model.config, folder, arch).items() if k != tensor}
    path = write_file(tmp_path / "bad.gguf", arch, hybrid_keys(model.config, arch), stored)
    with pytest.raises(SpecError, match=f"no tensor {tensor}") as err:
        load_spec(path)
    assert "bad.gguf" in str(err.value)


def test_nemotron_h_moe_is_refused_by_name(models, tmp_path):
    model, folder, _ = models("nemotron-h-pattern")
    keys = {k.replace("nemotron_h.", "nemotron_h_moe."): v for k, v in hybrid_keys(model.config, "nemotron_h").items()}
    path = write_file(tmp_path / "moe.gguf", "nemotron_h_moe", keys, hybrid_converted(model.config, folder,
                                                                                    "nemotron_h"))
    with pytest.raises(SpecError, match="general.architecture: 'nemotron_h_moe' is not supported"):
        load_spec(path)
