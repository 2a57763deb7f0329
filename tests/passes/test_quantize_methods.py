"""quantize's methods (rtn, mse, imatrix), its calibration run, the dequant_embedding op and
the text evaluation (perplexity, top-1 agreement) that its report and --eval-text use."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from frontends import load_spec
from irc.analysis import analyze
from irc.errors import PassError
from irc.evaluate import (EvalTextError, StreamingInterpreter, next_token_nll, perplexity_and_agreement,
                          prefill_logits, text_tokens)
from irc.interpreter import Interpreter, random_feeds
from irc.ops import get_op
from irc.ops.quant import dequantize_blocks, quantize_blocks
from irc.ops.nn import rms_norm
from irc.quant_report import pass_report
from irc.testing import apply_pass
from irc.weights import seed_absent
from passes.quantize import Quantize, QuantizedWeight
from passes.quantize_calibrate import importance
from passes.quantize_methods import search_blocks

TEXT = ("the cat sat on the mat and the dog sat on the log while a bird sang in the tree "
        "and the cat saw the bird and the dog saw the cat ") * 6


def example(name: str):
    graph = load_spec(f"examples/{name}.yaml")
    seed_absent(graph)
    return graph


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
    """(text file, tokenizer.json): a word-level tokenizer whose ids fit a 256-token vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted(set(TEXT.split()))
    tokenizer = Tokenizer(models.WordLevel({w: i + 1 for i, w in enumerate(words)} | {"[unk]": 0}, unk_token="[unk]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    directory = tmp_path_factory.mktemp("texts")
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "text.txt").write_text(TEXT)
    return str(directory / "text.txt"), str(directory / "tokenizer.json")


def group_errors(w, parts, weights, bits, block):
    """Weighted squared error per group of a quantization of ``w`` [N, K]."""
    approx = dequantize_blocks(*parts, bits=bits, block_size=block, k=w.shape[1])
    error = (weights * (w - approx) ** 2).astype(np.float64)
    return error.reshape(w.shape[0], -1, block).sum(axis=-1)


def magnitude_weights(w, block):
    blocks = w.reshape(w.shape[0], -1, block).astype(np.float64)
    sigma2 = (blocks ** 2).mean(axis=-1, keepdims=True)
    return np.sqrt(sigma2 + blocks ** 2).reshape(w.shape)


# ---- the search ----------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([4, 8]), symmetric=st.booleans(), block=st.sampled_from([16, 32]),
       rows=st.integers(1, 6), blocks=st.integers(1, 4), seed=st.integers(0, 2 ** 16),
       offset=st.sampled_from([0.0, 0.7]), calibrated=st.booleans())
def test_no_group_ends_worse_than_rtn(bits, symmetric, block, rows, blocks, seed, offset, calibrated):
    """RTN's scale is a candidate and refinement only lowers the error the search weighs."""
    rng = np.random.default_rng(seed)
    k = block * blocks
    w = (rng.standard_normal((rows, k)) + offset).astype(np.float32)
    w[0, :block] = 0.0  # an all-zero group
    imp = rng.uniform(0.1, 10.0, k).astype(np.float32) if calibrated else None
    parts = search_blocks(w, bits=bits, block_size=block, symmetric=symmetric, importance=imp)
    rtn = quantize_blocks(w, bits=bits, block_size=block, symmetric=symmetric)
    a = np.broadcast_to(imp / imp.mean(), w.shape) if calibrated else magnitude_weights(w, block)
    ours, theirs = group_errors(w, parts, a, bits, block), group_errors(w, rtn, a, bits, block)
    energy = (a * w.astype(np.float64) ** 2).reshape(rows, -1, block).sum(axis=-1)
    assert np.all(ours <= theirs + 1e-6 * energy)  # float32 sums choose the candidate
    assert (parts[2] is None) == symmetric and parts[0].dtype == np.uint8
    np.testing.assert_array_equal(dequantize_blocks(*parts, bits=bits, block_size=block, k=k)[0, :block], 0.0)


def test_gaussian_sqnr_beats_rtn_by_a_decibel():
    from irc.quant_report import weight_error

    w = np.random.default_rng(3).standard_normal((256, 1024)).astype(np.float32)
    rtn = weight_error(w, *quantize_blocks(w, bits=4, block_size=32, symmetric=True), bits=4, block_size=32)
    mse = weight_error(w, *search_blocks(w, bits=4, block_size=32, symmetric=True), bits=4, block_size=32)
    assert mse["sqnr_db"] > rtn["sqnr_db"] + 1.0


def test_importance_protects_the_channels_that_carry_signal():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 128)).astype(np.float32)
    imp = np.ones(128, np.float32)
    imp[::16] = 400.0  # a few channels carry most of the activation energy
    plain = search_blocks(w, bits=4, block_size=32, symmetric=True)
    weighted = search_blocks(w, bits=4, block_size=32, symmetric=True, importance=imp)

    def output_error(parts):
        approx = dequantize_blocks(*parts, bits=4, block_size=32, k=128)
        return float((imp * (w - approx) ** 2).sum())

    assert output_error(weighted) < 0.8 * output_error(plain)


