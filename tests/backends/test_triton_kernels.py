"""Each generated Triton kernel against the reference op, run by Triton's interpreter on CPU.

One-op (or one-pattern) graphs are emitted as Triton modules and run on random fp32 and
fp16 inputs at small odd sizes (T = 5, not a multiple of any block; head dims 16/32/64;
row widths that are not powers of two), compared with the NumPy reference interpreter:
1e-5 relative in fp32, 2e-2 in fp16 (the reference rounds at node boundaries, the
kernels keep fused chains in fp32).
"""
from __future__ import annotations

from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("triton")  # the optional `triton` extra

import passes  # noqa: E402,F401  (registers the passes)
from irc.interpreter import random_feeds, run  # noqa: E402
from backends.triton.emit import emit_module, load_module  # noqa: E402
from irc.build import emit, emit1  # noqa: E402
from irc.dtypes import DType  # noqa: E402
from irc.graph import Graph  # noqa: E402
from irc.passmanager import PassManager, parse_pipeline  # noqa: E402
from irc.check import relative_error  # noqa: E402
from irc.weights import seed_absent  # noqa: E402

F32, F16 = DType.f32, DType.f16
TOLERANCE = {F32: 1e-5, F16: 2e-2}
DTYPES = pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])


def check(graph: Graph, tmp_path, feeds: dict, dtype: DType, pipeline: str = "", tolerance=None) -> dict:
    """Emit ``graph`` (after ``pipeline``), run it on ``feeds`` and compare every output
    with the reference interpreter; returns the emitted module."""
    seed_absent(graph)
    if pipeline:
        PassManager(parse_pipeline(pipeline)).run(graph)
    path = str(tmp_path / f"{graph.name}.py")
    emit_module(graph, path, source="test")
    module = load_module(path)
    expected = run(graph, feeds)
    actual = module.forward(module.load_weights(), **feeds)
    for name, want in expected.items():
        got = actual[name].cpu()
        got = got.float().numpy() if got.is_floating_point() else got.numpy()
        error = relative_error(got, want.astype(np.float32) if want.dtype.kind == "f" else want)
        assert error <= (tolerance or TOLERANCE[dtype]), f"{name}: relative error {error:.2e}"
    return module


def new_graph(name: str) -> Graph:
    graph = Graph(name)
    graph.meta = {"vocab_size": 50}
    return graph


def cached_attention_graph(name: str, dtype: DType, heads: int, kv_heads: int, head_dim: int, attrs=None,
                           extra=None) -> Graph:
    """One attention over a past cache with a padding mask (q, k, v, attention_mask and the
    past caches inputs; out and the present caches outputs); ``extra(graph)`` gives the operands
    after the past (sinks, blocks, ALiBi slopes), ``attrs`` the op's attributes beyond its sizes."""
    g = new_graph(name)
    q = g.add_input("q", dtype, ("B", "T", heads * head_dim))
    k = g.add_input("k", dtype, ("B", "T", kv_heads * head_dim))
    v = g.add_input("v", dtype, ("B", "T", kv_heads * head_dim))
    mask = g.add_input("attention_mask", DType.i64, ("B", "P+T"))
    past = [g.add_input(f"past_key_values.0.{role}", dtype, ("B", kv_heads, "P", head_dim))
            for role in ("key", "value")]
    g.outputs = list(emit(g, "attention", [q, k, v, mask, *past, *(extra(g) if extra else [])],
                          {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, **(attrs or {})},
                          ["out", "present.0.key", "present.0.value"]))
    return g


# ---- row kernels: norms, residual adds, elementwise chains, embedding -----------------------

@DTYPES
def test_residual_add_rms_norm(tmp_path, dtype):
    g = new_graph("add_rms_norm")
    x = g.add_input("x", dtype, ("B", "T", 48))
    r = g.add_input("r", dtype, ("B", "T", 48))
    h = emit1(g, "add", [x, r], name="h")
    n = emit1(g, "rms_norm", [h, g.add_param("norm", dtype, (48,))], {"eps": 1e-5, "offset": 1.0}, "n")
    g.outputs = [h, n]
    module = check(g, tmp_path, random_feeds(g, batch=2, tokens=5), dtype)
    assert "def add_rms_norm(" in open(module.__file__).read()


