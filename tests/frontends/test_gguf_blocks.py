"""GGUF block formats repacked as irc's quantized weights (``frontends.gguf.blocks``),
held against the ``gguf`` package's own dequantizer, format by format: (q - zp) * scale
gives ggml's floats bit for bit for the symmetric formats, and within 2 ulp of the larger
of ggml's two terms (|d*q|, |m|) where a float zero point replaces ggml's minimum. The same
codes through ONNX: the portable form gives the reference's weights bit for bit, and
MatMulNBits (onnx-ort) the reference's product."""
from collections import Counter

import gguf
import numpy as np
import onnx
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from frontends.gguf.blocks import EXACT, repack
from irc.build import emit1
from irc.dtypes import DType
from irc.graph import Graph
from irc.ops.quant import dequantize_blocks, unpack_codes

ROWS, K = 12, 512
SYMMETRIC = [t for t, s in EXACT.items() if not s.float_zero]
WITH_MINIMUM = [t for t, s in EXACT.items() if s.float_zero]
F16_FIELDS = {T.Q2_K: (-4, -2), T.Q3_K: (-2,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (-2,)}  # d (and dmin) offsets


def weights(rng) -> np.ndarray:
    """Rows that exercise the edge cases: zero, constant, all positive, wide and tiny ranges."""
    w = rng.standard_normal((ROWS, K)).astype(np.float32) * 0.05
    w[0] = 0
    w[1] = 0.25                      # constant: Q4_1 / Q5_1 blocks with d == 0, m != 0
    w[2] = np.abs(w[2]) + 3.0        # all positive: a zero point far outside the codes
    w[3] *= 1000
    w[4] *= 1e-4
    return w


def k_quant_blocks(qtype, rng) -> np.ndarray:
    """Random blocks of a K-quant (gguf cannot quantize to them) with finite float16 d, dmin;
    every third block has d = 0 (constant sub-blocks)."""
    _, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (ROWS * K // 256, size), dtype=np.uint8)
    for i, offset in enumerate(F16_FIELDS[qtype]):
        values = (rng.standard_normal(len(blocks)) * 0.01).astype(np.float16)
        if i == 0:
            values[::3] = 0
        blocks[:, offset:offset + 2 or None] = values.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(ROWS, -1)


def stored(qtype, rng) -> np.ndarray:
    if qtype in F16_FIELDS:
        return k_quant_blocks(qtype, rng)
    return gguf.quants.quantize(weights(rng), qtype)


def irc_weights(raw, qtype):
    qweight, scales, zero = repack(raw, qtype, K)
    scheme = EXACT[qtype]
    return dequantize_blocks(qweight, scales, zero, bits=scheme.bits, block_size=scheme.block, k=K), (qweight, scales,
                                                                                                       zero)


@pytest.mark.parametrize("qtype", SYMMETRIC, ids=lambda t: t.name)
def test_symmetric_formats_are_bit_exact(qtype):
    raw = stored(qtype, np.random.default_rng(qtype.value))
    ours, _ = irc_weights(raw, qtype)
    want = gguf.quants.dequantize(raw, qtype)
    np.testing.assert_array_equal(ours.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("qtype", WITH_MINIMUM, ids=lambda t: t.name)
def test_float_zero_points_are_within_two_ulp_of_the_larger_term(qtype):
    raw = stored(qtype, np.random.default_rng(qtype.value))
    ours, (qweight, scales, zero) = irc_weights(raw, qtype)
    want = gguf.quants.dequantize(raw, qtype)
    scheme = EXACT[qtype]
    codes = unpack_codes(qweight, scheme.bits).reshape(ROWS, -1, scheme.block).astype(np.float32)
    terms = np.maximum(np.abs(codes * scales[..., None]), np.abs(zero * scales)[..., None]).reshape(ROWS, K)
    assert np.all(np.abs(ours - want) <= 2 * np.spacing(terms))
    assert np.mean(ours == want) > 0.3  # most elements agree exactly


def test_constant_blocks_are_exact():
    w = np.full((2, 64), -0.75, np.float32)
    raw = gguf.quants.quantize(w, T.Q4_1)
    qweight, scales, zero = repack(raw, T.Q4_1, 64)
    np.testing.assert_array_equal(dequantize_blocks(qweight, scales, zero, bits=4, block_size=32, k=64),
                                  gguf.quants.dequantize(raw, T.Q4_1))
    assert np.all(zero == -1)


def _graph(parts, qtype) -> Graph:
    """x @ W.T through dequant_linear, and W itself through dequantize, as graph outputs."""
    scheme = EXACT[qtype]
    g = Graph("blocks")
    x = g.add_input("x", DType.f32, (1, 3, K))
    params = [g.add_param(f"w.{name}", DType.parse(str(array.dtype).replace("uint8", "u8").replace("float32", "f32")),
                          array.shape, array) for name, array in zip(("qweight", "scales", "zero_points"), parts)
              if array is not None]
    attrs = {"K": K, "bits": scheme.bits, "block_size": scheme.block, "accuracy_level": 0}  # as the frontend sets
    y = emit1(g, "dequant_linear", [x, *params], {**attrs, "N": ROWS}, "y")
    w = emit1(g, "dequantize", params, attrs, "w")
    g.outputs = [y, w]
    return g


@pytest.mark.parametrize("qtype", list(EXACT), ids=lambda t: t.name)
def test_onnx_targets_compute_the_reference(qtype, tmp_path):
    from backends.onnx.emit import emit_model
    from backends.onnx.runtime import ort_engine
    from irc.interpreter import Interpreter

    _, parts = irc_weights(stored(qtype, np.random.default_rng(qtype.value)), qtype)
    graph = _graph(parts, qtype)
    x = np.random.default_rng(1).standard_normal((1, 3, K)).astype(np.float32)
    ref = Interpreter(graph).run({"x": x})
    for target in ("onnx", "onnx-ort"):
        path = str(tmp_path / f"{target}.onnx")
        emit_model(graph, path, target=target, genai=False)
        onnx.checker.check_model(path, full_check=True)
        counts = Counter(n.op_type for n in onnx.load(path).graph.node)
        assert counts["MatMulNBits"] == (1 if target == "onnx-ort" else 0)  # 8-bit float zero points too
        out = ort_engine(path)({"x": x})
        np.testing.assert_array_equal(out["w"].view(np.uint32), ref["w"].view(np.uint32))
        assert np.max(np.abs(out["y"] - ref["y"])) <= 1e-5 * np.max(np.abs(ref["y"]))


def test_numpy_module_computes_the_reference_and_triton_refuses(tmp_path):
    """The NumPy emitter copies the reference (float zero points included); the Triton
    kernels read u8 zero points only, so they refuse float ones with a message."""
    import importlib.util

    from backends import EmitOptions, get_target
    from irc.errors import BackendError
    from irc.interpreter import Interpreter

    _, parts = irc_weights(stored(T.Q4_K, np.random.default_rng(3)), T.Q4_K)
    graph = _graph(parts, T.Q4_K)
    x = np.random.default_rng(1).standard_normal((1, 3, K)).astype(np.float32)
    ref = Interpreter(graph).run({"x": x})
    path = tmp_path / "blocks_np.py"
    get_target("numpy").emit(graph, str(path), EmitOptions("numpy"))
    spec = importlib.util.spec_from_file_location("blocks_np", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.forward(module.load_weights(), x=x)
    np.testing.assert_array_equal(out["y"], ref["y"])
    with pytest.raises(BackendError, match="float zero points"):
        get_target("triton").emit(graph, str(tmp_path / "blocks_triton.py"), EmitOptions("triton"))
