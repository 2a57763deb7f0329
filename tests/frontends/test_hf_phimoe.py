"""Phi-3.5-MoE (``phimoe``) from Hugging Face against transformers 5.24: tiny random models
(LayerNorms with bias, q/k/v/o and LM-head biases, a window, the sparsemixer-routed MoE,
default RoPE and Phi-MoE's reading of LongRoPE), rows of the twin harness (test_hf_twins.py:
the left-padded batch and each row alone, 16 greedy tokens, both ONNX targets and
onnxruntime-genai); the routing is live; onnx-ort's standard-op routing; moe-sort on a twin;
the YAML and DSL forms; the full-size parameter count; config.json mistakes."""
import json

import numpy as np
import pytest

from frontends import load_spec
from irc.errors import SpecError
from tests.frontends.refusals import pointed_line, refused
from tests.frontends.test_hf_models import TOLERANCE, hf_logits, irc_logits, prompts, relative_error
from tests.frontends.twins import CHECKS, GENAI, family, models_fixture

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
             pad_token_id=0)
# original_max_position_embeddings 8: the prompts and the 16 steps run past it; the short and
# long factors differ, and the mscale is not LongRoPE's computed attention factor
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.5, 2.0, 3.0],
            "long_factor": [2.0, 4.0, 8.0, 16.0], "original_max_position_embeddings": 8, "short_mscale": 1.3,
            "long_mscale": 1.3}
CASES = {  # name: overrides of SMALL
    "phimoe-default-mixer": dict(),
    "phimoe-biases-window-wide-mixer": dict(attention_bias=True, lm_head_bias=True, sliding_window=4,
                                            router_jitter_noise=0.4, num_local_experts=6),
    "phimoe-longrope-biases": dict(attention_bias=True, lm_head_bias=True, router_jitter_noise=0.1,
                                   rope_parameters=LONGROPE),
}

TWINS = family("PhimoeConfig", SMALL, CASES, rows={"phimoe-biases-window-wide-mixer": dict(checks=CHECKS + (GENAI,))})


models = models_fixture(TWINS)


def router_logits(model, ids, mask) -> np.ndarray:
    """Every layer's router logits [L * N, E] on the batch."""
    seen = []
    hooks = [layer.mlp.router.register_forward_hook(lambda m, args, out: seen.append(out[0]))
             for layer in model.model.layers]
    with torch.no_grad():
        model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
    for hook in hooks:
        hook.remove()
    return torch.cat(seen).numpy()


def test_the_twins_exercise_the_mixers_mask_and_softmax(models):
    """The routing is live: with the wide mixer some tokens keep other logits beside the
    maximum (a first weight below 1) and some have logits masked (a first weight above the
    plain softmax's); the default mixer (0.01, Phi-3.5-MoE's) masks every other logit on
    these unit-scale logits, so its weights are 1. The long prompt outruns the window."""
    from irc.ops.moe import sparsemixer

    ids, mask, _ = prompts()
    assert mask.sum(axis=1).max() > CASES["phimoe-biases-window-wide-mixer"]["sliding_window"]
    for name, eps in (("phimoe-biases-window-wide-mixer", 0.4), ("phimoe-default-mixer", 0.01)):
        logits = router_logits(models(name)[0], ids, mask)
        chosen, weights = sparsemixer(logits, eps)
        softmax = np.exp(logits - logits.max(-1, keepdims=True))
        softmax /= softmax.sum(-1, keepdims=True)
        plain = np.take_along_axis(softmax, chosen[:, :1], -1)[:, 0]
        assert (weights[:, 0] > plain + 1e-6).any(), name
        assert (weights[:, 0] < 1 - 1e-6).any() == (eps > 0.01), name


def test_onnx_ort_routes_in_standard_ops_not_com_microsoft_moe(models, tmp_path):
    """ORT 1.32's MoE ignores ``use_sparse_mixer`` on CPU (tests/ops/test_moe_sparsemixer.py),
    so onnx-ort writes the routing and experts in standard ops: two ArgMax rounds a layer."""
    import onnx

    from backends.onnx import emit

    _, folder = models("phimoe-default-mixer")
    path = tmp_path / "model.onnx"
    emit.emit_model(load_spec(folder), str(path), target="onnx-ort", genai=False, context=64)
    kinds = [node.op_type for node in onnx.load(str(path)).graph.node]
    assert "MoE" not in kinds and kinds.count("ArgMax") == 2 * SMALL["num_hidden_layers"]


