"""Outputs written atomically: files are staged in a hidden folder beside them and renamed
into place only when all of them are complete. Every file irc writes goes through here
(``write_atomic`` for a single file).

    with OutputFolder("out", primary="model.onnx") as out:
        out.require(total_bytes)               # refuses before writing when the disk lacks room
        with open(out.stage("model.onnx.data"), "wb") as f: ...
        out.write("genai_config.json", text)
        out.copy("tokenizer.json", "/models/llama/tokenizer.json")

Guarantees:

- nothing in the destination changes until the block ends without an exception; then every
  staged file replaces its namesake with ``os.replace`` (atomic per file), the ``primary``
  file last, so a previous good output stays whole until the new one is complete;
- an exception, Ctrl-C (``KeyboardInterrupt``) or SIGTERM (raised as ``Terminated`` while the
  block runs in the main thread) removes the staging folder, and the destination folder
  too when this block created it; no partial model and no stray temporary file remain;
- the renames run with SIGINT and SIGTERM held back, so a signal cannot leave half of the
  files new and half old; it takes effect once they are all in place;
- a signal is remembered as well as raised (``record_signals``, which ``irc compile`` calls
  first; SIGTERM always): an interrupt that something swallowed on the way (one raised inside a
  finaliser is printed and dropped) still keeps the block from committing;
- a staging folder is named ``.irc-tmp-<pid>-<random>``; one left by a process that no
  longer runs (killed with SIGKILL, say) is removed by the next ``OutputFolder`` there.

Staged files get the usual mode (0666 less the umask), as ``open`` would give them.
"""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from contextlib import contextmanager
from typing import Optional

from irc.errors import IRCError

PREFIX = ".irc-tmp-"
HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM}
MARGIN = 64 << 20   # room kept free beyond the bytes an output needs


class OutputError(IRCError):
    """An output cannot be written where it was asked for (no room, not a folder...)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while an output was being written."""


_SEEN: list = []  # signals received since record_signals and not yet honoured (an exception that ended a block)
_RECORDING: list = []


def record_signals() -> None:
    """From now on SIGINT and SIGTERM are remembered as well as raised (Ctrl-C as
    ``KeyboardInterrupt``; main thread only, elsewhere a no-op): no ``OutputFolder`` commits
    while one is unhonoured (module docstring)."""
    if threading.current_thread() is threading.main_thread():
        forget_signals()
        _RECORDING[:] = [True]
        signal.signal(signal.SIGINT, _raise_interrupted)


