"""Compiling a Llama-3-8B-shaped bf16 checkpoint in bounded memory: irc against the
read+write floor and onnxruntime-genai's builder. Prints tables; never asserts on time.

The checkpoint (``write_checkpoint``): ``examples/hf/llama3-8b/config.json`` (with
``num_hidden_layers`` = ``--layers``), weights in bf16 split into 4 shards
(``model-0000N-of-00004.safetensors``) with ``model.safetensors.index.json``, and a
word-level ``tokenizer.json`` of the model's vocabulary (the builder needs one; genai runs
with it). It is written streaming, a few MB at a time, from a seeded pool of N(0, 0.02)
bf16 values read at random offsets (random enough for quantization and compile costs; the
pool is the only random draw, so generation runs at disk speed), into ``DIR.tmp`` and
renamed, so an existing ``DIR`` is always complete and is reused. 32 layers live in
``--dir``, other counts in ``DIR-<L>l``.

Each compile runs as its own process; the table gives wall time, peak RSS (``wait4``'s
``ru_maxrss`` of the process, and the sampled RSS of its whole tree every 0.1 s) and the
bytes written, and the output is deleted at once (the disk is shared; a compile whose
checkpoint plus output would pass ``--disk-budget-gb`` is not run):

- ``int4``:  ``irc compile DIR --target onnx-ort --passes "quantize{bits=4}"``: the pass's
  defaults, the builder's scheme by the compiled kernel (``method=ort``, block 32), every
  weight including the embedding table and the head;
- ``int4-rtn``: ``--passes "quantize{bits=4,method=rtn}"``, irc's NumPy round-to-nearest;
- ``f16``:   ``irc compile DIR --target onnx-ort --dtype f16``;
- ``f32``:   ``irc compile DIR --target onnx-ort --dtype f32``;
- ``floor (X)``: after compile X, read every shard (one reused 64 MiB buffer) and write as
  many bytes as X wrote: the least a compile that reads the checkpoint once must do. Compile
  and floor alternate ``--repeat`` times (each sees the page cache the other left); the
  table has medians and the largest peaks;
- ``builder``: ``python -m onnxruntime_genai.models.builder -i DIR -p int4 -e cpu``, under a
  memory cap (``--cap-gb``, default 10): a watchdog kills its process tree when the tree's
  RSS passes the cap, and the table says it was stopped and at what RSS.

``--genai-check`` compiles a narrow 2-layer variant (``NARROW``: d 1024, vocab 16384; the
reference interpreter holds every weight in f32, 16 GB for the 8B-wide 2-layer variant) to
int4 with exact float math and holds onnxruntime-genai's logits against the reference
interpreter's on the same quantized graph. ``--real HF_FOLDER`` times whole-process fp32
compiles of a real folder, irc and the builder interleaved (medians, ratio).

    python benchmarks/big_checkpoint.py --layers 2,32 [--runs int4,int4-rtn,floor,f16,f32,builder]
        [--dir /work/cache/big-llama3-8b] [--work DIR] [--cap-gb 10] [--disk-budget-gb 40]
        [--genai-check] [--real /work/cache/smollm2/hf-f32 --rounds 3]
    python benchmarks/big_checkpoint.py --generate-only --layers 2
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

import numpy as np

from common import ROOT, write_tokenizer

CONFIG = os.path.join(ROOT, "examples", "hf", "llama3-8b", "config.json")
SHARDS = 4
POOL = 1 << 24          # bf16 values in the random pool (32 MiB)
CHUNK = 1 << 22         # values written per write call
DTYPE_SIZE = 2          # bf16


def tensor_list(config: dict) -> list[tuple[str, tuple]]:
    """(name, shape) of every tensor of a Llama checkpoint, in the order HF saves them."""
    d, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = d // heads
    tensors = [("model.embed_tokens.weight", (v, d))]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors += [(p + "input_layernorm.weight", (d,)), (p + "mlp.down_proj.weight", (d, f)),
                    (p + "mlp.gate_proj.weight", (f, d)), (p + "mlp.up_proj.weight", (f, d)),
                    (p + "post_attention_layernorm.weight", (d,)),
                    (p + "self_attn.k_proj.weight", (kv * hd, d)), (p + "self_attn.o_proj.weight", (d, d)),
                    (p + "self_attn.q_proj.weight", (d, d)), (p + "self_attn.v_proj.weight", (kv * hd, d))]
    tensors += [("model.norm.weight", (d,)), ("lm_head.weight", (v, d))]
    return tensors


def split_shards(tensors: list, shards: int) -> list[list]:
    """Consecutive groups of about equal bytes (a tensor goes where its middle falls)."""
    total = sum(int(np.prod(s)) for _, s in tensors)
    groups, done = [[] for _ in range(shards)], 0
    for name, shape in tensors:
        size = int(np.prod(shape))
        groups[min(shards - 1, (2 * done + size) * shards // (2 * total))].append((name, shape))
        done += size
    return [g for g in groups if g]


def _write_shard(path: str, tensors: list, pool: np.ndarray, rng: np.random.Generator) -> int:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        size = int(np.prod(shape)) * DTYPE_SIZE
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for name, shape in tensors:
            count = int(np.prod(shape))
            if name.endswith("norm.weight"):
                f.write(np.full(count, 0x3F80, "<u2").tobytes())  # bf16 1.0
                continue
            while count:
                n = min(count, CHUNK)
                start = int(rng.integers(0, POOL))
                f.write(memoryview(pool[start:start + n]))
                count -= n
    return offset


def write_checkpoint(folder: str, layers: int, seed: int = 0, overrides: Optional[dict] = None) -> str:
    """The checkpoint of the module docstring under ``folder`` (kept when it exists);
    ``overrides`` change config.json keys (a narrower model)."""
    if os.path.exists(os.path.join(folder, "model.safetensors.index.json")):
        return folder
    import ml_dtypes

    with open(CONFIG) as f:
        config = json.load(f)
    config.update(overrides or {}, num_hidden_layers=layers)
    tmp = folder.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(POOL, np.float32) * 0.02).astype(ml_dtypes.bfloat16).view(np.uint16)
    pool = np.concatenate([pool, pool[:CHUNK]])  # any window of CHUNK values is contiguous
    groups = split_shards(tensor_list(config), SHARDS)
    weight_map, total = {}, 0
    for i, group in enumerate(groups, 1):
        name = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        total += _write_shard(os.path.join(tmp, name), group, pool, rng)
        weight_map.update({t: name for t, _ in group})
    with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    write_tokenizer(tmp, config["vocab_size"])
    os.replace(tmp, folder)
    return folder


# ---- measuring ------------------------------------------------------------------------------

class Run:
    """One measured process: wall seconds, peak RSS (``wait4``'s ``ru_maxrss`` of the
    process and the sampled RSS of its whole tree), exit code, and whether the memory cap
    stopped it."""

    def __init__(self, argv: list, cap_bytes: int = 0, interval: float = 0.1):
        self.argv, self.cap, self.interval = argv, cap_bytes, interval
        self.seconds = self.maxrss = self.tree_peak = 0.0
        self.returncode, self.stopped, self.tail = None, False, ""

    def run(self) -> "Run":
        log = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".big_checkpoint.log"), "w+")
        start = time.perf_counter()
        process = subprocess.Popen(self.argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        done = threading.Event()
        sampler = threading.Thread(target=self._sample, args=(process.pid, done))
        sampler.start()
        _, status, usage = os.wait4(process.pid, 0)
        self.seconds = time.perf_counter() - start
        done.set()
        sampler.join()
        process.returncode = self.returncode = os.waitstatus_to_exitcode(status)
        self.maxrss = usage.ru_maxrss * 1024
        log.seek(0)
        self.tail = (log.read().strip().splitlines() or [""])[-1][:120]
        log.close()
        os.unlink(log.name)
        return self

    def _sample(self, pid: int, done: threading.Event) -> None:
        while not done.wait(self.interval):
            total = tree_rss(pid)
            self.tree_peak = max(self.tree_peak, total)
            if self.cap and total > self.cap and not self.stopped:
                self.stopped = True
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    @property
    def peak(self) -> float:
        return max(self.maxrss, self.tree_peak)


def tree_rss(root: int) -> int:
    """Resident bytes of process ``root`` and all its descendants (from /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {root}, [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier and pid not in tree]
        tree.update(children)
        frontier = children
    total = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    return total


def _median_run(runs: list) -> Run:
    """A run with the median wall time and the largest peaks of ``runs``."""
    middle = sorted(runs, key=lambda run: run.seconds)[(len(runs) - 1) // 2]
    middle.maxrss = max(run.maxrss for run in runs)
    middle.tree_peak = max(run.tree_peak for run in runs)
    return middle


def _seconds(runs: list) -> str:
    return ", ".join(f"{run.seconds:.1f}" for run in runs) + " s"


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def floor_copy(checkpoint: str, out: str, nbytes: int) -> None:
    """Read every shard once and write ``nbytes`` to ``out`` (the bytes just read, again and
    again): the least any compile of this checkpoint into that many bytes must do."""
    buffer = bytearray(64 << 20)
    view = memoryview(buffer)
    shards = sorted(f for f in os.listdir(checkpoint) if f.endswith(".safetensors"))
    written = 0
    with open(out, "wb") as sink:
        for shard in shards:
            with open(os.path.join(checkpoint, shard), "rb", buffering=0) as source:
                while True:
                    got = source.readinto(buffer)
                    if not got:
                        break
                    if written < nbytes:
                        written += sink.write(view[:min(got, nbytes - written)])
        while written < nbytes:
            written += sink.write(view[:min(len(buffer), nbytes - written)])


# ---- the table ------------------------------------------------------------------------------

COMPILES = {  # name: (irc compile options, bytes per checkpoint byte, for the disk check)
    "int4": (["--target", "onnx-ort", "--passes", "quantize{bits=4}"], 0.35),
    "int4-rtn": (["--target", "onnx-ort", "--passes", "quantize{bits=4,method=rtn}"], 0.35),
    "f16": (["--target", "onnx-ort", "--dtype", "f16"], 1.0),
    "f32": (["--target", "onnx-ort", "--dtype", "f32"], 2.0),
}
GB = 1e9


def variant_dir(base: str, layers: int) -> str:
    return base if layers == 32 else f"{base.rstrip('/')}-{layers}l"


def measure_variant(folder: str, work: str, runs: list, cap: float, budget: float, repeat: int = 2) -> list:
    """Rows of the table for one checkpoint: each compile and its floor, interleaved
    ``repeat`` times (C F C F: each sees the page cache the other left), medians; the
    builder last."""
    rows, ckpt = [], folder_bytes(folder)
    for name in [r for r in runs if r in COMPILES]:
        options, ratio = COMPILES[name]
        out = os.path.join(work, name)
        if ckpt + ratio * ckpt > budget:
            rows.append((name, None, f"not run: checkpoint + output ~{(1 + ratio) * ckpt / GB:.0f} GB > the "
                                     f"{budget / GB:.0f} GB disk budget (--disk-budget-gb)"))
            continue
        compiles, floors = [], []
        for _ in range(repeat):
            run = Run([sys.executable, "-m", "irc_cli", "compile", folder, *options, "-o",
                       os.path.join(out, "model.onnx"), "--quiet"]).run()
            written = folder_bytes(out) if os.path.isdir(out) else 0
            shutil.rmtree(out, ignore_errors=True)
            compiles.append(run)
            if run.returncode or "floor" not in runs:
                break
            os.makedirs(work, exist_ok=True)
            sink = os.path.join(work, "floor.bin")
            floors.append(Run([sys.executable, os.path.abspath(__file__), "--floor", folder, sink, str(written)]).run())
            os.unlink(sink)
        run = compiles[-1]
        note = f"{written / GB:.2f} GB written" if run.returncode == 0 else f"failed: {run.tail}"
        rows.append((name, _median_run(compiles), f"{note}; runs {_seconds(compiles)}"))
        if floors:
            rows.append((f"floor ({name})", _median_run(floors),
                         f"read {ckpt / GB:.2f} GB, write {written / GB:.2f} GB; runs {_seconds(floors)}"))
    if "builder" in runs:
        out = os.path.join(work, "builder")
        run = Run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", folder, "-o", out, "-p", "int4",
                   "-e", "cpu", "-c", os.path.join(work, "builder-cache")], cap_bytes=int(cap)).run()
        written = folder_bytes(out) if os.path.isdir(out) else 0
        for path in (out, os.path.join(work, "builder-cache")):
            shutil.rmtree(path, ignore_errors=True)
        note = (f"stopped by the {cap / GB:.0f} GB cap at {run.tree_peak / GB:.1f} GB" if run.stopped else
                f"{written / GB:.2f} GB written" if run.returncode == 0 else f"failed: {run.tail}")
        rows.append(("builder -p int4 -e cpu", run, note))
    return rows


