"""Kolibri-1.1 (``frontends.hf.families_kolibri``) against transformers 5.25: tiny random twins
whose selection budget (``index_topk`` + local + sink tokens) and ``index_pool_size`` are below
the prompt lengths (11 and 6 tokens; both selections change transformers' logits: checked),
rows of the twin harness (test_hf_twins.py: transformers' logits on a left-padded batch and on
each row alone, its 16-token greedy continuation, the pool and the selection then working over
up to 27 keys, through the reference interpreter, and through ONNX Runtime on both ONNX targets
with the batch decoded left-padded); holes in the mask; the NumPy emitter and the Triton
interpreter agree with the reference interpreter; onnx-npu refuses the NVFP4 rounding by name.
transformers breaks ties of the routing scores towards the lower index (its ``top_k_mask``
keeps the k-th value's ties lowest index first, not in torch.topk's order), as ``topk_mask``
does, so exact ties (relu zeros) need no check here. Layers reading another layer's keys and
values have no k/v weights and no cache; holes in the attention mask keep the later keys'
positions; the default layer layout is derived as Kolibri1_1Config derives it; the settings
transformers rejects are refused at their key."""
import json

import numpy as np
import pytest

from frontends import load_spec
from irc.errors import SpecError
from tests.frontends.test_hf_models import SMALL, TOLERANCE, hf_logits, irc_logits, prompts, relative_error
from tests.frontends.twins import build as build_twin, built, check_numpy_and_triton, family

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
           pad_token_id=0, bos_token_id=1, eos_token_id=2, head_dim=16, sliding_window=4)
CASES = {  # name: (config class, overrides of SMALL)
    # layer 2 reads layer 1's keys and values and rescores layer 1's pool (3 blocks of 2); layer 3 a new indexer
    "kolibri1-1-shared-kv-pool-blocks2": ("Kolibri1_1Config", dict(
        MOE, num_hidden_layers=4, mlp_only_layers=[0], mlp_only_intermediate_size=40,
        layer_types=["sliding_attention"] + ["indexed_attention"] * 3, index_layers=[1, 3],
        kv_source_layers=[0, 1, 1, 3],
        index_topk=2, index_pool_size=6, index_compression=2, index_num_heads=2, index_num_local_tokens=2,
        index_num_sink_tokens=1)),
    # MQA, every layer MoE; layer 2 reads layer 0's keys and values and pool (one block of 4) across a sliding layer
    "kolibri1-1-mqa-pool-block4-across-sliding": ("Kolibri1_1Config", dict(
        MOE, num_hidden_layers=3, num_key_value_heads=1, mlp_only_layers=[],
        layer_types=["indexed_attention", "sliding_attention", "indexed_attention"], index_layers=[0],
        kv_source_layers=[0, 1, 0], index_topk=3, index_pool_size=4, index_compression=4, index_num_heads=3,
        index_num_local_tokens=1, index_num_sink_tokens=2)),
}
EVERY_KEY = dict(index_topk=64, index_pool_size=64)  # the same weights, no selection
NO_POOL = dict(index_pool_size=64)  # the same weights, every visible key in the pool


TWINS = family(None, SMALL, CASES, context=None)


def build(name: str, folder, **changes):
    return build_twin(TWINS[name], folder, **changes)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    return built(TWINS, tmp_path_factory)


