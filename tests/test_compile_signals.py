"""Ctrl-C and SIGTERM end a real ``irc compile`` promptly at any stage, with the previous
output untouched: a subprocess compiles a seeded 2-layer model whose int4 quantization takes
several seconds (``mse``, the NumPy search, and ``ort``, the compiled one) into a folder that
holds a finished model, and is signalled before the weights are written (seeding, passes)
or while they are quantized and written. The time from the signal to the process's end is
printed; the bound asserted (``BOUND``) is generous on a loaded machine, the aim is 2 s."""
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from irc.output import PREFIX

ROOT = Path(__file__).resolve().parents[1]
BOUND = 5.0
# 150 M parameters: seeding, mse's tens of seconds of quantization (ort's compiled kernel: about one) and
# writing take long enough to be signalled at each stage
BIG = """model:
  name: big
  vocab_size: 32000
  d_model: 1536
  n_layers: 2
  attention: {kind: gqa, n_heads: 12, n_kv_heads: 4}
  mlp: {kind: swiglu, d_ff: 6144}
"""
TINY = ROOT / "examples" / "tiny-llama3.yaml"


def digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def compile_command(spec, out: Path, method: str) -> list:
    return [sys.executable, "-m", "irc_cli", "compile", str(spec), "--target", "onnx-ort", "--passes",
            f"quantize{{bits=4,group=32,method={method}}}", "-o", str(out / "model.onnx"), "--quiet"]


@pytest.fixture()
def previous(tmp_path) -> tuple[Path, dict]:
    """An output folder holding a finished (tiny) model."""
    out = tmp_path / "out"
    done = subprocess.run(compile_command(TINY, out, "rtn"), cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out, digest(out)


def staged_weights(out: Path) -> bool:
    """Has the compile begun writing weights (a staged data file with bytes in it)?"""
    for staging in out.glob(PREFIX + "*"):
        try:
            if (staging / "model.onnx.data").stat().st_size > 0:
                return True
        except FileNotFoundError:
            continue
    return False


def interrupt(process: subprocess.Popen, out: Path, signum: int, writing: bool, timeout: float = 240.0) -> tuple:
    """Signal ``process`` before its weights are written (at once) or once they are being
    quantized and written (a second after the data file appears); (seconds to exit, stage)."""
    end = time.monotonic() + timeout
    if writing:
        while not staged_weights(out):
            assert process.poll() is None, f"the compile ended before writing: {process.stderr.read()}"
            assert time.monotonic() < end, "the weights were never written"
            time.sleep(0.01)
        time.sleep(1.0)
    else:
        time.sleep(0.5)  # loading the spec, seeding, the passes
    stage = "writing" if staged_weights(out) else "before writing"
    assert process.poll() is None, "the compile ended before the signal"
    sent = time.monotonic()
    process.send_signal(signum)
    process.wait(timeout=60)
    return time.monotonic() - sent, stage


@pytest.mark.parametrize("signum,method,writing", [
    (signal.SIGTERM, "mse", True), (signal.SIGINT, "mse", True), (signal.SIGTERM, "ort", True),
    (signal.SIGINT, "mse", False), (signal.SIGTERM, "mse", False)])
def test_a_signal_ends_the_compile_and_keeps_the_previous_output(previous, tmp_path, signum, method, writing):
    out, before = previous
    spec = tmp_path / "big.yaml"
    spec.write_text(BIG)
    process = subprocess.Popen(compile_command(spec, out, method), cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        seconds, stage = interrupt(process, out, signum, writing)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    name = signal.Signals(signum).name
    print(f"{name} {stage} ({method}): the compile ended {seconds:.2f} s after the signal, exit {process.returncode}")
    assert seconds < BOUND, f"{name} took {seconds:.1f} s to end the compile"
    expected = {signal.SIGTERM: (143, -signal.SIGTERM), signal.SIGINT: (130, -signal.SIGINT)}[signum]
    assert process.returncode in expected, process.stderr.read()
    assert digest(out) == before  # no new file, no staging folder, the previous model whole
    assert not [p for p in os.listdir(out) if p.startswith(PREFIX)]
