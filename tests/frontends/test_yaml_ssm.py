"""The YAML architecture form for state-space and hybrid models: the tiny twins build the
graph their DSL twins (and the HF frontend) build, every tiny example runs and generates
in the reference interpreter, the full-size specs have the published sizes, and every
mistake in a layer pattern or a mamba/mamba2 section is a SpecError at file:line:col
naming the key."""
from functools import partial
from pathlib import Path

import pytest

from frontends import load_spec
from irc.analysis import analyze
from irc.printer import print_graph
from irc.verify import verify
from tests.frontends.yaml_checks import (assert_hf_builds, assert_missing_section, assert_mistake,
                                         assert_prefills_and_generates, build, edited, show_error, spec_error)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MODELS = ["mamba2-2.7b", "jamba-1.5-mini", "granite-4.0-h-small", "falcon-h1-7b", "nemotron-h-8b"]
PAIRS = [("tiny-mamba2-2.7b.yaml", "tiny_mamba2_dsl.py"), ("tiny-jamba-1.5-mini.yaml", "tiny_jamba_dsl.py")]

# published totals: Mamba-2 "2.7B"; AI21 "52B total, 12B active" (51.6B on its model page);
# IBM "32B total, 9B active"; NVIDIA "8B". TII names Falcon-H1-7B "7B"; 7.59B is the count
# of its published config's shapes (44 x (attention + Mamba-2 + MLP) + two 130048-row tables)
PUBLISHED = {"mamba2-2.7b": 2.7e9, "jamba-1.5-mini": 51.6e9, "granite-4.0-h-small": 32e9, "falcon-h1-7b": 7.59e9,
             "nemotron-h-8b": 8e9}
ACTIVE = {"jamba-1.5-mini": 12e9, "granite-4.0-h-small": 9e9}


@pytest.mark.parametrize("yaml_name, dsl_name", PAIRS)
def test_dsl_twins_build_the_yaml_graph(yaml_name, dsl_name):
    from_yaml, from_dsl = load_spec(EXAMPLES / yaml_name), load_spec(EXAMPLES / dsl_name)
    assert print_graph(from_dsl) == print_graph(from_yaml)
    assert from_dsl.meta == from_yaml.meta


ATTENTION = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
MAMBA2 = dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2)
HF_TWINS = {  # each tiny twin as a config.json (no weights) of its Hugging Face family
    "mamba2-2.7b": dict(model_type="mamba2", vocab_size=256, hidden_size=64, num_hidden_layers=2, num_heads=8,
                        head_dim=16, expand=2, state_size=16, n_groups=1, conv_kernel=4, layer_norm_epsilon=1e-5,
                        tie_word_embeddings=True),
    "jamba-1.5-mini": dict(ATTENTION, model_type="jamba", num_hidden_layers=8, intermediate_size=128, num_experts=4,
                           num_experts_per_tok=2, attn_layer_period=8, attn_layer_offset=4, expert_layer_period=2,
                           expert_layer_offset=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4,
                           rms_norm_eps=1e-6, tie_word_embeddings=False),
    "granite-4.0-h-small": dict(ATTENTION, **MAMBA2, model_type="granitemoehybrid", num_hidden_layers=4,
                                layer_types=["mamba", "attention", "mamba", "mamba"], num_local_experts=8,
                                num_experts_per_tok=2, intermediate_size=32, shared_intermediate_size=64,
                                embedding_multiplier=1.0, logits_scaling=1.0, residual_multiplier=1.0,
                                attention_multiplier=0.25, position_embedding_type="nope", rms_norm_eps=1e-5,
                                tie_word_embeddings=True),
    "nemotron-h-8b": dict(ATTENTION, model_type="nemotron_h", num_hidden_layers=7, hybrid_override_pattern="M-M*-M-",
                          intermediate_size=128, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2,
                          conv_kernel=4, layer_norm_epsilon=1e-5, tie_word_embeddings=False),
    "falcon-h1-7b": dict(ATTENTION, **{**MAMBA2, "mamba_n_heads": 4}, model_type="falcon_h1", num_hidden_layers=2,
                         intermediate_size=128, mamba_d_ssm=64, mamba_rms_norm=True, mamba_norm_before_gate=False,
                         rope_theta=1e11, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, ssm_multipliers=[1.0] * 5, mlp_multipliers=[1.0, 1.0],
                         **{f"{k}_multiplier": 1.0 for k in ("attention_in", "attention_out", "ssm_in", "ssm_out",
                                                              "lm_head", "embedding", "key")}),
}


