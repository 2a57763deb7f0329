"""quantize{method=awq}: the scale search equals a direct NumPy transcription of AutoAWQ's
(same α, same scales, same codes), is never worse than ort in the group's output error, the
folds leave the float model's function unchanged (Gemma's (1 + w) norm too), and the pass is
idempotent, deterministic, matches the reference through both ONNX targets and refuses a
missing calibration text (exit 2, nothing written)."""
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
from irc.evaluate import text_tokens
from irc.interpreter import Interpreter, random_feeds
from irc.ops.nn import f32, rms_norm
from irc.ops.quant import dequantize_blocks
from irc.passmanager import PassManager, parse_pipeline
from irc.printer import print_graph
from irc.testing import apply_pass, check_golden
from passes.quantize import Quantize
from passes.quantize_awq import awq_fold, plan_groups, search_scale
from passes.quantize_awq_clip import RATIOS, clipped_rows, search_clip
from passes.quantize_ort import ort_blocks_numpy

from tests.passes.test_quantize_methods import example, text_files  # noqa: F401 (text_files: a fixture)


# ---- the search ----------------------------------------------------------------------------------

def direct_awq(x, weights, bits=4, block=32, symmetric=True, n_grid=20):
    """AutoAWQ's ``_search_best_scale`` (duo_scaling off) transcribed, in float32 but for the
    channel means (float64, rounded): (ratio, scales, losses)."""
    x = x.reshape(-1, x.shape[-1]).astype(np.float32)
    x_mean = np.abs(x).mean(axis=0, dtype=np.float64).astype(np.float32)
    fp_output = np.concatenate([x @ w.T for w in weights], axis=-1)
    best_error, best_ratio, best_scales, history = float("inf"), -1, None, []
    for ratio in range(n_grid):
        ratio = ratio / n_grid
        scales = np.clip(x_mean ** np.float32(ratio), 1e-4, None).astype(np.float32)
        scales = scales / np.sqrt(scales.max() * scales.min())
        fake = []
        for w in weights:
            q = ort_blocks_numpy(w * scales, bits=bits, block_size=block, symmetric=symmetric)
            fake.append(dequantize_blocks(*q, bits=bits, block_size=block, k=w.shape[1]) / scales)
        int_output = np.concatenate([x @ w.T for w in fake], axis=-1)
        loss = float(np.mean((fp_output.astype(np.float64) - int_output) ** 2))
        history.append(loss)
        if loss < best_error:
            best_error, best_ratio, best_scales = loss, ratio, scales
    return best_ratio, best_scales, np.array(history)


def outlier_layer(rng, t, k, ns, spread):
    """Activations with a few large channels (the case AWQ is for) and weights [n, k] each."""
    x = rng.standard_normal((t, k)).astype(np.float32)
    x *= np.exp(spread * rng.standard_normal(k)).astype(np.float32)
    return x, [(rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32) for n in ns]


def sources(weights):
    return [(lambda a, b, w=w: w[a:b], w.shape[0], DType.f32) for w in weights]


@pytest.mark.parametrize("symmetric", [True, False])
def test_search_equals_autoawq_transcribed(symmetric, monkeypatch):
    """Three weights sharing x (q|k|v-like); chunks of 8 rows change nothing."""
    import passes.quantize_awq as module

    rng = np.random.default_rng(11)
    x, weights = outlier_layer(rng, 200, 64, (24, 8, 8), 1.0)
    ratio, scales, history = direct_awq(x, weights, symmetric=symmetric)
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 8 * 64)
    alpha, s, losses = search_scale(x, sources(weights), bits=4, block_size=32, symmetric=symmetric)
    assert alpha == ratio and 0 < alpha
    np.testing.assert_array_equal(s, scales)
    np.testing.assert_allclose(losses, history, rtol=1e-5)
    assert losses.argmin() == history.argmin()


def block_error(x, weights, fake):
    return sum(float(np.sum((x @ w.T - x @ f.T).astype(np.float64) ** 2)) for w, f in zip(weights, fake))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 16), k=st.sampled_from([32, 64, 96]), spread=st.floats(0, 2),
       symmetric=st.booleans(), bits=st.sampled_from([4, 8]), rows=st.integers(1, 20))
