"""Whole-process compile time of real checkpoints: ``irc compile`` against onnxruntime-genai's
builder, fp32 and int4, on SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct (the float32
Hugging Face folders ``real_model.py`` and ``real_qwen_coder.py`` prepare). Prints a table
and never asserts on time.

Rows, each a fresh process timed from start to exit (start-up and imports included):

- ``irc onnx-ort fp32`` / ``irc onnx fp32``: ``irc compile HF --target onnx-ort|onnx -o
  OUT/model.onnx`` (its report and summary line captured). onnx-ort is the builder's like:
  both write ONNX Runtime's ``com.microsoft`` ops (and it is the target the decode benchmarks
  run); onnx is the portable target, whose MatMuls need every linear weight transposed;
- ``irc onnx-ort int4`` / ``irc onnx int4``: the same with ``--quantize int4``;
- ``builder fp32`` / ``builder int4``: ``python -m onnxruntime_genai.models.builder -i HF -o OUT
  -p fp32|int4 -e cpu -c CACHE`` (as ``builder_compare.py`` and ``onnx_vs_peers.py`` call it);
- with ``--baseline DIR`` (another checkout of irc, e.g. ``git archive HEAD | tar -x -C DIR``),
  ``irc@base ...`` rows: the same commands run from that tree (``PYTHONPATH``),
  so an optimisation is measured against its parent in the same interleaved rounds.

Columns: the median wall seconds of each row (every run listed) and the builder's median over
it; then the median user CPU seconds (the process and all its threads, from ``getrusage``)
and the same ratio, then the median system seconds. User time is the work a tool does itself and
moves far less than wall time when other work shares the host's two cores. System time is the
kernel's page-cache copies and faults: on this VM it swings several-fold from run to run
(``cat`` of the same cached 2.5 GB file took 1.3 to 5.4 s of system time in a row), which is
most of the spread of a Qwen row's wall time.

Fairness: runs are interleaved (every tool once per round, each round starting one row later
and every other round reversed: A B C D, A D C B, C D A B, ...) and medians reported, since the
host's second core is noisy; every run writes into an empty folder
(removed again after the run, not timed: a Qwen row writes GBs) after ``os.sync()`` (not
timed), so no run pays for the dirty pages of the one before; the checkpoint is read just
before each run (not timed), so every run finds it in the page cache whatever the run before
it pushed out (a builder run holds GBs). Bytecode: every process runs
with ``PYTHONPYCACHEPREFIX`` set to a folder of this work directory and without
``PYTHONDONTWRITEBYTECODE``, and one untimed warm-up round writes the caches, so each tool
imports compiled modules as an installed package does (``--no-bytecode`` times them
compiling every module from source instead).

    python benchmarks/compile_time.py [--rounds 3] [--models smollm2,qwen-coder]
        [--smollm2 DIR] [--qwen-coder DIR] [--workdir DIR] [--baseline DIR] [--no-bytecode]
        [--precisions fp32,int4] [--targets onnx-ort,onnx]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = {"smollm2": "/work/cache/smollm2/hf-f32", "qwen-coder": "/work/cache/qwen-coder/hf-f32"}
PRECISIONS = ("fp32", "int4")
TARGETS = ("onnx-ort", "onnx")


def tools(hf: str, out: str, cache: str, baseline: str | None, precisions=PRECISIONS, targets=TARGETS) -> dict:
    """{row name: (argv, extra PYTHONPATH or None)}; each writes under ``out``/<row>."""
    rows = {}
    trees = [("irc", None)] + ([("irc@base", baseline)] if baseline else [])
    for bits in precisions:
        for label, tree in trees:
            for target in targets:
                name = f"{label} {target} {bits}"
                argv = [sys.executable, "-m", "irc_cli", "compile", hf, "--target", target,
                        "-o", os.path.join(out, name.replace(" ", "-"), "model.onnx")]
                rows[name] = (argv + (["--quantize", "int4"] if bits == "int4" else []), tree)
        rows[f"builder {bits}"] = ([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf, "-o",
                                    os.path.join(out, f"builder-{bits}"), "-p", bits, "-e", "cpu",
                                    "-c", cache], None)
    return rows


def environment(work: str, tree: str | None, bytecode: bool) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if bytecode:
        env["PYTHONPYCACHEPREFIX"] = os.path.join(work, "pycache")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONPYCACHEPREFIX"] = os.path.join(work, "no-pycache")  # empty: nothing cached is found
    if tree:
        env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_once(argv: list, env: dict, cwd: str) -> tuple[float, float, str]:
    """(wall seconds, (user, system) CPU seconds of all its threads, "") of one whole process
    writing into an empty folder (removed again after it), or (NaN, NaN, the last line of its
    stderr)."""
    target = argv[argv.index("-o") + 1]
    folder = os.path.dirname(target) if target.endswith(".onnx") else target
    shutil.rmtree(folder, ignore_errors=True)
    os.sync()
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime)
    shutil.rmtree(folder, ignore_errors=True)  # a few GB a row on Qwen: keep one output at a time
    if done.returncode:
        return float("nan"), (float("nan"), float("nan")), (done.stderr.strip().splitlines() or ["failed"])[-1][:120]
    return seconds, cpu, ""


def read_through(folder: str) -> None:
    """Read every file of ``folder`` once, so each timed run finds the checkpoint cached."""
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                while f.read(64 << 20):
                    pass


def measure(models: dict, rounds: int, work: str, baseline: str | None, bytecode: bool,
            precisions=PRECISIONS, targets=TARGETS) -> dict:
    """{(model, row): ([(wall, user, system) seconds per round], note)}; rounds interleave every model
    and row."""
    jobs = {}
    for model, hf in models.items():
        for row, (argv, tree) in tools(hf, os.path.join(work, model), os.path.join(work, model, "cache"),
                                       baseline, precisions, targets).items():
            jobs[(model, row)] = (argv, environment(work, tree, bytecode), tree or ROOT, hf)
    results = {key: ([], "") for key in jobs}
    for round_ in range(rounds + 1):  # round 0: the untimed warm-up (bytecode caches, first reads)
        keys = list(jobs)
        keys = keys[round_ % len(keys):] + keys[:round_ % len(keys)]  # each round starts one row later,
        for key in keys[::-1] if round_ % 2 else keys:  # every other one in reverse: new neighbours
            argv, env, cwd, hf = jobs[key]  # cwd: -m irc_cli finds the tree it runs in first
            read_through(hf)  # back in the page cache, whatever the run before pushed out (not timed)
            seconds, cpu, note = run_once(argv, env, cwd)
            print(f"  round {round_}{' (warm-up)' if round_ == 0 else ''} {key[0]:<11} {key[1]:<21} "
                  f"{seconds:7.2f} s wall {cpu[0]:7.2f} s user {cpu[1]:7.2f} s system {note}", file=sys.stderr,
                  flush=True)
            if round_:
                times, first = results[key]
                results[key] = (times + [(seconds, *cpu)], first or note)
            elif note:
                results[key] = ([], note)
    return results


def median(values: list) -> float:
    kept = [v for v in values if v == v]
    return statistics.median(kept) if kept else float("nan")


def table(results: dict, models: dict, rounds: int) -> list[str]:
    """Per row: median wall seconds (every run's), the builder's median over it; the same for
    user CPU seconds (what the process computed, all its threads), then its median system
    seconds (the kernel's: page-cache reads and writes, faults)."""
    lines = [f"whole-process compile time, median of {rounds} interleaved rounds (seconds)",
             f"{'model':<11} {'row':<21} {'wall':>6} {'runs':<22} {'builder/row':>11} {'user':>6} {'builder/row':>11}"
             f" {'system':>6}"]
    for model in models:
        for row in [row for m, row in results if m == model]:
            runs, note = results[(model, row)]
            builder = results.get((model, f"builder {row.split()[-1]}"), ([], ""))[0]
            wall, user, system = (median([r[i] for r in runs]) for i in range(3))
            ratios = ["", ""] if row.startswith("builder") else [
                f"{median([r[i] for r in builder]) / value:10.1f}x" for i, value in enumerate((wall, user))]
            lines.append(f"{model:<11} {row:<21} {wall:6.2f} {' '.join(f'{r[0]:.2f}' for r in runs):<22} "
                         f"{ratios[0]:>11} {user:6.2f} {ratios[1]:>11} {system:6.2f}{'  ' + note if note else ''}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default=",".join(FOLDERS), help="comma-separated: " + ", ".join(FOLDERS))
    parser.add_argument("--smollm2", default=FOLDERS["smollm2"], help="float32 HF folder (%(default)s)")
    parser.add_argument("--qwen-coder", default=FOLDERS["qwen-coder"], help="float32 HF folder (%(default)s)")
    parser.add_argument("--workdir", default=None, help="outputs and bytecode caches (default: a temporary folder)")
    parser.add_argument("--baseline", default=None, help="another irc checkout, timed beside this one")
    parser.add_argument("--no-bytecode", action="store_true", help="compile every module from source in each run")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated: fp32, int4")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated irc targets: onnx-ort, onnx")
    args = parser.parse_args()
    given = {"smollm2": args.smollm2, "qwen-coder": args.qwen_coder}
    models = {}
    for name in args.models.split(","):
        if name not in given:
            raise SystemExit(f"unknown model {name!r}: one of {', '.join(FOLDERS)}")
        if not os.path.isfile(os.path.join(given[name], "config.json")):
            raise SystemExit(f"{given[name]} holds no config.json: prepare it with benchmarks/"
                             f"{'real_model.py' if name == 'smollm2' else 'real_qwen_coder.py'}")
        models[name] = given[name]
    work = args.workdir or tempfile.mkdtemp(prefix="irc-compile-time-")
    os.makedirs(work, exist_ok=True)
    try:
        results = measure(models, args.rounds, work, args.baseline and os.path.abspath(args.baseline),
                          not args.no_bytecode, [p for p in args.precisions.split(",") if p in PRECISIONS],
                          [t for t in args.targets.split(",") if t in TARGETS])
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print("\n".join(table(results, models, args.rounds)))


if __name__ == "__main__":
    main()
