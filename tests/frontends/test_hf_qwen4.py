"""Qwen4-Exp (``frontends.hf.families_qwen4``: qwen4_exp_text, and the multimodal qwen4_exp's text
model) against transformers 5.25: tiny random twins (gated hyper-connected streams, gated
DeltaNet and QSA-indexed attention layers, experts on every layer, hashed n-gram per-layer
embeddings) — the ``Qwen4ExpForCausalLM`` layout and the ``Qwen4ExpForConditionalGeneration``
one — rows of the twin harness (test_hf_twins.py: the left-padded batch and each row alone, 16
greedy tokens, both ONNX targets); the Triton target in its interpreter and the NumPy emitter;
the gated hyper-connection equals transformers' module; the selection and the n-grams' cut at
eos are live, the block scores free of ties at the selection's boundary; the hash constants are
the buffers transformers saves, the table read from its shards; fused experts read alike;
onnx-npu refuses the indexer by name; config.json mistakes."""
import json

import numpy as np
import pytest

from frontends import load_spec
from irc.errors import SpecError
from tests.frontends.test_hf_models import TOLERANCE, hf_logits, irc_logits, prompts, relative_error
from tests.frontends.twins import causal_lm, check_numpy_and_triton, family, model_of, models_fixture

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

LINEAR, INDEXED = "linear_attention", "indexed_attention"
SMALL = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, max_position_embeddings=64, linear_key_head_dim=8, linear_value_head_dim=8,
             linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=16,
             shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2, hc_count=2, hc_lowrank=8,
             layer_types=[LINEAR, INDEXED], indexer_n_heads=8, indexer_kv_heads=1, indexer_head_dim=8,
             indexer_budget=4, indexer_compress_ratio=2)
PLE = dict(eos_token_id=65, ngram_vocab_size_base=50, make_ngram_vocab_size_divisible_by=8, split_ngram_parts=2)
VISION = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32, patch_size=4,
              num_position_embeddings=16)
CASES = {  # name: (config class, overrides of SMALL); Qwen4ExpConfig: the multimodal layout
    # two streams, blocks of 2 with a budget of two blocks, GQA, full RoPE
    "qwen4-exp-two-streams-blocks-of-2": ("Qwen4ExpTextConfig", {}),
    # three streams, blocks of 3 with a budget of one, two indexed layers, MQA, RoPE on half of each
    # head, top-k weights not renormalised; PLE on the linear layer: 4-grams (3 carried tokens, the
    # convolution dilated by 4), one head per order, eos (65) the long prompt's third token
    "qwen4-exp-three-streams-blocks-of-3-half-rope-ple": ("Qwen4ExpTextConfig", dict(
        hc_count=3, num_hidden_layers=3, layer_types=[INDEXED, LINEAR, INDEXED], num_key_value_heads=1,
        indexer_n_heads=16, indexer_budget=3, indexer_compress_ratio=3, norm_topk_prob=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5},
        **PLE, ple_layer_ids=[2], ngram_size=4, heads_per_ngram=1, ple_embed_dim=24, ple_conv_kernel_size=3)),
    # the multimodal checkpoint: the text model under model.language_model., a vision tower beside
    # it; PLE (trigrams, two heads per order) on the first layer
    "qwen4-exp-multimodal-ple": ("Qwen4ExpConfig", dict(indexer_budget=2, hc_lowrank=4, **PLE, ple_layer_ids=[1],
                                                        heads_per_ngram=2, ple_embed_dim=16)),
}


def make(class_name: str, text: dict):
    if class_name == "Qwen4ExpConfig":
        config = transformers.Qwen4ExpConfig(text_config=text, vision_config=VISION)
        return transformers.Qwen4ExpForConditionalGeneration(config).eval()
    return causal_lm(class_name, text)


TWINS = family(None, SMALL, CASES, make=make, context=None)


def _model(name: str, **changes):
    return model_of(TWINS[name], **changes)


models = models_fixture(TWINS)


def test_triton_and_numpy_targets_match_the_reference(models, tmp_path):
    name = "qwen4-exp-three-streams-blocks-of-3-half-rope-ple"
    check_numpy_and_triton(models(name)[1], tmp_path, name)


