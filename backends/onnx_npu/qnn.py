"""Ahead-of-time compiles with Qualcomm's HTP compiler (``onnxruntime-qnn``, the ``npu`` extra).

``compile_htp(model, soc)`` creates an ONNX Runtime session with the QNN execution provider
and CPU fallback disabled, which compiles the model for Snapdragon ``soc`` (60 = X Elite,
69 = 8 Elite) with no device present and writes ``<out>`` (an ``EPContext`` model that
embeds the context binary). The placement comes from the provider's log at verbose
severity: its "Node placements" block (``node -> provider``) and the reasons it gives for
refused nodes. A failed compile still writes the ``_ctx.onnx``, so success is the absence
of an exception, never the file.

``emulated_session(ctx)`` runs a compiled context on x86 through the same ``libQnnHtp.so``
(emulation: a functional check, about a second per call for a small model).

The provider library is registered once per process (ONNX Runtime refuses a second
registration under the same name).
"""
from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass, field

from irc.errors import BackendError

EP = "QNNExecutionProvider"
SOCS = {60: "Snapdragon X Elite", 69: "Snapdragon 8 Elite"}
_REGISTERED = []   # the one registration per process (ONNX Runtime refuses a second)


@dataclass
class Compiled:
    """One compile: ``ok`` when the session was created (every node on the HTP)."""

    model: str
    soc: int
    ok: bool
    seconds: float
    context_path: str = ""
    context_bytes: int = 0
    placements: dict = field(default_factory=dict)     # node name -> provider
    refusals: list = field(default_factory=list)       # the provider's reasons, as logged
    error: str = ""

    @property
    def on_npu(self) -> int:
        return sum(p == EP for p in self.placements.values())

    @property
    def on_cpu(self) -> int:
        return sum(p != EP for p in self.placements.values())


def available() -> bool:
    try:
        import onnxruntime_qnn  # noqa: F401
    except ImportError:
        return False
    return True


def _devices():
    import onnxruntime as ort
    import onnxruntime_qnn

    if not _REGISTERED:
        ort.register_execution_provider_library(EP, onnxruntime_qnn.get_library_path())
        _REGISTERED.append(True)
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP]
    if not devices:
        raise BackendError("onnxruntime-qnn is installed but offers no QNN device")
    return devices


def _options(soc: int, extra: dict):
    import onnxruntime as ort
    import onnxruntime_qnn

    if soc not in SOCS:
        raise BackendError(f"soc_model {soc} is not one irc checks", hint=f"one of {', '.join(map(str, SOCS))}")
    so = ort.SessionOptions()
    so.add_provider_for_devices(_devices(), {"backend_path": onnxruntime_qnn.get_qnn_htp_path(),
                                             "soc_model": str(soc), **extra})
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return so


def compile_htp(model: str, soc: int, out: str = "", log_dir: str = "") -> Compiled:
    """Compile ``model`` for ``soc``; ``out`` is the EPContext model (default
    ``<model>_<soc>_ctx.onnx``). The verbose log goes to a file in ``log_dir`` (a temporary
    folder by default) and is parsed for placements."""
    import onnxruntime as ort

    out = out or f"{os.path.splitext(model)[0]}_{soc}_ctx.onnx"
    if os.path.exists(out):
        os.remove(out)  # the provider refuses to overwrite a context model
    with tempfile.TemporaryDirectory() as scratch:
        log = os.path.join(log_dir or scratch, f"qnn_{soc}.log")
        so = _options(soc, {})
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", out)
        so.add_session_config_entry("ep.context_embed_mode", "1")
        so.log_severity_level = 0
        so.log_verbosity_level = 0
        start = time.perf_counter()
        error = ""
        with _redirect_stderr(log):
            try:
                ort.InferenceSession(model, so)
            except Exception as err:  # noqa: BLE001  the provider's failure is the result
                error = str(err).strip().splitlines()[0][:500] if str(err).strip() else type(err).__name__
        seconds = time.perf_counter() - start
        with open(log, errors="replace") as f:
            text = f.read()
    placements, refusals = parse_log(text)
    ok = not error
    size = os.path.getsize(out) if ok and os.path.exists(out) else 0
    return Compiled(model, soc, ok, seconds, out if ok else "", size, placements, refusals, error)


VALIDATION = re.compile(r"Validation (PASSED|FAILED) for \d+ nodes in \w+ \((\w+)\)")
NODE = re.compile(r"Operator type: (\w+) Node name: (.*?) Node index: \d+")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_log(text: str) -> tuple[dict, list]:
    """(node name -> provider, refusal lines) from ONNX Runtime's verbose log. The QNN
    provider validates every node of the original model ("Validation PASSED for 1 nodes in
    OrtNodeUnit (MatMul) :" then "Operator type: MatMul Node name: ... Node index: ..."); a
    node that passed goes to the HTP, one that failed would have gone to the CPU, and the
    lines that say why are kept. Only the first validation round (before the layout
    transform, where the names are the model's own) is read."""
    placements, refusals, verdict = {}, [], None
    rounds = 0
    for line in text.splitlines():
        if "GetCapability pass" in line:
            rounds += 1
            if rounds > 1:
                break
        found = VALIDATION.search(line)
        if found:
            verdict = found.group(1)
            continue
        node = NODE.search(line)
        if node and verdict:
            placements[node.group(2)] = EP if verdict == "PASSED" else "CPUExecutionProvider"
            verdict = None
            continue
        if "not supported" in line or "unsupported" in line.lower() or " failed" in line.lower():
            reason = ANSI.sub("", line.split("] ", 1)[-1]).strip()
            if reason and reason not in refusals:
                refusals.append(reason)
    return placements, refusals


class _redirect_stderr:
    """Point file descriptor 2 at ``path`` (ONNX Runtime logs from C++ to fd 2)."""

    def __init__(self, path: str):
        self.path = path

    def __enter__(self):
        import sys

        sys.stderr.flush()
        self.saved = os.dup(2)
        self.file = open(self.path, "w")
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc):
        import sys

        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.close()
        return False


def compile_shared(models: dict, soc: int, out_dir: str) -> dict:
    """Compile ``models`` ({role: path}, in order) into one QNN context with shared weights
    (``ep.share_ep_contexts``; the last session stops the sharing): each role gets
    ``<out_dir>/<role>_ctx.onnx`` (``embed_mode`` 0), all referring to the first one's
    ``_qnn.bin``. Returns {role: path}; the bin's size is the weights once. (The x86
    emulator refuses to load such a context, QNN_COMMON_ERROR_NOT_SUPPORTED, so the
    emulated checks use one embedded context per graph.)"""
    import onnxruntime as ort

    written = {}
    for index, (role, model) in enumerate(models.items()):
        so = _options(soc, {})
        written[role] = os.path.join(out_dir, f"{role}_ctx.onnx")
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_file_path", written[role])
        so.add_session_config_entry("ep.context_embed_mode", "0")
        so.add_session_config_entry("ep.share_ep_contexts", "1")
        if index == len(models) - 1:
            so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
        so.log_severity_level = 3
        ort.InferenceSession(model, so)
    return written


def emulated_session(context_model: str, soc: int):
    """An ORT session over a compiled ``EPContext`` model, run by the HTP emulator on x86."""
    import onnxruntime as ort

    so = _options(soc, {})
    so.log_severity_level = 3
    return ort.InferenceSession(context_model, so)
