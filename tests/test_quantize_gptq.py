"""quantize{method=gptq}: GPTQ's codes equal a plain column-by-column implementation (in the
natural column order and in act-order), never weigh more than RTN's, the Hessians come layer
by layer through the already quantized weights, codes live on disk until written, and the
pass on a tiny model runs, is idempotent, and its ONNX (onnx-ort) output matches the
reference interpreter."""
import gc
import os
import weakref

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import passes  # noqa: F401  (registers the passes)
from backends.onnx.emit import emit_model
from backends.onnx.runtime import greedy, interpreter_engine, ort_engine
from backends.onnx.targets import TARGETS
from irc.build import emit1
from irc.check import relative_error
from irc.dtypes import DType
from irc.errors import PassError
from irc.graph import Graph
from irc.ops.quant import dequantize_blocks, quantize_blocks, unpack_codes
from irc.passmanager import PassManager, parse_pipeline
from irc.printer import print_graph
from irc.testing import apply_pass
from irc.weights import seed_absent
from passes.quantize import Quantize
from passes.quantize_calibrate import hessian, sequential_hessians
from passes.quantize_gptq import (DAMP, SpilledWeight, column_order, gptq_blocks, gptq_chunks, invert_upper,
                                  permute_symmetric, upper_factor)
from passes.quantize_methods import search_blocks

from tests.passes.test_quantize_methods import TEXT, example, text_files  # noqa: F401 (text_files: a fixture)


# ---- the algorithm -----------------------------------------------------------------------------

def direct_gptq(w, h, bits, block, symmetric, group_scales, act_order=False):
    """GPTQ as the paper writes it, column by column, no lazy batches, in float64: codes [N, K].
    ``act_order``: the reference code's --act-order with static groups, kept in column
    coordinates: column order[j] is rounded at step j against the factor of the permuted H, its
    error fed to the columns order[j+1:], and a group's scale is chosen when the first of its
    columns comes up, from the group's weights as they are then."""
    n, k = w.shape
    w = w.astype(np.float64).copy()
    h = h.astype(np.float64).copy()
    importance = np.diag(h).copy()
    order = np.argsort(-importance, kind="stable") if act_order else np.arange(k)
    dead = np.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h += DAMP * np.mean(np.diag(h)) * np.eye(k)
    u = np.linalg.cholesky(np.linalg.inv(h[order][:, order])).T  # upper, H_perm^-1 = U^T U
    top = 2 ** bits - 1
    codes = np.zeros((n, k), np.uint8)
    groups = {}
    for j, column in enumerate(order):
        first = column // block * block
        if first not in groups:  # the group's scale from its weights as updated so far
            g = w[:, first:first + block].astype(np.float32)
            if group_scales == "search":
                _, scale, zero = search_blocks(g, bits=bits, block_size=block, symmetric=symmetric,
                                               importance=importance[first:first + block])
                scale = scale[:, 0]
                zero = np.full(n, 2.0 ** (bits - 1)) if zero is None else unpack_codes(zero, bits)[:, 0].astype(float)
            elif symmetric:
                scale = np.abs(g).max(axis=1) / np.float32(2 ** (bits - 1) - 1)
                zero = np.full(n, 2.0 ** (bits - 1))
            else:
                low, high = np.minimum(g.min(axis=1), 0), np.maximum(g.max(axis=1), 0)
                scale = (high - low) / np.float32(top)
                zero = np.clip(np.round(np.divide(-low, scale, out=np.zeros_like(low), where=scale > 0)), 0, top)
            groups[first] = scale, zero
        scale, zero = groups[first]
        signed = np.rint(np.divide(w[:, column], scale.astype(np.float64), out=np.zeros(n), where=scale != 0))
        signed = np.clip(signed, -zero, top - zero)
        codes[:, column] = signed + zero
        quantized = (signed.astype(np.float32) * scale).astype(np.float64)
        error = (w[:, column] - quantized) / u[j, j]
        w[:, order[j + 1:]] -= np.outer(error, u[j, j + 1:])
    return codes


