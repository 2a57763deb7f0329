"""xLSTM (``frontends.hf.families_xlstm``) against transformers' ``xLSTMForCausalLM``: tiny random
twins (rows of the twin harness, test_hf_twins.py, held as ``unmasked`` holds them) saved
with save_pretrained and loaded with load_spec(folder) give transformers' logits and its 16
greedy tokens (the mLSTM states C, n, m fed back step by step) through the
reference interpreter and both ONNX targets in ONNX Runtime; Triton (in its interpreter) and
the NumPy emitter against the reference interpreter; onnx-npu's host loop gives transformers'
greedy tokens; ``irc show`` counts the states.

transformers' xLSTM takes no ``attention_mask``, so a left-padded row is not the unpadded
prompt there: the twins run unpadded rows one at a time and a batch of rows of equal length,
and the left-padded batch is held against transformers' own padded batch (irc ignores the
mask too). The "xlstm" twin's chunk_size 4 sends whole chunks of a prefill through
transformers' chunkwise kernel (8 of the 11-token prompt's tokens, 8 of the batch's 9) and
the rest through its step kernel; irc's step form holds against both."""
import pytest

from frontends import load_spec
from tests.frontends.twins import ALONE, GREEDY_ALONE, ONNX_ALONE, PADDED_AS_HF, family, models_fixture
from tests.frontends.unmasked import assert_onnx_npu_generates, assert_triton_and_numpy_match, plain_causal_lm

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=128, hidden_size=128, num_hidden_layers=2, num_heads=4, bos_token_id=0, eos_token_id=0,
             pad_token_id=0)
CASES = {  # name: overrides of SMALL
    # xLSTM-7B's shape: qk half the stream (dk 16), v the stream (dv 32), FFN 2.667x rounded up to 64, caps 15 / 30;
    # chunk_size 4: prefills run transformers' chunkwise kernel on whole chunks
    "xlstm": dict(chunk_size=4),
    # 3 blocks of 2 heads over a 64 stream (dk = dv = 32), all prefills step by step (chunk_size 64), other caps and
    # epsilons, an FFN 1.5x rounded up to 16, biases everywhere (use_bias); tie_word_embeddings, which transformers'
    # xLSTM ignores (its own head)
    "xlstm-caps-bias": dict(hidden_size=64, num_hidden_layers=3, num_heads=2, qk_dim_factor=1.0, gate_soft_cap=5.0,
                            output_logit_soft_cap=10.0, eps=1e-3, norm_eps=1e-5, ffn_proj_factor=1.5,
                            ffn_round_up_to_multiple_of=16, use_bias=True, tie_word_embeddings=True),
}


def randomize(model, seed: int) -> None:
    """Norm weights near 1, other biases near 0, input gate biases around 0 and forget gate
    biases around 3 (the memory keeps most of itself, as xLSTM's init makes it), matrices of
    unit-scale activations."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if name.endswith("fgate_preact.bias"):
                p.copy_(3.0 + noise)
            elif name.endswith("igate_preact.bias"):
                p.copy_(noise)
            elif name.endswith("bias"):
                p.copy_(0.2 * noise)
            elif p.ndim == 1:
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(noise * p.shape[-1] ** -0.5)


TWINS = family("xLSTMConfig", SMALL, CASES, checks=(ALONE, PADDED_AS_HF, GREEDY_ALONE, ONNX_ALONE),
               make=plain_causal_lm, randomizer=randomize)


models = models_fixture(TWINS)


def test_triton_and_numpy_match_the_reference(models, tmp_path):
    """The mLSTM recurrence as a torch fallback under Triton; the NumPy module bit for bit."""
    _, folder = models("xlstm")
    assert_triton_and_numpy_match(folder, tmp_path, "xlstm")


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_npu_generates_transformers_tokens(models, tmp_path, name):
    """The mLSTM a token at a time on onnx-npu (backends/onnx_npu/mlstm.py), f32, chunks of 4."""
    model, folder = models(name)
    assert_onnx_npu_generates(model, folder, tmp_path)


def test_onnx_npu_compiles_entirely_on_the_htp(models, tmp_path):
    """fp16 (the default precision): the chunk graph for soc 60 and the decode graph for soc 69
    with every node on the HTP (onnxruntime-qnn's compile)."""
    pytest.importorskip("onnxruntime_qnn")
    from backends.onnx_npu import qnn
    from irc_cli.commands import main

    folder = tmp_path / "fp16"
    assert main(["compile", str(models("xlstm")[1]), "--target", "onnx-npu", "-o", str(folder), "--context", "32",
                 "--chunk", "4", "--quiet"]) == 0
    for graph, soc in (("chunk", 60), ("decode", 69)):
        result = qnn.compile_htp(str(folder / f"{graph}.onnx"), soc, out=str(tmp_path / f"{graph}_{soc}_ctx.onnx"))
        assert result.ok and result.on_cpu == 0 and result.on_npu > 0, (graph, soc, result.error, result.refusals[:3])


def test_state_is_graph_io_and_counted(models):
    """C [4, 16, 32], n [4, 16] and m [4, 1] per block, float32; each block an mlstm layer."""
    from irc.analysis import analyze

    graph = load_spec(models("xlstm")[1])
    inputs, outputs = [v.name for v in graph.inputs], [v.name for v in graph.outputs]
    for i in range(2):
        for kind in ("recurrent_state", "normalizer_state", "max_state"):
            assert f"past_key_values.{i}.{kind}" in inputs and f"present.{i}.{kind}" in outputs
    report = analyze(graph)
    assert report["state_bytes_per_sequence"] == 2 * 4 * (4 * 16 * 32 + 4 * 16 + 4)
    assert [layer["mixer"] for layer in report["layers"]] == ["mlstm", "mlstm"]


def test_default_config_counts_transformers_parameters(tmp_path):
    """xLSTMConfig's defaults (xLSTM-7B's sizes), written by transformers and as the bare
    model type: irc's parameter count is transformers' (its own head: 6.87B)."""
    import json

    from irc.analysis import analyze

    config = transformers.xLSTMConfig()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    want = sum(p.numel() for p in model.parameters())
    for written in (config.to_dict(), {"model_type": "xlstm"}):
        (tmp_path / "config.json").write_text(json.dumps(written))
        assert analyze(load_spec(tmp_path))["params_total"] == want
    assert round(want / 1e9, 2) == 6.87