@pytest.mark.parametrize("name", sorted(HF_TWINS))
def test_the_hf_frontend_builds_the_same_graph(name, tmp_path):
    """The tiny twin's config.json (multipliers 1) through the HF frontend: the same graph
    but for its meta (which carries generation settings)."""
    from_yaml = load_spec(EXAMPLES / f"tiny-{name}.yaml")
    assert_hf_builds(tmp_path, HF_TWINS[name], from_yaml)


@pytest.mark.parametrize("name", MODELS)
def test_tiny_twins_build_verify_run_and_generate(name):
    graph = load_spec(EXAMPLES / f"tiny-{name}.yaml")
    verify(graph)
    meta = graph.meta
    assert (meta["vocab_size"], 32 <= meta["d_model"] <= 64, 2 <= meta["n_layers"] <= 8) == (256, True, True)
    assert_prefills_and_generates(graph)


@pytest.mark.parametrize("name", MODELS)
def test_tiny_twins_have_the_structure_of_the_full_size_spec(name):
    full, tiny = load_spec(EXAMPLES / f"{name}.yaml"), load_spec(EXAMPLES / f"tiny-{name}.yaml")
    assert set(tiny.meta["layer_kinds"]) == set(full.meta["layer_kinds"])
    assert tiny.meta["attention"] == full.meta["attention"]
    assert tiny.meta["tied_embeddings"] == full.meta["tied_embeddings"]
    assert (tiny.meta["moe"] is None) == (full.meta["moe"] is None)


@pytest.mark.parametrize("name", MODELS)
def test_full_size_parameter_counts_are_the_published_sizes(name):
    graph = load_spec(EXAMPLES / f"{name}.yaml")
    assert all(p.data is None for p in graph.params.values())
    stats = analyze(graph)
    assert stats["params_total"] == pytest.approx(PUBLISHED[name], rel=0.03)
    if name in ACTIVE:
        assert stats["params_active"] == pytest.approx(ACTIVE[name], rel=0.03)


def test_full_size_layer_layouts():
    kinds = load_spec(EXAMPLES / "jamba-1.5-mini.yaml").meta
    assert [i for i, k in enumerate(kinds["layer_kinds"]) if k == "attention"] == [4, 12, 20, 28]
    assert kinds["moe"]["layers"] == list(range(1, 32, 2))
    granite = load_spec(EXAMPLES / "granite-4.0-h-small.yaml").meta
    assert [i for i, k in enumerate(granite["layer_kinds"]) if k == "attention"] == [5, 15, 25, 35]
    assert granite["moe"]["layers"] == list(range(40))
    nemotron = load_spec(EXAMPLES / "nemotron-h-8b.yaml").meta["layer_kinds"]
    assert [nemotron.count(k) for k in ("mamba2", "attention", "none")] == [24, 4, 24]
    assert load_spec(EXAMPLES / "falcon-h1-7b.yaml").meta["layer_kinds"] == ["mamba2+attention"] * 44
    g = load_spec(EXAMPLES / "mamba2-2.7b.yaml")
    assert g.params["layers.0.ssm.in_proj"].shape == (2 * 5120 + 2 * 128 + 80, 2560)
    assert "position_ids" not in {v.name for v in g.inputs} and "lm_head" not in g.params


def test_origins_point_at_the_yaml_keys():
    path = EXAMPLES / "tiny-jamba-1.5-mini.yaml"
    text = path.read_text().splitlines()
    keys = {node.op: text[int(node.origin.rsplit(":", 1)[1]) - 1].split(":")[0].strip()
            for node in load_spec(path).nodes}
    assert (keys["selective_scan"], keys["causal_conv1d"], keys["attention"], keys["moe"], keys["swiglu"],
            keys["rms_norm"], keys["add"]) == ("mamba", "mamba", "attention", "moe", "mlp", "norm", "n_layers")


# ---- the layer pattern ---------------------------------------------------------------------

BASE = """\
model:
  name: t
  vocab_size: 64
  d_model: 32
  n_layers: 4
  layers:
    pattern: [mamba2, attention]
  norm: {kind: rms, eps: 1.0e-5}
  attention: {kind: gqa, n_heads: 4, n_kv_heads: 2}
  mamba2:
    n_heads: 4
    head_dim: 16
    expand: 2
    state_size: 8
    n_groups: 2
    conv_kernel: 4
  mlp: {kind: swiglu, d_ff: 64}
"""


def kinds(text: str) -> list:
    return build(text).meta["layer_kinds"]


