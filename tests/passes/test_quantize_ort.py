"""quantize{method=ort}: the compiled kernel (``passes._quantize_kernel``, numba) and
onnxruntime's own (MLAS) give the same bytes as the NumPy statement of their scheme for every
shape, block, dtype, bit width and symmetry; its dequantized weights stay within the scheme's error; and the pass
with it compiles to both ONNX targets, which agree with the reference interpreter."""
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from irc.ops.quant import dequantize_blocks, quantize_blocks, unpack_codes
import passes.quantize_ort as quantize_ort
from passes.quantize_methods import quantize_weight
from passes.quantize_ort import KERNEL_BLOCKS, ort_blocks, ort_blocks_mlas, ort_blocks_numpy

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))  # the ONNX tests' helpers
from test_onnx_quant import LLAMA, assert_close, compile_quantized, op_types  # noqa: E402
from backends.onnx.runtime import greedy, interpreter_engine, ort_engine  # noqa: E402
from test_onnx_models import PROMPTS  # noqa: E402

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
HALF_ULP = {"float32": 0.0, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}  # relative rounding of a stored scale
# ... and absolute, where a tiny scale is subnormal in its dtype (half the smallest subnormal)
HALF_SUBNORMAL = {name: float(ml_dtypes.finfo(t).smallest_subnormal) / 2 for name, t in DTYPES.items()}


