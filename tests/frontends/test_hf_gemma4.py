"""Gemma-4 (gemma4_text, and the multimodal gemma4's text model) from Hugging Face against
transformers 5.24: tiny random twins (per-layer head dims, k = v full layers, KV-shared
layers with double-wide MLPs, per-layer embeddings, proportional RoPE, v norms, layer
scalars, soft-capped logits, the MoE beside the MLP) — the ``Gemma4ForCausalLM`` layout and
the ``Gemma4ForConditionalGeneration`` one — rows of the twin harness (test_hf_twins.py: the
left-padded batch and each row alone, 16 greedy tokens, both ONNX targets where genai cannot
allocate the caches, onnxruntime-genai where it can); ``irc run`` where genai cannot, the static onnx-npu form and the
Triton target in its interpreter; the full-size structures' parameter counts; config.json
mistakes."""
import json

import numpy as np
import pytest

from frontends import load_spec
from irc.errors import SpecError
from tests.frontends.test_hf_models import (NEW_TOKENS, TOLERANCE, hf_batch_greedy, hf_logits,  # noqa: F401
                                            irc_logits, prompts, relative_error)
from tests.frontends.twins import GENAI, GREEDY, ROWS, causal_lm, family, models_fixture

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SLIDING, FULL = "sliding_attention", "full_attention"
SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, global_head_dim=16, sliding_window=4, max_position_embeddings=64,
             hidden_size_per_layer_input=8, vocab_size_per_layer_input=128, pad_token_id=0, bos_token_id=2,
             eos_token_id=1, layer_types=[SLIDING, FULL] * 2)
CASES = {  # name: (config class, overrides of SMALL); Gemma4Config: the multimodal layout
    # E2B/E4B-like: per-layer embeddings, the last two layers sharing the caches of layers
    # 2 (sliding) and 3 (full), double-wide MLPs there, a final soft-cap
    "gemma4-ple-kv-shared-wide": ("Gemma4TextConfig", dict(
        num_hidden_layers=6, layer_types=[SLIDING, FULL] * 3, num_kv_shared_layers=2, use_double_wide_mlp=True,
        final_logit_softcapping=5.0)),
    # 31B-like: full layers with k = v and one kv head, no per-layer embeddings, exact GELU,
    # untied, proportional RoPE over half the head with a factor, the default 5:1 pattern
    "gemma4-k-eq-v-untied": ("Gemma4TextConfig", dict(
        num_hidden_layers=6, layer_types=None, attention_k_eq_v=True, num_global_key_value_heads=1,
        hidden_size_per_layer_input=0, hidden_activation="gelu", tie_word_embeddings=False,
        rope_parameters={SLIDING: {"rope_type": "default", "rope_theta": 100.0},
                         FULL: {"rope_type": "proportional", "rope_theta": 1e4, "partial_rotary_factor": 0.5,
                                "factor": 2.0}})),
    # 26B-A4B-like: a MoE beside every MLP (router scale, per-expert scale), k = v full layers
    "gemma4-moe-k-eq-v": ("Gemma4TextConfig", dict(
        enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16, attention_k_eq_v=True,
        num_global_key_value_heads=1, hidden_size_per_layer_input=0)),
    # the multimodal checkpoint (text model under model.language_model.), KV sharing and k = v
    "gemma4-multimodal": ("Gemma4Config", dict(attention_k_eq_v=True, num_global_key_value_heads=1,
                                               num_kv_shared_layers=2)),
    # Gemma4UnifiedTextConfig: the same decoder without per-layer embeddings or MoE
    "gemma4-unified-text": ("Gemma4UnifiedTextConfig", dict(attention_k_eq_v=True, num_global_key_value_heads=1,
                                                            num_kv_shared_layers=2, use_double_wide_mlp=True)),
    # one cache layout on every layer (global_head_dim = head_dim): what genai can allocate
    "gemma4-uniform-kv-shared": ("Gemma4TextConfig", dict(global_head_dim=8, num_kv_shared_layers=2)),
}


def make(class_name: str, text: dict):
    text = {k: v for k, v in text.items() if v is not None}
    if class_name == "Gemma4Config":
        config = transformers.Gemma4Config(text_config=text, vision_config=None, audio_config=None)
        return transformers.Gemma4ForConditionalGeneration(config).eval()
    if class_name == "Gemma4UnifiedTextConfig":
        text = {k: v for k, v in text.items() if "per_layer_input" not in k}
    return causal_lm(class_name, text)


