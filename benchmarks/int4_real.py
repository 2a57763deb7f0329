"""int4 on a real model: irc's ``quantize`` methods and MatMulNBits accuracy levels against
onnxruntime-genai's builder on one of three real models (``--model``): SmolLM2-135M-Instruct
(``real_model.py`` prepares it), Gemma-3-270M (``real_gemma3.py``) or
Qwen2.5-Coder-0.5B-Instruct (``real_qwen_coder.py``). Prints tables and never asserts on time.

Rows, all in this one process:

- transformers fp32 (the reference): the Hugging Face folder in torch, eager;
- irc fp32: ``irc compile HF --target onnx-ort``;
- irc int4, per method (``--methods``, default ``rtn``, ``mse``, ``imatrix``; ``imatrix`` and
  ``gptq`` with ``CALIBRATION``, a text other than the evaluation text) and per accuracy
  level (0, 1, 2, 4):
  ``lower-mlp,quantize{bits=4,group=32,embeddings=true,method=M,accuracy_level=0},dce``
  (embedding table and tied head in int4, as the builder does), compiled once per method;
  each level is a copy of model.onnx with ``accuracy_level`` set on every MatMulNBits
  (same external data);
- builder int4: ``python -m onnxruntime_genai.models.builder -i HF -o OUT -p int4 -e cpu``.

irc's models are timed as compiled by default (``--logits last``: logits [B, 1, V]); their
perplexity is scored on twins compiled the same way with ``--logits all`` (the rows of
``int4_quality.py``, cached under ``WORKDIR/score`` by command line), at the same levels.

Columns: MB on disk (model.onnx + external data); perplexity over the first 512 tokens of
``real_model.SEED_TEXT`` (one ORT prefill, 2 threads; torch for transformers) and top-1
agreement of the next-token argmax with transformers fp32 over those positions; prefill ms
of a 128-token prompt (the text's first 128 tokens) and decode tok/s (64 new tokens, 1 /
the median step) through onnxruntime-genai's generate loop on 2 threads (torch eager for
transformers), medians over ``--rounds`` interleaved rounds (A B C ... A B C ...), each
model loaded afresh for its run and dropped after it: an idle ONNX Runtime session's thread
pool spins and would steal the cores from the session being timed. Then the
targets against the builder (int4 size <= 1.05x, decode >= 1.0x, perplexity gap to fp32 at
most half the builder's), the whole-process compile times, and the quantization speed
(MB of float32 weights per second) of each method's code search over every weight of the
model, in this process, against RTN.

    python benchmarks/int4_real.py [--model smollm2|gemma3|qwen-coder] [--rounds 5] [--threads 2]
        [--workdir DIR] [--methods rtn,mse,imatrix]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from common import (NEW, PROMPT, ROOT, GenaiStepper, TorchStepper, disk_bytes, median, set_threads,  # noqa: F401
                    timed_process, timed_rounds)
from int4_builds import CALIBRATION, MODELS, build as cached_build, irc_argv, ort_logits, prepare_model, with_level
from real_model import SEED_TEXT, eval_tokens

METHODS = ("rtn", "mse", "imatrix")
CALIBRATED = ("imatrix", "gptq")
LEVELS = (0, 1, 2, 4)


def pipeline(method: str, hf: str) -> str:
    extra = f",calibration={CALIBRATION},tokenizer={os.path.join(hf, 'tokenizer.json')}" if method in CALIBRATED else ""
    return f"lower-mlp,quantize{{bits=4,group=32,embeddings=true,method={method},accuracy_level=0{extra}}},dce"


def score_twins(work: str, hf: str, methods: list) -> dict:
    """{"irc fp32" or method: folder} of the ``--logits all`` twins perplexity is scored on
    (``int4_builds.build``: cached by command line; None where the compile failed)."""
    twins = {"irc fp32": cached_build(os.path.join(work, "score"), "irc-fp32", lambda out: irc_argv(hf, out),
                                      False, set())[0]}
    for method in methods:
        twins[method] = cached_build(os.path.join(work, "score"), f"irc-{method}-g32",
                                     lambda out, m=method: irc_argv(hf, out, m), True, set())[0]
    return twins


def build(work: str, hf: str, methods: list) -> dict:
    """{name: (folder, whole-process seconds, failure note)} for every compiled model."""
    irc = [sys.executable, "-m", "irc_cli", "compile", hf, "--target", "onnx-ort", "-o"]
    jobs = {"irc fp32": irc + [os.path.join(work, "irc-fp32", "model.onnx")]}
    for method in methods:
        jobs[f"irc int4 {method}"] = irc + [os.path.join(work, f"irc-{method}", "model.onnx"),
                                            "--passes", pipeline(method, hf)]
    jobs["builder int4"] = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf, "-o",
                            os.path.join(work, "builder-int4"), "-p", "int4", "-e", "cpu", "-c",
                            os.path.join(work, "builder-cache")]
    built = {}
    for name, argv in jobs.items():
        folder = os.path.dirname(argv[argv.index("-o") + 1]) if name.startswith("irc") else argv[argv.index("-o") + 1]
        seconds, note = timed_process(argv, ROOT)
        built[name] = (folder, seconds, note)
    return built


def quality(logits: np.ndarray, ids: list, reference_top: np.ndarray) -> tuple:
    """(perplexity, top-1 agreement with the reference's argmax) over positions 0..T-2."""
    from irc.evaluate import next_token_nll, perplexity

    top = logits[:-1].argmax(axis=-1)
    return perplexity(next_token_nll(logits, ids)), float(np.mean(top == reference_top))


def transformers_model(hf: str, threads: int):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    return AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()


def torch_logits(model, ids: list) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def search_speed(hf: str, calibration_stats: dict | None, methods: list) -> dict:
    """MB/s of float32 weights through each method's code search, every 2-D weight of the model
    (methods that need no statistics beyond imatrix's: not gptq)."""
    from frontends import load_spec
    from passes.quantize_methods import quantize_weight

    graph = load_spec(hf)
    weights = [p for p in graph.params.values() if p.rank == 2]
    speeds = {}
    for method in [m for m in ("rtn", *methods) if m != "gptq"]:
        if method in speeds:
            continue
        seconds, size = 0.0, 0
        for param in weights:
            w = np.asarray(param.array(), np.float32)
            importance = (calibration_stats or {}).get(param.name) if method == "imatrix" else None
            start = time.perf_counter()
            quantize_weight(w, bits=4, block_size=32, symmetric=True, method="mse" if importance is None and
                            method == "imatrix" else method, importance=importance)
            seconds += time.perf_counter() - start
            size += w.nbytes
        speeds[method] = size / seconds / 1e6
    return speeds


def calibration_seconds(hf: str) -> tuple:
    """(seconds, statistics) of the imatrix calibration run as the pass does it."""
    from frontends import load_spec
    from irc.evaluate import text_tokens
    from passes.quantize import Quantize
    from passes.quantize_calibrate import importance

    graph = load_spec(hf)
    tokens = text_tokens(CALIBRATION, os.path.join(hf, "tokenizer.json"),
                         Quantize.options["calibration_tokens"], what="calibration text")
    start = time.perf_counter()
    stats = importance(graph, tokens, {p.name for p in graph.params.values() if p.rank == 2})
    return time.perf_counter() - start, stats, len(tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", choices=list(MODELS))
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated (rtn, ort, mse, imatrix, gptq)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    methods = [m for m in args.methods.split(",") if m]
    hf = prepare_model(args.model)
    work = args.workdir or tempfile.mkdtemp(prefix="int4-real-")
    ids = eval_tokens(hf)
    prompt = np.asarray([ids[:PROMPT]], np.int64)
    print(f"model {hf}; eval: first {len(ids)} tokens of {SEED_TEXT}; work dir {work}", flush=True)

    built = build(work, hf, methods)
    twins = score_twins(work, hf, methods)
    rows, scored = {"irc fp32": built["irc fp32"][0]}, {"irc fp32": twins["irc fp32"]}
    for method in methods:
        for level in LEVELS:
            name = f"irc int4 {method} acc{level}"
            if not built[f"irc int4 {method}"][2] and twins[method]:
                rows[name] = with_level(built[f"irc int4 {method}"][0], level, args.threads)
                scored[name] = with_level(twins[method], level, args.threads)
    rows["builder int4"] = scored["builder int4"] = built["builder int4"][0]
    for folder in (built["irc fp32"][0], built["builder int4"][0]):
        set_threads(folder, args.threads)

    reference = transformers_model(hf, args.threads)
    reference_logits = torch_logits(reference, ids)
    reference_top = reference_logits[:-1].argmax(axis=-1)
    scores = {"transformers fp32": quality(reference_logits, ids, reference_top)}
    for name, folder in scored.items():
        scores[name] = quality(ort_logits(folder, ids, args.threads, head_dim(hf)), ids, reference_top)
        print(f"  scored {name}: perplexity {scores[name][0]:.2f}", flush=True)

    timings = measure_decode(rows, reference, prompt, args.rounds)
    report(rows, built, scores, timings, hf, MODELS[args.model])
    if "imatrix" in methods:
        seconds, stats, count = calibration_seconds(hf)
        note = f"; imatrix calibration: {count} tokens in {seconds:.1f} s (reference interpreter, streamed)"
    else:
        stats, note = None, ""
    speeds = search_speed(hf, stats, methods)
    print(f"\nquantization speed (every 2-D weight of the model, float32 MB/s, this process): "
          + ", ".join(f"{m} {s:.1f} MB/s ({s / speeds['rtn']:.2f}x rtn)" for m, s in speeds.items()) + note)


def head_dim(hf: str) -> int:
    """The attention head size of the folder's config (the builder's caches leave it symbolic)."""
    with open(os.path.join(hf, "config.json")) as f:
        config = json.load(f)
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def measure_decode(rows: dict, reference, prompt: np.ndarray, rounds: int) -> dict:
    """{name: (prefill seconds per round, decode step seconds)} of transformers' fp32 model
    and each genai folder of ``rows`` (``timed_rounds``)."""
    import onnxruntime_genai as og

    def open_stepper(name):
        if name == "transformers fp32":
            return TorchStepper(reference), reference
        model = og.Model(rows[name])
        return GenaiStepper(model), model

    return timed_rounds(open_stepper, ["transformers fp32", *rows], prompt, rounds)


def report(rows: dict, built: dict, scores: dict, timings: dict, hf: str, title: str) -> None:
    sizes = {"transformers fp32": sum(os.path.getsize(os.path.join(hf, n)) for n in os.listdir(hf)
                                      if n.endswith(".safetensors"))}
    sizes.update({name: disk_bytes(folder) for name, folder in rows.items()})
    print(f"\n{title}, CPU, prefill {PROMPT} tokens and decode {NEW} through onnxruntime-genai "
          f"(torch eager for transformers); perplexity and top-1 over the eval text")
    print(f"  {'model':<26} {'MB on disk':>10} {'perplexity':>10} {'top-1':>7} {'prefill ms':>10} {'decode tok/s':>12}")
    for name in ["transformers fp32", *rows]:
        prefill, steps = timings[name]
        ppl, top1 = scores[name]
        print(f"  {name:<26} {sizes[name] / 1e6:10.1f} {ppl:10.2f} {top1:7.1%} {median(prefill) * 1000:10.1f} "
              f"{1 / median(steps):12.1f}")
    builder = "builder int4"
    gap = scores[builder][0] - scores["transformers fp32"][0]
    limit = scores["transformers fp32"][0] + gap / 2
    print(f"\ntargets against the builder (size <= 1.05x, decode >= 1.0x, perplexity <= {limit:.2f}, "
          f"half the builder's gap of {gap:.2f}):")
    speed = 1 / median(timings[builder][1])
    for name in rows:
        if name.startswith("irc int4"):
            size, tps, ppl = sizes[name] / sizes[builder], 1 / median(timings[name][1]) / speed, scores[name][0]
            ok = size <= 1.05 and tps >= 1.0 and ppl <= limit
            print(f"  {name:<26} size {size:5.3f}x  decode {tps:5.2f}x  perplexity {ppl:7.2f}  "
                  f"{'all met' if ok else 'missed'}")
    print("\nwhole-process compile time (one run each):")
    for name, (_, seconds, note) in built.items():
        print(f"  {name:<26} {seconds:7.1f} s  {note}")


if __name__ == "__main__":
    main()
