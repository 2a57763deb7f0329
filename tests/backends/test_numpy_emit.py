"""The NumPy emitter: the generated module runs where irc cannot be imported and matches the
reference interpreter exactly; its text and weights are deterministic; references that
cannot be copied are refused with the op and the global named, and nothing is written."""
from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from backends.numpy.emit import emit_module, module_source
from irc.interpreter import random_feeds, run
from irc import ops
from irc.build import emit, emit1
from irc.dtypes import DType
from irc.errors import BackendError
from irc.graph import Graph

SITE = os.path.dirname(os.path.dirname(np.__file__))
# the clean interpreter keeps only PATH and the BLAS's own settings: a host that pins OpenBLAS's
# kernel (OPENBLAS_CORETYPE) must run the emitted module on the kernel the interpreter ran on,
# or equal code sums in another order and the bit-exact comparison fails for no fault of either
CLEAN_ENV = {name: value for name, value in os.environ.items() if name == "PATH" or name.startswith("OPENBLAS_")}

# Runs in `python -I -S`: no site hooks, so irc's editable install is invisible; only the
# directory holding numpy (and ml_dtypes) and the emitted module's directory are on the path.
RUNNER = textwrap.dedent("""
    import json, sys
    sys.path[:0] = [sys.argv[1]]
    sys.path.append(sys.argv[2])
    try:
        import irc
    except ImportError:
        pass
    else:
        raise SystemExit("irc is importable here: " + irc.__file__)
    import numpy as np
    import model_np
    feeds = dict(np.load(sys.argv[1] + "/feeds.npz"))
    outputs = model_np.forward(model_np.load_weights(), **feeds)
    dtypes = {name: str(value.dtype) for name, value in outputs.items()}
    np.savez(sys.argv[1] + "/outputs.npz", **{name: value.astype(np.float32) if value.dtype.kind == "V" else value
                                             for name, value in outputs.items()})
    print(json.dumps(dtypes))
""")


def run_emitted(graph, feeds, directory):
    """Emit ``graph`` into ``directory``, run it in a clean interpreter, return its outputs."""
    emit_module(graph, str(directory / "model_np.py"), source="test")
    np.savez(directory / "feeds.npz", **feeds)
    done = subprocess.run([sys.executable, "-I", "-S", "-c", RUNNER, str(directory), SITE], cwd=directory,
                          capture_output=True, text=True, env=CLEAN_ENV, timeout=60)
    assert done.returncode == 0, done.stderr + done.stdout
    dtypes = json.loads(done.stdout)
    with np.load(directory / "outputs.npz") as archive:
        return {name: archive[name].astype(dtype) for name, dtype in dtypes.items()}


def assert_matches_interpreter(graph, feeds, directory):
    expected = run(graph, feeds)
    got = run_emitted(graph, feeds, directory)
    assert list(got) == list(expected)
    for name, want in expected.items():
        assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
        np.testing.assert_array_equal(got[name], want, err_msg=name)


# ---- graphs ----------------------------------------------------------------------------------

