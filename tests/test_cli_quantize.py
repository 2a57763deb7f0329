"""``irc compile`` with quantize: --eval-text in the output, the dump stats and the report;
one clear message and exit code 2 (and no output file) for each bad quantize input."""
import json

import pytest

from irc_cli import main

TINY = "examples/tiny-llama3.yaml"  # vocabulary 256, d_ff 160
TEXT = "the cat sat on the mat and the dog sat on the log while the bird sang " * 8


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted(set(TEXT.split()))
    model = Tokenizer(models.WordLevel({w: i + 1 for i, w in enumerate(words)} | {"[unk]": 0}, unk_token="[unk]"))
    model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    model.save(str(path))
    return str(path)


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_eval_text_reaches_output_dumps_and_report(capsys, tmp_path, tokenizer):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    dump, page = tmp_path / "dump", tmp_path / "report.html"
    code, _, err = run_cli(capsys, "compile", TINY, "--passes", "lower-mlp,quantize{bits=4,group=32,method=mse}",
                           "--eval-text", str(text), "--tokenizer", tokenizer, "--dump-dir", str(dump),
                           "--report", str(page))
    assert code == 0, err
    assert "quantize (mse):" in err and "top-1 agreement" in err
    stats = json.loads((dump / "02-quantize.stats.json").read_text())["quantize"]
    assert stats["eval"]["tokens"] == len(TEXT.split()) and 0 < stats["eval"]["top1_agreement"] <= 1
    assert stats["summary"]["mean_sqnr_db"] > stats["summary"]["mean_sqnr_rtn_db"]
    html = page.read_text()
    assert "Mean SQNR per layer" in html and "eval text" in html


def test_eval_text_scores_every_position_before_last_logits(capsys, tmp_path, tokenizer):
    """The ONNX targets end with last-logits (logits [B, 1, V]); --eval-text still scores every
    position of the text, with the same figures as a compile keeping every position."""
    import onnx

    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    lines = {}
    for logits in ("last", "all"):
        out = tmp_path / logits / "model.onnx"
        code, _, err = run_cli(capsys, "compile", TINY, "--target", "onnx-ort", "--logits", logits, "--passes",
                               "quantize{bits=4,group=32}", "--eval-text", str(text), "--tokenizer", tokenizer,
                               "-o", str(out))
        assert code == 0, err
        lines[logits] = [line for line in err.splitlines() if "top-1 agreement" in line]
        shape = onnx.load(str(out), load_external_data=False).graph.output[0].type.tensor_type.shape.dim
        assert (shape[1].dim_value == 1) == (logits == "last")
    assert lines["last"] and lines["last"] == lines["all"]


@pytest.mark.parametrize("passes, message", [
    ("quantize{group=64,method=mse}", "group 64 does not divide K=160 of @layers.0.mlp.w_down"),
    ("quantize{bits=3}", "bits must be 4 or 8"),
    ("quantize{method=hqq}", "unknown method 'hqq'"),
    ("lower-mlp,quantize{method=awq}", "method=awq needs a calibration text and its tokenizer"),
])
def test_bad_quantize_input(capsys, tmp_path, passes, message):
    out = tmp_path / "model.onnx"
    code, _, err = run_cli(capsys, "compile", TINY, "--target", "onnx", "--passes", passes, "-o", str(out))
    assert code == 2 and message in err and "Traceback" not in err
    assert not out.exists()


def test_eval_text_of_one_token(capsys, tmp_path, tokenizer):
    short = tmp_path / "short.txt"
    short.write_text("cat")
    code, _, err = run_cli(capsys, "compile", TINY, "--passes", "quantize", "--eval-text", str(short),
                           "--tokenizer", tokenizer)
    assert code == 2 and "has 1 token(s); perplexity needs at least 2" in err


def test_eval_text_needs_a_pass_that_evaluates(capsys, tmp_path, tokenizer):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    code, _, err = run_cli(capsys, "compile", TINY, "--passes", "dce", "--eval-text", str(text), "--tokenizer",
                           tokenizer)
    assert code == 2 and "no pass in the pipeline evaluates a text" in err


def test_quantize_short_flag_is_the_pass_with_its_defaults(capsys, tmp_path):
    """``--quantize int4`` writes the same model as ``--passes`` with the target's pipeline
    followed by ``quantize{bits=4}``, and the compile says what became codes and what stayed
    float (with its size); with the table kept float the line names it."""
    outs = {}
    for name, argv in (("short", ["--quantize", "int4"]), ("pass", ["--passes", "dce,cse,scan-chunk{size=64},quantize{bits=4}"])):
        out = tmp_path / name / "model.onnx"
        code, _, err = run_cli(capsys, "compile", TINY, "--target", "onnx-ort", *argv, "-o", str(out))
        assert code == 0, err
        outs[name] = (out.read_bytes(), err)
    assert outs["short"][0] == outs["pass"][0]
    err = outs["short"][1]
    assert "quantize: int4 codes (block 32" in err and "for 16 weights" in err and "@embed" not in err
    code, _, err = run_cli(capsys, "compile", TINY, "--passes", "quantize{bits=4,embeddings=false}")
    assert code == 0, err
    assert "for 14 weights" in err and "float: @embed f32[256, 64] 64 KiB (embeddings=false keeps" in err


def test_quantize_given_twice_or_contradicting_is_exit_2(capsys, tmp_path):
    out = tmp_path / "model.onnx"
    code, _, err = run_cli(capsys, "compile", TINY, "--target", "onnx-ort", "--quantize", "int4", "--passes",
                           "quantize{bits=8}", "-o", str(out))
    assert code == 2 and "--quantize int4 and a quantize pass in --passes" in err and not out.exists()
    code, _, err = run_cli(capsys, "compile", "examples/tiny-gemma2-9b.yaml", "--target", "onnx-ort", "--passes",
                           "quantize{bits=4,embeddings=false,lm_head=true}", "-o", str(out))
    assert code == 2 and "tied to the embedding table @embed" in err and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.iterdir())


HEAVY = ("numba", "torch", "triton", "transformers")
PROBE = """import sys
from irc_cli import main
code = main(sys.argv[1:])
print(code, sorted(m for m in {heavy!r} if m in sys.modules))
"""


@pytest.mark.parametrize("passes,loaded", [(None, []), ("quantize{bits=4}", ["numba"])])
def test_only_a_quantizing_compile_loads_numba(tmp_path, passes, loaded):
    """``irc compile`` to ONNX imports none of the heavy libraries; the default quantizer's
    kernel brings numba, and only then."""
    import subprocess
    import sys

    argv = [TINY, "--target", "onnx-ort", "-o", str(tmp_path / "m.onnx"), "--quiet"]
    argv += ["--passes", passes] if passes else []
    done = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), "compile", *argv], capture_output=True,
                          text=True)
    assert done.stdout.split("\n")[-2] == f"0 {loaded}", done.stderr
