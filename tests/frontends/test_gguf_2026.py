"""The GGUF frontend's exaone4, exaone-moe, glm4moe, ernie4_5, ernie4_5-moe, hunyuan-moe,
hunyuan-dense, dots1, seed_oss, arcee, minimax-m2, exaone, stablelm, nemotron, starcoder, llama4,
jais2, dbrx, afmoe and minicpm3 archs (``frontends.gguf.families_2026``, ``families_2026b``) against
transformers 5.25: tiny random twins (``test_hf_models``' and a few of their own), written as
llama.cpp's converters write them (``gguf_convert_2026``), read back with ``load_spec``: the
logits of a left-padded batch equal transformers' on the real tokens (reference interpreter),
the greedy continuation of one prompt equals transformers', and the graph is the HF frontend's
(ops, params, values); one twin of each kind through both ONNX targets; block formats match
the float graph of the same file; what a file must say is refused naming the key or tensor."""
import gguf
import pytest

from frontends import load_spec
from frontends.gguf import load_gguf
from gguf_convert_2026 import write_converted
from irc.errors import SpecError
from test_gguf_decoders import assert_same_graph_as_hf
from test_hf_models import (NEW_TOKENS, SMALL, assert_greedy_matches, assert_logits_match, assert_ort_run_matches,
                            build_case, hf_logits, prompts, relative_error, save_twin)
