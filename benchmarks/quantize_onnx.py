"""int4 ONNX models of the "small" Llama (``common.SMALL``): irc's against
onnxruntime-genai's builder. Prints tables and never asserts on time.

- whole-process compile time (one run each) of
  ``irc compile HF --target onnx-ort --passes "lower-mlp,quantize{bits=4,group=32},dce"``
  (MatMulNBits), the same with ``--target onnx`` (DequantizeLinear + MatMul, which ORT fuses
  into MatMulNBits at load), the same onnx-ort with ``embeddings=true`` (the table and the LM
  head in int4 too), and ``python -m onnxruntime_genai.models.builder -p int4 -e cpu`` (its
  defaults: RTN, block 32, symmetric, ``accuracy_level`` 4 on CPU, LM head quantized,
  embedding table float); plus the fp32 models of both tools for the size ratio;
- per model: bytes on disk (model.onnx + external data), ratio to the same tool's fp32
  model, prefill ms of a 128-token prompt (median of interleaved rounds), decode tokens/s
  (64 new tokens, 1 / the median step time over all rounds), 2 threads, all driven by
  ``common.ort_run``; the prefill logits' relative error against the fp32
  transformers model, and top-1 agreement over the 64 decoded positions with the
  reference's greedy tokens fed back (teacher-forced, through the KV cache).

MatMulNBits' activation precision: the builder writes ``accuracy_level=4`` (int8
activations) into its nodes; irc's MatMulNBits carry no attribute (0: float). The session
option ``session.qdq_matmulnbits_accuracy_level`` only reaches MatMulNBits that ORT fuses
from DequantizeLinear -> MatMul (irc's ``--target onnx``). So the table has irc's models
both ways: as emitted / with the option "0" (what ``backends.onnx.runtime.ort_engine``
sets), and with level 4 (onnx-ort: a copy of model.onnx with ``accuracy_level=4`` set on
each MatMulNBits, same weights file; onnx: the option "4"), the like-for-like speed row.

    python benchmarks/quantize_onnx.py [--rounds 5] [--threads 2] [--workdir DIR]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from common import (NEW, PROMPT, ROOT, SMALL, cpu_session, disk_bytes, interleaved, make_hf_folder, median, ort_run,
                    timed_process, work_folder)
from backends.onnx.runtime import empty_caches  # noqa: E402
from frontends import load_spec  # noqa: E402
from irc.check import relative_error  # noqa: E402

PASSES = "lower-mlp,quantize{bits=4,group=32,embeddings=false},dce"  # the layers' weights only
PASSES_EMB = "lower-mlp,quantize{bits=4,group=32,embeddings=true},dce"  # irc's default: table and head too
PASSES_HEAD = ("lower-mlp,quantize{bits=4,group=32,embeddings=false,lm_head=true},dce")  # the builder's choice: head
# int4, table float


def engine(path: str, threads: int, qdq_level: str | None):
    """An ORT CPU session as an engine; ``qdq_level`` sets
    ``session.qdq_matmulnbits_accuracy_level`` (None: ORT's default)."""
    config = {} if qdq_level is None else {"session.qdq_matmulnbits_accuracy_level": qdq_level}
    session = cpu_session(path, threads, config)
    names = [o.name for o in session.get_outputs()]
    inputs = {i.name for i in session.get_inputs()}
    return lambda feeds: dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in inputs})))


def op_summary(path: str) -> str:
    import collections

    import onnx

    model = onnx.load(path, load_external_data=False)
    ops = collections.Counter(n.op_type for n in model.graph.node)
    levels = collections.Counter(next((a.i for a in n.attribute if a.name == "accuracy_level"), 0)
                                 for n in model.graph.node if n.op_type == "MatMulNBits")
    parts = [f"{op} {ops[op]}" for op in ("MatMulNBits", "DequantizeLinear", "MatMul", "Gather",
                                           "GatherBlockQuantized") if ops[op]]
    if levels:
        parts.append("accuracy_level " + ",".join(f"{k}x{v}" for k, v in sorted(levels.items())))
    return ", ".join(parts)