def test_never_worse_than_ort_on_the_block_output(seed, k, spread, symmetric, bits, rows):
    rng = np.random.default_rng(seed)
    x, weights = outlier_layer(rng, 64, k, (rows, 3), spread)
    alpha, s, _ = search_scale(x, sources(weights), bits=bits, block_size=32, symmetric=symmetric)
    awq = [dequantize_blocks(*ort_blocks_numpy(w * s, bits=bits, block_size=32, symmetric=symmetric), bits=bits,
                             block_size=32, k=k) / s for w in weights]
    ort = [dequantize_blocks(*ort_blocks_numpy(w, bits=bits, block_size=32, symmetric=symmetric), bits=bits,
                             block_size=32, k=k) for w in weights]
    assert block_error(x, weights, awq) <= block_error(x, weights, ort) * (1 + 1e-5) + 1e-12


def test_awq_clearly_beats_ort_with_outlier_channels():
    rng = np.random.default_rng(2)
    x, weights = outlier_layer(rng, 256, 128, (64,), 1.5)
    alpha, s, losses = search_scale(x, sources(weights), bits=4, block_size=32, symmetric=True)
    assert alpha > 0 and losses.min() < 0.8 * losses[0]


# ---- the clip search -------------------------------------------------------------------------------

def direct_clip(w, x, bits=4, block=32, symmetric=True, n_grid=20, max_shrink=0.5, n_sample_token=512):
    """AutoAWQ's ``_compute_best_clip`` transcribed (its pseudo-quantizer replaced by the ort
    codes, outputs in float64): the best max_val [co, n_group]."""
    co, ci = w.shape
    x = x.reshape(-1, ci).astype(np.float32)
    x = x.reshape(1, x.shape[0], -1, block)
    x = x[:, ::max(1, x.shape[1] // n_sample_token)].astype(np.float64)
    w = w.reshape(co, 1, -1, block)
    org_max_val = np.abs(w).max(axis=-1, keepdims=True)
    best_max_val = org_max_val.copy()
    min_errs = np.ones_like(org_max_val, dtype=np.float64) * 1e9
    org_out = (x * w).sum(axis=-1)
    for i_s in range(int(max_shrink * n_grid)):
        max_val = org_max_val * np.float32(1 - i_s / n_grid)
        cur_w = np.clip(w, -max_val, max_val).reshape(co, ci)
        q = ort_blocks_numpy(cur_w, bits=bits, block_size=block, symmetric=symmetric)
        q_w = dequantize_blocks(*q, bits=bits, block_size=block, k=ci).reshape(w.shape)
        cur_out = (x * q_w).sum(axis=-1)
        err = ((cur_out - org_out) ** 2).mean(axis=1).reshape(min_errs.shape)
        better = err < min_errs
        min_errs[better] = err[better]
        best_max_val[better] = max_val[better]
    return best_max_val.squeeze(1).squeeze(-1)


def fake_clipped(w, limits, bits=4, block=32, symmetric=True):
    """Q(clamp(W, ±limits)) dequantized, float32 [co, ci]; ``limits`` [co, n_group]."""
    co, ci = w.shape
    cut = np.clip(w.reshape(co, -1, block), -limits[..., None], limits[..., None]).reshape(co, ci)
    return dequantize_blocks(*ort_blocks_numpy(cut, bits=bits, block_size=block, symmetric=symmetric), bits=bits,
                             block_size=block, k=ci)


def row_error(x, w, fake):
    """Squared output error per row over every token, float64."""
    d = x.reshape(-1, x.shape[-1]).astype(np.float64) @ (fake.astype(np.float64) - w).T
    return (d ** 2).sum(axis=0)


def guarded(w, x, limits, **quantizer):
    """The row guard on ``limits``: a row whose whole output error grows keeps its maxima."""
    top = np.abs(w.reshape(w.shape[0], -1, quantizer.get("block", 32))).max(-1)
    worse = row_error(x, w, fake_clipped(w, limits, **quantizer)) > row_error(x, w, fake_clipped(w, top, **quantizer))
    return np.where(worse[:, None], top, limits)


def heavy_layer(rng, t, k, n, df=3.0):
    """Heavy-tailed weights (Student t), outlier-channel activations."""
    x, _ = outlier_layer(rng, t, k, (1,), 1.0)
    return x, (rng.standard_t(df, (n, k)) / np.sqrt(k)).astype(np.float32)


def limits_of(w, choice, block=32):
    return np.abs(w.reshape(w.shape[0], -1, block)).max(-1) * RATIOS[choice]


@pytest.mark.parametrize("symmetric", [True, False])
def test_clip_equals_autoawq_transcribed(symmetric, monkeypatch):
    """1100 tokens (AutoAWQ samples every 2nd), chunks of 6 rows; with the guard, a row is
    AutoAWQ's choice or unclipped, the latter exactly where the transcription's clip makes the
    row's output error over all tokens larger."""
    import passes.quantize_awq_clip as module

    rng = np.random.default_rng(5)
    x, w = heavy_layer(rng, 1100, 96, 40)
    want = direct_clip(w, x, symmetric=symmetric)
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 6 * 96 * len(RATIOS))
    read = lambda a, b: w[a:b]  # noqa: E731
    choice, _ = search_clip(x, read, 40, DType.f32, bits=4, block_size=32, symmetric=symmetric, guard=False)
    np.testing.assert_array_equal(limits_of(w, choice), want)
    assert 0.2 < np.mean(choice > 0) and len(np.unique(choice)) > 3
    choice, (before, after) = search_clip(x, read, 40, DType.f32, bits=4, block_size=32, symmetric=symmetric)
    np.testing.assert_array_equal(limits_of(w, choice), guarded(w, x, want, symmetric=symmetric))
    assert after < 0.97 * before


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 16), k=st.sampled_from([32, 64, 96]), tokens=st.sampled_from([8, 64, 700]),
       df=st.floats(1.5, 50), symmetric=st.booleans(), bits=st.sampled_from([4, 8]), rows=st.integers(1, 20))
