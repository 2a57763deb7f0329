"""``mla-absorb`` models (mla_latent_attention by default, mla_absorbed_attention with
fold_weights: latent cache [B, 1, P, d_c] and RoPE-key cache [B, 1, P, rope]) through both
ONNX targets in ONNX Runtime, held against the reference interpreter (1e-5): a left-padded
prefill and a few greedy decode steps."""
import math
from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

from frontends import load_spec

from backends.onnx.runtime import greedy, interpreter_engine, ort_engine
from test_onnx_models import PROMPTS, assert_matches
from test_onnx_moe_sort import compile_with

ROOT = Path(__file__).resolve().parents[2]
NEW_TOKENS = 5
CASES = {
    "deepseek-v2": ("examples/tiny-deepseek-v2.yaml", "mla-absorb", 23),
    "deepseek-v3": ("examples/tiny-deepseek-v3.yaml", "mla-absorb", 23),
    "deepseek-v3-sorted-opset21": ("examples/tiny-deepseek-v3.yaml", "mla-absorb,moe-sort", 21),
    "deepseek-v2-folded": ("examples/tiny-deepseek-v2.yaml", "mla-absorb{fold_weights=true}", 23),
    "deepseek-v3-folded-opset21": ("examples/tiny-deepseek-v3.yaml", "mla-absorb{fold_weights=true}", 21),
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


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_runtime_absorption_adds_no_weights_to_the_model(target, tmp_path):
    """The initializers hold the checkpoint's elements once (W^UV per head laid out [H, d_c, v],
    linear weights [in, out]), none of them shaped like a folded query weight
    [H*(d_c+rope), q_lora] (either way round), and the per-head products are batched MatMuls
    with no loop over heads."""
    text = (ROOT / "examples/tiny-deepseek-v2.yaml").read_text()
    spec = tmp_path / "wide-latent.yaml"  # d_c 40 != nope 16: a folded query weight would show
    spec.write_text(text.replace("kv_lora_rank: 16", "kv_lora_rank: 40"))
    spec = str(spec)
    checkpoint = sum(p.numel for p in load_spec(spec).params.values())
    graph, path = compile_with(spec, "mla-absorb", target, 23, tmp_path)
    model = onnx.load(path)
    [node] = [n for n in graph.nodes if n.op == "mla_latent_attention"][:1]
    a = node.attrs
    folded = (a["heads"] * (a["kv_lora_rank"] + a["qk_rope_head_dim"]), a["q_lora_rank"])
    weights = [numpy_helper.to_array(t) for t in model.graph.initializer if math.prod(t.dims) > 64]
    assert not any(w.shape in (folded, folded[::-1]) for w in weights)
    assert sum(w.size for w in weights) <= checkpoint  # small constants aside, nothing new
    names = {t.name for t in model.graph.initializer}
    assert "layers.0.attn.kv_b.uk" in names and "layers.0.attn.kv_b.uv.T" in names
    ops = [n.op_type for n in model.graph.node]
    assert "Loop" not in ops and "Scan" not in ops
    assert any(n.op_type == "MatMul" and "layers.0.attn.kv_b.uk" in n.input for n in model.graph.node)


NOPE_MLA = '''"""A tiny MLA model without RoPE (Kimi-Linear's full-attention layers)."""
from frontends.dsl import Model


def build():
    m = Model("tiny-nope-mla", vocab=256, d_model=64)
    x = m.embed(m.input_ids())
    for layer in m.layers(2):
        q_lora_rank = 32 if layer.index else None
        x = x + layer.mla_attention(layer.rms_norm(x, name="attn_norm"), heads=4, q_lora_rank=q_lora_rank,
                                    kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                                    rope=False)
        x = x + layer.swiglu(layer.rms_norm(x, name="mlp_norm"), d_ff=128)
    m.logits(m.rms_norm(x, name="norm"))
    return m.graph
'''


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("pipeline", ["dce", "mla-absorb", "mla-absorb{fold_weights=true}", "mla-absorb{cache=halves}"])
def test_mla_without_rope_matches_the_interpreter(pipeline, target, tmp_path):
    """NoPE MLA (``rope=False``), un-absorbed and in both absorbed forms: no position_ids
    input, no rotation in the model, the same tokens and logits as the interpreter."""
    spec = tmp_path / "nope_mla.py"
    spec.write_text(NOPE_MLA)
    graph, path = compile_with(str(spec), pipeline, target, 23, tmp_path)
    model = onnx.load(path)
    assert "position_ids" not in {v.name for v in model.graph.input}
    assert not any(n.op_type == "RotaryEmbedding" for n in model.graph.node)
    ref = greedy(interpreter_engine(graph), graph, PROMPTS, NEW_TOKENS)
    assert_matches(greedy(ort_engine(path), graph, PROMPTS, NEW_TOKENS), ref)
