"""int4 (``dequant_linear``) projections on ``onnx-ort`` in the form onnxruntime-genai's builder
writes: q, k and v as one MatMulNBits over their stacked codes that GroupQueryAttention reads
as its packed query, RoPE inside it (``backends.onnx.gqa_fuse``'s ``pack-qkv``), with no Split.
Each form is held against the reference interpreter on a left-padded batch of random prompts
(prefill, then greedy decode steps through the caches), and ``--unfuse pack-qkv`` gives back
the Split form (``backends.onnx.quant_pack``), which computes the same."""
from collections import Counter

import numpy as np
import onnx
import pytest

import passes  # noqa: F401  (registers the passes)
from backends.onnx.emit import emit_model
from backends.onnx.quant import matmul_nbits_fits
from backends.onnx.quant_pack import packable
from backends.onnx.runtime import greedy, interpreter_engine, ort_engine
from backends.onnx.targets import TARGETS
from frontends import load_spec
from irc.check import relative_error
from irc.passmanager import PassManager, parse_pipeline
from irc.weights import seed_absent
from tests.backends.test_onnx_models import real_rows

LLAMA = "examples/tiny-llama3.yaml"        # GQA, Llama-3 RoPE scaling, no biases
QWEN2 = "examples/tiny-qwen2-7b.yaml"      # q, k and v with biases
INT4 = "lower-mlp,quantize{bits=4,group=32,accuracy_level=0%s}"
CASES = {"llama-sym": (LLAMA, ""), "llama-asym": (LLAMA, ",symmetric=false"), "qwen2-bias": (QWEN2, ""),
         "llama-rtn-embeddings": (LLAMA, ",embeddings=true,method=rtn")}
NEW_TOKENS = 6
RTOL = 1e-4  # MatMulNBits sums each block in another order than NumPy (as tests/backends/test_onnx_quant)


def random_prompts(seed: int) -> list:
    """Two prompts of uneven length (the shorter is left-padded), random token ids."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 256, size=n).tolist() for n in (4, 11)]


def compiled(spec: str, options: str, tmp_path, edit=None, **emit_options):
    """(graph, model path) of the int4 pipeline on onnx-ort; ``edit(graph)`` runs after the passes."""
    graph = load_spec(spec)
    seed_absent(graph, 0)
    PassManager(parse_pipeline(f"{INT4 % options},{TARGETS['onnx-ort'].pipeline(23)}")).run(graph)
    if edit is not None:
        edit(graph)
    path = tmp_path / f"model-{len(list(tmp_path.iterdir()))}.onnx"
    emit_model(graph, str(path), target="onnx-ort", opset=23, context=64, **emit_options)
    return graph, str(path)


def assert_matches_interpreter(graph, path: str, seed: int = 0) -> None:
    """Prefill logits and caches on real tokens, the greedy tokens, every decode step's logits."""
    prompts = random_prompts(seed)
    ours = greedy(ort_engine(path), graph, prompts, NEW_TOKENS)
    ref = greedy(interpreter_engine(graph), graph, prompts, NEW_TOKENS)
    mask = ref["feeds"]["attention_mask"]
    assert 0 in mask  # the shorter prompt is padded
    for name, expected in ref["prefill"].items():
        got = ours["prefill"][name]
        if name.startswith("present."):  # [B, K, S, D]: real positions only
            got, expected = np.moveaxis(got, 2, 1), np.moveaxis(expected, 2, 1)
        error = relative_error(real_rows(got, mask), real_rows(expected, mask))
        assert error <= RTOL, f"prefill {name} off by {error:.3g}"
    np.testing.assert_array_equal(ours["tokens"], ref["tokens"])
    for step, (got, expected) in enumerate(zip(ours["steps"], ref["steps"]), start=1):
        assert relative_error(got, expected) <= RTOL, f"decode step {step}"


def producers(model) -> dict:
    return {o: n for n in model.graph.node for o in n.output}


def attributes(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("case", CASES)
def test_qkv_codes_feed_group_query_attention_packed(case, tmp_path):
    spec, options = CASES[case]
    graph, path = compiled(spec, options, tmp_path)
    model = onnx.load(path)
    made_by = producers(model)
    attention = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(attention) == 2
    for node in attention:
        query = made_by[node.input[0]]
        assert query.op_type == "MatMulNBits" and list(node.input[1:3]) == ["", ""]
        assert attributes(query)["N"] == (4 + 2 * 2) * 16 and attributes(node)["do_rotary"] == 1
    counts = Counter(n.op_type for n in model.graph.node)
    assert counts["Split"] == 2 and counts["RotaryEmbedding"] == 0  # only gate|up are split
    stored = {i.name: list(i.dims) for i in model.graph.initializer}
    assert stored["layers.0.attn.wq+wk+wv.qweight"] == [64 + 32 + 32, 2, 16]
    assert not any(name.startswith(("layers.0.attn.wk", "layers.0.attn.wv")) for name in stored)
    if case == "qwen2-bias":
        assert stored["layers.0.attn.wq+wk+wv.bias"] == [128]
    if case == "llama-asym":
        assert stored["layers.0.attn.wq+wk+wv.zero_points"] == [128, 1]
    assert_matches_interpreter(graph, path, seed=len(case))


@pytest.mark.parametrize("spec", [LLAMA, QWEN2])
def test_unfuse_pack_qkv_gives_the_split_form_back(spec, tmp_path):
    graph, path = compiled(spec, "", tmp_path, unfused=frozenset({"pack-qkv"}))
    model = onnx.load(path)
    made_by = producers(model)
    for node in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
        assert all(made_by[name].op_type == "Split" for name in node.input[:3])
    assert Counter(n.op_type for n in model.graph.node)["Split"] == 2 * 2
    assert_matches_interpreter(graph, path, seed=7)


def test_projections_that_disagree_are_not_packed(tmp_path):
    """k at another accuracy level (1, exact as 0 on CPU) cannot share q's MatMulNBits: GQA
    reads q, k and v apart, and the model still computes what the interpreter does."""
    def k_at_level_one(graph):
        for node in graph.nodes:
            if node.op == "dequant_linear" and node.outputs[0].name.endswith(".k"):
                node.attrs["accuracy_level"] = 1

    graph, path = compiled(LLAMA, "", tmp_path, edit=k_at_level_one)
    model = onnx.load(path)
    made_by = producers(model)
    for node in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
        assert all(name for name in node.input[:3]) and made_by[node.input[1]].op_type == "MatMulNBits"
    assert_matches_interpreter(graph, path, seed=3)


def test_packable_needs_one_signature():
    graph = load_spec(LLAMA)
    seed_absent(graph, 0)
    PassManager(parse_pipeline(INT4 % "")).run(graph)
    q, k, v = [n for n in graph.nodes if n.op == "dequant_linear"][:3]
    assert packable([q, k, v], matmul_nbits_fits)
    k.attrs["accuracy_level"] = 4
    assert not packable([q, k, v], matmul_nbits_fits)
