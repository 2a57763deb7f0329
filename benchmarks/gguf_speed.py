"""A GGUF compiled as is against irc's own int4 of the same model: decode speed, size and
what the GGUF's re-expression costs. Prints tables of measured medians; asserts nothing.

Per model (``MODELS``: SmolLM2-135M-Instruct Q4_1 with its Q8_0 tied table, from
``real_model.py``; Qwen2.5-Coder-0.5B-Instruct Q4_K_M, from ``real_qwen_coder.py``):

- ``gguf as is``: ``irc compile FILE.gguf --target onnx-ort`` (what a user types);
- ``gguf --gguf-weights int4``: the same with Q8_0 re-expressed as 4-bit codes too;
- ``irc int4``: ``irc compile HF --target onnx-ort --passes
  "lower-mlp,quantize{bits=4},dce"`` (quantize's defaults) on the Hugging Face
  folder dequantized from the same file;
- ``--extra MODEL:ROW=FOLDER``: any other compiled folder (an older build, a variant).

Decode tok/s (1 / the median step of 64 new tokens after a 128-token prompt) and prefill ms
through onnxruntime-genai's generate loop on ``--threads`` threads, medians over ``--rounds``
interleaved rounds (A B C ... A B C ...), each model loaded afresh and dropped after its run
(``common.GenaiStepper``), holding ``flock /tmp/bench.lock`` while timing (compiles and the
quality runs take no lock). Then ``--quality``: perplexity and top-1 agreement over the
first 512 tokens of the seed text for the GGUF as irc reads it now (in process, every
position's logits) against the file's own values in float32 (``weights="float"``, the
numbers transformers' GGUF loader computes), and per GGUF tensor kind the relative RMS error
of the weights the model holds against gguf's dequantization (0: exact).

    python benchmarks/gguf_speed.py [--model smollm2 --model qwen-coder]
        [--rounds 3] [--threads 2] [--workdir DIR] [--extra MODEL:ROW=FOLDER] [--quality] [--kernels]
        [--no-speed]

``--kernels`` first times MatMulNBits alone in each form a GGUF type can take (``KERNELS``).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

import numpy as np

from common import NEW, PROMPT, ROOT, GenaiStepper, disk_bytes, median, set_threads, timed_process, timed_rounds
from real_model import SEED_TEXT

MODELS = {
    "smollm2": ("/work/cache/smollm2/gguf/SmolLM2-135M-Instruct.Q4_1.gguf", "/work/cache/smollm2/hf-f32"),
    "qwen-coder": ("/work/cache/qwen-coder/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                   "/work/cache/qwen-coder/hf-f32"),
}
INT4 = "lower-mlp,quantize{bits=4},dce"
EVAL_TOKENS = 512
LOCK = "/tmp/bench.lock"


def build(work: str, name: str, extras: dict) -> dict:
    """{row: folder} for one model: the GGUF as is, irc's int4 of its HF folder, the extras."""
    gguf, hf = MODELS[name]
    irc = [sys.executable, "-m", "irc_cli", "compile"]
    jobs = {"gguf as is": irc + [gguf, "--target", "onnx-ort", "-o", os.path.join(work, name, "gguf", "model.onnx")],
            "gguf --gguf-weights int4": irc + [gguf, "--target", "onnx-ort", "--gguf-weights", "int4", "-o",
                                               os.path.join(work, name, "gguf-int4", "model.onnx")]}
    if os.path.exists(os.path.join(hf, "config.json")):
        jobs["irc int4"] = irc + [hf, "--target", "onnx-ort", "--passes", INT4, "-o",
                                      os.path.join(work, name, "int4", "model.onnx")]
    else:
        print(f"  {name}: no {hf}: the int4 row is left out (benchmarks/real_model.py / real_qwen_coder.py make it)")
    rows = {}
    for row, argv in jobs.items():
        seconds, note = timed_process(argv, ROOT)
        print(f"  compiled {name} {row}: {seconds:.1f} s {note}", flush=True)
        if not note:
            rows[row] = os.path.dirname(argv[-1])
    rows.update(extras)
    return rows