def test_the_gated_hyper_connection_equals_transformers_module():
    """``GatedHyperConnections``' block input, new streams and head against
    ``Qwen4ExpTextGatedResidual`` (with and without its inject weights)."""
    from frontends.dsl import ACTIVATION, Model, Tensor
    from frontends.dsl_hyper import GatedHyperConnections
    from irc.interpreter import Interpreter
    from transformers.models.qwen4_exp import modeling_qwen4_exp as module

    streams_n, width, rank = 3, 8, 5
    config = transformers.Qwen4ExpTextConfig(hidden_size=width, hc_count=streams_n, hc_lowrank=rank,
                                             rms_norm_eps=1e-5)
    block, head = module.Qwen4ExpTextGatedResidual(config), module.Qwen4ExpTextGatedResidual(config, False)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in [*block.parameters(), *head.parameters()]:
            p.copy_(0.5 * torch.randn(p.shape, generator=generator))
    m = Model("hc", vocab=4, d_model=width)
    gated = GatedHyperConnections(m, streams_n, width, 1e-5, rank)
    streams = Tensor(m, m.graph.add_input("streams", ACTIVATION, ("B", "T", streams_n, width)))
    out = Tensor(m, m.graph.add_input("out", ACTIVATION, ("B", "T", width)))
    state, mixed = gated.enter(streams, "hc.")
    m.graph.outputs = [mixed.value, gated.leave(state, out, "hc.").value, gated.head(streams, "head.").value]
    names = {"hc_norm": "hc_norm", "down": "input_mix_weight_down", "up": "input_mix_weight_up",
             "inject": "block_inject_weight"}
    for ours, theirs in names.items():
        m.graph.params[f"hc.{ours}"].data = getattr(block, theirs).weight.detach().numpy()
        if ours != "inject":
            m.graph.params[f"head.{ours}"].data = getattr(head, theirs).weight.detach().numpy()
    x = torch.randn(2, 5, streams_n, width, generator=generator)
    y = torch.randn(2, 5, width, generator=generator)
    got = list(Interpreter(m.graph).run({"streams": x.numpy(), "out": y.numpy()}).values())
    with torch.no_grad():
        mixed, hyper, inject = block(x.flatten(-2))
        want = [mixed, (hyper + (y.unsqueeze(-2) * inject.unsqueeze(-1)).flatten(-2)).unflatten(-1, (3, width)),
                head(x.flatten(-2))]
    for name, a, b in zip(("block input", "streams", "head"), got, want):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("name", ["qwen4-exp-two-streams-blocks-of-2",
                                  "qwen4-exp-three-streams-blocks-of-3-half-rope-ple"])
def test_the_selection_is_live(models, name):
    """A budget past the sequence (every key kept) changes transformers' logits."""
    model, _ = models(name)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    other = _model(name, indexer_budget=30 * CASES[name][1].get("indexer_compress_ratio", 2))
    got, wide = hf_logits(model, ids, mask, positions), hf_logits(other, ids, mask, positions)
    assert relative_error(got[real], wide[real]) > 100 * TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_blocks_tie_at_the_kth_place(models, monkeypatch, name):
    """torch.topk leaves the order of equal scores open, irc keeps the lower block first; the
    twins' block scores (sums of ReLU'd products) are checked free of ties at the boundary."""
    model, _ = models(name)
    seen, topk = [], torch.Tensor.topk

    def recording(self, k, *args, **kwargs):
        if self.ndim == 1:
            seen.append((self.detach().clone(), k))
        return topk(self, k, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "topk", recording)
    hf_logits(model, *prompts())
    assert seen
    rows = [(np.sort(scores.numpy())[::-1], k) for scores, k in seen]
    assert all(row[k - 1] > row[k] for row, k in rows if len(row) > k)


def test_the_ngram_cut_at_eos_is_live(models):
    """The PLE twins' eos (65) is the long prompt's third token: another eos changes
    transformers' logits (the n-grams no longer stop there)."""
    name = "qwen4-exp-three-streams-blocks-of-3-half-rope-ple"
    model, _ = models(name)
    ids, mask, positions = prompts()
    assert 65 in ids[0].tolist()
    real = mask.astype(bool)
    got, other = hf_logits(model, ids, mask, positions), hf_logits(_model(name, eos_token_id=127), ids, mask,
                                                                 positions)
    assert relative_error(got[real], other[real]) > 100 * TOLERANCE


@pytest.mark.parametrize("name", ["qwen4-exp-three-streams-blocks-of-3-half-rope-ple", "qwen4-exp-multimodal-ple"])
def test_the_hash_constants_are_transformers(models, name):
    """The multipliers, primes and offsets irc derives are the buffers transformers saves
    (which irc leaves aside), and the table is read from its shards."""
    from safetensors.numpy import load_file

    _, folder = models(name)
    tensors = load_file(f"{folder}/model.safetensors")
    graph = load_spec(folder)
    (node,) = [n for n in graph.nodes if n.op == "ngram_hash"]
    layer = node.outputs[0].name.split(".")[1]
    prefix = next(k for k in tensors if k.endswith(f"layers.{layer}.ple.ple_embedding.layer_multipliers"))[:-17]
    assert node.attrs["multipliers"] == tensors[prefix + "layer_multipliers"].tolist()
    assert node.attrs["primes"] == tensors[prefix + "ngram_heads_vocab_sizes"].tolist()
    assert node.attrs["offsets"] == tensors[prefix + "ngram_heads_offsets"].tolist()
    assert sum(k.startswith(prefix + "ngram_embedding.shard_") for k in tensors) == PLE["split_ngram_parts"]


