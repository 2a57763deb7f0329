"""DeepSeek sparse attention on --target onnx-npu (backends/onnx_npu/sparse.py): the lightning
indexer's key cache (``past_key_values.{i}.index_key``) is a static cache the host writes as it
writes the KV caches, and ``topk_mask`` selects over the visible slots.

A config-only DeepSeek-V3.2 folder (seeded weights, ``index_topk`` 4 below the 11-token
prompt, so the selection bites: checked against a dense selection) in f32 through the host
loop gives the reference interpreter's greedy tokens and every position's logits within
1e-4. The selection alone, on integer scores full of ties, with filled slots, empty ones and
new keys: the ONNX nodes give ``irc.ops.sparse_index.topk_visible`` over the real positions'
order on ONNX Runtime's CPU provider and, where onnxruntime-qnn is installed, in the HTP
emulator, whose ``TopK`` breaks ties to the higher index (measured: the lowering reads only
its k-th value and counts the ties itself, so neither engine's tie order matters). The chunk
and decode graphs (fp16) compile with every node on the HTP."""
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from backends.onnx_npu.emit import TABLE
from backends.onnx_npu.host import generate, load_contract, prefill_logits
from backends.onnx_npu.lower import MASK_VALUE, OPSET, NpuBuilder
from backends.onnx_npu.sparse import lower_topk_mask
from frontends import load_spec
from irc.build import emit
from irc.check import relative_error
from irc.dtypes import DType
from irc.errors import BackendError
from irc.evaluate import StreamingInterpreter
from irc.evaluate import prefill_logits as reference_prefill
from irc.graph import Graph
from irc.interpreter import generate as reference_generate
from irc.ops.sparse_index import topk_visible
from test_onnx_npu import PROMPT, compile_npu

V32 = {"model_type": "deepseek_v32", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 48,
       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 16,
       "kv_lora_rank": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6, "n_routed_experts": 4,
       "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_group": 1, "topk_group": 1,
       "first_k_dense_replace": 1, "index_topk": 4, "index_head_dim": 8, "index_n_heads": 2}


def v32_folder(where, **changes) -> str:
    folder = where / "v32"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**V32, **changes}))
    return str(folder)


def test_host_loop_matches_the_interpreter(tmp_path):
    """f32: three chunk calls (the last padded), then decode; the selection bites (a dense
    one moves the logits)."""
    folder = v32_folder(tmp_path)
    graph = load_spec(folder)
    expected, _ = reference_generate(graph, PROMPT, 4, seed=0)
    exact = compile_npu(folder, tmp_path / "f32", "--precision", "f32", "--weights", "seeded")
    assert generate(str(exact), PROMPT, 4) == expected
    ids = PROMPT + expected[:-1]
    reference = reference_prefill(StreamingInterpreter(graph, 0), ids)
    got = prefill_logits(str(exact), ids)
    assert max(relative_error(got[i], reference[i]) for i in range(len(ids))) < 1e-4
    dense_folder = tmp_path / "dense"
    dense_folder.mkdir()
    dense = reference_prefill(StreamingInterpreter(load_spec(v32_folder(dense_folder, index_topk=64)), 0), ids)
    assert max(relative_error(dense[i], reference[i]) for i in range(len(ids))) > 1e-2


def test_the_index_key_is_a_static_cache(tmp_path):
    """past_key_values.{i}.index_key [1, 1, N, D_i] in, present.{i}.index_key [1, 1, T, D_i]
    (the new keys) out, in the contract's caches; no dynamic shape reaches the compiler."""
    folder = compile_npu(v32_folder(tmp_path), tmp_path / "m", "--weights", "seeded")
    contract = load_contract(str(folder))
    caches = {c["past"]: c for c in contract["caches"]}
    assert caches["past_key_values.1.index_key"]["shape"] == [1, 1, 32, 8]
    assert caches["past_key_values.1.key"]["shape"] == [1, 4, 32, 12]
    for role, tokens in (("chunk", 4), ("decode", 1)):
        model = onnx.load(str(folder / contract["graphs"][role]), load_external_data=False)
        shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.output}
        assert shapes["present.1.index_key"] == [1, 1, tokens, 8] and shapes["present.0.value"] == [1, 4, tokens, 6]
        ops = {n.op_type for n in model.graph.node}
        assert {"TopK", "Where"} <= ops and not ops & {"Shape", "Range", "CumSum", "Loop", "If", "ScatterElements"}


def selection_model(tokens: int, context: int, k: int, dtype: DType = DType.f16, causal: bool = True):
    """topk_mask alone as onnx-npu lowers it: scores [1, T, N+T] and the host's attention_bias
    in, the bool mask out."""
    g = Graph("selection")
    scores = g.add_input("scores", dtype, ("B", "T", "P+T"))
    mask = g.add_input("attention_mask", DType.i64, ("B", "P+T"))
    g.outputs = emit(g, "topk_mask", [scores, mask], {"k": k, "causal": causal}, ["keep"])
    node = g.nodes[0]
    b = NpuBuilder(g, OPSET, "npu", context, bindings={"B": 1, "T": tokens, "P": context})
    b.bind(scores, b.claim("scores"))
    keep = b.bind(node.outputs[0], b.claim("keep"))
    lower_topk_mask(b, node, [keep])
    width = [1, tokens, context + tokens]
    inputs = [helper.make_tensor_value_info("scores", TensorProto.FLOAT16, width),
              helper.make_tensor_value_info("attention_bias", TensorProto.FLOAT16, [1, 1, *width[1:]])]
    out = b.op("Cast", [keep], "keep_f16", to=TensorProto.FLOAT16)  # the HTP casts bool -> float, not back
    graph = helper.make_graph(b.nodes, "selection", inputs,
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT16, width)],
                              initializer=list(b.constants))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    return model


