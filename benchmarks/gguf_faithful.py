"""A GGUF compiled as is, every block's values kept (the default, ``--gguf-weights blocks``),
against its lossy 4-bit form (``--gguf-weights blocks4``: Q5_0 / Q5_1 / Q5_K / Q6_K
re-expressed as 4-bit codes) and irc's own int4 of the same model. Prints one table per
model; asserts nothing.

Per model (``MODELS``: SmolLM2-135M-Instruct Q4_1, Qwen2.5-Coder-0.5B-Instruct Q4_K_M,
Gemma-3-270M Q4_K_M, prepared by ``real_model.py``, ``real_qwen_coder.py``, ``real_gemma3.py``):

- ``blocks``: ``irc compile FILE.gguf --target onnx-ort`` (what a user types; every compile
  here adds ``--logits all``, so one prefill scores every position);
- ``blocks4``: the same with ``--gguf-weights blocks4`` (the default before 2026-12-07);
- ``exact``: ``--gguf-weights exact`` (the file's codes at accuracy level 0, float
  activations): quality only unless ``--exact-speed`` (its 8-bit kernels dequantize the
  whole weight per call: seconds per token on a Q4_K_M file);
- ``irc int4``: ``irc compile HF --target onnx-ort --passes "lower-mlp,quantize{bits=4},dce"``
  on the Hugging Face folder dequantized from the same file.

Columns: the model's bytes on disk; top-1 agreement and perplexity over the first 512 tokens
of the seed text, every position of one prefill of the compiled ``model.onnx`` (ONNX Runtime,
2 threads), against the file's own values in float32 (``--gguf-weights float``: the numbers
transformers' GGUF loader computes); decode tok/s (1 / the median step of 64 new tokens after
a 128-token prompt, onnxruntime-genai's loop, ``--threads`` threads), medians over
``--rounds`` interleaved rounds (A B C A B C ...), each model loaded afresh, holding ``flock
/tmp/bench.lock`` while timing; the ratio to irc int4's median, and the per-round ratios
(min-max). The host's cores are shared with other jobs: compare ratios within one run.

    python benchmarks/gguf_faithful.py [--model smollm2 --model qwen-coder --model gemma3]
        [--rounds 3] [--threads 2] [--workdir DIR] [--no-speed] [--no-quality] [--exact-speed]
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import numpy as np

import gguf_speed
from common import NEW, PROMPT, ROOT, disk_bytes, median, timed_process
from gguf_speed import EVAL_TOKENS, INT4, measure, model_arguments, prompt_ids

MODELS = {**gguf_speed.MODELS,
          "gemma3": ("/work/cache/gemma3/gguf/gemma-3-270m-q4_k_m.gguf", "/work/cache/gemma3/hf-f32")}
SPEED_ROWS = ("blocks", "blocks4", "irc int4")


def compile_all(work: str, name: str, rows=("blocks", "blocks4", "exact", "float")) -> dict:
    """{row: folder} of the compiles that succeeded (module docstring): the GGUF ``rows``
    and irc int4."""
    gguf, hf = MODELS[name]
    irc = [sys.executable, "-m", "irc_cli", "compile"]
    jobs = {row: irc + [gguf, "--target", "onnx-ort", "--gguf-weights", row] for row in rows}
    if os.path.exists(os.path.join(hf, "config.json")):
        jobs["irc int4"] = irc + [hf, "--target", "onnx-ort", "--passes", INT4]
    else:
        print(f"  {name}: no {hf}: the irc int4 row is left out")
    folders = {}
    for row, argv in jobs.items():
        folder = os.path.join(work, name, row.replace(" ", "-"))
        if os.path.exists(os.path.join(folder, "genai_config.json")):  # a finished compile in --workdir
            folders[row] = folder
            continue
        seconds, note = timed_process(argv + ["--logits", "all", "-o", os.path.join(folder, "model.onnx"), "--quiet"],
                                      ROOT)  # every position: quality; a decode step is one position anyway
        print(f"  compiled {name} {row}: {seconds:.1f} s {note}", flush=True)
        if not note:
            folders[row] = folder
    return folders


def prefill_logits(folder: str, ids: list, threads: int) -> np.ndarray:
    """Every position's logits [T, V] of one prefill of ``folder``/model.onnx (empty caches)."""
    from common import cpu_session

    session = cpu_session(os.path.join(folder, "model.onnx"), threads)
    x = np.asarray([ids], np.int64)
    feeds = {}
    for spec in session.get_inputs():
        if spec.name == "input_ids":
            feeds[spec.name] = x
        elif spec.name == "attention_mask":
            feeds[spec.name] = np.ones_like(x)
        elif spec.name == "position_ids":
            feeds[spec.name] = np.arange(len(ids), dtype=np.int64)[None]
        else:  # an empty past: batch 1, every other symbolic axis 0
            shape = [1] + [d if isinstance(d, int) else 0 for d in spec.shape[1:]]
            feeds[spec.name] = np.zeros(shape, np.float16 if "float16" in spec.type else np.float32)
    out = session.run(["logits"], feeds)[0][0]
    del session
    return out.astype(np.float32)


