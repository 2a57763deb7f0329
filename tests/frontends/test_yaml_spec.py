"""The YAML architecture form: every example loads, sizes match the published models, and
every mistake is a SpecError at file:line:col naming the key."""
import time
from functools import partial
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from frontends import load_spec, yaml_spec
from irc.verify import verify
from tests.frontends.yaml_checks import assert_mistake, edited, spec_error

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SPECS = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
FULL_SIZE = [name for name in SPECS if not name.startswith("tiny-") and "graph" not in name]


def n_params(graph) -> int:
    return sum(p.numel for p in graph.params.values())


@pytest.mark.parametrize("name", SPECS)
def test_every_example_loads_and_verifies(name):
    graph = load_spec(EXAMPLES / name)
    verify(graph)
    assert graph.outputs[0].name == ("last_hidden_state" if "vision" in graph.meta else "logits")


def test_every_full_size_example_has_a_tiny_twin():
    twins = {"llama3-8b.yaml": "tiny-llama3.yaml"}  # the others are tiny-<name>
    for name in FULL_SIZE:
        twin = twins.get(name, f"tiny-{name}")
        assert twin in SPECS, name
        assert load_spec(EXAMPLES / twin).meta["attention"] == load_spec(EXAMPLES / name).meta["attention"]


@pytest.mark.parametrize("name, count", [
    ("llama3-8b.yaml", 8_030_261_248), ("mixtral-8x7b.yaml", 46_702_792_704), ("llama2-7b.yaml", 6_738_415_616),
    ("llama2-70b.yaml", 68_976_648_192), ("mistral-7b.yaml", 7_241_732_096), ("gemma2-9b.yaml", 9_241_705_984),
])
def test_parameter_counts_match_the_published_models(name, count):
    assert n_params(load_spec(EXAMPLES / name)) == count


def test_published_shapes():
    meta = load_spec(EXAMPLES / "llama2-70b.yaml").meta
    assert (meta["n_layers"], meta["d_model"], meta["n_heads"], meta["n_kv_heads"], meta["d_ff"],
            meta["vocab_size"]) == (80, 8192, 64, 8, 28672, 32000)
    meta = load_spec(EXAMPLES / "llama2-7b.yaml").meta
    assert (meta["n_layers"], meta["d_model"], meta["n_heads"], meta["n_kv_heads"], meta["attention"],
            meta["d_ff"], meta["vocab_size"]) == (32, 4096, 32, 32, "mha", 11008, 32000)


def test_deepseek_v2_features():
    g = load_spec(EXAMPLES / "deepseek-v2.yaml")
    assert g.meta["mla"] == {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                             "qk_rope_head_dim": 64, "v_head_dim": 128}
    assert g.meta["moe"]["layers"] == list(range(1, 60)) and g.meta["moe"]["experts"] == 160
    assert g.params["layers.0.mlp.w_gate"].shape == (12288, 5120)
    assert g.params["layers.1.moe.w_gate"].shape == (160, 1536, 5120)
    assert g.params["layers.1.moe.shared_gate"].shape == (2 * 1536, 5120)
    assert g.params["layers.1.attn.kv_a"].shape == (512 + 64, 5120)
    assert g.inputs[3].shape == ("B", 128, "P", 192)
    assert g.meta["rope"]["scaling"]["mscale_all_dim"] == 0.707
    assert 235e9 < n_params(g) < 237e9


def test_deepseek_v3_features():
    g = load_spec(EXAMPLES / "deepseek-v3.yaml")
    moe = next(n for n in g.nodes if n.op == "moe")
    assert moe.attrs["scoring"] == "sigmoid" and moe.attrs["group_score"] == "top2_sum"
    assert (moe.attrs["n_group"], moe.attrs["topk_group"], moe.attrs["routed_scale"]) == (8, 4, 2.5)
    assert g.params["layers.3.moe.router_bias"].shape == (256,)
    assert "layers.2.mlp.w_up" in g.params and "layers.3.mlp.w_up" not in g.params
    assert g.meta["rope"]["convention"] == "interleaved"
    assert 670e9 < n_params(g) < 672e9


def test_gemma2_features():
    g = load_spec(EXAMPLES / "gemma2-9b.yaml")
    assert g.meta["window"] == [4096, None] * 21
    attention = [n for n in g.nodes if n.op == "attention"]
    assert attention[0].attrs["window"] == 4096 and attention[1].attrs["window"] is None
    assert attention[0].attrs["softcap"] == 50.0 and attention[0].attrs["scale"] == 256 ** -0.5
    assert g.outputs[0].producer.op == "softcap" and g.outputs[0].producer.attrs["cap"] == 30.0
    assert "lm_head" not in g.params and "layers.0.post_mlp_norm" in g.params
    assert next(n for n in g.nodes if n.op == "rms_norm").attrs["offset"] == 1.0
    assert g.nodes[0].attrs["scale"] == pytest.approx(3584 ** 0.5)


