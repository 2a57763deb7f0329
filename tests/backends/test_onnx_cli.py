"""``irc compile --target onnx|onnx-ort``: default pipelines per opset, the files written,
and one clear message with exit code 2 and no file for every bad combination."""
import subprocess
import sys

import pytest

from irc_cli import main

TINY = "examples/tiny-llama3.yaml"


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("target", ["onnx", "onnx-ort"])
def test_compile_writes_model_and_genai_config(capsys, tmp_path, target):
    code, _, err = run_cli(capsys, "compile", TINY, "--target", target, "-o", str(tmp_path / "model.onnx"))
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["genai_config.json", "model.onnx"]
    assert f"target {target}, opset 23" in err


def test_older_opset_runs_lower_norms_by_default(capsys, tmp_path):
    code, _, err = run_cli(capsys, "compile", TINY, "--target", "onnx", "--opset", "21", "-o", str(tmp_path / "m.onnx"))
    assert code == 0, err
    assert "lower-norms" in err and "gqa-broadcast" in err and "opset 21" in err


def test_check_holds_the_pipeline_to_the_interpreter(capsys, tmp_path):
    code, _, err = run_cli(capsys, "compile", TINY, "--target", "onnx", "--opset", "22", "--check",
                           "-o", str(tmp_path / "m.onnx"))
    assert code == 0 and "check passed" in err


def test_shape_only_full_size(capsys, tmp_path):
    code, _, err = run_cli(capsys, "compile", "examples/mistral-7b.yaml", "--target", "onnx-ort", "--weights", "none",
                           "-o", str(tmp_path / "mistral.onnx"))
    assert code == 0, err
    assert "shape-only compile" in err and "not written" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["genai_config.json", "mistral.onnx"]


@pytest.mark.parametrize("argv, message", [
    (["--target", "onnx", "--opset", "21", "--passes", "dce"], "rms_norm needs RMSNormalization"),
    (["--target", "onnx", "--opset", "20"], "--opset 20 is not supported"),
    (["--target", "onnx-ort", "--weights", "random"], "--weights 'random' is not supported"),
    (["--target", "ir", "--opset", "23"], "--opset applies to onnx and onnx-ort only"),
    (["--target", "numpy", "--weights", "none"], "--weights none (a shape-only model) applies to onnx"),
])
def test_bad_combinations_exit_2_and_write_nothing(capsys, tmp_path, argv, message):
    code, _, err = run_cli(capsys, "compile", TINY, *argv, "-o", str(tmp_path / "m.onnx"))
    assert code == 2 and message in err and "Traceback" not in err
    assert err.count("irc: error:") == 1
    assert list(tmp_path.iterdir()) == []


def test_onnx_target_needs_an_output(capsys):
    code, _, err = run_cli(capsys, "compile", TINY, "--target", "onnx")
    assert code == 2 and "give -o PATH" in err


def test_other_commands_do_not_import_onnx():
    """Nor ml_dtypes (0.5 s to import here; onnx imports it, so an ONNX compile pays it): an f32
    model never needs it (irc.dtypes imports it when bf16 or int4 is first asked for)."""
    script = ("import sys; from irc_cli import main; main(['show', 'examples/tiny-llama3.yaml']); "
              "main(['compile', 'examples/tiny-llama3.yaml', '--target', 'ir']); "
              "sys.exit(1 if {'onnx', 'onnxruntime', 'ml_dtypes'} & set(sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", script], capture_output=True).returncode == 0