def weights(seed, lead, n, k, magnitude, offset, ties, zero_group, dtype, block):
    """float weights [*lead, n, k]: Gaussian, shifted, some rounded to quarters (ties and
    signed zeros), the first group of the first row all zeros."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((*lead, n, k)) * 10.0 ** magnitude + offset).astype(np.float32)
    if ties:
        w = np.round(w * 4) / 4  # halves and quarters of a step, -0.0 among them
    if zero_group:
        w.reshape(-1, n, k)[0, 0, :block] = 0.0
    return w.astype(DTYPES[dtype])


def same_bytes(got, want) -> None:
    for a, b, part in zip(got, want, ("qweight", "scales", "zero_points")):
        if a is None or b is None:
            assert a is None and b is None, part
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, (part, a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=part)


case = dict(bits=st.sampled_from([4, 8]), symmetric=st.booleans(), block=st.sampled_from(KERNEL_BLOCKS),
            lead=st.sampled_from([(), (1,), (3,)]), n=st.integers(1, 7), blocks=st.integers(1, 3),
            short=st.integers(0, 15), seed=st.integers(0, 2 ** 16), magnitude=st.floats(-5, 2),
            offset=st.sampled_from([0.0, 0.3, -2.0]), ties=st.booleans(), zero_group=st.booleans(),
            dtype=st.sampled_from(sorted(DTYPES)))


@settings(max_examples=150, deadline=None)
@given(**case)
def test_compiled_codes_equal_the_numpy_scheme_bit_for_bit(bits, symmetric, block, lead, n, blocks, short, seed,
                                                            magnitude, offset, ties, zero_group, dtype):
    k = max(1, block * blocks - short)  # K not a multiple of the block: the last one padded
    w = weights(seed, lead, n, k, magnitude, offset, ties, zero_group, dtype, block)
    options = dict(bits=bits, block_size=block, symmetric=symmetric, scale_dtype=dtype)
    got = ort_blocks(w, **options)
    same_bytes(got, ort_blocks_numpy(w, **options))
    same_bytes(ort_blocks_mlas(w, **options), got)  # onnxruntime's own kernel: the scheme's origin
    layout = quantize_blocks(w, **options)  # irc's layout: the same shapes and dtypes as RTN's
    assert [None if a is None else (a.shape, a.dtype) for a in got] == \
        [None if a is None else (a.shape, a.dtype) for a in layout]


def test_many_kernel_calls_give_the_bytes_of_one(monkeypatch):
    """A weight cut into several kernel calls (the last one narrower) and leading dims."""
    w = weights(3, (2,), 37, 100, -1.5, 0.1, False, True, "bfloat16", 32)
    options = dict(bits=4, block_size=32, symmetric=False, scale_dtype="bfloat16")
    whole = ort_blocks(w, **options)
    monkeypatch.setattr(quantize_ort, "CHUNK_ELEMENTS", 128 * 5)  # 5 rows a call: 15 calls, the last of 4
    same_bytes(ort_blocks(w, **options), whole)
    same_bytes(ort_blocks_mlas(w, **options), whole)
    same_bytes(whole, ort_blocks_numpy(w, **options))


@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([4, 8]), symmetric=st.booleans(), block=st.sampled_from([16, 32, 48, 128]),
       n=st.integers(1, 5), k=st.integers(1, 300), seed=st.integers(0, 2 ** 16), offset=st.sampled_from([0.0, 0.4]),
       dtype=st.sampled_from(sorted(DTYPES)))
@example(bits=8, symmetric=True, block=16, n=5, k=1, seed=43291, offset=0.0, dtype="float16")  # a subnormal scale
def test_dequantized_weights_are_within_the_schemes_error(bits, symmetric, block, n, k, seed, offset, dtype):
    """Each weight within half a step of its value inside the code range (plus what lies
    beyond it: the clipped side of a symmetric group), plus what rounding the stored scale to
    its dtype moves (|q - z| x half an ulp); padding dequantizes to 0. Block 48 is not a
    kernel size: the NumPy statement of the scheme serves it."""
    w = weights(seed, (), n, k, -1.7, offset, False, False, dtype, block)
    qweight, scales, zeros = ort_blocks(w, bits=bits, block_size=block, symmetric=symmetric, scale_dtype=dtype)
    nb = scales.shape[-1]
    s = np.abs(scales.astype(np.float64))[..., None]
    z = 2.0 ** (bits - 1) if zeros is None else unpack_codes(zeros, bits)[..., :nb, None].astype(np.float64)
    q = unpack_codes(qweight, bits).reshape(n, nb, block).astype(np.float64)
    signed = np.sign(scales.astype(np.float64))[..., None]
    ends = np.stack(np.broadcast_arrays((0 - z) * s * signed, (2 ** bits - 1 - z) * s * signed))
    low, high = ends.min(axis=0), ends.max(axis=0)
    padded = np.zeros((n, nb * block))
    padded[:, :k] = w.astype(np.float64)
    exact = padded.reshape(n, nb, block)
    beyond = np.maximum(0, np.maximum(low - exact, exact - high))
    rounding = np.maximum(s * HALF_ULP[dtype], HALF_SUBNORMAL[dtype]) * 1.001  # of the stored scale
    bound = s * (0.5 + 1e-5) + beyond + np.abs(q - z) * rounding + 1e-6 * np.abs(exact)
    approx = dequantize_blocks(qweight, scales, zeros, bits=bits, block_size=block, k=nb * block).astype(np.float64)
    error = np.abs(approx.reshape(n, nb, block) - exact)
    assert np.all(error <= bound)
    np.testing.assert_array_equal(approx[:, k:], 0.0)
    if symmetric:  # only the side opposite the largest weight's sign clips, by up to a step (and the
        # extreme weight by the scale's rounding times its code's distance, where the scale is subnormal)
        assert np.all(beyond <= s * (1 + 1e-3) + 2.0 ** (bits - 1) * np.maximum(rounding - s * HALF_ULP[dtype] * 1.001, 0))


@pytest.mark.parametrize("bits", [4, 8])
def test_symmetric_scales_of_a_bfloat16_weight_are_stored_exactly(bits):
    """s = -v / 2^(bits-1) of a bfloat16 v is a bfloat16: the stored scale is the one the codes
    were computed with, so nothing of the module docstring's rounding applies."""
    w = weights(5, (), 64, 256, -1.7, 0.0, False, False, "bfloat16", 32)
    narrow = ort_blocks(w, bits=bits, block_size=32, symmetric=True, scale_dtype="bfloat16")
    wide = ort_blocks(w, bits=bits, block_size=32, symmetric=True, scale_dtype="float32")
    np.testing.assert_array_equal(narrow[0], wide[0])
    np.testing.assert_array_equal(narrow[1].astype(np.float32), wide[1])