def with_accuracy_level(path: str, level: int) -> str:
    """A copy of model.onnx (same directory, same external data file) with ``accuracy_level``
    set on every MatMulNBits."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for a in list(node.attribute):
                if a.name == "accuracy_level":
                    node.attribute.remove(a)
            node.attribute.append(onnx.helper.make_attribute("accuracy_level", level))
    out = os.path.join(os.path.dirname(path), f"model-acc{level}.onnx")
    onnx.save(model, out)
    return out


def forced(run, caches: dict, prompt: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Argmax of each decode step with ``tokens`` fed back (teacher forcing): [len(tokens)]
    predictions for the positions after the prompt and each fed token but the last."""
    out = run({"input_ids": prompt, "attention_mask": np.ones_like(prompt), **caches,
               "position_ids": np.arange(prompt.shape[1], dtype=np.int64)[None]})
    total, picks = prompt.shape[1], [int(np.argmax(out["logits"][0, -1]))]
    for token in tokens[:-1]:
        total += 1
        out = run({"input_ids": np.array([[token]], np.int64), "attention_mask": np.ones((1, total), np.int64),
                   "position_ids": np.array([[total - 1]], np.int64),
                   **{k: out["present." + k[len("past_key_values."):]] for k in caches}})
        picks.append(int(np.argmax(out["logits"][0, -1])))
    return np.array(picks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved latency rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    work = work_folder(args.workdir, "irc-quant-onnx-")
    hf = os.path.join(work, "hf")
    model = make_hf_folder(hf)

    irc = [sys.executable, "-m", "irc_cli", "compile", hf, "--logits", "all"]  # every position, as the builder's
    builder = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf, "-e", "cpu",
               "-c", os.path.join(work, "builder-cache")]
    jobs = {  # directory: argv
        "irc-fp32": irc + ["--target", "onnx-ort"],
        "irc-ort-int4": irc + ["--target", "onnx-ort", "--passes", PASSES],
        "irc-qdq-int4": irc + ["--target", "onnx", "--passes", PASSES],
        "irc-ort-int4-emb": irc + ["--target", "onnx-ort", "--passes", PASSES_EMB],
        "irc-ort-int4-head": irc + ["--target", "onnx-ort", "--passes", PASSES_HEAD],
        "builder-fp32": builder + ["-p", "fp32"],
        "builder-int4": builder + ["-p", "int4"],
    }
    print("\nwhole-process compile time (one run each)")
    built = {}
    for name, argv in jobs.items():
        out = os.path.join(work, name)
        os.makedirs(out, exist_ok=True)  # irc compile does not create the -o directory
        argv = argv + (["-o", os.path.join(out, "model.onnx")] if argv[2] == "irc_cli" else ["-o", out])
        seconds, note = timed_process(argv, ROOT)
        ok = os.path.exists(os.path.join(out, "model.onnx")) and not note
        built[name] = ok
        summary = op_summary(os.path.join(out, "model.onnx")) if ok else ""
        print(f"  {name:<18} {seconds:7.2f} s  {summary}" + ("" if ok else f"  FAILED: {note}"))
    if built["irc-ort-int4"]:
        summary = op_summary(os.path.join(work, "irc-ort-int4", "model.onnx"))
        print(f"  check: irc onnx-ort int4 has MatMulNBits: {'MatMulNBits' in summary}")
    if built["irc-qdq-int4"]:
        summary = op_summary(os.path.join(work, "irc-qdq-int4", "model.onnx"))
        print(f"  check: irc onnx int4 has DequantizeLinear: {'DequantizeLinear' in summary}")

    # the fp32 reference: greedy tokens, then the logits of prompt + tokens in one forward
    import torch

    torch.set_num_threads(args.threads)
    prompt = np.random.default_rng(0).integers(3, SMALL["vocab_size"], size=(1, PROMPT)).astype(np.int64)
    with torch.inference_mode():
        generated = model.generate(torch.from_numpy(prompt), attention_mask=torch.ones(1, PROMPT, dtype=torch.long),
                                   max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW,
                                   pad_token_id=0).numpy()
        reference_tokens = generated[0, PROMPT:PROMPT + NEW]
        reference_logits = model(torch.from_numpy(prompt)).logits.numpy()

    graph = load_spec(hf)
    caches = empty_caches(graph, 1)
    d = lambda name: os.path.join(work, name)  # noqa: E731
    rows = []  # (label, directory, model path, qdq option, accuracy note)
    if built["irc-fp32"]:
        rows.append(("irc onnx-ort fp32", d("irc-fp32"), os.path.join(d("irc-fp32"), "model.onnx"), None, "-"))
    if built["builder-fp32"]:
        rows.append(("builder fp32", d("builder-fp32"), os.path.join(d("builder-fp32"), "model.onnx"), None, "-"))
    if built["irc-ort-int4"]:
        path = os.path.join(d("irc-ort-int4"), "model.onnx")
        rows.append(("irc onnx-ort int4", d("irc-ort-int4"), path, "0", "attr unset (0, fp32)"))
        rows.append(("irc onnx-ort int4 acc4*", d("irc-ort-int4"), with_accuracy_level(path, 4), None,
                     "attr 4 (int8), patched"))
    if built["irc-qdq-int4"]:
        path = os.path.join(d("irc-qdq-int4"), "model.onnx")
        rows.append(("irc onnx int4 (QDQ)", d("irc-qdq-int4"), path, "0", "option \"0\" (fp32)"))
        rows.append(("irc onnx int4 (QDQ) acc4", d("irc-qdq-int4"), path, "4", "option \"4\" (int8)"))
    if built["irc-ort-int4-head"]:
        path = os.path.join(d("irc-ort-int4-head"), "model.onnx")
        rows.append(("irc onnx-ort int4 head", d("irc-ort-int4-head"), path, "0", "attr unset (0, fp32)"))
        rows.append(("irc onnx-ort int4 head acc4*", d("irc-ort-int4-head"), with_accuracy_level(path, 4), None,
                     "attr 4 (int8), patched"))
    if built["irc-ort-int4-emb"]:
        rows.append(("irc onnx-ort int4 emb", d("irc-ort-int4-emb"), os.path.join(d("irc-ort-int4-emb"), "model.onnx"),
                     "0", "attr unset (0, fp32)"))
    if built["builder-int4"]:
        rows.append(("builder int4", d("builder-int4"), os.path.join(d("builder-int4"), "model.onnx"), None,
                     "attr 4 (int8), as shipped; option unset"))

    engines, failures = {}, {}
    for label, _, path, level, _ in rows:
        try:
            engines[label] = engine(path, args.threads, level)
        except Exception as error:  # noqa: BLE001 - a table row, not a crash
            failures[label] = str(error).splitlines()[0][:100]
    quality = {}
    for label, run in engines.items():
        _, _, logits = ort_run(run, caches, prompt, 0)
        picks = forced(run, caches, prompt, reference_tokens)
        quality[label] = (relative_error(logits.reshape(reference_logits.shape), reference_logits),
                          float(np.mean(picks == reference_tokens)))
    for run in engines.values():  # warm-up
        ort_run(run, caches, prompt, 4)
    runs = interleaved({label: lambda run=run: ort_run(run, caches, prompt, NEW)[:2] for label, run in engines.items()},
                       args.rounds)
    timings = {label: ([prefill for prefill, _ in done], [s for _, steps in done for s in steps])
               for label, done in runs.items()}

    fp32 = {"irc": disk_bytes(d("irc-fp32")) if built["irc-fp32"] else float("nan"),
            "builder": disk_bytes(d("builder-fp32")) if built["builder-fp32"] else float("nan")}
    print(f"\nsmall Llama (d 512, 8 layers, vocab 32000), ORT CPU, {args.threads} threads; prefill of {PROMPT} "
          f"tokens (median of {args.rounds} interleaved rounds), decode of {NEW} tokens (1 / median step); "
          f"logits err: prefill logits vs fp32 transformers (relative); top-1: teacher-forced agreement over "
          f"the {NEW} decoded positions with transformers' greedy tokens")
    print(f"  {'model':<26} {'bytes on disk':>13} {'of fp32':>7} {'prefill ms':>10} {'decode tok/s':>12} "
          f"{'logits err':>10} {'top-1':>6}  MatMulNBits accuracy")
    for label, directory, _, _, note in rows:
        size = disk_bytes(directory)
        ratio = size / fp32["builder" if label.startswith("builder") else "irc"]
        if label in failures:
            print(f"  {label:<26} {size:>13,} {ratio:>7.1%}  FAILED: {failures[label]}")
            continue
        prefill, steps = timings[label]
        error, top1 = quality[label]
        print(f"  {label:<26} {size:>13,} {ratio:>7.1%} {median(prefill) * 1000:10.1f} {1 / median(steps):12.1f} "
              f"{error:10.1e} {top1:6.1%}  {note}")
    print("  * a copy of irc's model.onnx with accuracy_level=4 set by this script (not irc's output), same weights;"
          " the fair speed row against the builder's. 'emb': quantize{embeddings=true} (table and LM head int4).")
    print("  of fp32: against the same tool's fp32 model (irc onnx-ort fp32, builder -p fp32).")


if __name__ == "__main__":
    main()
