"""The GGUF frontend's gptneox, falcon, glm4, cohere2, olmo, olmoe, gpt-oss, olmo2 (OLMo-3),
mistral3 (Ministral-3) and kimi-linear archs against transformers 5.24: tiny random twins
(``test_hf_models``' and their own), written as llama.cpp's converters write them
(``gguf_convert``), read back with ``load_spec``: the logits of a left-padded batch of two
equal transformers' on the real tokens (reference interpreter, and both ONNX targets through
ONNX Runtime), the 16-token greedy continuations equal (one prompt through the interpreter,
the padded batch through ONNX Runtime), the graph is the HF frontend's (ops, params) and every
param is the checkpoint's. GPT-OSS also with its experts stored as MXFP4 (as a released
checkpoint converts), the values held against transformers' own MXFP4 dequantizer;
onnxruntime-genai runs two of the GGUF-built folders; block formats (rows of fused tensors
among them) match the float graph of the same file; what a file must say is refused through
the CLI naming the key or tensor."""
import gguf
import numpy as np
import pytest

from frontends import load_spec
from frontends.gguf import load_gguf
from gguf_convert import converted, mxfp4_checkpoint, mxfp4_round_experts, mxfp4_values, repack_mxfp4, write_converted
from irc.interpreter import generate
from test_hf_kimi import SMALL as KIMI_BASE
from test_hf_models import (NEW_TOKENS, SMALL, TOLERANCE, assert_greedy_matches, assert_ort_run_matches, build_case,
                            hf_logits, irc_logits, prompts, relative_error, save_twin)
from twin_fixtures import once_fixture, random_twin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CASES = {  # test_hf_models' twin -> its GGUF architecture
    "gpt-neox-parallel": "gptneox", "gpt-neox-sequential-half-rotary": "gptneox",
    "falcon-7b-multi-query": "falcon", "falcon-40b-new-arch-biases": "falcon",
    "falcon-new-arch-one-norm-untied": "falcon", "glm4-sandwich-partial-rotary": "glm4",
    "cohere2-nope-global": "cohere2", "olmoe-top2": "olmoe", "olmo3-windows": "olmo2",
    "olmo-plain-norms-clip": "olmo", "olmo-mha-no-clip": "olmo", "ministral3-llama4-scale-yarn": "mistral3",
}
LOCAL = {  # name: (config class, overrides of SMALL, GGUF architecture)
    "olmo3-yarn-attention-factor": ("Olmo3Config", dict(num_hidden_layers=4, sliding_window=4, pad_token_id=0,
                                                        eos_token_id=2, layer_types=[
        "sliding_attention", "full_attention", "sliding_attention", "full_attention"], rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                           "original_max_position_embeddings": 8, "attention_factor": 1.5, "beta_fast": 32.0,
                           "beta_slow": 1.0}}), "olmo2"),
}
GPT_OSS = {  # name: (overrides of test_hf_gpt_oss.SMALL, expert gate/up scale, MXFP4 experts)
    "gpt-oss-alternating-yarn": (dict(rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}), 3.0, False),
    "gpt-oss-mxfp4-experts": (dict(num_key_value_heads=1, intermediate_size=32, rope_parameters={  # K % 32 == 0
        "rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "original_max_position_embeddings": 8,
        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}), 3.0, True),
}
ALL = sorted(CASES) + sorted(LOCAL) + sorted(GPT_OSS)
GENAI = ("falcon-40b-new-arch-biases", "gpt-oss-mxfp4-experts")


def _local(name: str, folder):
    class_name, overrides, _ = LOCAL[name]
    return save_twin(random_twin(class_name, {**SMALL, **overrides}, ALL.index(name)), folder)


def _gpt_oss(name: str, folder):
    from test_hf_gpt_oss import SMALL as OSS_SMALL

    overrides, scale, mxfp4 = GPT_OSS[name]
    model = random_twin("GptOssConfig", {**OSS_SMALL, **overrides, "bos_token_id": 1, "eos_token_id": 2},
                        ALL.index(name))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.mul_(10.0)
            layer.mlp.experts.gate_up_proj.mul_(scale)
    if mxfp4:
        mxfp4_round_experts(model)
    return (*save_twin(model, folder), mxfp4)


