"""The output folder: written atomically (nothing on a failed pass, an exception while writing,
Ctrl-C or SIGTERM; a previous good output intact), refused up front on a disk without room,
progress only on a terminal, and bad checkpoints: one message, exit 2, no output."""
import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import save_file

import irc.output
from backends.onnx import writer
from backends.onnx.emit import emit_model
from frontends import load_spec
from irc.output import OutputFolder
from irc.progress import Progress
from irc_cli import main

sys.path.insert(0, os.path.dirname(__file__))
from test_onnx_stream import hf_folder  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OLD = {"model.onnx": b"old model", "model.onnx.data": b"old weights", "notes.txt": b"the user's"}


def previous_output(folder) -> dict:
    folder.mkdir(parents=True)
    for name, data in OLD.items():
        (folder / name).write_bytes(data)
    return {name: (folder / name).read_bytes() for name in OLD}


def contents(folder) -> dict:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


@pytest.mark.parametrize("error", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_a_failure_while_writing_leaves_the_previous_output(tmp_path, monkeypatch, error):
    graph = load_spec(hf_folder(tmp_path / "hf"))
    out = tmp_path / "out"
    before = previous_output(out)
    calls = []

    def failing(piece, fd):
        calls.append(piece)
        if len(calls) == 3:
            raise error
        return real(piece, fd)

    real = writer.Piece.write
    monkeypatch.setattr(writer.Piece, "write", failing)
    with pytest.raises(type(error)):
        emit_model(graph, str(out / "model.onnx"), target="onnx-ort", external_threshold=0)
    assert contents(out) == before  # nothing new, nothing staged left behind


def test_a_failed_pass_writes_nothing(tmp_path, capsys):
    folder = hf_folder(tmp_path / "hf")
    out = tmp_path / "new"
    assert main(["compile", str(folder), "--target", "onnx-ort", "--passes", "quantize{bits=5}", "-o",
                 str(out / "model.onnx")]) == 2
    assert not out.exists()


def test_sigterm_while_writing_leaves_nothing(tmp_path):
    folder = hf_folder(tmp_path / "hf")
    out = tmp_path / "out"
    before = previous_output(out)
    started = tmp_path / "started"
    driver = f"""
import sys, time
sys.path.insert(0, {ROOT!r})
from irc.output import OutputFolder
real = OutputFolder.write
def slow(folder, name, data):
    path = real(folder, name, data)
    open({str(started)!r}, "w").close()
    time.sleep(0.5)
    return path
OutputFolder.write = slow
from irc_cli import main
sys.exit(main(["compile", {str(folder)!r}, "--target", "onnx-ort", "-o", {str(out / "model.onnx")!r}]))
"""
    process = subprocess.Popen([sys.executable, "-c", driver], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not started.exists() and time.time() < deadline and process.poll() is None:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1] == "irc: interrupted; no output was left behind"
    assert contents(out) == before


def test_staging_folders_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".irc-tmp-{dead.stdout.strip()}-abc"
    stale.mkdir()
    (stale / "model.onnx.data").write_bytes(b"half")
    with OutputFolder(str(tmp_path)) as out:
        out.write("x.txt", "new")
    assert sorted(os.listdir(tmp_path)) == ["x.txt"]


def test_a_disk_without_room_is_refused_before_writing(tmp_path, monkeypatch, capsys):
    folder = hf_folder(tmp_path / "hf")
    monkeypatch.setattr(irc.output, "free_bytes", lambda path: 1 << 20)
    out = tmp_path / "out"
    code = main(["compile", str(folder), "--target", "onnx-ort", "-o", str(out / "model.onnx")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not out.exists()
    assert err[-2].startswith(f"irc: error: {out}: not enough room on the disk: the output needs ")
    assert err[-1] == "  hint: free some space or write the output to another disk"


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_on_a_terminal_only(tmp_path):
    graph = load_spec(hf_folder(tmp_path / "hf"))
    assert not Progress.for_terminal(io.StringIO()).enabled
    assert not Progress.for_terminal(Terminal(), quiet=True).enabled
    screen = Terminal()
    progress = Progress.for_terminal(screen)
    emit_model(graph, str(tmp_path / "out" / "model.onnx"), target="onnx-ort", external_threshold=0,
               progress=progress)
    assert "weights" in screen.getvalue() and re.search(r"\d+/\d+ tensors", screen.getvalue())
    with progress.passes(2):
        progress.pass_started("dce")
        progress.pass_started("cse")
    assert "passes" in screen.getvalue() and "cse" in screen.getvalue()


def test_quiet_prints_nothing(tmp_path, capsys):
    folder = hf_folder(tmp_path / "hf")
    assert main(["compile", str(folder), "--target", "onnx-ort", "--quiet", "-o", str(tmp_path / "o" / "m.onnx")]) == 0
    assert capsys.readouterr().err == ""


# ---- bad checkpoints: one message, exit 2, no output ------------------------------------------

def _missing_shard(folder):
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.embed_tokens.weight": "model-00002-of-00002.safetensors"}}))
    return r"model.safetensors.index.json: shard model-00002-of-00002.safetensors is missing"


def _truncated_shard(folder):
    path = folder / "model.safetensors"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 10)
    return r"model.safetensors: truncated shard: tensor model.norm.weight ends at byte"


def _wrong_dtype(folder):
    _resave(folder, "model.layers.0.mlp.up_proj.weight", np.zeros((64, 32), np.int8))
    return r"model.safetensors: tensor model.layers.0.mlp.up_proj.weight is stored as I8; irc reads float weights"


def _wrong_shape(folder):
    _resave(folder, "model.layers.1.self_attn.k_proj.weight", np.zeros((8, 32), np.float32))
    return (r"model.safetensors: tensor model.layers.1.self_attn.k_proj.weight has shape \[8, 32\]; config.json "
            r"describes @layers.1.attn.wk as \[16, 32\]")


def _resave(folder, name, array):
    from safetensors.numpy import load_file
    tensors = load_file(str(folder / "model.safetensors"))
    tensors[name] = array
    save_file(tensors, str(folder / "model.safetensors"))


@pytest.mark.parametrize("spoil", [_missing_shard, _truncated_shard, _wrong_dtype, _wrong_shape])
def test_bad_checkpoints_get_one_message_and_no_output(tmp_path, capsys, spoil):
    folder = hf_folder(tmp_path / "hf")
    pattern = spoil(folder)
    out = tmp_path / "out"
    assert main(["compile", str(folder), "--target", "onnx-ort", "-o", str(out / "model.onnx")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in lines if line.startswith("irc: error:")]) == 1
    error = next(line for line in lines if line.startswith("irc: error:"))
    assert re.search(pattern, error), error
    assert "Traceback" not in "\n".join(lines) and not out.exists()
