"""shard{tp=N}: tensor parallelism as one rank's program, proven equal to the unsharded graph
as a world of ranks (irc.world) through the reference interpreter: golden dumps, the changed
flag both ways, idempotence, outputs and caches equal at tp 2 and 4 (KV heads replicated
where fewer than ranks), greedy tokens equal; per-rank accounting (irc show --tp) on the
seeds' cases; refusals naming the node and the dimension."""
import json

import numpy as np
import pytest

from frontends.yaml_spec import load, loads
from irc.analysis import analyze
from irc.analysis_shard import shard_summary
from irc.errors import PassError
from irc.interpreter import generate, random_feeds
from irc.check import compare_outputs
from irc.testing import apply_pass, assert_pass, assert_unchanged
from irc_cli import main
from passes.shard import ShardPass

SPECS = {"llama3": "examples/tiny-llama3.yaml", "qwen2-bias": "examples/tiny-qwen2-7b.yaml",
         "gemma2-geglu-softcap-window": "examples/tiny-gemma2-9b.yaml", "mistral-window": "examples/tiny-mistral-7b.yaml",
         "mixtral-moe": "examples/tiny-mixtral-8x7b.yaml", "glm-4.5-air-moe-shared": "examples/tiny-glm-4.5-air.yaml",
         "deepseek-v3-mla-moe": "examples/tiny-deepseek-v3.yaml", "deepseek-v2-mla": "examples/tiny-deepseek-v2.yaml",
         "mamba2-one-group-norm-across-ranks": "examples/tiny-mamba2-2.7b.yaml",
         "nemotron-h-groups-relu2-mlp": "examples/tiny-nemotron-h-8b.yaml",
         "falcon-h1-mup-scales": "examples/tiny-falcon-h1-7b.yaml", "lfm2-short-conv": "examples/tiny-lfm2-1.2b.yaml",
         "bloom-alibi": "examples/tiny-bloom-7b1.yaml", "phi-2-gelu-mlp": "examples/tiny-phi-2.yaml",
         "granite-4-hybrid-moe": "examples/tiny-granite-4.0-h-small.yaml",
         "olmo-2-qk-norm-over-all-heads": "examples/tiny-olmo-2-7b.yaml", "minimax-m2-moe": "examples/tiny-minimax-m2.yaml",
         "gpt-oss-sinks-expert-bias": "examples/tiny-gpt-oss-20b.yaml"}
MQA = """
model:
  name: tiny-mqa
  vocab_size: 128
  d_model: 32
  n_layers: 2
  norm: {kind: rms, eps: 1.0e-6}
  attention: {kind: gqa, n_heads: 4, n_kv_heads: 1, head_dim: 8, rope: {base: 10000, convention: half}}
  mlp: {kind: swiglu, d_ff: 64}
"""


QWEN3 = MQA.replace("tiny-mqa", "tiny-qwen3").replace("n_kv_heads: 1, head_dim: 8,", "n_kv_heads: 2, head_dim: 8, qk_norm: true,")


def test_per_head_qk_norms_follow_their_heads():
    """Qwen3's q/k norms (reshape to heads, RMS norm per head, reshape back) re-aimed at the
    rank's heads."""
    graph = loads(QWEN3)
    for tp in (2, 4):
        sharded, _ = apply_pass(ShardPass(tp=tp), graph)
        assert compare_outputs(graph, sharded, random_feeds(graph, batch=2, tokens=4, past=2)) <= 1e-5


def test_golden_and_idempotent():
    assert assert_pass(ShardPass(tp=2), load("examples/tiny-llama3.yaml"), golden="shard")


def test_tp1_changes_nothing():
    assert_unchanged(ShardPass(tp=1), load("examples/tiny-llama3.yaml"))


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_world_equals_the_unsharded_graph(name, tp):
    """Logits and presents (joined along the KV heads) over a past of 3 and 5 new tokens."""
    graph = load(SPECS[name])
    sharded, changed = apply_pass(ShardPass(tp=tp), graph)
    assert changed
    feeds = random_feeds(graph, batch=2, tokens=5, past=3, seed=1)
    assert compare_outputs(graph, sharded, feeds) <= 1e-5


