"""The irc compiles that the int4 benchmarks share (``int4_quality.py`` scores them,
``int4_real.py`` times them): the calibration text, the compile command line of a method,
and a folder cache keyed by that command line."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

from onnx_vs_peers import ROOT

CALIBRATION = os.path.join(os.path.dirname(ROOT), "shared", "seeds", "000_812997a390ead4ae.txt")
CALIBRATED = ("imatrix", "gptq", "awq")


def irc_argv(hf: str, out: str, method: str | None = None, group: int = 32) -> list:
    argv = [sys.executable, "-m", "irc_cli", "compile", hf, "--target", "onnx-ort", "--logits", "all",
            "--quiet", "-o", os.path.join(out, "model.onnx")]
    if method is None:
        return argv
    name, *more = method.split(":")  # "ort:symmetric=false": a method with more quantize options
    extra = "".join("," + option for option in more)
    if name in CALIBRATED:
        extra += f",calibration={CALIBRATION},tokenizer={os.path.join(hf, 'tokenizer.json')}"
    return argv + ["--passes", f"lower-mlp,quantize{{bits=4,group={group},embeddings=true,method={name}{extra}}},dce"]
def build(work: str, row: str, make, quantized: bool, rebuild: set) -> tuple:
    """(folder, failure note) of the model that ``make(folder)``'s command line writes,
    compiled now unless a complete folder for the same command line is cached."""
    key = hashlib.sha256(json.dumps(make("OUT")).encode()).hexdigest()
    folder = os.path.join(work, f"{row}-{key[:12]}")
    done = os.path.join(folder, ".done")
    if os.path.exists(done) and row not in rebuild and not (quantized and "int4" in rebuild):
        return folder, ""
    shutil.rmtree(folder, ignore_errors=True)
    argv = make(folder)
    print(f"  compiling {row}: {' '.join(argv[1:])}", flush=True)
    start = time.perf_counter()
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    shutil.rmtree(folder + ".cache", ignore_errors=True)
    if run.returncode or not os.path.exists(os.path.join(folder, "model.onnx")):
        shutil.rmtree(folder, ignore_errors=True)
        lines = [line.strip() for line in (run.stderr + run.stdout).splitlines() if line.strip()] or ["failed"]
        errors = [i for i, line in enumerate(lines) if "error" in line.lower()]
        return None, " ".join(lines[errors[-1]:errors[-1] + 2] if errors else lines[-1:])[:200]
    with open(done, "w") as f:
        f.write(" ".join(argv) + f"\n{time.perf_counter() - start:.1f} s\n")
    return folder, ""
