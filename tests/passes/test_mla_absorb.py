"""mla-absorb: attention over the cached latent, W^UK and W^UV applied at run time (the
default: per-head views of kv_b, no new params) or folded into the query and output weights
(fold_weights=true). The caches change shape, so equivalence is held on prefill and on
decoding with each graph fed its own caches back."""
import importlib.util
import json
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from backends.numpy.emit import emit_module
from irc.interpreter import Interpreter, cache_inputs, present_name, random_feeds, run
from frontends import load_spec
from irc import dims
from irc.build import emit, emit1
from irc_cli import main
from irc.dtypes import DType
from irc.errors import PassError
from irc.graph import Graph
from irc.parser import parse_graph
from irc.printer import print_graph
from irc.check import compare_outputs, compare_own_caches, relative_error
from irc.testing import apply_pass, assert_pass, assert_unchanged
from irc.weights import Derived, seed_absent
from passes.mla_absorb import MlaAbsorb

F32 = DType.f32
RUNTIME, FOLD = MlaAbsorb(), MlaAbsorb(fold_weights=True)
VARIANTS = {"runtime": (RUNTIME, "mla_latent_attention"), "fold": (FOLD, "mla_absorbed_attention")}
YARN = {"kind": "yarn", "factor": 4.0, "original_max_position": 16, "mscale": 1.0, "mscale_all_dim": 0.8}


def mla_graph(heads=2, d=32, q_lora_rank=16, kv_lora_rank=12, nope=8, rope=4, v_dim=6, convention="interleaved",
              scaling=YARN, caches=True, rotate=True) -> Graph:
    """One mla_attention layer over x [B,T,d], with its caches as graph inputs/outputs
    unless ``caches`` is False; params seeded. ``rotate`` False: NoPE MLA (the op's rope
    None), no position_ids input."""
    g = Graph("mla")
    x = g.add_input("x", F32, ("B", "T", d))
    mask = g.add_input("attention_mask", DType.i64, ("B", "P+T" if caches else "T"))
    positions = g.add_input("position_ids", DType.i64, ("B", "T")) if rotate else None
    past_key = past_value = None
    if caches:
        past_key = g.add_input("past_key_values.0.key", F32, ("B", heads, "P", nope + rope))
        past_value = g.add_input("past_key_values.0.value", F32, ("B", heads, "P", v_dim))
    shapes = {"kv_a": (kv_lora_rank + rope, d), "kv_a_norm": (kv_lora_rank,),
              "kv_b": (heads * (nope + v_dim), kv_lora_rank), "wo": (d, heads * v_dim)}
    if q_lora_rank is None:
        shapes["wq"] = (heads * (nope + rope), d)
    else:
        shapes.update(q_a=(q_lora_rank, d), q_a_norm=(q_lora_rank,), q_b=(heads * (nope + rope), q_lora_rank))
    p = {name: g.add_param(f"layers.0.attn.{name}", F32, shape) for name, shape in sorted(shapes.items())}
    seed_absent(g)
    attrs = {"heads": heads, "q_lora_rank": q_lora_rank, "kv_lora_rank": kv_lora_rank, "qk_nope_head_dim": nope,
             "qk_rope_head_dim": rope, "v_head_dim": v_dim,
             "rope": {"base": 10000.0, "convention": convention, "scaling": scaling} if rotate else None}
    g.outputs = emit(g, "mla_attention", [x, positions, mask, past_key, past_value, p.get("wq"), p.get("q_a"),
                                          p.get("q_a_norm"), p.get("q_b"), p["kv_a"], p["kv_a_norm"], p["kv_b"],
                                          p["wo"]],
                     attrs, ["out", "present.0.key", "present.0.value"])
    return g


