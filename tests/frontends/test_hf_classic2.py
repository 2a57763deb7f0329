"""``frontends.hf.families_classic2`` beyond its twins in ``test_hf_models`` (BitNet, CTRL,
GPT-NeoX-Japanese, ModernBERT-decoder):

- CTRL's sinusoidal positions (``irc.ops.positions`` with ``frequencies`` "transformer")
  against transformers' ``positional_encoding``, refused for an odd width, and lowered alike by
  both ONNX targets and the Triton fallback;
- a BitNet checkpoint with a ``quantization_config`` is refused naming the key when its
  weights are read (transformers' BitLinear rounds each linear's input to int8 per token),
  and its structure compiles;
- GPT-NeoX-Japanese's legacy ``rotary_pct`` / ``rotary_emb_base`` and ModernBERT-decoder's
  legacy ``global_rope_theta`` / ``local_rope_theta`` with its derived layer types read as
  transformers reads them (the re-saved twin against transformers' model of that folder);
- a tied checkpoint that holds its head's own tensor, unequal to the embeddings
  (``embed_out.weight``, ``decoder.weight``, ``lm_head.weight``), reads the head from it, as
  transformers 5 does (it leaves the two untied);
- ModernBERT-decoder with a silu MLP (its activated half of ``Wi`` as SwiGLU's gate)."""
import json
import shutil

import numpy as np
import pytest

from frontends import load_spec
from irc import ops
from irc.build import emit
from irc.dtypes import DType
from irc.errors import ShapeError, SpecError
from irc.graph import Graph, Value
from irc.ops.positions import sinusoidal_rows
from irc.testing import run_op
from tests.frontends.test_hf_models import models  # noqa: F401 (the twins' fixture)
from tests.frontends.test_hf_models import (SMALL, TOLERANCE, hf_logits, irc_logits, prompts, randomize,
                                            relative_error, save_twin)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
OP = "sinusoidal_positions"
CTRL = {"frequencies": "transformer"}


@pytest.mark.parametrize("dim", [32, 48, 1280])
def test_ctrl_table_matches_transformers(dim):
    from transformers.models.ctrl.modeling_ctrl import positional_encoding

    want = positional_encoding(256, dim, torch.float).numpy()
    got = sinusoidal_rows(np.arange(256), dim, None, "transformer")
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    (rows,) = run_op(OP, [np.array([[0, 1, 2], [0, 0, 255]], np.int64)], {"dim": dim, **CTRL})
    np.testing.assert_array_equal(rows, got[[[0, 1, 2], [0, 0, 255]]])


@pytest.mark.parametrize("attrs, message", [({"dim": 9, **CTRL}, "even dim"),
                                            ({"dim": 8, "frequencies": "rope"}, "frequencies must be one of")])
def test_inference_refuses(attrs, message):
    with pytest.raises(ShapeError, match=message):
        ops.infer(OP, [Value("p", DType.i64, ("B", "T"))], ops.get_op(OP).normalize_attrs(attrs))


def positions_graph(attrs: dict) -> Graph:
    g = Graph(OP)
    positions = g.add_input("position_ids", DType.i64, ("B", "T"))
    g.outputs = emit(g, OP, [positions], attrs, ["table"])
    return g


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_onnx_lowers_ctrl_positions_as_the_reference(tmp_path, target):
    ort = pytest.importorskip("onnxruntime")
    from backends.onnx.emit import emit_model
    from irc.interpreter import Interpreter

    graph = positions_graph({"dim": 32, **CTRL})
    path = str(tmp_path / "m.onnx")
    emit_model(graph, path, target=target, genai=False)
    feeds = {"position_ids": np.array([[0, 1, 2, 3, 4, 200], [0, 0, 0, 0, 1, 2]], np.int64)}
    (got,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got, Interpreter(graph).run(feeds)["table"], rtol=0, atol=2e-5)