@contextmanager
def signals_held():
    """SIGINT and SIGTERM deferred while the block runs (main thread; elsewhere Python takes
    no signals), then handled as they would have been. For importing a native extension: a
    KeyboardInterrupt raised inside its module init aborts the process (onnx's nanobind init
    calls std::terminate) instead of ending it cleanly. The handlers are swapped rather than
    the signals masked: a process-directed signal blocked in the main thread would still reach
    another thread, and Python would raise it in the main thread all the same."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list = []
    previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in sorted(HELD_SIGNALS)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in pending[:1]:
            handler = previous[s]
            if callable(handler):
                handler(s, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(s)


def import_native(module: str):
    """``importlib.import_module(module)`` under ``signals_held``: for an extension imported
    late (onnxruntime for ``--check``, onnxruntime-genai for ``irc run``), whose native init a
    KeyboardInterrupt must not reach."""
    import importlib

    with signals_held():
        return importlib.import_module(module)


def forget_signals() -> None:
    """The signals seen so far were honoured (the command ended on them)."""
    _SEEN.clear()


class OutputFolder:
    """Stage files for ``directory`` and move them in at the end (module docstring)."""

    def __init__(self, directory: str, primary: Optional[str] = None):
        self.directory = os.path.abspath(directory)
        self.primary = primary
        self.staging: Optional[str] = None
        self.staged: list[str] = []
        self._created = False
        self._previous_handler = None

    # ---- the block -------------------------------------------------------------------
    def __enter__(self) -> "OutputFolder":
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise OutputError("the output's folder is a file", location=self.directory)
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, _raise_terminated)
        try:
            if not os.path.exists(self.directory):
                try:
                    os.makedirs(self.directory)
                except OSError as err:
                    raise OutputError(f"cannot create the output folder: {err.strerror}",
                                      location=self.directory) from None
                self._created = True
            remove_stale(self.directory)
            try:
                self.staging = tempfile.mkdtemp(dir=self.directory, prefix=f"{PREFIX}{os.getpid()}-")
            except OSError as err:
                raise OutputError(f"cannot write in the output folder: {err.strerror}",
                                  location=self.directory) from None
        except BaseException as err:
            self.__exit__(type(err), err, None)
            _remove_own_staging(self.directory)  # SIGTERM inside mkdtemp: made, but not yet ours by name
            raise
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is None and _SEEN:  # a signal's exception was swallowed on the way: commit nothing
            stop = (Terminated if signal.SIGTERM in _SEEN else KeyboardInterrupt)(f"signal {_SEEN[0]}")
            self.__exit__(type(stop), stop, None)
            raise stop
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            forget_signals()  # this block ends on it
        held = kind is None and self._previous_handler is not None
        try:
            if held:  # no signal between the first rename and the last
                signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
            if kind is None:
                self._commit()
        finally:
            if self._previous_handler is not None:
                signal.signal(signal.SIGTERM, self._previous_handler)
                self._previous_handler = None
            if held:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_SIGNALS)
            if self.staging is not None:
                shutil.rmtree(self.staging, ignore_errors=True)
            if kind is not None and self._created:
                try:
                    os.rmdir(self.directory)  # only when empty: never anything but what we made
                except OSError:
                    pass
        return False

    # ---- staging -----------------------------------------------------------------------
    def stage(self, name: str) -> str:
        """The temporary path to write ``name`` to (a plain file name, no folders)."""
        if self.staging is None:
            raise RuntimeError("OutputFolder.stage outside its with-block")
        if os.path.basename(name) != name or name in ("", ".", ".."):
            raise OutputError(f"output name {name!r} must be a plain file name", location=self.directory)
        if name not in self.staged:
            self.staged.append(name)
        return os.path.join(self.staging, name)

    def final(self, name: str) -> str:
        """Where ``name`` will be once the block completes."""
        return os.path.join(self.directory, name)

    def write(self, name: str, data: str | bytes) -> str:
        with open(self.stage(name), "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        return self.final(name)

    def copy(self, name: str, source: str) -> str:
        shutil.copyfile(source, self.stage(name))
        return self.final(name)

    def require(self, nbytes: int) -> None:
        """Refuse (OutputError) when the disk lacks ``nbytes`` (plus a small margin)."""
        free = free_bytes(self.staging)
        if nbytes + MARGIN > free:
            raise OutputError(f"not enough room on the disk: the output needs {nbytes:,} bytes and "
                              f"{free:,} are free", location=self.directory,
                              hint="free some space or write the output to another disk")

    def _commit(self) -> None:
        umask = os.umask(0)
        os.umask(umask)
        order = [n for n in self.staged if n != self.primary] + [n for n in self.staged if n == self.primary]
        for name in order:
            path = os.path.join(self.staging, name)
            if os.path.exists(path):
                os.chmod(path, 0o666 & ~umask)
                os.replace(path, self.final(name))


def write_atomic(path: str, data: str | bytes) -> str:
    """Write one file atomically (an ``OutputFolder`` of one file); its path."""
    directory, name = os.path.split(os.path.abspath(path))
    with OutputFolder(directory, primary=name) as out:
        return out.write(name, data)


def free_bytes(path: str) -> int:
    """Free bytes on the disk holding ``path`` (a seam the tests replace)."""
    return shutil.disk_usage(path).free


def _remove_own_staging(directory: str) -> None:
    """Remove this process's staging folders in ``directory`` (``PREFIX{pid}-*``)."""
    own = f"{PREFIX}{os.getpid()}-"
    for name in os.listdir(directory) if os.path.isdir(directory) else []:
        if name.startswith(own):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def remove_stale(directory: str) -> None:
    """Remove staging folders in ``directory`` whose process no longer runs."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _raise_terminated(signum, frame):
    _SEEN.extend([signum] if _RECORDING else [])
    raise Terminated(f"signal {signum}")


def _raise_interrupted(signum, frame):
    _SEEN.append(signum)
    raise KeyboardInterrupt
