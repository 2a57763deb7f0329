"""LongRoPE through the DSL and the targets that are not ONNX Runtime's dynamic graphs:
the DSL and the YAML architecture form build the same graph; the NumPy emitter's module
computes the reference; onnx-npu's host picks the table rows by the sequence length it
knows (chunked prefill included) and matches the reference generate; ``rope-fuse`` never
claims a LongRoPE from fixed tables; the op refuses factor lists of the wrong length."""
from __future__ import annotations

import numpy as np
import pytest

from frontends.dsl import Model, Rope
from irc.errors import ShapeError
from irc.interpreter import generate

ORIGINAL = 16
SCALING = {"kind": "longrope", "short_factor": [1.0, 1.25, 1.5, 2.0], "long_factor": [2.0, 5.0, 11.0, 29.0],
           "original_max_position": ORIGINAL, "factor": 4.0}


def longrope_model(scaling=None, rotary_dim=None) -> "Graph":  # noqa: F821
    """Two layers, GQA 4 over 2, head_dim 8, LongRoPE with n = 16."""
    m = Model("tiny-longrope", vocab=64, d_model=32)
    x = m.embed(m.input_ids())
    for layer in m.layers(2):
        rope = Rope(base=1e4, scaling=scaling or SCALING, rotary_dim=rotary_dim)
        x = x + layer.attention(layer.rms_norm(x, name="attn_norm", eps=1e-5), heads=4, kv_heads=2, head_dim=8,
                                rope=rope)
        x = x + layer.swiglu(layer.rms_norm(x, name="mlp_norm", eps=1e-5), d_ff=48)
    m.logits(m.rms_norm(x, name="norm", eps=1e-5))
    return m.graph


YAML = """model:
  name: tiny-longrope
  vocab_size: 64
  d_model: 32
  n_layers: 2
  norm: {kind: rms, eps: 1.0e-5}
  attention:
    kind: gqa
    n_heads: 4
    n_kv_heads: 2
    head_dim: 8
    rope:
      base: 10000
      scaling: {kind: longrope, short_factor: [1.0, 1.25, 1.5, 2.0], long_factor: [2, 5, 11, 29],
                original_max_position: 16, factor: 4}
  mlp: {kind: swiglu, d_ff: 48}
  tied_embeddings: false
"""


def test_yaml_and_dsl_build_the_same_graph(tmp_path):
    from frontends import load_spec
    from irc.parser import parse_graph
    from irc.printer import print_graph

    path = tmp_path / "tiny-longrope.yaml"
    path.write_text(YAML)
    text = print_graph(longrope_model())
    assert print_graph(load_spec(str(path))) == text
    assert print_graph(parse_graph(text)) == text  # the factor lists round-trip through the text form
    assert ('scaling={"factor": 4.0, "kind": "longrope", "long_factor": [2.0, 5.0, 11.0, 29.0], '
            '"original_max_position": 16, "short_factor": [1.0, 1.25, 1.5, 2.0]}') in text


def test_numpy_emitter_module_matches_the_interpreter(tmp_path):
    """The emitted module copies the rope reference, switch and all: prefill over 20
    positions (long) and over 12 (short), bit-equal to the interpreter."""
    from irc.interpreter import random_feeds
    from tests.backends.test_numpy_emit import assert_matches_interpreter

    graph = longrope_model()
    for tokens in (12, 20):
        feeds = random_feeds(graph, batch=2, tokens=tokens, past=0)
        feeds["position_ids"] = np.tile(np.arange(tokens), (2, 1))
        assert_matches_interpreter(graph, feeds, tmp_path)


@pytest.mark.parametrize("prompt_length", [11, 18], ids=["decode-crosses-n", "prompt-past-n"])
def test_onnx_npu_host_matches_the_reference_generate(tmp_path, prompt_length):
    """f32 folder, chunks of 4 over a 40-slot cache: an 11-token prompt crosses n = 16 during
    decode (the host runs the sequence again there); an 18-token prompt is past n in its
    first chunk already (the host's rows pick the long set for every chunk)."""
    from backends.onnx_npu.emit import emit_folder
    from backends.onnx_npu.host import generate as npu_generate, load_contract, prefill_logits
    from irc.check import relative_error
    from irc.interpreter import Interpreter

    import passes  # noqa: F401  (registers the passes)
    from backends.onnx_npu.targets import PIPELINE
    from irc.passmanager import PassManager, parse_pipeline

    graph = longrope_model()
    PassManager(parse_pipeline(PIPELINE)).run(graph)
    folder = tmp_path / "npu"
    emit_folder(graph, str(folder), chunk=4, context=40, precision="f32")
    contract = load_contract(str(folder))
    assert contract["rope_rows"] == [{"name": "rope_rows", "offset": 40, "original": ORIGINAL}]
    prompt = [int(t) for t in np.random.default_rng(prompt_length).integers(1, 64, prompt_length)]
    expected, _ = generate(graph, prompt, 10)
    assert npu_generate(str(folder), prompt, 10) == expected
    ids = np.asarray([prompt])
    want = Interpreter(graph, 0).run({"input_ids": ids, "attention_mask": np.ones_like(ids),
                                      "position_ids": np.arange(prompt_length)[None],
                                      **{v.name: np.zeros((1, 2, 0, 8), np.float32) for v in graph.inputs
                                         if v.name.startswith("past_key_values.")}})["logits"][0]
    assert relative_error(prefill_logits(str(folder), prompt), want) <= 1e-4


