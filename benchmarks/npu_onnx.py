"""onnx-npu against Qualcomm's HTP compiler (onnxruntime-qnn): compile time, context-binary
size and placement counts per model, graph and SoC, and the quantized precisions' error
(no assertions; needs the ``npu`` extra).

Models: every ``examples/tiny-*.yaml`` (the hybrids with recurrent layers among them:
Mamba-2, gated DeltaNet, LFM2's short convs; tiny-jamba's Mamba-1 scan is reported as
refused) and the first two layers of a real SmolLM2-135M
(``--smollm2 DIR``, a Hugging Face folder, default ``/work/cache/smollm2/hf-bf16``;
skipped when absent). Each is compiled to an onnx-npu folder (fp16; ``--precisions``
adds w8a16 / w4a16, calibrated on a seed text or random ids), then both graphs (chunk and
decode) for soc_model 60 (Snapdragon X Elite) and 69 (8 Elite) with CPU fallback disabled.

Table 1, one row per model, precision, graph and SoC: whether it compiled, the seconds the
compile took (session creation, which compiles), the EPContext model's size (the context
binary embedded) and the nodes the log placed on the HTP / refused.

Table 2, one row per model and precision: the CPU provider's logits over a held-out text,
teacher-forced through the chunked prefill, against the reference interpreter's f32 graph:
max relative error and top-1 agreement.

Table 3: both graphs compiled into one weight-shared context (soc 69) against the sum of
the two separate contexts.

    python benchmarks/npu_onnx.py [--models tiny-llama3,smollm2-2l] [--precisions fp16,w8a16,w4a16]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time

import numpy as np

from common import ROOT

import passes  # noqa: E402,F401
from backends.onnx_npu import qnn  # noqa: E402
from backends.onnx_npu.emit import emit_folder  # noqa: E402
from backends.onnx_npu.host import prefill_logits  # noqa: E402
from backends.onnx_npu.targets import PIPELINE, prelude  # noqa: E402
from frontends import companion_files, load_spec  # noqa: E402
from irc.errors import BackendError  # noqa: E402
from irc.evaluate import StreamingInterpreter  # noqa: E402
from irc.evaluate import prefill_logits as reference_prefill  # noqa: E402
from irc.passmanager import PassManager, parse_pipeline  # noqa: E402
from irc.text import format_bytes  # noqa: E402
from irc.weights import seed_absent  # noqa: E402

SMOLLM2 = "/work/cache/smollm2/hf-bf16"
SEEDS = os.path.join(os.path.dirname(ROOT), "shared", "seeds")


def smollm2_slice(folder: str, scratch: str, layers: int = 2) -> str:
    """A Hugging Face folder whose config keeps the first ``layers`` layers (weights linked)."""
    out = os.path.join(scratch, f"smollm2-{layers}l")
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(folder):
        if name != "config.json":
            os.symlink(os.path.join(folder, name), os.path.join(out, name))
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    config["num_hidden_layers"] = layers
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    return out


def models(args, scratch: str) -> dict:
    found = {os.path.basename(p)[:-5]: p for p in sorted(glob.glob(os.path.join(ROOT, "examples", "tiny-*.yaml")))}
    if os.path.isdir(args.smollm2):
        found["smollm2-2l"] = smollm2_slice(args.smollm2, scratch)
    wanted = args.models.split(",") if args.models else list(found)
    return {name: found[name] for name in wanted if name in found}


def texts(spec: str, files: dict, vocab: int, scratch: str) -> tuple[str, list]:
    """(calibration file, held-out ids): a seed text under the spec's tokenizer, else random ids."""
    rng = np.random.default_rng(0)
    seeds = sorted(glob.glob(os.path.join(SEEDS, "*.txt")))
    if "tokenizer.json" in files and seeds:
        from tokenizers import Tokenizer

        source = files["tokenizer.json"]
        tokenizer = Tokenizer.from_str(source.decode()) if isinstance(source, bytes) else Tokenizer.from_file(source)
        ids = tokenizer.encode(open(seeds[0], encoding="utf-8").read()).ids
    else:
        ids = [int(t) for t in rng.integers(0, vocab, 400)]
    path = os.path.join(scratch, f"calibration-{os.path.basename(spec)}.txt")
    with open(path, "w") as f:
        f.write(" ".join(map(str, ids[:256])))
    return path, ids[256:320]


def compile_row(name, precision, role, soc, folder) -> dict:
    out = os.path.join(folder, f"{role}_{soc}_ctx.onnx")
    result = qnn.compile_htp(os.path.join(folder, f"{role}.onnx"), soc, out=out)
    row = {"model": name, "precision": precision, "graph": role, "soc": soc, "ok": result.ok,
           "seconds": result.seconds, "context_bytes": result.context_bytes, "htp": result.on_npu,
           "refused": result.on_cpu, "error": result.error}
    if os.path.exists(out):
        os.remove(out)
    return row


