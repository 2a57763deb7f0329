"""--target onnx-ort on a sharded graph (backends.onnx.shard): one model per rank and the launch
note, each model passing onnx.checker; then the ranks run as a world on CPU (onnx_world: two
processes joined by torch.distributed's gloo, each running its rank's model in onnxruntime
split at the collectives, the collectives done by gloo). Logits and presents (joined along
their cut axis, as irc_shard.json says) equal the unsharded model's in onnxruntime, and eight
greedy tokens are the same. onnxruntime's own collective kernels (CUDA + NCCL) are not run here.
"""
import json
import os

import numpy as np
import onnx
import pytest

from frontends.yaml_spec import load
from irc.errors import BackendError
from irc.interpreter import random_feeds
from irc.testing import apply_pass
from irc.world import KEY, join
from backends.onnx.emit import emit_model
from backends.onnx.shard import NOTE, emit_sharded
from passes.shard import ShardPass

pytest.importorskip("torch")
onnx_world = pytest.importorskip("onnx_world")  # tests/backends/onnx_world.py (needs onnxruntime)

TP = 2
CASES = {"llama3-tp2": ("examples/tiny-llama3.yaml", 1), "mixtral-tp2": ("examples/tiny-mixtral-8x7b.yaml", 1),
         "mixtral-ep2": ("examples/tiny-mixtral-8x7b.yaml", TP),
         "gemma2-tp2": ("examples/tiny-gemma2-9b.yaml", 1),  # embedding scale, tied head, softcaps
         # Mamba-2 by heads (B and C replicated, the gated norm's sum of squares all-reduced) beside
         # attention and a squared-ReLU MLP
         "nemotron-h-tp2": ("examples/tiny-nemotron-h-8b.yaml", 1), "mamba2-tp2": ("examples/tiny-mamba2-2.7b.yaml", 1),
         # sinks by heads, the experts' down bias on rank 0; q / k norms over all heads summed across ranks
         "gpt-oss-tp2": ("examples/tiny-gpt-oss-20b.yaml", 1), "olmo2-tp2": ("examples/tiny-olmo-2-7b.yaml", 1)}


def compile_case(spec: str, tp: int, ep: int, folder) -> tuple:
    graph = load(spec)
    sharded, changed = apply_pass(ShardPass(tp=tp, ep=ep), graph)
    assert changed
    ranks, note = emit_sharded(sharded, str(folder / "sharded" / "model.onnx"), target="onnx-ort")
    whole = emit_model(graph, str(folder / "whole" / "model.onnx"), target="onnx-ort", genai=False)
    return graph, sharded, ranks, note, whole


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    """Every case compiled, its unsharded model run, and all rank models run in one world."""
    root = tmp_path_factory.mktemp("shard")
    cases, folders, feeds = {}, [], []
    for case, (spec, ep) in sorted(CASES.items()):
        graph, sharded, ranks, note, whole = compile_case(spec, TP, ep, root / case)
        fed = random_feeds(graph, batch=2, tokens=5, past=3)
        cases[case] = (sharded, ranks, note, onnx_world.greedy(onnx_world.Runner(whole.path), fed))
        folders.append(str(root / case / "sharded"))
        feeds.append(fed)
    results = onnx_world.run_world(str(root / "gloo.store"), folders, feeds, TP)
    return {case: (*cases[case], result) for case, result in zip(sorted(CASES), results)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rank_files_check_and_say_how_to_launch(case, worlds):
    _, ranks, note_path, _, _ = worlds[case]
    folder = os.path.dirname(note_path)
    assert sorted(os.listdir(folder)) == sorted([NOTE] + [f"model.rank{r}.onnx" for r in range(TP)] +
                                                [f"result{r}.npz" for r in range(TP)])
    note = json.load(open(note_path))
    assert note["world_size"] == TP and [r["model"] for r in note["ranks"]] == [f"model.rank{r}.onnx"
                                                                                for r in range(TP)]
    assert note["launch"]["env"]["LOCAL_WORLD_SIZE"] == str(TP) and "mpirun -n 2" in note["launch"]["mpi"]
    for result in ranks:
        model = onnx.load(result.path)
        onnx.checker.check_model(model, full_check=True)
        ops = {n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
        assert {"AllReduce", "AllGather"} <= ops


@pytest.mark.parametrize("case", sorted(CASES))
def test_rank_models_equal_the_unsharded_model(case, worlds):
    sharded, _, _, (expected, tokens), results = worlds[case]
    cuts = sharded.meta[KEY]["outputs"]
    for name, want in expected.items():
        parts = [r[name] for r in results]
        got = join(parts, cuts[name]) if name in cuts else parts[0]
        assert got.shape == want.shape, name
        error = np.abs(got - want).max() / max(1.0, np.abs(want).max())
        assert error <= 1e-4, f"{case}: {name} differs by {error:.2e}"
    for result in results:
        assert result["tokens"].tolist() == tokens, case


def test_the_ranks_differ_in_their_rows_and_experts(tmp_path):
    """Same structure, rank constants: rank 1's embedding starts at row vocab / 2; at ep 2
    rank 1's MoE keeps experts 4..7's gating columns."""
    for spec, ep, suffix, want in (("examples/tiny-llama3.yaml", 1, "first_row", [0, 128]),
                                   ("examples/tiny-mixtral-8x7b.yaml", TP, "rank_gating", [0, 4])):
        _, _, ranks, _, _ = compile_case(spec, TP, ep, tmp_path / suffix)
        firsts = []
        for result in ranks:
            model = onnx.load(result.path)
            consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
            if suffix == "first_row":
                firsts.append(int(next(v for k, v in consts.items() if k.endswith(suffix))))
            else:
                node = next(n for n in model.graph.node if n.output[0].endswith(suffix))
                firsts.append(int(consts[node.input[1]][0]))
        assert firsts == want, spec


def test_portable_target_refuses(tmp_path):
    sharded, _ = apply_pass(ShardPass(tp=TP), load("examples/tiny-llama3.yaml"))
    with pytest.raises(BackendError, match="onnx-ort"):
        emit_sharded(sharded, str(tmp_path / "model.onnx"), target="onnx")
