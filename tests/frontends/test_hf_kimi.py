"""Kimi-Linear (``kimi_linear``) against transformers 5.24 on tiny random twins: Kimi Delta
Attention beside MLA without RoPE, dense MLPs and DeepSeek-V3 MoE (group routing, shared
experts), from both checkpoint layouts transformers loads. Logits on a left-padded batch of
two (each row held against the row run alone, and against transformers' own padded batch)
and 16 greedy tokens through the reference interpreter; both ONNX targets in ONNX Runtime
(prefill logits and 16 greedy tokens per row, conv and recurrent states and KV caches fed
back); onnxruntime-genai 0.18 on ``mla-absorb{cache=halves}``. Then the refusals: one
SpecError naming config.json and the key; ``irc compile`` exits 2 and writes nothing."""
import json

import pytest

from frontends import load_spec
from irc.interpreter import generate
from irc_cli import main
from tests.frontends.refusals import pointed_line, refused
from tests.frontends.test_hf_models import NEW_TOKENS, TOLERANCE, assert_ort_run_matches, built_once, hf_logits, \
    irc_logits, prompts, randomize, relative_error
from tests.frontends.test_hf_ssm import unpadded_logits
from tests.frontends.test_hf_ssm_onnx import genai_greedy, hf_greedy  # noqa: F401 (hf_greedy: a fixture)

try:
    import torch
    import transformers
except ImportError:  # the refusals below need neither
    torch = transformers = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch and transformers")

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_attention_heads=2,
             num_key_value_heads=2, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6,
             pad_token_id=0, bos_token_id=0, eos_token_id=0)
CASES = {  # name: (settings, checkpoint layout)
    # KDA, MLA, KDA, MLA from the checkpoint's 1-indexed lists; direct q; first layer dense; 2 groups, top 1
    "direct-q-groups": (dict(SMALL, num_hidden_layers=4, q_lora_rank=None, num_experts=4, num_experts_per_token=2,
                             num_expert_group=2, topk_group=1, first_k_dense_replace=1,
                             linear_attn_config={"head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 3,
                                                 "full_attn_layers": [2, 4], "kda_layers": [1, 3]}), "saved"),
    # MLA first with q_lora; sparse, dense, sparse; 3 groups of 2, top 2; two shared experts; no renormalising
    "q-lora-layer-types": (dict(SMALL, num_hidden_layers=3, q_lora_rank=8, num_experts=6, num_experts_per_token=2,
                                num_expert_group=3, topk_group=2, num_shared_experts=2, moe_renormalize=False,
                                routed_scaling_factor=1.5, linear_num_heads=3, linear_head_dim=6,
                                linear_conv_kernel_dim=4, layer_types=["full_attention", "linear_attention",
                                                                       "linear_attention"],
                                mlp_layer_types=["sparse", "dense", "sparse"]), "saved"),
    # the first twin's shapes in the module layout: conv1d, forget_gate.*, mlp.experts.gate_up_proj / down_proj
    "module-layout": (dict(SMALL, num_hidden_layers=4, q_lora_rank=None, num_experts=4, num_experts_per_token=2,
                           num_expert_group=2, topk_group=1,
                           linear_attn_config={"head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 3,
                                               "full_attn_layers": [2, 4], "kda_layers": [1, 3]}), "module"),
}


def build_case(name: str, folder):
    settings, layout = CASES[name]
    config = transformers.KimiLinearConfig(**settings)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=sorted(CASES).index(name), norm_centre=1.0)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    if layout == "saved":  # save_pretrained writes the original layout (block_sparse_moe, per-expert w1/w2/w3)
        model.save_pretrained(folder)
        return model, folder
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    config.to_json_file(str(folder / "config.json"))
    model.generation_config.to_json_file(str(folder / "generation_config.json"))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    for key, value in model.state_dict().items():  # transformers loads this layout as it is
        assert torch.equal(loaded.state_dict()[key], value), key
    return loaded, folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return built_once(build_case, tmp_path_factory)