def test_search_is_deterministic_and_rows_match_the_whole(tmp_path):
    g = example("tiny-llama3")
    source = g.params["layers.0.mlp.w_gate"]
    weight = QuantizedWeight(source, 4, 32, False, "mse")
    whole = [weight.part(p) for p in ("qweight", "scales", "zero_points")]
    again = search_blocks(source.array(), bits=4, block_size=32, symmetric=False)
    for a, b in zip(whole, again):
        np.testing.assert_array_equal(a, b)
    rows = [weight.part(p, (40, 90)) for p in ("qweight", "scales", "zero_points")]
    for a, b in zip(rows, whole):
        np.testing.assert_array_equal(a, b[40:90])


def test_padding_of_a_single_block_dequantizes_to_zero():
    w = np.random.default_rng(5).standard_normal((3, 24)).astype(np.float32)
    qweight, scales, zero = search_blocks(w, bits=4, block_size=32, symmetric=False)
    codes = np.stack([qweight & 15, qweight >> 4], axis=-1).reshape(3, 32)
    np.testing.assert_array_equal(codes[:, 24:], np.repeat(zero & 15, 8, axis=1))


# ---- the pass --------------------------------------------------------------------------------

@pytest.mark.parametrize("bad, message", [
    ({"bits": 3}, "bits must be 4 or 8"),
    ({"method": "hqq"}, "unknown method 'hqq'"),
    ({"method": "imatrix"}, "needs a calibration text"),
    ({"accuracy_level": 5}, "accuracy_level must be"),
])
def test_bad_options(bad, message):
    with pytest.raises(PassError, match=message):
        Quantize(**bad)


def test_a_searching_method_needs_whole_blocks_before_anything_changes():
    g = example("tiny-llama3")  # d_ff 160: 64 does not divide it
    before = sorted(g.params)
    with pytest.raises(PassError, match=r"group 64 does not divide K=160 of @layers.0.mlp.w_down") as info:
        Quantize(group=64, method="mse").run(g)
    assert "group=32" in info.value.hint and "method=ort" in info.value.hint
    assert sorted(g.params) == before


@pytest.mark.parametrize("method", ["ort", "rtn"])
def test_ort_and_rtn_pad_the_last_block(method):
    """K=160 in blocks of 64: three blocks a row, the last one half zeros, as MatMulNBits lays
    it out; the codes dequantize to within a scale step of the float weight."""
    g = example("tiny-llama3")
    weight = g.params["layers.0.mlp.w_down"].array()
    assert Quantize(group=64, method=method).run(g)
    params = g.params
    codes, scales = params["layers.0.mlp.w_down.qweight"].array(), params["layers.0.mlp.w_down.scales"].array()
    assert codes.shape == (64, 3, 32) and scales.shape == (64, 3)
    zero_points = params.get("layers.0.mlp.w_down.zero_points")
    restored = dequantize_blocks(codes, scales, None if zero_points is None else zero_points.array(), bits=4,
                                 block_size=64, k=160)
    assert restored.shape == weight.shape
    assert np.all(np.abs(restored - weight) <= np.repeat(np.abs(scales), 64, axis=1)[:, :160] + 1e-7)


def test_embedding_lookup_reads_rows_of_the_shared_codes():
    g = example("tiny-gemma2-9b")  # tied table, embedding scale sqrt(d)
    after, changed = apply_pass(Quantize(embeddings=True, symmetric=False), g)
    lookup = next(n for n in after.nodes if n.op == "dequant_embedding")
    head = next(n for n in after.nodes if n.op == "dequant_linear" and n.inputs[1].name == "embed.qweight")
    assert lookup.inputs[1] is head.inputs[1] and lookup.inputs[2] is head.inputs[2]
    assert lookup.attrs["scale"] == next(n for n in g.nodes if n.op == "embedding").attrs["scale"]
    ids = np.array([[3, 0, 255], [7, 7, 1]])
    parts = [p.array() for p in lookup.inputs[1:]]
    table = get_op("dequantize").reference(parts, {"K": 64, "bits": 4, "block_size": 32})[0]
    want = get_op("embedding").reference([ids, table], {"scale": lookup.attrs["scale"]})[0]
    got = get_op("dequant_embedding").reference([ids, *parts], lookup.attrs)[0]
    np.testing.assert_array_equal(got, want)