def gguf_twin(name: str, folder):
    """(transformers model, HF folder, GGUF path)."""
    if name in GPT_OSS:
        model, hf_folder, mxfp4 = _gpt_oss(name, folder)
        arch = "gpt-oss"
    elif name in LOCAL:
        model, hf_folder = _local(name, folder)
        arch, mxfp4 = LOCAL[name][2], False
    else:
        model, hf_folder = build_case(name, folder)
        arch, mxfp4 = CASES[name], False
    return model, hf_folder, write_converted(folder / f"{name}.gguf", model, arch, mxfp4=mxfp4, tokens=True)


models = once_fixture(gguf_twin)


@pytest.fixture(scope="module")
def batch_greedy(models):
    done = {}

    def get(name):
        if name not in done:
            model = models(name)[0]
            ids, mask, _ = prompts()
            with torch.no_grad():
                out = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                                     max_new_tokens=NEW_TOKENS, do_sample=False)
            done[name] = out[:, ids.shape[1]:].numpy()
        return done[name]

    return get


@pytest.mark.parametrize("name", ALL)
def test_logits_greedy_tokens_and_params_match(models, name):
    model, hf_folder, path = models(name)
    graph = load_spec(path)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    assert relative_error(irc_logits(graph, ids, mask, positions)[real],
                          hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE
    prompt = ids[0].tolist()
    assert_greedy_matches(graph, model, prompt, NEW_TOKENS)
    assert_same_graph_as_hf(path, hf_folder)


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", ALL)
def test_onnx_runtime_matches_transformers(models, batch_greedy, tmp_path, name, target):
    pytest.importorskip("onnxruntime")
    from backends.onnx import emit

    model, _, path = models(name)
    graph = load_spec(path)
    onnx_path = str(tmp_path / "model.onnx")
    emit.emit_model(graph, onnx_path, target=target, genai=False, context=64)
    assert_ort_run_matches(onnx_path, graph, hf_logits(model, *prompts()), batch_greedy(name))


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", GENAI)
def test_genai_runs_the_gguf_built_folder(models, batch_greedy, tmp_path, name, target):
    from tests.frontends.test_hf_ssm_onnx import assert_genai_generates, emit_genai_folder

    _, _, path = models(name)
    emit_genai_folder(load_spec(path), tmp_path, target)
    assert_genai_generates(tmp_path, batch_greedy(name)[0].tolist())


# ---- MXFP4 -----------------------------------------------------------------------------------

def test_mxfp4_experts_are_read_as_transformers_dequantizes_them(models):
    """The GGUF holds the experts as ggml MXFP4 blocks; irc's float32 values of every expert
    weight are exactly transformers' dequantization of the checkpoint's MXFP4 blocks, and the
    notes say the blocks were dequantized."""
    model, _, path = models("gpt-oss-mxfp4-experts")
    file = gguf.GGUFReader(path)
    kinds = {t.name: t.tensor_type for t in file.tensors}
    assert {kinds[f"blk.0.ffn_{p}_exps.weight"] for p in ("gate", "up", "down")} == {gguf.GGMLQuantizationType.MXFP4}
    graph = load_gguf(path)
    assert any("MXFP4 tensor(s) dequantized to float32" in note for note in graph.meta["gguf"]["notes"])
    experts = model.model.layers[1].mlp.experts
    rows = experts.gate_up_proj.detach().numpy().transpose(0, 2, 1)
    np.testing.assert_array_equal(graph.params["layers.1.moe.w_gate"].array(), rows[:, ::2])
    np.testing.assert_array_equal(graph.params["layers.1.moe.w_up"].array(), rows[:, 1::2])
    np.testing.assert_array_equal(graph.params["layers.1.moe.w_down"].array(),
                                  experts.down_proj.detach().numpy().transpose(0, 2, 1))


def test_mxfp4_dequantization_is_ggml_s_definition(tmp_path):
    """Every e2m1 code under scales from tiny (a float32 subnormal) to large (e8m0 1, 100, 127,
    140, 200): irc's values equal transformers' dequantization of the same checkpoint blocks
    and the OCP definition, code value x 2^(e - 127)."""
    rng = np.random.default_rng(0)
    exponents = np.array([1, 100, 127, 140, 200], np.uint8)
    codes = np.stack([rng.permutation(np.tile(np.arange(16, dtype=np.uint8), 2)) for _ in exponents])
    blocks = (codes[:, 0::2] | (codes[:, 1::2] << np.uint8(4)))[None, :, None, :]  # [1, 5 rows, 1 block, 16]
    scales = exponents[None, :, None]
    want = np.ldexp(np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])[codes],
                    exponents.astype(np.int64)[:, None] - 127).astype(np.float32)[None]
    np.testing.assert_array_equal(mxfp4_values(blocks, scales), want)
    from gguf_writer import write_file

    raw = repack_mxfp4(blocks, scales)
    path = write_file(tmp_path / "mxfp4.gguf", "gpt-oss", {}, {"t": (raw, gguf.GGMLQuantizationType.MXFP4)})
    from frontends.gguf.reader import GGUFFile
    from frontends.gguf.tensors import TensorSource

    np.testing.assert_array_equal(TensorSource("t").read_float(GGUFFile.open(path)), want)
    np.testing.assert_array_equal(mxfp4_values(*mxfp4_checkpoint(want)), want)  # the twins' quantizer is exact here


