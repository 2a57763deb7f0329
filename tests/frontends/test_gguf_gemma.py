"""The GGUF frontend's ``gemma3n`` arch against transformers 5.24: tiny random
Gemma3nForCausalLM twins (four AltUp streams, as the converter requires, a non-zero active
stream, LAuReL, per-layer embeddings, KV-sharing layers, activation sparsity, per-layer MLP
widths, local/global windows and RoPE with linear scaling on the global layers), written as
llama.cpp's converter writes them (``gguf_convert_gemma``), read back with ``load_spec``: the
logits of a left-padded batch of two equal transformers' on the real tokens (reference
interpreter, and both ONNX targets through ONNX Runtime), the 16-token greedy continuations
equal (one prompt through the interpreter, the padded batch through ONNX Runtime), the graph
is the HF frontend's (ops, params) and every param is the checkpoint's; onnxruntime-genai runs
the GGUF-built folder; a Q8_0 file keeps its blocks and matches its float graph; what the file
must say is refused through the CLI naming the key."""
import numpy as np
import pytest

from frontends import load_spec
from gguf_convert_gemma import gemma3n_converted, gemma3n_keys, write_gemma3n
from test_gguf_decoders import (assert_blocks_match_float, assert_compiles_to_the_same_bytes, assert_gguf_twin_matches,
                                refused)
from test_hf_models import NEW_TOKENS, TOLERANCE, hf_logits, irc_logits, prompts, randomize, relative_error, save_twin
from twin_fixtures import once_fixture, random_twin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, laurel_rank=4, hidden_size_per_layer_input=8,
             max_position_embeddings=64, pad_token_id=0, num_kv_shared_layers=0, altup_num_inputs=4,
             vocab_size_per_layer_input=128)
GEMMA3N = {
    # 6 layers: the last two reuse layers 2 (sliding) and 3 (full); sparse MLPs on three layers
    "gemma3n-shared-sparse": dict(
        num_hidden_layers=6, num_kv_shared_layers=2, altup_active_idx=1, sliding_window=4,
        intermediate_size=[48, 40, 48, 32, 48, 48], layer_types=["sliding_attention", "full_attention"] * 3,
        activation_sparsity_pattern=[0.95, 0.5, 0.0, 0.0, 0.9, 0.0],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0}}),
    # transformers' defaults otherwise: every layer sliding (window 512), dense MLPs, no sharing
    "gemma3n-plain": dict(laurel_rank=2),
}
PADDED = dict(vocab_size_per_layer_input=100)  # a per-layer table smaller than the vocabulary
ALL = sorted(GEMMA3N)


def gemma3n_twin(name: str, folder):
    """(transformers model, HF folder, GGUF path)."""
    model, _ = save_twin(random_twin("Gemma3nTextConfig", {**SMALL, **GEMMA3N[name]}, ALL.index(name)),
                         folder)  # plain norm weights, not 1 + w
    return model, folder, write_gemma3n(folder / f"{name}.gguf", model)


models = once_fixture(gemma3n_twin)


def hf_batch_greedy(model) -> np.ndarray:
    ids, mask, _ = prompts()
    with torch.no_grad():
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), max_new_tokens=NEW_TOKENS,
                             do_sample=False)
    return out[:, ids.shape[1]:].numpy()


@pytest.mark.parametrize("name", ALL)
def test_gemma3n_matches_transformers(models, tmp_path, name):
    """Logits, 16 greedy tokens, the HF frontend's graph and params; both ONNX targets on the
    left-padded batch."""
    model, hf_folder, path = models(name)
    assert load_spec(path).meta["gguf"]["architecture"] == "gemma3n"
    assert_gguf_twin_matches(path, hf_folder, model, tmp_path)


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_genai_runs_the_gguf_built_folder(models, tmp_path, target):
    """onnxruntime-genai runs the KV-sharing file's folder (its config counts the 4 layers that
    hold a cache) to transformers' greedy tokens."""
    import json

    og = pytest.importorskip("onnxruntime_genai")
    from backends.onnx import emit
    from tests.frontends.test_hf_ssm_onnx import genai_greedy

    model, _, path = models("gemma3n-shared-sparse")
    emitted = emit.emit_model(load_spec(path), str(tmp_path / "model.onnx"), target=target, context=64)
    assert emitted.genai_config, emitted.genai_note
    assert json.loads((tmp_path / "genai_config.json").read_text())["model"]["decoder"]["num_hidden_layers"] == 4
    prompt = prompts()[0][0]
    assert genai_greedy(og, tmp_path, prompt, NEW_TOKENS) == hf_batch_greedy(model)[0].tolist()