@DTYPES
def test_elementwise_chain_is_one_kernel(tmp_path, dtype):
    g = new_graph("chain")
    x = g.add_input("x", dtype, ("B", "T", 24))
    y = g.add_input("y", dtype, ("B", "T", 24))
    gate = g.add_input("gate", dtype, ("B", "T", 1))
    v = emit1(g, "mul", [x, y])
    v = emit1(g, "silu", [v])
    v = emit1(g, "add", [v, g.add_param("bias", dtype, (24,))])
    v = emit1(g, "tanh", [v])
    v = emit1(g, "mul", [v, gate])
    v = emit1(g, "softcap", [emit1(g, "sub", [v, x])], {"cap": 3.0})
    g.outputs = [v]
    module = check(g, tmp_path, random_feeds(g, batch=2, tokens=5), dtype)
    row_kernels = [k for k, (sig, _, _) in module.KERNEL_SPECS.items() if "BLOCK_R" in sig]
    assert len(module.KERNEL_SPECS) == 1 and len(row_kernels) == 1


@DTYPES
def test_embedding_scale_then_layer_norm_and_gelu(tmp_path, dtype):
    g = new_graph("embed_ln")
    ids = g.add_input("input_ids", DType.i64, ("B", "T"))
    x = emit1(g, "embedding", [ids, g.add_param("embed", dtype, (50, 40))], {"scale": 6.5}, "x")
    n = emit1(g, "layer_norm", [x, g.add_param("ln", dtype, (40,)), g.add_param("ln_bias", dtype, (40,))],
              {"eps": 1e-5}, "n")
    g.outputs = [x, emit1(g, "gelu", [n], {"approximate": "none"}, "act")]
    check(g, tmp_path, random_feeds(g, batch=2, tokens=5), dtype)


# ---- matmuls -------------------------------------------------------------------------------

@DTYPES
def test_linear_bias_softcap_epilogue(tmp_path, dtype):
    g = new_graph("linear_softcap")
    x = g.add_input("x", dtype, ("B", "T", 40))
    y = emit1(g, "linear", [x, g.add_param("w", dtype, (37, 40)), g.add_param("b", dtype, (37,))])
    g.outputs = [emit1(g, "softcap", [y], {"cap": 2.0}, "logits")]
    module = check(g, tmp_path, random_feeds(g, batch=2, tokens=5), dtype)
    assert list(module.KERNEL_SPECS) == ["matmul_bias_softcap"]


@DTYPES
@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_gated_mlp_dual_gemm(tmp_path, dtype, op):
    g = new_graph(op)
    x = g.add_input("x", dtype, ("B", "T", 32))
    weights = [g.add_param(n, dtype, s) for n, s in (("wg", (72, 32)), ("wu", (72, 32)), ("wd", (32, 72)))]
    g.outputs = [emit1(g, op, [x, *weights], name="out")]
    check(g, tmp_path, random_feeds(g, batch=2, tokens=5), dtype)


def test_decomposed_glu_fuses_into_one_dual_gemm(tmp_path):
    g = new_graph("glu")
    x = g.add_input("x", F32, ("B", "T", 32))
    gate = emit1(g, "linear", [x, g.add_param("wg", F32, (48, 32))])
    up = emit1(g, "linear", [x, g.add_param("wu", F32, (48, 32))])
    g.outputs = [emit1(g, "mul", [emit1(g, "silu", [gate]), up], name="hidden")]
    module = check(g, tmp_path, random_feeds(g, batch=2, tokens=5), F32)
    assert list(module.KERNEL_SPECS) == ["matmul_silu_glu"]


def test_gelu_mlp_with_biases(tmp_path):
    g = new_graph("gelu_mlp")
    x = g.add_input("x", F32, ("B", "T", 32))
    params = [g.add_param(n, F32, s) for n, s in (("wu", (48, 32)), ("wd", (32, 48)), ("bu", (48,)), ("bd", (32,)))]
    g.outputs = [emit1(g, "gelu_mlp", [x, *params], {"approximate": "tanh"}, "out")]
    check(g, tmp_path, random_feeds(g, batch=2, tokens=5), F32)