def shared_row(name, precision, folder, separate: list) -> dict:
    """Both graphs into one weight-shared context for soc 69, against the two separate ones."""
    out = os.path.join(folder, "shared")
    os.makedirs(out)
    qnn.compile_shared({role: os.path.join(folder, f"{role}.onnx") for role in ("chunk", "decode")}, 69, out)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    return {"model": name, "precision": precision, "shared_bytes": size,
            "separate_bytes": sum(r["context_bytes"] for r in separate)}


def run(args) -> tuple[list, list, list]:
    compiles, accuracy, shared = [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        for name, spec in models(args, scratch).items():
            files = companion_files(spec)[0]
            reference_graph = load_spec(spec)
            seed_absent(reference_graph, 0)
            vocab = int(reference_graph.meta["vocab_size"])
            calibration, held_out = texts(spec, files, vocab, scratch)
            reference = reference_prefill(StreamingInterpreter(reference_graph, 0), held_out)
            for precision in args.precisions.split(","):
                graph = load_spec(spec)
                seed_absent(graph, 0)
                options = {"precision": precision, "calibration": calibration if precision in ("w8a16", "w4a16")
                           else None}
                PassManager(parse_pipeline(f"{prelude(options)},{PIPELINE}")).run(graph)
                folder = os.path.join(scratch, f"{name}-{precision}")
                try:
                    emit_folder(graph, folder, chunk=args.chunk, context=args.context, precision=precision,
                                calibration=calibration, files=files)
                except BackendError as err:   # a recurrence onnx-npu does not lower (RWKV, RG-LRU)
                    print(f"{name:<20}{precision:<7}refused by onnx-npu: {err.message}", flush=True)
                    break
                for role in ("chunk", "decode"):
                    for soc in qnn.SOCS:
                        compiles.append(compile_row(name, precision, role, soc, folder))
                        print_row(compiles[-1])
                shared.append(shared_row(name, precision, folder, [r for r in compiles[-4:] if r["soc"] == 69]))
                got = prefill_logits(folder, held_out).astype(np.float32)
                accuracy.append({"model": name, "precision": precision, "tokens": len(held_out),
                                 "relative_error": float(np.abs(got - reference).max() / np.abs(reference).max()),
                                 "top1": float(np.mean(got.argmax(-1) == reference.argmax(-1)))})
    return compiles, accuracy, shared


def print_row(row: dict) -> None:
    status = "ok" if row["ok"] else "FAILED " + row["error"][:60]
    print(f"{row['model']:<20}{row['precision']:<7}{row['graph']:<8}{row['soc']:<5}{status:<8}"
          f"{row['seconds']:>8.2f}{format_bytes(row['context_bytes']):>12}{row['htp']:>7}{row['refused']:>8}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated (default: every tiny example and smollm2-2l)")
    parser.add_argument("--precisions", default="fp16,w8a16,w4a16")
    parser.add_argument("--smollm2", default=SMOLLM2, help="a SmolLM2 Hugging Face folder (sliced to 2 layers)")
    parser.add_argument("--chunk", type=int, default=32)
    parser.add_argument("--context", type=int, default=256)
    args = parser.parse_args()
    if not qnn.available():
        sys.exit("benchmarks/npu_onnx.py needs onnxruntime-qnn (pip install '.[npu]')")
    started = time.perf_counter()
    print(f"{'model':<20}{'prec':<7}{'graph':<8}{'soc':<5}{'':<8}{'compile s':>8}{'context':>12}{'HTP':>7}"
          f"{'refused':>8}")
    compiles, accuracy, shared = run(args)
    failed = [r for r in compiles if not r["ok"] or r["refused"]]
    print(f"\n{len(compiles) - len(failed)}/{len(compiles)} compiles entirely on the HTP "
          f"(chunk {args.chunk}, context {args.context}); {time.perf_counter() - started:.0f} s in all")
    print(f"\n{'model':<20}{'precision':<11}{'tokens':>7}{'max rel err':>13}{'top-1':>8}   (CPU provider vs "
          "the reference interpreter, teacher-forced)")
    for row in accuracy:
        print(f"{row['model']:<20}{row['precision']:<11}{row['tokens']:>7}{row['relative_error']:>13.4f}"
              f"{row['top1']:>8.3f}")
    print(f"\n{'model':<20}{'precision':<11}{'shared':>12}{'separate':>12}   (soc 69: chunk + decode in one "
          "weight-shared context vs two contexts)")
    for row in shared:
        print(f"{row['model']:<20}{row['precision']:<11}{format_bytes(row['shared_bytes']):>12}"
              f"{format_bytes(row['separate_bytes']):>12}")


if __name__ == "__main__":
    main()