def test_moe_sort_on_the_twin_equals_the_reference(models):
    """moe-sort lowers every sparsemixer MoE (moe_route keeps the routing) and the graph
    still gives the reference's logits, which are transformers'."""
    from irc.check import compare_outputs
    from irc.testing import apply_pass
    from passes.moe_sort import MoeSort

    model, folder = models("phimoe-biases-window-wide-mixer")
    graph = load_spec(folder)
    after, changed = apply_pass(MoeSort(), graph)
    assert changed and not any(n.op == "moe" for n in after.nodes)
    routes = [n for n in after.nodes if n.op == "moe_route"]
    assert len(routes) == SMALL["num_hidden_layers"]
    assert all(n.attrs["scoring"] == "sparsemixer" and n.attrs["jitter_eps"] == 0.4 for n in routes)
    ids, mask, positions = prompts()
    real = mask.astype(bool)
    got = irc_logits(after, ids, mask, positions)
    assert relative_error(got[real], hf_logits(model, ids, mask, positions)[real]) <= TOLERANCE
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    feeds.update({v.name: np.zeros((2, 2, 0, 8), np.float32) for v in graph.inputs if v.name.startswith("past")})
    assert compare_outputs(graph, after, feeds) <= 1e-5


# ---- the YAML and DSL forms ---------------------------------------------------------------

TINY_CONFIG = {"model_type": "phimoe", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 32, "num_local_experts": 4,
               "attention_bias": True, "lm_head_bias": True, "sliding_window": 8, "rope_theta": 10000.0}


def without_meta(graph) -> str:
    from irc.printer import print_graph

    return "\n".join(line for line in print_graph(graph).splitlines() if not line.lstrip().startswith("meta "))


def test_yaml_dsl_and_config_json_build_one_graph(tmp_path):
    """examples/tiny-phi-3.5-moe.yaml (``router: sparsemixer``, ``jitter_eps``), its DSL twin
    (``scoring="sparsemixer"``) and the matching config.json give the same graph, which
    generates."""
    from pathlib import Path

    from frontends.hf import load_hf
    from irc.interpreter import generate

    examples = Path(__file__).resolve().parents[2] / "examples"
    from_yaml = load_spec(examples / "tiny-phi-3.5-moe.yaml")
    assert without_meta(load_spec(examples / "tiny_phi_3_5_moe_dsl.py")) == without_meta(from_yaml)
    folder = tmp_path / from_yaml.name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
    assert without_meta(load_hf(folder, weights=False)) == without_meta(from_yaml)
    (moe,) = {(n.attrs["scoring"], n.attrs["jitter_eps"], n.attrs["norm_topk_prob"])
              for n in from_yaml.nodes if n.op == "moe"}
    assert moe == ("sparsemixer", 0.01, False)
    tokens, _ = generate(from_yaml, [1, 2, 3], 4)
    assert len(tokens) == 4 and all(0 <= t < 256 for t in tokens)


@pytest.mark.parametrize("change, key, fragment", [
    (("router: sparsemixer", "router: softmax"), "model.moe.jitter_eps", "applies to router sparsemixer only"),
    (("top_k: 2", "top_k: 3"), "model.moe.top_k", "sparsemixer routes exactly 2 experts"),
    (("jitter_eps: 0.01", "jitter_eps: -0.5"), "model.moe.jitter_eps", "non-negative"),
    (("router: sparsemixer", "router: sparse"), "model.moe.router", "sparsemixer"),
])
def test_yaml_mistakes_name_the_key(change, key, fragment):
    from pathlib import Path

    from frontends import yaml_spec

    text = (Path(__file__).resolve().parents[2] / "examples" / "tiny-phi-3.5-moe.yaml").read_text()
    assert change[0] in text
    with pytest.raises(SpecError) as err:
        yaml_spec.loads(text.replace(*change))
    assert f"{key}: " in str(err.value) and fragment in str(err.value), str(err.value)


@pytest.mark.parametrize("extra, arg, fragment", [
    (dict(top_k=1), "top_k", "sparsemixer routes exactly 2 experts"),
    (dict(router_bias=True), "router_bias", "no selection bias"),
    (dict(groups=2, top_groups=1), "groups", "no expert groups"),
    (dict(jitter_eps=float("inf")), "jitter_eps", "non-negative number"),
])
def test_dsl_refuses_what_sparsemixer_cannot_route(extra, arg, fragment):
    from frontends.dsl import Model
    from frontends.dsl_args import ArgError

    m = Model("t", vocab=16, d_model=8)
    x = m.embed(m.input_ids())
    layer = next(iter(m.layers(1)))
    with pytest.raises(ArgError) as err:
        layer.moe(x, **{"experts": 4, "top_k": 2, "d_ff": 8, "scoring": "sparsemixer", **extra})
    assert err.value.arg == arg and fragment in str(err.value)


# ---- the full-size model ---------------------------------------------------------------------

def test_phi_3_5_moe_structure_counts_transformers_parameters(tmp_path):
    """Phi-3.5-MoE's sizes (transformers' PhimoeConfig defaults, with the released model's
    attention and LM-head biases and window; default RoPE, which holds no parameters): irc's
    count is transformers' count on the meta device, 41.87B, and 6.64B are active per token
    (Microsoft's model card: 42B and 6.6B)."""
    from frontends.hf import load_hf
    from irc.analysis import analyze

    config = transformers.PhimoeConfig(attention_bias=True, lm_head_bias=True, sliding_window=131072)
    with torch.device("meta"):
        model = transformers.PhimoeForCausalLM(config)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    graph = load_hf(tmp_path, weights=False)
    stats = analyze(graph)
    assert stats["params_total"] == sum(p.numel() for p in model.parameters()) == 41_873_153_344
    assert round(stats["params_active"] / 1e9, 2) == 6.64
    assert [n.attrs["window"] for n in graph.nodes if n.op == "attention"] == [131072] * 32