def sharpen(model, name: str) -> None:
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for key, buffer in model.named_buffers():
            if key.endswith("layer_scalar"):  # a checkpoint buffer, ones by default
                buffer.copy_(0.5 + torch.rand(buffer.shape, generator=generator))
        for key, p in model.named_parameters():  # a decisive router, expert scales of order one
            if key.endswith("router.scale"):
                p.copy_(3.0 + torch.randn(p.shape, generator=generator))
            elif key.endswith("per_expert_scale"):
                p.copy_(0.5 + torch.rand(p.shape, generator=generator))


# ONNX where the cache layouts differ (genai refuses them), genai where they are one (KV-shared
# layers included: they have no cache for genai to allocate, so its config counts the 2 of 4
# layers that hold one, as for Gemma-3n)
TWINS = family(None, SMALL, CASES, make=make, tweak=sharpen, genai_refused="different cache layouts", rows={
    "gemma4-unified-text": dict(checks=(ROWS, GREEDY)),
    "gemma4-uniform-kv-shared": dict(checks=(ROWS, GREEDY, GENAI), genai_layers=2)})


models = models_fixture(TWINS)


def test_the_twins_exercise_the_gemma4_parts(models):
    """The features are live: the longer prompt outruns the window, shared layers have no
    k/v weights and no cache, full layers their own head dim, the scalars are not one."""
    model, folder = models("gemma4-ple-kv-shared-wide")
    ids, mask, _ = prompts()
    assert mask.sum(axis=1).max() > SMALL["sliding_window"]
    assert not hasattr(model.model.layers[5].self_attn, "k_proj")
    assert model.model.layers[5].mlp.gate_proj.out_features == 2 * SMALL["intermediate_size"]
    graph = load_spec(folder)
    caches = {v.name: v.shape for v in graph.inputs if v.name.startswith("past_key_values.")}
    assert sorted(caches) == [f"past_key_values.{i}.{kv}" for i in range(4) for kv in ("key", "value")]
    assert caches["past_key_values.1.key"][1:] == (2, "P", 16) and caches["past_key_values.0.key"][3] == 8
    attention = [n for n in graph.nodes if n.op == "attention"]
    assert [n.inputs[4].name for n in attention][4:] == ["past_key_values.2.key", "past_key_values.3.key"]
    scalars = [float(p) for p in model.model.layers[0].layer_scalar]
    assert scalars != [1.0]


def irc_run(folder, *options) -> list:
    """``irc run FOLDER`` on the first prompt: its tokens."""
    import contextlib
    import io

    from irc_cli import main

    prompt = prompts()[0][0].tolist()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["run", str(folder), "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens",
                     str(NEW_TOKENS), "--json", *options]) == 0
    return json.loads(printed.getvalue())["tokens"]


def test_irc_run_generates_where_genai_cannot(models, hf_batch_greedy, tmp_path):
    """Full layers with their own head dim: no genai_config.json (genai gives every cache
    one head size), and ``irc run`` on the compiled folder gives transformers' tokens."""
    pytest.importorskip("onnxruntime")
    from irc_cli import main

    name = "gemma4-ple-kv-shared-wide"
    _, folder = models(name)
    out = tmp_path / "out"
    assert main(["compile", str(folder), "--target", "onnx-ort", "-o", str(out / "model.onnx")]) == 0
    assert not (out / "genai_config.json").exists()
    assert irc_run(out, "--engine", "ort") == hf_batch_greedy(name)[0].tolist()


@pytest.mark.parametrize("name", ["gemma4-moe-k-eq-v", "gemma4-ple-kv-shared-wide"])
def test_onnx_npu_static_graph_matches_the_reference(models, hf_batch_greedy, tmp_path, name):
    """The onnx-npu form (static shapes, a fixed-slot cache, chunked prefill) on ONNX
    Runtime's CPU provider: f32 gives transformers' 16 greedy tokens and the reference's
    logits within 1e-4 (teacher-forced); fp16 is held to its precision, the median step
    within 1e-2 (measured 2-4e-3; single steps reach 2e-2, and 0.4 where fp16 flips a
    near-tied expert choice of the MoE twin)."""
    pytest.importorskip("onnxruntime")
    from backends.onnx_npu.host import generate, prefill_logits
    from irc.evaluate import StreamingInterpreter
    from irc.evaluate import prefill_logits as reference_prefill
    from tests.frontends.test_hf_gpt_oss_targets import compile_npu

    _, folder = models(name)
    prompt = prompts()[0][0].tolist()
    expected = hf_batch_greedy(name)[0].tolist()
    f32 = compile_npu(folder, tmp_path / "f32", "--precision", "f32")
    assert generate(f32, prompt, NEW_TOKENS) == expected
    ids = prompt + expected[:-1]
    want = reference_prefill(StreamingInterpreter(load_spec(folder), 0), ids)[len(prompt) - 1:]
    for precision, folder_ in (("f32", f32), ("fp16", compile_npu(folder, tmp_path / "fp16"))):
        got = prefill_logits(folder_, ids)[len(prompt) - 1:].astype(np.float32)
        errors = [relative_error(got[step], want[step]) for step in range(NEW_TOKENS)]
        if precision == "f32":
            assert max(errors) <= TOLERANCE, errors
        else:
            assert np.median(errors) < 1e-2, errors


