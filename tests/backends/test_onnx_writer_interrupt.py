"""The weight writer under Ctrl-C: an exception in the waiting thread ends ``write_data``
within ``STOP_GRACE`` of its arrival even while a worker is in the middle of a long piece
(the workers are not waited for), the output folder is left as it was, and the workers
start no piece after it."""
import signal
import threading
import time

import pytest

from backends.onnx import writer
from backends.onnx.emit import emit_model
from frontends import load_spec
from irc.weights import seed_absent

SLOW = 3.0  # seconds each piece takes: far past the grace


@pytest.fixture()
def alarm():
    """SIGALRM raises KeyboardInterrupt in the main thread, as Ctrl-C does."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_an_interrupt_does_not_wait_for_the_pieces_in_progress(tmp_path, monkeypatch, alarm):
    started, write = [], writer.Piece.write

    def slow_write(piece, fd):
        started.append(time.monotonic())
        time.sleep(SLOW)
        return write(piece, fd)

    monkeypatch.setattr(writer.Piece, "write", slow_write)
    graph = load_spec("examples/tiny-llama3.yaml")
    seed_absent(graph, 0)
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.onnx").write_bytes(b"previous")
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    begin = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        emit_model(graph, str(out / "model.onnx"), external_threshold=0, workers=2)
    seconds = time.monotonic() - begin
    print(f"write_data ended {seconds - 0.3:.2f} s after the interrupt, with pieces of {SLOW} s in progress")
    assert seconds < 0.3 + writer.STOP_GRACE + 0.5
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx"]
    assert (out / "model.onnx").read_bytes() == b"previous"
    running = [t for t in threading.enumerate() if t.name.startswith("irc-writer-")]
    assert running and all(t.daemon for t in running)  # still in their piece, not joined
    count = len(started)
    for thread in running:
        thread.join(timeout=SLOW + 5)
    assert len(started) == count == 2  # one piece each, none after the interrupt
