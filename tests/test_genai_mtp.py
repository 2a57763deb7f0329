"""onnxruntime-genai 0.18 running irc's folders with its own speculative decoding: the
``model.mtp`` section ``--mtp`` writes (``backends.onnx.genai_mtp``), ``og.MtpGenerator`` with
the head loaded through ``head_overlay`` giving irc's plain greedy tokens on attention
(GLM-4.5), MLA with its cache in halves (DeepSeek-V3) and DeltaNet hybrids (Qwen3.5); ``irc run
--engine genai --speculative mtp``; the float32 refusal; genai's n-gram drafting on a folder
compiled with ``--logits all``."""
import json

import numpy as np
import pytest

from backends.onnx.genai_mtp import head_overlay
from irc_cli import main

og = pytest.importorskip("onnxruntime_genai")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.frontends.mtp_twins import twins_fixture  # noqa: E402,F401 (the twins fixture)

PROMPT = [5, 6, 7, 8, 9, 5, 6]
NEW = 18



def compiled(twins, name, out, *extra) -> str:
    _, _, folder = twins(name)
    assert main(["compile", str(folder), "--target", "onnx-ort", "--logits", "all", "--mtp", *extra, "-o",
                 str(out / "model.onnx"), "--quiet"]) == 0
    return str(out)


def run_json(capsys, folder, *argv) -> dict:
    ids = ",".join(map(str, PROMPT))
    assert main(["run", folder, "--prompt-ids", ids, "--max-new-tokens", str(NEW), "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


CASES = [("glm4-moe", ()), ("deepseek-v3", ("--passes", "mla-absorb{cache=halves}")), ("qwen3.5-moe", ()),
         ("qwen3-next", ())]


@pytest.mark.parametrize("name, extra", CASES)
def test_mtp_generator_gives_plain_greedy(twins, tmp_path, capsys, name, extra):
    """genai's MtpGenerator over the folder, the head loaded as the folder's config with the
    overlay, drafting 1 and 3 tokens a round: irc's plain greedy tokens in onnxruntime."""
    out = compiled(twins, name, tmp_path, "--dtype", "f16", *extra)
    config = json.load(open(f"{out}/genai_config.json"))
    assert config["model"]["decoder"]["outputs"]["hidden_states"] == "hidden_states"
    mtp = config["model"]["mtp"]
    assert mtp["filename"] == "mtp.onnx" and mtp["outputs"]["hidden_states"] == "hidden_states_out"
    want = run_json(capsys, out, "--engine", "ort")["tokens"]
    head_config = og.Config(out)
    head_config.overlay(head_overlay(config))
    model, head = og.Model(out), og.Model(head_config)
    for k in (1, 3):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(PROMPT) + NEW, do_sample=False)
        params.set_speculative_options(max_draft_tokens=k)
        generator = og.MtpGenerator(model, head, params)
        generator.append_tokens(np.asarray(PROMPT, np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        assert [int(t) for t in generator.get_sequence()[len(PROMPT):]] == want
        stats = generator.get_stats()
        assert stats["rounds"] > 0 and stats["draft_tokens_proposed"] >= stats["rounds"]
    got = run_json(capsys, out, "--engine", "genai", "--speculative", "mtp=2")
    assert got["tokens"] == want and got["engine"] == "onnxruntime-genai MtpGenerator"
    assert got["speculative"]["drafter"] == "mtp" and got["speculative"]["proposed"] > 0


def test_float32_logits_are_refused_and_plain_genai_still_runs(twins, tmp_path, capsys):
    out = compiled(twins, "glm4-moe", tmp_path)
    want = run_json(capsys, out, "--engine", "ort")["tokens"]
    assert run_json(capsys, out, "--engine", "genai")["tokens"] == want  # the mtp section is ignored
    ids = ",".join(map(str, PROMPT))
    assert main(["run", out, "--prompt-ids", ids, "--max-new-tokens", "4", "--engine", "genai", "--speculative",
                 "mtp"]) == 2
    err = capsys.readouterr().err
    assert "Cast - input and output types are the same" in err and "--dtype f16" in err


def test_other_drafters_are_refused_with_genai(twins, tmp_path, capsys):
    out = compiled(twins, "glm4-moe", tmp_path, "--dtype", "f16")
    assert main(["run", out, "--prompt-ids", "1,2", "--max-new-tokens", "4", "--engine", "genai", "--speculative",
                 "ngram"]) == 2
    assert "--speculative ngram runs in irc's own loop" in capsys.readouterr().err


def test_genai_ngram_drafting_on_all_position_logits(tmp_path, capsys):
    """genai's own n-gram drafter needs logits at every position (``--logits all``) and no
    config key (``set_speculative_options``); it gives the plain tokens."""
    out = str(tmp_path)
    assert main(["compile", "examples/tiny-llama3.yaml", "--target", "onnx-ort", "--logits", "all", "-o",
                 f"{out}/model.onnx", "--quiet"]) == 0
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    model = og.Model(out)

    def generate(ngram: bool):
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + 24, do_sample=False)
        if ngram:
            params.set_speculative_options(ngram_size=3, max_draft_tokens=4)
        generator = og.Generator(model, params)
        generator.append_tokens(np.asarray([prompt], np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        return [int(t) for t in generator.get_sequence(0)[len(prompt):]], generator

    plain, _ = generate(False)
    drafted, generator = generate(True)
    assert drafted == plain
    assert generator.get_speculative_stats()["draft_tokens_accepted"] > 0
    ids = ",".join(map(str, prompt))
    assert main(["run", out, "--prompt-ids", ids, "--max-new-tokens", "24", "--engine", "ort", "--quiet"]) == 0
    assert capsys.readouterr().out.split() == [str(t) for t in plain]