@pytest.mark.parametrize("options", ["bits=4,group=32", "bits=8,symmetric=false", "bits=4,group=32,symmetric=false"])
def test_dequant_matmul(tmp_path, options):
    """int8/int4 codes decoded in the K loop (K = 24 in one 32-block: the block is padded;
    quantize refuses a group that leaves a padded block after others)."""
    g = new_graph("dequant")
    x = g.add_input("x", F32, ("B", "T", 24))
    g.outputs = [emit1(g, "linear", [x, g.add_param("w", F32, (24, 24)), g.add_param("b", F32, (24,))], name="y")]
    module = check(g, tmp_path, random_feeds(g, batch=2, tokens=5), F32, f"quantize{{{options}}}")
    assert list(module.KERNEL_SPECS) == ["dequant_matmul_bias"]


# ---- rope ------------------------------------------------------------------------------------

@DTYPES
@pytest.mark.parametrize("convention,rotary", [("half", None), ("interleaved", None), ("half", 8)])
def test_rope(tmp_path, dtype, convention, rotary):
    """Out of place from a graph input, and in place on a projection's buffer."""
    g = new_graph(f"rope_{convention}")
    x = g.add_input("x", dtype, ("B", "T", 64))
    positions = g.add_input("position_ids", DType.i64, ("B", "T"))
    attrs = {"head_dim": 32, "rotary_dim": rotary, "base": 10000.0, "convention": convention,
             "scaling": {"kind": "linear", "factor": 2.0}}
    q = emit1(g, "linear", [x, g.add_param("wq", dtype, (96, 64))], name="q")
    g.outputs = [emit1(g, "rope", [x, positions], attrs, "x_rope"), emit1(g, "rope", [q, positions], attrs, "q_rope")]
    feeds = random_feeds(g, batch=2, tokens=5, past=3)
    module = check(g, tmp_path, feeds, dtype)
    assert "# in place" in open(module.__file__).read()


# ---- attention ----------------------------------------------------------------------------------

def attention_graph(name, dtype, heads, kv_heads, head_dim, v_dim=None, past=True, **attrs):
    g = new_graph(name)
    v_dim = v_dim or head_dim
    q = g.add_input("q", dtype, ("B", "T", heads * head_dim))
    k = g.add_input("k", dtype, ("B", "T", kv_heads * head_dim))
    v = g.add_input("v", dtype, ("B", "T", kv_heads * v_dim))
    mask = g.add_input("attention_mask", DType.i64, ("B", "P+T" if past else "T"))
    inputs = [q, k, v, mask]
    if past:
        inputs += [g.add_input("past_key_values.0.key", dtype, ("B", kv_heads, "P", head_dim)),
                   g.add_input("past_key_values.0.value", dtype, ("B", kv_heads, "P", v_dim))]
    outs = emit(g, "attention", inputs, {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
                                         "v_head_dim": v_dim if v_dim != head_dim else None, **attrs},
                ["out", "present.0.key", "present.0.value"][:3 if past else 1])
    g.outputs = list(outs)
    return g


@DTYPES
def test_attention_prefill_no_cache(tmp_path, dtype):
    g = attention_graph("attn_nocache", dtype, heads=4, kv_heads=2, head_dim=16, past=False)
    check(g, tmp_path, random_feeds(g, batch=2, tokens=5), dtype)


@DTYPES
def test_attention_prefill_past_window_softcap_padding(tmp_path, dtype):
    g = attention_graph("attn_window", dtype, heads=4, kv_heads=2, head_dim=32, v_dim=16, window=4, softcap=20.0,
                        scale=0.3)
    feeds = random_feeds(g, batch=2, tokens=5, past=7)
    feeds["attention_mask"][1, :3] = 0  # left padding on the second row
    module = check(g, tmp_path, feeds, dtype)
    text = open(module.__file__).read()
    assert "tanh_f32(s / SOFTCAP)" in text and "WINDOW > 0" in text


def test_attention_code_only_for_used_features(tmp_path):
    g = attention_graph("attn_plain", F32, heads=4, kv_heads=2, head_dim=16)
    seed_absent(g)
    emit_module(g, str(tmp_path / "plain.py"))
    text = open(tmp_path / "plain.py").read()
    assert "SOFTCAP *" not in text and "qpos[:, None] - WINDOW" not in text and "tanh_f32" not in text


