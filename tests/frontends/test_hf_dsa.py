"""DeepSeek-V3.2's sparse-attention kin (``frontends.hf.families_dsa``) against transformers
5.25, held as DeepSeek-V3.2's twins are (``test_hf_deepseek_v32``): tiny random twins whose
``index_topk`` is below the prompt length (the selection changes transformers' logits:
checked, and no two visible keys tie at the boundary of a selection), rows of the twin
harness (test_hf_twins.py: transformers' logits on a left-padded batch and on each row alone
and its 16-token greedy continuation through the reference interpreter, and through ONNX
Runtime on both ONNX targets, the batch decoded left-padded, the indexers' key caches fed
back), the Triton interpreter and the NumPy
emitter agreeing with the reference interpreter on dots3's and MiniMax-M3's twins, onnx-npu
refusing MiniMax-M3's block selection by name; GLM-5's "shared" layers have no
indexer and no index-key cache; dots3's full-attention layers (``use_dsa: false``) match too;
the settings irc does not implement are refused at their key."""
import json

import numpy as np
import pytest

from frontends import load_spec
from irc.errors import SpecError
from tests.frontends.test_hf_models import (MLA, NEW_TOKENS, SMALL, TOLERANCE, hf_logits, irc_logits, prompts,
                                            relative_error)
from tests.frontends.twins import GREEDY, LOGITS, ONNX, build as build_twin, built, check_numpy_and_triton, family

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DSA = dict(MLA, q_lora_rank=16, n_routed_experts=8, num_experts_per_tok=2, pad_token_id=0, bos_token_id=1,
           eos_token_id=2, index_head_dim=16, index_n_heads=16)
CASES = {  # name: (config class, overrides of SMALL); prompts are 11 and 6 tokens long
    "glm-moe-dsa-shared-topk4": ("GlmMoeDsaConfig", dict(DSA, n_group=2, topk_group=1, index_topk=4,
                                                         num_hidden_layers=3,
                                                         indexer_types=["full", "shared", "full"])),
    "axk2-gates-topk3": ("AXK2Config", dict(DSA, index_topk=3, index_head_dim=6, num_hidden_layers=3, gated_norm_rank=8,
                                            mlp_layer_types=["dense", "sparse", "dense"])),
    "dots3-note-swa-topk4": ("Dots3NoteTextConfig", dict(
        DSA, index_topk=4, head_dim=12, num_hidden_layers=4, n_group=2, topk_group=1, rope_theta=1000.0,
        shared_experts_intermediate_size=20, sliding_window=3, swa_num_attention_heads=2, swa_num_key_value_heads=2,
        swa_q_lora_rank=8, swa_kv_lora_rank=10, swa_head_dim=10, swa_qk_nope_head_dim=6, swa_v_head_dim=4,
        swa_rope_theta=500.0)),  # layers: indexed, indexed, sliding, sliding (the sliding ones of their own sizes)
    # blocks of 5: the short prompt's 5 pads fill block 0 alone (padding keys are all equal: a block mixing
    # padding and tokens would tie with it, and torch.topk orders ties freely)
    "minimax-m3-blocks5-top2": ("MiniMaxM3VLTextConfig", dict(
        num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, intermediate_size=16,
        dense_intermediate_size=24, shared_intermediate_size=12, index_n_heads=2, index_head_dim=12,
        index_block_size=5, index_topk_blocks=2, index_local_blocks=1, num_hidden_layers=3, swiglu_limit=1.5,
        layer_types=["minimax_m3_sparse", "full_attention", "minimax_m3_sparse"], pad_token_id=0, bos_token_id=1,
        eos_token_id=2, mlp_layer_types=["dense", "sparse", "sparse"],
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5})),
}
EVERY_KEY = {"minimax-m3-blocks5-top2": dict(index_topk_blocks=64)}  # the same weights, no selection
M3 = "minimax-m3-blocks5-top2"  # transformers' own M3 differs between a left-padded row and the row alone


# M3: 1 + w norms; only the padded batch (see M3 above), and its batch decoded as the runtime feeds it
TWINS = family(None, SMALL, CASES, context=None, rows={M3: dict(
    norm_centre=0.0, checks=(LOGITS, GREEDY, ONNX), batch_tokens=lambda model: padded_greedy(model, *prompts()))})