# the genai check: a 2-layer model narrowed so the reference interpreter fits in memory (it
# holds every weight as f32; on the 8B-wide 2-layer variant it peaked at 16.2 GB)
NARROW = {"hidden_size": 1024, "intermediate_size": 3584, "num_attention_heads": 8, "num_key_value_heads": 2,
          "vocab_size": 16384}
CHECK_PASSES = "quantize{bits=4,group=32,lm_head=true,method=rtn,accuracy_level=0}"


def genai_check(base: str, work: str) -> str:
    """Compile the narrow checkpoint to int4 (MatMulNBits, exact float math), run a prompt
    through onnxruntime-genai, and hold its last logits against the reference interpreter's
    on the same quantized graph."""
    import onnxruntime_genai as og

    sys.path.insert(0, ROOT)
    import passes  # noqa: F401
    from backends.onnx.runtime import empty_caches, left_padded
    from frontends import load_spec
    from irc.check import relative_error, run_reference
    from irc.passmanager import PassManager, parse_pipeline

    folder = write_checkpoint(f"{base.rstrip('/')}-narrow", 2, overrides=NARROW)
    out = os.path.join(work, "int4-genai")
    run = Run([sys.executable, "-m", "irc_cli", "compile", folder, "--target", "onnx-ort", "--passes", CHECK_PASSES,
               "-o", os.path.join(out, "model.onnx"), "--quiet"]).run()
    if run.returncode:
        return f"int4 compile failed: {run.tail}"
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, NARROW["vocab_size"], 24)]
    model = og.Model(out)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=64)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    genai = np.asarray(generator.get_output("logits"), np.float32).reshape(-1, NARROW["vocab_size"])[-1]
    del generator, model
    shutil.rmtree(out, ignore_errors=True)
    graph = load_spec(folder)
    PassManager(parse_pipeline("retype," + CHECK_PASSES)).run(graph)
    reference = run_reference(graph, {**left_padded([prompt]), **empty_caches(graph, 1)}, 0)[0][0, -1]
    same = int(np.argmax(genai)) == int(np.argmax(reference))
    return (f"int4 ({CHECK_PASSES}) in onnxruntime-genai vs the reference interpreter on {folder}: max |dlogit| "
            f"{float(np.abs(genai - reference).max()):.2e}, relative {relative_error(genai, reference):.2e}, "
            f"top-1 {'same' if same else 'differs'}")