from twin_fixtures import once_fixture, random_twin

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CASES = {  # test_hf_models' twin -> (its GGUF architecture, MTP blocks written after the model's)
    "exaone4-post-norms-nope-global": ("exaone4", 0), "exaone4-no-window-rope-everywhere": ("exaone4", 0),
    "glm4-moe-qk-norm-all-moe": ("glm4moe", 1), "ernie4-5-interleaved-tied": ("ernie4_5", 0),
    "ernie4-5-moe-shared-interleaved": ("ernie4_5-moe", 0), "hunyuan-dense-alpha-rope-biases": ("hunyuan-dense", 0),
    "hunyuan-moe-topk-list-shared-mlp": ("hunyuan-moe", 0), "seed-oss-qkv-out-bias": ("seed_oss", 0),
    "arcee-relu2-mlp-bias": ("arcee", 0), "minimax-m2-full-qk-norm-rotary-dim": ("minimax-m2", 0),
    "exaone-original-names": ("exaone", 0), "stablelm-qk-layernorm-qkv-bias": ("stablelm", 0),
    "stablelm-tied-parallel-half-rotary": ("stablelm", 0), "nemotron-layernorm1p": ("nemotron", 0),
    "jais2-layernorm-relu2-biases": ("jais2", 0), "dbrx-clip-qkv-top2-renorm": ("dbrx", 0),
    "granitemoeshared-shared-expert": ("granitemoe", 0),  # frontends.gguf.families' granitemoe with *_shexp
}
LOCAL = {  # name: (config class, overrides of SMALL, GGUF architecture, MTP blocks)
    "glm4-moe-qkv-bias-dense-first": ("Glm4MoeConfig", dict(n_routed_experts=4, num_experts_per_tok=2, head_dim=16,
                                                            moe_intermediate_size=16, attention_bias=True,
                                                            routed_scaling_factor=1.5, pad_token_id=0), "glm4moe", 0),
    # llama.cpp's dots1 has no windows: the twin's layers are all full (max_window_layers = all)
    "dots1-v3-moe-no-windows": ("Dots1Config", dict(num_hidden_layers=3, n_routed_experts=4, num_experts_per_tok=2,
                                                    n_shared_experts=1, moe_intermediate_size=16,
                                                    first_k_dense_replace=1, head_dim=16, norm_topk_prob=True,
                                                    routed_scaling_factor=2.0, max_window_layers=3), "dots1", 0),
    "exaone4-llama3-rope-windows": ("Exaone4Config", dict(num_hidden_layers=4, sliding_window=4, head_dim=16,
                                                          sliding_window_pattern=4, pad_token_id=0, rope_parameters={
        "rope_type": "llama3", "rope_theta": 1000000.0, "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}), "exaone4", 0),
    "exaone-moe-dense-first-shared-mtp": ("ExaoneMoeConfig", dict(num_hidden_layers=4, sliding_window=4,
                                                                  sliding_window_pattern=2, head_dim=16, num_experts=4,
                                                                  num_experts_per_tok=2, moe_intermediate_size=16,
                                                                  num_shared_experts=1, first_k_dense_replace=1,
                                                                  routed_scaling_factor=1.5, eos_token_id=2),
                                          "exaone-moe", 1),
    # llama.cpp's AFMoE: every 4th layer full (NoPE), the embeddings always times sqrt(d) (mup_enabled)
    "afmoe-gate-nope-every-4th-mup": ("AfmoeConfig", dict(num_hidden_layers=4, num_experts=4, num_experts_per_tok=2,
                                                          moe_intermediate_size=16, head_dim=8, sliding_window=4,
                                                          num_shared_experts=1, route_scale=1.5, mup_enabled=True,
                                                          pad_token_id=0, eos_token_id=2), "afmoe", 0),
    # llama.cpp's MiniCPM3: q through q_lora_rank, values d / heads wide, its fixed µP (12, 1.4, 256)
    "minicpm3-mla-fixed-mup": ("MiniCPM3Config", dict(num_key_value_heads=4, kv_lora_rank=12, qk_nope_head_dim=8,
                                                      qk_rope_head_dim=4, v_head_dim=8, q_lora_rank=16, scale_emb=12.0,
                                                      scale_depth=1.4, dim_model_base=256, pad_token_id=0,
                                                      eos_token_id=2), "minicpm3", 0),
    # the converter writes feed_forward_length 4 * n_embd and one kv head: a multi-query twin of that width
    "starcoder-multi-query": ("GPTBigCodeConfig", dict(bos_token_id=1, eos_token_id=2), "starcoder", 0),
    # llama.cpp's Llama-4: chunks of 8192, every 4th layer NoPE, its temperature constants (the config's defaults)
    "llama4-moe-every-2nd-nope-4th": ("Llama4TextConfig", dict(num_hidden_layers=4, head_dim=8, intermediate_size=24,
                                                               intermediate_size_mlp=40, num_local_experts=4,
                                                               num_experts_per_tok=2, interleave_moe_layer_step=2,
                                                               pad_token_id=0, bos_token_id=1, eos_token_id=2),
                                      "llama4", 0),
}
ALL = sorted(CASES) + sorted(LOCAL)
ONNX = ("exaone4-post-norms-nope-global", "glm4-moe-qk-norm-all-moe", "hunyuan-moe-topk-list-shared-mlp",
        "arcee-relu2-mlp-bias", "llama4-moe-every-2nd-nope-4th", "nemotron-layernorm1p", "starcoder-multi-query")


def _local(name: str, folder):
    class_name, overrides, _, _ = LOCAL[name]
    return save_twin(random_twin(class_name, {**SMALL, **overrides}, ALL.index(name)), folder)


def gguf_twin(name: str, folder):
    """(transformers model, HF folder, GGUF path)."""
    model, hf_folder = _local(name, folder) if name in LOCAL else build_case(name, folder)
    arch, mtp = LOCAL[name][2:] if name in LOCAL else CASES[name]
    return model, hf_folder, write_converted(folder / f"{name}.gguf", model, arch, mtp=mtp)


models = once_fixture(gguf_twin)


@pytest.mark.parametrize("name", ALL)
def test_logits_greedy_tokens_and_graph_match(models, name):
    model, hf_folder, path = models(name)
    graph = load_spec(path)
    assert_logits_match(graph, model)
    assert_greedy_matches(graph, model, prompts()[0][0].tolist(), NEW_TOKENS)
    assert_same_graph_as_hf(path, hf_folder)


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", ONNX)
def test_onnx_runtime_matches_transformers(models, tmp_path, name, target):
    pytest.importorskip("onnxruntime")
    from backends.onnx import emit

    model, _, path = models(name)
    graph = load_spec(path)
    ids, mask, _ = prompts()
    with torch.no_grad():
        out = model.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                             max_new_tokens=NEW_TOKENS, do_sample=False)
    onnx_path = str(tmp_path / "model.onnx")
    emit.emit_model(graph, onnx_path, target=target, genai=False, context=64)
    assert_ort_run_matches(onnx_path, graph, hf_logits(model, *prompts()), out[:, ids.shape[1]:].numpy())


@pytest.mark.parametrize("name", ["glm4-moe-qkv-bias-dense-first", "ernie4-5-moe-shared-interleaved",
                                  "afmoe-gate-nope-every-4th-mup"])
def test_block_formats_match_the_float_graph(models, tmp_path, name):
    from test_hf_models import irc_logits

    model, _, _ = models(name)
    arch, mtp = LOCAL[name][2:] if name in LOCAL else CASES[name]
    path = write_converted(tmp_path / "q8.gguf", model, arch, mtp=mtp, qtype=gguf.GGMLQuantizationType.Q8_0)
    blocks, floats = load_gguf(path, weights="exact"), load_gguf(path, weights="float")
    assert any(n.op in ("dequant_linear", "dequantize") for n in blocks.nodes)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    assert relative_error(irc_logits(blocks, ids, mask, positions)[real],
                          irc_logits(floats, ids, mask, positions)[real]) <= 1e-5


# ---- refusals ----------------------------------------------------------------------------------

def _rewritten(path, tmp_path, arch: str, changes: dict, drop=()) -> str:
    """The file at ``path`` with ``{arch}.KEY`` values changed (None: removed) and tensors dropped."""
    from gguf_writer import write_file

    reader = gguf.GGUFReader(path)
    keys = {}
    for field in reader.fields.values():
        if not field.name.startswith(arch + "."):
            continue
        value = field.contents()
        keys[field.name] = float(value) if field.types and field.types[0] == gguf.GGUFValueType.FLOAT32 else value
    for key, value in changes.items():
        keys.pop(f"{arch}.{key}", None)
        if value is not None:
            keys[f"{arch}.{key}"] = value
    tensors = {t.name: t.data.reshape([int(x) for x in reversed(t.shape)]) for t in reader.tensors
               if t.name not in drop}
    return write_file(tmp_path / "bad.gguf", arch, keys, tensors)


BAD = {  # name: (twin, changes to its keys, tensors dropped, what the error names)
    "dots1-softmax-gating": ("dots1-v3-moe-no-windows", {"expert_gating_func": 1}, (), "dots1.expert_gating_func"),
    "glm4moe-all-blocks-mtp": ("glm4-moe-qk-norm-all-moe", {"nextn_predict_layers": 3}, (),
                               "glm4moe.nextn_predict_layers"),
    "hunyuan-moe-two-shared": ("hunyuan-moe-topk-list-shared-mlp", {"expert_shared_count": 2}, (),
                               "hunyuan-moe.expert_shared_count"),
    "minimax-m2-top-k-above-experts": ("minimax-m2-full-qk-norm-rotary-dim", {"expert_used_count": 9}, (),
                                       "minimax-m2.expert_used_count"),
    "ernie-moe-no-expert-width": ("ernie4-5-moe-shared-interleaved", {"expert_feed_forward_length": None}, (),
                                  "ernie4_5-moe.expert_feed_forward_length"),
    "llama4-sliding-window": ("llama4-moe-every-2nd-nope-4th", {"attention.sliding_window": 0}, (),
                              "llama4.attention.sliding_window"),
    "starcoder-kv-heads-not-the-rows": ("starcoder-multi-query", {"attention.head_count_kv": 2}, (),
                                        "starcoder.attention.head_count_kv"),
    "starcoder-no-position-table": ("starcoder-multi-query", {}, ("position_embd.weight",), "position_embd.weight"),
    "stablelm-rotary-beyond-head": ("stablelm-tied-parallel-half-rotary", {"rope.dimension_count": 10}, (),
                                    "stablelm.rope.dimension_count"),
    "afmoe-pattern-not-every-4th": ("afmoe-gate-nope-every-4th-mup",
                                    {"attention.sliding_window_pattern": [True, False, True, False]}, (),
                                    "afmoe.attention.sliding_window_pattern"),
    "minicpm3-no-q-lora": ("minicpm3-mla-fixed-mup", {"attention.q_lora_rank": None},
                           ("blk.0.attn_q_a.weight", "blk.1.attn_q_a.weight"), "blk.0.attn_q_a.weight"),
    "exaone4-pattern-short": ("exaone4-post-norms-nope-global", {"attention.sliding_window_pattern": [True, False]},
                              (), "exaone4.attention.sliding_window_pattern"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_metadata_mistakes_are_refused_naming_the_key(models, tmp_path, name):
    twin, changes, drop, named = BAD[name]
    arch = (LOCAL[twin][2] if twin in LOCAL else CASES[twin][0])
    path = _rewritten(models(twin)[2], tmp_path, arch, changes, drop)
    with pytest.raises(SpecError, match=named.replace(".", r"\.")):
        load_gguf(path)