def selection_cases(tokens: int, context: int, k: int, count: int = 12):
    """(scores, attention_bias, expected bool [1, T, N+T]): integer scores (ties everywhere),
    ``filled`` slots of the cache holding positions 0..filled-1, then T new keys; expected is
    ``topk_visible`` over the real sequence (filled slots, then the new keys), put back."""
    rng = np.random.default_rng(k)
    for case in range(count):
        filled = int(rng.integers(0, context - tokens + 1)) if case else 0
        scores = rng.integers(0, 3, (1, tokens, context + tokens)).astype(np.float16)
        real = np.r_[np.arange(filled), context + np.arange(tokens)]
        keep = topk_visible(scores[:, :, real].astype(np.float32), k=k)
        expected = np.zeros(scores.shape, bool)
        expected[:, :, real] = keep
        query, key = filled + np.arange(tokens)[:, None], np.r_[np.arange(context), filled + np.arange(tokens)]
        visible = (key[None] <= query) & ((np.arange(context + tokens) < filled) | (np.arange(context + tokens)
                                                                                     >= context))[None]
        bias = np.where(visible, 0, MASK_VALUE).astype(np.float16)[None, None]
        yield scores, bias, expected


@pytest.mark.parametrize("tokens, k", [(4, 3), (1, 5), (4, 40)])
def test_the_selection_keeps_the_lower_index_of_ties(tmp_path, tokens, k):
    """ONNX Runtime's CPU provider: exactly the reference over the real positions' order
    (k 40 >= N + T: every visible key, no TopK)."""
    import onnxruntime as ort

    path = str(tmp_path / "selection.onnx")
    onnx.save(selection_model(tokens, 32, k), path)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for scores, bias, expected in selection_cases(tokens, 32, k):
        (got,) = session.run(None, {"scores": scores, "attention_bias": bias})
        assert np.array_equal(got != 0, expected)


def test_a_non_causal_selection_is_refused():
    with pytest.raises(BackendError, match="causal selection"):
        selection_model(4, 32, 3, causal=False)


def test_the_table_lowers_the_selection_and_its_masked_scores():
    assert {"topk_mask", "where", "concat", "mla_attention"} <= set(TABLE)


def test_the_htp_emulator_keeps_the_lower_index_of_ties(tmp_path):
    """The selection compiled for the HTP (soc 69) and run in its x86 emulator: the same
    masks, although the HTP's own TopK takes the higher index of a tie."""
    pytest.importorskip("onnxruntime_qnn")
    from backends.onnx_npu import qnn

    path = str(tmp_path / "selection.onnx")
    onnx.save(selection_model(4, 32, 3), path)
    compiled = qnn.compile_htp(path, 69, out=str(tmp_path / "selection_ctx.onnx"))
    assert compiled.ok and compiled.on_cpu == 0, compiled.error
    session = qnn.emulated_session(compiled.context_path, 69)
    for scores, bias, expected in selection_cases(4, 32, 3, count=6):
        (got,) = session.run(None, {"scores": scores, "attention_bias": bias})
        assert np.array_equal(got != 0, expected)


@pytest.mark.parametrize("role, soc", [("chunk", 60), ("decode", 69)])
def test_the_graphs_compile_entirely_on_the_htp(tmp_path, role, soc):
    """fp16 (the default precision): the chunk graph for soc 60, the decode graph for 69."""
    pytest.importorskip("onnxruntime_qnn")
    from backends.onnx_npu import qnn
    from test_onnx_npu_qnn import assert_all_on_htp

    folder = compile_npu(v32_folder(tmp_path), tmp_path / "m", "--weights", "seeded")
    path = str(folder / f"{role}.onnx")
    assert_all_on_htp(qnn.compile_htp(path, soc, out=str(tmp_path / f"{role}_ctx.onnx")), path)


def test_the_htp_emulator_runs_the_host_loop(tmp_path):
    """fp16, both graphs compiled for soc 69 and run in the emulator inside the host loop: the
    CPU provider's greedy tokens, logits within 5e-2 relative (measured 1.1e-2 at most)."""
    pytest.importorskip("onnxruntime_qnn")
    from backends.onnx_npu import host, qnn

    folder = compile_npu(v32_folder(tmp_path), tmp_path / "m", "--weights", "seeded")
    engines = {}
    for role in ("chunk", "decode"):
        compiled = qnn.compile_htp(str(folder / f"{role}.onnx"), 69, out=str(tmp_path / f"{role}_ctx.onnx"))
        assert compiled.ok, compiled.error
        engines[role] = host.session_engine(qnn.emulated_session(compiled.context_path, 69))
    cpu, emulated = [], []
    tokens = generate(str(folder), PROMPT, 3, logits=cpu)
    assert generate(str(folder), PROMPT, 3, engines=engines, logits=emulated) == tokens
    for a, b in zip(cpu, emulated):
        assert relative_error(b.astype(np.float32), a.astype(np.float32)) < 5e-2