def correlated_inputs(rng, t, k):
    x = rng.standard_normal((t, k))
    x[:, k // 2:] += 1.5 * x[:, :k - k // 2]  # inputs that share information: feedback pays
    return x


@pytest.mark.parametrize("group_scales", ["search", "rtn"])
@pytest.mark.parametrize("bits,symmetric,block", [(4, True, 32), (4, False, 32), (8, True, 64), (4, True, 256)])
def test_codes_equal_the_plain_algorithm(bits, symmetric, block, group_scales):
    """K=256: two lazy batches of 128 (one of 256 for block 256), a dead input column."""
    rng = np.random.default_rng(bits + block)
    w = rng.standard_normal((12, 256)).astype(np.float32)
    x = correlated_inputs(rng, 400, 256)
    x[:, 7] = 0
    h = x.T @ x
    qweight, scales, zero_points = gptq_blocks(w, hessian=h, bits=bits, block_size=block, symmetric=symmetric,
                                               group_scales=group_scales, rtn_rows=False)
    want = direct_gptq(w, h, bits, block, symmetric, group_scales)
    np.testing.assert_array_equal(unpack_codes(qweight, bits).reshape(12, 256), want)
    dequantized = dequantize_blocks(qweight, scales, zero_points, bits=bits, block_size=block, k=256)
    assert np.all(dequantized[:, 7] == 0)  # the dead column: its code is the zero point


def shuffled_energies(rng, t, k):
    """Correlated inputs whose channels' energies (H's diagonal) are in no order."""
    return correlated_inputs(rng, t, k) * rng.uniform(0.2, 3.0, k)


@pytest.mark.parametrize("group_scales", ["search", "rtn"])
@pytest.mark.parametrize("bits,symmetric,block", [(4, True, 32), (4, False, 32), (8, True, 64), (4, True, 256)])
def test_act_order_codes_equal_the_plain_algorithm(bits, symmetric, block, group_scales):
    """K=256, H's diagonal shuffled: a group's columns fall in both lazy batches (its scale is
    chosen with the pending feedback applied), a dead input column (last in the order)."""
    rng = np.random.default_rng(bits + block + 1)
    w = rng.standard_normal((12, 256)).astype(np.float32)
    x = shuffled_energies(rng, 400, 256)
    x[:, 7] = 0
    h = x.T @ x
    qweight, scales, zero_points = gptq_blocks(w, hessian=h, bits=bits, block_size=block, symmetric=symmetric,
                                               group_scales=group_scales, act_order=True, rtn_rows=False)
    codes = unpack_codes(qweight, bits).reshape(12, 256)
    np.testing.assert_array_equal(codes, direct_gptq(w, h, bits, block, symmetric, group_scales, act_order=True))
    assert not np.array_equal(codes, direct_gptq(w, h, bits, block, symmetric, group_scales))  # the order counts
    dequantized = dequantize_blocks(qweight, scales, zero_points, bits=bits, block_size=block, k=256)
    assert np.all(dequantized[:, 7] == 0)


@pytest.mark.parametrize("act_order", [False, True])
def test_a_padded_block_is_dead_columns(act_order):
    """K=20 in one block of 32: the 12 padding columns are dead inputs (last in act-order)."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((7, 20)).astype(np.float32)
    h = (x := shuffled_energies(rng, 100, 20)).T @ x
    padded_w, padded_h = np.zeros((7, 32), np.float32), np.zeros((32, 32))
    padded_w[:, :20], padded_h[:20, :20] = w, h
    for symmetric in (True, False):
        qweight, _, _ = gptq_blocks(w, hessian=h, bits=4, block_size=32, symmetric=symmetric, act_order=act_order,
                                    rtn_rows=False)
        np.testing.assert_array_equal(unpack_codes(qweight, 4).reshape(7, 32),
                                      direct_gptq(padded_w, padded_h, 4, 32, symmetric, "search", act_order))


def test_act_order_on_a_decreasing_diagonal_is_the_natural_order():
    rng = np.random.default_rng(11)
    w = rng.standard_normal((10, 192)).astype(np.float32)
    x = correlated_inputs(rng, 500, 192)
    x *= np.linspace(3.0, 0.5, 192) / np.linalg.norm(x, axis=0)  # channel energies 9 ... 0.25
    h = x.T @ x
    assert np.all(np.diff(np.diag(h)) < 0)
    for symmetric in (True, False):
        natural = gptq_blocks(w, hessian=h, bits=4, block_size=32, symmetric=symmetric)
        ordered = gptq_blocks(w, hessian=h, bits=4, block_size=32, symmetric=symmetric, act_order=True)
        for a, b in zip(ordered, natural):
            assert (a is None and b is None) or np.array_equal(a, b)
    assert not np.array_equal(gptq_blocks(w, hessian=h[::-1, ::-1], bits=4, block_size=32, symmetric=True)[0],
                              gptq_blocks(w, hessian=h[::-1, ::-1], bits=4, block_size=32, symmetric=True,
                                          act_order=True)[0])  # increasing: the order is reversed


def test_the_order_and_the_permutation_in_place():
    assert list(column_order(np.array([1.0, 3.0, 0.0, 3.0, 2.0, 0.0]))) == [1, 3, 4, 0, 2, 5]  # ties: column order
    rng = np.random.default_rng(2)
    h = (x := rng.standard_normal((90, 70))).T @ x
    perm = rng.permutation(70)
    work = h.copy()
    assert permute_symmetric(work, perm, block=16) is work
    np.testing.assert_array_equal(work, h[perm][:, perm])


def test_act_order_beats_the_natural_order_on_shuffled_energies():
    assert_clearly_better(shuffled_energies, 8, 0.9, lambda w, h, symmetric: gptq_blocks(
        w, hessian=h, bits=4, block_size=32, symmetric=symmetric, act_order=True), lambda w, h, symmetric: gptq_blocks(
        w, hessian=h, bits=4, block_size=32, symmetric=symmetric))


def test_a_diagonal_hessian_gives_rtn():
    """Inputs that share nothing: no feedback, so GPTQ is RTN, codes, scales and zero points."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((9, 96)).astype(np.float32)
    h = np.diag(rng.uniform(0.5, 2.0, 96))
    for symmetric in (True, False):
        got = gptq_blocks(w, hessian=h, bits=4, block_size=32, symmetric=symmetric, group_scales="rtn")
        want = quantize_blocks(w, bits=4, block_size=32, symmetric=symmetric)
        for a, b in zip(got, want):
            assert (a is None and b is None) or np.array_equal(a, b)


def test_the_factors_are_exact():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 70))
    h = x.T @ x + np.eye(70)
    v = upper_factor(h.copy(), block=16)
    assert np.allclose(np.tril(v, -1), 0) and np.all(np.diag(v) > 0)
    np.testing.assert_allclose(v @ v.T, h, rtol=1e-12, atol=1e-9)
    u = invert_upper(v, block=16)
    np.testing.assert_allclose(u, np.linalg.cholesky(np.linalg.inv(h)).T, rtol=1e-9, atol=1e-12)


