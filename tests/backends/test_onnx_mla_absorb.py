"""``mla-absorb`` models (mla_absorbed_attention: latent cache [B, 1, P, d_c] and RoPE-key
cache [B, 1, P, rope]) through both ONNX targets in ONNX Runtime, held against the
reference interpreter (1e-5): a left-padded prefill and a few greedy decode steps."""
import onnx
import pytest

from backends.onnx.runtime import greedy, interpreter_engine, ort_engine
from test_onnx_models import PROMPTS, assert_matches
from test_onnx_moe_sort import compile_with

NEW_TOKENS = 5
CASES = {
    "deepseek-v2": ("examples/tiny-deepseek-v2.yaml", "mla-absorb", 23),
    "deepseek-v3": ("examples/tiny-deepseek-v3.yaml", "mla-absorb", 23),
    "deepseek-v3-sorted-opset21": ("examples/tiny-deepseek-v3.yaml", "mla-absorb,moe-sort", 21),
}


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("case", CASES)
def test_absorbed_mla_matches_the_interpreter(case, target, tmp_path):
    spec, pipeline, opset = CASES[case]
    graph, path = compile_with(spec, pipeline, target, opset, tmp_path)
    model = onnx.load(path)
    past = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
    latent, rope = past["past_key_values.0.key"], past["past_key_values.0.value"]
    assert latent[1] == rope[1] == 1 and latent[3] > rope[3]
    assert not (tmp_path / "genai_config.json").exists()  # caches of two widths: genai cannot allocate them
    ref = greedy(interpreter_engine(graph), graph, PROMPTS, NEW_TOKENS)
    assert_matches(greedy(ort_engine(path), graph, PROMPTS, NEW_TOKENS), ref)
