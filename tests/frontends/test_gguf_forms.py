"""The forms GGUF block types take in the compiled model (``frontends.gguf.forms``):

- Q5_0 and Q6_K become 4-bit codes with u8 zero points: a block whose levels span at most
  16 values dequantizes to gguf's floats bit for bit, any other within one new step (the
  code's rounding and the zero point's); Q5_1 and Q5_K (float zero points) too, every block
  rounded; ``weights="exact"`` keeps them as the file's 8-bit codes;
- Q8_0 and Q4_0 stay bit for bit, Q4_1 within float rounding (``test_gguf_blocks``);
- every projection is MatMulNBits at accuracy level 4, a table read only by lookups is one
  ``dequant_embedding`` in the file's exact codes (GatherBlockQuantized), a tied table
  shares the head's codes, and the notes say per kind what was kept and what re-expressed;
- the ONNX Runtime model computes what the reference interpreter does with those weights.
"""
from collections import Counter

import gguf
import numpy as np
import onnx
import pytest
from gguf import GGMLQuantizationType as T

from frontends.gguf import load_gguf
from frontends.gguf.blocks import EXACT, repack
from frontends.gguf.forms import ACCURACY_LEVEL, REQUANTIZED, form, in_form, requantize
from gguf_writer import write_file
from irc.ops.quant import dequantize_blocks, pack_codes, unpack_codes
from test_gguf_blocks import K, stored
from test_gguf_errors import D, KEYS, VOCAB, tensors


def dequantized(parts, held) -> np.ndarray:
    qweight, scales, zero = parts
    return dequantize_blocks(qweight, scales, zero, bits=held.bits, block_size=held.block, k=K)