def real_model_compiles(folder: str, work: str, rounds: int) -> str:
    """Whole-process fp32 compiles of a real folder, irc and the builder interleaved:
    medians over ``rounds`` and their ratio."""
    tools = {
        "irc --target onnx-ort": [sys.executable, "-m", "irc_cli", "compile", folder, "--target", "onnx-ort",
                                  "-o", os.path.join(work, "real-irc", "model.onnx"), "--quiet"],
        "builder -p fp32 -e cpu": [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", folder, "-o",
                                   os.path.join(work, "real-builder"), "-p", "fp32", "-e", "cpu", "-c",
                                   os.path.join(work, "real-builder-cache")],
    }
    times: dict = {name: [] for name in tools}
    for _ in range(rounds):
        for name, argv in tools.items():
            run = Run(argv).run()
            times[name].append(run.seconds if run.returncode == 0 else float("nan"))
            for sub in ("real-irc", "real-builder", "real-builder-cache"):
                shutil.rmtree(os.path.join(work, sub), ignore_errors=True)
    irc_s, builder_s = (float(np.median(times[name])) for name in tools)
    return (f"fp32 compile of {folder}, whole process, median of {rounds} interleaved: irc {irc_s:.2f} s "
            f"({', '.join(f'{t:.2f}' for t in times['irc --target onnx-ort'])}), builder {builder_s:.2f} s "
            f"({', '.join(f'{t:.2f}' for t in times['builder -p fp32 -e cpu'])}): builder / irc = "
            f"{builder_s / irc_s:.1f}x")


