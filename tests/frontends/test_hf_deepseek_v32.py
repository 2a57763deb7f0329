"""DeepSeek-V3.2 (``frontends.hf.families_deepseek_v32``) against transformers 5.25: tiny random
twins whose ``index_topk`` is below the prompt length (so the lightning indexer's selection
changes the logits: checked), rows of the twin harness (test_hf_twins.py: transformers' logits
on a left-padded batch and on each row alone, its 16-token greedy continuation through the
reference interpreter, and through ONNX Runtime on both ONNX targets with the batch decoded
left-padded), the indexer's key cache fed back as a graph input; the Triton interpreter and the
NumPy emitter agree with the reference interpreter; onnx-npu's host loop gives transformers'
greedy tokens; the full-size example (DeepSeek-V3.2-Exp's config) counts what transformers
builds on the meta device; and the settings irc does not implement are refused at their key."""
import json
from pathlib import Path

import numpy as np
import pytest

from frontends import load_spec
from irc.errors import SpecError
from tests.frontends.test_hf_models import (MLA, NEW_TOKENS, SMALL, TOLERANCE, YARN, hf_greedy_tokens, hf_logits,
                                            prompts, relative_error)
from tests.frontends.twins import build as build_twin, built, check_numpy_and_triton, family

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf" / "deepseek-v3.2"
V32 = dict(MLA, q_lora_rank=16, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
           pad_token_id=0, bos_token_id=1, eos_token_id=2)
CASES = {  # name: overrides of SMALL (prompts are 11 and 6 tokens long)
    "deepseek-v32-topk4": dict(V32, index_topk=4, index_head_dim=16, index_n_heads=16),
    "deepseek-v32-yarn-topk3-partial": dict(V32, index_topk=3, index_head_dim=6, index_n_heads=16,
                                            rope_parameters=dict(YARN, mscale=1.0, mscale_all_dim=1.0),
                                            num_hidden_layers=3),  # YaRN as DeepSeek-V3.2-Exp writes it
}


TWINS = family("DeepseekV32Config", SMALL, CASES, context=None)


def build(name: str, folder, **changes):
    return build_twin(TWINS[name], folder, **changes)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    return built(TWINS, tmp_path_factory)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_selection_changes_transformers_logits(twins, tmp_path, name):
    model, _ = twins(name)
    dense, _ = build(name, tmp_path, index_topk=64)  # the same weights, every visible key kept
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    sparse, full = hf_logits(model, ids, mask, positions), hf_logits(dense, ids, mask, positions)
    assert relative_error(sparse[real], full[real]) > 100 * TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_visible_keys_tie_at_the_kth_place(twins, monkeypatch, name):
    """torch.topk leaves the order of equal scores to its CPU sort (a partial sort, not
    stable), irc keeps the lower key index; indexer scores tie exactly where every head's
    ReLU is zero for two keys, so the twins (16 index heads) are checked free of such ties
    at the boundary of the selection, where the two would choose differently."""
    model, _ = twins(name)
    seen, topk = [], torch.Tensor.topk

    def recording(self, *args, **kwargs):
        seen.append(self.detach().clone())
        return topk(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "topk", recording)
    hf_logits(model, *prompts())
    k = model.config.index_topk
    rows = [np.sort(row[row > -1e30])[::-1] for scores in seen if tuple(scores.shape) == (2, 11, 11)
            for row in scores.reshape(-1, 11).numpy()]  # the indexers' (the routers' group scores are 3-D too)
    assert len(rows) == 2 * 11 * model.config.num_hidden_layers
    assert all(row[k - 1] > row[k] for row in rows if len(row) > k)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_indexer_key_cache_is_a_graph_input(twins, name):
    _, folder = twins(name)
    graph = load_spec(folder)
    assert [v.name for v in graph.inputs if v.name.endswith("index_key")][:1] == ["past_key_values.0.index_key"]


def test_triton_and_numpy_targets_match_the_reference(twins, tmp_path):
    name = "deepseek-v32-topk4"
    check_numpy_and_triton(twins(name)[1], tmp_path, name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_npu_host_loop_gives_transformers_tokens(twins, tmp_path, name):
    """onnx-npu (backends/onnx_npu/sparse.py: the indexer's key cache and the top-k mask over
    the static slots), f32, through the host loop: transformers' 16 greedy tokens of the
    unpadded 11-token prompt (tests/backends/test_onnx_npu_sparse.py holds the logits)."""
    from backends.onnx_npu.host import generate as npu_generate
    from irc_cli.commands import main

    model, folder = twins(name)
    assert main(["compile", str(folder), "--target", "onnx-npu", "-o", str(tmp_path / "npu"), "--context", "32",
                 "--chunk", "4", "--quiet", "--precision", "f32"]) == 0
    prompt = prompts()[0][0].tolist()
    assert npu_generate(str(tmp_path / "npu"), prompt, NEW_TOKENS) == hf_greedy_tokens(model, prompt)


def test_the_full_size_example_counts_what_transformers_builds():
    """DeepSeek-V3.2-Exp: transformers' parameters plus its persistent buffers (the 58 MoE
    routers' e_score_correction_bias [256], checkpoint tensors irc reads as params), 671.9B;
    per token the per-head caches (128 x (192 + 128)) and the indexer's key (128), bf16."""
    from irc.analysis import analyze

    config = transformers.AutoConfig.from_pretrained(EXAMPLE)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    want = sum(t.numel() for t in model.state_dict().values())
    assert want - params == 58 * 256
    summary = analyze(load_spec(EXAMPLE))
    assert summary["params_total"] == want and round(want / 1e9, 1) == 671.9
    assert summary["kv_cache_bytes_per_token"] == 61 * (128 * (192 + 128) + 128) * 2


BASE = {"model_type": "deepseek_v32", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 16,
        "kv_lora_rank": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_group": 1, "topk_group": 1,
        "first_k_dense_replace": 1, "index_topk": 4, "index_head_dim": 8, "index_n_heads": 2}


@pytest.mark.parametrize("changes, key, fragment", [
    ({"q_lora_rank": None}, "q_lora_rank", "query latent"),
    ({"mlp_layer_types": ["sparse", "sparse"]}, "mlp_layer_types", "first_k_dense_replace"),
    ({"layer_types": ["full_attention", "indexed_attention"]}, "layer_types", "indexed_attention"),
    ({"scoring_func": "softmax"}, "scoring_func", "fixes it"),
    ({"index_head_dim": 2}, "index_head_dim", "narrower than qk_rope_head_dim"),
])
def test_refusals_name_the_key(tmp_path, changes, key, fragment):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **changes}))
    with pytest.raises(SpecError) as err:
        load_spec(tmp_path)
    assert str(err.value).startswith(f"{key}:") or f" {key}:" in str(err.value), str(err.value)
    assert fragment in str(err.value) and "config.json" in str(err.value)


def test_the_base_config_builds_with_an_index_key_cache_per_layer(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    graph = load_spec(tmp_path)
    names = [v.name for v in graph.outputs]
    assert [n for n in names if n.endswith("index_key")] == ["present.0.index_key", "present.1.index_key"]
    assert graph.meta["sparse_index"] == {"heads": 2, "head_dim": 8, "topk": 4}