def dense_graph():
    """embedding, norms, linear (bf16 weight through cast), reshape over B and T, MLPs, softcap, topk;
    value names that are not identifiers or shadow the module's own names."""
    g = Graph("dense")
    g.meta["vocab_size"] = 32
    ids = g.add_input("input_ids", DType.i64, ("B", "T"))
    p = {name: g.add_param(name, dtype, shape) for name, dtype, shape in [
        ("embed", DType.f32, (32, 16)), ("layers.0.attn_norm", DType.f32, (16,)),
        ("layers.0.wq", DType.bf16, (16, 16)), ("layers.0.bq", DType.f32, (16,)),
        ("mlp.gate", DType.f32, (24, 16)), ("mlp.up", DType.f32, (24, 16)), ("mlp.down", DType.f32, (16, 24)),
        ("ln.weight", DType.f32, (16,)), ("ln.bias", DType.f32, (16,)), ("fc.up", DType.f32, (32, 16)),
        ("fc.down", DType.f32, (16, 32)), ("fc.b_up", DType.f32, (32,)), ("head", DType.f16, (32, 16)),
        ("layers.0.w4", DType.i4, (16, 16))]}
    x = emit1(g, "embedding", [ids, p["embed"]], {"scale": 4.0}, "x")
    h = emit1(g, "rms_norm", [x, p["layers.0.attn_norm"]], {"eps": 1e-5, "offset": 1.0}, "layers.0.h")
    w = emit1(g, "cast", [p["layers.0.wq"]], {"to": "f32"}, "W")
    q = emit1(g, "linear", [h, w, p["layers.0.bq"]], {}, "np")
    w4 = emit1(g, "cast", [p["layers.0.w4"]], {"to": "f32"}, "w4")
    q = emit1(g, "add", [q, emit1(g, "linear", [h, w4], {}, "q4")], {}, "q")
    heads = emit1(g, "reshape", [q], {"shape": ["B", "T", 4, 4]}, "q.BTHD")
    flat = emit1(g, "reshape", [heads], {"shape": ["B*T", 16]}, "forward")
    back = emit1(g, "reshape", [flat], {"shape": ["B", "T", 16]}, "q_BTHD")
    m = emit1(g, "swiglu", [back, p["mlp.gate"], p["mlp.up"], p["mlp.down"]], {}, "1st mlp")
    r = emit1(g, "add", [m, x], {}, "lambda")
    n = emit1(g, "layer_norm", [r, p["ln.weight"], p["ln.bias"]], {}, "ln")
    f = emit1(g, "gelu_mlp", [n, p["fc.up"], p["fc.down"], p["fc.b_up"]], {"approximate": "tanh"}, "fc")
    f = emit1(g, "geglu", [f, p["mlp.gate"], p["mlp.up"], p["mlp.down"]], {}, "geglu")
    half = emit1(g, "cast", [f], {"to": "f16"}, "half")
    logits = emit1(g, "linear", [half, p["head"]], {}, "logits16")
    logits = emit1(g, "cast", [logits], {"to": "f32"}, "logits32")
    capped = emit1(g, "softcap", [logits], {"cap": 3.0}, "logits")
    top, top_ids = emit(g, "topk", [capped], {"k": 3}, ["top", "top.ids"])
    low = emit1(g, "cast", [top], {"to": "bf16"}, "top_bf16")
    g.outputs = [capped, top, top_ids, low]
    return g


def primitives_graph():
    """Every primitive op once, over an input with symbolic B."""
    g = Graph("primitives")
    x = g.add_input("x", DType.f32, ("B", 6))
    y = g.add_input("y", DType.f32, (6,))
    idx = g.add_input("idx", DType.i64, (3,))

    def e(op, inputs, attrs=None):
        return emit1(g, op, inputs, attrs)

    pos = e("add", [e("exp", [x]), e("constant", [], {"value": 0.5})])
    vals = [e(op, [x, y]) for op in ("add", "sub", "mul", "div", "maximum")]
    vals += [e(op, [x]) for op in ("exp", "tanh", "silu", "sigmoid", "cos", "sin", "neg", "gelu")]
    vals += [e("sqrt", [pos]), e("rsqrt", [pos]), e("gelu", [x], {"approximate": "tanh"}), e("softcap", [x], {"cap": 2.0})]
    vals.append(e("where", [e("less", [x, y]), x, e("softmax", [x])]))
    vals.append(e("where", [e("equal", [x, x]), x, y]))
    vals.append(e("expand", [e("reduce_sum", [x], {"axes": [1]})], {"shape": ["B", 6]}))
    vals.append(e("expand", [e("reduce_mean", [x], {"axes": [-1]})], {"shape": ["B", 6]}))
    vals.append(e("expand", [e("reduce_max", [x], {"axes": [1]})], {"shape": ["B", 6]}))
    total = vals[0]
    for v in vals[1:]:
        total = e("add", [total, v])
    mm = e("matmul", [total, e("transpose", [e("slice", [total], {"axis": 0, "start": 0, "end": 1})], {"perm": [1, 0]})])
    both = e("concat", [total, e("neg", [total])], {"axis": 1})
    picked = e("gather", [both, idx], {"axis": 1})
    rows = e("slice", [both], {"axis": 0, "start": 0, "end": 1})
    columns = e("transpose", [picked], {"perm": [1, 0]})
    scattered = e("scatter_add", [columns, idx, e("neg", [columns])])
    order = e("argsort", [rows])
    as_int = e("cast", [e("mul", [rows, e("constant", [], {"value": 4.0})])], {"to": "i32"})
    g.outputs = [mm, scattered, order, as_int]
    return g