def test_mistral_windows_every_layer_and_qwen2_has_qkv_bias():
    assert load_spec(EXAMPLES / "mistral-7b.yaml").meta["window"] == [4096] * 32
    g = load_spec(EXAMPLES / "qwen2-7b.yaml")
    assert g.params["layers.0.attn.bk"].shape == (512,)


def test_origins_point_at_the_yaml_keys():
    g = load_spec(EXAMPLES / "tiny-llama3.yaml")
    text = (EXAMPLES / "tiny-llama3.yaml").read_text().splitlines()
    for node in g.nodes:
        file, line = node.origin.rsplit(":", 1)
        assert file.endswith("tiny-llama3.yaml")
        key = text[int(line) - 1].split(":")[0].strip()
        expected = {"attention": "attention", "rms_norm": "norm", "add": "n_layers", "swiglu": "mlp",
                    "embedding": "vocab_size", "linear": None, "rope": "attention"}[node.op]
        if expected:
            assert key == expected, node


def test_full_size_loads_fast_with_weights_absent():
    best = min(_timed(EXAMPLES / "llama2-70b.yaml") for _ in range(3))
    assert best < 0.5


def _timed(path) -> float:
    start = time.perf_counter()
    graph = load_spec(path)
    elapsed = time.perf_counter() - start
    assert graph.meta["n_layers"] == 80 and all(p.data is None for p in graph.params.values())
    return elapsed


# ---- mistakes ----------------------------------------------------------------------------

GOOD = """\
model:
  name: t
  vocab_size: 64
  d_model: 32
  n_layers: 2
  norm: {kind: rms, eps: 1.0e-5}
  attention:
    kind: gqa
    n_heads: 4
    n_kv_heads: 2
    rope: {base: 10000, convention: half}
  mlp: {kind: swiglu, d_ff: 64}
"""


edit = partial(edited, GOOD)


def test_the_base_spec_is_good(tmp_path):
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    verify(load_spec(path))


def test_heads_not_divisible_by_kv_heads(tmp_path):
    message = spec_error(tmp_path, edit("n_kv_heads: 2", "n_kv_heads: 3"))
    expected = "model.attention.n_kv_heads: 4 heads are not divisible by 3 kv heads"
    assert message == f"{tmp_path / 'bad.yaml'}:10:5: {expected}"


@pytest.mark.parametrize("old, new, line, key, words", [
    ("n_kv_heads: 2", "n_kv_head: 2", 10, "model.attention.n_kv_head", "unknown key"),
    ("n_layers: 2", "n_layers: two", 5, "model.n_layers", "expected a positive integer, got 'two'"),
    ("n_layers: 2", "n_layers: true", 5, "model.n_layers", "expected a positive integer"),
    ("d_model: 32", "d_model: 0", 4, "model.d_model", "expected a positive integer, got 0"),
    ("d_ff: 64", "d_ff: -64", 12, "model.mlp.d_ff", "got -64"),
    ("eps: 1.0e-5", "eps: small", 6, "model.norm.eps", "expected a positive number"),
    ("kind: gqa", "kind: sparse", 8, "model.attention.kind", "expected one of mha, gqa, mqa, mla"),
    ("kind: rms", "kind: batch", 6, "model.norm.kind", "expected one of rms, layer"),
    ("kind: swiglu", "kind: relu", 12, "model.mlp.kind", "expected one of swiglu, geglu, gelu"),
    ("convention: half", "convention: sideways", 11, "model.attention.rope.convention", "expected one of"),
    ("n_kv_heads: 2\n", "n_kv_heads: 2\n    head_dim: 7\n", 11, "model.attention.head_dim",
     "RoPE rotates pairs: needs an even dimension, got 7"),
    ("n_heads: 4\n    n_kv_heads: 2", "n_heads: 3\n    n_kv_heads: 1", 9, "model.attention.n_heads",
     "d_model 32 is not divisible by 3 heads"),
    ("kind: gqa", "kind: mha", 10, "model.attention.n_kv_heads", "mha has one kv head per head"),
    ("n_kv_heads: 2\n", "n_kv_heads: 2\n    kv_lora_rank: 16\n", 11, "model.attention.kv_lora_rank",
     "applies to kind mla only"),
    ("n_kv_heads: 2\n", "n_kv_heads: 2\n    window_pattern: [local, global]\n", 11,
     "model.attention.window_pattern", "needs window"),
    ("n_kv_heads: 2\n", "n_kv_heads: 2\n    window: 8\n    window_pattern: [local, near]\n", 12,
     "model.attention.window_pattern[1]", "expected one of local, global"),
    ("rope: {base: 10000, convention: half}", "rope: {base: 10000, scaling: {kind: ntk, factor: 2}}", 11,
     "model.attention.rope.scaling.kind", "expected one of linear"),
    ("rope: {base: 10000, convention: half}",
     "rope: {base: 10000, scaling: {kind: llama3, factor: 8, original_max_position: 64}}", 11,
     "model.attention.rope.scaling.low_freq_factor", "needs low_freq_factor"),
    ("  mlp: {kind: swiglu, d_ff: 64}\n", "", 1, "model.mlp", "missing required key"),
    ("  name: t\n", "", 1, "model.name", "missing required key"),
    ("  vocab_size: 64\n", "  vocab_size: 64\n  vocab_size: 65\n", 4, "", "duplicate key 'vocab_size'"),
])
def test_mistakes_name_file_line_and_key(tmp_path, old, new, line, key, words):
    assert_mistake(tmp_path, edit(old, new), line, key, words, after="")


