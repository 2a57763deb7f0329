"""The models and irc compiles that the int4 benchmarks share (``int4_quality.py`` scores
them, ``int4_real.py`` and ``gguf_speed.py`` time them): the real models' folders, the
calibration text, the compile command line of a method, a folder cache keyed by that
command line, a copy at another MatMulNBits accuracy level, and plain ONNX Runtime logits."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

from common import ROOT, cpu_session, set_threads

CALIBRATION = os.path.join(os.path.dirname(ROOT), "shared", "seeds", "000_812997a390ead4ae.txt")
CALIBRATED = ("imatrix", "gptq", "awq")
MODELS = {"smollm2": "SmolLM2-135M-Instruct", "gemma3": "Gemma-3-270M", "qwen-coder": "Qwen2.5-Coder-0.5B-Instruct"}


def irc_argv(hf: str, out: str, method: str | None = None, group: int = 32, tokenizer: str | None = None) -> list:
    """``irc compile`` of ``hf`` with ``method`` (``name:option=value:...``) at ``group``; a
    calibrated method reads ``CALIBRATION`` with ``tokenizer`` (the folder's by default)."""
    argv = [sys.executable, "-m", "irc_cli", "compile", hf, "--target", "onnx-ort", "--logits", "all",
            "--quiet", "-o", os.path.join(out, "model.onnx")]
    if method is None:
        return argv
    name, *more = method.split(":")  # "ort:symmetric=false": a method with more quantize options
    extra = "".join("," + option for option in more)
    if name in CALIBRATED:
        extra += f",calibration={CALIBRATION},tokenizer={tokenizer or os.path.join(hf, 'tokenizer.json')}"
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


def prepare_model(model: str) -> str:
    """The float32 Hugging Face folder of ``model`` (a key of ``MODELS``), made on first use."""
    if model == "smollm2":
        from real_model import prepare
        return prepare()["f32"]
    if model == "gemma3":
        from real_gemma3 import prepare
        return prepare()
    if model == "qwen-coder":
        from real_qwen_coder import prepare
        return prepare()
    raise SystemExit(f"unknown model {model!r}: one of {', '.join(MODELS)}")


def with_level(folder: str, level: int, threads: int) -> str:
    """A sibling folder whose model.onnx sets ``accuracy_level`` on every MatMulNBits (none for
    0); the external data and tokenizer are hard links to ``folder``'s (ONNX Runtime refuses
    external data that resolves outside the model's folder, as a symbolic link does)."""
    import onnx

    out = f"{folder}-acc{level}"
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for name in os.listdir(folder):
        if name not in ("model.onnx", "genai_config.json"):
            os.link(os.path.join(folder, name), os.path.join(out, name))
    shutil.copy(os.path.join(folder, "genai_config.json"), out)
    model = onnx.load(os.path.join(folder, "model.onnx"), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for attribute in [a for a in node.attribute if a.name == "accuracy_level"]:
                node.attribute.remove(attribute)
            if level:
                node.attribute.append(onnx.helper.make_attribute("accuracy_level", level))
    onnx.save(model, os.path.join(out, "model.onnx"))
    set_threads(out, threads)
    return out


def ort_logits(folder: str, ids: list, threads: int, head_dim: int = 64) -> np.ndarray:
    """Logits [T, V] of one prefill over ``ids`` through plain ONNX Runtime (empty caches;
    ``head_dim`` where a cache input leaves it symbolic, as the builder's do)."""
    session = cpu_session(os.path.join(folder, "model.onnx"), threads)
    t = len(ids)
    feeds = {"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, t), np.int64),
             "position_ids": np.arange(t, dtype=np.int64)[None]}
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values"):
            shape = [1, i.shape[1], 0, i.shape[3] if isinstance(i.shape[3], int) else head_dim]
            feeds[i.name] = np.zeros(shape, types[i.type])
    names = {i.name for i in session.get_inputs()}
    logits = session.run(["logits"], {k: v for k, v in feeds.items() if k in names})[0]
    return np.asarray(logits[0], np.float32)