def measure(rows: dict, prompt: np.ndarray, rounds: int, threads: int) -> dict:
    """{row: (prefill seconds per round, decode step seconds)}, interleaved rounds, holding
    ``LOCK`` (one timing job at a time on a shared machine; compiles run outside it)."""
    import fcntl

    import onnxruntime_genai as og

    for folder in rows.values():
        set_threads(folder, threads)
    def open_stepper(row):
        model = og.Model(rows[row])
        return GenaiStepper(model), model

    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return timed_rounds(open_stepper, list(rows), prompt, rounds)


def prompt_ids(gguf: str) -> list:
    from frontends.gguf.reader import GGUFFile
    from frontends.gguf.tokenizer import build_tokenizer

    with open(SEED_TEXT, encoding="utf-8") as f:
        return build_tokenizer(GGUFFile.open(gguf))[0].encode(f.read()).ids[:EVAL_TOKENS]


def report_speed(name: str, rows: dict, timings: dict) -> None:
    """Median decode tok/s over all steps, and the spread: each round's median tok/s and its
    ratio to irc int4's in the same round (min-max over rounds)."""
    base = "irc int4" if "irc int4" in rows else None
    print(f"\n{name}: prefill {PROMPT} tokens, decode {NEW} through onnxruntime-genai")
    print(f"  {'model':<28} {'MB on disk':>10} {'prefill ms':>10} {'decode tok/s':>12} {'rounds min-max':>15} "
          f"{'vs int4':>8} {'rounds min-max':>15}")
    speed = {row: 1 / median(steps) for row, (_, steps) in timings.items()}
    per_round = {row: [1 / median(steps[i:i + NEW]) for i in range(0, len(steps), NEW)]
                 for row, (_, steps) in timings.items()}
    for row, folder in rows.items():
        spread = f"{min(per_round[row]):.1f}-{max(per_round[row]):.1f}"
        ratio, ratios = f"{'-':>8}", "-"
        if base:
            paired = [a / b for a, b in zip(per_round[row], per_round[base])]
            ratio, ratios = f"{speed[row] / speed[base]:8.2f}", f"{min(paired):.2f}-{max(paired):.2f}"
        print(f"  {row:<28} {disk_bytes(folder) / 1e6:10.1f} {median(timings[row][0]) * 1000:10.1f} "
              f"{speed[row]:12.1f} {spread:>15} {ratio} {ratios:>15}")


def full_logits(graph, ids: list, path: str) -> np.ndarray:
    from backends.onnx import emit, runtime

    emit.emit_model(graph, path, target="onnx-ort", genai=False)
    x = np.asarray([ids], np.int64)
    feeds = {"input_ids": x, "attention_mask": np.ones_like(x), "position_ids": np.arange(len(ids))[None],
             **runtime.empty_caches(graph, 1)}
    return runtime.ort_engine(path)(feeds)["logits"][0]


@contextlib.contextmanager
def requantizing(types: tuple):
    """``frontends.gguf.forms.REQUANTIZED`` set to ``types`` while building a variant."""
    from frontends.gguf import forms

    saved, forms.REQUANTIZED = forms.REQUANTIZED, types
    try:
        yield
    finally:
        forms.REQUANTIZED = saved


def variants(gguf) -> dict:
    """{label: graph} of the forms compared (the default first)."""
    from gguf import GGMLQuantizationType as T

    from frontends.gguf import build as build_graph

    from frontends.gguf import forms

    found = {"default (frontends.gguf.forms)": build_graph(gguf)}
    types = {entry.ggml_type for entry in gguf.tensors.values()}
    if T.Q8_0 in types:
        if T.Q8_0 in forms.REQUANTIZED:
            with requantizing(tuple(t for t in forms.REQUANTIZED if t != T.Q8_0)):
                found["Q8_0 kept as 8-bit codes"] = build_graph(gguf)
        else:
            with requantizing(forms.REQUANTIZED + (T.Q8_0,)):
                found["Q8_0 as 4-bit codes (requantized)"] = build_graph(gguf)
    exact = build_graph(gguf, weights="exact")
    found["file's codes, level 0 (weights=exact)"] = exact
    level4 = build_graph(gguf, weights="exact")
    for node in level4.nodes:
        if "accuracy_level" in node.attrs:
            node.attrs["accuracy_level"] = 4
    found["file's codes, level 4"] = level4
    return found