@pytest.mark.parametrize("changes", [EVERY_KEY, NO_POOL], ids=["selection", "pool"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_selection_and_the_pool_change_transformers_logits(twins, tmp_path, name, changes):
    model, _ = twins(name)
    other, _ = build(name, tmp_path, **changes)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    sparse, wider = hf_logits(model, ids, mask, positions), hf_logits(other, ids, mask, positions)
    assert relative_error(sparse[real], wider[real]) > 100 * TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_masked_keys_between_keep_their_positions(twins, name):
    """Holes in the attention mask (keys 3 and 6 of the long row): positions still count from
    the row's first visible key, the holes count as zeros in their block's mean."""
    model, folder = twins(name)
    ids, mask, _ = prompts()
    mask[0, 3] = mask[0, 6] = 0
    positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
    got, want = irc_logits(load_spec(folder), ids, mask, positions), hf_logits(model, ids, mask, positions)
    real = mask.astype(bool)
    assert relative_error(got[real], want[real]) <= TOLERANCE


def test_triton_and_numpy_targets_match_the_reference(twins, tmp_path):
    name = "kolibri1-1-shared-kv-pool-blocks2"
    check_numpy_and_triton(twins(name)[1], tmp_path, name)


def test_onnx_npu_refuses_the_nvfp4_rounding_by_name(twins, tmp_path, capsys):
    from irc_cli.commands import main

    folder = twins("kolibri1-1-mqa-pool-block4-across-sliding")[1]
    assert main(["compile", str(folder), "--target", "onnx-npu", "-o", str(tmp_path / "npu"), "--context", "32",
                 "--chunk", "4", "--quiet", "--precision", "f32"]) != 0
    assert "'nvfp4_fake_quantize' has no NPU lowering for target onnx-npu" in capsys.readouterr().err


def test_layers_reading_shared_keys_have_no_weights_or_cache(twins):
    graph = load_spec(twins("kolibri1-1-shared-kv-pool-blocks2")[1])
    assert [v.name for v in graph.inputs if v.name.endswith(".key")] == [
        f"past_key_values.{i}.key" for i in (0, 1, 3)]
    assert "layers.2.attn.wq" in graph.params and "layers.2.attn.wk" not in graph.params
    assert graph.meta["sparse_index"] == {"index_layers": (1, 3), "topk": 2, "pool_size": 6, "compression": 2,
                                          "num_heads": 2, "num_local_tokens": 2, "num_sink_tokens": 1}


BASE = {"model_type": "kolibri1_1", "vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16, "mlp_only_intermediate_size": 24,
        "index_num_heads": 2}


def test_the_default_layout_is_transformers(tmp_path):
    """30 layers: every 5th indexed; indexers the 1st, 3rd, 4th and 6th of them; the 2nd and
    3rd read the 1st's keys and values (Kolibri1_1Config.__post_init__)."""
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "num_hidden_layers": 30}))
    graph = load_spec(tmp_path)
    config = transformers.Kolibri1_1Config(**{k: v for k, v in BASE.items() if k != "model_type"},
                                           num_hidden_layers=30)
    cached = {int(v.name.split(".")[1]) for v in graph.inputs if v.name.endswith(".key")}
    assert cached == {i for i, mode in enumerate(config.kv_sharing_modes) if mode != "reuse"}
    assert graph.meta["sparse_index"]["index_layers"] == tuple(config.index_layers) == (4, 14, 19, 29)
    assert "layers.1.mlp.w_gate" in graph.params and "layers.2.moe.router" in graph.params


@pytest.mark.parametrize("changes, key, fragment", [
    ({"hidden_act": "gelu"}, "hidden_act", "SwiGLU"),
    ({"num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"]}, "layer_types", "each"),
    ({"num_hidden_layers": 10, "index_layers": [9]}, "index_layers", "the first of them"),
    ({"num_hidden_layers": 10, "kv_source_layers": [0, 1, 2, 3, 4, 5, 6, 7, 8, 3]}, "kv_source_layers",
     "earlier producing layer of its type"),
    ({"num_hidden_layers": 5, "head_dim": 8}, "head_dim", "blocks of 16"),
    ({"num_hidden_layers": 5, "index_num_heads": 3}, "index_num_heads", "query heads"),
    ({"num_hidden_layers": 5, "index_pool_size": 10, "index_compression": 4}, "index_pool_size", "multiple"),
    ({"num_hidden_layers": 60}, "kv_source_layers", "default covers 10"),
])
def test_refusals_name_the_key(tmp_path, changes, key, fragment):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, **changes}))
    with pytest.raises(SpecError) as err:
        load_spec(tmp_path)
    assert str(err.value).startswith(f"{key}:") or f" {key}:" in str(err.value), str(err.value)
    assert fragment in str(err.value) and "config.json" in str(err.value)