def run_chunks(graph: Graph, chunks: list, seed: int = 0) -> list:
    """Run ``graph`` over successive feeds (no caches in them), starting from empty caches
    and feeding each ``present.*`` back as ``past_key_values.*``; the outputs per chunk."""
    interp = Interpreter(graph.clone(), seed)
    batch = len(next(iter(chunks[0].values())))
    state = {c.name: np.zeros(dims.evaluate_shape(c.shape, {"B": batch, "P": 0}), c.dtype.numpy)
             for c in cache_inputs(graph)}
    results = []
    for feeds in chunks:
        outputs = interp.run({**feeds, **state})
        state = {name: outputs[present_name(name)] for name in state}
        results.append(outputs)
    return results


def decode_chunks(prompts: list, steps: int, vocab: int, seed: int = 0) -> list:
    """Left-padded prompts in one batch, then ``steps`` single-token steps of seeded ids."""
    width = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), width), np.int64)
    mask = np.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = prompt
        mask[row, width - len(prompt):] = 1
    positions = np.maximum(np.cumsum(mask, axis=-1) - 1, 0)
    rng = np.random.default_rng(seed)
    chunks = [{"input_ids": ids, "attention_mask": mask, "position_ids": positions}]
    for _ in range(steps):
        mask = np.concatenate([mask, np.ones((len(prompts), 1), np.int64)], axis=1)
        positions = positions[:, -1:] + 1
        chunks.append({"input_ids": rng.integers(0, vocab, (len(prompts), 1)), "attention_mask": mask,
                       "position_ids": positions})
    return chunks


def assert_same_per_chunk(before: Graph, after: Graph, chunks: list, name: str, rtol: float = 1e-5) -> None:
    for step, (want, got) in enumerate(zip(run_chunks(before, chunks), run_chunks(after, chunks))):
        error = relative_error(got[name], want[name])
        assert error <= rtol, f"step {step}: %{name} moved by {error:.3g}"


# ---- the rewrite -------------------------------------------------------------------------

def test_absorbs_q_lora_mla_at_run_time():
    assert assert_pass(RUNTIME, mla_graph(), golden="mla-absorb")


def test_folds_q_lora_mla():
    assert assert_pass(FOLD, mla_graph(), golden="mla-absorb-fold")


def test_runtime_absorption_of_a_direct_query_keeps_the_checkpoint_params():
    g = mla_graph(q_lora_rank=None, convention="half", scaling=None)
    assert assert_pass(RUNTIME, g)
    after, _ = apply_pass(RUNTIME, g)
    assert sorted(after.params) == ["layers.0.attn.kv_a", "layers.0.attn.kv_a_norm", "layers.0.attn.kv_b.uk",
                                    "layers.0.attn.kv_b.uv", "layers.0.attn.wo", "layers.0.attn.wq"]
    assert sum(p.numel for p in after.params.values()) == sum(p.numel for p in g.params.values())


def test_views_are_kv_b_itself_per_head():
    g = mla_graph()
    kv_b = g.params["layers.0.attn.kv_b"].data = g.params["layers.0.attn.kv_b"].array()  # loaded, as a checkpoint
    after, _ = apply_pass(RUNTIME, g)
    w_uk, w_uv = after.params["layers.0.attn.kv_b.uk"].array(), after.params["layers.0.attn.kv_b.uv"].array()
    assert w_uk.shape == (2, 8, 12) and w_uv.shape == (2, 6, 12)
    # no new weights: the checkpoint's element count, and no param shaped like a folded query
    # weight [H*(d_c+rope), q_lora] = [32, 16] (q_b is [H*(nope+rope), q_lora] = [24, 16])
    assert sum(p.numel for p in after.params.values()) == sum(p.numel for p in g.params.values())
    assert not any(p.shape == (2 * (12 + 4), 16) for p in after.params.values())
    folded, _ = apply_pass(FOLD, g)
    assert any(p.shape == (2 * (12 + 4), 16) for p in folded.params.values())  # the check can fail
    assert np.shares_memory(w_uk, kv_b) and np.shares_memory(w_uv, kv_b)  # views: no copy
    per_head = kv_b.reshape(2, 14, 12)
    np.testing.assert_array_equal(w_uk, per_head[:, :8])
    np.testing.assert_array_equal(w_uv, per_head[:, 8:])
    np.testing.assert_array_equal(after.params["layers.0.attn.kv_b.uv"].data.rows(1, 2), per_head[1:, 8:])