def weighted_error(w, parts, h, bits, block):
    d = (w - dequantize_blocks(*parts, bits=bits, block_size=block, k=w.shape[1])).astype(np.float64)
    return float(np.einsum("nk,kl,nl->", d, h, d))


def assert_clearly_better(inputs, seed: int, ratio: float, better, worse):
    """On W [64, 256] and H = X^T X of ``inputs(rng, 1024, 256)``, symmetric and not:
    ``better(w, h, symmetric)``'s codes weigh under ``ratio`` times ``worse``'s in H-weighted
    error (4 bits, block 32)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    h = (x := inputs(rng, 1024, 256)).T @ x
    for symmetric in (True, False):
        ours, theirs = better(w, h, symmetric), worse(w, h, symmetric)
        assert weighted_error(w, ours, h, 4, 32) < ratio * weighted_error(w, theirs, h, 4, 32)


def test_chunks_of_rows_change_nothing(monkeypatch):
    import passes.quantize_gptq as module

    rng = np.random.default_rng(6)
    w = rng.standard_normal((37, 64)).astype(np.float32)
    h = (x := correlated_inputs(rng, 200, 64)).T @ x
    whole = gptq_blocks(w, hessian=h, bits=4, block_size=32, symmetric=False)
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 8 * 64)  # chunks of 8 rows
    for a, b in zip(gptq_blocks(w, hessian=h, bits=4, block_size=32, symmetric=False), whole):
        np.testing.assert_array_equal(a, b)


def test_a_group_shares_one_factorisation_and_changes_nothing():
    rng = np.random.default_rng(5)
    weights = [rng.standard_normal((n, 64)).astype(np.float32) for n in (8, 3, 5)]
    h = (x := correlated_inputs(rng, 200, 64)).T @ x
    sources = [(lambda a, b, w=w: w[a:b], w.shape[0], "float32") for w in weights]
    together = [parts for _, _, parts in gptq_chunks(sources, h, bits=4, block_size=32, symmetric=False)]
    for w, got in zip(weights, together):
        want = gptq_blocks(w, hessian=h, bits=4, block_size=32, symmetric=False)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


@settings(max_examples=100, deadline=None)
@given(bits=st.sampled_from([4, 8]), symmetric=st.booleans(), block=st.sampled_from([16, 32]),
       rows=st.integers(1, 6), blocks=st.integers(1, 5), extra=st.integers(1, 40), mix=st.floats(0, 3),
       seed=st.integers(0, 2 ** 16), float32=st.booleans(), group_scales=st.sampled_from(["search", "rtn", "static"]),
       act_order=st.booleans(), spread=st.floats(0, 2))
def test_never_worse_than_rtn_in_hessian_weighted_error(bits, symmetric, block, rows, blocks, extra, mix, seed,
                                                        float32, group_scales, act_order, spread):
    rng = np.random.default_rng(seed)
    k = block * blocks
    w = rng.standard_normal((rows, k)).astype(np.float32)
    x = rng.standard_normal((k + extra, k))  # more rows than columns: H positive definite
    x[:, 1:] += mix * x[:, :-1]
    x *= np.exp(spread * rng.standard_normal(k))  # channel energies in no order
    h = x.T @ x
    gptq = gptq_blocks(w, hessian=h.astype(np.float32) if float32 else h, bits=bits, block_size=block,
                       symmetric=symmetric, group_scales=group_scales, act_order=act_order)
    rtn = quantize_blocks(w, bits=bits, block_size=block, symmetric=symmetric)
    mine, theirs = weighted_error(w, gptq, h, bits, block), weighted_error(w, rtn, h, bits, block)
    assert mine <= theirs * (1 + 1e-5) + 1e-9


def test_gptq_beats_rtn_clearly_on_correlated_inputs():
    assert_clearly_better(correlated_inputs, 7, 0.8, lambda w, h, symmetric: gptq_blocks(
        w, hessian=h, bits=4, block_size=32, symmetric=symmetric), lambda w, h, symmetric: quantize_blocks(
        w, bits=4, block_size=32, symmetric=symmetric))


def test_bad_hessians():
    w = np.ones((2, 32), np.float32)
    with pytest.raises(ValueError, match="hessian must be a finite"):
        gptq_blocks(w, hessian=np.eye(16), bits=4, block_size=32, symmetric=True)
    with pytest.raises(ValueError, match="not positive semidefinite"):
        gptq_blocks(w, hessian=-np.eye(32), bits=4, block_size=32, symmetric=True)


# ---- sequential calibration --------------------------------------------------------------------

class Done:
    def __init__(self, dequantized):
        self.array = dequantized

    def dequantized(self):
        return self.array


class RecordRTN:
    """A ``quantize`` callback that records each group and its Hessian and quantizes by RTN."""

    def __init__(self, graph):
        self.graph, self.hessians, self.groups = graph, {}, []

    def __call__(self, names, hessian):
        self.groups.append(list(names))
        results = {}
        for name in names:
            self.hessians[name] = hessian.copy()
            weight = self.graph.params[name].array()
            parts = quantize_blocks(weight, bits=4, block_size=16, symmetric=True)
            results[name] = Done(dequantize_blocks(*parts, bits=4, block_size=16, k=weight.shape[1]))
        return results


def two_linears() -> Graph:
    """ids -> embedding [20, 16] -> linear W1 [24, 16] -> linear W2 [8, 24] (the logits)."""
    g = Graph("two")
    ids = g.add_input("input_ids", DType.i64, ("B", "T"))
    table = g.add_param("embed", DType.f32, (20, 16))
    w1 = g.add_param("w1", DType.f32, (24, 16))
    w2 = g.add_param("w2", DType.f32, (8, 24))
    seed_absent(g)
    x = emit1(g, "embedding", [ids, table], None, "x")
    g.outputs = [emit1(g, "linear", [emit1(g, "linear", [x, w1], None, "h"), w2], None, "logits")]
    return g


def test_layer_two_sees_layer_one_quantized():
    g = two_linears()
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, 20, 50)]
    record = RecordRTN(g)
    done = sequential_hessians(g, tokens, {"w1", "w2"}, record, window=32)
    assert sorted(done) == ["w1", "w2"]
    x = np.concatenate([g.params["embed"].array()[tokens[:32]], g.params["embed"].array()[tokens[32:]]])
    np.testing.assert_allclose(record.hessians["w1"], x.T.astype(np.float64) @ x / 50, rtol=1e-5)
    quantized = x @ done["w1"].dequantized().T
    np.testing.assert_allclose(record.hessians["w2"], quantized.T.astype(np.float64) @ quantized / 50, rtol=1e-5)
    exact = x @ g.params["w1"].array().T
    assert not np.allclose(record.hessians["w2"], exact.T @ exact / 50, rtol=1e-3)


def test_the_hessian_holds_one_window_at_a_time():
    """``hessian`` sums a generator's windows as they come: each is released before the next
    is made (a down projection's hidden at 4096 tokens is 0.24 GB), and the sum is X^T X / T."""
    rng = np.random.default_rng(3)
    made, released = [], []

    def windows():
        for rows in (7, 5, 9):
            released.append(all(ref() is None for ref in made))
            window = rng.normal(size=(1, rows, 6)).astype(np.float32)
            made.append(weakref.ref(window))
            kept.append(window.copy())
            yield window
            del window

    kept = []
    h = hessian(windows())
    assert released == [True, True, True]
    x = np.concatenate([k.reshape(-1, 6) for k in kept]).astype(np.float64)
    np.testing.assert_allclose(h, x.T @ x / 21, rtol=1e-6, atol=1e-7)
    assert h.dtype == np.float32


def test_one_hessian_per_activation_and_the_hidden_of_a_fused_mlp(text_files):
    """q/k/v read one x: one group, one Hessian; a swiglu's w_down gets its hidden's, from
    the quantized gate and up."""
    g = example("tiny-llama3")
    from irc.evaluate import text_tokens
    tokens = text_tokens(*text_files)
    record = RecordRTN(g)
    names = {"layers.0.attn.wq", "layers.0.attn.wk", "layers.0.attn.wv", "layers.0.mlp.w_gate",
             "layers.0.mlp.w_up", "layers.0.mlp.w_down"}
    sequential_hessians(g, tokens, names, record, window=64)
    assert record.groups == [["layers.0.attn.wq", "layers.0.attn.wk", "layers.0.attn.wv"],
                             ["layers.0.mlp.w_gate", "layers.0.mlp.w_up"], ["layers.0.mlp.w_down"]]
    h = record.hessians
    np.testing.assert_array_equal(h["layers.0.attn.wq"], h["layers.0.attn.wv"])
    np.testing.assert_array_equal(h["layers.0.mlp.w_gate"], h["layers.0.mlp.w_up"])
    assert h["layers.0.mlp.w_down"].shape == (160, 160) and not np.array_equal(h["layers.0.attn.wq"],
                                                                               h["layers.0.mlp.w_gate"])


# ---- the pass ------------------------------------------------------------------------------------

def gptq(text_files, **options):
    text, tokenizer = text_files
    return Quantize(method="gptq", calibration=text, tokenizer=tokenizer, calibration_tokens=128, **options)


def test_pass_runs_is_idempotent_and_spills_its_codes(text_files):
    g = example("tiny-llama3")
    q = gptq(text_files, bits=4, group=32)
    out, changed = apply_pass(q, g)
    assert changed
    assert "gptq" in repr(out.params["layers.1.attn.wo.qweight"].data)
    assert any("@embed has no calibration statistics" in n for n in q.notes)  # the untied table: mse
    text = print_graph(out)
    assert q.run(out) is False and print_graph(out) == text
    source = out.params["layers.1.mlp.w_down.qweight"].data.compute.weight
    assert isinstance(source, SpilledWeight)
    directory = source.directory.path
    assert os.path.isdir(directory) and os.listdir(directory)
    whole = out.params["layers.1.mlp.w_down.qweight"].array()
    np.testing.assert_array_equal(out.params["layers.1.mlp.w_down.qweight"].data.rows(3, 9), whole[3:9])
    plain, _ = apply_pass(Quantize(method="rtn", bits=4, group=32), g)
    assert not np.array_equal(whole, plain.params["layers.1.mlp.w_down.qweight"].array())
    del out, source, q, whole
    gc.collect()
    assert not os.path.exists(directory)  # removed with the last param that reads it


def test_two_runs_write_the_same_bytes(text_files):
    g = example("tiny-llama3")
    first, _ = apply_pass(gptq(text_files, act_order=False), g)  # the default, act-order: the test below
    second, _ = apply_pass(gptq(text_files, act_order=False), g)
    for name, param in first.params.items():
        np.testing.assert_array_equal(param.array(), second.params[name].array())


def test_act_order_pass_is_idempotent_and_writes_the_same_bytes_twice(text_files):
    g = example("tiny-llama3")
    q = gptq(text_files, act_order=True)
    first, changed = apply_pass(q, g)
    assert changed and "gptq" in repr(first.params["layers.0.attn.wq.qweight"].data)
    text = print_graph(first)
    assert q.run(first) is False and print_graph(first) == text
    second, _ = apply_pass(gptq(text_files, act_order=True), g)
    natural, _ = apply_pass(gptq(text_files, act_order=False), g)
    for name, param in first.params.items():
        np.testing.assert_array_equal(param.array(), second.params[name].array())
    assert not np.array_equal(first.params["layers.0.mlp.w_down.qweight"].array(),
                              natural.params["layers.0.mlp.w_down.qweight"].array())


def test_act_order_is_an_option_of_gptq_only(text_files):
    with pytest.raises(PassError, match="act_order must be true or false"):
        gptq(text_files, act_order="yes")
    with pytest.raises(PassError, match="act_order=true orders GPTQ's columns; method=ort"):
        Quantize(method="ort", act_order=True)


def test_gptq_defaults_are_its_best_measured_setting(text_files):
    """``METHOD_DEFAULTS``: gptq calibrates on 4096 tokens in act-order unless told otherwise;
    other methods keep 1024 tokens; the pipeline string shows only what differs from the
    method's defaults."""
    text, tokenizer = text_files
    q = Quantize(method="gptq", calibration=text, tokenizer=tokenizer)
    assert (q.config["calibration_tokens"], q.config["act_order"]) == (4096, True)
    assert "act_order" not in repr(q) and "calibration_tokens" not in repr(q)
    natural = Quantize(method="gptq", calibration=text, tokenizer=tokenizer, act_order=False, calibration_tokens=1024)
    assert (natural.config["calibration_tokens"], natural.config["act_order"]) == (1024, False)
    assert "act_order=False" in repr(natural) and "calibration_tokens=1024" in repr(natural)
    imatrix = Quantize(method="imatrix", calibration=text, tokenizer=tokenizer)
    assert (imatrix.config["calibration_tokens"], imatrix.config["act_order"]) == (1024, False)
    assert Quantize().config["act_order"] is False


def test_calibrated_error_is_smaller_than_rtn_on_the_calibration_text(text_files):
    from irc.evaluate import StreamingInterpreter, prefill_logits, text_tokens

    g = example("tiny-llama3")
    ids = text_tokens(*text_files)[:128]
    reference = prefill_logits(StreamingInterpreter(g.clone()), ids)
    errors = {}
    for name, q in (("gptq", gptq(text_files)), ("rtn", Quantize(method="rtn"))):
        out, _ = apply_pass(q, g)
        errors[name] = relative_error(prefill_logits(StreamingInterpreter(out), ids), reference)
    assert errors["gptq"] < 0.6 * errors["rtn"], errors


def test_onnx_ort_matches_the_reference(text_files, tmp_path):
    """A tied head (its table's Hessian is the final hidden state's), lower-mlp first."""
    text, tokenizer = text_files
    graph = example("tiny-gemma2-9b")
    PassManager(parse_pipeline(f"lower-mlp,quantize{{bits=4,group=32,embeddings=true,method=gptq,"
                               f"calibration={text},tokenizer={tokenizer},calibration_tokens=128,"
                               f"accuracy_level=0}},{TARGETS['onnx-ort'].pipeline(23)}")).run(graph)
    assert "gptq" in repr(graph.params["embed.qweight"].data)
    path = str(tmp_path / "model.onnx")
    emit_model(graph, path, target="onnx-ort", opset=23, context=64)
    prompts = [[1, 5, 9, 3], [7, 2]]
    ours, ref = greedy(ort_engine(path), graph, prompts, 3), greedy(interpreter_engine(graph), graph, prompts, 3)
    np.testing.assert_array_equal(ours["tokens"], ref["tokens"])
    for row, pad in enumerate((0, 2)):  # left padding: the padded positions' logits are no one's
        assert relative_error(ours["prefill"]["logits"][row, pad:], ref["prefill"]["logits"][row, pad:]) < 1e-4
    for got, expected in zip(ours["steps"], ref["steps"]):
        assert relative_error(got, expected) < 1e-4


def test_a_short_calibration_text_is_one_error_naming_the_file(text_files):
    text, tokenizer = text_files
    g = example("tiny-llama3")
    before = print_graph(g)
    with pytest.raises(PassError, match="gives 192 tokens, method=gptq asks for calibration_tokens=4096") as err:
        Quantize(method="gptq", calibration=text, tokenizer=tokenizer).run(g)
    assert err.value.location == text
    assert print_graph(g) == before
    with pytest.raises(PassError, match="needs a calibration text"):
        Quantize(method="gptq")


def test_experts_fall_back_to_the_weighted_search(text_files):
    """MoE experts: no observer sees their inputs, so mse with a note; attention stays gptq."""
    g = example("tiny-mixtral-8x7b")
    q = gptq(text_files, bits=4)
    q.run(g)
    for name in ("layers.0.moe.w_gate", "layers.1.moe.w_down"):
        assert any(f"@{name} has no calibration statistics" in n for n in q.notes)
        assert "mse" in repr(g.params[f"{name}.qweight"].data)
    assert "gptq" in repr(g.params["layers.1.attn.wq.qweight"].data)