def build(name: str, folder, **changes):
    return build_twin(TWINS[name], folder, **changes)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    return built(TWINS, tmp_path_factory)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_selection_changes_transformers_logits(twins, tmp_path, name):
    model, _ = twins(name)
    dense, _ = build(name, tmp_path, **EVERY_KEY.get(name, dict(index_topk=64)))  # every visible key kept
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    sparse, full = hf_logits(model, ids, mask, positions), hf_logits(dense, ids, mask, positions)
    assert relative_error(sparse[real], full[real]) > 100 * TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_visible_keys_tie_at_the_kth_place(twins, monkeypatch, name):
    """torch.topk's order of equal scores is its CPU sort's, irc keeps the lower key index:
    the twins' indexer scores are checked free of ties at the boundary of each selection."""
    model, _ = twins(name)
    seen, topk = [], torch.Tensor.topk

    def recording(self, *args, **kwargs):
        seen.append(self.detach().clone())
        return topk(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "topk", recording)
    hf_logits(model, *prompts())
    config = model.config
    k, width, heads = getattr(config, "index_topk", None), 11, 1
    if name == M3:  # M3 ranks blocks, per indexer head
        k, width, heads = config.index_topk_blocks, -(-11 // config.index_block_size), config.index_n_heads
    shape = (2, 11, width) if heads == 1 else (2, heads, 11, width)
    rows = [np.sort(row[row > -1e30])[::-1] for scores in seen if tuple(scores.shape) == shape
            for row in scores.reshape(-1, width).numpy()]  # the indexers' (the routers' group scores are 3-D too)
    indexers = sum(getattr(layer.self_attn, "indexer", None) is not None for layer in model.model.layers)
    assert len(rows) == 2 * heads * 11 * indexers
    assert all(row[k - 1] > row[k] for row in rows if len(row) > k)


def padded_greedy(model, ids, mask, positions) -> np.ndarray:
    """transformers' greedy decode of the left-padded batch with the runtime's positions (0 on
    the padding, as ``backends.onnx.runtime`` feeds them): generate puts 1 there, and M3's
    selection reads the padding rows' positions (their outputs reach the real rows that keep
    no key), so generate's own tokens answer other inputs."""
    from transformers import DynamicCache

    cache, tokens = DynamicCache(config=model.config), []
    step, mask, positions = torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(positions)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=step, attention_mask=mask, position_ids=positions, cache=cache,
                           use_cache=True).logits
            step = logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(step)
            mask = torch.cat([mask, torch.ones_like(step)], dim=1)
            positions = positions[:, -1:] + 1
    return torch.cat(tokens, dim=1).numpy()


@pytest.mark.parametrize("name", ["dots3-note-swa-topk4", M3])
def test_triton_and_numpy_targets_match_the_reference(twins, tmp_path, name):
    check_numpy_and_triton(twins(name)[1], tmp_path, name)


def test_onnx_npu_refuses_the_block_selection_by_name(twins, tmp_path, capsys):
    from irc_cli.commands import main

    folder = twins(M3)[1]
    assert main(["compile", str(folder), "--target", "onnx-npu", "-o", str(tmp_path / "npu"), "--context", "32",
                 "--chunk", "4", "--quiet", "--precision", "f32"]) != 0
    assert "'block_topk_mask' has no NPU lowering for target onnx-npu" in capsys.readouterr().err


def test_shared_layers_have_no_indexer_cache(twins):
    graph = load_spec(twins("glm-moe-dsa-shared-topk4")[1])
    assert [v.name for v in graph.inputs if v.name.endswith("index_key")] == [
        "past_key_values.0.index_key", "past_key_values.2.index_key"]
    assert graph.meta["sparse_index"] == {"heads": 16, "head_dim": 16, "topk": 4, "convention": "interleaved"}


def test_dots3_without_dsa_matches_with_full_attention_layers(tmp_path):
    """``use_dsa: false``: the indexed layers become full MLA layers (no indexer, no index-key
    cache), each through the attention op; transformers' logits on the left-padded batch."""
    model, folder = build("dots3-note-swa-topk4", tmp_path, use_dsa=False)
    assert model.config.layer_types == ["full_attention", "full_attention", "sliding_attention", "sliding_attention"]
    graph = load_spec(folder)
    assert not [v.name for v in graph.inputs if v.name.endswith("index_key")]
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    got, want = irc_logits(graph, ids, mask, positions), hf_logits(model, ids, mask, positions)
    assert relative_error(got[real], want[real]) <= TOLERANCE


BASE = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 12,
        "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 16, "index_topk": 4, "index_head_dim": 8,
        "index_n_heads": 2}
GLM = {**BASE, "model_type": "glm_moe_dsa", "first_k_dense_replace": 1}
AXK2 = {**BASE, "model_type": "axk2", "gated_norm_rank": 4}
M3_BASE = {"model_type": "minimax_m3_vl_text", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 16,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
           "num_local_experts": 4, "num_experts_per_tok": 2, "index_n_heads": 2, "index_head_dim": 8,
           "index_block_size": 4, "index_topk_blocks": 2}
DOTS3 = {**BASE, "model_type": "dots3_note_text", "head_dim": 12, "num_hidden_layers": 3, "sliding_window": 4,
         "per_layer_config": {"2": {"num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 10,
                                    "qk_nope_head_dim": 6}}}