@pytest.mark.parametrize("name", ["mixtral-moe", "glm-4.5-air-moe-shared", "deepseek-v3-mla-moe",
                                  "gpt-oss-sinks-expert-bias"])
def test_expert_parallel_equals_the_unsharded_graph(name):
    """ep = tp: whole experts spread over the ranks (the shared expert split by width)."""
    graph = load(SPECS[name])
    sharded, _ = apply_pass(ShardPass(tp=2, ep=2), graph)
    assert any(n.op == "moe" and n.attrs["expert_shards"] == 2 for n in sharded.nodes)
    assert compare_outputs(graph, sharded, random_feeds(graph, batch=2, tokens=5, past=3, seed=2)) <= 1e-5


@pytest.mark.parametrize("form", ["mla-absorb", "mla-absorb{fold_weights=true}"])
def test_mla_latent_forms_keep_the_latent_cache_whole_on_every_rank(form):
    from irc.passmanager import PassManager, parse_pipeline
    from irc.weights import seed_absent

    graph = load(SPECS["deepseek-v3-mla-moe"])
    seed_absent(graph)  # the absorbed weights are made from kv_b
    PassManager(parse_pipeline(form)).run(graph)
    sharded, _ = apply_pass(ShardPass(tp=2), graph)
    assert compare_outputs(graph, sharded, random_feeds(graph, batch=2, tokens=5, past=3, seed=3)) <= 1e-5
    shard = shard_summary(sharded)
    assert shard["kv_replication"] == 2
    assert shard["kv_cache_bytes_per_token_per_rank"] == analyze(graph)["kv_cache_bytes_per_token"]


def test_mqa_replicates_its_kv_head_on_every_rank():
    graph = loads(MQA)
    sharded, _ = apply_pass(ShardPass(tp=4), graph)
    assert compare_outputs(graph, sharded, random_feeds(graph, batch=1, tokens=4, past=2)) <= 1e-5
    shard = shard_summary(sharded)
    assert shard["kv_replication"] == 4
    assert shard["kv_cache_bytes_per_token_per_rank"] == analyze(graph)["kv_cache_bytes_per_token"]


def test_greedy_tokens_equal():
    graph = load("examples/tiny-llama3.yaml")
    sharded, _ = apply_pass(ShardPass(tp=2), graph)
    assert generate(sharded, [3, 17, 42], 12)[0] == generate(graph, [3, 17, 42], 12)[0]


def test_refusals_name_the_node_and_the_dimension():
    with pytest.raises(PassError, match=r"node %x \(embedding\): the vocabulary \(embedding rows\) is 256, which 3 "):
        apply_pass(ShardPass(tp=3), load("examples/tiny-llama3.yaml"))
    with pytest.raises(PassError, match=r"node %layers\.0\.attn \(attention\): the query heads is 4, which 8 ranks"):
        apply_pass(ShardPass(tp=8), load("examples/tiny-llama3.yaml"))


def test_layers_without_a_split_stay_whole_and_are_said():
    """A CLIP tower's patch embedding and quick-GELU MLPs (x · sigmoid(1.702 x) reads its input
    twice: no column / row form) run whole on every rank: still the unsharded outputs, and the
    note counts what stays whole (routers and MLA's latent projections, replicated by design,
    are not counted)."""
    graph = load("examples/tiny-clip-vit-large-patch14-336.yaml")
    shard = ShardPass(tp=2)
    sharded, _ = apply_pass(shard, graph)
    assert compare_outputs(graph, sharded, random_feeds(graph, batch=1, seed=2)) <= 1e-5
    assert any("stay whole on every rank" in note and "patch_embed" in note for note in shard.notes)
    deepseek = ShardPass(tp=2)
    apply_pass(deepseek, load(SPECS["deepseek-v3-mla-moe"]))
    assert not [note for note in deepseek.notes if "stay whole" in note]