def test_rope_fuse_never_claims_longrope_from_fixed_tables():
    """A decomposed RoPE with the plain base-10000 tables, in a model whose meta says
    LongRoPE with all short factors 1 (the same frequencies below n): fused as plain RoPE,
    never as the LongRoPE, which would switch to the long set past n. A decomposed
    LongRoPE itself is refused by the DSL."""
    import passes  # noqa: F401  (registers the passes)
    from frontends.dsl_args import ArgError
    from irc.interpreter import random_feeds, run
    from irc.passmanager import PassManager, parse_pipeline

    with pytest.raises(ArgError, match="longrope scaling depends on the sequence length"):
        Rope(scaling=SCALING, decomposed=True)
    m = Model("decomposed", vocab=64, d_model=32)
    x = m.embed(m.input_ids())
    for layer in m.layers(1):
        x = x + layer.attention(layer.rms_norm(x), heads=4, kv_heads=2, head_dim=8,
                                rope=Rope(base=1e4, decomposed=True))
    m.logits(m.rms_norm(x))
    graph = m.graph
    graph.meta["rope"] = {**graph.meta["rope"], "scaling": {**SCALING, "short_factor": [1.0] * 4}}
    feeds = random_feeds(graph, batch=1, tokens=20, past=0)
    feeds["position_ids"] = np.arange(20)[None]
    before = run(graph, feeds)["logits"]
    assert PassManager(parse_pipeline("rope-fuse")).run(graph)
    fused = [n for n in graph.nodes if n.op == "rope"]
    assert fused and all(n.attrs["scaling"] is None and n.attrs["base"] == 1e4 for n in fused)
    np.testing.assert_allclose(run(graph, feeds)["logits"], before, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scaling, message", [
    ({**SCALING, "long_factor": [1.0, 2.0]}, "longrope long_factor has 2 entries for a rotary dim of 8 (needs 4)"),
    ({**SCALING, "short_factor": [1.0, 0.0, 1.0, 1.0]}, "short_factor must be a list of positive numbers"),
    ({k: v for k, v in SCALING.items() if k != "original_max_position"}, "longrope rope scaling needs"),
])
def test_op_refuses_bad_longrope_settings(scaling, message):
    from irc.build import emit1
    from irc.dtypes import DType
    from irc.graph import Graph

    g = Graph("bad")
    x = g.add_input("x", DType.f32, ("B", "T", 16))
    positions = g.add_input("position_ids", DType.i64, ("B", "T"))
    with pytest.raises(ShapeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        emit1(g, "rope", [x, positions], {"head_dim": 8, "base": 1e4, "scaling": scaling}, "out")


@pytest.mark.parametrize("context", [16, 40])
def test_tables_stack_only_when_the_context_passes_n(tmp_path, context):
    """onnx-ort's cos/sin caches and onnx-npu's tables hold the long set's rows after the
    short set's only when the context reaches past n (else the long set never applies: one
    table, read by position_ids); either way the tokens are the reference's."""
    import onnx

    import passes  # noqa: F401  (registers the passes)
    from backends.onnx.emit import emit_model
    from backends.onnx.runtime import greedy, interpreter_engine, ort_engine
    from backends.onnx_npu.emit import emit_folder
    from backends.onnx_npu.host import load_contract
    from backends.onnx_npu.targets import PIPELINE
    from irc.passmanager import PassManager, parse_pipeline

    graph = longrope_model()
    path = tmp_path / "model.onnx"
    emit_model(graph, str(path), target="onnx-ort", genai=False, context=context)
    shapes = {i.name: list(i.dims) for i in onnx.load(str(path)).graph.initializer if i.name.endswith("cos_cache")}
    rows = context * (2 if context > ORIGINAL else 1)
    assert shapes == {"rope/8/10000/cos_cache": [rows, 4]}
    prompts = [[5, 9, 33, 2, 17] + ([60, 61, 62, 7, 1, 12] if context > ORIGINAL else []), [8, 40, 3]]  # 11: crosses n
    want = greedy(interpreter_engine(graph), graph, prompts, 10)["tokens"]
    np.testing.assert_array_equal(greedy(ort_engine(str(path)), graph, prompts, 10)["tokens"], want)
    PassManager(parse_pipeline(PIPELINE)).run(graph)
    emit_folder(graph, str(tmp_path / "npu"), chunk=4, context=context, precision="f32")
    assert ("rope_rows" in load_contract(str(tmp_path / "npu"))) == (context > ORIGINAL)


def test_yaml_factor_list_errors_name_the_key(tmp_path):
    from frontends import load_spec
    from irc.errors import SpecError

    path = tmp_path / "bad.yaml"
    path.write_text(YAML.replace("short_factor: [1.0, 1.25, 1.5, 2.0]", "short_factor: [1.0, -1, 1.5, 2.0]"))
    with pytest.raises(SpecError) as err:
        load_spec(str(path))
    assert "rope.scaling.short_factor: expected a positive number, got -1" in str(err.value)
    assert "bad.yaml:14:" in str(err.value)
    path.write_text(YAML.replace("long_factor: [2, 5, 11, 29]", "long_factor: [2, 5]"))
    with pytest.raises(SpecError, match="long_factor has 2 entries for a rotary dim of 8"):
        load_spec(str(path))


def test_onnx_emission_is_deterministic(tmp_path):
    from backends.onnx.emit import emit_model

    for target in ("onnx", "onnx-ort"):
        paths = [tmp_path / f"{target}-{i}.onnx" for i in range(2)]
        for path in paths:
            emit_model(longrope_model(), str(path), target=target, genai=False, context=40)
        assert paths[0].read_bytes() == paths[1].read_bytes(), target
