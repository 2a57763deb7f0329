"""irc's ONNX models against their peers on a "small" Llama (d 512, 8 layers, 8 heads over
2 KV heads, ffn 1408, vocab 32000, fp32, random weights). Prints three tables and never
asserts on time:

(a) whole-process compile time of one Hugging Face folder (written with transformers):
    ``irc compile DIR --target onnx-ort`` and ``--target onnx``, onnxruntime-genai's
    builder (``-p fp32 -e cpu``) and ``torch.onnx.export`` (dynamo, opset 23, no KV cache);
(b) prefill latency (one 128-token prompt; median over rounds) and decode speed (64 new
    tokens with the KV cache; 1 / the median step time over all rounds) of
    irc's models and the builder's in ONNX Runtime (one driver for all, 2 threads), of
    both through onnxruntime-genai's generate loop, of transformers eager, and the
    prefill of the torch export; plus each model's logits error against transformers;
(c) the decode ceiling: peak read bandwidth (measured here, 2 threads over 1 GiB, probed
    between the tools' runs) over the bytes one decoded token reads (weights, one
    embedding row, the KV cache), and each tool's fraction of it.

irc reads the folder through its Hugging Face frontend (``frontends.hf``). Runs are
interleaved (A B C A B C ...) and medians reported: the host's second core is noisy.

    python benchmarks/onnx_vs_peers.py [--rounds 5] [--compile-rounds 3] [--threads 2] [--workdir DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from common import (NEW, PROMPT, ROOT, SMALL, TorchStepper, genai_generate, interleaved, make_hf_folder, median,
                    ort_run, set_threads, timed_process, work_folder)
from backends.onnx.emit import emit_model  # noqa: E402
from backends.onnx.runtime import empty_caches, ort_engine  # noqa: E402
from frontends import load_spec  # noqa: E402
from irc.check import relative_error  # noqa: E402

TORCH_EXPORT = """
import sys, torch
from transformers import LlamaForCausalLM
model = LlamaForCausalLM.from_pretrained(sys.argv[1]).eval()
model.config.use_cache = False
seq = torch.export.Dim("seq", min=2, max=2048)
torch.onnx.export(model, (torch.randint(0, 32000, (1, 16)),), sys.argv[2], dynamo=True, opset_version=23,
                  dynamic_shapes={"input_ids": {1: seq}}, input_names=["input_ids"], external_data=True)
"""


# ---- (a) compile time ------------------------------------------------------------------

def compile_times(work: str, rounds: int) -> dict:
    hf = os.path.join(work, "hf")
    with open(os.path.join(work, "torch_export.py"), "w") as f:
        f.write(TORCH_EXPORT)
    tools = {
        "irc compile --target onnx-ort": [sys.executable, "-m", "irc_cli", "compile", hf, "--target", "onnx-ort",
                                          "-o", os.path.join(work, "c-irc-ort", "model.onnx")],
        "irc compile --target onnx": [sys.executable, "-m", "irc_cli", "compile", hf, "--target", "onnx",
                                      "-o", os.path.join(work, "c-irc", "model.onnx")],
        "genai builder (fp32, cpu)": [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf, "-o",
                                      os.path.join(work, "builder"), "-p", "fp32", "-e", "cpu",
                                      "-c", os.path.join(work, "builder-cache")],
        "torch.onnx.export (dynamo, 23)": [sys.executable, os.path.join(work, "torch_export.py"), hf,
                                           os.path.join(work, "torch", "model.onnx")],
    }
    for d in ("c-irc-ort", "c-irc", "torch"):
        os.makedirs(os.path.join(work, d), exist_ok=True)
    runs = interleaved({name: lambda argv=argv: timed_process(argv, ROOT) for name, argv in tools.items()}, rounds)
    return {name: ([seconds for seconds, _ in done], next((note for _, note in done if note), ""))
            for name, done in runs.items()}


# ---- (b) latency -----------------------------------------------------------------------

def genai_run(model, prompt: np.ndarray, new: int) -> tuple[float, list, None]:
    prefill, steps = genai_generate(model, prompt, new)
    return prefill, steps, None


def torch_run(model, prompt: np.ndarray, new: int) -> tuple[float, list, np.ndarray]:
    """Eager forward passes with the model's KV cache (``common.TorchStepper``)."""
    stepper = TorchStepper(model)
    prefill = stepper.start(prompt)
    logits = stepper.out.logits.numpy().copy()
    return prefill, [stepper.step() for _ in range(new)], logits


