"""The forms GGUF block types take in the compiled model (``frontends.gguf.forms``):

- by default every block keeps its values: Q5_0, Q6_K and Q8_0 as 8-bit codes under the
  file's scales, bit for bit; Q5_1 and Q5_K as 8-bit codes with float zero points, within
  float rounding; Q4_0 bit for bit, Q4_1 within float rounding (``test_gguf_blocks``); a tiny
  twin holding every one of them, compiled for ONNX Runtime, computes the file's values;
- ``weights="blocks4"`` (lossy): Q5_0 and Q6_K become 4-bit codes with u8 zero points: a block
  whose levels span at most 16 values dequantizes to gguf's floats bit for bit, any other
  within one new step (the code's rounding and the zero point's); Q5_1 and Q5_K (float zero
  points) too, every block rounded;
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
def test_the_default_keeps_every_blocks_values(qtype):
    """Q6_K / Q5_0: 8-bit codes under the same per-block scale, gguf's floats bit for bit;
    Q5_1 / Q5_K: 8-bit codes with their float zero points, within 2 ulp of the larger of
    ggml's two terms (|d*q|, |m|), as Q4_1 / Q4_K."""
    raw = stored(qtype, np.random.default_rng(qtype.value))
    want = gguf.quants.dequantize(raw, qtype).astype(np.float32)
    held = form(qtype)
    assert (held.bits, held.block, held.exact) == (8, EXACT[qtype].block, True)
    parts = in_form(repack(raw, qtype, K), held)
    ours = dequantized(parts, held)
    if not EXACT[qtype].float_zero:
        assert held.zero == "none"
        np.testing.assert_array_equal(ours.view(np.uint32), want.view(np.uint32))
        return
    assert held.zero == "float"
    qweight, scales, zero = parts
    codes = unpack_codes(qweight, 8).reshape(*scales.shape, -1).astype(np.float32)
    terms = np.maximum(np.abs(codes * scales[..., None]), np.abs(zero * scales)[..., None]).reshape(want.shape)
    assert np.all(np.abs(ours - want) <= 2 * np.spacing(terms))


@pytest.mark.parametrize("qtype", REQUANTIZED, ids=lambda t: t.name)
def test_requantized_kinds_are_exact_where_16_levels_hold_a_block(qtype):
    raw = stored(qtype, np.random.default_rng(qtype.value))
    want = gguf.quants.dequantize(raw, qtype).astype(np.float32)
    held = form(qtype, "blocks4")
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
    exact = dequantized(in_form(parts, form(qtype, "exact")), form(qtype, "exact"))
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
    # the tied table is read by the head too: one copy, the file's 8-bit codes
    lookup = next(n for n in graph.nodes if n.op == "dequant_embedding")
    head = next(n for n in graph.nodes if n.op == "dequant_linear" and n.inputs[1] is lookup.inputs[1])
    assert lookup.attrs["bits"] == head.attrs["bits"] == 8
    notes = graph.meta["gguf"]["notes"]
    assert any(n.startswith("3 Q5_0 tensor(s) kept as 8-bit codes, block 32, symmetric (exact), MatMulNBits at "
                            "accuracy level 4 (int8 activations)") for n in notes)
    assert not any("lossy" in n for n in notes)
    graph = load_gguf(model_file(tmp_path, TYPES), weights="blocks4")
    lookup = next(n for n in graph.nodes if n.op == "dequant_embedding")
    head = next(n for n in graph.nodes if n.op == "dequant_linear" and n.inputs[1] is lookup.inputs[1])
    assert lookup.attrs["bits"] == head.attrs["bits"] == 4  # blocks4: the head's 4-bit form
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
    graph = load_gguf(model_file(tmp_path, TYPES, tied=False), weights="blocks4")
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
        assert form(qtype).exact and form(qtype, "exact").exact
        assert form(qtype, "blocks4").exact == (qtype not in REQUANTIZED)
        assert form(qtype, "int4").exact == (EXACT[qtype].bits == 4)


def test_the_cli_chooses_the_gguf_weights(tmp_path, capsys):
    """``irc compile x.gguf --gguf-weights exact`` writes the file's codes at accuracy level
    0; the default (blocks) at level 4; on a spec that is not a GGUF the option is one error
    (exit 2, nothing written)."""
    from irc_cli import main

    spec = model_file(tmp_path, TYPES)
    levels = {}
    for choice in ("blocks", "blocks4", "exact"):
        out = tmp_path / choice / "model.onnx"
        assert main(["compile", spec, "--target", "onnx-ort", "--gguf-weights", choice, "-o", str(out),
                     "--quiet"]) == 0
        levels[choice] = {next((a.i for a in n.attribute if a.name == "accuracy_level"), 0)  # absent: 0
                          for n in onnx.load(str(out)).graph.node if n.op_type == "MatMulNBits"}
    assert levels == {"blocks": {ACCURACY_LEVEL}, "blocks4": {ACCURACY_LEVEL}, "exact": {0}}
    out = tmp_path / "yaml" / "model.onnx"
    assert main(["compile", "examples/tiny-llama3.yaml", "--gguf-weights", "exact", "--target", "onnx",
                 "-o", str(out)]) == 2
    assert "--gguf-weights exact applies to a .gguf file only" in capsys.readouterr().err
    assert not out.parent.exists()