def test_q8_0_blocks_stay_quantized_and_match_float(models, tmp_path):
    """The KV-sharing twin with its projections as Q8_0: the blocks kept (``weights="exact"``)
    give the float-weights graph's logits, through the interpreter and both ONNX targets; the
    stacked AltUp projections (slabs of one tensor) are read in float."""
    import gguf

    model = models("gemma3n-shared-sparse")[0]
    path = write_gemma3n(tmp_path / "q8.gguf", model, qtype=gguf.GGMLQuantizationType.Q8_0)
    assert_blocks_match_float(path, tmp_path)


def test_the_same_file_compiles_to_the_same_bytes(models, tmp_path):
    assert_compiles_to_the_same_bytes(models("gemma3n-shared-sparse")[2], tmp_path)


def _rewritten(model, path, keys=None, drop=()) -> str:
    from gguf_writer import write_file

    tensors = {k: v for k, v in gemma3n_converted(model).items() if k not in drop}
    return write_file(path, "gemma3n", {**gemma3n_keys(model.config), **(keys or {})}, tensors)


@pytest.mark.parametrize("keys, words", [
    ({"gemma3n.altup.active_idx": 4}, "gemma3n.altup.active_idx: 4 is not one of the 4 streams"),
    ({"gemma3n.activation_sparsity_scale": [1.0, -1.0]},
     "gemma3n.activation_sparsity_scale: has 2 entries for 6 layers"),
    ({"gemma3n.feed_forward_length": [48, 48, 48]}, "gemma3n.feed_forward_length: has 3 entries for 6 layers"),
    ({"gemma3n.attention.shared_kv_layers": 5},
     "gemma3n.attention.shared_kv_layers: layer 1 (global) shares the keys and values of an earlier global layer"),
    ({"gemma3n.attention.sliding_window_pattern": [True, False]},
     "gemma3n.attention.sliding_window_pattern: has 2 entries for 6 layers"),
])
def test_what_the_file_says_wrong_is_refused_naming_the_key(models, tmp_path, capsys, keys, words):
    model = models("gemma3n-shared-sparse")[0]
    refused(capsys, tmp_path, _rewritten(model, tmp_path / "bad.gguf", keys=keys), words)


def test_a_per_layer_table_padded_by_the_converter_reads_zeros_past_the_checkpoint_s(tmp_path):
    """The converter pads a 100-row per-layer table to the 128-row vocabulary with zeros: irc
    reads the 128 rows as stored (zeros past row 100, llama.cpp's reading) and matches
    transformers on prompts inside the checkpoint's table."""
    config = transformers.Gemma3nTextConfig(**{**SMALL, **GEMMA3N["gemma3n-shared-sparse"], **PADDED})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=7, norm_centre=1.0)
    graph = load_spec(write_gemma3n(tmp_path / "padded.gguf", model))
    table = graph.params["embed_per_layer"].array()
    assert table.shape[0] == 128 and not table[100:].any()
    np.testing.assert_array_equal(table[:100], model.model.embed_tokens_per_layer.weight.detach().numpy())
    ids, mask, positions = prompts(vocab=100)
    real = mask.astype(bool)
    assert relative_error(irc_logits(graph, ids, mask, positions)[real],
                          hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE


def test_a_missing_laurel_tensor_is_refused_naming_it(models, tmp_path, capsys):
    model = models("gemma3n-shared-sparse")[0]
    path = _rewritten(model, tmp_path / "nolaurel.gguf", drop=["blk.0.laurel_l.weight"])
    refused(capsys, tmp_path, path, "blk.0.laurel_l.weight")


# ---- Gemma-4 (gemma4, dense) ------------------------------------------------------------------

G4_SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, global_head_dim=16, sliding_window=4, max_position_embeddings=64,
                hidden_size_per_layer_input=8, vocab_size_per_layer_input=128, pad_token_id=0, bos_token_id=2,
                eos_token_id=1)