@pytest.mark.parametrize("qtype", REQUANTIZED, ids=lambda t: t.name)
def test_requantized_kinds_are_exact_where_16_levels_hold_a_block(qtype):
    raw = stored(qtype, np.random.default_rng(qtype.value))
    want = gguf.quants.dequantize(raw, qtype).astype(np.float32)
    held = form(qtype)
    assert (held.bits, held.zero, held.exact) == (4, "u8", False)
    parts = repack(raw, qtype, K)
    ours = dequantized(in_form(parts, held), held)
    if not EXACT[qtype].float_zero:  # integer levels: a block of at most 16 of them is kept exactly
        levels = unpack_codes(parts[0], 8).astype(np.int32) - 128
        span = np.maximum(levels.max(-1), 0) - np.minimum(levels.min(-1), 0)  # [rows, nb]
        narrow = np.repeat(span <= 15, held.block, axis=-1)
        np.testing.assert_array_equal(ours[narrow].view(np.uint32), want[narrow].view(np.uint32))
    step = np.abs(np.repeat(in_form(parts, held)[1], held.block, axis=-1))
    assert np.all(np.abs(ours - want) <= step * (1 + 1e-5))  # rounding, and the zero point's rounding
    assert np.mean(np.abs(ours - want)) <= np.mean(step) / 3
    exact = dequantized(in_form(parts, form(qtype, exact_forms=True)), form(qtype, exact_forms=True))
    if EXACT[qtype].float_zero:  # within float rounding (test_gguf_blocks bounds it in ulp)
        np.testing.assert_allclose(exact, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    else:
        np.testing.assert_array_equal(exact.view(np.uint32), want.view(np.uint32))


def test_requantize_keeps_narrow_blocks_and_rounds_wide_ones():
    """Levels -3..12 (16 values with 0) stay as they are; -40..40 are rounded to 16 steps."""
    narrow = np.arange(-3, 13)
    wide = np.linspace(-40, 40, 16).round().astype(int)
    levels = np.stack([np.concatenate([narrow, narrow]), np.concatenate([wide, wide])])[:, None, :]  # [2, 1, 32]
    scales = np.array([[0.5], [0.25]], np.float32)
    qweight, new_scales, zero = requantize(pack_codes(levels + 128, 8), scales)
    values = dequantize_blocks(qweight, new_scales, zero, bits=4, block_size=32, k=32)
    np.testing.assert_array_equal(values[0], levels[0, 0] * np.float32(0.5))
    assert new_scales[0, 0] == 0.5 and unpack_codes(zero, 4)[0, 0] == 3
    assert np.max(np.abs(values[1] - levels[1, 0] * 0.25)) <= new_scales[1, 0]
    assert new_scales[1, 0] == np.float32(0.25 * 80 / 15)


def model_file(tmp_path, types: dict, tied: bool = True) -> str:
    stored_tensors = tensors()
    for name, qtype in types.items():
        stored_tensors[name] = (gguf.quants.quantize(stored_tensors[name], qtype), qtype)
    if not tied:
        head = (np.random.default_rng(5).standard_normal((VOCAB, D)) * 0.1).astype(np.float32)
        stored_tensors["output.weight"] = (gguf.quants.quantize(head, T.Q8_0), T.Q8_0)
    return write_file(tmp_path / "m.gguf", "llama", KEYS, stored_tensors)


TYPES = {"token_embd.weight": T.Q5_0, "blk.0.attn_q.weight": T.Q5_0, "blk.0.attn_k.weight": T.Q4_1,
         "blk.0.attn_v.weight": T.Q4_0, "blk.0.attn_output.weight": T.Q8_0, "blk.0.ffn_gate.weight": T.Q5_0,
         "blk.0.ffn_up.weight": T.Q4_1, "blk.0.ffn_down.weight": T.Q4_0}


def test_graph_forms_levels_lookups_and_notes(tmp_path):
    graph = load_gguf(model_file(tmp_path, TYPES))
    ops = Counter(n.op for n in graph.nodes)
    assert ops["dequant_embedding"] == 1 and ops["embedding"] == 0
    quantized = [n for n in graph.nodes if n.op in ("dequant_linear", "dequantize")]
    assert quantized and all(n.attrs["accuracy_level"] == ACCURACY_LEVEL for n in quantized)
    # the tied table is read by the head too: it takes the head's 4-bit form, one copy
    lookup = next(n for n in graph.nodes if n.op == "dequant_embedding")
    head = next(n for n in graph.nodes if n.op == "dequant_linear" and n.inputs[1] is lookup.inputs[1])
    assert lookup.attrs["bits"] == head.attrs["bits"] == 4
    notes = graph.meta["gguf"]["notes"]
    lossy = next(n for n in notes if n.startswith("3 Q5_0 tensor(s) kept as 4-bit codes, block 32, u8 zero points "
                                                   "(requantized from the file's codes: lossy)"))
    assert "relative RMS weight error" in lossy  # what it costs, measured on the file's rows
    assert any(n.startswith("1 Q8_0 tensor(s) kept as 8-bit codes, block 32, symmetric (exact), MatMulNBits at "
                            "accuracy level 4 (int8 activations)") for n in notes)
    assert any(n.startswith("2 Q4_1 tensor(s) kept as 4-bit codes, block 32, float zero points (exact up to float "
                            "rounding)") for n in notes)
    assert any(n.startswith("2 Q4_0 tensor(s) kept as 4-bit codes, block 32, symmetric (exact)") for n in notes)
    exact = load_gguf(model_file(tmp_path, TYPES), weights="exact")
    assert any(n.startswith("3 Q5_0 tensor(s) kept as 8-bit codes, block 32, symmetric (exact), MatMulNBits at "
                            "accuracy level 0 (float activations)")
               for n in exact.meta["gguf"]["notes"])


def test_an_untied_table_keeps_the_files_codes(tmp_path):
    graph = load_gguf(model_file(tmp_path, TYPES, tied=False))
    lookup = next(n for n in graph.nodes if n.op == "dequant_embedding")
    assert lookup.attrs["bits"] == 8 and len(lookup.inputs) == 3  # Q5_0 as stored: symmetric 8-bit codes
    table = gguf.quants.dequantize(gguf.quants.quantize(tensors()["token_embd.weight"], T.Q5_0), T.Q5_0)
    parts = [p.array() for p in lookup.inputs[1:]]
    ours = dequantize_blocks(*parts, None, bits=8, block_size=32, k=table.shape[1])
    np.testing.assert_array_equal(ours.view(np.uint32), table.astype(np.float32).view(np.uint32))


def test_onnx_ort_computes_the_reference(tmp_path):
    from backends.onnx import emit, runtime
    from irc.interpreter import Interpreter

    graph = load_gguf(model_file(tmp_path, TYPES))
    path = str(tmp_path / "m.onnx")
    emit.emit_model(graph, path, target="onnx-ort", genai=False)
    counts = Counter(n.op_type for n in onnx.load(path).graph.node)
    assert counts["GatherBlockQuantized"] == 1 and counts["DequantizeLinear"] == 0
    levels = {a.i for n in onnx.load(path).graph.node if n.op_type == "MatMulNBits" for a in n.attribute
              if a.name == "accuracy_level"}
    assert levels == {ACCURACY_LEVEL}
    ids = np.array([[1, 5, 9, 63]], np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(4)[None],
             **runtime.empty_caches(graph, 1)}
    want = Interpreter(graph).run(feeds)["logits"]
    got = runtime.ort_engine(path)(feeds)["logits"]
    # int8 activations inside MatMulNBits (accuracy level 4): within a few percent of the exact products
    assert np.max(np.abs(got - want)) <= 0.05 * np.max(np.abs(want))


def test_exact_types_have_exact_forms():
    for qtype in EXACT:
        held = form(qtype)
        assert held.exact == (qtype not in REQUANTIZED)
        assert form(qtype, exact_forms=True).exact


def test_the_cli_chooses_the_gguf_weights(tmp_path, capsys):
    """``irc compile x.gguf --gguf-weights exact`` writes the file's codes at accuracy level
    0; the default (blocks) at level 4; on a spec that is not a GGUF the option is one error
    (exit 2, nothing written)."""
    from irc_cli import main

    spec = model_file(tmp_path, TYPES)
    levels = {}
    for choice in ("blocks", "exact"):
        out = tmp_path / choice / "model.onnx"
        assert main(["compile", spec, "--target", "onnx-ort", "--gguf-weights", choice, "-o", str(out),
                     "--quiet"]) == 0
        levels[choice] = {next((a.i for a in n.attribute if a.name == "accuracy_level"), 0)  # absent: 0
                          for n in onnx.load(str(out)).graph.node if n.op_type == "MatMulNBits"}
    assert levels == {"blocks": {ACCURACY_LEVEL}, "exact": {0}}
    out = tmp_path / "yaml" / "model.onnx"
    assert main(["compile", "examples/tiny-llama3.yaml", "--gguf-weights", "exact", "--target", "onnx",
                 "-o", str(out)]) == 2
    assert "--gguf-weights exact applies to a .gguf file only" in capsys.readouterr().err
    assert not out.parent.exists()
