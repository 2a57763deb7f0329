"""A sharded graph (``shard{tp=2}``) through the triton target and ``irc run FOLDER --tp 2``:
two processes under torch.distributed (gloo on CPU, Triton's interpreter), whose greedy
tokens equal the reference interpreter's on the unsharded graph and whose last logits are
within 1e-4; each rank's weights file holds its blocks; a rank that fails is reported and
stops the others; the module says how to run it when no process group is there; and the
refusals (``--tp`` on a folder not sharded that many ways, experts split across ranks).
"""
from __future__ import annotations

from backends.triton.interpreter import use_interpreter

use_interpreter()  # TRITON_INTERPRET=1 before triton is imported: kernels run on CPU tensors

import json  # noqa: E402
import shutil  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("triton")  # the optional `triton` extra

import passes  # noqa: E402,F401  (registers the passes)
from backends.triton.emit import emit_module, load_module  # noqa: E402
from frontends import load_spec  # noqa: E402
from irc.errors import BackendError  # noqa: E402
from irc.passmanager import PassManager, parse_pipeline  # noqa: E402
from irc.weights import seed_absent  # noqa: E402
from irc_cli import main  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOLERANCE = 1e-4
MODELS = {"llama3": "dce,cse,shard{tp=2}", "mixtral-8x7b": "dce,cse,shard{tp=2},moe-sort",  # MoE: split by width
          "mamba2-2.7b": "dce,cse,shard{tp=2}",  # Mamba-2 by heads, the gated norm summed across ranks
          "deepseek-v3": "dce,cse,mla-absorb,shard{tp=2},moe-sort",  # latent cache whole on each rank
          "qwen3-next-80b-a3b": "dce,cse,shard{tp=2},moe-sort"}  # gated DeltaNet by key heads, gated attention


def spec(name: str) -> str:
    return str(EXAMPLES / f"tiny-{name}.yaml")


def irc(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """examples/tiny-<name>.yaml compiled for the triton target, sharded two ways."""
    made = {}
    for name, pipeline in MODELS.items():
        out = tmp_path_factory.mktemp(f"tp2_{name}")
        assert main(["compile", spec(name), "--target", "triton", "--passes", pipeline, "-o",
                     str(out / "model_tt.py")]) == 0
        made[name] = out
    return made


@pytest.mark.parametrize("name", MODELS)
def test_two_ranks_decode_the_reference_tokens(folders, capsys, name):
    ask = ("--prompt-ids", "1,2,3", "--max-new-tokens", "5", "--json", "--logits", "--quiet")
    code, out, err = irc(capsys, "run", folders[name], "--tp", "2", *ask)
    assert code == 0, err
    ranks = json.loads(out)
    code, out, err = irc(capsys, "run", spec(name), *ask)  # the unsharded graph, reference interpreter
    assert code == 0, err
    reference = json.loads(out)
    assert ranks["engine"] == "triton, 2 ranks (gloo), interpreted"
    assert ranks["tokens"] == reference["tokens"] and len(ranks["tokens"]) == 5
    gap = np.abs(np.asarray(ranks["logits_last"]) - np.asarray(reference["logits_last"])).max()
    assert gap <= TOLERANCE * max(1.0, np.abs(reference["logits_last"]).max()), gap


def test_each_rank_file_holds_its_blocks(folders):
    folder = folders["llama3"]
    manifest = json.loads((folder / "irc_triton.json").read_text())
    assert manifest["world"] == 2 and manifest["weights"] == ["model_tt.rank0.pt", "model_tt.rank1.pt"]
    graph = load_spec(spec("llama3"))
    seed_absent(graph)
    full = {name: np.asarray(graph.params[name].array()) for name in ("embed", "layers.0.attn.wo", "norm")}
    for rank in range(2):
        weights = torch.load(folder / f"model_tt.rank{rank}.pt", weights_only=True)
        np.testing.assert_array_equal(weights["embed"].numpy(), full["embed"][rank * 128:(rank + 1) * 128])
        np.testing.assert_array_equal(weights["layers.0.attn.wo"].numpy(),
                                      full["layers.0.attn.wo"][:, rank * 32:(rank + 1) * 32])
        np.testing.assert_array_equal(weights["norm"].numpy(), full["norm"])  # replicated


def test_a_failed_rank_is_reported_and_stops_the_others(folders, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(folders["llama3"], broken)
    (broken / "model_tt.rank1.pt").unlink()  # rank 1 fails; rank 0 would wait for it in a collective
    code, _, err = irc(capsys, "run", broken, "--tp", "2", "--prompt-ids", "1,2", "--max-new-tokens", "2")
    assert code == 2 and "rank 1: FileNotFoundError" in err and "model_tt.rank1.pt" in err


def test_the_module_says_how_to_run_it_without_a_process_group(folders):
    module = load_module(str(folders["llama3"] / "model_tt.py"))
    assert module.WORLD_SIZE == 2
    with pytest.raises(RuntimeError, match="torch.distributed process group"):
        module.load_weights()  # the rank comes from the process group
    session = module.Session(module.load_weights(rank=0), batch=1, capacity=8)
    with pytest.raises(RuntimeError, match=r"irc run FOLDER --tp 2"):
        session(torch.tensor([[1, 2, 3]]))


def test_tp_refusals(folders, tmp_path, capsys):
    code, _, err = irc(capsys, "run", folders["llama3"], "--tp", "4", "--prompt-ids", "1,2")
    assert code == 2 and "compiled for 2 ranks" in err and "--tp 2" in err and "Traceback" not in err
    code, _, err = irc(capsys, "run", spec("llama3"), "--tp", "2", "--prompt-ids", "1,2")
    assert code == 2 and "runs a Triton folder compiled with shard{tp=2}" in err
    plain = tmp_path / "plain"
    assert main(["compile", spec("llama3"), "--target", "triton", "-o", str(plain / "model_tt.py")]) == 0
    capsys.readouterr()
    code, _, err = irc(capsys, "run", plain, "--tp", "2", "--prompt-ids", "1,2")
    assert code == 2 and "compiled without the shard pass" in err and err.count("irc: error") == 1


def test_experts_split_across_ranks_are_refused(tmp_path):
    graph = load_spec(spec("mixtral-8x7b"))
    seed_absent(graph)
    PassManager(parse_pipeline("dce,cse,shard{tp=2,ep=2}")).run(graph)
    with pytest.raises(BackendError, match="expert_shards=2") as info:
        emit_module(graph, str(tmp_path / "m.py"))
    assert "node %layers.0.moe_out" in str(info.value) and "ep=1" in str(info.value)
    assert list(tmp_path.iterdir()) == []