def test_the_released_config_form_reads_its_longrope_as_transformers_applies_it(tmp_path):
    """Phi-3.5-MoE-instruct's config.json form (``rope_scaling`` with ``type: longrope``, 64
    short and long factors, equal mscales, ``rope_theta`` and
    ``original_max_position_embeddings`` at the top level; factors made up here): every
    layer's RoPE rotates by the short factors at every length and scales cos/sin by the
    mscale, as transformers' PhimoeRotaryEmbedding does; cos/sin equal its own past 4096."""
    from frontends.hf import load_hf
    from irc.ops.rope import rope_inv_freq

    rng = np.random.default_rng(0)
    short, long = (1.0 + rng.random(64)).tolist(), (4.0 + 40 * rng.random(64)).tolist()
    scaling = {"type": "longrope", "short_factor": short, "long_factor": long, "short_mscale": 1.243163121016122,
               "long_mscale": 1.243163121016122, "original_max_position_embeddings": 4096}
    config = {**transformers.PhimoeConfig(attention_bias=True, lm_head_bias=True, sliding_window=131072,
                                          num_hidden_layers=2).to_dict(),
              "rope_scaling": scaling, "rope_theta": 10000.0, "original_max_position_embeddings": 4096}
    del config["rope_parameters"]
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    graph = load_hf(tmp_path, weights=False)
    ropes = [n.attrs for n in graph.nodes if n.op == "rope"]
    assert len(ropes) == 4 and all(r["scaling"] == ropes[0]["scaling"] for r in ropes)  # q and k, 2 layers
    got = ropes[0]["scaling"]
    assert got["kind"] == "longrope" and got["short_factor"] == got["long_factor"] == short
    assert got["attention_factor"] == 1.243163121016122 and got["original_max_position"] == 4096
    hf = transformers.PhimoeConfig(**{k: v for k, v in config.items() if k != "rope_scaling"},
                                   rope_parameters={**scaling, "rope_type": "longrope", "rope_theta": 10000.0})
    from transformers.models.phimoe.modeling_phimoe import PhimoeRotaryEmbedding

    positions = torch.tensor([[0, 17, 4096, 5000, 131071]])
    cos, sin = PhimoeRotaryEmbedding(hf)(torch.zeros(1, dtype=torch.float32), positions)
    for seq_len in (4096, 131072):
        inv_freq, factor = rope_inv_freq(128, ropes[0]["base"], got, seq_len)
        angles = positions[0].numpy()[:, None].astype(np.float32) * inv_freq[None]
        emb = np.concatenate([angles, angles], axis=-1)
        np.testing.assert_allclose(np.cos(emb) * factor, cos[0].numpy(), atol=2e-5)
        np.testing.assert_allclose(np.sin(emb) * factor, sin[0].numpy(), atol=2e-5)


# ---- config.json mistakes -------------------------------------------------------------------

BASE = {"model_type": "phimoe", **{k: v for k, v in SMALL.items() if k != "pad_token_id"}}
BAD = [  # (config.json, the key named, a fragment of the message)
    ({**BASE, "num_experts_per_tok": 1}, "num_experts_per_tok", "1 is not supported"),
    ({**BASE, "num_experts_per_tok": 3}, "num_experts_per_tok", "3 is not supported"),
    ({**BASE, "num_local_experts": 1}, "num_local_experts", "too few"),
    ({**BASE, "router_jitter_noise": -0.1}, "router_jitter_noise", "non-negative"),
    ({**BASE, "hidden_act": "gelu"}, "hidden_act", '"gelu" is not supported'),
    ({**BASE, "rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "rope_parameters.rope_type",
     '"linear" is not supported'),
    ({**BASE, "rope_parameters": {**LONGROPE, "long_mscale": 1.5}}, "rope_parameters.long_mscale",
     "1.5 is not supported"),
    ({**BASE, "rope_parameters": {k: v for k, v in LONGROPE.items() if k != "short_mscale"}},
     "rope_parameters.short_mscale", "expected a positive number"),
    ({**BASE, "partial_rotary_factor": 0.5}, "partial_rotary_factor", "0.5 is not supported"),
]


@pytest.mark.parametrize("config, key, fragment", BAD)
def test_bad_configs_name_the_key(tmp_path, config, key, fragment):
    line = pointed_line(tmp_path, refused(tmp_path, key, fragment, config))
    assert any(f'"{part}"' in line for part in key.split("."))


def test_the_cli_exits_2_and_writes_nothing(tmp_path, capsys):
    from irc_cli import main

    (tmp_path / "config.json").write_text(json.dumps({**BASE, "num_experts_per_tok": 4}, indent=2))
    out = tmp_path / "out.onnx"
    code = main(["compile", str(tmp_path), "--target", "onnx", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "config.json" in err and "num_experts_per_tok: 4 is not supported" in err, err
    assert not out.exists()
