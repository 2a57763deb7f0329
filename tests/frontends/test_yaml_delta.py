"""The YAML architecture form for Qwen3-Next / Qwen3.5 gated DeltaNet: the ``gated_delta``
layer kind and section, the attention's ``output_gate``. The examples build the graph their
DSL twins (and the HF frontend) build, the tiny one runs and generates in the reference
interpreter, and every mistake is a SpecError at the YAML key's file:line:col."""
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
PAIRS = [("tiny-qwen3-next-80b-a3b.yaml", "tiny_qwen3_next_dsl.py"),
         ("qwen3-next-80b-a3b.yaml", "qwen3_next_80b_a3b_dsl.py")]

# the tiny twin as a Qwen3-Next config.json (no weights)
TINY_CONFIG = {"model_type": "qwen3_next", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "partial_rotary_factor": 0.25,
               "rope_theta": 1e7, "rms_norm_eps": 1e-6, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
               "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
               "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "shared_expert_intermediate_size": 32, "norm_topk_prob": True, "decoder_sparse_step": 1,
               "mlp_only_layers": [], "intermediate_size": 32, "full_attention_interval": 4,
               "tie_word_embeddings": False}


@pytest.mark.parametrize("yaml_name, dsl_name", PAIRS)
def test_the_yaml_examples_build_the_dsl_graph(yaml_name, dsl_name):
    from_yaml, from_dsl = load_spec(EXAMPLES / yaml_name), load_spec(EXAMPLES / dsl_name)
    assert print_graph(from_yaml) == print_graph(from_dsl)
    assert from_yaml.meta == from_dsl.meta


def test_the_hf_frontend_builds_the_tiny_graph(tmp_path):
    from_yaml = load_spec(EXAMPLES / "tiny-qwen3-next-80b-a3b.yaml")
    assert_hf_builds(tmp_path, TINY_CONFIG, from_yaml)


def test_the_tiny_twin_builds_verifies_runs_and_generates():
    graph = load_spec(EXAMPLES / "tiny-qwen3-next-80b-a3b.yaml")
    verify(graph)
    assert graph.meta["layer_kinds"] == ["gated_delta"] * 3 + ["attention"]
    assert_prefills_and_generates(graph)


def test_the_full_size_spec_has_the_published_size():
    stats = analyze(load_spec(EXAMPLES / "qwen3-next-80b-a3b.yaml"))
    assert stats["params_total"] == 79_674_391_296 and stats["params_active"] == 3_874_929_408


def test_origins_point_at_the_yaml_keys():
    path = EXAMPLES / "tiny-qwen3-next-80b-a3b.yaml"
    text = path.read_text().splitlines()
    keys = {node.op: text[int(node.origin.rsplit(":", 1)[1]) - 1].split(":")[0].strip()
            for node in load_spec(path).nodes}
    assert (keys["gated_delta_rule"], keys["gated_rms_norm"], keys["attention"], keys["sigmoid"], keys["moe"]) == (
        "gated_delta", "gated_delta", "attention", "attention", "moe")  # sigmoid: the output gate


# ---- the section and its mistakes --------------------------------------------------------

BASE = """\
model:
  name: t
  vocab_size: 64
  d_model: 32
  n_layers: 4
  layers:
    pattern: [gated_delta, gated_delta, gated_delta, attention]
  norm: {kind: rms, eps: 1.0e-6, offset: 1.0}
  attention: {kind: gqa, n_heads: 4, n_kv_heads: 2, head_dim: 8, qk_norm: true, output_gate: true}
  gated_delta:
    linear_num_key_heads: 2
    linear_num_value_heads: 4
    linear_key_head_dim: 8
    linear_value_head_dim: 8
    linear_conv_kernel_dim: 4
  mlp: {kind: swiglu, d_ff: 48}
"""


