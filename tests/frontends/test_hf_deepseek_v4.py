"""DeepSeek-V4 (``frontends.hf.families_deepseek_v4``) beyond the twins of ``test_hf_models``:
hash routing through a random ``tid2eid`` (transformers' twins keep it zero), a prefill split
in two calls across window boundaries (the window state and the per-slot compressed caches
carried between calls equal one call's results), and the checkpoint reader's integer tables
(read only into an integer param)."""
import numpy as np
import pytest

from frontends import load_spec
from irc import dims
from irc.errors import SpecError
from irc.interpreter import Interpreter, past_inputs
from tests.frontends.test_hf_models import (NEW_TOKENS, SMALL, TOLERANCE, assert_greedy_matches, assert_logits_match,
                                            assert_ort_run_matches, hf_logits, prompts, randomize, relative_error,
                                            save_twin, twin_seed)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BASE = dict(head_dim=16, q_lora_rank=16, partial_rotary_factor=0.5, o_groups=2, o_lora_rank=8, n_routed_experts=4,
            num_experts_per_tok=2, sliding_window=4, hc_mult=2, index_n_heads=16, index_head_dim=8, index_topk=2)
CASES = {  # name: (config class, overrides of SMALL); tid2eid random; YaRN on the compressed layers' RoPE
    "deepseek-v4-sliding-csa-hca-hashed-yarn": ("DeepseekV4Config", dict(
        BASE, num_hidden_layers=3, hc_mult=3, hc_sinkhorn_iters=5, o_groups=4, o_lora_rank=4, sliding_window=5,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
        mlp_layer_types=["hash_moe", "moe", "hash_moe"],
        compress_rates={"compressed_sparse_attention": 3, "heavily_compressed_attention": 4},
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                         "beta_fast": 32.0, "beta_slow": 1.0})),
}
NAME = next(iter(CASES))


def build(name: str, folder):
    class_name, overrides = CASES[name]
    config = getattr(transformers, class_name)(**{**SMALL, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=twin_seed(name), norm_centre=1.0)
    generator = torch.Generator().manual_seed(twin_seed(name))
    with torch.no_grad():
        for key, buffer in model.named_buffers():
            if key.endswith("tid2eid"):
                buffer.copy_(torch.randint(0, config.n_routed_experts, buffer.shape, generator=generator))
    return save_twin(model, folder)


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    return build(NAME, tmp_path_factory.mktemp("deepseek-v4"))


def test_hash_routed_twin_matches_transformers(twin):
    model, folder = twin
    graph = load_spec(folder)
    assert "layers.0.moe.tid2eid" in graph.params and graph.params["layers.0.moe.tid2eid"].dtype.text == "i64"
    assert_logits_match(graph, model)
    assert_greedy_matches(graph, model, prompts()[0][0].tolist(), NEW_TOKENS)


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_onnx_runtime_runs_the_hash_routed_twin(twin, tmp_path, target):
    pytest.importorskip("onnxruntime")
    from backends.onnx import emit

    model, folder = twin
    graph = load_spec(folder)
    ids, mask, _ = prompts()
    with torch.no_grad():
        want = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=NEW_TOKENS,
                              do_sample=False)[:, ids.shape[1]:].numpy()
    path = str(tmp_path / "model.onnx")
    emit.emit_model(graph, path, target=target, genai=False)
    assert_ort_run_matches(path, graph, hf_logits(model, *prompts()), want)


def test_a_prefill_split_in_two_calls_equals_one(twin):
    """7 tokens then 4 (windows of 3 and 4 close in both calls, the sliding window spans the
    cut): the calls' logits are transformers' for the whole prompt."""
    model, folder = twin
    graph = load_spec(folder)
    ids = prompts()[0][:1]
    want = hf_logits(model, ids, np.ones_like(ids), np.arange(ids.shape[1])[None])
    interp, names = Interpreter(graph), {v.name for v in graph.inputs}
    state = {v.name: np.zeros(dims.evaluate_shape(v.shape, {"B": 1, "P": 0}), np.float32) for v in past_inputs(graph)}
    got = []
    for start, stop in ((0, 7), (7, ids.shape[1])):
        feeds = {"input_ids": ids[:, start:stop], "attention_mask": np.ones((1, stop), np.int64),
                 "position_ids": np.arange(start, stop)[None], **state}
        out = interp.run({k: v for k, v in feeds.items() if k in names})
        got.append(out["logits"])
        state = {k: out["present." + k[len("past_key_values."):]] for k in state}
    assert relative_error(np.concatenate(got, axis=1), want) <= TOLERANCE


def test_integer_tables_are_read_only_into_integer_params(twin):
    from frontends.hf.weights import Checkpoint

    _, folder = twin
    graph = load_spec(folder)
    checkpoint = graph.params["layers.0.moe.tid2eid"].data.checkpoint
    assert isinstance(checkpoint, Checkpoint)
    name = "model.layers.0.ffn.gate.tid2eid"
    with pytest.raises(SpecError, match="stored as I64"):
        checkpoint.dtype(name)
    assert checkpoint.dtype(name, integer=True).text == "i64"
    table = graph.params["layers.0.moe.tid2eid"].data.load()
    assert table.dtype == np.int64 and table.shape == (SMALL["vocab_size"], 2) and 0 <= table.min() <= table.max() < 4