@pytest.mark.parametrize("moe, line, key, words", [
    ("{experts: 4, top_k: 5, d_ff: 8}", 13, "model.moe.top_k", "top_k 5 exceeds 4 experts"),
    ("{experts: 6, top_k: 2, d_ff: 8, group_limited: {groups: 4, top_groups: 2}}", 13,
     "model.moe.group_limited.groups", "6 experts do not split into 4 groups"),
    ("{experts: 4, top_k: 2, d_ff: 8, dense_layers: [0, 2]}", 13, "model.moe.dense_layers[1]",
     "beyond n_layers 2"),
    ("{experts: 4, top_k: 2, d_ff: 8, router: argmax}", 13, "model.moe.router", "expected one of softmax, sigmoid"),
    ("{experts: 4, top_k: 2, d_ff: 8, shared_expert_gate: true}", 13, "model.moe.shared_expert_gate",
     "needs shared experts"),
])
def test_moe_mistakes(tmp_path, moe, line, key, words):
    assert_mistake(tmp_path, GOOD + f"  moe: {moe}\n", line, key, words, after="")


def test_syntax_errors_and_missing_top_key(tmp_path):
    assert spec_error(tmp_path, GOOD.replace("d_ff: 64}", "d_ff: 64")).startswith(f"{tmp_path / 'bad.yaml'}:12:")
    assert "top-level key 'model'" in spec_error(tmp_path, "layers: 2\n")
    assert "expected a mapping" in spec_error(tmp_path, "model: [1, 2]\n")


def test_mla_rejects_keys_that_do_not_apply(tmp_path):
    text = (EXAMPLES / "tiny-deepseek-v2.yaml").read_text().replace("n_heads: 4", "n_heads: 4\n    n_kv_heads: 4")
    message = spec_error(tmp_path, text)
    assert "model.attention.n_kv_heads: does not apply to kind mla" in message


# ---- random small architectures ------------------------------------------------------------

@st.composite
def architectures(draw):
    kv = draw(st.integers(1, 3))
    heads = kv * draw(st.integers(1, 3))
    head_dim = 2 * draw(st.integers(1, 6))
    d = draw(st.integers(2, 40))
    layers = draw(st.integers(1, 3))
    d_ff = draw(st.integers(1, 50))
    vocab = draw(st.integers(1, 50))
    moe = draw(st.none() | st.tuples(st.integers(1, 4), st.integers(0, 2)))
    tied = draw(st.booleans())
    qkv_bias = draw(st.booleans())
    return dict(kv=kv, heads=heads, head_dim=head_dim, d=d, layers=layers, d_ff=d_ff, vocab=vocab, moe=moe,
                tied=tied, qkv_bias=qkv_bias)


@settings(max_examples=30, deadline=None)
@given(architectures())
def test_random_architectures_build_with_the_expected_parameter_count(a):
    moe_text = ""
    if a["moe"]:
        experts, shared = a["moe"]
        moe_text = f"  moe: {{experts: {experts}, top_k: 1, d_ff: {a['d_ff']}, shared_experts: {shared}}}\n"
    text = (f"model:\n  name: r\n  vocab_size: {a['vocab']}\n  d_model: {a['d']}\n  n_layers: {a['layers']}\n"
            f"  attention: {{kind: gqa, n_heads: {a['heads']}, n_kv_heads: {a['kv']}, head_dim: {a['head_dim']},"
            f" qkv_bias: {str(a['qkv_bias']).lower()}, rope: {{base: 10000}}}}\n"
            f"  mlp: {{kind: swiglu, d_ff: {a['d_ff']}}}\n{moe_text}"
            f"  tied_embeddings: {str(a['tied']).lower()}\n")
    graph = yaml_spec.loads(text, "random.yaml")
    verify(graph)
    d, hd, f = a["d"], a["head_dim"], a["d_ff"]
    q, kv = a["heads"] * hd, a["kv"] * hd
    attention = 2 * d * q + 2 * d * kv + (q + 2 * kv if a["qkv_bias"] else 0)
    if a["moe"]:
        experts, shared = a["moe"]
        mlp = experts * d + experts * 3 * d * f + shared * 3 * d * f
    else:
        mlp = 3 * d * f
    expected = a["layers"] * (attention + mlp + 2 * d) + d + a["vocab"] * d * (1 if a["tied"] else 2)
    assert n_params(graph) == expected
