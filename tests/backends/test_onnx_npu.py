"""--target onnx-npu: the static-shape folder, its host loop against the reference
interpreter (greedy tokens equal, fp16 logits within 1e-2 relative) on every tiny decoder
example, determinism, and one message + exit 2 for each bad input. The tiny examples with
recurrent layers (state-space, linear attention: recurrent states among the graph inputs)
are held to the reference in test_onnx_npu_recurrent.py; a recurrent op without a lowering
(RWKV-4's token shift, taken out of the table) to its refusal here."""
import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from backends.onnx_npu.host import Host, generate, load_contract, prefill_logits
from frontends import load_spec
from irc.check import relative_error
from irc.errors import IRCError
from irc.evaluate import StreamingInterpreter
from irc.analysis import state_inputs
from irc.evaluate import prefill_logits as reference_prefill
from irc.interpreter import generate as reference_generate
from irc_cli.commands import main
from irc.testing import one_graph  # noqa: E402

# the decoders (the image encoders' vision graphs: tests/backends/test_onnx_npu_vision.py)
EXAMPLES = sorted(str(p) for p in Path("examples").glob("tiny-*.yaml")
                  if one_graph(p) and "vision" not in load_spec(p).meta)
RECURRENT = [spec for spec in EXAMPLES if state_inputs(load_spec(spec))]
DECODERS = [spec for spec in EXAMPLES if spec not in RECURRENT]


# a recurrent op without an onnx-npu lowering: RWKV-4's token shift taken out of the table
RWKV = {"model_type": "rwkv", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "attention_hidden_size": 32,
        "intermediate_size": 64, "context_length": 64}


LLAMA = "examples/tiny-llama3.yaml"
PROMPT = [3, 17, 42, 99, 5, 7, 250, 11, 60, 61, 62]   # 11 tokens: 3 chunks of 4 (the last padded), past window 8


def compile_npu(spec, folder, *extra, context=32, chunk=4):
    code = main(["compile", spec, "--target", "onnx-npu", "-o", str(folder), "--context", str(context),
                 "--chunk", str(chunk), "--quiet", *extra])
    assert code == 0
    return folder


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return compile_npu(LLAMA, tmp_path_factory.mktemp("npu") / "llama")