GEMMA4 = {  # name: (overrides of G4_SMALL, num_global_key_value_heads as the Hub's config.json says it)
    # E2B/E4B-like: per-layer embeddings, the last two layers sharing layers 2 (sliding) and 3
    # (full), double-wide MLPs there, a final soft-cap
    "gemma4-ple-kv-shared-wide": (dict(layer_types=["sliding_attention", "full_attention"] * 3,
                                       num_kv_shared_layers=2, use_double_wide_mlp=True,
                                       final_logit_softcapping=5.0), None),
    # 31B-like: full layers with k = v and one kv head, no per-layer embeddings, untied,
    # proportional RoPE over half the head, the default 5:1 pattern
    "gemma4-k-eq-v-untied": (dict(attention_k_eq_v=True, num_global_key_value_heads=1, hidden_size_per_layer_input=0,
                                  tie_word_embeddings=False, rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        "full_attention": {"rope_type": "proportional", "rope_theta": 1e4, "partial_rotary_factor": 0.5}}), 1),
    # one cache layout on every layer (global_head_dim = head_dim): what genai can allocate
    "gemma4-uniform-kv-shared": (dict(global_head_dim=8, num_kv_shared_layers=2, num_hidden_layers=4,
                                      layer_types=["sliding_attention", "full_attention"] * 2), None),
}


def gemma4_twin(name: str, folder):
    """(transformers model, HF folder, GGUF path)."""
    from gguf_convert_gemma import gemma4_converted, gemma4_keys
    from gguf_writer import write_file

    overrides, global_kv = GEMMA4[name]
    model = random_twin("Gemma4TextConfig", {**G4_SMALL, **overrides}, sorted(GEMMA4).index(name))
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for key, buffer in model.named_buffers():
            if key.endswith("layer_scalar"):  # a checkpoint buffer, ones by default
                buffer.copy_(0.5 + torch.rand(buffer.shape, generator=generator))
    save_twin(model, folder)
    head = {**G4_SMALL, **overrides}["global_head_dim"]
    path = write_file(folder / f"{name}.gguf", "gemma4", gemma4_keys(model.config, head, global_kv),
                      gemma4_converted(model, head))
    return model, folder, path


gemma4 = once_fixture(gemma4_twin, "gemma4")


@pytest.mark.parametrize("name", sorted(GEMMA4))
def test_gemma4_matches_transformers(gemma4, tmp_path, name):
    """Logits, 16 greedy tokens, the HF frontend's graph and params; both ONNX targets on the
    left-padded batch."""
    model, hf_folder, path = gemma4(name)
    assert_gguf_twin_matches(path, hf_folder, model, tmp_path, attrs_of=("rope",))


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_genai_runs_the_gemma4_gguf_built_folder(gemma4, tmp_path, target):
    og = pytest.importorskip("onnxruntime_genai")
    from backends.onnx import emit
    from tests.frontends.test_hf_ssm_onnx import genai_greedy

    model, _, path = gemma4("gemma4-uniform-kv-shared")
    emitted = emit.emit_model(load_spec(path), str(tmp_path / "model.onnx"), target=target, context=64)
    assert emitted.genai_config, emitted.genai_note
    prompt = prompts()[0][0]
    assert genai_greedy(og, tmp_path, prompt, NEW_TOKENS) == hf_batch_greedy(model)[0].tolist()


def test_gemma4_moe_is_refused_naming_the_tensor(gemma4, tmp_path, capsys):
    from gguf_convert_gemma import gemma4_converted, gemma4_keys
    from gguf_writer import write_file

    model = gemma4("gemma4-k-eq-v-untied")[0]
    tensors = {**gemma4_converted(model, 16), "blk.0.ffn_gate_inp.weight": np.zeros((4, 32), np.float32)}
    path = write_file(tmp_path / "moe.gguf", "gemma4", gemma4_keys(model.config, 16, 1), tensors)
    refused(capsys, tmp_path, path, "blk.0.ffn_gate_inp.weight: Gemma-4's MoE form is not read from GGUF")


def test_gemma4_rope_freqs_that_are_not_proportional_are_refused(gemma4, tmp_path, capsys):
    from gguf_convert_gemma import gemma4_converted, gemma4_keys
    from gguf_writer import write_file

    model = gemma4("gemma4-k-eq-v-untied")[0]
    tensors = {**gemma4_converted(model, 16), "rope_freqs.weight": np.linspace(1, 4, 8).astype(np.float32)}
    path = write_file(tmp_path / "freqs.gguf", "gemma4", gemma4_keys(model.config, 16, 1), tensors)
    refused(capsys, tmp_path, path, "rope_freqs.weight", "not proportional RoPE")