def quality(folders: dict, ids: list, threads: int) -> dict:
    """{row: (top-1 agreement with the float row, perplexity)}; the float folder (gigabytes)
    is deleted after."""
    from irc.evaluate import next_token_nll, perplexity

    want = prefill_logits(folders["float"], ids, threads)
    found = {"float": (1.0, perplexity(next_token_nll(want, ids)))}
    for row, folder in folders.items():
        if row != "float":
            ours = prefill_logits(folder, ids, threads)
            found[row] = (float(np.mean(ours[:-1].argmax(-1) == want[:-1].argmax(-1))),
                          perplexity(next_token_nll(ours, ids)))
            print(f"  quality {row}: top-1 {found[row][0]:.1%}, perplexity {found[row][1]:.2f}", flush=True)
    shutil.rmtree(folders.pop("float"))
    return found


def speed(folders: dict, ids: list, rounds: int, threads: int, exact: bool = False) -> dict:
    """{row: (tok/s median, [per-round tok/s])} for ``SPEED_ROWS`` (and ``exact``: the exact
    row too), module docstring: ``gguf_speed.measure``'s interleaved rounds."""
    rows = {row: folders[row] for row in SPEED_ROWS + (("exact",) if exact else ()) if row in folders}
    timings = measure(rows, np.asarray([ids[:PROMPT]], np.int64), rounds, threads)
    return {row: (1 / median(steps), [1 / median(steps[i:i + NEW]) for i in range(0, len(steps), NEW)])
            for row, (_, steps) in timings.items()}


def report(name: str, sizes: dict, scores: dict, speeds: dict) -> None:
    print(f"\n{name}: {os.path.basename(MODELS[name][0])}; quality over {EVAL_TOKENS} tokens against the file's "
          f"values in float32; decode {NEW} tokens after {PROMPT}")
    header = ("weights", "MB on disk", "top-1 vs file", "perplexity", "decode tok/s", "vs irc int4", "rounds")
    rows = []
    base = speeds.get("irc int4")
    for row in ("float", "exact", "blocks", "blocks4", "irc int4"):
        if row not in sizes:
            continue
        top1, ppl = (f"{scores[row][0]:.1%}", f"{scores[row][1]:.2f}") if row in scores else ("-", "-")
        tok, ratio, spread = "-", "-", "-"
        if row in speeds:
            tok = f"{speeds[row][0]:.1f}"
            if base:
                paired = [a / b for a, b in zip(speeds[row][1], base[1])]
                ratio, spread = f"{speeds[row][0] / base[0]:.2f}", f"{min(paired):.2f}-{max(paired):.2f}"
        rows.append((row, f"{sizes[row] / 1e6:.1f}", top1, ppl, tok, ratio, spread))
    from common import text_table

    text_table(header, rows)


def main(argv=None) -> int:
    parser = model_arguments(__doc__, MODELS)
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--no-quality", action="store_true")
    parser.add_argument("--exact-speed", action="store_true", help="time the exact row's decode too (slow)")
    args = parser.parse_args(argv)
    work = args.workdir or tempfile.mkdtemp(prefix="gguf-faithful-")
    print(f"work dir {work}")
    for name in args.model or list(MODELS):
        if not os.path.exists(MODELS[name][0]):
            print(f"{name}: no {MODELS[name][0]}: skipped")
            continue
        ids = prompt_ids(MODELS[name][0])
        rows = ("blocks", "blocks4") + (("exact", "float") if not args.no_quality else
                                        ("exact",) if args.exact_speed else ())
        folders = compile_all(work, name, rows)
        sizes = {row: disk_bytes(folder) for row, folder in folders.items()}
        scores = {} if args.no_quality else quality(folders, ids, args.threads)
        speeds = {} if args.no_speed else speed(folders, ids, args.rounds, args.threads, args.exact_speed)
        report(name, sizes, scores, speeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
