"""quantize{mixed=...}: per-weight bit widths in one graph (8-bit LM head and the value /
down projections llama.cpp's Q4_K_M widens, 4-bit elsewhere), through the reference
interpreter and both ONNX targets in ONNX Runtime; golden IR, idempotence, the headline."""
import sys
from pathlib import Path

import onnx
import pytest

from irc.errors import PassError
from irc.passmanager import parse_pipeline
from irc.printer import print_graph
from irc.testing import apply_pass, assert_pass, assert_unchanged, check_golden
from irc.weights import seed_absent
from frontends import load_spec
from passes.quantize import Quantize
from passes.quantize_mixed import RECIPES, use_more_bits
from tests.passes.test_quantize_methods import text_files  # noqa: F401 (a fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))  # the ONNX tests' helpers
from test_onnx_quant import LLAMA, RTOL, NEW_TOKENS, assert_close, compile_quantized, op_types  # noqa: E402
from backends.onnx.runtime import greedy, interpreter_engine, ort_engine  # noqa: E402
from test_onnx_models import PROMPTS  # noqa: E402


def example(name: str):
    graph = load_spec(f"examples/{name}.yaml")
    seed_absent(graph)
    return graph


def bits_by_weight(graph) -> dict:
    """{source weight name: bits} over the dequant nodes of ``graph``."""
    found = {}
    for node in graph.nodes:
        if node.op in ("dequant_linear", "dequant_embedding", "dequantize"):
            qweight = next(v for v in node.inputs if v is not None and v.name.endswith(".qweight"))
            found[qweight.name[:-len(".qweight")]] = node.attrs["bits"]
    return found


def test_use_more_bits_is_llama_cpps():
    """llama.cpp's rule for 30 layers (SmolLM2): the first 3, the last 4, every third between."""
    assert [i for i in range(30) if use_more_bits(i, 30)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
    assert [i for i in range(24) if use_more_bits(i, 24)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]
    assert [i for i in range(2) if use_more_bits(i, 2)] == [1]


def test_q4_k_m_widens_the_head_and_the_picked_value_and_down_projections():
    p = Quantize(bits=4, mixed="q4_k_m")
    after, changed = apply_pass(p, example("tiny-llama3"))
    assert changed
    bits = bits_by_weight(after)
    wide = sorted(name for name, b in bits.items() if b == 8)
    assert wide == ["layers.1.attn.wv", "layers.1.mlp.w_down", "lm_head"]
    assert all(b == 4 for name, b in bits.items() if name not in wide) and "embed" in bits
    assert after.params["lm_head.qweight"].shape == (256, 2, 32)  # 8 bits: a byte a code, block 32
    assert after.params["layers.0.attn.wv.qweight"].shape == (32, 2, 16)
    assert p.headline[0].startswith("quantize: int4 codes (block 32, ort) for 13 weights, ")
    assert "int8 (block 32) for 3 more" in p.headline[0] and "(mixed=q4_k_m)" in p.headline[0]
    assert p.headline[1].startswith("  int8: @lm_head: the LM head")


def test_a_tied_table_stays_4_bit_unless_the_recipe_says_tied():
    bits = bits_by_weight(apply_pass(Quantize(mixed="q4_k_m"), example("tiny-gemma2-9b"))[0])
    assert bits["embed"] == 4
    bits = bits_by_weight(apply_pass(Quantize(mixed="q4_k_m_tied"), example("tiny-gemma2-9b"))[0])
    assert bits["embed"] == 8


def test_golden_and_idempotent():
    g = example("tiny-llama3")
    after, _ = apply_pass(Quantize(mixed="q4_k_m"), g)
    check_golden("quantize-mixed.after.ir", print_graph(after))
    assert_unchanged(Quantize(mixed="q4_k_m"), after)
    assert_unchanged(Quantize(), after)  # stored codes are never quantized again, at any width


def test_the_pass_test_holds():
    """Verified, outputs near (random tiny weights at 4 bits move them a lot), idempotent."""
    assert assert_pass(Quantize(mixed="q4_k_m"), example("tiny-llama3"), rtol=1.0)


def test_options_are_checked_and_8_bits_do_not_mix():
    with pytest.raises(PassError, match="unknown mixed recipe"):
        Quantize(mixed="q5_k_m")
    assert set(RECIPES) >= {"none", "q4_k_m"}
    bits = bits_by_weight(apply_pass(Quantize(bits=8, mixed="q4_k_m"), example("tiny-llama3"))[0])
    assert set(bits.values()) == {8}
    (p,) = parse_pipeline("quantize{bits=4,mixed=none}")
    assert p.config["mixed"] == "none"


@pytest.mark.parametrize("pipeline", ["lower-mlp,quantize{bits=4,group=32,mixed=q4_k_m,accuracy_level=0}",
                                      "quantize{bits=4,group=16,mixed=q4_k_m_tied,accuracy_level=0}"])
def test_mixed_widths_run_in_onnx_runtime_as_in_the_interpreter(pipeline, tmp_path):
    spec = LLAMA if "lower-mlp" in pipeline else "examples/tiny-gemma2-9b.yaml"
    results = {}
    for target in ("onnx", "onnx-ort"):
        graph, path = compile_quantized(spec, pipeline, target, tmp_path)
        onnx.checker.check_model(path, full_check=True)
        if target == "onnx-ort":
            nodes = [n for n in onnx.load(path).graph.node if n.op_type in ("MatMulNBits", "GatherBlockQuantized")]
            widths = {next(a.i for a in n.attribute if a.name == "bits") for n in nodes}
            assert widths == {4, 8}
        else:
            assert op_types(path)["MatMulNBits"] == 0
        results[target] = greedy(ort_engine(path), graph, PROMPTS, NEW_TOKENS)
    ref = greedy(interpreter_engine(graph), graph, PROMPTS, NEW_TOKENS)
    for ours in results.values():
        assert_close(ours, ref, RTOL)


@pytest.mark.parametrize("method", ["imatrix", "gptq", "awq"])
def test_calibrated_methods_mix_widths(method, text_files):
    """GPTQ runs the weights sharing one Hessian at each width apart (q, k at 4 bits, v at 8
    from one copy each); awq clips an 8-bit weight at 8 bits; imatrix searches at each width."""
    text, tokenizer = text_files
    g = example("tiny-llama3")
    q = Quantize(method=method, calibration=text, tokenizer=tokenizer, calibration_tokens=128, mixed="q4_k_m")
    if method == "awq":  # it scales the linears lower-mlp makes
        g = apply_pass(parse_pipeline("lower-mlp")[0], g)[0]
    after, changed = apply_pass(q, g)
    assert changed
    bits = bits_by_weight(after)
    assert sorted(n for n, b in bits.items() if b == 8) == ["layers.1.attn.wv", "layers.1.mlp.w_down", "lm_head"]
    assert after.params["layers.1.attn.wv.qweight"].array().shape == (32, 2, 32)
    assert q.run(after) is False