def test_clip_never_worse_than_no_clip(seed, k, tokens, df, symmetric, bits, rows):
    """Per row, over every calibration token, and per block on AutoAWQ's sampled criterion."""
    rng = np.random.default_rng(seed)
    x, w = heavy_layer(rng, tokens, k, rows, df)
    choice, _ = search_clip(x, lambda a, b: w[a:b], rows, DType.f32, bits=bits, block_size=32, symmetric=symmetric)
    quantizer = {"bits": bits, "symmetric": symmetric}
    clipped, plain = fake_clipped(w, limits_of(w, choice), **quantizer), fake_clipped(w, limits_of(w, 0 * choice),
                                                                                    **quantizer)
    assert np.all(row_error(x, w, clipped) <= row_error(x, w, plain) * (1 + 1e-5) + 1e-12)
    np.testing.assert_array_equal(clipped_rows(w, choice, 32, DType.f32),
                                  np.clip(w.reshape(rows, -1, 32), -limits_of(w, choice)[..., None],
                                          limits_of(w, choice)[..., None]).reshape(rows, k))


def test_clipped_rows_keep_the_bfloat16_codes_of_the_search():
    """A bfloat16 weight: the lazy param's rows (whole or a slice), quantized, dequantize to
    the very candidate the search scored in each block."""
    from irc.graph import Param
    from passes.quantize_awq_clip import Clipped, _candidates
    from passes.quantize_ort import ort_blocks

    rng = np.random.default_rng(3)
    x, w = heavy_layer(rng, 300, 64, 24)
    param = Param("w", DType.bf16, (24, 64), w.astype(DType.bf16.numpy))
    choice, _ = search_clip(x, lambda a, b: param.data[a:b], 24, DType.bf16, bits=4, block_size=32, symmetric=True)
    assert choice.any()
    lazy = Clipped(param, choice, 32)
    np.testing.assert_array_equal(lazy.rows(5, 17).view(np.uint16), lazy()[5:17].view(np.uint16))
    assert lazy().dtype == DType.bf16.numpy and np.all(np.abs(f32(lazy())) <= np.abs(f32(param.data)))
    _, fake = _candidates(param.data, 32, DType.bf16, {"bits": 4, "symmetric": True})
    scored = np.take_along_axis(fake.reshape(len(RATIOS), 24, 2, 32), choice[None, :, :, None], axis=0)[0]
    written = dequantize_blocks(*ort_blocks(lazy(), bits=4, block_size=32, symmetric=True, scale_dtype="bfloat16"),
                                bits=4, block_size=32, k=64)
    np.testing.assert_array_equal(written, scored.reshape(24, 64))


