"""The GGUF frontend's state-space archs (mamba, mamba2, jamba) against transformers: tiny
random Mamba, Falcon-Mamba, Mamba-2 and Jamba twins written as llama.cpp's converter writes them
(``gguf_writer``: ssm_a = -exp(A_log), squeezed conv, [H, 1] A and D, grouped norm,
dt_bias as ssm_dt.bias), read back with ``load_spec(file.gguf)``: the logits of a
left-padded batch and the greedy continuation equal transformers', the graph is the HF
frontend's, a Q8_0 file keeps its projections' blocks and matches its float graph, and a
missing key or tensor is one SpecError naming the file and the key."""
import gguf
import numpy as np
import onnx
import pytest

from frontends import load_spec
from frontends.gguf import load_gguf
from gguf_writer import converted, ssm_keys, write_file, write_model
from irc.errors import SpecError
from irc.interpreter import generate
from test_hf_models import TOLERANCE, assert_greedy_matches, hf_logits, irc_logits, prompts, relative_error
from test_hf_ssm import SMALL, unpadded_logits
from twin_fixtures import once_fixture, random_twin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NEW_TOKENS = 8
CASES = {  # name: (config class, overrides of test_hf_ssm.SMALL, GGUF architecture)
    "mamba-tied": ("MambaConfig", dict(state_size=8, conv_kernel=4, expand=2), "mamba"),
    "mamba-bias-rank-5-untied": ("MambaConfig", dict(state_size=4, conv_kernel=3, use_bias=True, time_step_rank=5,
                                                     tie_word_embeddings=False, num_hidden_layers=3), "mamba"),
    # llama.cpp normalises dt, B and C at layer_norm_rms_epsilon (mixer_rms_eps is not in the file)
    "falcon-mamba": ("FalconMambaConfig", dict(state_size=8, conv_kernel=4, mixer_rms_eps=1e-5), "mamba"),
    "mamba2-groups": ("Mamba2Config", dict(num_heads=8, head_dim=8, state_size=8, n_groups=2, conv_kernel=4,
                                           chunk_size=8), "mamba2"),
    "mamba2-one-group-no-conv-bias-tied": ("Mamba2Config", dict(num_heads=4, head_dim=16, state_size=12, n_groups=1,
                                                                conv_kernel=3, use_conv_bias=False, chunk_size=4,
                                                                tie_word_embeddings=True), "mamba2"),
    # layers: Mamba + MLP, attention + MoE, Mamba + MLP, attention + MoE
    "jamba-moe": ("JambaConfig", dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=48, num_experts=4, num_experts_per_tok=2,
                                      expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2,
                                      attn_layer_offset=1, mamba_d_state=8), "jamba"),
}


def build_case(name: str, folder):
    class_name, overrides, arch = CASES[name]
    model = random_twin(class_name, {**SMALL, **overrides}, sorted(CASES).index(name), eager=False)
    return model, write_model(folder / f"{name}.gguf", model, arch)