def test_show_counts_the_tied_table_once_and_the_lookup_by_rows():
    g = example("tiny-gemma2-9b")
    after, _ = apply_pass(Quantize(embeddings=True), g)
    stats = analyze(after)
    assert stats["param_bytes"] == sum(p.nbytes for p in after.params.values())
    assert stats["params_total"] == analyze(g)["params_total"]
    lookup = next(n for n in after.nodes if n.op == "dequant_embedding")
    from irc.analysis import node_cost
    cost = node_cost(lookup, {"B": 1, "T": 1})
    row = sum(p.nbytes // p.shape[0] for p in lookup.inputs[1:])
    assert cost.bytes_read == 8 + row  # one id, one row of codes and scales


def test_accuracy_level_reaches_every_quantized_reader():
    after, _ = apply_pass(Quantize(accuracy_level=4), example("tiny-llama3"))  # swiglu reads dequantize
    levels = {n.attrs["accuracy_level"] for n in after.nodes if n.op in ("dequant_linear", "dequantize")}
    assert levels == {4}
    plain, _ = apply_pass(Quantize(), example("tiny-llama3"))
    assert {n.attrs["accuracy_level"] for n in plain.nodes if n.op == "dequantize"} == {None}


# ---- calibration and evaluation --------------------------------------------------------------

def test_calibration_statistics_are_mean_squared_inputs(text_files):
    g = example("tiny-llama3")
    ids = text_tokens(*text_files)
    stats = importance(g, ids, {"layers.0.attn.wq", "layers.0.attn.wk", "layers.0.mlp.w_down", "lm_head"}, window=32)
    assert sorted(stats) == ["layers.0.attn.wk", "layers.0.attn.wq", "layers.0.mlp.w_down", "lm_head"]
    windows = [ids[i:i + 32] for i in range(0, len(ids), 32) if len(ids[i:i + 32]) >= 2]
    x = np.concatenate([g.params["embed"].array()[w] for w in windows])
    normed = rms_norm(x, g.params["layers.0.attn_norm"].array(), 1e-5)
    np.testing.assert_allclose(stats["layers.0.attn.wq"], (normed.astype(np.float64) ** 2).mean(axis=0), rtol=1e-5)
    np.testing.assert_array_equal(stats["layers.0.attn.wq"], stats["layers.0.attn.wk"])
    assert stats["layers.0.mlp.w_down"].shape == (160,) and np.all(stats["layers.0.mlp.w_down"] > 0)


def test_imatrix_pass_uses_the_calibration(text_files):
    text, tokenizer = text_files
    g = example("tiny-llama3")
    calibrated, _ = apply_pass(Quantize(method="imatrix", calibration=text, tokenizer=tokenizer), g)
    plain, _ = apply_pass(Quantize(method="mse"), g)
    name = "layers.1.attn.wo.qweight"
    assert not np.array_equal(calibrated.params[name].array(), plain.params[name].array())
    assert "imatrix" in repr(calibrated.params[name].data)


def test_streaming_interpreter_gives_the_same_outputs():
    g = example("tiny-qwen2-7b")
    feeds = random_feeds(g, batch=2, tokens=5, past=3)
    want = Interpreter(g.clone()).run(feeds)
    got = StreamingInterpreter(g.clone()).run(feeds)
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_perplexity_and_agreement(text_files):
    g = example("tiny-llama3")
    ids = text_tokens(*text_files)
    same = perplexity_and_agreement(g, g, ids, window=40)
    assert same["top1_agreement"] == 1.0 and same["perplexity"]["reference"] == same["perplexity"]["candidate"]
    logits = prefill_logits(Interpreter(g.clone()), ids[:40])
    assert same["perplexity"]["reference"] > 1 and same["perplexity"]["reference"] < 1e4
    nll = next_token_nll(logits, ids[:40])
    shifted = logits - logits.max(axis=-1, keepdims=True)
    want = -(shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True)))[np.arange(39), ids[1:40]]
    np.testing.assert_allclose(nll, want, rtol=1e-6)
    quantized, _ = apply_pass(Quantize(bits=4, embeddings=True), g)
    report = pass_report(g, quantized, "mse", ids, window=40)
    assert 0 < report["eval"]["top1_agreement"] < 1
    assert report["eval"]["perplexity_float"] == same["perplexity"]["reference"]
    assert all(t["sqnr_db"] > t["sqnr_rtn_db"] for t in report["tensors"])


def test_text_errors(tmp_path, text_files):
    _, tokenizer = text_files
    short = tmp_path / "short.txt"
    short.write_text("cat")
    with pytest.raises(EvalTextError, match="has 1 token"):
        text_tokens(str(short), tokenizer)
    with pytest.raises(EvalTextError, match="is not a file"):
        text_tokens(str(tmp_path / "missing.txt"), tokenizer)


def test_calibration_refuses_what_it_cannot_run(tmp_path, text_files):
    from tokenizers import Tokenizer, models, pre_tokenizers

    text, tokenizer = text_files
    shape_only = load_spec("examples/tiny-llama3.yaml")
    with pytest.raises(PassError, match="has no weights"):
        Quantize(method="imatrix", calibration=text, tokenizer=tokenizer).run(shape_only)
    wide = Tokenizer(models.WordLevel({"[unk]": 0, "cat": 300}, unk_token="[unk]"))
    wide.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    wide.save(str(tmp_path / "wide.json"))
    with pytest.raises(PassError, match="outside the vocabulary of 256"):
        Quantize(method="imatrix", calibration=text, tokenizer=str(tmp_path / "wide.json")).run(example("tiny-llama3"))