def test_triton_fallback_line_lowers_ctrl_positions_as_the_reference():
    from backends.triton.fallback import HELPERS, fallback_line

    attrs = ops.get_op(OP).normalize_attrs({"dim": 32, **CTRL})
    line, helpers = fallback_line(OP, attrs, ["p"], [Value("table", DType.f32, (2, 6, 32))])
    namespace = {"torch": torch}
    for name in sorted(helpers):
        exec(HELPERS[name], namespace)
    positions = np.array([[0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 1, 200]], np.int64)
    got = eval(line, {**namespace, "p": torch.from_numpy(positions)})
    np.testing.assert_allclose(got.numpy(), sinusoidal_rows(positions, 32, None, "transformer"), rtol=0, atol=2e-5)


def copied(folder, tmp_path, edit) -> str:
    """The twin's folder copied to ``tmp_path``, its config.json dict passed through ``edit``."""
    target = tmp_path / "copy"
    shutil.copytree(folder, target)
    config = json.loads((target / "config.json").read_text())
    edit(config)
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return str(target)


def test_bitnet_quantized_checkpoint_is_refused_naming_the_key(models, tmp_path):  # noqa: F811
    from frontends.hf import load_hf

    _, folder = models("bitnet-sub-norms-gqa")
    quantized = copied(folder, tmp_path, lambda c: c.update(quantization_config={
        "quant_method": "bitnet", "linear_class": "bitlinear", "quantization_mode": "offline"}))
    with pytest.raises(SpecError, match="quantization_config"):
        load_spec(quantized)
    graph = load_hf(quantized, weights=False)
    assert any(name.endswith("attn.out_norm") for name in graph.params)


def test_gpt_neox_japanese_legacy_rotary_keys(models, tmp_path):  # noqa: F811
    model, folder = models("gpt-neox-japanese-half-rotary")

    def legacy(config):
        config.pop("rope_parameters")
        config.update(rotary_pct=0.5, rotary_emb_base=10000)
    resaved = copied(folder, tmp_path, legacy)
    assert transformers.AutoConfig.from_pretrained(resaved).rope_parameters["partial_rotary_factor"] == 0.5
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    got = irc_logits(load_spec(resaved), ids, mask, positions)
    assert relative_error(got[real], hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE


def test_modernbert_decoder_legacy_thetas_and_derived_layer_types(models, tmp_path):  # noqa: F811
    _, folder = models("modernbert-decoder-windows-tied")

    def legacy(config):
        config.pop("rope_parameters")
        config.pop("layer_types")
        config.update(global_rope_theta=20000.0, local_rope_theta=500.0, global_attn_every_n_layers=2)
    resaved = copied(folder, tmp_path, legacy)
    model = transformers.AutoModelForCausalLM.from_pretrained(resaved, attn_implementation="eager").eval()
    assert model.config.layer_types == ["full_attention", "sliding_attention", "full_attention"]
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    got = irc_logits(load_spec(resaved), ids, mask, positions)
    assert relative_error(got[real], hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE


@pytest.mark.parametrize("name, head", [("gpt-neox-japanese-half-rotary", "embed_out.weight"),
                                        ("modernbert-decoder-windows-tied", "decoder.weight"),
                                        ("ctrl-sinusoidal-head-bias", "lm_head.weight")])
def test_a_tied_checkpoint_holding_its_heads_copy_reads_it(models, tmp_path, name, head):  # noqa: F811
    from safetensors.numpy import load_file, save_file

    _, folder = models(name)
    tensors = load_file(folder / "model.safetensors")
    assert head not in tensors
    embed = next(key for key in tensors if key.endswith(("embed_in.weight", "tok_embeddings.weight", "w.weight")))
    tensors[head] = np.ascontiguousarray(tensors[embed][::-1])  # unequal: transformers leaves the two untied
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    got = irc_logits(load_spec(tmp_path), ids, mask, positions)
    assert relative_error(got[real], hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE


def test_modernbert_decoder_silu_mlp_is_swiglu(tmp_path):
    """``hidden_activation`` silu: the activated half of ``Wi`` is SwiGLU's gate."""
    config = transformers.ModernBertDecoderConfig(**{**SMALL, "num_key_value_heads": 4}, hidden_activation="silu",
                                                  local_attention=4, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=7, norm_centre=1.0)
    model, folder = save_twin(model, tmp_path)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    got = irc_logits(load_spec(folder), ids, mask, positions)
    assert relative_error(got[real], hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE
