"""``irc compile --target onnx|onnx-ort``: default pipelines per opset, the files written,
and one clear message with exit code 2 and no file for every bad combination."""
import json
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
    """Nor ml_dtypes: an f32 model never needs it (irc.dtypes imports it when bf16 or int4 is
    first asked for; onnx imports it, so an ONNX compile does: constraints.txt pins 0.6.0, which
    imports in ~0.03 s where 0.7.0 took ~0.6 s)."""
    script = ("import sys; from irc_cli import main; main(['show', 'examples/tiny-llama3.yaml']); "
              "main(['compile', 'examples/tiny-llama3.yaml', '--target', 'ir']); "
              "sys.exit(1 if {'onnx', 'onnxruntime', 'ml_dtypes'} & set(sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", script], capture_output=True).returncode == 0


HEAVY = {"torch", "transformers", "triton", "numba", "onnxruntime"}


def _imported(*argv: str) -> set:
    """The modules ``irc compile ARGV`` leaves in ``sys.modules`` of a fresh process: each
    top-level package that ran (``onnx`` only when the onnx package itself was imported)."""
    script = ("import json, sys; from irc_cli import main; code = main(sys.argv[1:]); "
              "print(json.dumps(sorted(m for m in sys.modules if '.' not in m))); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", script, "compile", *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_onnx_compile_imports_only_what_it_needs(tmp_path):
    """An f32 ONNX compile of a YAML spec, --check included (its reference is irc's NumPy
    interpreter, not onnxruntime), imports none of torch, transformers, triton, numba or
    onnxruntime."""
    imported = _imported(TINY, "--target", "onnx", "--check", "-o", str(tmp_path / "f32" / "model.onnx"))
    assert not imported & HEAVY and "onnx" in imported


def test_int4_compile_imports_only_its_kernel(tmp_path):
    """--quantize int4 adds numba (the compiled blockwise quantizer, ``passes._quantize_kernel``)
    and ml_dtypes (int4 values), and still neither onnxruntime nor torch, transformers, triton."""
    imported = _imported(TINY, "--target", "onnx", "--quantize", "int4", "-o", str(tmp_path / "q" / "model.onnx"))
    assert not imported & (HEAVY - {"numba"})
