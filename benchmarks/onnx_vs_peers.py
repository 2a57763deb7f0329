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
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from backends.onnx.emit import emit_model  # noqa: E402
from backends.onnx.runtime import empty_caches, ort_engine  # noqa: E402
from frontends import load_spec  # noqa: E402
from irc.check import relative_error  # noqa: E402

SMALL = dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=1408, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
PROMPT, NEW = 128, 64
TORCH_EXPORT = """
import sys, torch
from transformers import LlamaForCausalLM
model = LlamaForCausalLM.from_pretrained(sys.argv[1]).eval()
model.config.use_cache = False
seq = torch.export.Dim("seq", min=2, max=2048)
torch.onnx.export(model, (torch.randint(0, 32000, (1, 16)),), sys.argv[2], dynamo=True, opset_version=23,
                  dynamic_shapes={"input_ids": {1: seq}}, input_names=["input_ids"], external_data=True)
"""


# ---- set-up ----------------------------------------------------------------------------

def make_hf_folder(directory: str):
    """The small Llama with seeded random weights, saved with a word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMALL)).eval()
    model.save_pretrained(directory)
    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(SMALL["vocab_size"])}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "t1", "eos_token": "t2",
                   "pad_token": "t0", "unk_token": "t0"}, f)
    return model


# ---- (a) compile time ------------------------------------------------------------------

def timed_process(argv: list, cwd: str) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        return float("nan"), (done.stderr.strip().splitlines() or ["failed"])[-1][:100]
    return seconds, ""


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
    times = {name: [] for name in tools}
    notes = {name: "" for name in tools}
    for _ in range(rounds):
        for name, argv in tools.items():
            seconds, note = timed_process(argv, ROOT)
            times[name].append(seconds)
            notes[name] = notes[name] or note
    return {name: (times[name], notes[name]) for name in tools}


# ---- (b) latency -----------------------------------------------------------------------

def ort_run(engine, caches: dict, prompt: np.ndarray, new: int) -> tuple[float, list, np.ndarray]:
    """(prefill seconds, seconds of each of ``new`` decode steps, prefill logits) driving an
    ORT session with the genai signature (position_ids reach the models that take them)."""
    feeds = {"input_ids": prompt, "attention_mask": np.ones_like(prompt), **caches,
             "position_ids": np.arange(prompt.shape[1], dtype=np.int64)[None]}
    start = time.perf_counter()
    out = engine(feeds)
    prefill = time.perf_counter() - start
    logits = out["logits"]
    total, steps = prompt.shape[1], []
    for _ in range(new):
        start = time.perf_counter()
        token = np.argmax(out["logits"][:, -1], axis=-1)[:, None].astype(np.int64)
        total += 1
        feeds = {"input_ids": token, "attention_mask": np.ones((1, total), np.int64),
                 "position_ids": np.array([[total - 1]], np.int64),
                 **{k: out["present." + k[len("past_key_values."):]] for k in caches}}
        out = engine(feeds)
        steps.append(time.perf_counter() - start)
    return prefill, steps, logits


def genai_run(model, prompt: np.ndarray, new: int) -> tuple[float, list, None]:
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt.shape[1] + new + 1, do_sample=False)
    generator = og.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens(prompt.astype(np.int32))
    prefill, steps = time.perf_counter() - start, []
    for _ in range(new):
        start = time.perf_counter()
        generator.generate_next_token()
        steps.append(time.perf_counter() - start)
    return prefill, steps, None


def torch_run(model, prompt: np.ndarray, new: int) -> tuple[float, list, np.ndarray]:
    """Eager forward passes with the model's KV cache (``cache`` in transformers 5.x)."""
    import inspect

    import torch

    keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.inference_mode():
        ids = torch.from_numpy(prompt)
        start = time.perf_counter()
        out = model(ids, use_cache=True)
        prefill = time.perf_counter() - start
        logits, steps = out.logits.numpy().copy(), []
        for _ in range(new):
            start = time.perf_counter()
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            past = getattr(out, "cache", None) or out.past_key_values
            out = model(token, use_cache=True, **{keyword: past})
            steps.append(time.perf_counter() - start)
        return prefill, steps, logits


def set_genai_threads(directory: str, threads: int) -> None:
    path = os.path.join(directory, "genai_config.json")
    with open(path) as f:
        config = json.load(f)
    config["model"]["decoder"]["session_options"]["intra_op_num_threads"] = threads
    with open(path, "w") as f:
        json.dump(config, f, indent=4)


def latency(work: str, model, graph, threads: int, rounds: int, bandwidth: "ReadBandwidth") -> dict:
    import onnxruntime_genai as og
    import torch

    torch.set_num_threads(threads)
    prompt = np.random.default_rng(0).integers(3, SMALL["vocab_size"], size=(1, PROMPT)).astype(np.int64)
    caches = empty_caches(graph, 1)
    runs = {}
    for name in ("irc-ort", "irc"):
        path = os.path.join(work, name, "model.onnx")
        set_genai_threads(os.path.dirname(path), threads)
        engine = ort_engine(path, threads)
        runs[f"irc onnx{'-ort' if name == 'irc-ort' else ''} (ORT)"] = (ort_run, engine, caches)
    builder = os.path.join(work, "builder", "model.onnx")
    if os.path.exists(builder):
        set_genai_threads(os.path.dirname(builder), threads)
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

def median(values) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved latency rounds")
    parser.add_argument("--compile-rounds", type=int, default=3, help="interleaved compile rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="irc-onnx-bench-")
    os.makedirs(work, exist_ok=True)
    print(f"work directory: {work}")
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
