"""The cells and timings that ``vlm_twins.py`` and ``vlm_mllama.py`` share (their verdict
against transformers is ``common.verdict``): a tool's last error line, empty decoder caches,
irc's two ONNX targets, the builder's cell, and the vision latency row."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np

from common import compile_graph, median_seconds


def last_line(text: str) -> str:
    """The error a tool ended with (its last line naming an error, else its last line)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line.split(":")[0] or line.startswith("error")]
    return ((errors or lines or ["no output"])[-1])[:160].replace("|", "/")


def empty_states(decoder) -> dict:
    """Zero-length caches [1, kv, 0, D] and zero recurrent states (Qwen3.5's conv_state [1, C, K-1],
    recurrent_state [1, H, dk, dv]) for a decoder session's past_key_values inputs, from its
    ONNX shapes: batch 1, any other symbolic axis (the past length) 0."""
    return {v.name: np.zeros([1 if i == 0 else d if isinstance(d, int) else 0 for i, d in enumerate(v.shape)],
                             np.float16 if v.type == "tensor(float16)" else np.float32)
            for v in decoder.get_inputs() if v.name.startswith("past_key_values.")}


def irc_onnx_cells(folder: str, tmp: str, check) -> list:
    """``irc compile`` to both ONNX targets (``tmp/irc-onnx``, ``tmp/irc-onnx-ort``): each folder's
    verdict from ``check({"vision": path, "embedding": path, "decoder": path})``, or "refused"."""
    from irc_cli import main

    cells = []
    for target in ("onnx", "onnx-ort"):
        out = os.path.join(tmp, f"irc-{target}")
        if main(["compile", folder, "--target", target, "-o", os.path.join(out, "model.onnx"), "--quiet"]) != 0:
            cells.append("refused")
            continue
        cells.append(check({k: os.path.join(out, f) for k, f in (("vision", "vision.onnx"),
                                                                  ("embedding", "embedding.onnx"),
                                                                  ("decoder", "model.onnx"))}))
    return cells


def builder_cell(folder: str, tmp: str) -> str:
    out = os.path.join(tmp, "builder")
    done = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", folder, "-o", out, "-p",
                           "fp32", "-e", "cpu"], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return f"refused: {last_line(done.stderr + done.stdout)}"
    return f"text decoder only ({onnx_files(out)}): no vision or embedding model"


def onnx_files(out: str) -> str:
    return ", ".join(sorted(f for f in os.listdir(out) if f.endswith(".onnx")))


def median_ms(run, rounds: int = 5) -> float:
    """Median ms of ``rounds`` calls of ``run()`` after one warm-up."""
    return 1000 * median_seconds(run, rounds)


def irc_vision_ms(folder: str, feeds: dict, rounds: int = 5) -> tuple:
    """The folder's vision model: its FLOPs per image (irc's analysis) and irc ``onnx-ort``'s
    median ms in ONNX Runtime (2 threads) on ``feeds``."""
    from backends import get_target
    from backends.onnx.runtime import ort_session
    from frontends import load_spec
    from irc.analysis import analyze

    spec = get_target("onnx-ort")
    vision = load_spec(folder).parts["vision"]
    flops = analyze(vision)["vision"]["flops_per_image"]
    pipeline = ",".join(p for p in (spec.prelude({}), spec.pipeline({}), spec.postlude({})) if p)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "vision.onnx")
        compile_graph(vision, path, pipeline, target="onnx-ort", genai=False)
        session = ort_session(path, threads=2)
        return flops, median_ms(lambda: session.run(None, feeds), rounds)


def latency_row(label: str, flops: float, irc_ms: float, torch_ms: float) -> tuple:
    return (label, f"{flops / 1e9:,.0f}", f"{irc_ms:,.0f}", f"{torch_ms:,.0f}", f"{torch_ms / irc_ms:.2f}x")
