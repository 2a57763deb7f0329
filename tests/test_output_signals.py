"""Atomic output under signals, on real compiles in a subprocess: SIGTERM while the weights
are being written leaves no new file and the previous output byte for byte; SIGKILL leaves
a staging folder that the next run in that folder removes; the single-file outputs
(``write_atomic``: IR, dumps, plan, report) and the NumPy module's pair behave the same."""
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from irc.output import PREFIX, OutputFolder, write_atomic

ROOT = Path(__file__).resolve().parents[1]
# about 20 M float32 parameters: an 80 MB weights file, most of a second to write
MEDIUM = """model:
  name: medium
  vocab_size: 16000
  d_model: 512
  n_layers: 2
  attention: {kind: gqa, n_heads: 8, n_kv_heads: 4}
  mlp: {kind: swiglu, d_ff: 1536}
"""
TINY = ROOT / "examples" / "tiny-llama3.yaml"


def irc(*args) -> list[str]:
    return [sys.executable, "-m", "irc_cli", *map(str, args)]


def digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def compile_medium(tmp_path: Path, out: Path, seed: int) -> subprocess.Popen:
    spec = tmp_path / "medium.yaml"
    spec.write_text(MEDIUM)
    return subprocess.Popen(irc("compile", spec, "--target", "onnx", "-o", out / "model.onnx", "--quiet",
                                "--seed", seed), cwd=ROOT, stderr=subprocess.PIPE, text=True)


def wait_for_weights(process: subprocess.Popen, out: Path, timeout: float = 120.0) -> Path:
    """The staged weights file, once it holds some bytes (the write is under way)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert process.poll() is None, f"the compile ended before writing: {process.stderr.read()}"
        for staging in out.glob(PREFIX + "*"):
            data = staging / "model.onnx.data"
            try:
                if data.stat().st_blocks > 0:
                    return staging
            except FileNotFoundError:
                pass
        time.sleep(0.005)
    process.kill()
    raise AssertionError("the weights were never written")


@pytest.fixture(scope="module")
def previous(tmp_path_factory) -> tuple[Path, dict]:
    """A folder holding a finished compile of the medium model (seed 0)."""
    tmp = tmp_path_factory.mktemp("previous")
    out = tmp / "out"
    process = compile_medium(tmp, out, 0)
    assert process.wait(timeout=300) == 0, process.stderr.read()
    return out, digest(out)


def test_sigterm_mid_write_leaves_the_previous_output(previous, tmp_path):
    out, before = previous
    process = compile_medium(tmp_path, out, 1)
    wait_for_weights(process, out)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 143
    assert "interrupted; no output was left behind" in process.stderr.read()
    assert digest(out) == before  # no new file, no temporary, the old model whole


def test_sigkill_leaves_a_staging_folder_the_next_run_removes(previous, tmp_path):
    out, before = previous
    process = compile_medium(tmp_path, out, 2)
    staging = wait_for_weights(process, out)
    process.kill()
    process.wait(timeout=60)
    assert staging.exists()  # nothing can clean up after SIGKILL
    done = subprocess.run(irc("compile", TINY, "--target", "ir", "-o", out / "tiny.ir"), cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not staging.exists()
    after = digest(out)
    assert after.pop("tiny.ir") and after == before


def test_a_live_process_staging_folder_is_kept(tmp_path):
    """Only the staging folders of processes that no longer run are removed."""
    live = tmp_path / f"{PREFIX}{os.getppid()}-abc"
    live.mkdir()
    dead = tmp_path / f"{PREFIX}999999999-abc"
    dead.mkdir()
    write_atomic(str(tmp_path / "x.txt"), "x")
    assert live.exists() and not dead.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "x.txt"])


def test_write_atomic_leaves_nothing_on_an_error(tmp_path):
    (tmp_path / "model.ir").write_text("old")
    with pytest.raises(RuntimeError):
        with OutputFolder(str(tmp_path), primary="model.ir") as out:
            out.write("model.ir", "new")
            raise RuntimeError("a failing pass")
    assert [p.name for p in tmp_path.iterdir()] == ["model.ir"]
    assert (tmp_path / "model.ir").read_text() == "old"


def test_sigterm_during_a_numpy_compile(tmp_path):
    """The NumPy module and its .npz are one output: SIGTERM mid-way leaves neither."""
    spec = tmp_path / "medium.yaml"
    spec.write_text(MEDIUM)
    out = tmp_path / "np"
    out.mkdir()
    process = subprocess.Popen(irc("compile", spec, "--target", "numpy", "-o", out / "model.py", "--quiet"),
                               cwd=ROOT, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 120
    while not list(out.glob(PREFIX + "*")) and time.monotonic() < end:
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.002)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 143
    assert list(out.iterdir()) == []


def test_a_swallowed_interrupt_keeps_the_block_from_committing(tmp_path):
    """A Ctrl-C whose KeyboardInterrupt something swallowed (a finaliser drops what it raises)
    still ends the block: nothing is committed, and the interrupt is raised at its end."""
    from irc.output import OutputFolder, forget_signals, record_signals

    record_signals()
    try:
        with pytest.raises(KeyboardInterrupt):
            with OutputFolder(str(tmp_path / "out"), primary="model.txt") as out:
                out.write("model.txt", "new")
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(1.0)  # the handler raises here...
                except KeyboardInterrupt:
                    pass  # ...and this swallows it
        assert not (tmp_path / "out").exists()
        with OutputFolder(str(tmp_path / "out"), primary="model.txt") as out:  # honoured: the next one commits
            out.write("model.txt", "new")
        assert (tmp_path / "out" / "model.txt").read_text() == "new"
    finally:
        forget_signals()
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_signals_held_are_delivered_when_the_block_ends():
    """Inside ``signals_held`` (a native extension's import) a Ctrl-C waits; it is raised as
    the block ends, not inside it."""
    from irc.output import signals_held

    reached = []
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            reached.append("inside")  # not interrupted
    assert reached == ["inside"]


def test_a_late_native_import_finishes_before_a_ctrl_c(tmp_path, monkeypatch):
    """``import_native`` (onnxruntime for ``--check``, onnxruntime-genai for ``irc run``): a
    Ctrl-C arriving while the module's init runs lets the init finish, then ends the command."""
    import sys

    from irc.output import import_native

    (tmp_path / "slow_native_init.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.2)\nFINISHED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        import_native("slow_native_init")
    assert sys.modules["slow_native_init"].FINISHED
    del sys.modules["slow_native_init"]
    assert import_native("json") is __import__("json")
