"""``irc run --speculative`` (irc_cli/speculative.py): drafts checked a call at a time give
plain greedy decoding's tokens, token for token, through the reference interpreter and an
onnxruntime folder, for attention caches (cut back along their past axis) and recurrent
states (the kept tokens run again from the step's starting states); the prompt-lookup
drafter and a draft model (a spec or a folder) with its own caches rolled back; k's
adaptation; the report; refusals with one message and exit 2."""
import json

import pytest

from backends.onnx.runtime import empty_caches, interpreter_engine
from frontends import load_spec
from irc.errors import IRCError
from irc.interpreter import generate
from irc_cli import main, speculative

SPECS = ["examples/tiny-llama3.yaml", "examples/tiny-qwen3-next-80b-a3b.yaml", "examples/tiny-jamba-1.5-mini.yaml",
         "examples/tiny-lfm2-1.2b.yaml"]
PROMPT = [3, 17, 42, 99, 5, 3, 17, 42, 99, 5]
NEW = 20


class Clock:
    speculation = None

    def start(self):
        pass

    def token(self, token):
        pass


def run_json(capsys, *argv) -> dict:
    assert main([str(a) for a in argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_prompt_lookup_drafter():
    """The tokens after the most recent earlier occurrence of the last 3, else 2, else 1 tokens."""
    assert speculative.ngram_draft([1, 2, 3, 4, 5, 1, 2, 3], 2) == [4, 5]
    assert speculative.ngram_draft([7, 2, 3, 9, 2, 3, 8, 2, 3], 3) == [8, 2, 3]  # the most recent occurrence
    assert speculative.ngram_draft([1, 2, 5, 6, 2], 4) == [5, 6, 2]  # one token matched, three follow
    assert speculative.ngram_draft([1, 2, 3], 4) == []
    assert speculative.parse("ngram") == ("ngram", speculative.DEFAULT_K, None)
    assert speculative.parse("ngram=7") == ("ngram", 7, None) and speculative.parse("draft=d/")[::2] == ("draft", "d/")


def drafting(monkeypatch, continuation: list, wrong: set):
    """Drafts from the true continuation, each position in ``wrong`` (counted in the answer)
    replaced by another token: whole drafts kept, drafts cut at a wrong token."""
    def draft(sequence, k, sizes=None):
        done = len(sequence) - len(PROMPT)
        return [(t + 1) % 256 if done + i in wrong else t for i, t in enumerate(continuation[done:done + k])]
    monkeypatch.setattr(speculative, "ngram_draft", draft)


@pytest.mark.parametrize("spec", SPECS)
def test_kept_and_cut_drafts_give_plain_greedys_tokens(spec, monkeypatch):
    """Attention only (tiny-llama3), gated DeltaNet and conv states (Qwen3-Next), Mamba-1
    (Jamba), short convolutions (LFM2): drafts kept whole move several tokens a call, a wrong
    token cuts the draft there, and the answer is plain greedy's either way (reruns only
    where the model has recurrent states)."""
    graph = load_spec(spec)
    want, _ = generate(graph, PROMPT, NEW)
    drafting(monkeypatch, want, wrong={4, 9, 10, 15})
    caches = empty_caches(graph, 1)
    tokens, _, report = speculative.speculative_loop(interpreter_engine(graph), caches, PROMPT, NEW, set(), Clock(),
                                                     k=4)
    assert tokens == want
    assert report["accepted"] > report["proposed"] // 2 and report["model_calls"] < NEW
    assert 0 < report["kept_lengths"].get("0", 0) + report["kept_lengths"].get("1", 0) + report["kept_lengths"].get(
        "2", 0) + report["kept_lengths"].get("3", 0)
    states = any(0 not in array.shape for array in caches.values())
    assert (report["reruns"] > 0) == states


def test_k_adapts_to_what_the_drafter_keeps(monkeypatch):
    """Every draft wrong from its first token: k falls to 1 and each check costs one token's
    call, plain greedy's count."""
    graph = load_spec(SPECS[0])
    want, _ = generate(graph, PROMPT, NEW)
    drafting(monkeypatch, want, wrong=set(range(NEW)))
    tokens, _, report = speculative.speculative_loop(interpreter_engine(graph), empty_caches(graph, 1), PROMPT, NEW,
                                                     set(), Clock(), k=8)
    assert tokens == want and report["accepted"] == 0
    assert report["proposed"] == 8 + (NEW - 2)  # the first draft of 8, then one token a check
    assert report["model_calls"] == NEW


def test_an_eos_inside_a_kept_draft_ends_the_answer(monkeypatch):
    graph = load_spec(SPECS[0])
    want, _ = generate(graph, PROMPT, NEW)
    drafting(monkeypatch, want, wrong=set())
    eos = {want[6]}
    plain = want[:want.index(want[6]) + 1]
    tokens, _, _ = speculative.speculative_loop(interpreter_engine(graph), empty_caches(graph, 1), PROMPT, NEW, eos,
                                                Clock(), k=4)
    assert tokens == plain


@pytest.mark.parametrize("spec", [SPECS[0], SPECS[1]])
def test_irc_run_speculative_on_a_spec_and_a_folder(spec, tmp_path, capsys):
    """The CLI: the interpreter, and an onnx-ort folder compiled with --logits all (plain
    onnxruntime, irc's loop), give their plain runs' tokens with --speculative, and --json
    reports the drafting; a folder with the last position's logits only is refused with the
    hint."""
    ids = ",".join(map(str, PROMPT))
    plain = run_json(capsys, "run", spec, "--prompt-ids", ids, "--max-new-tokens", NEW, "--json")["tokens"]
    got = run_json(capsys, "run", spec, "--prompt-ids", ids, "--max-new-tokens", NEW, "--json", "--speculative",
                   "ngram=4")
    assert got["tokens"] == plain
    report = got["speculative"]
    assert report["drafter"] == "ngram" and report["k"] == 4 and report["model_calls"] <= NEW + report["reruns"]
    folder, last = tmp_path / "out", tmp_path / "last"
    assert main(["compile", spec, "--target", "onnx-ort", "-o", str(folder / "model.onnx"), "--logits", "all",
                 "--quiet"]) == 0
    capsys.readouterr()
    ort = run_json(capsys, "run", folder, "--prompt-ids", ids, "--max-new-tokens", NEW, "--json", "--engine", "ort",
                   "--speculative", "ngram")
    assert ort["engine"] == "onnxruntime"
    assert ort["tokens"] == run_json(capsys, "run", folder, "--prompt-ids", ids, "--max-new-tokens", NEW, "--json",
                                     "--engine", "ort")["tokens"]
    assert main(["compile", spec, "--target", "onnx-ort", "-o", str(last / "model.onnx"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["run", str(last), "--prompt-ids", ids, "--engine", "ort", "--speculative", "ngram"]) == 2
    assert "--logits all" in capsys.readouterr().err


@pytest.mark.parametrize("value, fragment", [("lookahead", "the drafters are ngram"), ("ngram=0", "from 1 to 16"),
                                             ("ngram=x", "from 1 to 16"), ("draft", "name the draft model"),
                                             ("draft=no/such", "no such")])
def test_a_bad_drafter_is_one_message(capsys, value, fragment):
    assert main(["run", SPECS[0], "--prompt-ids", "1,2,3", "--speculative", value]) == 2
    err = capsys.readouterr().err
    assert err.count("irc: error:") == 1 and fragment in err and "Traceback" not in err


def test_genai_and_onnx_npu_folders_are_refused(tmp_path, capsys):
    from irc_cli import engines

    with pytest.raises(IRCError, match="not in onnxruntime-genai"):
        engines.onnx_folder(str(tmp_path), [1], 2, set(), Clock(), engine="genai", speculative=("ngram", 4))
    with pytest.raises(IRCError, match="one token a decode call"):
        engines.npu_host(str(tmp_path), [1], 2, set(), Clock(), speculative=("ngram", 4))


def misleading(step, wrong: set):
    """``step`` whose greedy choice is pushed off at the sequence lengths in ``wrong``."""
    def run(feeds):
        outputs = dict(step(feeds))
        logits = outputs["logits"].copy()
        if feeds["attention_mask"].shape[1] in wrong:
            logits[0, -1, int(logits[0, -1].argmax())] = -1e9
        outputs["logits"] = logits
        return outputs
    return run


@pytest.mark.parametrize("spec", [SPECS[0], SPECS[1]])
def test_a_draft_model_drafts_and_rolls_back(spec):
    """draft=PATH's drafter (the same model, pushed off its choice at three lengths so some
    drafts are cut): plain greedy's tokens; growing caches cut back (Llama) or states restored
    to the draft's start (Qwen3-Next: DeltaNet and conv states); every draft token kept where
    the drafter is the model itself."""
    graph = load_spec(spec)
    want, _ = generate(graph, PROMPT, NEW)
    wrong = {len(PROMPT) + 5, len(PROMPT) + 11, len(PROMPT) + 12}
    drafter = speculative.DraftModel(misleading(interpreter_engine(graph), wrong), empty_caches(graph, 1))
    tokens, _, report = speculative.speculative_loop(interpreter_engine(graph), empty_caches(graph, 1), PROMPT, NEW,
                                                     set(), Clock(), "draft", 4, drafter)
    assert tokens == want and 0 < report["accepted"] < report["proposed"]
    same = speculative.DraftModel(interpreter_engine(graph), empty_caches(graph, 1))
    tokens, _, report = speculative.speculative_loop(interpreter_engine(graph), empty_caches(graph, 1), PROMPT, NEW,
                                                     set(), Clock(), "draft", 4, same)
    assert tokens == want and report["accepted"] == report["proposed"] and report["model_calls"] <= NEW // 4 + 2


def test_irc_run_with_a_draft_folder(tmp_path, capsys):
    """The CLI: a compiled folder drafts for a spec (another model of the same vocabulary:
    nothing kept, the same tokens)."""
    folder = tmp_path / "draft"
    assert main(["compile", SPECS[1], "--target", "onnx", "-o", str(folder / "model.onnx"), "--quiet"]) == 0
    capsys.readouterr()
    ids = ",".join(map(str, PROMPT))
    plain = run_json(capsys, "run", SPECS[0], "--prompt-ids", ids, "--max-new-tokens", NEW, "--json")["tokens"]
    got = run_json(capsys, "run", SPECS[0], "--prompt-ids", ids, "--max-new-tokens", NEW, "--json", "--speculative",
                   f"draft={folder}")
    assert got["tokens"] == plain and got["speculative"]["drafter"] == "draft"


def test_int8_activation_kernels_are_said(tmp_path, capsys):
    """MatMulNBits at accuracy level 4 round a several-token call differently from a one-token
    step, so a checked draft may part from plain greedy where logits are close: said in the
    report and on stderr (a folder of exact products has no note)."""
    for level, noted in ((4, True), (0, False)):
        out = tmp_path / f"level{level}"
        assert main(["compile", "examples/tiny-llama3.yaml", "--target", "onnx-ort", "--logits", "all", "--quiet",
                     "--passes", f"quantize{{bits=4,accuracy_level={level}}}", "-o", str(out / "model.onnx")]) == 0
        capsys.readouterr()
        report = run_json(capsys, "run", out, "--prompt-ids", "3,17,42,3,17", "--max-new-tokens", 6,
                          "--speculative", "ngram", "--json")["speculative"]
        assert ("note" in report) == noted
        if noted:
            assert "accuracy level 4" in report["note"]