def assert_logits_match(model, graph) -> None:
    """A left-padded batch: each row equals the row run alone, and transformers' padded batch."""
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    got = irc_logits(graph, ids, mask, positions)
    assert relative_error(got[real], unpadded_logits(model, ids, mask)[real]) <= TOLERANCE
    assert relative_error(got[real], hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE


@needs_torch
@pytest.mark.parametrize("name", ["direct-q-groups", "q-lora-layer-types"])
def test_interpreter_matches_transformers(models, hf_greedy, name):  # noqa: F811
    model, folder = models(name)
    graph = load_spec(folder)
    assert "position_ids" not in {v.name for v in graph.inputs}  # no layer rotates anything
    assert_logits_match(model, graph)
    ids, _, _ = prompts()
    tokens, _ = generate(graph, ids[0].tolist(), NEW_TOKENS)
    assert tokens == hf_greedy(name)[0].tolist()


@needs_torch
def test_the_module_layout_is_read_as_transformers_reads_it(models):
    model, folder = models("module-layout")
    graph = load_spec(folder)
    sources = {name: repr(p.data.source) for name, p in graph.params.items()}
    assert sources["layers.0.ssm.conv"] == "model.layers.0.self_attn.conv1d.weight"
    assert sources["layers.0.ssm.A_log"] == "model.layers.0.self_attn.forget_gate.A_log"
    assert sources["layers.1.moe.w_up"] == "model.layers.1.mlp.experts.gate_up_proj[second half]"
    assert sources["layers.0.mlp.w_gate"] == "model.layers.0.mlp.gate_proj.weight"
    assert_logits_match(model, graph)
    saved = load_spec(models("direct-q-groups")[1])
    assert repr(saved.params["layers.0.ssm.conv"].data.source).startswith("join(model.layers.0.self_attn.q_conv1d")


@needs_torch
@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
@pytest.mark.parametrize("name", ["direct-q-groups", "q-lora-layer-types"])
def test_onnx_matches_transformers(models, hf_greedy, tmp_path, name, target):  # noqa: F811
    """Both rows through ONNX Runtime, irc's greedy loop feeding every state and cache back."""
    from backends.onnx import emit

    model, folder = models(name)
    graph = load_spec(folder)
    path = str(tmp_path / "model.onnx")
    emitted = emit.emit_model(graph, path, target=target, context=64)
    assert emitted.genai_config is None and "different cache layouts" in emitted.genai_note
    assert_ort_run_matches(path, graph, unpadded_logits(model, *prompts()[:2]), hf_greedy(name))


@needs_torch
@pytest.mark.parametrize("pipeline", ["mla-absorb{cache=halves}", "mla-absorb{cache=halves,fold_weights=true}"])
def test_genai_runs_the_absorbed_halved_caches(models, hf_greedy, tmp_path, pipeline):  # noqa: F811
    """The un-absorbed MLA caches (keys nope + rope wide, values v) are two widths genai
    cannot allocate; absorbed with halved latent caches, onnxruntime-genai finds those beside
    the KDA layers' conv and recurrent states and generates transformers' tokens."""
    import passes  # noqa: F401  (registers the passes)
    from backends.onnx import emit
    from irc.passmanager import PassManager, parse_pipeline

    og = pytest.importorskip("onnxruntime_genai")
    _, folder = models("q-lora-layer-types")
    graph = load_spec(folder)
    PassManager(parse_pipeline(pipeline)).run(graph)
    emitted = emit.emit_model(graph, str(tmp_path / "model.onnx"), target="onnx-ort", context=64)
    assert emitted.genai_config, emitted.genai_note
    ids, _, _ = prompts()
    assert genai_greedy(og, tmp_path, ids[0], NEW_TOKENS) == hf_greedy("q-lora-layer-types")[0].tolist()


@needs_torch
def test_show_prints_the_state_and_kv_bytes(models, capsys):
    _, folder = models("direct-q-groups")
    assert main(["show", str(folder)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    # two KDA layers: conv [3·2·8, 2] and recurrent [2, 8, 8] f32; two MLA layers: [2 heads, 8 + 4] keys, [2, 6] values
    assert "recurrent state/sequence 1,792 bytes (192 conv + 256 recurrent elements" in shown, shown
    assert f"KV cache @ 4,096 tokens {2 * 2 * (12 + 6) * 4 * 4096:,} bytes" in shown, shown
    assert "MLA latent cache/token 96 bytes (12 elements/layer)" in shown, shown


# ---- refusals (no transformers needed) --------------------------------------------------------

BASE = {"model_type": "kimi_linear", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
        "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 48, "moe_intermediate_size": 16,
        "kv_lora_rank": 8, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8, "v_head_dim": 6, "num_experts": 4,
        "num_experts_per_token": 2, "linear_attn_config": {"head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 3,
                                                           "full_attn_layers": [2, 4], "kda_layers": [1, 3]}}
LINEAR = BASE["linear_attn_config"]
REFUSALS = {  # name: (changes, the key named, a fragment of the message)
    "unknown-layer-kind": ({"layer_types": ["linear_attention", "sliding_attention", "linear_attention",
                                            "full_attention"]}, "layer_types", '"sliding_attention" is not supported'),
    "layer-types-too-short": ({"layer_types": ["linear_attention", "full_attention"]}, "layer_types",
                              "has 2 entries for 4 layers"),
    "a-layer-in-neither-list": ({"linear_attn_config": {**LINEAR, "kda_layers": [1]}}, "linear_attn_config",
                                "layer 3 (1-indexed) is in neither"),
    "a-layer-past-the-end": ({"linear_attn_config": {**LINEAR, "full_attn_layers": [2, 5]}},
                             "linear_attn_config.full_attn_layers", "layer 5 is outside 1..4"),
    "bad-kda-heads": ({"linear_attn_config": {**LINEAR, "num_heads": 0}}, "linear_attn_config.num_heads",
                      "expected a positive integer"),
    "mlp-kind": ({"mlp_layer_types": ["dense", "sparse", "moe", "sparse"]}, "mlp_layer_types",
                 '"moe" is not supported'),
    "kv-heads": ({"num_key_value_heads": 1}, "num_key_value_heads", "1 kv heads for 2 attention heads"),
    "attention-bias": ({"attention_bias": True}, "attention_bias", "true is not supported"),
    "activation": ({"hidden_act": "gelu"}, "hidden_act", '"gelu" is not supported'),
    "moe-layer-freq": ({"moe_layer_freq": 2}, "moe_layer_freq", "2 is not supported"),
    "router-activation": ({"moe_router_activation_func": "softmax"}, "moe_router_activation_func",
                          '"softmax" is not supported'),
    "top-k-above-experts": ({"num_experts_per_token": 5}, "num_experts_per_token", "top_k 5 exceeds 4 experts"),
    "groups": ({"num_expert_group": 3}, "num_expert_group", "4 experts (num_experts) do not split into 3 groups"),
}


def folder_with(tmp_path, config: dict):
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    return tmp_path


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_a_bad_setting_is_one_error_naming_config_json_and_the_key(tmp_path, name):
    changes, key, fragment = REFUSALS[name]
    message = refused(tmp_path, key, fragment, {**BASE, **changes})
    assert f'"{key.split(".")[-1]}"' in pointed_line(tmp_path, message)


def test_the_full_size_defaults_count_what_transformers_builds(tmp_path):
    """KimiLinearConfig's defaults (Kimi-Linear-48B-A3B): 49,133,081,120 parameters, the count
    of transformers 5.24's KimiLinearForCausalLM built on the meta device (e_score_correction_bias
    included); six MLA layers of 32 heads caching 192 + 128 bf16 values per token."""
    from irc.analysis import analyze

    summary = analyze(load_spec(folder_with(tmp_path, {"model_type": "kimi_linear", "torch_dtype": "bfloat16"})))
    assert summary["params_total"] == 49_133_081_120
    assert summary["kv_cache_bytes_per_token"] == 6 * 32 * (192 + 128) * 2


def test_the_default_layer_kinds_follow_transformers(tmp_path):
    """Without layer lists: every layer i > 0 with i % 4 == 0 MLA; the first layer dense."""
    config = {k: v for k, v in BASE.items() if k != "linear_attn_config"}
    graph = load_spec(folder_with(tmp_path, {**config, "num_hidden_layers": 6}))
    assert graph.meta["layer_kinds"] == ["kimi_delta"] * 4 + ["attention", "kimi_delta"]
    assert graph.meta["moe"]["layers"] == [1, 2, 3, 4, 5]
    assert graph.meta["mla"]["q_lora_rank"] is None and graph.meta["rope"] is None


def test_the_cli_refuses_with_exit_2_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    folder = folder_with(tmp_path / "model", {**BASE, "num_key_value_heads": 1})
    out = tmp_path / "out"
    assert main(["compile", str(folder), "--target", "onnx", "-o", str(out / "model.onnx"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "num_key_value_heads" in err and "config.json" in err and len(err.strip().splitlines()) <= 2, err
    assert not out.exists()
