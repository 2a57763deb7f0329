"""``irc run --speculative mtp`` (irc_cli/speculative_mtp.py) on tiny twins whose checkpoints
hold a multi-token-prediction head (tests.frontends.mtp_twins): plain greedy's tokens, token
for token, through the reference interpreter and a folder compiled with ``--mtp`` in
onnxruntime, with drafts kept and cut (the head's own drafts, some replaced by the true
continuation so that both happen), on attention (DeepSeek-V3's MLA) and on a hybrid whose
DeltaNet states rerun (Qwen3.5); the head's cache after the run equals a fresh run over the
kept tokens; the compile's files; refusals with one message and exit 2."""
import json
import os

import numpy as np
import pytest

from backends.onnx.runtime import empty_caches, interpreter_engine
from frontends import load_spec
from frontends.hf.mtp import return_hidden
from irc.interpreter import generate
from irc_cli import main
from irc_cli.speculative import keep_first, speculative_loop
from irc_cli.speculative_mtp import MtpDrafter

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.frontends.mtp_twins import twins_fixture  # noqa: E402,F401 (the twins fixture)

from tests.test_cli_run_speculative import Clock  # noqa: E402

PROMPT = [5, 6, 7, 8, 9, 5, 6]
NEW = 18



class Forced(MtpDrafter):
    """The head's drafts with the true continuation put in at the first ``right[n]`` places of
    the n-th draft: some drafts kept whole, some cut, the head's cache fed either way."""

    def __init__(self, step, caches, truth: list, right: list):
        super().__init__(step, caches)
        self.truth, self.right, self.calls = truth, right, 0

    def __call__(self, sequence, k):
        draft = super().__call__(sequence, k)
        done, good = len(sequence) - len(PROMPT), self.right[self.calls % len(self.right)]
        self.calls += 1
        true = self.truth[done:done + len(draft)]
        return [t if i < good else (t + 1) % 128 for i, t in enumerate(true)] if len(true) == len(draft) else draft


def plain(graph) -> list:
    return list(generate(graph, PROMPT, NEW)[0])


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3.5-moe"])
def test_forced_mix_of_kept_and_cut_drafts_gives_plain_greedy(twins, name):
    _, _, folder = twins(name)
    graph = load_spec(folder)
    truth = plain(graph)
    return_hidden(graph)
    head = graph.parts["mtp"]
    drafter = Forced(interpreter_engine(head), empty_caches(head, 1), truth, right=[3, 0, 1, 3, 2])
    tokens, _, report = speculative_loop(interpreter_engine(graph), empty_caches(graph, 1), PROMPT, NEW, set(),
                                         Clock(), "mtp", 3, drafter)
    assert tokens == truth
    assert report["accepted"] > 0 and report["accepted"] < report["proposed"]
    assert report["kept_lengths"].get("3", 0) > 0 and report["kept_lengths"].get("0", 0) > 0
    if name == "qwen3.5-moe":  # DeltaNet states: a cut draft runs the kept tokens again
        assert report["reruns"] > 0
    assert_cache_is_a_fresh_run(graph, head, drafter, PROMPT + tokens)


def assert_cache_is_a_fresh_run(graph, head, drafter: MtpDrafter, sequence: list) -> None:
    """The entries the drafter keeps (positions 1..held) equal the head run once over the kept
    tokens with the decoder's hidden states of a plain run: no trace of a rejected draft."""
    held = drafter.held
    ids = np.asarray([sequence[:held + 1]], np.int64)
    decoder = interpreter_engine(graph)({"input_ids": ids[:, :held], "attention_mask": np.ones((1, held), np.int64),
                                         "position_ids": np.arange(held)[None], **empty_caches(graph, 1)})
    fresh = interpreter_engine(head)({"input_ids": ids[:, 1:], "attention_mask": np.ones((1, held), np.int64),
                                      "position_ids": np.arange(1, held + 1)[None],
                                      "hidden_states": decoder["hidden_states"], **empty_caches(head, 1)})
    kept = keep_first(drafter.caches, drafter.growing, held)
    for name, array in kept.items():
        np.testing.assert_allclose(array, fresh["present." + name[len("past_key_values."):]], rtol=1e-5, atol=1e-5)


def run_json(capsys, *argv) -> dict:
    assert main([str(a) for a in argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_folder_compiled_with_mtp_drafts_in_onnxruntime(twins, tmp_path, capsys):
    """``--mtp`` writes mtp.onnx beside the decoder, which returns hidden_states; ``irc run
    --speculative mtp`` on the folder and on the checkpoint gives plain greedy's tokens."""
    _, _, folder = twins("glm4-moe")
    out = tmp_path / "out"
    assert main(["compile", str(folder), "--target", "onnx-ort", "--logits", "all", "--mtp", "-o",
                 str(out / "model.onnx"), "--quiet"]) == 0
    assert {"model.onnx", "mtp.onnx"} <= set(os.listdir(out))
    ids = ",".join(map(str, PROMPT))
    want = run_json(capsys, "run", out, "--prompt-ids", ids, "--max-new-tokens", NEW, "--engine", "ort", "--json")
    for source in (out, folder):
        got = run_json(capsys, "run", source, "--prompt-ids", ids, "--max-new-tokens", NEW, "--speculative", "mtp=2",
                       "--json")
        assert got["tokens"] == want["tokens"]
        assert got["speculative"]["drafter"] == "mtp" and got["speculative"]["proposed"] > 0


def test_without_mtp_the_head_is_left_out_and_said(twins, tmp_path, capsys):
    _, _, folder = twins("deepseek-v3")
    assert main(["compile", str(folder), "--target", "onnx", "-o", str(tmp_path / "model.onnx")]) == 0
    assert "multi-token-prediction head" in capsys.readouterr().err
    assert "mtp.onnx" not in os.listdir(tmp_path)


@pytest.mark.parametrize("argv, message", [
    (["compile", "examples/tiny-llama3.yaml", "--target", "onnx", "--mtp", "-o", "{tmp}/m.onnx"],
     "--mtp: this model has no multi-token-prediction head"),
    (["run", "examples/tiny-llama3.yaml", "--prompt-ids", "1,2", "--speculative", "mtp"],
     "--speculative mtp: this model has no multi-token-prediction head"),
    (["run", "examples/tiny-llama3.yaml", "--prompt-ids", "1,2", "--speculative", "mtp=17"],
     "K must be a whole number from 1 to 16"),
    (["run", "examples/tiny-llama3.yaml", "--prompt-ids", "1,2", "--speculative", "mtp=0"],
     "K must be a whole number from 1 to 16"),
])
def test_refusals(argv, message, tmp_path, capsys):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    assert os.listdir(tmp_path) == []
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_runner_and_the_target_name_the_head_alike():
    from backends.onnx import mtp

    import irc_cli.speculative_mtp as runner
    assert runner.MTP_FILE == mtp.MTP_FILE