def test_odd_block_sizes_and_the_compiled_kernel_agree():
    """Blocks MLAS lacks (48, per channel 4096) and a float16 weight with float16 scales (the
    kernel's two calls: float32 scales, then codes from their float16 rounding)."""
    for block, k, dtype in ((48, 100, "float32"), (4096, 3000, "bfloat16"), (32, 96, "float16")):
        for symmetric in (True, False):
            w = weights(11, (), 9, k, -1.2, 0.2, True, True, dtype, block)
            options = dict(bits=4, block_size=block, symmetric=symmetric, scale_dtype=dtype)
            same_bytes(ort_blocks(w, **options), ort_blocks_numpy(w, **options))


def test_the_method_is_the_compiled_quantizer():
    w = weights(7, (), 16, 96, -1.0, 0.0, False, False, "float32", 32)
    got = quantize_weight(w, bits=4, block_size=32, symmetric=True, method="ort")
    same_bytes(got, ort_blocks(w, bits=4, block_size=32, symmetric=True))
    rtn = quantize_blocks(w, bits=4, block_size=32, symmetric=True)
    codes = unpack_codes(got[0], 4)
    assert codes.min() == 0 and codes.max() == 15  # the full range, where RTN's max-abs uses 1..15
    assert unpack_codes(rtn[0], 4).min() == 1


CASES = {
    "int4-g32-sym": "quantize{bits=4,group=32,method=ort,accuracy_level=0}",
    "int4-g16-asym-embeddings": "lower-mlp,quantize{bits=4,group=16,symmetric=false,embeddings=true,method=ort,"
                                "accuracy_level=0}",
    "int8-channel-asym": "quantize{bits=8,group=channel,symmetric=false,method=ort,accuracy_level=0}",
}


@pytest.mark.parametrize("case", CASES)
def test_both_onnx_targets_match_the_interpreter(case, tmp_path):
    """The pass with method=ort, compiled to onnx and onnx-ort and run in ONNX Runtime, against
    the reference interpreter on the same quantized graph (prefill and greedy decode)."""
    results = {}
    for target in ("onnx", "onnx-ort"):
        graph, path = compile_quantized(LLAMA, CASES[case], target, tmp_path)
        counts = op_types(path)
        assert counts["DequantizeLinear"] + counts["MatMulNBits"] > 0
        results[target] = (graph, greedy(ort_engine(path), graph, PROMPTS, 4))
    graph = results["onnx"][0]
    reference = greedy(interpreter_engine(graph), graph, PROMPTS, 4)
    for _, ours in results.values():
        assert_close(ours, reference, 1e-4)


def test_a_bfloat16_checkpoint_is_quantized_from_its_stored_rows():
    """A float32 param over a bfloat16 checkpoint (``irc.weights.Cast``): the writer's pieces
    hand the kernel the stored rows (``read_rows_stored``), which it widens itself; the codes
    are those of the float32 values, piece by piece and whole."""
    from irc.dtypes import DType
    from irc.graph import Graph
    from irc.weights import Cast, read_rows_stored
    from passes.quantize_methods import QuantizedWeight

    stored = weights(13, (), 40, 96, -1.5, 0.1, True, True, "bfloat16", 32)
    param = Graph("g").add_param("w", DType.f32, stored.shape)
    param.data = Cast(stored, DType.f32)
    assert read_rows_stored(param, 3, 9).dtype == stored.dtype  # not converted on the way
    want = ort_blocks(stored.astype(np.float32), bits=4, block_size=32, symmetric=True)
    weight = QuantizedWeight(param, 4, 32, True, "ort")
    pieces = [[weight.part(p, (start, start + 8)) for p in ("qweight", "scales")] for start in range(0, 40, 8)]
    same_bytes((np.concatenate([q for q, _ in pieces]), np.concatenate([s for _, s in pieces]), None), want)