def attention_graph():
    """A decode step: rope on q/k, grouped attention over past + new keys with a padding mask,
    caches in and out under names that are not identifiers."""
    g = Graph("decode")
    g.meta["vocab_size"] = 16
    ids = g.add_input("input_ids", DType.i64, ("B", "T"))
    mask = g.add_input("attention_mask", DType.i64, ("B", "P+T"))
    pos = g.add_input("position_ids", DType.i64, ("B", "T"))
    past_k = g.add_input("past_key_values.0.key", DType.f32, ("B", 2, "P", 8))
    past_v = g.add_input("past_key_values.0.value", DType.f32, ("B", 2, "P", 8))
    p = {name: g.add_param(name, DType.f32, shape) for name, shape in [
        ("embed", (16, 32)), ("wq", (32, 32)), ("wk", (16, 32)), ("wv", (16, 32)), ("wo", (32, 32))]}
    x = emit1(g, "embedding", [ids, p["embed"]], {}, "x")
    q = emit1(g, "linear", [x, p["wq"]], {}, "q")
    k = emit1(g, "linear", [x, p["wk"]], {}, "k")
    v = emit1(g, "linear", [x, p["wv"]], {}, "v")
    rope = {"head_dim": 8, "base": 10000.0, "scaling": {"kind": "linear", "factor": 2.0}}
    q = emit1(g, "rope", [q, pos], rope, "q_rot")
    k = emit1(g, "rope", [k, pos], dict(rope, convention="interleaved"), "k_rot")
    out, key, value = emit(g, "attention", [q, k, v, mask, past_k, past_v],
                           {"heads": 4, "kv_heads": 2, "head_dim": 8, "softcap": 20.0, "window": 3},
                           ["attn", "present.0.key", "present.0.value"])
    y = emit1(g, "linear", [out, p["wo"]], {}, "logits")
    g.outputs = [y, key, value]
    return g


def decode_feeds(graph, past=3):
    feeds = random_feeds(graph, batch=2, tokens=2, past=past, seed=1)
    feeds["attention_mask"][0, 0] = 0  # left padding in the first row
    return feeds


def mla_graph():
    g = Graph("mla")
    x = g.add_input("x", DType.f32, ("B", "T", 32))
    mask = g.add_input("attention_mask", DType.i64, ("B", "P+T"))
    pos = g.add_input("position_ids", DType.i64, ("B", "T"))
    past_k = g.add_input("past_key_values.0.key", DType.f32, ("B", 2, "P", 12))
    past_v = g.add_input("past_key_values.0.value", DType.f32, ("B", 2, "P", 8))
    shapes = {"q_a": (16, 32), "q_a_norm": (16,), "q_b": (24, 16), "kv_a": (12, 32), "kv_a_norm": (8,),
              "kv_b": (32, 8), "wo": (32, 16)}
    p = {name: g.add_param(f"mla.{name}", DType.f32, shape) for name, shape in shapes.items()}
    outs = emit(g, "mla_attention", [x, pos, mask, past_k, past_v, None, p["q_a"], p["q_a_norm"], p["q_b"],
                                     p["kv_a"], p["kv_a_norm"], p["kv_b"], p["wo"]],
                {"heads": 2, "q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                 "v_head_dim": 8, "rope": {"base": 10000.0, "convention": "interleaved",
                                           "scaling": {"kind": "yarn", "factor": 4.0, "original_max_position": 16,
                                                       "mscale": 1.0, "mscale_all_dim": 1.0}}},
                ["out", "present.0.key", "present.0.value"])
    g.outputs = list(outs)
    return g


def moe_graph():
    g = Graph("moe")
    x = g.add_input("x", DType.f32, ("B", "T", 16))
    shapes = {"router": (8, 16), "w_gate": (8, 12, 16), "w_up": (8, 12, 16), "w_down": (8, 16, 12),
              "router_bias": (8,), "shared_gate": (10, 16), "shared_up": (10, 16), "shared_down": (16, 10)}
    p = {name: g.add_param(f"moe.{name}", DType.f32, shape) for name, shape in shapes.items()}
    y = emit1(g, "moe", [x, *p.values()], {"experts": 8, "top_k": 3, "scoring": "sigmoid", "n_group": 4,
                                           "topk_group": 2, "group_score": "top2_sum", "routed_scale": 2.5}, "y")
    g.outputs = [y]
    return g


# ---- equivalence -----------------------------------------------------------------------------

def test_dense_graph_matches_the_interpreter_without_irc(tmp_path):
    g = dense_graph()
    assert_matches_interpreter(g, random_feeds(g, batch=2, tokens=5), tmp_path)