# ---- the folds and the pass ------------------------------------------------------------------------

def lowered(name):
    graph = example(name)
    PassManager(parse_pipeline("lower-mlp")).run(graph)
    return graph


CONFIG = {"bits": 4, "symmetric": True, "calibration_tokens": 128, "calibration": "text"}


@pytest.mark.parametrize("name", ["tiny-llama3", "tiny-gemma2-9b"])
def test_folded_float_model_equals_the_original(name, text_files):
    """Without the clip (which changes the weights): Gemma-2's norms are (1 + w) (offset 1):
    w' = (1 + w) / s - 1."""
    graph = lowered(name)
    folded = graph.clone()
    tokens = text_tokens(*text_files)
    weights = [p for p in folded.params.values() if p.rank >= 2]
    alphas, skipped, _ = awq_fold(folded, tokens, weights, CONFIG, lambda k: 32, clip=False)
    assert sum(a > 0 for a in alphas.values()) >= 6
    assert "Derived(awq" in repr(folded.params["layers.0.mlp.w_up"].data)  # its rows take the down's 1/s
    if name == "tiny-gemma2-9b":
        assert any(n.op == "rms_norm" and n.attrs["offset"] == 1.0 and "awq" in repr(n.inputs[1].data)
                   for n in folded.nodes)
        assert "table tied to it" in skipped["embed"]
    assert "present V cache" in skipped["layers.0.attn.wo"]
    feeds = random_feeds(graph, batch=2, tokens=6, past=3, seed=1, left_pad=2)
    want, got = Interpreter(graph).run(feeds), Interpreter(folded).run(feeds)
    for key in want:
        assert relative_error(got[key], want[key]) < 1e-5, key


def test_the_pass_writes_the_transcription_codes(text_files):
    """Layer 0's q|k|v: x is the attention norm of the looked-up rows (one window of 128); q
    and k are not clipped, v is, by the transcribed clip search on x / s with the row guard."""
    text, tokenizer = text_files
    graph = lowered("tiny-llama3")
    q = Quantize(method="awq", calibration=text, tokenizer=tokenizer, calibration_tokens=128)
    out, changed = apply_pass(q, graph)
    assert changed
    ids = text_tokens(text, tokenizer, 128)
    p = graph.params
    x = rms_norm(p["embed"].array()[ids], p["layers.0.attn_norm"].array(), 1e-5)
    names = ["layers.0.attn.wq", "layers.0.attn.wk", "layers.0.attn.wv"]
    ratio, scales, _ = direct_awq(x, [p[n].array() for n in names])
    assert ratio > 0
    for name in names:
        weight = p[name].array() * scales
        if name.endswith("wv"):
            limits = guarded(weight, x / scales, direct_clip(weight, x / scales))
            assert (limits < np.abs(weight).reshape(32, 2, 32).max(-1)).any()
            weight = np.clip(weight.reshape(32, 2, 32), -limits[..., None], limits[..., None]).reshape(32, 64)
        want = ort_blocks_numpy(weight, bits=4, block_size=32, symmetric=True)
        np.testing.assert_array_equal(out.params[f"{name}.qweight"].array(), want[0])
        np.testing.assert_array_equal(out.params[f"{name}.scales"].array(), want[1])
    np.testing.assert_array_equal(out.params["layers.0.attn_norm"].array(), p["layers.0.attn_norm"].array() / scales)
    unclipped = next(n for n in q.notes if "unclipped: a query / key projection" in n)
    assert "4 weight(s)" in unclipped and "@layers.0.attn.wq" in unclipped
    assert any(n.startswith("quantize: awq clip @layers.1.mlp.w_up:") for n in q.notes)


def awq(text_files, **options):
    text, tokenizer = text_files
    return Quantize(method="awq", calibration=text, tokenizer=tokenizer, calibration_tokens=128, **options)


def test_idempotent_and_deterministic(text_files):
    graph = lowered("tiny-llama3")
    q = awq(text_files)
    first, changed = apply_pass(q, graph)
    assert changed and "awq" in repr(first.params["layers.1.mlp.w_down.qweight"].data)
    assert any("@layers.0.attn.wo unscaled" in n for n in q.notes)
    text = print_graph(first)
    assert q.run(first) is False and print_graph(first) == text
    second, _ = apply_pass(awq(text_files), graph)
    assert sorted(first.params) == sorted(second.params)
    for name, param in first.params.items():
        assert param.array().tobytes() == second.params[name].array().tobytes(), name