WIDE = 256  # K-quants take rows of 256
WIDE_KEYS = {**KEYS, "llama.embedding_length": WIDE, "llama.feed_forward_length": WIDE}
WIDE_TYPES = {"blk.0.attn_q.weight": T.Q6_K, "blk.0.attn_k.weight": T.Q5_K, "blk.0.attn_v.weight": T.Q5_1,
              "blk.0.attn_output.weight": T.Q5_0, "blk.0.ffn_gate.weight": T.Q6_K, "blk.0.ffn_up.weight": T.Q5_K,
              "blk.0.ffn_down.weight": T.Q5_1, "token_embd.weight": T.Q5_0}


def k_quant(rows: int, qtype, rng) -> np.ndarray:
    """Random blocks of a K-quant (gguf cannot quantize to them) with small float16 d (and dmin)."""
    from test_gguf_blocks import F16_FIELDS, GGML_QUANT_SIZES

    blocks = rng.integers(0, 256, (rows * WIDE // 256, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        small = (rng.random(len(blocks)) * 1e-4 + 1e-5).astype(np.float16)
        blocks[:, offset:offset + 2 or None] = small.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def wide_file(tmp_path) -> str:
    """A one-layer Llama twin of width 256 holding Q6_K, Q5_K, Q5_1 and Q5_0 (tied table)."""
    rng = np.random.default_rng(7)
    kv = WIDE // 4 * 2
    shapes = {"token_embd.weight": (VOCAB, WIDE), "blk.0.attn_q.weight": (WIDE, WIDE), "blk.0.attn_k.weight": (kv, WIDE),
              "blk.0.attn_v.weight": (kv, WIDE), "blk.0.attn_output.weight": (WIDE, WIDE),
              "blk.0.ffn_gate.weight": (WIDE, WIDE), "blk.0.ffn_up.weight": (WIDE, WIDE),
              "blk.0.ffn_down.weight": (WIDE, WIDE)}
    stored_tensors = {name: np.ones(WIDE, np.float32) for name in
                      ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight")}
    for name, shape in shapes.items():
        qtype = WIDE_TYPES[name]
        if qtype in (T.Q6_K, T.Q5_K):
            stored_tensors[name] = (k_quant(shape[0], qtype, rng), qtype)
        else:
            values = (rng.standard_normal(shape) * 0.1).astype(np.float32)
            stored_tensors[name] = (gguf.quants.quantize(values, qtype), qtype)
    return write_file(tmp_path / "wide.gguf", "llama", WIDE_KEYS, stored_tensors)


def test_a_twin_compiled_as_is_computes_the_files_values(tmp_path):
    """The default compile of a Q6_K / Q5_K / Q5_1 / Q5_0 twin keeps every tensor as the
    file's codes (8-bit, MatMulNBits); with float activations (accuracy level 0) ONNX Runtime
    gives the logits of the file's dequantized values (``weights="float"``, reference
    interpreter) within float rounding, and at the default level 4 (int8 activations) within
    a few percent."""
    from backends.onnx import emit, runtime
    from irc.interpreter import Interpreter

    path = wide_file(tmp_path)
    graph = load_gguf(path)
    notes = graph.meta["gguf"]["notes"]
    assert len(notes) == 4 and all("8-bit codes" in n and "lossy" not in n for n in notes), notes
    ids = np.array([[1, 5, 9, 63, 2]], np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(5)[None],
             **runtime.empty_caches(graph, 1)}
    want = Interpreter(load_gguf(path, weights="float")).run(feeds)["logits"]
    got = {}
    for level in (ACCURACY_LEVEL, 0):
        for node in graph.nodes:
            if "accuracy_level" in node.attrs:
                node.attrs["accuracy_level"] = level
        onnx_path = str(tmp_path / f"level{level}" / "m.onnx")
        emit.emit_model(graph, onnx_path, target="onnx-ort", genai=False)
        nodes = onnx.load(onnx_path).graph.node
        assert {next(a.i for a in n.attribute if a.name == "bits") for n in nodes if n.op_type == "MatMulNBits"} == {8}
        assert not any(n.op_type == "DequantizeLinear" for n in nodes)
        assert any(n.op_type == "ReduceSum" for n in nodes)  # Q5_1 / Q5_K: the zero points' correction
        got[level] = runtime.ort_engine(onnx_path)(feeds)["logits"]
    scale = np.max(np.abs(want))
    assert np.max(np.abs(got[0] - want)) <= 1e-5 * scale
    assert np.max(np.abs(got[ACCURACY_LEVEL] - want)) <= 0.05 * scale