def test_every_primitive_matches_the_interpreter(tmp_path):
    g = primitives_graph()
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((3, 6)).astype(np.float32), "y": rng.standard_normal(6).astype(np.float32),
             "idx": np.array([2, 0, 2])}
    assert_matches_interpreter(g, feeds, tmp_path)


def test_decode_attention_with_caches(tmp_path):
    g = attention_graph()
    text = module_source(g)
    assert "    P = past_key_values_0_key.shape[2]\n" in text
    assert 'past_key_values_0_key = np.asarray(inputs["past_key_values.0.key"])' in text
    assert_matches_interpreter(g, decode_feeds(g), tmp_path)


def test_compound_dim_binds_its_one_unbound_symbol(tmp_path):
    g = Graph("mask_only")
    ids = g.add_input("input_ids", DType.i64, ("B", "T"))
    mask = g.add_input("attention_mask", DType.f32, ("B", "P+T"))
    flat = emit1(g, "reshape", [mask], {"shape": ["B*P+B*T"]}, "flat")
    back = emit1(g, "reshape", [flat], {"shape": ["B", "P+T"]}, "back")
    g.outputs = [back, ids]
    text = module_source(g)
    assert "    T = input_ids.shape[1]\n    P = attention_mask.shape[1] - T\n" in text
    assert '    flat, = _reshape_reference([attention_mask], {"shape": [B*P+B*T]})\n' in text
    rng = np.random.default_rng(0)
    feeds = {"input_ids": np.zeros((2, 3), np.int64), "attention_mask": rng.standard_normal((2, 7)).astype(np.float32)}
    assert_matches_interpreter(g, feeds, tmp_path)


def test_mla_attention_matches_the_interpreter(tmp_path):
    g = mla_graph()
    assert_matches_interpreter(g, decode_feeds(g, past=2), tmp_path)


def test_moe_matches_the_interpreter(tmp_path):
    g = moe_graph()
    assert_matches_interpreter(g, random_feeds(g, batch=2, tokens=3), tmp_path)


WORLD_OPS = ("all_reduce", "all_gather", "pipe", "vocab_embedding")  # a sharded graph's: refused by this target


def test_every_registered_op_emits():
    """No op's reference reads a global the emitter cannot copy (lambdas, closures, DType, ...);
    the ops that meet other ranks aside (the target refuses a sharded graph)."""
    from backends.numpy.pysource import collect
    from backends.numpy.emit import RESERVED, STANDARD_IMPORTS
    bundle = collect({f"op {name!r}": op.reference for name, op in sorted(ops.OPS.items()) if name not in WORLD_OPS},
                     RESERVED, STANDARD_IMPORTS)
    text = "\n\n".join(section for _, section in bundle.sections)
    compile(text, "<references>", "exec")


# ---- the module itself -----------------------------------------------------------------------

def test_text_is_deterministic_and_compiles(tmp_path):
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        emit_module(attention_graph(), str(tmp_path / name / "model_np.py"))
        py_compile.compile(str(tmp_path / name / "model_np.py"), doraise=True)
    for suffix in (".py", ".npz"):
        assert (tmp_path / "one" / f"model_np{suffix}").read_bytes() == (tmp_path / "two" / f"model_np{suffix}").read_bytes()
    assert module_source(dense_graph()) == module_source(dense_graph())


def test_readable_forward(tmp_path):
    text = module_source(dense_graph())
    assert not re.search(r"^\s*(import|from) (irc|backends)", text, re.MULTILINE)
    assert '    # %layers.0.h = rms_norm %x, @layers.0.attn_norm {eps=1e-05, offset=1.0} : f32[B,T,16]\n' in text
    assert ('    layers_0_h, = _rms_norm_reference([x, W["layers.0.attn_norm"]], {"eps": 1e-05, "offset": 1.0})\n'
            in text)
    assert '    forward_1, = _reshape_reference([q_BTHD], {"shape": [B*T, 16]})\n' in text
    assert '    np_1, = _linear_reference([layers_0_h, W_1, W["layers.0.bq"]], {})\n' in text
    assert 'W["layers.0.w4"]' in text
    assert "    B = input_ids.shape[0]\n    T = input_ids.shape[1]\n" in text
    assert 'WEIGHT_DTYPES = {"layers.0.w4": "int4", "layers.0.wq": "bfloat16"}' in text
    assert "import ml_dtypes" in text
    assert "import ml_dtypes" not in module_source(moe_graph())