def test_a_fused_mlp_is_not_scaled_and_says_why(text_files):
    q = awq(text_files)
    out, _ = apply_pass(q, example("tiny-llama3"))
    assert any("@layers.0.mlp.w_gate unscaled (ort codes): read by swiglu, not a linear (run lower-mlp first"
               in n for n in q.notes)
    assert "Derived(awq" in repr(out.params["layers.0.attn_norm"].data)


def test_groups_skip_a_shared_norm_output():
    """An activation with a reader outside the group cannot take 1/s."""
    graph = lowered("tiny-llama3")
    wanted = {p.name for p in graph.params.values() if p.rank >= 2}
    norm_out = next(n for n in graph.nodes if n.op == "rms_norm").outputs[0]
    graph.outputs.append(norm_out)  # the graph's output
    groups, skipped = plan_groups(graph, wanted)
    assert "graph output" in skipped["layers.0.attn.wq"] and all(g.x is not norm_out for g in groups)
    graph.outputs.pop()
    graph.outputs.append(emit1(graph, "silu", [norm_out], None, "other"))  # another reader
    groups, skipped = plan_groups(graph, wanted)
    assert "also read by %other (silu)" in skipped["layers.0.attn.wq"] and all(g.x is not norm_out for g in groups)
    assert "layers.1.attn.wq" not in skipped


@pytest.mark.parametrize("target", ["onnx-ort", "onnx"])
def test_onnx_matches_the_reference(target, text_files, tmp_path):
    """Gemma-2 (offset norms, tied head, geglu lowered), a left-padded batch of two, 16 greedy
    steps; two compiles write the same bytes."""
    text, tokenizer = text_files
    files = []
    for run in range(2):
        graph = example("tiny-gemma2-9b")
        PassManager(parse_pipeline(f"lower-mlp,quantize{{bits=4,group=32,embeddings=true,method=awq,"
                                   f"calibration={text},tokenizer={tokenizer},calibration_tokens=128,"
                                   f"accuracy_level=0}},{TARGETS[target].pipeline(23)}")).run(graph)
        files.append(tmp_path / f"{run}" / "model.onnx")
        files[-1].parent.mkdir()
        emit_model(graph, str(files[-1]), target=target, opset=23, context=64)
    assert "awq" in repr(graph.params["layers.0.mlp.w_down.qweight"].data)
    assert files[0].read_bytes() == files[1].read_bytes()
    prompts = [[1, 5, 9, 3], [7, 2]]
    ours = greedy(ort_engine(str(files[0])), graph, prompts, 16)
    ref = greedy(interpreter_engine(graph), graph, prompts, 16)
    np.testing.assert_array_equal(ours["tokens"], ref["tokens"])
    for row, pad in enumerate((0, 2)):
        assert relative_error(ours["prefill"]["logits"][row, pad:], ref["prefill"]["logits"][row, pad:]) < 1e-4
    for got, expected in zip(ours["steps"], ref["steps"]):
        assert relative_error(got, expected) < 1e-4


def test_no_calibration_text_is_one_error(text_files, tmp_path, capsys):
    from irc_cli import main

    with pytest.raises(PassError, match="method=awq needs a calibration text"):
        Quantize(method="awq")
    out = tmp_path / "model.onnx"
    code = main(["compile", "examples/tiny-llama3.yaml", "--target", "onnx-ort", "--passes",
                 "lower-mlp,quantize{method=awq}", "-o", str(out)])
    assert code == 2 and "method=awq needs a calibration text" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.iterdir())
    text, tokenizer = text_files
    with pytest.raises(PassError, match="gives 192 tokens, method=awq asks for calibration_tokens=1024"):
        Quantize(method="awq", calibration=text, tokenizer=tokenizer).run(lowered("tiny-llama3"))


def test_golden_after_lower_mlp(text_files):
    """The structure is ort's (dequant_linear); the scales live in the params' data."""
    graph = lowered("tiny-llama3")
    after, _ = apply_pass(awq(text_files), graph)
    check_golden("quantize-awq.before.ir", print_graph(graph))
    check_golden("quantize-awq.after.ir", print_graph(after))
