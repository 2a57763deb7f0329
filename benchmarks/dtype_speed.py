"""Which weight type makes the fastest exact CPU model of a bf16 checkpoint? Prints a table;
never asserts on time.

Compiles the real SmolLM2-135M bf16 folder (``benchmarks/real_model.py``) with
``--target onnx-ort`` four ways and times decoding in ONNX Runtime's CPU provider (2
threads), interleaved (A B C D A B C D ...), medians over ``--rounds``:

- ``f32``: ``--dtype f32`` (irc's ``auto`` on CPU): weights cast to f32 when written;
- ``bf16 weights, f32 math``: the graph as the checkpoint has it (no ``retype``): bf16
  initializers read through a ``Cast`` to f32 in the graph;
- ``f16``: ``--dtype f16``: f16 weights and activations, f32 math where ORT's CPU provider has
  no fp16 kernel (``backends.onnx.precision``);
- ``bf16``: ``--dtype bf16``, compiled only when ORT can load it (it has no bf16 kernels).

Per model: MB on disk, session creation ms, prefill ms (128 tokens), decode tokens/s (64 new
tokens), and the largest |logit| difference from the f32 model on the prefill.

    python benchmarks/dtype_speed.py [--folder /work/cache/smollm2/hf-bf16] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

from common import compile_graph, interleaved
from backends.onnx.runtime import left_padded  # noqa: E402
from frontends import load_spec  # noqa: E402

VARIANTS = {"f32": "retype{dtype=f32},dce,cse", "bf16 weights, f32 math": "dce,cse",
            "f16": "retype{dtype=f16},dce,cse", "bf16": "retype{dtype=bf16},dce,cse"}
PROMPT, NEW = 128, 64


def compile_variant(folder: str, pipeline: str, out: str) -> str:
    return compile_graph(load_spec(folder), os.path.join(out, "model.onnx"), pipeline, target="onnx-ort").path


def session(path: str, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    start = time.perf_counter()
    sess = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return sess, (time.perf_counter() - start) * 1000


def decode(sess, prompt: np.ndarray) -> tuple[float, float, np.ndarray]:
    """(prefill ms, decode tokens/s, prefill logits of the last position)."""
    names = [o.name for o in sess.get_outputs()]
    inputs = {i.name: i for i in sess.get_inputs()}
    cache_type = np.float16 if "float16" in inputs["past_key_values.0.key"].type else np.float32
    feeds = {**left_padded([list(prompt)]), **{k: v.astype(cache_type) for k, v in _caches(inputs).items()}}
    start = time.perf_counter()
    out = dict(zip(names, sess.run(None, feeds)))
    prefill = (time.perf_counter() - start) * 1000
    logits = out["logits"][0, -1].astype(np.float32)
    mask, position = feeds["attention_mask"], feeds["position_ids"][:, -1:]
    steps = []
    for _ in range(NEW):
        token = np.argmax(out["logits"][:, -1], axis=-1)[:, None].astype(np.int64)
        mask = np.concatenate([mask, np.ones((1, 1), np.int64)], axis=1)
        position = position + 1
        feeds = {"input_ids": token, "attention_mask": mask, "position_ids": position,
                 **{k.replace("present.", "past_key_values."): v for k, v in out.items() if k.startswith("present.")}}
        start = time.perf_counter()
        out = dict(zip(names, sess.run(None, feeds)))
        steps.append(time.perf_counter() - start)
    return prefill, 1.0 / float(np.median(steps)), logits


def _caches(inputs) -> dict:
    shapes = {name: [1 if d == "batch_size" else 0 if d == "past_sequence_length" else d for d in i.shape]
              for name, i in inputs.items() if name.startswith("past_key_values.")}
    return {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", default="/work/cache/smollm2/hf-bf16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="irc-dtype-")
    prompt = np.random.default_rng(0).integers(3, 1000, PROMPT)
    paths, rows = {}, {}
    for name, pipeline in VARIANTS.items():
        folder = os.path.join(work, name.replace(" ", "_").replace(",", ""))
        paths[name] = compile_variant(args.folder, pipeline, folder)
    sessions = {}
    for name, path in paths.items():
        try:
            sessions[name] = session(path, args.threads)
        except Exception as err:  # noqa: BLE001  (ORT refuses the model: say why in the table)
            rows[name] = {"note": str(err).splitlines()[0][:80]}
    results = interleaved({name: lambda sess=sess: decode(sess, prompt) for name, (sess, _) in sessions.items()},
                          args.rounds)
    reference = results["f32"][0][2] if "f32" in results else None
    print(f"{'model':<24} {'MB':>8} {'load ms':>8} {'prefill ms':>11} {'decode tok/s':>13} {'max|dlogit|':>12}")
    for name, path in paths.items():
        size = sum(os.path.getsize(os.path.join(os.path.dirname(path), f)) for f in os.listdir(os.path.dirname(path))
                   if f.startswith("model.onnx"))
        if name not in results:
            print(f"{name:<24} {size / 1e6:8.1f}  not run: {rows[name]['note']}")
            continue
        prefill = float(np.median([r[0] for r in results[name]]))
        speed = float(np.median([r[1] for r in results[name]]))
        diff = float(np.abs(results[name][0][2] - reference).max()) if reference is not None else float("nan")
        print(f"{name:<24} {size / 1e6:8.1f} {sessions[name][1]:8.0f} {prefill:11.1f} {speed:13.1f} {diff:12.2e}")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