def report_quality(name: str, ids: list, work: str) -> None:
    """Perplexity / top-1 of each form against the file's float32 values, and the default's
    per-kind weight error (module docstring)."""
    from frontends.gguf import build as build_graph
    from frontends.gguf.reader import GGUFFile
    from irc.evaluate import next_token_nll, perplexity

    gguf = GGUFFile.open(MODELS[name][0])
    folder = os.path.join(work, name, "quality")
    exact = full_logits(build_graph(gguf, weights="float"), ids, os.path.join(folder, "float", "model.onnx"))
    print(f"\n{name}: {len(ids)} tokens of {os.path.basename(SEED_TEXT)}, onnx-ort in process, every position")
    print(f"  {'weights':<40} {'perplexity':>10} {'top-1 vs float':>14}")
    print(f"  {'the file in float32 (weights=float)':<40} {perplexity(next_token_nll(exact, ids)):10.3f} {'-':>14}")
    graphs = variants(gguf)
    for index, (label, graph) in enumerate(graphs.items()):
        ours = full_logits(graph, ids, os.path.join(folder, f"v{index}", "model.onnx"))
        agree = float(np.mean(ours[:-1].argmax(-1) == exact[:-1].argmax(-1)))
        print(f"  {label:<40} {perplexity(next_token_nll(ours, ids)):10.3f} {agree:14.1%}", flush=True)
    graph = next(iter(graphs.values()))
    print("  notes (default): " + "\n                   ".join(graph.meta["gguf"]["notes"]))
    print(f"  {'kind':<6} {'tensors':>7} {'rel. RMS error':>15} {'max |error| / RMS':>18}")
    for kind, (count, rel, worst) in sorted(weight_errors(gguf, graph).items()):
        print(f"  {kind:<6} {count:>7} {rel:15.2e} {worst:18.2e}")


def weight_errors(gguf, graph) -> dict:
    """{ggml kind: (tensors, relative RMS error, max |error| / RMS of the weight)} of each
    block-kept tensor's dequantized parts against gguf's own dequantization."""
    from frontends.gguf.tensors import BlockData
    from irc.ops.quant import dequantize_blocks

    parts: dict = {}
    for param in graph.params.values():
        if isinstance(param.data, BlockData):
            parts.setdefault(param.data.source, {})[param.data.part] = param
    stats: dict = {}
    for source, found in parts.items():
        arrays = [found[i].array() if i in found else None for i in range(3)]
        node = next(iter(found[0].uses))
        a = node.attrs
        ours = dequantize_blocks(arrays[0], arrays[1], arrays[2], bits=a["bits"], block_size=a["block_size"], k=a["K"])
        want = source.read_float(gguf)
        error, scale = ours - want, float(np.sqrt(np.mean(want.astype(np.float64) ** 2))) or 1.0
        count, total, worst = stats.get(gguf.tensor(source.name).type_name, (0, 0.0, 0.0))
        stats[gguf.tensor(source.name).type_name] = (count + 1, total + float(np.mean(error.astype(np.float64) ** 2)) /
                                                     scale ** 2, max(worst, float(np.abs(error).max()) / scale))
    return {kind: (count, float(np.sqrt(total / count)), worst) for kind, (count, total, worst) in stats.items()}


KERNELS = [  # (bits, block, accuracy level, zero points): MatMulNBits forms a GGUF type can take
    (4, 32, 0, None), (4, 32, 4, None), (4, 32, 4, "u8"), (4, 32, 0, "float"), (4, 32, 4, "float"),
    (4, 16, 4, None), (8, 32, 0, None), (8, 32, 4, None), (8, 16, 4, None), (8, 32, 4, "u8")]