def _config(tmp_path, **changes) -> str:
    config = transformers.Qwen4ExpTextConfig(**SMALL).to_dict()
    config.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize("changes, key", [
    ({"ple_layer_ids": [2], "eos_token_id": 2}, "ple_layer_ids"),
    ({"ple_layer_ids": [1], "eos_token_id": None}, "eos_token_id"),
    ({"ple_layer_ids": [1], "eos_token_id": 2, "ple_embed_dim": 20}, "ple_embed_dim"),
    ({"hc_count": 1}, "hc_count"),
    ({"indexer_kv_heads": 2}, "indexer_kv_heads"),
    ({"indexer_budget": 3}, "indexer_budget"),
    ({"indexer_head_dim": 4}, "indexer_head_dim"),
    ({"indexer_n_heads": None}, "indexer_n_heads"),
    ({"output_gate_type": "sigmoid"}, "output_gate_type"),
    ({"layer_types": [LINEAR, "sliding_attention"]}, "layer_types"),
])
def test_config_mistakes_name_the_key(tmp_path, changes, key):
    with pytest.raises(SpecError, match=rf"config.json(:\d+)?: {key}"):
        load_spec(_config(tmp_path, **changes))


def test_full_attention_reads_as_indexed(tmp_path):
    """A checkpoint's "full_attention" entries are indexed layers, as transformers reads them."""
    graph = load_spec(_config(tmp_path, layer_types=[LINEAR, "full_attention"]))
    assert any(v.name == "past_key_values.1.index_key" for v in graph.inputs)


def test_onnx_npu_refuses_the_indexer_by_name(models, tmp_path, capsys):
    """onnx-npu's static form has no lowering for the indexer's key ranks (``range_like``
    over the cache): the compile fails naming the op and the indexer node."""
    from irc_cli.commands import main

    folder = models("qwen4-exp-two-streams-blocks-of-2")[1]
    assert main(["compile", str(folder), "--target", "onnx-npu", "-o", str(tmp_path / "npu"), "--context", "32",
                 "--chunk", "4", "--quiet", "--precision", "f32"]) != 0
    err = capsys.readouterr().err
    assert "layers.1.indexer." in err and "has no NPU lowering for target onnx-npu" in err


def test_fused_experts_read_alike(models, tmp_path):
    """The experts fused as transformers holds them ([E, 2F, d] and [E, d, F]) give the same
    logits as the one-tensor-per-expert file save_pretrained writes."""
    from safetensors.numpy import load_file, save_file

    name = "qwen4-exp-two-streams-blocks-of-2"
    _, folder = models(name)
    tensors = load_file(f"{folder}/model.safetensors")
    for layer in range(SMALL["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.mlp.experts."
        for fused, parts in (("gate_up_proj", ("gate_proj", "up_proj")), ("down_proj", ("down_proj",))):
            stacked = [np.stack([tensors.pop(f"{prefix}{e}.{part}.weight") for e in range(SMALL["num_experts"])])
                       for part in parts]
            tensors[prefix + fused] = np.concatenate(stacked, axis=1)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    ids, mask, positions = prompts()
    np.testing.assert_array_equal(irc_logits(load_spec(str(tmp_path)), ids, mask, positions),
                                  irc_logits(load_spec(str(folder)), ids, mask, positions))


def test_table_shards_read_rows_across_them(models):
    """``Shards.rows`` reads any row range across the shards as the concatenated table."""
    from safetensors.numpy import load_file

    from frontends.hf.families_qwen4_ple import Shards
    from frontends.hf.weights import Checkpoint

    _, folder = models("qwen4-exp-multimodal-ple")
    checkpoint = Checkpoint.find(str(folder))
    names = sorted(n for n in checkpoint.files if ".ngram_embedding.shard_" in n)
    tensors = load_file(f"{folder}/model.safetensors")
    table = np.concatenate([tensors[n] for n in names])
    source = Shards(names)
    assert source.shape(checkpoint) == list(table.shape)
    edge = len(tensors[names[0]])
    for start, stop in ((0, len(table)), (3, 5), (edge - 2, edge + 3), (edge, len(table) - 1)):
        np.testing.assert_array_equal(source.rows(checkpoint, start, stop), table[start:stop])


def test_a_full_size_config_counts_what_transformers_builds(tmp_path):
    """Qwen4ExpTextConfig's defaults with the QSA indexer set and PLE on 10 layers (each table
    16 heads of ~20M rows: 41B weights, past irc's default dimension limit, raised here):
    irc's params are transformers' parameters, 477.2B (its persistent buffers are the hash
    constants irc derives)."""
    from irc import limits
    from irc.analysis import analyze

    settings = dict(indexer_n_heads=16, indexer_kv_heads=1, indexer_head_dim=256, indexer_budget=2048,
                    indexer_compress_ratio=4, ple_layer_ids=[1, 2, 3, 5, 6, 7, 9, 10, 11, 13], eos_token_id=248044)
    config = transformers.Qwen4ExpTextConfig(**settings)
    config.save_pretrained(tmp_path)
    with torch.device("meta"):
        model = transformers.Qwen4ExpForCausalLM(config)
    want = sum(p.numel() for p in model.parameters())
    with limits.applied(dim=400_000_000):
        summary = analyze(load_spec(tmp_path))
    assert summary["params_total"] == want and round(want / 1e9, 1) == 477.2