def latency(work: str, model, graph, threads: int, rounds: int, bandwidth: "ReadBandwidth") -> dict:
    import onnxruntime_genai as og
    import torch

    torch.set_num_threads(threads)
    prompt = np.random.default_rng(0).integers(3, SMALL["vocab_size"], size=(1, PROMPT)).astype(np.int64)
    caches = empty_caches(graph, 1)
    runs = {}
    for name in ("irc-ort", "irc"):
        path = os.path.join(work, name, "model.onnx")
        set_threads(os.path.dirname(path), threads, inter_op=None)
        engine = ort_engine(path, threads)
        runs[f"irc onnx{'-ort' if name == 'irc-ort' else ''} (ORT)"] = (ort_run, engine, caches)
    builder = os.path.join(work, "builder", "model.onnx")
    if os.path.exists(builder):
        set_threads(os.path.dirname(builder), threads, inter_op=None)
        runs["genai builder (ORT)"] = (ort_run, ort_engine(builder, threads), caches)
    runs["irc onnx-ort (genai loop)"] = (genai_run, og.Model(os.path.join(work, "irc-ort")), None)
    runs["irc onnx (genai loop)"] = (genai_run, og.Model(os.path.join(work, "irc")), None)
    if os.path.exists(builder):
        runs["genai builder (genai loop)"] = (genai_run, og.Model(os.path.dirname(builder)), None)
    runs["transformers eager"] = (torch_run, model, None)
    exported = os.path.join(work, "torch", "model.onnx")
    if os.path.exists(exported):
        runs["torch.onnx.export (ORT, prefill only)"] = (export_run, ort_engine(exported, threads), None)
    results = {name: ([], [], None) for name in runs}
    for name, (fn, handle, extra) in runs.items():  # warm-up
        fn(handle, extra, prompt, 4) if fn is ort_run else fn(handle, prompt, 4)
    for _ in range(rounds):
        bandwidth.probe()
        for name, (fn, handle, extra) in runs.items():
            prefill, decode, logits = fn(handle, extra, prompt, NEW) if fn is ort_run else fn(handle, prompt, NEW)
            results[name][0].append(prefill)
            results[name][1].extend(decode)
            if logits is not None:
                results[name] = (results[name][0], results[name][1], logits)
    return results


def export_run(engine, prompt: np.ndarray, new: int) -> tuple[float, list, np.ndarray]:
    """The exported graph has no KV cache: prefill only."""
    start = time.perf_counter()
    logits = engine({"input_ids": prompt})
    return time.perf_counter() - start, [], next(iter(logits.values()))


# ---- (c) ceiling -----------------------------------------------------------------------

class ReadBandwidth:
    """Peak read bandwidth of ``threads`` threads: a bitwise-or reduction (the cheapest pass
    over the data NumPy offers) over 1 GiB, split in ``threads`` parts. ``probe`` runs a
    few passes; the ceiling takes the best pass of all probes (a peak, not a median),
    probed between the tools' runs so it sees the same host."""

    def __init__(self, threads: int, size: int = 1 << 30):
        self.size, self.threads = size, threads
        self.chunks = np.array_split(np.ones(size // 8, dtype=np.uint64), threads)
        self.best = 0.0

    def probe(self, repeat: int = 3) -> None:
        with ThreadPoolExecutor(self.threads) as pool:
            for _ in range(repeat):
                start = time.perf_counter()
                list(pool.map(np.bitwise_or.reduce, self.chunks))
                self.best = max(self.best, self.size / (time.perf_counter() - start))


def bytes_per_token(graph) -> int:
    """Weights a decode step reads (all but the embedding table, plus one of its rows) and
    the KV cache at the mean context of the decode (prompt + half the new tokens)."""
    weights = sum(p.nbytes for p in graph.params.values())
    embed = graph.params["embed"]
    weights -= embed.nbytes - embed.shape[1] * embed.dtype.nbytes(1)
    kv_per_token = 2 * SMALL["num_hidden_layers"] * SMALL["num_key_value_heads"] * 64 * 4
    return weights + kv_per_token * (PROMPT + NEW // 2)


# ---- main ------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved latency rounds")
    parser.add_argument("--compile-rounds", type=int, default=3, help="interleaved compile rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    work = work_folder(args.workdir, "irc-onnx-bench-")
    model = make_hf_folder(os.path.join(work, "hf"))

    compiled = compile_times(work, args.compile_rounds)
    print(f"\n(a) whole-process compile time, median of {args.compile_rounds} interleaved runs")
    print(f"  {'tool':<34} {'seconds':>8}  runs")
    for name, (times, note) in compiled.items():
        runs = " ".join(f"{t:.2f}" for t in times)
        print(f"  {name:<34} {median(times):8.2f}  {runs}" + (f"  FAILED: {note}" if note else ""))

    graph = load_spec(os.path.join(work, "hf"))  # the Hugging Face frontend: the same folder the builder reads
    for name, target in (("irc-ort", "onnx-ort"), ("irc", "onnx")):
        os.makedirs(os.path.join(work, name), exist_ok=True)
        emit_model(graph, os.path.join(work, name, "model.onnx"), target=target, context=PROMPT + NEW + 64)
    probe = ReadBandwidth(args.threads)
    results = latency(work, model, graph, args.threads, args.rounds, probe)
    reference = results["transformers eager"][2]
    bandwidth = probe.best
    per_token = bytes_per_token(graph)
    ceiling = bandwidth / per_token
    print(f"\n(b) prefill of {PROMPT} tokens (median of {args.rounds} interleaved runs) and decode of {NEW} "
          f"tokens (1 / median step time over all runs), batch 1, {args.threads} threads")
    print(f"  {'tool':<38} {'prefill ms':>10} {'decode tok/s':>12} {'of ceiling':>10} {'logits err':>10}")
    for name, (prefill, decode, logits) in results.items():
        rate = 1.0 / median(decode)
        error = "" if logits is None else f"{relative_error(logits.reshape(reference.shape), reference):.1e}"
        print(f"  {name:<38} {median(prefill) * 1000:10.1f} {rate:12.1f} {rate / ceiling:10.1%} {error:>10}")
    print(f"\n(c) decode ceiling: peak read bandwidth {bandwidth / 1e9:.1f} GB/s ({args.threads} threads, 1 GiB, best "
          f"of {3 * args.rounds} passes between the runs) / "
          f"{per_token / 1e6:.1f} MB per token (fp32 weights, one embedding row, KV cache at "
          f"{PROMPT + NEW // 2} tokens) = {ceiling:.0f} tokens/s")


if __name__ == "__main__":
    main()