@pytest.mark.parametrize("config, want", [
    ({**GLM, "num_hidden_layers": 4, "index_topk_freq": 2}, ["full", "full", "shared", "full"]),
    ({**GLM, "num_hidden_layers": 3, "index_topk_pattern": "FSS"}, ["full", "shared", "shared"]),
])
def test_glm_derives_the_indexer_types_as_its_config_class_does(tmp_path, config, want):
    (tmp_path / "config.json").write_text(json.dumps(config))
    graph = load_spec(tmp_path)
    assert [f"past_key_values.{i}.index_key" in {v.name for v in graph.inputs} for i in range(len(want))] == \
        [t == "full" for t in want]
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    assert transformers.GlmMoeDsaConfig(**kwargs).indexer_types == want


def test_dots3_reads_its_layer_types_and_sizes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(DOTS3))
    graph = load_spec(tmp_path)
    names = {v.name: v.shape for v in graph.inputs}
    assert [f"past_key_values.{i}.index_key" in names for i in range(3)] == [True, True, False]
    assert names["past_key_values.2.key"][1] == 2 and names["past_key_values.0.key"][1] == 4
    assert "layers.0.mlp.w_gate" in graph.params and "layers.1.moe.router" in graph.params


def test_minimax_m3_reads_the_legacy_sparse_attention_config(tmp_path):
    legacy = {"sparse_attention_freq": [1, 0], "sparse_block_size": 3, "sparse_topk_blocks": 4, "sparse_local_block": 2}
    (tmp_path / "config.json").write_text(json.dumps({**M3_BASE, "sparse_attention_config": legacy,
                                                      "moe_layer_freq": [0, 1]}))
    graph = load_spec(tmp_path)
    assert graph.meta["sparse_index"] == {"heads": 2, "head_dim": 8, "block": 3, "topk": 4, "local": 2}
    assert [v.name for v in graph.inputs if v.name.endswith("index_key")] == ["past_key_values.0.index_key"]
    assert "layers.0.mlp.w_gate_up" in graph.params and "layers.1.moe.router" in graph.params


def test_axk2_derives_its_mlp_layers_from_the_legacy_keys(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**AXK2, "num_hidden_layers": 4, "moe_layer_freq": 2}))
    graph = load_spec(tmp_path)
    assert ["layers.0.mlp.w_gate" in graph.params, "layers.2.moe.router" in graph.params] == [True, True]
    assert "layers.1.moe.router" not in graph.params and "layers.3.mlp_gnorm" not in graph.params


@pytest.mark.parametrize("changes, key, fragment", [
    ({**GLM, "indexer_types": ["shared", "full"]}, "indexer_types", "first layer must be \"full\""),
    ({**GLM, "indexer_types": ["full", "skip"]}, "indexer_types", "each \"full\" or \"shared\""),
    ({**GLM, "q_lora_rank": None}, "q_lora_rank", "query latent"),
    ({**AXK2, "n_group": 2, "topk_group": 1}, "n_group", "0.0"),
    ({**AXK2, "mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types", "each \"dense\" or \"sparse\""),
    ({**AXK2, "q_lora_rank": None}, "q_lora_rank", "query latent"),
    ({**DOTS3, "rope_parameters": {"indexed_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "rope_parameters.indexed_attention", "default RoPE"),
    ({**DOTS3, "per_layer_config": {"2": {"rms_norm_eps": 1e-6}}}, "per_layer_config.2", "overrides of"),
    ({**DOTS3, "per_layer_config": {"2": {"head_dim": 11, "qk_nope_head_dim": 6}}}, "per_layer_config",
     "not qk_nope_head_dim + qk_rope_head_dim"),
    ({**DOTS3, "num_hidden_layers": 4, "layer_types": ["indexed_attention"] * 2 + ["sliding_attention"] * 2},
     "per_layer_config", "one set of sizes per layer type"),
    ({**DOTS3, "index_head_dim": 2}, "index_head_dim", "narrower than qk_rope_head_dim"),
    ({**M3_BASE, "index_head_dim": 4}, "index_head_dim", "narrower than the 8 rotated dims"),
    ({**M3_BASE, "index_local_blocks": 3}, "index_local_blocks", "at most index_topk_blocks"),
    ({**M3_BASE, "index_n_heads": 3}, "index_n_heads", "do not group"),
    ({**M3_BASE, "layer_types": ["minimax_m3_sparse", "sliding_attention"]}, "layer_types", "entries of"),
])
def test_refusals_name_the_key(tmp_path, changes, key, fragment):
    (tmp_path / "config.json").write_text(json.dumps(changes))
    with pytest.raises(SpecError) as err:
        load_spec(tmp_path)
    assert str(err.value).startswith(f"{key}:") or f" {key}:" in str(err.value), str(err.value)
    assert fragment in str(err.value) and "config.json" in str(err.value)