@DTYPES
@pytest.mark.parametrize("heads,kv_heads,head_dim,batch", [(3, 1, 64, 1), (6, 2, 16, 2)])
def test_attention_decode(tmp_path, dtype, heads, kv_heads, head_dim, batch):
    """T = 1 over a 40-token past: split-KV partials and their combine (MQA, B = 1: three
    splits), or one program per KV head (GQA, groups of 3)."""
    g = attention_graph(f"attn_decode_{kv_heads}", dtype, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                        window=16)
    module = check(g, tmp_path, random_feeds(g, batch=batch, tokens=1, past=40), dtype)
    assert "def attention_combine(" in open(module.__file__).read()


def test_decode_split_counts_agree(tmp_path):
    """The split-KV partials merged by attention_combine equal one pass over the keys."""
    import torch

    g = attention_graph("attn_splits", F32, heads=3, kv_heads=1, head_dim=32)
    seed_absent(g)
    emit_module(g, str(tmp_path / "splits.py"))
    module = load_module(str(tmp_path / "splits.py"))
    rng = np.random.default_rng(0)
    q, k, v = (torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
               for shape in ((1, 1, 3, 32), (1, 1, 45, 32), (1, 1, 45, 32)))
    mask = torch.ones((1, 45), dtype=torch.int64)
    mask[0, :4] = 0
    outputs = []
    for splits in (1, 2, 3):
        out = torch.empty((1, 1, 3, 32))
        module.launch_attention(q, k, v, out, mask, 0.2, splits=splits)
        outputs.append(out)
    assert all(float((o - outputs[0]).abs().max()) < 1e-6 for o in outputs[1:])


# ---- absorbed MLA ---------------------------------------------------------------------------------

def mla_graph(dtype, q_lora_rank):
    g = new_graph(f"mla_{q_lora_rank}")
    heads, rank, rope, d = 4, 16, 8, 32
    x = g.add_input("x", dtype, ("B", "T", d))
    positions = g.add_input("position_ids", DType.i64, ("B", "T"))
    mask = g.add_input("attention_mask", DType.i64, ("B", "P+T"))
    latent = g.add_input("past_key_values.0.key", dtype, ("B", 1, "P", rank))
    rope_key = g.add_input("past_key_values.0.value", dtype, ("B", 1, "P", rope))
    width = heads * (rank + rope)
    if q_lora_rank is None:
        query = [g.add_param("wq_absorbed", dtype, (width, d)), None, None, None]
    else:
        query = [None, g.add_param("q_a", dtype, (q_lora_rank, d)), g.add_param("q_a_norm", dtype, (q_lora_rank,)),
                 g.add_param("q_b_absorbed", dtype, (width, q_lora_rank))]
    weights = [g.add_param("kv_a", dtype, (rank + rope, d)), g.add_param("kv_a_norm", dtype, (rank,)),
               g.add_param("wo_absorbed", dtype, (d, heads * rank))]
    rope_config = {"base": 10000.0, "convention": "interleaved",
                   "scaling": {"kind": "yarn", "factor": 4.0, "original_max_position": 16, "mscale": 0.707,
                               "mscale_all_dim": 0.707}}
    g.outputs = emit(g, "mla_absorbed_attention", [x, positions, mask, latent, rope_key, *query, *weights],
                     {"heads": heads, "q_lora_rank": q_lora_rank, "kv_lora_rank": rank, "qk_nope_head_dim": 16,
                      "qk_rope_head_dim": rope, "v_head_dim": 16, "rope": rope_config},
                     ["out", "present.0.key", "present.0.value"])
    return g


@DTYPES
@pytest.mark.parametrize("q_lora_rank,tokens", [(None, 5), (24, 1)])
def test_mla_absorbed_attention(tmp_path, dtype, q_lora_rank, tokens):
    g = mla_graph(dtype, q_lora_rank)
    check(g, tmp_path, random_feeds(g, batch=2, tokens=tokens, past=6), dtype)


