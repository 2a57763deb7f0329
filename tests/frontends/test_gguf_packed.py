"""GGUF projections with float zero points (Q4_1, Q4_K) on onnx-ort in the packed form irc's
int4 takes (``backends.onnx.quant_pack``): q, k and v as one MatMulNBits that
GroupQueryAttention reads, gate and up as one MatMulNBits and a Split, each with one shared
correction for the zero points' fractions (Reshape, ReduceSum, MatMul, Sub) -- and still the
file's weights:

- the gated MLP is unfolded into ``linear`` layers (``frontends.gguf.quantized.unfold_gated``)
  so its gate and up pack; the reference result is the float model's;
- at accuracy level 0 the ONNX model equals the reference interpreter on a left-padded
  batch of two, prefill and greedy decode steps (1e-4 relative);
- the weights the ONNX model holds (codes, u8 zero points, scales and the fractions'
  offsets) are gguf's dequantization up to float rounding; the Q8_0 table bit for bit;
- the same file compiles to the same bytes.
"""
from collections import Counter

import gguf
import numpy as np
import onnx
from gguf import GGMLQuantizationType as T
from onnx import numpy_helper

import pytest

from backends.onnx.emit import emit_model
from backends.onnx.runtime import empty_caches, greedy, interpreter_engine, ort_engine
from frontends.gguf import load_gguf
from gguf_writer import write_file
from irc.check import relative_error
from irc.interpreter import Interpreter
from irc.ops.quant import unpack_codes
from test_gguf_errors import D, FF, KEYS, VOCAB

PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
TYPES = {"token_embd.weight": T.Q8_0, **{f"blk.0.{name}.weight": T.Q4_1 for name in PROJECTIONS}}
KV_HEADS = 1
RTOL = 1e-4
NEW_TOKENS = 5
# head size 8: q, k and v packed then Split (GroupQueryAttention's rotary takes multiples of 16);
# head size 16: its packed query
HEADS = {"split": 4, "gqa-packed": 2}


def model_file(tmp_path, heads: int = 2) -> str:
    """A one-layer Llama GGUF, every projection Q4_1, the tied table Q8_0."""
    rng = np.random.default_rng(heads)
    kv = D // heads * KV_HEADS
    shapes = {"token_embd.weight": (VOCAB, D), "output_norm.weight": (D,), "blk.0.attn_norm.weight": (D,),
              "blk.0.attn_q.weight": (D, D), "blk.0.attn_k.weight": (kv, D), "blk.0.attn_v.weight": (kv, D),
              "blk.0.attn_output.weight": (D, D), "blk.0.ffn_norm.weight": (D,), "blk.0.ffn_gate.weight": (FF, D),
              "blk.0.ffn_up.weight": (FF, D), "blk.0.ffn_down.weight": (D, FF)}
    tensors = {}
    for name, shape in shapes.items():
        values = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        tensors[name] = (gguf.quants.quantize(values, TYPES[name]), TYPES[name]) if name in TYPES else values
    keys = {**KEYS, "llama.attention.head_count": heads, "llama.attention.head_count_kv": KV_HEADS}
    return write_file(tmp_path / f"m{heads}.gguf", "llama", keys, tensors)


def compiled(tmp_path, weights: str, heads: int = 2, name: str = "m.onnx"):
    graph = load_gguf(model_file(tmp_path, heads), weights=weights)
    path = str(tmp_path / name)
    emit_model(graph, path, target="onnx-ort", genai=False)
    return graph, path


def test_gate_and_up_unfold_into_linears_computing_the_float_model(tmp_path):
    blocks = load_gguf(model_file(tmp_path), weights="exact")
    ops = Counter(n.op for n in blocks.nodes)
    assert ops["swiglu"] == 0 and ops["dequant_linear"] == 8 and ops["silu"] == 1  # 7 projections + the head
    names = {n.outputs[0].name for n in blocks.nodes if n.op == "dequant_linear"}
    assert {"layers.0.mlp_out.gate", "layers.0.mlp_out.up", "layers.0.mlp_out"} <= names  # lower-mlp's names
    floats = load_gguf(model_file(tmp_path), weights="float")
    assert Counter(n.op for n in floats.nodes)["swiglu"] == 1  # float weights: the MLP stays one op
    ids = np.array([[1, 5, 9, 63, 2]], np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(5)[None],
             **empty_caches(blocks, 1)}
    want = Interpreter(floats).run(feeds)["logits"]
    got = Interpreter(blocks).run(feeds)["logits"]
    assert relative_error(got, want) <= 1e-5  # the float zero points' rounding only


@pytest.mark.parametrize("form", HEADS)
def test_float_zero_points_pack_with_one_correction_per_activation(form, tmp_path):
    heads = HEADS[form]
    graph, path = compiled(tmp_path, "exact", heads)
    model = onnx.load(path)
    counts = Counter(n.op_type for n in model.graph.node)
    # q|k|v, o, gate|up, down, head (Q8_0: symmetric, no correction); one correction per activation
    assert counts["MatMulNBits"] == 5 and counts["ReduceSum"] == 4
    assert counts["Split"] == (2 if form == "split" else 1)  # gate|up (and q|k|v)
    made = {o: n for n in model.graph.node for o in n.output}
    qkv = next(n for n in model.graph.node if n.op_type == "MatMulNBits" and "wq+wk+wv" in n.name)
    assert {a.name: a.i for a in qkv.attribute}["N"] == D + 2 * D // heads * KV_HEADS
    attention = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    if form == "gqa-packed":
        corrected = made[attention.input[0]]
        assert corrected.op_type == "Sub" and list(attention.input[1:3]) == ["", ""]  # packed query
        assert made[corrected.input[0]] is qkv
    prompts = [[3, 17, 40, 8], [9, 22, 5, 61, 12, 33, 7, 50, 2]]  # the first is left-padded
    ours = greedy(ort_engine(path), graph, prompts, NEW_TOKENS)
    ref = greedy(interpreter_engine(graph), graph, prompts, NEW_TOKENS)
    assert 0 in ref["feeds"]["attention_mask"]
    mask = ref["feeds"]["attention_mask"].astype(bool)
    assert relative_error(ours["prefill"]["logits"][mask], ref["prefill"]["logits"][mask]) <= RTOL
    np.testing.assert_array_equal(ours["tokens"], ref["tokens"])
    for got, want in zip(ours["steps"], ref["steps"]):
        assert relative_error(got, want) <= RTOL