def test_the_base_spec_is_good():
    graph = build(BASE)
    verify(graph)
    assert graph.meta["layer_kinds"] == ["mamba2", "attention"] * 2
    assert {"layers.0.ssm_norm", "layers.0.mlp_norm", "layers.1.attn_norm", "layers.1.mlp_norm"} <= set(graph.params)


def test_a_pattern_as_long_as_the_model_and_nemotron_letters():
    assert kinds(BASE.replace("[mamba2, attention]", "[mamba2, mamba2, attention, mamba2]")) == [
        "mamba2", "mamba2", "attention", "mamba2"]
    graph = build(BASE.replace("[mamba2, attention]", '"M-*E"') + "  moe: {experts: 4, top_k: 2, d_ff: 16}\n")
    assert graph.meta["layer_kinds"] == ["mamba2", "none", "attention", "none"]
    assert "layers.0.mlp_norm" not in graph.params and "layers.0.ssm_norm" in graph.params
    assert "layers.1.mlp.w_up" in graph.params and "layers.3.moe.router" in graph.params
    assert "layers.2.mlp_norm" not in graph.params and "layers.2.attn_norm" in graph.params


def test_without_feed_forward_a_layer_is_its_mixer():
    text = BASE.replace("[mamba2, attention]", "[mamba2]\n    feed_forward: false").replace(
        "  attention: {kind: gqa, n_heads: 4, n_kv_heads: 2}\n", "").replace("  mlp: {kind: swiglu, d_ff: 64}\n", "")
    graph = build(text)
    assert graph.meta["layer_kinds"] == ["mamba2"] * 4 and "layers.0.mlp_norm" not in graph.params
    assert sum(p.numel for p in graph.params.values()) == analyze(graph)["params_total"]


def test_parallel_mixers_share_one_norm_and_one_residual_add():
    graph = build(BASE.replace("[mamba2, attention]", "[mamba2+attention]"))
    assert graph.meta["layer_kinds"] == ["mamba2+attention"] * 4
    assert "layers.0.ssm_norm" not in graph.params and "layers.0.attn_norm" in graph.params
    first, residual = [n for n in graph.nodes if n.op == "add"][:2]
    assert [v.name for v in first.inputs] == ["layers.0.ssm_out", "layers.0.attn_out"]
    assert [v.name for v in residual.inputs] == ["x", "layers.0.mixers_out"]


def test_moe_layers_by_period_or_list():
    moe = "  moe: {experts: 4, top_k: 2, d_ff: 16, layers: %s}\n"
    assert build(BASE + moe % "{period: 2, offset: 1}").meta["moe"]["layers"] == [1, 3]
    assert build(BASE + moe % "[0, 3]").meta["moe"]["layers"] == [0, 3]
    assert build(BASE + "  moe: {experts: 4, top_k: 2, d_ff: 16, dense_layers: [0]}\n").meta["moe"]["layers"] == [
        1, 2, 3]


def test_mamba1_and_mamba2_defaults():
    text = BASE.replace("[mamba2, attention]", "[mamba, mamba2]").replace(
        "  attention: {kind: gqa, n_heads: 4, n_kv_heads: 2}\n", "  mamba: {bcdt_norm: plain}\n")
    graph = build(text)
    assert graph.params["layers.0.ssm.in_proj"].shape == (2 * 64, 32)       # expand 2
    assert graph.params["layers.0.ssm.x_proj"].shape == (2 + 2 * 16, 64)    # dt_rank ceil(32 / 16), state 16
    ssd = next(n for n in graph.nodes if n.op == "ssd")
    assert (ssd.attrs["dt_min"], ssd.attrs["dt_max"]) == (0.0, None)
    limited = build(BASE.replace("conv_kernel: 4", "conv_kernel: 4\n    time_step_limit: [0.001, 0.1]"))
    assert next(n for n in limited.nodes if n.op == "ssd").attrs["dt_max"] == 0.1
    derived = build(BASE.replace("    n_heads: 4\n", ""))  # expand 2 x d 32 / head_dim 16
    assert derived.params["layers.0.ssm.A_log"].shape == (4,)


edit = partial(edited, BASE)