@pytest.mark.parametrize("variant", VARIANTS)
def test_halved_caches_hold_the_latent_and_rope_key_in_two_equal_widths(variant):
    g = mla_graph()  # d_c 12 + rope 4: two halves of 8
    pass_obj = MlaAbsorb(cache="halves", fold_weights=variant == "fold")
    assert assert_pass(pass_obj, g, golden="mla-absorb-halves" if variant == "runtime" else None)
    after, _ = apply_pass(pass_obj, g)
    types = {v.name: v.type_str() for v in [*after.inputs, *after.outputs]}
    assert types["past_key_values.0.key"] == types["past_key_values.0.value"] == "f32[B,1,P,8]"
    assert types["present.0.key"] == types["present.0.value"] == "f32[B,1,P+T,8]"
    joined = np.concatenate([run_chunks(after, [random_feeds(g, batch=2, tokens=3, past=0)])[0][f"present.0.{k}"]
                             for k in ("key", "value")], axis=-1)
    split, _ = apply_pass(VARIANTS[variant][0], g)
    [want] = run_chunks(split, [random_feeds(g, batch=2, tokens=3, past=0)])
    np.testing.assert_array_equal(joined, np.concatenate([want["present.0.key"], want["present.0.value"]], axis=-1))
    assert_same_per_chunk(g, after, decode_chunks_x(), "out")


def test_halved_caches_need_an_even_width_and_a_known_layout():
    assert_unchanged(MlaAbsorb(cache="halves"), mla_graph(kv_lora_rank=11))
    with pytest.raises(PassError, match="cache must be one of split, halves"):
        apply_pass(MlaAbsorb(cache="half"), mla_graph())


def decode_chunks_x(d: int = 32) -> list:
    """x chunks of 3, 1, 1 tokens for a batch of two, the first row left-padded by one."""
    rng = np.random.default_rng(3)
    chunks, past, mask = [], 0, np.array([[0, 1, 1], [1, 1, 1]], np.int64)
    for tokens in (3, 1, 1):
        mask = mask if not chunks else np.concatenate([mask, np.ones((2, tokens), np.int64)], axis=1)
        chunks.append({"x": rng.standard_normal((2, tokens, d)).astype(np.float32), "attention_mask": mask,
                       "position_ids": np.arange(past, past + tokens)[None].repeat(2, axis=0)})
        past += tokens
    return chunks


def test_absorbs_direct_query():
    g = mla_graph(q_lora_rank=None, convention="half", scaling=None)
    assert assert_pass(FOLD, g)
    after, _ = apply_pass(FOLD, g)
    assert sorted(after.params) == ["layers.0.attn.kv_a", "layers.0.attn.kv_a_norm", "layers.0.attn.wo_absorbed",
                                    "layers.0.attn.wq_absorbed"]
    assert after.params["layers.0.attn.wq_absorbed"].shape == (2 * (12 + 4), 32)


@pytest.mark.parametrize("variant", VARIANTS)
def test_caches_become_latent_and_rope_key(variant):
    pass_obj, op = VARIANTS[variant]
    after, changed = apply_pass(pass_obj, mla_graph())
    types = {v.name: v.type_str() for v in [*after.inputs, *after.outputs]}
    assert changed and [v.name for v in after.inputs] == [v.name for v in mla_graph().inputs]
    assert types["past_key_values.0.key"] == "f32[B,1,P,12]" and types["past_key_values.0.value"] == "f32[B,1,P,4]"
    assert types["present.0.key"] == "f32[B,1,P+T,12]" and types["present.0.value"] == "f32[B,1,P+T,4]"
    assert [n.op for n in after.nodes] == [op]
    assert "layers.0.attn.kv_b" not in after.params
    assert ("layers.0.attn.q_b" in after.params) == (variant == "runtime")
    assert print_graph(parse_graph(print_graph(after))) == print_graph(after)