# ---- what the file must say: refused through the CLI, one message, exit 2, nothing written -----

def refused(capsys, tmp_path, path, *words) -> None:
    from irc_cli import main

    out = tmp_path / "out.onnx"
    assert main(["compile", str(path), "--target", "onnx", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("irc: error:") == 1 and str(path) in err, err
    for word in words:
        assert word in err, err
    assert not out.exists() and not list(tmp_path.glob("out.onnx*"))


def rewritten(model, arch: str, path, keys=None, drop=(), **extra) -> str:
    """``model``'s converted file with keys changed and tensors dropped or added."""
    from gguf_convert import converter_keys
    from gguf_writer import write_file

    tensors = {k: v for k, v in converted(model, arch).items() if k not in drop}
    return write_file(path, arch, {**converter_keys(model.config, arch), **(keys or {})}, {**tensors, **extra})


def test_gpt_oss_without_sinks_is_refused_naming_the_tensor(models, tmp_path, capsys):
    model = models("gpt-oss-alternating-yarn")[0]
    drop = [f"blk.{i}.attn_sinks.weight" for i in range(model.config.num_hidden_layers)]
    refused(capsys, tmp_path, rewritten(model, "gpt-oss", tmp_path / "nosinks.gguf", drop=drop),
            "blk.0.attn_sinks.weight: GPT-OSS's attention sinks are missing")


def test_gpt_oss_top_k_above_the_experts_is_refused_naming_the_key(models, tmp_path, capsys):
    model = models("gpt-oss-alternating-yarn")[0]
    path = rewritten(model, "gpt-oss", tmp_path / "topk.gguf", keys={"gpt-oss.expert_used_count": 5})
    refused(capsys, tmp_path, path, "gpt-oss.expert_used_count: top_k 5 exceeds 4 experts")


def test_falcon_without_the_fused_qkv_is_refused_naming_the_tensor(models, tmp_path, capsys):
    model = models("falcon-7b-multi-query")[0]
    qkv = converted(model, "falcon")["blk.1.attn_qkv.weight"]
    path = rewritten(model, "falcon", tmp_path / "split.gguf", drop=["blk.1.attn_qkv.weight"],
                     **{"blk.1.attn_q.weight": qkv[:32]})
    refused(capsys, tmp_path, path, "tensor blk.1.attn_qkv.weight is missing: falcon keeps q, k and v fused")


def test_olmo3_pattern_of_the_wrong_length_is_refused_naming_the_key(models, tmp_path, capsys):
    model = models("olmo3-windows")[0]
    path = rewritten(model, "olmo2", tmp_path / "pattern.gguf",
                     keys={"olmo2.attention.sliding_window_pattern": [True, False]})
    refused(capsys, tmp_path, path, "olmo2.attention.sliding_window_pattern: has 2 entries for 4 layers")


def test_mistral3_moe_is_refused_naming_the_tensor(models, tmp_path, capsys):
    model = models("ministral3-llama4-scale-yarn")[0]
    router = np.zeros((4, model.config.hidden_size), np.float32)
    path = rewritten(model, "mistral3", tmp_path / "moe.gguf", **{"blk.0.ffn_gate_inp.weight": router})
    refused(capsys, tmp_path, path, "blk.0.ffn_gate_inp.weight: mistral3's MoE layers are not supported")


def test_glm4_with_q_k_v_fused_in_attn_qkv_matches(models, tmp_path):
    """A GLM-4 file that keeps q, k and v in one ``attn_qkv`` (llama.cpp's loader takes either)
    is read by rows: the same logits."""
    from gguf_convert import converter_keys
    from gguf_writer import write_file

    model, _, _ = models("glm4-sandwich-partial-rotary")
    tensors = converted(model, "glm4")
    for block in range(model.config.num_hidden_layers):
        for kind in ("weight", "bias"):
            parts = [tensors.pop(f"blk.{block}.attn_{x}.{kind}") for x in "qkv"]
            tensors[f"blk.{block}.attn_qkv.{kind}"] = np.concatenate(parts)
    path = write_file(tmp_path / "fused.gguf", "glm4", converter_keys(model.config, "glm4"), tensors)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    assert relative_error(irc_logits(load_spec(path), ids, mask, positions)[real],
                          hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE


QUANTIZED = {  # name: (case, GGUF block type): rows of a fused tensor and MXFP4 experts beside blocks
    "falcon-40b-q8_0": ("falcon-40b-new-arch-biases", gguf.GGMLQuantizationType.Q8_0),
    "gpt-neox-q4_0": ("gpt-neox-parallel", gguf.GGMLQuantizationType.Q4_0),
    "glm4-q4_1": ("glm4-sandwich-partial-rotary", gguf.GGMLQuantizationType.Q4_1),
    "gpt-oss-mxfp4-q8_0": ("gpt-oss-mxfp4-experts", gguf.GGMLQuantizationType.Q8_0),
}


@pytest.mark.parametrize("name", sorted(QUANTIZED))
def test_block_formats_stay_quantized_and_match_float(models, tmp_path, name):
    """The same twin quantized: its blocks kept (``weights="exact"``: fused tensors' rows
    taken whole blocks at a time) give the float-weights graph's logits, through the
    interpreter and both ONNX targets."""
    from backends.onnx import emit, runtime

    case, qtype = QUANTIZED[name]
    model = models(case)[0]
    arch = "gpt-oss" if case in GPT_OSS else CASES[case]
    path = write_converted(tmp_path / f"{name}.gguf", model, arch, qtype=qtype, mxfp4=case in GPT_OSS)
    assert_blocks_match_float(path, tmp_path)


def test_the_same_file_compiles_to_the_same_bytes(models, tmp_path):
    path = models("gpt-oss-mxfp4-experts")[2]
    assert_compiles_to_the_same_bytes(path, tmp_path)


# ---- Kimi-Linear ------------------------------------------------------------------------------

KIMI_SMALL = dict(KIMI_BASE, num_expert_group=1, topk_group=1)
KIMI = {  # name: settings (what the converter can say: leading dense layers, renormalised, no groups)
    "kimi-direct-q": dict(KIMI_SMALL, num_hidden_layers=4, q_lora_rank=None, num_experts=4, num_experts_per_token=2,
                          first_k_dense_replace=1, linear_attn_config={
        "head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 3, "full_attn_layers": [2, 4], "kda_layers": [1, 3]}),
    "kimi-q-lora-two-shared": dict(KIMI_SMALL, num_hidden_layers=3, q_lora_rank=8, num_experts=6,
                                   num_experts_per_token=2, num_shared_experts=2, routed_scaling_factor=1.5,
                                   first_k_dense_replace=2, linear_attn_config={
        "head_dim": 6, "num_heads": 2, "short_conv_kernel_size": 4, "full_attn_layers": [1], "kda_layers": [2, 3]}),
}


def kimi_twin(name: str, folder):
    """(transformers model, HF folder, GGUF path)."""
    from gguf_convert import write_kimi

    model, _ = save_twin(random_twin("KimiLinearConfig", KIMI[name], sorted(KIMI).index(name)), folder)
    return model, folder, write_kimi(folder / f"{name}.gguf", model, folder)


kimi = once_fixture(kimi_twin, "kimi")


@pytest.mark.parametrize("name", sorted(KIMI))
def test_kimi_linear_matches_transformers(kimi, tmp_path, name):
    """Logits, 16 greedy tokens, the HF frontend's graph and params; both ONNX targets on the
    left-padded batch (conv and recurrent states and the MLA cache fed back)."""
    model, hf_folder, path = kimi(name)
    assert_gguf_twin_matches(path, hf_folder, model, tmp_path)


def test_kimi_linear_other_gating_is_refused_naming_the_key(kimi, tmp_path, capsys):
    from gguf_convert import kimi_converted, kimi_keys
    from gguf_writer import write_file

    model, folder, _ = kimi("kimi-direct-q")
    keys = {**kimi_keys(model.config), "kimi-linear.expert_gating_func": 1}
    path = write_file(tmp_path / "softmax.gguf", "kimi-linear", keys, kimi_converted(model.config, folder))
    refused(capsys, tmp_path, path, "kimi-linear.expert_gating_func: 1 is not sigmoid gating (2)")


def assert_same_graph_as_hf(path, hf_folder, attrs_of=()) -> None:
    """The file read with float weights is the HF frontend's graph of ``hf_folder``: the same
    ops in order (the same attrs on the ops named in ``attrs_of``), param shapes, and values
    within 1e-6."""
    from_gguf, from_hf = load_gguf(path, weights="float"), load_spec(hf_folder)
    assert [n.op for n in from_gguf.nodes] == [n.op for n in from_hf.nodes]
    for op in attrs_of:
        assert [n.attrs for n in from_gguf.nodes if n.op == op] == [n.attrs for n in from_hf.nodes if n.op == op]
    assert {n: p.shape for n, p in from_gguf.params.items()} == {n: p.shape for n, p in from_hf.params.items()}
    for param in from_hf.params:
        np.testing.assert_allclose(from_gguf.params[param].array(), from_hf.params[param].array(), rtol=0,
                                   atol=1e-6, err_msg=param)


def assert_gguf_twin_matches(path, hf_folder, model, tmp_path, attrs_of=()) -> None:
    """A GGUF twin against its transformers model: the interpreter's logits on the
    left-padded batch and its first row's greedy tokens; the HF frontend's graph
    (``assert_same_graph_as_hf``); then both ONNX targets' prefill logits and the batch's
    greedy tokens through ONNX Runtime (every state fed back)."""
    from backends.onnx import emit, runtime

    graph = load_spec(path)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    want = hf_logits(model, ids, mask, positions)
    assert relative_error(irc_logits(graph, ids, mask, positions)[real], want[real]) <= TOLERANCE
    with torch.no_grad():
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=NEW_TOKENS,
                             do_sample=False)
    batch = out[:, ids.shape[1]:].numpy()
    tokens, _ = generate(graph, ids[0].tolist(), NEW_TOKENS)
    assert tokens == batch[0].tolist()
    assert_same_graph_as_hf(path, hf_folder, attrs_of)
    long, short = ids[0].tolist(), ids[1][mask[1] == 1].tolist()
    for target in ("onnx", "onnx-ort"):
        onnx_path = str(tmp_path / f"{target}.onnx")
        emit.emit_model(graph, onnx_path, target=target, genai=False, context=64)
        result = runtime.greedy(runtime.ort_engine(onnx_path), graph, [long, short], NEW_TOKENS)
        assert relative_error(result["prefill"]["logits"][real], want[real]) <= TOLERANCE
        np.testing.assert_array_equal(result["tokens"], batch)


def assert_blocks_match_float(path, tmp_path, targets=("onnx", "onnx-ort")) -> None:
    """The file's blocks kept (``weights="exact"``) give the float-weights graph's logits on
    the left-padded batch: the interpreter within 1e-5, then each ONNX target's prefill."""
    from backends.onnx import emit, runtime

    blocks, floats = load_gguf(path, weights="exact"), load_gguf(path, weights="float")
    assert sum(n.op in ("dequant_linear", "dequantize") for n in blocks.nodes) >= 4
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    want = irc_logits(floats, ids, mask, positions)
    assert relative_error(irc_logits(blocks, ids, mask, positions)[real], want[real]) <= 1e-5
    long, short = ids[0].tolist(), ids[1][mask[1] == 1].tolist()
    for target in targets:
        onnx_path = str(tmp_path / f"{target}.onnx")
        emit.emit_model(blocks, onnx_path, target=target, genai=False, context=64)
        result = runtime.greedy(runtime.ort_engine(onnx_path), blocks, [long, short], 4)
        assert relative_error(result["prefill"]["logits"][real], want[real]) <= TOLERANCE


def assert_compiles_to_the_same_bytes(path, tmp_path) -> None:
    """Two onnx-ort compiles of the file write the same files, byte for byte."""
    from backends.onnx import emit

    written = []
    for run in range(2):
        onnx_path = tmp_path / f"{run}" / "model.onnx"
        onnx_path.parent.mkdir()
        emit.emit_model(load_spec(path), str(onnx_path), target="onnx-ort", genai=False, context=64)
        written.append(sorted((p.name, p.read_bytes()) for p in onnx_path.parent.iterdir()))
    assert written[0] == written[1]