def held_weight(inits: dict, stem: str, n: int, k: int, block: int = 32) -> np.ndarray:
    """W [n, k] in float64 from what the ONNX model holds for packed rows ``stem``: codes q,
    u8 zero points zi, scales s, offsets o: (q - zi) * s - o.T, per block."""
    codes = unpack_codes(inits[f"{stem}.qweight"], 4).astype(np.float64)  # [n, nb, block]
    nb = k // block
    zero = unpack_codes(inits[f"{stem}.zero_points.codes"], 4)[:, :nb].astype(np.float64)
    scales = inits[f"{stem}.scales"].astype(np.float64)
    offsets = inits[f"{stem}.zero_points.offsets"].astype(np.float64).T  # [n, nb]
    weight = (codes - zero[..., None]) * scales[..., None] - offsets[..., None]
    return weight.reshape(n, k)


def test_the_model_holds_the_files_weights(tmp_path):
    _, path = compiled(tmp_path, "blocks")
    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    floats = load_gguf(model_file(tmp_path), weights="float")  # gguf's dequantization, in irc's layout
    stored = {name: param.array().astype(np.float64) for name, param in floats.params.items()}
    for stem, names, k in (("layers.0.attn.wq+wk+wv", ("attn.wq", "attn.wk", "attn.wv"), D),
                           ("layers.0.mlp.w_gate+w_up", ("mlp.w_gate", "mlp.w_up"), D),
                           ("layers.0.attn.wo", ("attn.wo",), D), ("layers.0.mlp.w_down", ("mlp.w_down",), FF)):
        want = np.concatenate([stored[f"layers.0.{name}"] for name in names])
        got = held_weight(inits, stem, len(want), k)
        # ggml's d * q + m against (q - zp) * d: float32 rounding of the two forms (test_gguf_blocks)
        np.testing.assert_allclose(got, want, rtol=0, atol=4e-7 * np.abs(want).max())
    table = unpack_codes(inits["embed.qweight"], 8).astype(np.int32) - 128  # symmetric 8-bit: Q8_0's own codes
    values = (table * inits["embed.scales"][..., None]).reshape(VOCAB, D).astype(np.float32)
    np.testing.assert_array_equal(values.view(np.uint32), stored["embed"].astype(np.float32).view(np.uint32))


def test_the_same_file_compiles_to_the_same_bytes(tmp_path):
    paths = [compiled(tmp_path, "blocks", name=f"m{i}.onnx")[1] for i in range(2)]
    first, second = (open(p, "rb").read() for p in paths)
    assert first == second


def test_int4_makes_q8_0_four_bit_and_says_what_it_costs(tmp_path):
    """``weights="int4"`` (``--gguf-weights int4``): the Q8_0 tied table and head become 4-bit
    codes with u8 zero points, noted with their measured error; the Q4_1 projections keep the
    file's values; every MatMulNBits is 4-bit. An untied table read by lookups only keeps the
    file's codes (test_gguf_forms' file: a Q5_0 table, a Q8_0 head)."""
    from irc_cli import main
    from test_gguf_forms import model_file as untied_file

    graph = load_gguf(model_file(tmp_path), weights="int4")
    head = next(n for n in graph.nodes if n.op == "dequant_linear" and n.outputs[0].name == "logits")
    assert head.attrs["bits"] == 4 and head.inputs[3].dtype.name == "u8"
    notes = graph.meta["gguf"]["notes"]
    assert any(n.startswith("1 Q8_0 tensor(s) kept as 4-bit codes, block 32, u8 zero points (requantized from the "
                            "file's codes: lossy)") and "relative RMS weight error" in n for n in notes), notes
    assert any(n.startswith("7 Q4_1 tensor(s) kept as 4-bit codes, block 32, float zero points") for n in notes)
    out = tmp_path / "int4" / "model.onnx"
    assert main(["compile", model_file(tmp_path), "--target", "onnx-ort", "--gguf-weights", "int4", "-o", str(out),
                 "--quiet"]) == 0
    bits = {a.i for n in onnx.load(str(out)).graph.node if n.op_type in ("MatMulNBits", "GatherBlockQuantized")
            for a in n.attribute if a.name == "bits"}
    assert bits == {4}
    untied = load_gguf(untied_file(tmp_path, {"token_embd.weight": T.Q5_0}, tied=False), weights="int4")
    lookup = next(n for n in untied.nodes if n.op == "dequant_embedding")
    head = next(n for n in untied.nodes if n.op == "dequant_linear" and n.outputs[0].name == "logits")
    assert (lookup.attrs["bits"], head.attrs["bits"]) == (8, 4)