def test_folder_and_static_signature(llama_folder):
    contract = load_contract(str(llama_folder))
    assert sorted(p.name for p in llama_folder.iterdir()) == ["chunk.onnx", "decode.onnx", "irc_npu.json",
                                                              "model.data"]
    assert (contract["chunk"], contract["context"], contract["dtype"]) == (4, 32, "f16")
    for role, tokens in (("chunk", 4), ("decode", 1)):
        path = str(llama_folder / contract["graphs"][role])
        onnx.checker.check_model(path)
        model = onnx.load(path, load_external_data=False)
        shapes = {v.name: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in
                           v.type.tensor_type.shape.dim] for v in [*model.graph.input, *model.graph.output]}
        assert shapes["input_ids"] == [1, tokens] and shapes["position_ids"] == [1, tokens]
        assert shapes["attention_bias"] == [1, 1, tokens, 32 + tokens]
        assert shapes["past_key_values.0.key"] == [1, 2, 32, 16] and shapes["present.0.key"] == [1, 2, tokens, 16]
        assert all(isinstance(d, int) for dims in shapes.values() for d in dims)  # static: no symbolic dim
        ops = {n.op_type for n in model.graph.node}
        assert not ops & {"Shape", "Range", "Expand", "Where", "RotaryEmbedding", "Attention"}
        external = {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
        assert external == {"model.data"}  # one weights file for both graphs


def test_deterministic(tmp_path, llama_folder):
    again = compile_npu(LLAMA, tmp_path / "again")
    for name in ("chunk.onnx", "decode.onnx", "model.data", "irc_npu.json"):
        assert (again / name).read_bytes() == (llama_folder / name).read_bytes(), name


@pytest.mark.parametrize("spec", DECODERS)
def test_host_loop_matches_interpreter(spec, tmp_path):
    """Chunked prefill (a padded last chunk) and decode past the sliding windows. f32: the
    interpreter's greedy tokens exactly (the contract: cache placement, masks, RoPE rows).
    fp16: every step's logits within 1e-2 relative, teacher-forced on the interpreter's
    tokens, and the same greedy tokens unless the interpreter's own top-2 margin at the
    first difference is inside that tolerance (tiny-mixtral at chunk 4: 2.2671 vs 2.2646,
    below fp16's resolution at that size)."""
    graph = load_spec(spec)
    expected, _ = reference_generate(graph, PROMPT, 5, seed=0)
    exact = compile_npu(spec, tmp_path / "f32", "--precision", "f32")
    assert generate(str(exact), PROMPT, 5) == expected
    folder = compile_npu(spec, tmp_path / "fp16")
    ids = PROMPT + expected[:-1]
    reference = reference_prefill(StreamingInterpreter(graph, 0), ids)[len(PROMPT) - 1:]
    got = prefill_logits(str(folder), ids)[len(PROMPT) - 1:].astype(np.float32)
    for step in range(5):
        assert relative_error(got[step], reference[step]) < 1e-2
    tokens = generate(str(folder), PROMPT, 5)
    if tokens != expected:
        first = next(i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b)
        top2 = np.sort(reference[first])[-2:]
        assert top2[1] - top2[0] < 1e-2 * np.abs(reference[first]).max()


def unlowered_spec(tmp_path, monkeypatch) -> Path:
    from backends.onnx_npu import emit

    monkeypatch.delitem(emit.TABLE, "token_shift")
    (tmp_path / "rwkv").mkdir()
    (tmp_path / "rwkv" / "config.json").write_text(json.dumps(RWKV))
    return tmp_path / "rwkv"


def test_unlowered_recurrent_layers_are_refused(tmp_path, capsys, monkeypatch):
    """One message naming the recurrent op and its node (the first the target does not
    lower), with the targets that take it; exit 2 and nothing written."""
    spec, out = unlowered_spec(tmp_path, monkeypatch), tmp_path / "out"
    assert main(["compile", str(spec), "--weights", "seeded", "--target", "onnx-npu", "-o", str(out), "--context",
                 "32", "--chunk", "4", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("irc: error: node %") and err.count("irc: error:") == 1 and "Traceback" not in err
    found = re.search(r"node %(\S+?),.* op '(\w+)' .*is a recurrent layer that onnx-npu has no lowering for", err)
    assert found, err
    assert found.groups() == ("layers.0.time_shift", "token_shift")
    assert "--target onnx or --target onnx-ort" in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["rwkv"]


def test_recurrent_layers_are_refused_before_calibration(tmp_path, capsys, monkeypatch):
    calibration = tmp_path / "ids.txt"
    calibration.write_text(",".join(str(i) for i in range(64)))
    out = tmp_path / "out"
    assert main(["compile", str(unlowered_spec(tmp_path, monkeypatch)), "--weights", "seeded", "--target", "onnx-npu", "-o",
                 str(out), "--precision", "w8a16", "--calibration", str(calibration), "--quiet"]) == 2
    assert "is a recurrent layer" in capsys.readouterr().err and not out.exists()


def test_f32_precision_and_eos(tmp_path):
    folder = compile_npu(LLAMA, tmp_path / "f32", "--precision", "f32")
    assert load_contract(str(folder))["dtype"] == "f32"
    expected, _ = reference_generate(load_spec(LLAMA), PROMPT, 4, seed=0)
    seen = []
    assert generate(str(folder), PROMPT, 4, on_token=seen.append) == expected == seen
    assert generate(str(folder), PROMPT, 4, eos_ids=[expected[1]]) == expected[:2]


def test_masks_follow_the_cache(llama_folder):
    host = Host(load_contract(str(llama_folder)), engines={})
    host.filled = 5
    bias = host.feeds([1, 2], 4)["attention_bias"][0, 0]   # two real tokens, two padded rows
    visible = bias == 0
    assert visible[0, :5].all() and not visible[0, 5:32].any()          # filled slots only
    assert visible[0, 32] and not visible[0, 33] and visible[1, 32:34].all()  # causal among the new
    assert visible[2].sum() == 1 and visible[2, 34] and visible[3, 35]  # padded rows: themselves


def test_sequence_longer_than_the_cache(llama_folder):
    with pytest.raises(IRCError, match="does not fit the 32-slot KV cache"):
        generate(str(llama_folder), list(range(30)), 4)


@pytest.mark.parametrize("argv, message", [
    (["--chunk", "0"], "--chunk 0 must be a positive number"),
    (["--context", "0"], "--context 0 must be a positive number"),
    (["--context", "4", "--chunk", "8"], "--context 4 is smaller than --chunk 8"),
    (["--passes", "mla-absorb,lower-norms,lower-mlp"], "compile without mla-absorb"),
    (["--precision", "w8a16"], "--precision w8a16 needs --calibration FILE"),
    (["--calibration", "examples/tiny-llama3.yaml"], "--calibration applies to --precision w8a16 or w4a16"),
])
def test_bad_input_one_message_exit_2(argv, message, tmp_path, capsys):
    spec = "examples/tiny-deepseek-v2.yaml" if any("mla-absorb" in a for a in argv) else LLAMA
    out = tmp_path / "out"
    assert main(["compile", spec, "--target", "onnx-npu", "-o", str(out), "--quiet", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.startswith("irc: error:")
    assert not out.exists()


def test_no_npu_lowering_names_the_pass(tmp_path, capsys):
    assert main(["compile", LLAMA, "--target", "onnx-npu", "-o", str(tmp_path / "o"), "--passes", "dce"]) == 2
    err = capsys.readouterr().err
    assert "op 'rms_norm' has no NPU lowering" in err and "needed: lower-norms" in err


def test_not_an_npu_folder(tmp_path):
    with pytest.raises(IRCError, match="has no irc_npu.json"):
        generate(str(tmp_path), [1], 1)


def test_placement_rows_group_by_layer_and_meet_the_plan():
    from backends.onnx_npu import placement, qnn

    compiled = qnn.Compiled("m.onnx", 60, False, 0.1, placements={
        "layers.0.q/matmul": qnn.EP, "layers.0.attn/heads": qnn.EP, "layers.1.mlp_out": "CPUExecutionProvider",
        "x": qnn.EP}, refusals=["Operators of type `Shrink` are not supported by QNN EP."], error="fallback")
    plan = {"ops": [{"layer": 1, "phase": "prefill", "cycles": 10, "count": 2, "dram_bytes": 5},
                    {"layer": 1, "phase": "decode", "cycles": 3, "count": 1, "dram_bytes": 1}]}
    rows = placement.rows({("chunk", 60): compiled}, plan)
    by_layer = {(r["graph"], r["layer"]): r for r in rows}
    assert by_layer[("chunk", "layer 0")]["soc 60"] == {"htp": 2, "refused": 0, "compiled": False}
    assert by_layer[("chunk", "layer 1")]["soc 60"]["refused"] == 1
    assert by_layer[("chunk", "layer 1")]["plan"] == {"ops": 1, "cycles": 20, "dram_bytes": 10}
    assert by_layer[("decode", "layer 1")]["plan"]["cycles"] == 3
    assert by_layer[("chunk", "model")]["soc 60"]["htp"] == 1
    assert [r["layer"] for r in rows if r["graph"] == "chunk"] == ["layer 0", "layer 1", "model"]


def test_a_graph_that_is_not_a_decoder(tmp_path, capsys):
    spec = tmp_path / "add.yaml"
    spec.write_text("graph:\n  name: add\n  inputs:\n    - {name: x, dtype: f32, shape: [B, T, 8]}\n"
                    "  nodes:\n    - {op: add, inputs: [x, x], outputs: [y]}\n  outputs: [y]\n")
    assert main(["compile", str(spec), "--target", "onnx-npu", "-o", str(tmp_path / "o"), "--quiet"]) == 2
    assert "onnx-npu compiles decoder graphs" in capsys.readouterr().err


NOPE_MLA = """model:
  name: tiny-nope-mla
  vocab_size: 256
  d_model: 32
  n_layers: 2
  attention: {kind: mla, n_heads: 4, kv_lora_rank: 8, qk_nope_head_dim: 8, qk_rope_head_dim: 4, v_head_dim: 8,
              rope: null}
  mlp: {kind: swiglu, d_ff: 64}
"""


def test_mla_without_rope(tmp_path):
    """Kimi-Linear's MLA form (rope: null): nothing rotated, no position_ids read; f32 gives
    the interpreter's greedy tokens."""
    spec = tmp_path / "nope-mla.yaml"
    spec.write_text(NOPE_MLA)
    expected, _ = reference_generate(load_spec(spec), PROMPT, 5, seed=0)
    folder = compile_npu(str(spec), tmp_path / "f32", "--precision", "f32")
    assert generate(str(folder), PROMPT, 5) == expected