def test_split_projections_by_default_and_the_gate_in_wq():
    graph = build(BASE)
    verify(graph)
    p = graph.params
    assert p["layers.0.ssm.in_proj_qkv"].shape == (2 * 2 * 8 + 4 * 8, 32)
    assert (p["layers.0.ssm.in_proj_z"].shape, p["layers.0.ssm.in_proj_b"].shape) == ((32, 32), (4, 32))
    assert p["layers.0.ssm.conv"].shape == (2 * 2 * 8 + 4 * 8, 1, 4) and "layers.0.ssm.conv_bias" not in p
    assert p["layers.3.attn.wq"].shape == (2 * 4 * 8, 32)
    assert graph.meta["ssm"]["kind"] == "gated_delta"


def test_fused_projections():
    p = build(BASE.replace("linear_conv_kernel_dim: 4", "linear_conv_kernel_dim: 4\n    projections: fused")).params
    assert p["layers.0.ssm.in_proj_qkvz"].shape == (2 * 2 * 8 + 2 * 4 * 8, 32)
    assert p["layers.0.ssm.in_proj_ba"].shape == (2 * 4, 32) and "layers.0.ssm.in_proj_qkv" not in p


def test_defaults_are_qwen3_next_s():
    text = BASE.split("  gated_delta:\n")[0].replace("d_model: 32", "d_model: 64") + "  gated_delta: {}\n" \
        "  mlp: {kind: swiglu, d_ff: 48}\n"
    p = build(text).params
    assert p["layers.0.ssm.in_proj_qkv"].shape == (2 * 16 * 128 + 32 * 128, 64)
    assert p["layers.0.ssm.conv"].shape[-1] == 4


edit = partial(edited, BASE)


@pytest.mark.parametrize("old, new, line, key, words", [
    ("linear_num_value_heads: 4", "linear_num_value_heads: 3", 12, "model.gated_delta.linear_num_value_heads",
     "3 value heads are not a multiple of 2 key heads"),
    ("linear_conv_kernel_dim: 4", "linear_conv_kernel_dim: 0", 15, "model.gated_delta.linear_conv_kernel_dim",
     "expected a positive integer, got 0"),
    ("linear_key_head_dim: 8", "linear_key_head_dim: -8", 13, "model.gated_delta.linear_key_head_dim",
     "expected a positive integer"),
    ("linear_conv_kernel_dim: 4", "linear_conv_kernel_dim: 4\n    projections: grouped", 16,
     "model.gated_delta.projections", "expected one of split, fused"),
    ("linear_value_head_dim: 8", "linear_value_hed_dim: 8", 14, "model.gated_delta.linear_value_hed_dim",
     "unknown key"),
    ("output_gate: true", "output_gate: yes please", 9, "model.attention.output_gate", "expected"),
    ("[gated_delta, gated_delta, gated_delta, attention]", "[attention]", 10, "model.gated_delta",
     "no layer is gated_delta"),
])
def test_mistakes_name_file_line_and_key(tmp_path, old, new, line, key, words):
    assert_mistake(tmp_path, edit(old, new), line, key, words)


def test_a_missing_section_names_the_layer_that_needs_it():
    assert_missing_section(BASE.split("  gated_delta:\n")[0] + "  mlp: {kind: swiglu, d_ff: 48}\n", "gated_delta",
                           "gated_delta")


def test_output_gate_does_not_apply_to_mla(tmp_path):
    text = BASE.replace("  attention: {kind: gqa, n_heads: 4, n_kv_heads: 2, head_dim: 8, qk_norm: true, "
                        "output_gate: true}",
                        "  attention: {kind: mla, n_heads: 4, kv_lora_rank: 16, qk_nope_head_dim: 8, "
                        "qk_rope_head_dim: 4, v_head_dim: 8, output_gate: true}")
    assert "model.attention.output_gate: does not apply to kind mla" in spec_error(tmp_path, text)


def test_the_cli_exits_2_naming_the_key(tmp_path, capsys):
    path, err = show_error(tmp_path, capsys, edit("linear_num_value_heads: 4", "linear_num_value_heads: 3"))
    assert f"{path}:12:5: model.gated_delta.linear_num_value_heads: 3 value heads are not a multiple of 2 key heads" \
        in err
    assert not list(tmp_path.glob("*.onnx"))