models = once_fixture(build_case)


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_transformers_on_a_left_padded_batch(models, name):
    model, path = models(name)
    graph = load_spec(path)
    ids, mask, positions = prompts()
    got, real = irc_logits(graph, ids, mask, positions), mask.astype(bool)
    assert relative_error(got[real], unpadded_logits(model, ids, mask)[real]) <= TOLERANCE
    config = model.config
    if not getattr(config, "use_bias", None) and not getattr(config, "mamba_proj_bias", None):
        # transformers' own padded batch is right only without in_proj's bias
        assert relative_error(got[real], hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_generation_matches(models, name):
    model, path = models(name)
    prompt = prompts()[0][0].tolist()
    assert_greedy_matches(load_spec(path), model, prompt, NEW_TOKENS)


def as_float32(attrs: dict) -> dict:
    """GGUF stores epsilons as float32."""
    return {k: float(np.float32(v)) if isinstance(v, float) else v for k, v in attrs.items()}


@pytest.mark.parametrize("name", ["mamba-bias-rank-5-untied", "falcon-mamba", "mamba2-groups", "jamba-moe"])
def test_the_graph_is_the_hf_frontends(models, tmp_path, name):
    """Same model, both frontends: the same ops, params (names, shapes) and mixer arguments;
    A_log read back from ssm_a = -exp(A_log) gives the file's A to 2 float32 ulps."""
    model, path = models(name)
    model.save_pretrained(tmp_path)
    from_gguf, from_hf = load_gguf(path, weights="float"), load_spec(tmp_path)
    assert [n.op for n in from_gguf.nodes] == [n.op for n in from_hf.nodes]
    assert [as_float32(n.attrs) for n in from_gguf.nodes] == [as_float32(n.attrs) for n in from_hf.nodes]
    assert {n: p.shape for n, p in from_gguf.params.items()} == {n: p.shape for n, p in from_hf.params.items()}
    assert as_float32(from_gguf.meta["ssm"]) == as_float32(from_hf.meta["ssm"])
    stored = converted(model, CASES[name][2])
    for param in from_hf.params:
        got, want = from_gguf.params[param].array(), from_hf.params[param].array()
        if param.endswith("A_log"):  # irc's A against the file's ssm_a (what llama.cpp computes with)
            ssm_a = stored[f"blk.{param.split('.')[1]}.ssm_a"].reshape(got.shape)
            assert np.max(np.abs(-np.exp(got) - ssm_a) / np.spacing(np.abs(ssm_a))) <= 2, param
            np.testing.assert_allclose(got, want, rtol=0, atol=2 ** -22, err_msg=param)
        else:
            np.testing.assert_array_equal(got, want, err_msg=param)


@pytest.mark.parametrize("name", ["mamba-bias-rank-5-untied", "mamba2-groups", "jamba-moe"])
def test_q8_0_keeps_blocks_and_matches_float(models, tmp_path, name):
    """Q8_0 projections stay 8-bit codes (``dequant_linear``); conv, A, D and norms, which
    the converter keeps in float32, are read as floats; the blocks graph gives the float
    graph's logits and greedy tokens, and so do both ONNX targets in ONNX Runtime
    (MatMulNBits on onnx-ort; ``weights="exact"``: float activations, exact products)."""
    from backends.onnx import emit, runtime

    model, _ = models(name)
    path = write_model(tmp_path / f"{name}.q8_0.gguf", model, CASES[name][2], qtype=gguf.GGMLQuantizationType.Q8_0)
    blocks, floats = load_gguf(path, weights="exact"), load_gguf(path, weights="float")
    kept = {p[:-len(".qweight")] for p in blocks.params if p.endswith(".qweight")}
    assert {"layers.0.ssm.in_proj", "layers.0.ssm.out_proj", "embed"} <= kept
    assert not any(".conv" in p or "A_log" in p for p in kept)
    assert any(n.op == "dequant_linear" for n in blocks.nodes)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    want = irc_logits(floats, ids, mask, positions)
    assert relative_error(irc_logits(blocks, ids, mask, positions)[real], want[real]) <= 1e-5
    prompt = ids[0].tolist()
    assert generate(blocks, prompt, NEW_TOKENS)[0] == generate(floats, prompt, NEW_TOKENS)[0]
    for target in ("onnx", "onnx-ort"):
        onnx_path = str(tmp_path / f"{target}.onnx")
        emit.emit_model(blocks, onnx_path, target=target, genai=False)
        ops = {n.op_type for n in onnx.load(onnx_path).graph.node}
        assert ("MatMulNBits" in ops) == (target == "onnx-ort")
        result = runtime.greedy(runtime.ort_engine(onnx_path), blocks, [prompt, ids[1][real[1]].tolist()], 4)
        assert relative_error(result["prefill"]["logits"][real], want[real]) <= TOLERANCE


def test_params_read_by_rows_as_whole(models):
    """What a streaming writer reads piece by piece is the whole param's rows (A_log of
    Mamba-1 included: transformed row by row)."""
    from irc.weights import read_rows, reads_rows

    _, path = models("mamba-tied")
    graph = load_gguf(path)
    checked = []
    for param in graph.params.values():
        if reads_rows(param.data) and param.shape[0] > 2:
            np.testing.assert_array_equal(read_rows(param, 1, 3), param.array()[1:3], err_msg=param.name)
            checked.append(param.name)
    assert "layers.0.ssm.A_log" in checked and "layers.0.ssm.in_proj" in checked


# ---- bad files ---------------------------------------------------------------------------

def _file(tmp_path, models, name: str, drop_key=None, drop_tensor=None, change=None) -> str:
    model, _ = models(name)
    arch = CASES[name][2]
    keys = {k: v for k, v in ssm_keys(model.config, arch).items() if k != drop_key}
    stored = {k: v for k, v in converted(model, arch).items() if k != drop_tensor}
    if change is not None:
        change(stored)
    return write_file(tmp_path / "bad.gguf", arch, keys, stored)


@pytest.mark.parametrize("name, key", [("mamba-tied", "mamba.ssm.state_size"),
                                       ("mamba-tied", "mamba.ssm.time_step_rank"),
                                       ("mamba2-groups", "mamba2.ssm.group_count"),
                                       ("mamba2-groups", "mamba2.ssm.conv_kernel")])
def test_a_missing_ssm_key_is_one_error_naming_file_and_key(models, tmp_path, name, key):
    path = _file(tmp_path, models, name, drop_key=key)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert str(err.value).count(f"{key}: missing required key") == 1
    assert "bad.gguf" in str(err.value)


def test_a_missing_ssm_tensor_is_named(models, tmp_path):
    path = _file(tmp_path, models, "mamba2-groups", drop_tensor="blk.1.ssm_a")
    with pytest.raises(SpecError, match="no tensor blk.1.ssm_a") as err:
        load_spec(path)
    assert "bad.gguf" in str(err.value)


def test_heads_that_do_not_divide_the_groups(models, tmp_path):
    model, _ = models("mamba2-groups")
    keys = {**ssm_keys(model.config, "mamba2"), "mamba2.ssm.group_count": 3}
    path = write_file(tmp_path / "groups.gguf", "mamba2", keys, converted(model, "mamba2"))
    with pytest.raises(SpecError, match="mamba2.ssm.group_count: 3 groups do not divide 8 heads"):
        load_spec(path)


def test_an_ssm_a_that_is_not_negative_is_refused_when_read(models, tmp_path):
    def positive(stored):
        stored["blk.0.ssm_a"] = np.abs(stored["blk.0.ssm_a"])

    graph = load_gguf(_file(tmp_path, models, "mamba-tied", change=positive))
    with pytest.raises(SpecError, match="blk.0.ssm_a holds .* -exp\\(A_log\\)"):
        graph.params["layers.0.ssm.A_log"].array()