def test_main_block_and_example_inputs(tmp_path):
    g = attention_graph()
    emit_module(g, str(tmp_path / "model_np.py"))
    script = (f"import sys, runpy; sys.path.append({SITE!r}); "
              f"runpy.run_path({str(tmp_path / 'model_np.py')!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, timeout=60,
                          env=CLEAN_ENV)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["logits float32 (1, 4, 32)", "present.0.key float32 (1, 2, 4, 8)",
                                        "present.0.value float32 (1, 2, 4, 8)"]
    spec = importlib.util.spec_from_file_location("emitted_decode", tmp_path / "model_np.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    mine, theirs = module.example_inputs(B=2, T=3, P=1, seed=4), random_feeds(g, batch=2, tokens=3, past=1, seed=4)
    assert list(mine) == list(theirs)
    for name in theirs:
        np.testing.assert_array_equal(mine[name], theirs[name])


# ---- refusals and renames --------------------------------------------------------------------

PROBE = '''
import numpy as np
from irc.dtypes import DType

SCALE = 2.0


def silu(x):
    """Not primitives.silu: the emitter must keep both apart."""
    return x * SCALE


def _probe_reference(inputs, attrs):
    return [silu(inputs[0])]


def _bad_reference(inputs, attrs):
    return [inputs[0].astype(DType.f32.numpy)]
'''


@pytest.fixture
def probe_ops(tmp_path):
    """Ops from a throwaway module inside irc.ops (so its functions may be copied)."""
    path = tmp_path / "emit_probe.py"
    path.write_text(PROBE)
    spec = importlib.util.spec_from_file_location("irc.ops.emit_probe", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    same = ops.OPS["silu"].infer
    added = {"probe": module._probe_reference, "probe_bad": module._bad_reference,
             "probe_lambda": lambda inputs, attrs: inputs}
    for name, reference in added.items():
        ops.register(ops.OpDef(name, ("x",), {}, same, reference))
    try:
        yield
    finally:
        for name in added:
            ops.OPS.pop(name)
        sys.modules.pop(spec.name)


def unary_graph(*op_names):
    g = Graph("probe")
    x = g.add_input("x", DType.f32, ("B", 4))
    for name in op_names:
        x = emit1(g, name, [x], {}, name)
    g.outputs = [x]
    return g


def test_name_clash_prefixes_both_definitions(probe_ops, tmp_path):
    g = unary_graph("silu", "probe")
    text = module_source(g)
    assert "def primitives_silu(x):" in text and "def emit_probe_silu(x):" in text
    assert "return [emit_probe_silu(inputs[0])]" in text and "float_unary(primitives_silu, inputs)" in text
    assert_matches_interpreter(g, {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}, tmp_path)


def test_unemittable_reference_names_the_op_and_global_and_writes_nothing(probe_ops, tmp_path):
    with pytest.raises(BackendError, match=r"op 'probe_bad': _bad_reference reads global 'DType'"):
        emit_module(unary_graph("silu", "probe_bad"), str(tmp_path / "model_np.py"))
    with pytest.raises(BackendError, match=r"op 'probe_lambda': .*<lambda> is a lambda"):
        module_source(unary_graph("probe_lambda"))
    assert list(tmp_path.iterdir()) == [tmp_path / "emit_probe.py"]


# ---- the examples --------------------------------------------------------------------------

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
TINY_SPECS = sorted(name for name in os.listdir(EXAMPLES) if name.startswith("tiny-") and name.endswith(".yaml"))


@pytest.mark.parametrize("name", TINY_SPECS)
def test_every_tiny_example_emits_and_matches(name, tmp_path):
    from frontends import load_spec
    graph = load_spec(os.path.join(EXAMPLES, name))
    feeds = random_feeds(graph, batch=2, seed=1) if "vision" in graph.meta else decode_feeds(graph, past=2)
    assert_matches_interpreter(graph, feeds, tmp_path)  # an image encoder: two random images


def test_a_sharded_graph_is_refused(tmp_path):
    from frontends.yaml_spec import load
    from irc.errors import BackendError
    from irc.testing import apply_pass
    from passes.shard import ShardPass

    sharded, _ = apply_pass(ShardPass(tp=2), load("examples/tiny-llama3.yaml"))
    with pytest.raises(BackendError, match="one rank of a sharded model"):
        emit_module(sharded, str(tmp_path / "model_np.py"))
    assert not list(tmp_path.iterdir())