def kernel_model(n: int, k: int, bits: int, block: int, level: int, zero):
    """One MatMulNBits x [T, K] @ W.T with random codes in the given form."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nb = k // block
    arrays = {"q": rng.integers(0, 256, (n, nb, block * bits // 8), dtype=np.uint8),
              "s": (rng.random((n, nb)) * 0.01).astype(np.float32)}
    if zero == "u8":
        arrays["z"] = rng.integers(0, 256, (n, -(-nb * bits // 8)), dtype=np.uint8)
    elif zero == "float":
        arrays["z"] = (rng.random((n, nb)) * 15).astype(np.float32)
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block, **({"accuracy_level": level} if level else {})}
    node = helper.make_node("MatMulNBits", ["x", *arrays], ["y"], domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", n])],
                              [numpy_helper.from_array(a, name) for name, a in arrays.items()])
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def report_kernels(threads: int, shapes=((4864, 896), (896, 4864), (151936, 896))) -> None:
    """Median ms of one token through each MatMulNBits form (``KERNELS``), holding ``LOCK``."""
    import fcntl

    import onnxruntime as ort

    print(f"\nMatMulNBits, one token, {threads} threads, median ms of 100 runs (5 where a run takes > 10 ms)")
    print(f"  {'N x K':<12} {'bits':>4} {'block':>5} {'level':>5} {'zero points':>11} {'ms':>8}")
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for n, k in shapes:
            for bits, block, level, zero in KERNELS:
                options = ort.SessionOptions()
                options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
                session = ort.InferenceSession(kernel_model(n, k, bits, block, level, zero).SerializeToString(),
                                               options, providers=["CPUExecutionProvider"])
                x = {"x": np.random.default_rng(1).standard_normal((1, k)).astype(np.float32)}
                start = time.perf_counter()
                for _ in range(3):
                    session.run(None, x)
                slow = time.perf_counter() - start > 0.03  # the forms that dequantize per call: fewer runs
                times = []
                for _ in range(5 if slow else 100):
                    start = time.perf_counter()
                    session.run(None, x)
                    times.append(time.perf_counter() - start)
                print(f"  {f'{n}x{k}':<12} {bits:>4} {block:>5} {level:>5} {zero or '-':>11} "
                      f"{median(times) * 1000:8.3f}", flush=True)
                del session


def extra_rows(items: list) -> list:
    """``MODEL:ROW=FOLDER`` options -> [(model, row, folder)]."""
    rows = []
    for item in items:
        model, _, rest = item.partition(":")
        row, _, folder = rest.partition("=")
        if model not in MODELS or not row or not folder:
            raise SystemExit(f"--extra {item!r}: expected MODEL:ROW=FOLDER with MODEL one of {', '.join(MODELS)}")
        rows.append((model, row, folder))
    return rows


def model_arguments(description: str, models: dict) -> argparse.ArgumentParser:
    """The options every GGUF benchmark takes: ``--model`` (of ``models``), ``--rounds``,
    ``--threads``, ``--workdir``."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument("--model", action="append", choices=sorted(models))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    return parser


def main(argv=None) -> int:
    parser = model_arguments(__doc__, MODELS)
    parser.add_argument("--extra", action="append", default=[], help="MODEL:ROW=FOLDER, another compiled folder")
    parser.add_argument("--quality", action="store_true")
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--kernels", action="store_true", help="time MatMulNBits' forms alone first")
    args = parser.parse_args(argv)
    work = args.workdir or tempfile.mkdtemp(prefix="gguf-speed-")
    print(f"work dir {work}")
    if args.kernels:
        report_kernels(args.threads)
    for name in (args.model or ["smollm2", "qwen-coder"]):
        ids = prompt_ids(MODELS[name][0])
        if not args.no_speed:
            extras = {row: folder for model, row, folder in extra_rows(args.extra) if model == name}
            rows = build(work, name, extras)
            report_speed(name, rows, measure(rows, np.asarray([ids[:PROMPT]], np.int64), args.rounds, args.threads))
        if args.quality:
            report_quality(name, ids, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