def test_absorbed_weights_are_lazy_and_fold_per_head():
    g = mla_graph()
    after, _ = apply_pass(FOLD, g)
    q_abs, wo_abs = after.params["layers.0.attn.q_b_absorbed"], after.params["layers.0.attn.wo_absorbed"]
    assert isinstance(q_abs.data, Derived) and isinstance(wo_abs.data, Derived)
    q_b, kv_b, wo = (g.params[f"layers.0.attn.{n}"].array().astype(np.float64) for n in ("q_b", "kv_b", "wo"))
    heads, rank, nope, rope, v_dim = 2, 12, 8, 4, 6
    q_heads = q_b.reshape(heads, nope + rope, -1)
    kv_heads = kv_b.reshape(heads, nope + v_dim, rank)
    for h in range(heads):
        w_uk, w_uv = kv_heads[h, :nope], kv_heads[h, nope:]
        rows = q_abs.array()[h * (rank + rope):(h + 1) * (rank + rope)]
        np.testing.assert_allclose(rows[:rank], w_uk.T @ q_heads[h, :nope], rtol=1e-5)
        np.testing.assert_array_equal(rows[rank:], q_heads[h, nope:].astype(np.float32))
        np.testing.assert_allclose(wo_abs.array()[:, h * rank:(h + 1) * rank], wo[:, h * v_dim:(h + 1) * v_dim] @ w_uv,
                                   rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_absorbs_a_layer_without_caches(variant):
    g = mla_graph(caches=False)
    assert [v.name for v in g.outputs] == ["out"]
    assert assert_pass(VARIANTS[variant][0], g)


def test_shape_only_compile_of_deepseek_v2_keeps_its_params_and_fails_only_on_load():
    g = load_spec("examples/deepseek-v2.yaml")
    after, changed = apply_pass(RUNTIME, g)
    assert changed and sum(p.numel for p in after.params.values()) == 235_741_434_880
    w_uk = after.params["layers.5.attn.kv_b.uk"]
    assert w_uk.shape == (128, 128, 512) and after.params["layers.5.attn.kv_b.uv"].shape == (128, 128, 512)
    with pytest.raises(ValueError, match="no data"):
        w_uk.array()


def test_shape_only_compile_gives_shapes_and_fails_only_on_load():
    g = load_spec("examples/deepseek-v2.yaml")
    after, changed = apply_pass(FOLD, g)
    q_abs = after.params["layers.5.attn.q_b_absorbed"]
    assert changed and q_abs.shape == (128 * (512 + 64), 1536)
    assert after.params["layers.5.attn.wo_absorbed"].shape == (5120, 128 * 512)
    with pytest.raises(ValueError, match="no data"):
        q_abs.array()


@pytest.mark.parametrize("variant", VARIANTS)
def test_leaves_graphs_without_mla_alone(tiny_llama, variant):
    assert_unchanged(VARIANTS[variant][0], tiny_llama)


@pytest.mark.parametrize("variant", VARIANTS)
def test_refuses_a_computed_kv_b(variant):
    g = mla_graph()
    node = g.nodes[0]
    kv_b = node.inputs[11]
    node.set_input(11, emit1(g, "mul", [kv_b, emit1(g, "constant", [], {"value": 1.0}, "one", before=node)],
                             None, "kv_b.scaled", before=node))
    assert_unchanged(VARIANTS[variant][0], g)


def test_runtime_absorption_takes_a_computed_wo():
    g = mla_graph()
    node = g.nodes[0]
    wo = node.inputs[12]
    node.set_input(12, emit1(g, "mul", [wo, emit1(g, "constant", [], {"value": 1.0}, "one", before=node)],
                             None, "wo.scaled", before=node))
    assert assert_pass(RUNTIME, g)
    assert_unchanged(FOLD, g)


@pytest.mark.parametrize("variant", VARIANTS)
def test_cache_layout_is_transformers_deepseek_v2_cache(variant):
    """transformers' DeepseekV2Attention caches key = the normalised latent [B,1,S,d_c] and
    value = the rotated RoPE key [B,1,S,rope] (interleaved); the absorbed presents are those."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as v2
    config = transformers.DeepseekV2Config(
        hidden_size=32, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=16, kv_lora_rank=12,
        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    layer, rotary = v2.DeepseekV2Attention(config, 0).eval(), v2.DeepseekV2RotaryEmbedding(config)
    g = mla_graph(scaling=None)
    for ours, theirs in [("q_a", "q_a_proj"), ("q_a_norm", "q_a_layernorm"), ("q_b", "q_b_proj"),
                         ("kv_a", "kv_a_proj_with_mqa"), ("kv_a_norm", "kv_a_layernorm"), ("kv_b", "kv_b_proj"),
                         ("wo", "o_proj")]:
        g.params[f"layers.0.attn.{ours}"].data = getattr(layer, theirs).weight.detach().numpy().copy()
    after, _ = apply_pass(VARIANTS[variant][0], g)
    x = np.random.default_rng(0).standard_normal((2, 5, 32)).astype(np.float32)
    positions = np.arange(5)[None].repeat(2, axis=0)
    cache = transformers.DynamicCache()
    with torch.no_grad():
        layer(torch.from_numpy(x), attention_mask=None, cache=cache,
              position_embeddings=rotary(torch.from_numpy(x), torch.from_numpy(positions)))
    [ours] = run_chunks(after, [{"x": x, "attention_mask": np.ones((2, 5), np.int64), "position_ids": positions}])
    np.testing.assert_allclose(ours["present.0.key"], cache.layers[0].keys.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours["present.0.value"], cache.layers[0].values.numpy(), rtol=1e-5, atol=1e-5)


# ---- numbers: prefill and decoding, each graph with its own caches ------------------------

@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("spec", ["examples/tiny-deepseek-v2.yaml", "examples/tiny-deepseek-v3.yaml"])
def test_tiny_deepseek_prefill_and_16_decode_steps_left_padded(spec, variant):
    """A batch of two uneven prompts (the short one left-padded through attention_mask),
    prefill, then 16 decode steps: logits equal at every step."""
    g = load_spec(spec)
    seed_absent(g)
    after, changed = apply_pass(VARIANTS[variant][0], g)
    assert changed
    chunks = decode_chunks([[5, 17, 200, 3, 99, 42, 7], [11, 250, 8]], steps=16, vocab=256)
    assert_same_per_chunk(g, after, chunks, "logits")
    assert compare_outputs(g, after) <= 1e-5  # the --check path: prefill and one decode step


@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_of_one_layer_matches_at_every_step(variant):
    g = mla_graph()
    after, _ = apply_pass(VARIANTS[variant][0], g)
    rng = np.random.default_rng(1)
    chunks, past = [], 0
    mask = np.array([[0, 0, 1], [1, 1, 1]], np.int64)
    for tokens in (3, 1, 1, 2, 1):
        mask = mask if not chunks else np.concatenate([mask, np.ones((2, tokens), np.int64)], axis=1)
        chunks.append({"x": rng.standard_normal((2, tokens, 32)).astype(np.float32), "attention_mask": mask,
                       "position_ids": np.arange(past, past + tokens)[None].repeat(2, axis=0) + 20})
        past += tokens
    assert_same_per_chunk(g, after, chunks, "out")


@pytest.mark.parametrize("q_lora_rank", [None, 16])
@pytest.mark.parametrize("variant", VARIANTS)
def test_absorbs_mla_without_rope_and_decodes_the_same(variant, q_lora_rank):
    """NoPE MLA (rope None, Kimi-Linear): both forms keep it unrotated and positionless;
    a left-padded prefill and four decode steps give the same output, each graph fed its
    own caches back; the absorbed op prints and parses with its absent position_ids."""
    pass_obj, op = VARIANTS[variant]
    g = mla_graph(q_lora_rank=q_lora_rank, rotate=False)
    after, changed = apply_pass(pass_obj, g)
    assert changed and [n.op for n in after.nodes] == [op]
    assert after.nodes[0].inputs[1] is None and after.nodes[0].attrs["rope"] is None
    assert "position_ids" not in {v.name for v in after.inputs}
    assert print_graph(parse_graph(print_graph(after))) == print_graph(after)
    chunks = [{k: v for k, v in chunk.items() if k != "position_ids"} for chunk in decode_chunks_x()]
    rng = np.random.default_rng(5)
    for _ in range(2):
        mask = np.concatenate([chunks[-1]["attention_mask"], np.ones((2, 1), np.int64)], axis=1)
        chunks.append({"x": rng.standard_normal((2, 1, 32)).astype(np.float32), "attention_mask": mask})
    assert_same_per_chunk(g, after, chunks, "out")
    assert_unchanged(pass_obj, after)


def test_irc_show_reports_the_latent_cache(capsys):
    def show(*extra):
        assert main(["show", "examples/deepseek-v2.yaml", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    before, after = show(), show("--passes", "mla-absorb{fold_weights=true}")
    assert before["kv_cache_elements_per_token_per_layer"] == 128 * (192 + 128)
    assert after["kv_cache_elements_per_token_per_layer"] == 576
    assert after["kv_cache_bytes_per_token"] == 69_120 == after["kv_cache_latent_bytes_per_token"]
    assert after["kv_cache_bytes_mha_equivalent_per_token"] == 3_932_160
    assert {layer["attention"] for layer in after["layers"]} == {"mla_absorbed_attention"}
    # attention over the latent: 2·S·H·(576 + 512) instead of 2·S·H·(192 + 128) per layer, plus
    # the larger absorbed projections (q_b -> q_b_absorbed, wo -> wo_absorbed, kv_b gone)
    attention = 60 * 2 * 4096 * 128 * ((576 + 512) - (192 + 128))
    projections = 60 * 2 * (128 * 576 * 1536 - 128 * 192 * 1536 + 5120 * 128 * 512 - 5120 * 128 * 128
                            - 128 * 256 * 512)
    assert after["flops_per_token"] - before["flops_per_token"] == attention + projections
    assert after["params_total"] - before["params_total"] == projections // 2
    # at run time: the checkpoint's params and projection FLOPs (W^UK and W^UV are kv_b once)
    runtime = show("--passes", "mla-absorb")
    assert runtime["params_total"] == before["params_total"] == 235_741_434_880
    assert runtime["param_bytes"] == before["param_bytes"]
    assert runtime["kv_cache_bytes_per_token"] == 69_120
    assert runtime["flops_per_token"] - before["flops_per_token"] == attention
    assert {layer["attention"] for layer in runtime["layers"]} == {"mla_latent_attention"}
    # both forms side by side (and the un-absorbed one), whichever was compiled
    forms = {f["form"]: f for f in runtime["mla_forms"]["forms"]}
    assert runtime["mla_forms"]["compiled"] == ["runtime"] and after["mla_forms"]["compiled"] == ["folded"]
    assert forms["runtime"]["params"] == 235_741_434_880 and forms["folded"]["params"] == 254_364_144_640
    assert forms["folded"]["param_bytes"] - forms["runtime"]["param_bytes"] == projections  # bf16: 2 bytes each
    assert forms["runtime"]["kv_bytes_per_token"] == forms["folded"]["kv_bytes_per_token"] == 69_120
    assert forms["un-absorbed"]["kv_bytes_per_token"] == 60 * 2 * 128 * (192 + 128)
    assert forms["runtime"]["flops_per_token"]["4096"] == runtime["flops_per_token"]
    assert forms["folded"]["flops_per_token"]["4096"] == after["flops_per_token"]
    for context in ("4096", "32768"):
        assert forms["folded"]["flops_per_token"][context] - forms["runtime"]["flops_per_token"][context] == \
            projections
        assert forms["runtime"]["bytes_per_token"][context] - 69_120 * int(context) == \
            forms["folded"]["bytes_per_token"][context] - 69_120 * int(context) - projections
    assert {r["fastest"] for r in runtime["mla_forms"]["roofline"]} == {"runtime"}
    assert before["mla_forms"]["forms"] == runtime["mla_forms"]["forms"]  # the same numbers from any form
    assert main(["show", "examples/deepseek-v2.yaml", "--passes", "mla-absorb"]) == 0
    text = capsys.readouterr().out
    assert "runtime *    235,741,434,880" in text and "Decode roofline" in text


# ---- backends ------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_numpy_emitter_runs_the_absorbed_graph(tmp_path, variant):
    g = load_spec("examples/tiny-deepseek-v2.yaml")
    seed_absent(g)
    after, _ = apply_pass(VARIANTS[variant][0], g)
    emit_module(after, str(tmp_path / "absorbed_np.py"), source="test")
    spec = importlib.util.spec_from_file_location("absorbed_np", tmp_path / "absorbed_np.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    feeds = random_feeds(after, batch=2, tokens=3, past=2)
    got = module.forward(module.load_weights(), **feeds)
    want = run(after.clone(), feeds)
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    sys.modules.pop("absorbed_np", None)


# ---- property: random small MLA shapes through the check ----------------------------------

@settings(max_examples=40, deadline=None)
@given(heads=st.integers(1, 3), d=st.integers(4, 12), q_lora=st.one_of(st.none(), st.integers(2, 8)),
       rank=st.integers(1, 8), nope=st.integers(1, 6), rope=st.sampled_from([2, 4, 6]), v_dim=st.integers(1, 6),
       convention=st.sampled_from(["half", "interleaved"]), yarn=st.booleans(), tokens=st.integers(1, 3),
       past=st.integers(0, 3), variant=st.sampled_from(sorted(VARIANTS)))
def test_random_mla_shapes_hold_the_check(heads, d, q_lora, rank, nope, rope, v_dim, convention, yarn, tokens, past,
                                          variant):
    g = mla_graph(heads, d, q_lora, rank, nope, rope, v_dim, convention, YARN if yarn else None)
    pass_obj, op = VARIANTS[variant]
    after, changed = apply_pass(pass_obj, g)
    assert changed and print_graph(after).count(op) == 1
    # The check: when the caches' types coincide by accident (one head, d_c = nope + rope and
    # rope = v), compare_outputs cannot tell that they changed; compare_own_caches is what it
    # runs whenever they differ.
    same_types = [v.type_str() for v in g.inputs] == [v.type_str() for v in after.inputs]
    check = compare_own_caches if same_types else compare_outputs
    assert check(g, after, random_feeds(g, batch=2, tokens=tokens, past=past)) <= 1e-5
    rng = np.random.default_rng(past * 10 + tokens)
    chunks = []
    for start, count in ((0, past), (past, tokens)):
        if count:
            chunks.append({"x": rng.standard_normal((2, count, d)).astype(np.float32),
                           "attention_mask": np.ones((2, start + count), np.int64),
                           "position_ids": np.arange(start, start + count)[None].repeat(2, axis=0)})
    assert_same_per_chunk(g, after, chunks, "out")