def print_table(layers: int, folder: str, rows: list) -> None:
    print(f"\n{folder} ({layers} layers, {folder_bytes(folder) / GB:.2f} GB of bf16 safetensors)")
    print(f"{'run':<24} {'wall s':>8} {'peak RSS GB':>12} {'tree GB':>8} {'vs floor':>9}  note")
    floors = {name[len('floor ('):-1]: run.seconds for name, run, _ in rows if run and name.startswith("floor (")}
    for name, run, note in rows:
        if run is None:
            print(f"{name:<24} {'':>8} {'':>12} {'':>8} {'':>9}  {note}")
            continue
        ratio = f"{run.seconds / floors[name]:.2f}x" if name in floors else ""
        print(f"{name:<24} {run.seconds:8.1f} {run.maxrss / GB:12.2f} {run.tree_peak / GB:8.2f} {ratio:>9}  {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default="32", help="comma-separated layer counts (32: Llama-3-8B)")
    parser.add_argument("--dir", default="/work/cache/big-llama3-8b",
                        help="the 32-layer checkpoint's folder (others: DIR-<L>l)")
    parser.add_argument("--work", default=None, help="where compiles write (deleted after each)")
    parser.add_argument("--runs", default="int4,floor,f16,f32,builder")
    parser.add_argument("--cap-gb", type=float, default=10.0, help="memory cap of the builder's process tree")
    parser.add_argument("--disk-budget-gb", type=float, default=40.0,
                        help="skip a compile whose checkpoint plus output would pass this")
    parser.add_argument("--generate-only", action="store_true")
    parser.add_argument("--genai-check", action="store_true",
                        help="also run the int4 model of a narrow 2-layer variant in onnxruntime-genai against the "
                             "reference interpreter")
    parser.add_argument("--real", default=None, metavar="HF_FOLDER",
                        help="also time fp32 compiles of a real folder against the builder (SmolLM2: "
                             "/work/cache/smollm2/hf-f32, from benchmarks/real_model.py)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --real")
    parser.add_argument("--repeat", type=int, default=2, help="compile/floor pairs per compile (medians)")
    parser.add_argument("--floor", nargs=3, metavar=("CHECKPOINT", "OUT", "BYTES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor:
        floor_copy(args.floor[0], args.floor[1], int(args.floor[2]))
        return
    work = args.work or tempfile.mkdtemp(prefix="irc-big-")
    runs = args.runs.split(",")
    for layers in (int(n) for n in args.layers.split(",")):
        folder = write_checkpoint(variant_dir(args.dir, layers), layers)
        if not args.generate_only:
            print_table(layers, folder, measure_variant(folder, work, runs, args.cap_gb * GB,
                                                        args.disk_budget_gb * GB, args.repeat))
    if args.genai_check:
        print("\n" + genai_check(args.dir, work))
    if args.real:
        print("\n" + real_model_compiles(args.real, work, args.rounds))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