@pytest.mark.parametrize("old, new, line, key, words", [
    ("[mamba2, attention]", "[mamba2, mamba3]", 7, "model.layers.pattern[1]",
     "expected one of attention, mamba, mamba2, conv, gated_delta, kimi_delta, lightning, mamba+attention, mamba2+attention, mlp, moe, got 'mamba3'"),
    ("[mamba2, attention]", "[mamba2, attention, mamba2]", 7, "model.layers.pattern",
     "3 kinds do not divide n_layers 4"),
    ("[mamba2, attention]", "[]", 7, "model.layers.pattern", "expected at least one layer kind"),
    ("[mamba2, attention]", '"M-X*"', 7, "model.layers.pattern", "letter 2 'X' is not a layer letter"),
    ("[mamba2, attention]", "7", 7, "model.layers.pattern", "expected a list, got 7"),
    ("    pattern: [mamba2, attention]\n", "    patern: [mamba2, attention]\n", 7, "model.layers.patern",
     "unknown key"),
    ("n_heads: 4\n    head_dim", "n_heads: 3\n    head_dim", 11, "model.mamba2.n_heads",
     "3 heads x head_dim 16 = 48 is not expand x d_model = 2 x 32 = 64"),
    ("n_groups: 2", "n_groups: 3", 15, "model.mamba2.n_groups", "3 groups do not divide 4 heads"),
    ("conv_kernel: 4", "conv_kernel: 0", 16, "model.mamba2.conv_kernel", "expected a positive integer, got 0"),
    ("conv_kernel: 4", "conv_kernel: 4\n    time_step_limit: [0.1, 0.01]", 17, "model.mamba2.time_step_limit",
     "expected [low, high] with 0 <= low <= high"),
    ("    head_dim: 16\n    expand: 2\n", "    head_dim: 16\n    expand: two\n", 13, "model.mamba2.expand",
     "expected a positive integer"),
    ("  attention: {kind: gqa, n_heads: 4, n_kv_heads: 2}\n", "", 1, "model.attention", "missing required key"),
    ("state_size: 8", "state_sise: 8", 14, "model.mamba2.state_sise", "unknown key"),
    ("  mlp: {kind: swiglu, d_ff: 64}\n", "", 1, "model.mlp", "missing required key"),
])
def test_mistakes_name_file_line_and_key(tmp_path, old, new, line, key, words):
    assert_mistake(tmp_path, edit(old, new), line, key, words)


def test_a_missing_section_names_the_layer_that_needs_it(tmp_path):
    text = edit("  mamba2:\n", "  unused:\n").replace("  unused:\n    n_heads: 4\n    head_dim: 16\n    expand: 2\n"
                                                     "    state_size: 8\n    n_groups: 2\n    conv_kernel: 4\n", "")
    assert_missing_section(text, "mamba2", "mamba2")


@pytest.mark.parametrize("moe, key, words", [
    ("{experts: 4, top_k: 2, d_ff: 16, layers: [1], dense_layers: [0]}", "model.moe.layers",
     "give layers or dense_layers, not both"),
    ("{experts: 4, top_k: 2, d_ff: 16, layers: {period: 2, offset: 2}}", "model.moe.layers.offset",
     "offset 2 is not below period 2"),
    ("{experts: 4, top_k: 2, d_ff: 16, layers: [4]}", "model.moe.layers[0]", "layer 4 is beyond n_layers 4"),
    ("{experts: 4, top_k: 2, d_ff: 16, layers: {every: 2}}", "model.moe.layers.every", "unknown key"),
])
def test_moe_layer_mistakes(tmp_path, moe, key, words):
    assert_mistake(tmp_path, BASE + f"  moe: {moe}\n", 18, key, words)


def test_moe_layers_without_mlp_name_the_mlp_layers(tmp_path):
    text = edit("  mlp: {kind: swiglu, d_ff: 64}\n", "  moe: {experts: 4, top_k: 2, d_ff: 16, layers: [1, 3]}\n")
    assert "model.moe.layers: layer 0 is not MoE: the other layers need model.mlp" in spec_error(tmp_path, text)


def test_state_space_sections_need_their_kinds_in_the_pattern(tmp_path):
    assert build(edit("[mamba2, attention]", "[mamba2]")).meta["attention"] is None  # attention may stay
    assert "model.mamba2: no layer is mamba2" in spec_error(tmp_path, edit("[mamba2, attention]", "[attention]"))
    text = edit("  mlp: {kind: swiglu, d_ff: 64}\n", "  mlp: {kind: swiglu, d_ff: 64}\n  mamba: {}\n")
    assert "model.mamba: no layer is mamba" in spec_error(tmp_path, text)
    text = edit("[mamba2, attention]", "[mamba2, attention]\n    feed_forward: false")
    assert "model.mlp: no layer has a feed-forward block" in spec_error(tmp_path, text)


def test_the_cli_exits_2_naming_the_key(tmp_path, capsys):
    path, err = show_error(tmp_path, capsys, edit("n_groups: 2", "n_groups: 3"))
    assert f"{path}:15:5: model.mamba2.n_groups: 3 groups do not divide 4 heads" in err