def test_mamba2_splits_by_heads_with_its_groups_replicated():
    """Mamba-2 with one group of B and C at tp 4: heads, states and the norm's weight split,
    B and C (and their conv channels and state) on every rank, the gated norm over all d_inner
    features summed across ranks (one more all-reduce a layer, of one float a token)."""
    graph = load(SPECS["mamba2-one-group-norm-across-ranks"])
    shard = ShardPass(tp=4)
    sharded, _ = apply_pass(shard, graph)
    ssd = next(n for n in sharded.nodes if n.op == "ssd")
    assert (ssd.attrs["heads"], ssd.attrs.get("groups", 1)) == (2, 1)
    assert any("replicated on 4 ranks" in note for note in shard.notes)
    summary, full = shard_summary(sharded), analyze(graph)
    d_inner, bc, state = 128, 16, 16
    conv, scan = (d_inner // 4 + 2 * bc) * 3, 8 // 4 * state * 16  # conv kernel - 1 columns; heads x N x P
    assert summary["state_bytes_per_sequence_per_rank"] == 2 * 4 * (conv + scan)
    assert full["state_bytes_per_sequence"] == 2 * 4 * ((d_inner + 2 * bc) * 3 + 8 * state * 16)
    reduce = summary["collectives"]["all_reduce"]
    assert reduce["count"] == 2 * 2 + 1  # norm + out_proj a layer, the embedding
    assert not [n for n in sharded.nodes if n.op == "gated_rms_norm"]
    assert generate(sharded, [3, 17, 42], 8)[0] == generate(graph, [3, 17, 42], 8)[0]


def test_mla_absorb_after_shard_says_to_run_it_first():
    from passes.mla_absorb import MlaAbsorb

    sharded, _ = apply_pass(ShardPass(tp=2), load(SPECS["deepseek-v3-mla-moe"]))
    with pytest.raises(PassError, match=r"mla-absorb cannot run: @layers.0.attn.q_b is already cut across ranks by shard; run mla-absorb before"):
        from irc.passmanager import PassManager
        PassManager([MlaAbsorb()]).run(sharded)


def test_a_bias_on_split_experts_is_added_by_one_rank():
    """GPT-OSS's expert down-projection bias with the experts split by width: rank 0 holds it,
    the others zeros, so the all-reduce adds it once."""
    from irc.world import block

    graph = load(SPECS["gpt-oss-sinks-expert-bias"])
    sharded, _ = apply_pass(ShardPass(tp=2), graph)
    name = next(n for n in sharded.params if n.endswith("b_down"))
    shard = sharded.params[name].data
    assert np.array_equal(shard.for_rank(0), shard.full()) and not shard.for_rank(1).any()
    assert block(np.arange(4.0), {"axis": 0, "block": 4, "rep": 2, "owner": 0}, 1).tolist() == [0.0] * 4


def test_a_qk_norm_over_all_heads_is_summed_across_ranks():
    """OLMo-2 normalises q and k over all heads: each rank's heads' gains, the sum of squares
    all-reduced (two more all-reduces a layer), no rms_norm of the full width left."""
    graph = load(SPECS["olmo-2-qk-norm-over-all-heads"])
    sharded, _ = apply_pass(ShardPass(tp=2), graph)
    layers = graph.meta["n_layers"]
    assert shard_summary(sharded)["collectives"]["all_reduce"]["count"] == 4 * layers + 1
    assert generate(sharded, [3, 17, 42], 8)[0] == generate(graph, [3, 17, 42], 8)[0]


def test_norm_groups_spanning_some_ranks_meet_in_their_slots():
    """Nemotron-H's two norm groups at tp 4: each spans two ranks; each rank's sum of squares
    goes to its group's slot of a [B, T, 2] all-reduce (a one-hot row a rank)."""
    graph = load(SPECS["nemotron-h-groups-relu2-mlp"])
    sharded, _ = apply_pass(ShardPass(tp=4), graph)
    onehots = [p for p in sharded.params.values() if p.name.endswith("group_of_rank")]
    assert onehots and all(p.shape == (2,) for p in onehots)
    assert compare_outputs(graph, sharded, random_feeds(graph, batch=2, tokens=3, past=2, seed=7)) <= 1e-5


def show_json(capsys, *argv) -> dict:
    assert main(["show", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("tp, replication", [(8, 1), (16, 2)])
def test_llama_70b_per_rank(capsys, tp, replication):
    """Llama-2-70B (64 query heads, 8 KV heads): at tp 8 each rank owns one KV group, at tp 16
    each KV head sits on two ranks; every weight but the norms is cut N ways; two all-reduces
    a layer (attention, MLP) and one for the embedding, one all-gather of the logits."""
    full = show_json(capsys, "examples/llama2-70b.yaml")
    shard = show_json(capsys, "examples/llama2-70b.yaml", "--tp", str(tp))["shard"]
    d, layers, vocab, d_ff, head_dim = 8192, 80, 32000, 28672, 128
    kv_rows = max(8 // tp, 1) * head_dim  # a rank's KV heads: 1 at tp 8, and at tp 16 (shared by 2)
    layer = 2 * d * d // tp + 2 * kv_rows * d + 3 * d * d_ff // tp + 2 * d
    assert shard["params_per_rank"] == layers * layer + 2 * vocab * d // tp + d
    assert full["params_total"] == layers * (2 * d * d + 2 * 8 * head_dim * d + 3 * d * d_ff + 2 * d) + 2 * vocab * d + d
    assert shard["kv_cache_bytes_per_token_per_rank"] == full["kv_cache_bytes_per_token"] * replication // tp
    assert shard["kv_replication"] == replication
    reduce, gather = shard["collectives"]["all_reduce"], shard["collectives"]["all_gather"]
    assert reduce["count"] == 2 * layers + 1 and gather["count"] == 1
    ring = 2 * (tp - 1)  # an all-reduce of n bytes sends 2 (N - 1) / N x n
    # the layers' activations are f32; the embedding's rows stay the table's bf16 until the first norm
    assert reduce["bytes_per_token"] == 2 * layers * (d * 4 * ring // tp) + d * 2 * ring // tp
    assert gather["bytes_per_token"] == vocab * 4 * (tp - 1) // tp


def test_cli_refuses_with_exit_2(capsys):
    assert main(["show", "examples/tiny-llama3.yaml", "--tp", "3"]) == 2
    err = capsys.readouterr().err
    assert "3 ranks do not divide" in err and "Traceback" not in err


def test_a_sharded_graph_runs_as_a_world_only():
    graph = load("examples/tiny-llama3.yaml")
    sharded, _ = apply_pass(ShardPass(tp=2), graph)
    from irc.interpreter import Interpreter
    out = Interpreter(sharded).run(random_feeds(graph, batch=1, tokens=3))
    assert out["logits"].shape == (1, 3, 256) and np.isfinite(out["logits"]).all()


@pytest.mark.parametrize("spec", ["examples/tiny-llama3.yaml", "examples/tiny-qwen3-next-80b-a3b.yaml",
                                  "examples/tiny-mamba2-2.7b.yaml"])
def test_pipeline_stages_equal_the_unsharded_graph(spec):
    """shard{pp=2}: each stage's rank runs its layers, the residual stream (and anything else a
    later layer reads) crossing in pipes; the same outputs, caches and states, and tokens."""
    graph = load(spec)
    sharded, changed = apply_pass(ShardPass(pp=2), graph)
    assert changed and any(n.op == "pipe" for n in sharded.nodes)
    assert compare_outputs(graph, sharded, random_feeds(graph, batch=2, tokens=4, past=2, seed=4)) <= 1e-6
    assert generate(sharded, [5, 9, 2], 6)[0] == generate(graph, [5, 9, 2], 6)[0]


def test_pipeline_refusals():
    with pytest.raises(PassError, match=r"3 layers \(n_layers\), which 2 pipeline stages do not divide"):
        apply_pass(ShardPass(pp=2), load("examples/tiny-deepseek-v3.yaml"))
    with pytest.raises(PassError, match=r"one way at a time"):
        apply_pass(ShardPass(tp=2, pp=2), load("examples/tiny-llama3.yaml"))


def test_llama_70b_in_four_stages(capsys):
    """Every parameter in exactly one stage; a quarter of the KV cache each; the residual stream
    (8,192 f32 a token) crossing three boundaries."""
    full = show_json(capsys, "examples/hf/llama3-70b")
    shard = show_json(capsys, "examples/hf/llama3-70b", "--pp", "4")["shard"]
    assert sum(r["params"] for r in shard["stages"]) == full["params_total"]
    assert all(r["kv_cache_bytes_per_token"] == full["kv_cache_bytes_per_token"] // 4 for r in shard["stages"])
    assert shard["collectives"]["pipe"] == {"count": 3, "payload_bytes_per_token": 3 * 8192 * 4,
                                            "bytes_per_token": 3 * 8192 * 4}


TWINS = ["llama-gqa-llama3-rope", "llama-mqa-odd-head-dim-tied-linear", "qwen3-moe", "deepseek-v3-q-lora-yarn",
         "deepseek-v3-direct-q-half-rope"]


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.frontends.test_hf_models import build_case, built_once
    return built_once(build_case, tmp_path_factory)


@pytest.mark.parametrize("degrees", [dict(tp=2), dict(tp=4), dict(tp=2, ep=2), dict(pp=2)])
@pytest.mark.parametrize("name", TWINS)
def test_hf_twins_sharded_equal_their_unsharded_graphs(twins, name, degrees):
    """Tiny transformers twins with their checkpoints' weights (Llama GQA and MQA with a tied
    head, Qwen3-MoE with q/k norms, DeepSeek-V3's MLA + MoE, low-rank and direct q): at tp 2
    and 4, ep 2 and pp 2 the unsharded logits and caches."""
    from frontends import load_spec

    graph = load_spec(str(twins(name)[1]))
    sharded, changed = apply_pass(ShardPass(**degrees), graph)
    assert changed
    assert compare_outputs(graph, sharded, random_feeds(graph, batch=2, tokens=5, past=3, seed=5)) <= 1e-5


@pytest.fixture(scope="module")
def delta_twins(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.frontends.test_hf_delta import TWINS
    from tests.frontends.twins import built
    return built(TWINS, tmp_path_factory)  # name -> (model, folder)


@pytest.mark.parametrize("name", ["qwen3-next-moe", "qwen3.5-dense", "qwen3.5-moe"])
def test_gated_deltanet_splits_by_key_heads(delta_twins, name):
    """Qwen3-Next (fused, key-head-grouped projections; the gated attention's output gate) and
    Qwen3.5 (split q | k | v projections) at tp 2: the DeltaNet's convolution, states and
    heads split; the unsharded logits, caches and states; no matrix left whole but the router."""
    from frontends import load_spec

    graph = load_spec(str(delta_twins(name)[1]))
    shard = ShardPass(tp=2)
    sharded, _ = apply_pass(shard, graph)
    assert compare_outputs(graph, sharded, random_feeds(graph, batch=2, tokens=5, past=3, seed=6)) <= 1e-5
    assert any(n.op == "gated_delta_rule" and n.attrs["key_heads"] == 1 for n in sharded.nodes)
    assert not [note for note in shard.notes if "stay whole" in note and "ssm" in note]


@pytest.fixture(scope="module")
def ssm_twins(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.frontends.test_hf_models import built_once
    from tests.frontends.test_hf_ssm import build_case
    return built_once(build_case, tmp_path_factory)  # name -> (model, folder)


@pytest.mark.parametrize("name, tp", [("mamba2-groups", 2), ("mamba2-groups", 4), ("mamba2-one-group-no-conv-bias", 4),
                                      ("bamba-partial-rotary", 2), ("granite-moe-shared-rope-multipliers", 2),
                                      ("nemotron-h-pattern", 2), ("nemotron-h-mlp-bias-one-group", 4)])
def test_mamba2_twins_split_by_heads(ssm_twins, name, tp):
    """transformers' Mamba-2, Bamba, Granite-4 and Nemotron-H twins (their checkpoints' weights):
    the scan's heads, the convolution's channels, the states and Nemotron's squared-ReLU MLP
    split; the unsharded logits, caches and states; no matrix left whole."""
    from frontends import load_spec

    graph = load_spec(str(ssm_twins(name)[1]))
    shard = ShardPass(tp=tp)
    sharded, _ = apply_pass(shard, graph)
    assert compare_outputs(graph, sharded, random_feeds(graph, batch=2, tokens=5, past=3, seed=8)) <= 1e-5
    assert not [note for note in shard.notes if "stay whole" in note]


def test_moe_sort_leaves_expert_parallel_moe_and_says_why():
    from passes.moe_sort import MoeSort

    graph = load(SPECS["mixtral-moe"])
    sharded, _ = apply_pass(ShardPass(tp=2, ep=2), graph)
    sort = MoeSort()
    _, changed = apply_pass(sort, sharded)
    assert not changed and any("spread over ranks" in note for note in sort.notes)
