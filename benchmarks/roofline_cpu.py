"""Where CPU decode and prefill stand against this machine's own limits (a roofline table).

A decode step on CPU reads every weight it uses once, so tokens/s <= read bandwidth / bytes
read per token; a prefill is bound by GEMM throughput. This script measures both limits, then
each model x tool against them, and says from measured figures where a decode step's time goes.

Machine (printed first):

- read bandwidth, 1 and 2 threads: ``np.max`` over a 1 GiB float32 array cut into equal
  contiguous parts, one Python thread per part (``np.max`` releases the GIL and is not
  compute-bound; ``np.sum`` under-reports, its float32 sum is); GB/s = bytes / wall time until
  the last thread ends; best and median of the repeats. "The limit" is the best 2-thread figure
  seen in the run (probed again before and after each model's rounds).
- GEMM GFLOP/s at 1 and 2 threads, M=K=N=1024, best of the repeats (a ceiling): NumPy fp32
  (OpenBLAS; threads set by OPENBLAS_NUM_THREADS in a child process), ONNX Runtime MatMul fp32,
  MatMulInteger (u8 x s8) and MatMulNBits int4 at accuracy level 4 (int8 activations: the
  kernel the int4 models of irc and of the builder use); and the GB/s of MatMul fp32 /
  MatMulNBits as a GEMV (M=1) over a weight larger than the 32 MiB L3 (the decode kernels' own ceiling).

Models x tools (``benchmarks/cpu_speed.py``'s builds and interleaved genai-loop rounds, 2
intra-op threads): irc onnx-ort, the onnxruntime-genai builder, mobius-onnx at fp32; irc and the
builder at int4 (irc's INT4 passes, builder ``-p int4``). Bytes read per decoded token:

- weights: every initializer of the decoder graph, whole, except a table read one row per token:
  the data/scales/zero points of an embedding ``Gather``/``GatherBlockQuantized`` and the
  cos/sin caches of rotary ops (counted as bytes / rows); a table the LM head also reads (tied
  embeddings) counts whole. Reshape/Transpose/Cast of an initializer are followed (ORT folds
  them). Initializers no node reads count zero.
- KV cache: 2 x layers x kv heads x head dim x context x element bytes (a sliding layer reads
  min(context, window)), at the mean context of the timed steps (128-token prompt + 16 steps:
  136; 2,048 + 8: 2,052). Not counted: activations, the logits written, the new KV row written.

Prefill: useful FLOPs = 2 x tokens x (the checkpoint's matrix weights: every 2-D tensor but the
embedding, plus the head) + causal attention (4 x heads x head dim x sum_i min(i, window) per
layer), against ORT MatMul fp32 (fp32 models) or MatMulNBits acc 4 (int4) measured at the
model's MLP shape (M=tokens, K=hidden, N=intermediate), 2 threads.

Where the gap goes: decode steps (after a 128-token prompt) of irc's int4 model (full run: also
the builder's int4 and irc's fp32) in the genai loop with the decoder session profiled
(``enable_profiling``): step wall time vs its ``session.run`` vs the sum of kernel times, then
per op type ms/step, share and bytes read (weights as counted above, activations and KV from
the profiler's activation_size) as GB/s; then the excess over bytes/limit by category, and the
matrix products per weight shape. (A plain ORT session fed past -> present would copy the KV
cache into new tensors each step, which genai's shared buffer avoids: its steps ran slower.)

    python benchmarks/roofline_cpu.py [--quick] [--models smollm2,qwen-coder,gemma3]
        [--rounds 3] [--workdir /work/cache/roofline] [--profile-model smollm2]

``--quick``: SmolLM2 only, prefill 128 and short decode, 2 rounds, fewer repeats. The host may
be shared: medians only, and compare shares within one run.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import cpu_speed  # noqa: E402  (builds, genai rounds, plain-ORT sessions)

MODELS = {"smollm2": "/work/cache/smollm2/hf-f32", "qwen-coder": "/work/cache/qwen-coder/hf-f32",
          "gemma3": "/work/cache/gemma3/hf-f32"}
TOOLS = {"fp32": ("irc onnx-ort", "builder", "mobius"), "int4": ("irc onnx-ort", "builder")}
CONTEXT = {"decode short": 128 + cpu_speed.SHORT_NEW // 2, "decode 2048": 2048 + cpu_speed.LONG_NEW // 2}
THREADS = cpu_speed.THREADS


# ---- machine ceilings ------------------------------------------------------------------

def read_bandwidth(threads: int, repeats: int, size: int = 1 << 30) -> list[float]:
    """GB/s of ``np.max`` over ``size`` bytes split across ``threads`` Python threads."""
    data = np.ones(size // 4, np.float32)
    parts = np.array_split(data, threads)
    rates = []
    for _ in range(repeats):
        gate = threading.Barrier(threads + 1)

        def work(part):
            gate.wait()
            part.max()

        workers = [threading.Thread(target=work, args=(p,)) for p in parts]
        for w in workers:
            w.start()
        gate.wait()
        start = time.perf_counter()
        for w in workers:
            w.join()
        rates.append(data.nbytes / (time.perf_counter() - start) / 1e9)
    return rates


def gemm_model(kind: str, m: int, k: int, n: int):
    """(ONNX model bytes, feeds, weight bytes) of one ``kind`` GEMM: fp32, int8 or int4."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    a, out = rng.standard_normal((m, k)).astype(np.float32), TensorProto.FLOAT
    if kind == "fp32":
        inits = [numpy_helper.from_array(np.full((k, n), 0.01, np.float32), "B")]
        node = helper.make_node("MatMul", ["A", "B"], ["Y"])
    elif kind == "int8":
        a, out = rng.integers(0, 256, (m, k), dtype=np.uint8), TensorProto.INT32
        inits = [numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), "B"),
                 numpy_helper.from_array(np.array(128, np.uint8), "azp")]
        node = helper.make_node("MatMulInteger", ["A", "B", "azp"], ["Y"])
    else:
        inits = [numpy_helper.from_array(rng.integers(0, 256, (n, k // 32, 16), dtype=np.uint8), "B"),
                 numpy_helper.from_array((rng.random((n, k // 32)) * 0.01).astype(np.float32), "scales")]
        node = helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain="com.microsoft",
                                K=k, N=n, bits=4, block_size=32, accuracy_level=4)
    a_type = TensorProto.UINT8 if kind == "int8" else TensorProto.FLOAT
    graph = helper.make_graph([node], kind, [helper.make_tensor_value_info("A", a_type, [m, k])],
                              [helper.make_tensor_value_info("Y", out, [m, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    weight = sum(len(t.raw_data) for t in inits)
    return model.SerializeToString(), {"A": a}, weight


def ort_gemm(kind: str, m: int, k: int, n: int, threads: int, repeats: int) -> tuple[float, float]:
    """(GFLOP/s, GB/s of weight read) of ONNX Runtime's ``kind`` GEMM, best of ``repeats``."""
    import onnxruntime as ort

    blob, feeds, weight = gemm_model(kind, m, k, n)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.log_severity_level = 3
    session = ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"])
    seconds = timed(lambda: session.run(None, feeds), repeats)
    return 2 * m * k * n / seconds / 1e9, weight / seconds / 1e9


def timed(call, repeats: int, best: bool = True) -> float:
    """Seconds of ``call()`` after two warm-ups: the best of ``repeats`` (a ceiling) or the median."""
    call()
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times) if best else statistics.median(times)


NUMPY_GEMM = """import numpy as np, statistics, time
a = np.ones(({n}, {n}), np.float32); a @ a; t = []
for _ in range({r}):
    s = time.perf_counter(); a @ a; t.append(time.perf_counter() - s)
print(2 * {n} ** 3 / min(t) / 1e9)"""


def numpy_gemm(threads: int, repeats: int, n: int = 1024) -> float:
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    done = subprocess.run([sys.executable, "-c", NUMPY_GEMM.format(n=n, r=repeats)], env=env,
                          capture_output=True, text=True)
    return float(done.stdout.strip()) if done.returncode == 0 else float("nan")


def machine_ceilings(quick: bool) -> dict:
    """Read bandwidth, GEMM and GEMV ceilings at 1 and 2 threads; prints them."""
    repeats = 4 if quick else 9
    read = {t: read_bandwidth(t, repeats) for t in (1, 2, 1, 2)}  # the second pass is kept
    print(f"read bandwidth (np.max over 1 GiB float32, one thread per contiguous part, {repeats} repeats):")
    for t, rates in read.items():
        print(f"  {t} thread{'s' if t > 1 else ' '}: best {max(rates):5.1f} GB/s, median {statistics.median(rates):5.1f} GB/s")
    gemm = {}
    print("GEMM M=K=N=1024, GFLOP/s (best)       1 thread  2 threads")
    rows = [("NumPy fp32 (OpenBLAS)", lambda t: numpy_gemm(t, repeats)),
            ("ORT MatMul fp32", lambda t: ort_gemm("fp32", 1024, 1024, 1024, t, repeats)[0]),
            ("ORT MatMulInteger u8 x s8", lambda t: ort_gemm("int8", 1024, 1024, 1024, t, repeats)[0]),
            ("ORT MatMulNBits int4 acc 4", lambda t: ort_gemm("int4", 1024, 1024, 1024, t, repeats)[0])]
    for name, probe in rows:
        gemm[name] = {t: probe(t) for t in (1, 2)}
        print(f"  {name:<34}{gemm[name][1]:9.1f}{gemm[name][2]:11.1f}")
    gemv = {}
    print("GEMV M=1 over a weight > L3, GB/s of weight read (best)")
    for name, kind, k, n in (("ORT MatMul fp32 8192x8192 (268 MB)", "fp32", 8192, 8192),
                             ("ORT MatMulNBits int4 8192x16384 (84 MB)", "int4", 8192, 16384)):
        gemv[kind] = {t: ort_gemm(kind, 1, k, n, t, repeats)[1] for t in (1, 2)}
        print(f"  {name:<42}{gemv[kind][1]:7.1f}{gemv[kind][2]:11.1f}")
    return {"read": read, "limit": max(read[2]), "gemm": gemm, "gemv": gemv}


# ---- bytes and FLOPs -------------------------------------------------------------------

PASS_THROUGH = {"Reshape", "Transpose", "Cast", "Identity", "Squeeze", "Unsqueeze"}
BITS = {1: 32, 2: 8, 3: 8, 5: 16, 6: 32, 7: 64, 9: 8, 10: 16, 11: 64, 12: 32, 13: 64, 16: 16, 21: 4, 22: 4}


def row_positions(node) -> set:
    """Inputs of ``node`` of which a step reads one row per token (position or token id)."""
    if node.op_type == "Gather":
        return {0}
    if node.op_type == "GatherBlockQuantized":
        return {0, 2, 3}
    if node.op_type == "GroupQueryAttention":
        return {7, 8}
    if node.op_type == "RotaryEmbedding":
        return {2, 3} if node.domain == "com.microsoft" else {1, 2}
    return set()


def decoder_graph(folder: str):
    import onnx

    with open(os.path.join(folder, "genai_config.json")) as f:
        name = json.load(f)["model"]["decoder"]["filename"]
    return onnx.load(os.path.join(folder, name), load_external_data=False).graph


def tensor_bytes(t) -> int:
    return int(np.prod(t.dims, dtype=np.int64)) * BITS.get(t.data_type, 32) // 8


def initializer_reads(graph) -> tuple[int, int, dict]:
    """(initializer bytes, bytes a decode step reads of them, {node: weight bytes that node
    reads}): see the module docstring. An initializer two nodes read (a tied table: a row by
    the embedding, whole by the head) counts once, at the larger read; each node its own."""
    inits = {t.name: t for t in graph.initializer}
    source = {name: (name, t.dims[0] if t.dims else 1) for name, t in inits.items()}
    for node in graph.node:  # values ORT folds from an initializer: (initializer, rows)
        if node.op_type in PASS_THROUGH and node.input and node.input[0] in source:
            name, rows = source[node.input[0]]
            dims = inits[name].dims
            source[node.output[0]] = (name, dims[-1] if node.op_type == "Transpose" and len(dims) == 2 else rows)
    reads, per_node = {}, defaultdict(int)
    for node in graph.node:
        if node.op_type in PASS_THROUGH and node.output[0] in source:
            continue
        for i, value in enumerate(node.input):
            if value not in source:
                continue
            name, rows = source[value]
            size = tensor_bytes(inits[name])
            part = size // max(rows, 1) if i in row_positions(node) else size
            per_node[node.name] += part
            reads[name] = max(reads.get(name, 0), part)
    return sum(tensor_bytes(t) for t in inits.values()), sum(reads.values()), per_node


def hf_config(hf: str) -> dict:
    with open(os.path.join(hf, "config.json")) as f:
        config = json.load(f)
    return config.get("text_config", config)


def spans(config: dict, context: int) -> list[int]:
    """Keys each layer's attention reads at ``context`` (sliding layers: at most the window)."""
    layers = config["num_hidden_layers"]
    types = config.get("layer_types") or ["full_attention"] * layers
    window = config.get("sliding_window") or context
    return [min(context, window) if kind == "sliding_attention" else context for kind in types]


def kv_bytes(config: dict, context: int, element: int) -> int:
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return sum(2 * heads * head_dim * span * element for span in spans(config, context))


def matrix_params(hf: str) -> int:
    """Matrix weights a token multiplies by: every 2-D tensor but the embedding, plus the head."""
    total, names = 0, set()
    for path in glob.glob(os.path.join(hf, "*.safetensors")):
        with open(path, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            names.add(name)
            if len(info["shape"]) == 2 and "embed_tokens" not in name:
                total += int(np.prod(info["shape"]))
    config = hf_config(hf)
    if not any(n.endswith("lm_head.weight") for n in names):
        total += config["vocab_size"] * config["hidden_size"]
    return total


def prefill_flops(hf: str, tokens: int) -> float:
    config = hf_config(hf)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    keys = sum(sum(spans(config, i)) for i in range(1, tokens + 1))
    return 2 * tokens * matrix_params(hf) + 4 * config["num_attention_heads"] * head_dim * keys


# ---- one model -------------------------------------------------------------------------

def build(model: str, hf: str, workdir: str) -> tuple[dict, dict]:
    """({"tool precision": folder}, {"tool precision": note}) through cpu_speed's builds."""
    builds, notes = {}, {}
    for precision, tools in TOOLS.items():
        out = os.path.join(workdir, model + ("-int4" if precision == "int4" else ""))
        built = cpu_speed.build_all(hf, out, {}, False, set(tools), precision == "int4")
        for tool, (folder, note) in built.items():
            if folder:
                builds[f"{tool} {precision}"] = folder
            else:
                notes[f"{tool} {precision}"] = note
    return builds, notes


def kv_element(graph) -> int:
    kinds = {1: 4, 10: 2, 16: 2}
    first = next((i for i in graph.input if i.name.startswith("past_key_values")), None)
    return kinds.get(first.type.tensor_type.elem_type, 4) if first is not None else 4


def print_decode(model: str, hf: str, builds: dict, table: dict, limit: float) -> dict:
    """The decode roofline rows; returns {tool: bytes per token at the short context}."""
    config, sizes = hf_config(hf), {}
    print(f"\n{model} decode ({THREADS} threads, genai loop, median tok/s; limit = {limit:.1f} GB/s read)")
    print(f"  {'tool':<20}{'context':>8}{'disk MB':>9}{'weights MB':>11}{'KV MB':>7}{'MB/token':>9}"
          f"{'tok/s':>8}{'GB/s':>7}{'of limit':>9}{'bound tok/s':>12}")
    for name, folder in builds.items():
        graph = decoder_graph(folder)
        whole, weights, _ = initializer_reads(graph)
        for phase, context in CONTEXT.items():
            speed = table[name].get(phase, float("nan"))
            if speed != speed:
                continue
            total = weights + kv_bytes(config, context, kv_element(graph))
            sizes.setdefault(name, total)
            print(f"  {name:<20}{context:8d}{whole / 1e6:9.1f}{weights / 1e6:11.1f}{(total - weights) / 1e6:7.1f}"
                  f"{total / 1e6:9.1f}{speed:8.1f}{speed * total / 1e9:7.1f}{speed * total / 1e9 / limit:9.0%}"
                  f"{limit * 1e9 / total:12.1f}")
    return sizes


def print_prefill(model: str, hf: str, builds: dict, table: dict, quick: bool, gemm: dict) -> None:
    config = hf_config(hf)
    lengths = [128] if quick else [128, 1024]
    cube = {"fp32": gemm["ORT MatMul fp32"][THREADS], "int4": gemm["ORT MatMulNBits int4 acc 4"][THREADS]}
    peaks = {(kind, t): max(cube[kind], ort_gemm(kind, t, config["hidden_size"], config["intermediate_size"],
                                                 THREADS, 5)[0]) for kind in ("fp32", "int4") for t in lengths}
    print(f"\n{model} prefill (genai loop, median ms; peak = the better of ORT MatMul fp32 / MatMulNBits acc 4 at "
          f"M=tokens, K={config['hidden_size']}, N={config['intermediate_size']} and at 1024^3, {THREADS} threads)")
    print(f"  {'tool':<20}{'tokens':>7}{'GFLOP':>8}{'ms':>9}{'GFLOP/s':>9}{'peak':>8}{'of peak':>9}")
    for name in builds:
        for tokens in lengths:
            ms = table[name].get(f"prefill {tokens}", float("nan"))
            flops = prefill_flops(hf, tokens)
            peak = peaks[(name.split()[-1], tokens)]
            rate = flops / ms / 1e6
            print(f"  {name:<20}{tokens:7d}{flops / 1e9:8.1f}{ms:9.1f}{rate:9.1f}{peak:8.1f}{rate / peak:9.0%}")


# ---- where a decode step goes ----------------------------------------------------------

def profile_step(folder: str, hf: str, steps: int, context: int = 128) -> dict:
    """Decode steps after a ``context``-token prompt in the genai loop, its decoder session
    profiled (``session_options.enable_profiling`` in a copy of genai_config.json): the mean
    wall ms of a step, the mean ms of its ``session.run`` (model_run) and {node: [op type, ms
    per step, bytes read per step, K x N]}. The prefill run and the first step are dropped."""
    import gc

    import onnxruntime_genai as og

    tmp = tempfile.mkdtemp(prefix="irc-roofline-")
    for name in os.listdir(folder):
        if name != "genai_config.json":
            os.symlink(os.path.join(folder, name), os.path.join(tmp, name))
    with open(os.path.join(folder, "genai_config.json")) as f:
        config = json.load(f)
    config["model"]["decoder"].setdefault("session_options", {})["enable_profiling"] = os.path.join(tmp, "ort")
    with open(os.path.join(tmp, "genai_config.json"), "w") as f:
        json.dump(config, f)
    model = og.Model(tmp)
    walls = cpu_speed.generate(model, cpu_speed.prompt_ids(hf, context), steps + 2)[1][2:]  # step 0 runs nothing
    del model
    gc.collect()  # the session writes its profile when it ends
    with open(glob.glob(os.path.join(tmp, "ort*.json"))[0]) as f:
        events = json.load(f)
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[2:]
    graph = decoder_graph(folder)
    weights = initializer_reads(graph)[2]
    dims = {t.name: list(t.dims) for t in graph.initializer}  # MatMul: B's dims (K x N)
    shapes = {n.name: "x".join(str(a.i) for a in n.attribute if a.name in ("K", "N"))
              or "x".join(map(str, _k_by_n(n, dims))) for n in graph.node}
    nodes = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        if not any(r["ts"] <= e["ts"] <= r["ts"] + r["dur"] for r in runs):
            continue
        name = e["name"][: -len("_kernel_time")]
        row = nodes.setdefault(name, [e["args"].get("op_name", "?"), 0.0, 0.0, shapes.get(name, "")])
        row[1] += e["dur"] / 1000 / len(runs)
        row[2] += (weights.get(name, 0) + int(e["args"].get("activation_size", 0))) / len(runs)
    return {"wall": 1000 * sum(walls) / len(walls), "run": sum(r["dur"] for r in runs) / 1000 / len(runs),
            "nodes": nodes}


def _k_by_n(node, dims: dict) -> list:
    """K x N of a (Fused)MatMul's initializer B (stored [N, K] under transB=1), else []."""
    b = dims.get(node.input[1] if len(node.input) > 1 else "", [])
    flipped = any(a.name == "transB" and a.i for a in node.attribute)
    return b[::-1] if flipped and len(b) == 2 else b


def print_gap(name: str, model: str, got: dict, genai_ms: float, bytes_per_token: float, limit: float) -> None:
    per_op = defaultdict(lambda: [0.0, 0.0, 0])
    for op, ms, size, _ in got["nodes"].values():
        row = per_op[op]
        row[0], row[1], row[2] = row[0] + ms, row[1] + size, row[2] + 1
    kernels, run = sum(r[0] for r in per_op.values()), got["run"]
    bound = bytes_per_token / limit / 1e6
    print(f"\nwhere a decode step goes: {name}, {model}, one token after a 128-token prefill, {THREADS} threads")
    print(f"  genai step, unprofiled (table median) {genai_ms:7.2f} ms   roofline bound {bound:.2f} ms "
          f"({bytes_per_token / 1e6:.1f} MB at {limit:.1f} GB/s)")
    print(f"  genai step, profiled (mean)           {got['wall']:7.2f} ms")
    print(f"  its session.run (model_run, mean)     {run:7.2f} ms   -> genai loop around it {got['wall'] - run:+.2f} ms")
    print(f"  kernels (sum of node times, per step) {kernels:7.2f} ms   -> ORT between kernels {run - kernels:+.2f} ms")
    print(f"    {'op type':<34}{'nodes':>6}{'ms/step':>9}{'of run':>8}{'MB in':>8}{'GB/s':>7}{'of limit':>9}")
    small = [op for op, row in per_op.items() if row[0] < 0.01 * kernels and op != "GroupQueryAttention"]
    for op, (ms, size, count) in sorted(per_op.items(), key=lambda kv: -kv[1][0]):
        if op not in small:
            rate = size / ms / 1e6 if ms else 0.0
            print(f"    {op:<34}{count:6d}{ms:9.3f}{ms / run:8.0%}{size / 1e6:8.1f}{rate:7.1f}{rate / limit:9.0%}")
    rest = sum(per_op[op][0] for op in small)
    print(f"    {f'({len(small)} other op types, each < 1%)':<34}{sum(per_op[op][2] for op in small):6d}"
          f"{rest:9.3f}{rest / run:8.0%}")
    over = {op: ms - size / limit / 1e6 for op, (ms, size, _) in per_op.items()}
    top = sorted(over, key=lambda op: -over[op])[:3]
    print(f"  time over the bytes-at-limit bound: genai loop {got['wall'] - run:+.2f} ms; in the profiled run "
          f"{run - sum(size for _, size, _ in per_op.values()) / limit / 1e6:.2f} ms = between kernels "
          f"{run - kernels:.2f} + " + " + ".join(f"{op} {over[op]:.2f}" for op in top)
          + f" + other kernels {sum(over.values()) - sum(over[op] for op in top):.2f}")
    print_shapes(got, limit)


def print_shapes(got: dict, limit: float) -> None:
    """Matrix products by weight shape K x N: time per call and the GB/s of its bytes."""
    groups = defaultdict(lambda: [0.0, 0.0, 0])
    for op, ms, size, shape in got["nodes"].values():
        if op in ("MatMulNBits", "MatMul", "FusedMatMul", "Gemm"):
            row = groups[f"{op} {shape}".strip()]
            row[0], row[1], row[2] = row[0] + ms, row[1] + size, row[2] + 1
    print(f"    {'matrix products (K x N)':<34}{'nodes':>6}{'us/node':>9}{'MB/node':>8}{'GB/s':>7}{'of limit':>9}")
    for shape, (ms, size, count) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
        rate = size / ms / 1e6 if ms else 0.0
        print(f"      {shape:<32}{count:6d}{ms * 1000 / count:9.1f}{size / count / 1e6:8.2f}{rate:7.1f}{rate / limit:9.0%}")


# ---- main ------------------------------------------------------------------------------

def run_model(model: str, args, ceilings: dict) -> None:
    hf = MODELS[model]
    if not os.path.exists(os.path.join(hf, "config.json")):
        print(f"\n== {model}: {hf} not prepared, skipped")
        return
    print(f"\n== {model} ({hf})", flush=True)
    builds, notes = build(model, hf, args.workdir)
    for name, note in notes.items():
        print(f"  {name}: {note}")
    phases = ["prefill 128", "decode short"] + ([] if args.quick else ["prefill 1024", "decode 2048"])
    prompts = {n: cpu_speed.prompt_ids(hf, n) for n in ((128,) if args.quick else (128, 1024, 2048))}
    start, before = time.perf_counter(), max(read_bandwidth(THREADS, 3))
    results = cpu_speed.measure(builds, prompts, phases, args.rounds, {"irc onnx-ort int4", "builder int4"})
    after = max(read_bandwidth(THREADS, 3))
    print(f"  timed {len(builds)} builds x {args.rounds} rounds in {time.perf_counter() - start:.0f} s; 2-thread read "
          f"bandwidth just before {before:.1f} GB/s, just after {after:.1f} GB/s (the limit: the best seen so far)")
    ceilings["limit"] = max(ceilings["limit"], before, after)
    table = cpu_speed.summarize(results)
    sizes = print_decode(model, hf, builds, table, ceilings["limit"])
    print_prefill(model, hf, builds, table, args.quick, ceilings["gemm"])
    if model == args.profile_model:
        for name in ["irc onnx-ort int4"] + ([] if args.quick else ["builder int4", "irc onnx-ort fp32"]):
            if name in builds:
                got = profile_step(builds[name], hf, steps=10 if args.quick else 30)
                genai_ms = 1000 / table[name]["decode short"]
                print_gap(name, model, got, genai_ms, sizes[name], ceilings["limit"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="SmolLM2 only, short phases, 2 rounds")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=None, help="genai rounds (default 3, quick 2)")
    parser.add_argument("--workdir", default="/work/cache/roofline")
    parser.add_argument("--profile-model", default="smollm2")
    args = parser.parse_args()
    args.rounds = args.rounds or (2 if args.quick else 3)
    models = ["smollm2"] if args.quick else args.models.split(",")
    start = time.perf_counter()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores; load average "
          f"{os.getloadavg()[0]:.2f} at start (other jobs on the host skew every figure)")
    ceilings = machine_ceilings(args.quick)
    for model in models:
        run_model(model, args, ceilings)
    print(f"\nwhole run {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
