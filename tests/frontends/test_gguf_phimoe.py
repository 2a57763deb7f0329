"""The GGUF frontend's ``phimoe`` arch (Phi-3.5-MoE) against transformers 5.24: tiny random
PhimoeForCausalLM twins (LayerNorms with bias, q/k/v/o and LM-head biases, a window, the
sparsemixer-routed MoE, default RoPE and LongRoPE) written as llama.cpp's converter writes them
(``phimoe_keys`` / ``phimoe_converted`` below, ``PhiMoeModel`` on ``Phi3MiniModel``,
independently of ``frontends.gguf``), read back with ``load_spec``: the logits of a
left-padded batch of two equal transformers' on the real tokens (reference interpreter, and
both ONNX targets through ONNX Runtime), the 16-token greedy continuations equal, the graph is
the HF frontend's (ops, params) and every param is the checkpoint's; what the file must say is
refused through the CLI naming the key.

The converter drops ``router_jitter_noise`` (irc reads 0.01: the twins have it) and the
checkpoint's ``short_mscale``, writing LongRoPE's computed sqrt(1 + ln(s) / ln(n)) as
``rope.scaling.attn_factor``: the LongRoPE twin's mscale is that value (sqrt 2 for s = n = 8).
A config without ``original_max_position_embeddings`` in its RoPE (default RoPE) stops the
converter; the emulation writes ``max_position_embeddings`` there."""
import math

import gguf
import numpy as np
import pytest

from frontends import load_spec
from gguf_writer import write_file
from test_gguf_decoders import assert_blocks_match_float, assert_gguf_twin_matches, refused
from test_hf_models import NEW_TOKENS, prompts, save_twin
from twin_fixtures import once_fixture, random_twin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
             pad_token_id=0, router_jitter_noise=0.01)
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.5, 2.0, 3.0],
            "long_factor": [2.0, 4.0, 8.0, 16.0], "original_max_position_embeddings": 8,
            "short_mscale": math.sqrt(2.0), "long_mscale": math.sqrt(2.0)}
CASES = {
    "phimoe-default": dict(),
    "phimoe-biases-window": dict(attention_bias=True, lm_head_bias=True, sliding_window=4, num_local_experts=6),
    "phimoe-longrope-biases": dict(attention_bias=True, lm_head_bias=True, rope_parameters=LONGROPE),
}
ALL = sorted(CASES)


def phimoe_keys(config) -> dict:
    """``PhiMoeModel.set_gguf_parameters`` (``Phi3MiniModel``'s, then the expert counts)."""
    rope = config.to_dict()["rope_parameters"]
    d, heads = config.hidden_size, config.num_attention_heads
    original = rope.get("original_max_position_embeddings", config.max_position_embeddings)
    keys = {"context_length": config.max_position_embeddings, "rope.scaling.original_context_length": original,
            "embedding_length": d, "feed_forward_length": config.intermediate_size,
            "block_count": config.num_hidden_layers, "attention.head_count": heads,
            "attention.head_count_kv": config.num_key_value_heads,
            "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
            "rope.dimension_count": int(rope.get("partial_rotary_factor", 1.0) * d) // heads,
            "rope.freq_base": float(rope["rope_theta"]), "attention.sliding_window": config.sliding_window or 0,
            "expert_used_count": config.num_experts_per_tok, "expert_count": config.num_local_experts}
    if rope.get("long_factor"):
        scale = config.max_position_embeddings / original
        keys["rope.scaling.attn_factor"] = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
    return {f"phimoe.{key}": value for key, value in keys.items()}


def phimoe_converted(config, folder) -> dict:
    """{GGUF name: float32 array} of the checkpoint saved in ``folder`` as ``PhiMoeModel``
    writes it: gguf's name table, each layer's per-expert ``w1`` / ``w2`` / ``w3`` stacked
    [E, ...], the LongRoPE factors as ``rope_factors_long`` / ``rope_factors_short``."""
    from gguf_writer import _checkpoint

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.PHIMOE, config.num_hidden_layers)
    tensors, out = _checkpoint(folder), {}
    for key, value in tensors.items():
        if ".block_sparse_moe.experts." in key:
            if key.endswith(".experts.0.w1.weight"):
                for w in ("w1", "w2", "w3"):
                    stacked = torch.stack([tensors[key.replace(".0.w1.", f".{e}.{w}.")]
                                           for e in range(config.num_local_experts)])
                    merged = key.replace(".experts.0.w1.", f".experts.{w}.")
                    out[names.get_name(merged, try_suffixes=(".weight",))] = stacked.numpy()
            continue
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        assert name is not None, key
        out[name] = value.numpy()
    rope = config.to_dict()["rope_parameters"]
    if rope.get("long_factor"):
        out["rope_factors_long.weight"] = np.asarray(rope["long_factor"], np.float32)
        out["rope_factors_short.weight"] = np.asarray(rope["short_factor"], np.float32)
    return {name: np.ascontiguousarray(data, dtype=np.float32) for name, data in out.items()}


def phimoe_twin(name: str, folder):
    """(transformers model, HF folder, GGUF path)."""
    model, _ = save_twin(random_twin("PhimoeConfig", {**SMALL, **CASES[name]}, ALL.index(name)), folder)
    return model, folder, write_file(folder / f"{name}.gguf", "phimoe", phimoe_keys(model.config),
                                     phimoe_converted(model.config, folder))


models = once_fixture(phimoe_twin)


@pytest.mark.parametrize("name", ALL)
def test_phimoe_matches_transformers(models, tmp_path, name):
    """Logits, 16 greedy tokens, the HF frontend's graph and params; both ONNX targets on the
    left-padded batch."""
    model, hf_folder, path = models(name)
    assert_gguf_twin_matches(path, hf_folder, model, tmp_path, attrs_of=("moe",))


def test_top_k_other_than_two_is_refused_naming_the_key(models, tmp_path, capsys):
    model, folder, _ = models("phimoe-default")
    keys = {**phimoe_keys(model.config), "phimoe.expert_used_count": 3}
    path = write_file(tmp_path / "top3.gguf", "phimoe", keys, phimoe_converted(model.config, folder))
    refused(capsys, tmp_path, path, "phimoe.expert_used_count: 3 is not supported")


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_genai_runs_the_gguf_built_folder(models, tmp_path, target):
    og = pytest.importorskip("onnxruntime_genai")
    from backends.onnx import emit
    from tests.frontends.test_hf_ssm_onnx import genai_greedy, until_eos

    model, _, path = models("phimoe-longrope-biases")
    emitted = emit.emit_model(load_spec(path), str(tmp_path / "model.onnx"), target=target, context=64)
    assert emitted.genai_config, emitted.genai_note
    prompt = prompts()[0][0]
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt.tolist()]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    want = out[0, len(prompt):].tolist()
    assert genai_greedy(og, tmp_path, prompt, NEW_TOKENS) == until_eos(want, tmp_path)


def test_q8_0_blocks_stay_quantized_and_match_float(models, tmp_path):
    """The biased twin with its projections and experts as Q8_0: the blocks kept
    (``weights="exact"``) give the float-weights graph's logits (interpreter)."""
    from gguf_writer import _quantizable

    model, folder, _ = models("phimoe-biases-window")
    qtype = gguf.GGMLQuantizationType.Q8_0
    tensors = {name: (gguf.quants.quantize(data, qtype), qtype) if _quantizable(name, data, qtype) else data
               for name, data in phimoe_converted(model.config, folder).items()}
    path = write_file(tmp_path / "q8.gguf", "phimoe", phimoe_keys(model.config), tensors)
    assert_blocks_match_float(path, tmp_path, targets=())