def test_triton_twin_matches_the_reference_and_transformers(models, hf_batch_greedy, tmp_path):
    """``--target triton``'s default pipeline, run by Triton's interpreter on CPU, on the
    KV-shared twin (a shared layer's kernel reads its producer's cache): prefill logits within
    1e-4 of transformers on the left-padded batch, 16 greedy steps its tokens."""
    from backends.triton.interpreter import use_interpreter
    use_interpreter()  # before triton is imported: kernels run on CPU tensors
    pytest.importorskip("triton")
    import passes  # noqa: F401  (registers the passes)
    from backends.onnx import runtime
    from backends.triton import DEFAULT_PIPELINE
    from backends.triton.emit import emit_module, load_module
    from irc.passmanager import PassManager, parse_pipeline

    name = "gemma4-ple-kv-shared-wide"
    model, folder = models(name)
    graph = load_spec(folder)
    PassManager(parse_pipeline(DEFAULT_PIPELINE)).run(graph)
    path = tmp_path / "gemma4_tt.py"
    emit_module(graph, str(path), source=name)
    module = load_module(str(path))
    weights = module.load_weights()

    def engine(feeds):
        out = module.forward(weights, **feeds)
        return {k: v.cpu().float().numpy() if v.is_floating_point() else v.cpu().numpy() for k, v in out.items()}

    ids, mask, positions = prompts()
    result = runtime.greedy(engine, graph, [ids[0].tolist(), ids[1][mask[1] == 1].tolist()], NEW_TOKENS)
    real = mask.astype(bool)
    got = np.asarray(result["prefill"]["logits"])[real]
    assert relative_error(got, hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE
    np.testing.assert_array_equal(result["tokens"], hf_batch_greedy(name))


def test_moe_sort_keeps_the_moe_twin_exact(models):
    """``moe-sort`` (token slots sorted by expert, grouped GEMMs) on the folded MoE: the
    reference interpreter's logits before and after agree within 1e-5."""
    import passes  # noqa: F401  (registers the passes)
    from irc.passmanager import PassManager, parse_pipeline

    _, folder = models("gemma4-moe-k-eq-v")
    graph = load_spec(folder)
    ids, mask, positions = prompts()
    before = irc_logits(graph, ids, mask, positions)
    PassManager(parse_pipeline("moe-sort")).run(graph)
    assert "moe" not in {n.op for n in graph.nodes}
    real = mask.astype(bool)
    assert relative_error(irc_logits(graph, ids, mask, positions)[real], before[real]) <= 1e-5


def test_onnx_output_is_byte_identical(models, tmp_path):
    pytest.importorskip("onnxruntime")
    from backends.onnx import emit

    _, folder = models("gemma4-ple-kv-shared-wide")
    for run in ("a", "b"):
        emit.emit_model(load_spec(folder), str(tmp_path / run / "model.onnx"), target="onnx-ort", genai=False,
                        context=64)
    assert (tmp_path / "a" / "model.onnx").read_bytes() == (tmp_path / "b" / "model.onnx").read_bytes()


def test_proportional_rope_frequencies_are_transformers(models):
    """irc's ``proportional`` scaling gives transformers' inverse frequencies."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from irc.ops.rope import rope_inv_freq

    model, _ = models("gemma4-k-eq-v-untied")
    config = model.config.per_layer_config[FULL]
    want, factor = ROPE_INIT_FUNCTIONS["proportional"](config, layer_type=FULL)
    got, irc_factor = rope_inv_freq(16, 1e4, {"kind": "proportional", "factor": 2.0, "partial_rotary_factor": 0.5})
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)
    assert (got[4:] == 0).all() and (got[:4] > 0).all() and irc_factor == factor == 1.0


@pytest.mark.parametrize("overrides, layers", [
    ({}, 30),  # transformers' defaults: per-layer embeddings, 512-wide full layers
    ({"attention_k_eq_v": True, "num_global_key_value_heads": 2, "hidden_size_per_layer_input": 0,
      "num_kv_shared_layers": 0}, 30),
    ({"num_hidden_layers": 35, "num_kv_shared_layers": 20, "use_double_wide_mlp": True}, 35),
    ({"enable_moe_block": True, "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704,
      "attention_k_eq_v": True, "num_global_key_value_heads": 2, "hidden_size_per_layer_input": 0}, 30),
])
def test_full_size_parameter_count_equals_transformers(tmp_path, overrides, layers):
    """A full-size config on the meta device: irc counts what transformers holds, its
    parameters plus the layer_scalar buffers (one number a layer) the checkpoint carries;
    with the MoE, less the factors folded into the expert and router weights (the router's
    scale [d], the per-expert scale [E], pre_feedforward_layernorm_2 [d] a layer)."""
    from frontends.hf import load_hf
    from irc.analysis import analyze

    config = transformers.Gemma4TextConfig(**overrides)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    want = sum(p.numel() for p in model.parameters()) + layers
    if config.enable_moe_block:
        want -= layers * (2 * config.hidden_size + config.num_experts)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    stats = analyze(load_hf(tmp_path, weights=False))
    assert stats["params_total"] == want
    if config.enable_moe_block:  # 8 of 128 experts a token
        expert = 3 * config.hidden_size * config.moe_intermediate_size
        assert stats["params_total"] - stats["params_active"] == layers * (128 - 8) * expert


def test_global_head_dim_keys_read_as_per_layer_config(models, tmp_path):
    """The released configs' ``global_head_dim`` / ``num_global_key_value_heads`` and the
    ``per_layer_config`` transformers 5.24 saves describe the same model."""
    from frontends.hf import load_hf

    _, folder = models("gemma4-moe-k-eq-v")
    config = json.loads((folder / "config.json").read_text())
    assert config.pop("per_layer_config") == {"1": {"head_dim": 16, "num_key_value_heads": 1},
                                              "3": {"head_dim": 16, "num_key_value_heads": 1}}
    config.update(global_head_dim=16, num_global_key_value_heads=1)
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    saved, written = load_hf(folder, weights=False), load_hf(tmp_path, weights=False)
    assert {k: p.shape for k, p in saved.params.items()} == {k: p.shape for k, p in written.params.items()}
    assert [(v.name, v.shape) for v in saved.inputs] == [(v.name, v.shape) for v in written.inputs]


def test_the_last_layer_is_full_as_transformers_makes_it(tmp_path):
    from frontends.hf import load_hf

    types = [FULL, SLIDING, FULL, SLIDING]
    assert transformers.Gemma4TextConfig(**{**SMALL, "layer_types": types}).layer_types[-1] == FULL
    (tmp_path / "config.json").write_text(json.dumps({**TEXT, "layer_types": types}))
    graph = load_hf(tmp_path, weights=False)
    assert [n.attrs["window"] for n in graph.nodes if n.op == "attention"] == [None, 4, None, None]
    assert graph.params["layers.3.attn.wk"].shape == (2 * 16, 32)


TEXT = {"model_type": "gemma4_text", **{k: v for k, v in SMALL.items() if k not in ("pad_token_id",)}}
BAD = [  # (config.json, the key named, a fragment of the message)
    ({**TEXT, "layer_types": [SLIDING, FULL]}, "layer_types", "2 entries for 4"),
    ({**TEXT, "layer_types": [SLIDING, "chunked_attention", SLIDING, FULL]}, "layer_types",
     '"chunked_attention" is not supported'),
    ({**TEXT, "num_kv_shared_layers": 4}, "num_kv_shared_layers", "no layer computes"),
    ({**TEXT, "layer_types": [SLIDING, SLIDING, FULL, FULL], "num_kv_shared_layers": 2}, "num_kv_shared_layers",
     "the first 2 layers have none"),
    ({**TEXT, "per_layer_config": {"1": {"intermediate_size": 64}}}, "per_layer_config.1.intermediate_size",
     "is not supported"),
    ({**TEXT, "per_layer_config": {"1": {"head_dim": 16}}}, "per_layer_config", "another full_attention layer"),
    ({**TEXT, "per_layer_config": {"7": {"head_dim": 16}}}, "per_layer_config.7", "below 4"),
    ({**TEXT, "attention_k_eq_v": True, "num_global_key_value_heads": 3}, "num_global_key_value_heads",
     "not divisible by 3"),
    ({**TEXT, "enable_moe_block": True, "num_experts": 4, "top_k_experts": 5, "moe_intermediate_size": 8},
     "top_k_experts", "exceeds 4 experts"),
    ({**TEXT, "enable_moe_block": True, "top_k_experts": 2, "moe_intermediate_size": 8}, "num_experts",
     "missing: enable_moe_block needs it"),
    ({**TEXT, "use_bidirectional_attention": "all"}, "use_bidirectional_attention", '"all" is not supported'),
    ({**TEXT, "hidden_activation": "silu"}, "hidden_activation", '"silu" is not supported'),
    ({**TEXT, "rope_parameters": {SLIDING: {"rope_type": "default", "rope_theta": 1e4}}},
     "rope_parameters.full_attention", "missing"),
    ({**TEXT, "rope_parameters": {SLIDING: {"rope_type": "yarn", "factor": 2.0}, FULL: {"rope_type": "default"}}},
     "rope_parameters.sliding_attention.rope_type", '"yarn" is not supported'),
    ({**TEXT, "rope_parameters": {SLIDING: {"rope_type": "default", "partial_rotary_factor": 0.5},
                                  FULL: {"rope_type": "default"}}},
     "rope_parameters.sliding_attention.partial_rotary_factor", "ignores it"),
    ({"model_type": "gemma4"}, "text_config", "expected the text model's settings"),
    ({"model_type": "gemma4", "text_config": {**TEXT, "model_type": "gemma3_text"}}, "text_config.model_type",
     '"gemma3_text" is not supported'),
]


@pytest.mark.parametrize("config, key, fragment", BAD)
def test_bad_configs_name_the_key(tmp_path, config, key, fragment):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2))
    with pytest.raises(SpecError) as err:
        load_spec(tmp_path)
    message = str(err.value)
    assert message.startswith(f"{path}") and f"{key}: " in message and fragment in message, message
    if f'"{key.split(".")[0]}"' in path.read_text():  # the message points at the line of the key
        line = path.read_text().splitlines()[int(message.split("config.json:")[1].split(":")[0]) - 1]
        assert any(f'"{part}"' in line for part in key.split(".")), (message, line)


def test_a_bad_config_exits_2_and_writes_nothing(tmp_path, capsys):
    from irc_cli import main

    (tmp_path / "config.json").write_text(json.dumps({**TEXT, "num_kv_shared_layers": 4}, indent=2))
    out = tmp_path / "out"
    assert main(["compile", str(tmp_path), "--target", "onnx", "-o", str(out / "model.onnx")]) == 2
    assert "config.json:" in capsys.readouterr().err and not out.exists()


def test_kv_sharing_is_one_mechanism_with_the_cache_rule_genai_reads():
    """``frontends.dsl_gemma_shared``'s KV sharing, as both Gemmas use it: a layer with a
    source has no cache input or present output and attends over its source's past cache;
    genai's config counts the layers with a cache; a source that computes no K/V is refused,
    naming num_kv_shared_layers."""
    from backends.onnx.genai import decoder_layers
    from frontends.dsl import Model, Rope
    from frontends.dsl_gemma_shared import KVSharing, attention

    def build(sources):
        m = Model("kv-sharing", vocab=16, d_model=8)
        sharing = KVSharing(sources)
        x = m.embed(m.input_ids())
        for layer in m.layers(len(sources)):
            x = x + attention(layer, x, 2, 1, 4, Rope(base=1e4), None, 1e-6, sharing)
        m.logits(x)
        return m.graph

    graph = build([None, None, 0])
    assert [v.name for v in graph.inputs if v.name.startswith("past_key_values.")] == [
        f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
    assert [v.name for v in graph.outputs][1:] == [f"present.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
    attention_nodes = [n for n in graph.nodes if n.op == "attention"]
    assert [n.inputs[4].name for n in attention_nodes] == [f"past_key_values.{i}.key" for i in (0, 1, 0)]
    assert attention_nodes[2].inputs[1] is attention_nodes[0].inputs[1]  # layer 0's new keys
    assert "layers.2.attn.wk" not in graph.params and decoder_layers(graph)[0] == 2
    with pytest.raises(SpecError, match="num_kv_shared_layers: layer 0 reuses the K/V of layer 1, which computes"):
        build([1, None])