def mla_latent_graph(dtype, q_lora_rank):
    """mla_latent_attention (run-time absorption): W^UK and W^UV per head, d_c 24 wider than nope 16."""
    g = new_graph(f"mla_latent_{q_lora_rank}")
    heads, rank, nope, rope, v_dim, d = 4, 24, 16, 8, 12, 32
    x = g.add_input("x", dtype, ("B", "T", d))
    positions = g.add_input("position_ids", DType.i64, ("B", "T"))
    mask = g.add_input("attention_mask", DType.i64, ("B", "P+T"))
    latent = g.add_input("past_key_values.0.key", dtype, ("B", 1, "P", rank))
    rope_key = g.add_input("past_key_values.0.value", dtype, ("B", 1, "P", rope))
    width = heads * (nope + rope)
    if q_lora_rank is None:
        query = [g.add_param("wq", dtype, (width, d)), None, None, None]
    else:
        query = [None, g.add_param("q_a", dtype, (q_lora_rank, d)), g.add_param("q_a_norm", dtype, (q_lora_rank,)),
                 g.add_param("q_b", dtype, (width, q_lora_rank))]
    weights = [g.add_param("kv_a", dtype, (rank + rope, d)), g.add_param("kv_a_norm", dtype, (rank,)),
               g.add_param("kv_b.uk", dtype, (heads, nope, rank)), g.add_param("kv_b.uv", dtype, (heads, v_dim, rank)),
               g.add_param("wo", dtype, (d, heads * v_dim))]
    rope_config = {"base": 10000.0, "convention": "half", "scaling": None}
    g.outputs = emit(g, "mla_latent_attention", [x, positions, mask, latent, rope_key, *query, *weights],
                     {"heads": heads, "q_lora_rank": q_lora_rank, "kv_lora_rank": rank, "qk_nope_head_dim": nope,
                      "qk_rope_head_dim": rope, "v_head_dim": v_dim, "rope": rope_config},
                     ["out", "present.0.key", "present.0.value"])
    return g


@DTYPES
@pytest.mark.parametrize("q_lora_rank,tokens", [(None, 5), (24, 1)])
def test_mla_latent_attention(tmp_path, dtype, q_lora_rank, tokens):
    g = mla_latent_graph(dtype, q_lora_rank)
    check(g, tmp_path, random_feeds(g, batch=2, tokens=tokens, past=6), dtype)


# ---- MoE grouped GEMMs ---------------------------------------------------------------------------

def moe_graph(dtype, shared):
    """E = 4 experts, top-2; ``shared``: False, True, or "gated" (Qwen2-MoE's sigmoid gate)."""
    g = new_graph(f"moe_{shared}")
    x = g.add_input("x", dtype, ("B", "T", 32))
    experts, f = 4, 24
    params = [g.add_param("router", dtype, (experts, 32)), g.add_param("w_gate", dtype, (experts, f, 32)),
              g.add_param("w_up", dtype, (experts, f, 32)), g.add_param("w_down", dtype, (experts, 32, f)), None]
    if shared:
        params += [g.add_param("shared_gate", dtype, (40, 32)), g.add_param("shared_up", dtype, (40, 32)),
                   g.add_param("shared_down", dtype, (32, 40))]
    if shared == "gated":
        params.append(g.add_param("shared_expert_gate", dtype, (1, 32)))
    g.outputs = [emit1(g, "moe", [x, *params], {"experts": experts, "top_k": 2}, "out")]
    return g


@DTYPES
@pytest.mark.parametrize("shared", [True, False, "gated"])
def test_moe_sorted_grouped_gemms(tmp_path, dtype, shared):
    g = moe_graph(dtype, shared)
    module = check(g, tmp_path, random_feeds(g, batch=2, tokens=5), dtype, "moe-sort")
    assert {"moe_glu_gemm", "moe_down_gemm"} <= set(module.KERNEL_SPECS)


def test_moe_dropped_rows_and_int4_experts(tmp_path):
    """capacity_factor drops token slots (rows past indptr[E] are never computed); experts
    quantized to int4 decode inside the grouped GEMMs."""
    g = moe_graph(F32, shared=True)
    module = check(g, tmp_path, random_feeds(g, batch=2, tokens=5), F32,
                   "moe-sort{capacity_factor=0.5},quantize{bits=4,group=8}")
    assert {"dequant_moe_glu_gemm", "dequant_moe_down_gemm"} <= set(module.KERNEL_SPECS)
