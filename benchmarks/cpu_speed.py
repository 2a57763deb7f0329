"""irc's ONNX models against every peer on CPU, on real models, in one run.

Tools (each writes an onnxruntime-genai folder from the same Hugging Face folder):

- ``irc onnx-ort`` and ``irc onnx``: ``python -m irc_cli compile HF --target ...``;
- ``builder``: onnxruntime-genai's builder, ``-p fp32 -e cpu``;
- ``mobius``: ``mobius build --config HF --dtype f32 --runtime ort-genai`` (mobius-onnx 0.1.0).

Models: SmolLM2-135M-Instruct (Llama family, ``benchmarks/real_model.py``), Gemma-3-270M
(``benchmarks/real_gemma3.py``) and Qwen2.5-Coder-0.5B-Instruct (``qwen-coder``,
``benchmarks/real_qwen_coder.py``), fp32, from GGUF files that ship inside PyPI packages.

``--int4``: every tool at int4 instead: irc with ``--passes INT4`` (quantize's defaults: the
embedding table and tied head in int4, the builder's scheme), the builder with ``-p int4`` (its default accuracy
level 4, as irc's), no mobius (mobius-onnx 0.1.0 cannot quantize a float checkpoint); each
model's op census (node counts per op type) is printed, and ``--variant`` builds take the same
passes unless they give their own (``--variant "split-qkv=--target onnx-ort --unfuse pack-qkv"``
measures the q|k|v MatMulNBits + Split form against GroupQueryAttention's packed query).

Measured, through onnxruntime-genai's generate loop, 2 intra-op threads for every tool:

- prefill ms of a 128- and a 1,024-token prompt (real text, the seed file);
- decode tok/s after the 128-token prompt ("short", 16 steps) and after a 2,048-token prompt
  (8 steps; only for ``--long-tools``, by default irc onnx-ort and the peers: that prefill
  is the run's largest cost);
- peak resident memory of a process that loads the model and runs the 1,024-token prefill
  and a few decode steps (one subprocess per tool, its VmHWM);
- per-op time shares of one 128-token prefill of irc's onnx-ort model (and the fastest
  peer's, for comparison) from ONNX Runtime's profiler (plain ORT session, empty caches);
- max |logit difference| of each tool's 128-token prefill (last row, plain ORT) against
  transformers.

Rounds are interleaved (model by model: A B C D A B C D ...), each model loaded afresh and
dropped after its turn, so no idle session's threads compete; medians over rounds are
reported (a round's decode figure is the median of its steps). The host is shared and noisy:
compare ratios within one run, never across runs. Each target line also gives the ratio round
by round against the same peer (median and range): both ran within seconds of each other, so
the host's drift between rounds cancels there.

    python benchmarks/cpu_speed.py [--rounds 5] [--models smollm2,gemma3] [--quick]
        [--variant NAME=IRC_ARGS ...] [--rebuild]

``--variant "ort-gemm=--target onnx-ort --tied-head gemm"`` adds an irc build with those
compile arguments, so an option's effect is measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from common import genai_generate, genai_round, median, set_threads  # noqa: E402

THREADS = 2
SHORT_NEW, LONG_NEW = 16, 8
LONG_TOOLS = "irc onnx-ort,builder,mobius"  # the 2,048-token prefill is the run's largest cost
INT4 = "lower-mlp,quantize{bits=4},dce"
PHASES = {"prefill 128": 128, "prefill 1024": 1024, "decode short": 128, "decode 2048": 2048}


# ---- models and builds -----------------------------------------------------------------

def hf_folders(names: list[str]) -> dict[str, str]:
    folders = {}
    for name in names:
        if name == "smollm2":
            import real_model
            folders[name] = real_model.prepare()["f32"]
        elif name == "gemma3":
            import real_gemma3
            folders[name] = real_gemma3.prepare()
        elif name == "qwen-coder":
            import real_qwen_coder
            folders[name] = real_qwen_coder.prepare()
        else:
            raise SystemExit(f"unknown model {name!r} (smollm2, gemma3, qwen-coder)")
    return folders


def tool_commands(hf: str, out: str, variants: dict, int4: bool = False) -> dict[str, list]:
    irc = [sys.executable, "-m", "irc_cli", "compile", hf, "--quiet", "--context", "4096", "-o"]
    passes = ["--passes", INT4] if int4 else []
    jobs = {"irc onnx-ort": irc + [os.path.join(out, "irc-ort", "model.onnx"), "--target", "onnx-ort", *passes],
            "irc onnx": irc + [os.path.join(out, "irc", "model.onnx"), "--target", "onnx", *passes]}
    for name, extra in variants.items():
        own = shlex.split(extra)
        jobs[f"irc {name}"] = irc + [os.path.join(out, f"irc-{name}", "model.onnx"), *own,
                                     *([] if "--passes" in own else passes)]
    jobs["builder"] = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf, "-o",
                       os.path.join(out, "builder"), "-p", "int4" if int4 else "fp32", "-e", "cpu", "-c",
                       os.path.join(out, "builder-cache")]
    if not int4:
        jobs["mobius"] = [os.path.join(os.path.dirname(sys.executable), "mobius"), "build", "--config", hf, "--dtype",
                          "f32", "--runtime", "ort-genai", os.path.join(out, "mobius")]
    return jobs


def folder_of(argv: list) -> str:
    if "-o" in argv and argv[0] == sys.executable and argv[2] == "irc_cli":
        return os.path.dirname(argv[argv.index("-o") + 1])
    return argv[argv.index("-o") + 1] if "-o" in argv else argv[-1]


def build_all(hf: str, out: str, variants: dict, rebuild: bool, keep: set, int4: bool = False) -> dict[str, tuple]:
    """{tool: (folder or None, note)} for the tools in ``keep`` (all when empty) and the
    variants; existing folders are kept unless irc's and ``rebuild``."""
    built = {}
    for name, argv in tool_commands(hf, out, variants, int4).items():
        if keep and name not in keep and name[4:] not in variants:
            continue
        folder = folder_of(argv)
        fresh = rebuild and name.startswith("irc")
        if fresh:
            shutil.rmtree(folder, ignore_errors=True)
        if not os.path.exists(os.path.join(folder, "genai_config.json")):
            os.makedirs(os.path.dirname(folder), exist_ok=True)
            start = time.perf_counter()
            done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
            seconds = time.perf_counter() - start
            if done.returncode or not os.path.exists(os.path.join(folder, "genai_config.json")):
                lines = (done.stderr or done.stdout).strip().splitlines() or ["no genai_config.json"]
                built[name] = (None, f"cannot convert it: {lines[-1][:120]}")
                shutil.rmtree(folder, ignore_errors=True)
                continue
            print(f"  built {name} in {seconds:.1f} s", flush=True)
        set_threads(folder, THREADS)
        built[name] = (folder, "")
    return built


# ---- timing ----------------------------------------------------------------------------

def prompt_ids(hf: str, count: int) -> np.ndarray:
    from real_model import eval_tokens

    ids = eval_tokens(hf, count=count)
    while len(ids) < count:
        ids = ids + ids
    return np.asarray([ids[:count]], np.int32)


generate = genai_generate  # (prefill seconds, decode step seconds) through the genai generate loop


def one_round(folder: str, prompts: dict, phases: list) -> dict:
    """{phase: seconds (prefill) or [step seconds] (decode)} for one fresh load of ``folder``."""
    return genai_round(folder, prompts, phases, SHORT_NEW, LONG_NEW)


def measure(builds: dict, prompts: dict, phases: list, rounds: int, long_tools: set) -> dict:
    """{tool: {phase: [one value per round]}}, interleaved over ``rounds``: a prefill's seconds,
    or the median seconds of a round's decode steps; "decode 2048" only for ``long_tools``."""
    results = {name: {phase: [] for phase in phases} for name in builds}
    for r in range(rounds):
        for name, folder in builds.items():
            mine = [p for p in phases if p != "decode 2048" or name in long_tools]
            for phase, value in one_round(folder, prompts, mine).items():
                if phase in results[name]:
                    results[name][phase].append(statistics.median(value) if isinstance(value, list) else value)
        print(f"  round {r + 1}/{rounds} done", flush=True)
    return results


def peak_memory(folder: str, hf: str) -> float:
    """MB: the peak resident memory (VmHWM) of a child that loads ``folder`` and runs the
    1,024-token prefill + 4 steps. Not ``ru_maxrss``: Linux carries it across fork and exec,
    so a child would report this process's peak."""
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-memory", folder, "--hf", hf],
                          capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        return float("nan")
    return float(done.stdout.strip().splitlines()[-1])


def child_memory(folder: str, hf: str) -> None:
    import onnxruntime_genai as og

    model = og.Model(folder)
    generate(model, prompt_ids(hf, 1024), 4)
    with open("/proc/self/status") as f:
        peak_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    print(peak_kb / 1024)


# ---- plain ORT: logits and profile -----------------------------------------------------

def ort_session(folder: str, profile: str = ""):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    options.log_severity_level = 3
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = profile
    with open(os.path.join(folder, "genai_config.json")) as f:
        name = json.load(f)["model"]["decoder"]["filename"]
    return ort.InferenceSession(os.path.join(folder, name), options, providers=["CPUExecutionProvider"])


def prefill_feeds(session, ids: np.ndarray, head_dim: int) -> dict:
    t = ids.shape[1]
    feeds = {"input_ids": ids.astype(np.int64), "attention_mask": np.ones((1, t), np.int64),
             "position_ids": np.arange(t, dtype=np.int64)[None]}
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int32)": np.int32}
    for i in session.get_inputs():
        if i.name.startswith("past_key_values"):
            shape = [1, i.shape[1], 0, i.shape[3] if isinstance(i.shape[3], int) else head_dim]
            feeds[i.name] = np.zeros(shape, types[i.type])
        elif i.name in feeds and i.type == "tensor(int32)":
            feeds[i.name] = feeds[i.name].astype(np.int32)
    names = {i.name for i in session.get_inputs()}
    return {k: v for k, v in feeds.items() if k in names}


def last_logits(folder: str, ids: np.ndarray, head_dim: int) -> np.ndarray:
    session = ort_session(folder)
    logits = session.run(["logits"], prefill_feeds(session, ids, head_dim))[0]
    return logits[0, -1]


def reference_logits(hf: str, ids: np.ndarray) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    with torch.inference_mode():
        return model(torch.from_numpy(ids.astype(np.int64))).logits[0, -1].numpy()


def op_shares(folder: str, ids: np.ndarray, head_dim: int, runs: int = 3) -> list[tuple[str, float, float]]:
    """[(op type, share of node time, ms per run)], largest first, over ``runs`` prefills."""
    prefix = os.path.join(tempfile.mkdtemp(prefix="irc-profile-"), "ort")
    session = ort_session(folder, prefix)
    feeds = prefill_feeds(session, ids, head_dim)
    session.run(None, feeds)
    path = session.end_profiling()
    session = ort_session(folder, prefix)
    for _ in range(runs):
        session.run(None, feeds)
    path = session.end_profiling()
    with open(path) as f:
        events = json.load(f)
    totals = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            op = event["args"].get("op_name", "?")
            totals[op] = totals.get(op, 0) + event["dur"]
    whole = sum(totals.values()) or 1
    return sorted(((op, us / whole, us / 1000 / runs) for op, us in totals.items()), key=lambda row: -row[1])


# ---- report ----------------------------------------------------------------------------

def summarize(results: dict) -> dict:
    """{tool: {phase: prefill ms or decode tok/s}}: the median over rounds."""
    table = {}
    for name, phases in results.items():
        table[name] = {phase: speed(phase, median(values)) for phase, values in phases.items()}
    return table


def speed(phase: str, seconds: float) -> float:
    return seconds * 1000 if phase.startswith("prefill") else 1 / seconds


def paired(results: dict, ours: str, peer: str, phase: str) -> list:
    """Round by round, ours against ``peer`` (time ratio for a prefill, speed ratio for a
    decode): the same round ran both within seconds, so the host's drift cancels."""
    pairs = zip(results[ours].get(phase, []), results[peer].get(phase, []))
    return sorted(a / b if phase.startswith("prefill") else b / a for a, b in pairs if a == a and b == b)


def print_table(model: str, table: dict, notes: dict, memory: dict, errors: dict, phases: list) -> None:
    print(f"\n{model}: genai loop, {THREADS} threads, medians (prefill ms, decode tok/s); "
          f"memory = peak RSS of a process running the 1,024-token prefill")
    header = "".join(f"{p:>14}" for p in phases)
    print(f"  {'tool':<22}{header}{'peak MB':>10}{'max|dlogit|':>12}")
    for name in notes:
        if notes[name]:
            print(f"  {name:<22}{notes[name]}")
            continue
        cells = "".join(f"{table[name].get(p, float('nan')):14.1f}" for p in phases)
        print(f"  {name:<22}{cells}{memory.get(name, float('nan')):10.0f}{errors.get(name, float('nan')):12.1e}")


def print_targets(model: str, table: dict, results: dict, phases: list, name: str = "irc onnx-ort") -> None:
    """Each target as the ratio of medians, then the median and range of the per-round ratios
    against the same peer."""
    peers = [n for n in ("builder", "mobius") if n in table]
    ours = table.get(name)
    if not peers or ours is None:
        return
    print(f"  targets ({model}, {name}): ", end="")
    parts = []
    for phase in phases:
        prefill = phase.startswith("prefill")
        values = {p: table[p][phase] for p in peers if table[p].get(phase, float("nan")) == table[p].get(phase)}
        if not values or ours.get(phase, float("nan")) != ours.get(phase):
            continue
        best = (min if prefill else max)(values, key=values.get)
        ratio = ours[phase] / values[best]
        ok = ratio <= 0.95 if prefill else ratio >= 1.0
        rounds = paired(results, name, best, phase)
        spread = (f" [{best}, per round: median {median(rounds):.2f}x, {rounds[0]:.2f}-{rounds[-1]:.2f}]"
                  if rounds else "")
        parts.append(f"{phase} {ratio:.2f}x best peer ({'met' if ok else 'MISSED'}){spread}")
        if table.get("irc onnx", {}).get(phase, float("nan")) == table.get("irc onnx", {}).get(phase):
            portable = table["irc onnx"][phase] / ours[phase] if prefill else ours[phase] / table["irc onnx"][phase]
            parts[-1] += f", onnx/onnx-ort {portable:.2f}x{'' if portable <= 1.2 else ' (MISSED)'}"
    print("; ".join(parts))


def print_census(builds: dict) -> None:
    """Node counts per op type of each tool's graph, the types that differ between tools first."""
    import onnx
    from collections import Counter

    counts = {}
    for name, folder in builds.items():
        with open(os.path.join(folder, "genai_config.json")) as f:
            filename = json.load(f)["model"]["decoder"]["filename"]
        graph = onnx.load(os.path.join(folder, filename), load_external_data=False).graph
        counts[name] = Counter(n.op_type for n in graph.node)
    ops = sorted({op for c in counts.values() for op in c},
                 key=lambda op: (len({c[op] for c in counts.values()}) == 1, -max(c[op] for c in counts.values()), op))
    print("  op census (nodes per op type, per graph):")
    print(f"    {'op':<34}" + "".join(f"{name:>16}" for name in counts))
    for op in ops:
        print(f"    {op:<34}" + "".join(f"{c[op]:16d}" for c in counts.values()))
    print(f"    {'all':<34}" + "".join(f"{sum(c.values()):16d}" for c in counts.values()))


def disk_mb(folder: str) -> float:
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder) if n.startswith("model")) / 1e6


def print_profile(name: str, shares: list, top: int = 8) -> None:
    total = sum(ms for _, _, ms in shares)
    print(f"  ORT profile, 128-token prefill, {name}: {total:.0f} ms of node time; "
          + ", ".join(f"{op} {share:.1%}" for op, share, _ in shares[:top]))


def head_dim_of(hf: str) -> int:
    with open(os.path.join(hf, "config.json")) as f:
        config = json.load(f)
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="smollm2,gemma3")
    parser.add_argument("--tools", default="", help="comma-separated subset of tools (default all)")
    parser.add_argument("--quick", action="store_true", help="prefill 128 and short decode only, no memory")
    parser.add_argument("--variant", action="append", default=[], help="NAME=IRC_COMPILE_ARGS")
    parser.add_argument("--rebuild", action="store_true", help="recompile irc's models")
    parser.add_argument("--workdir", default="/work/cache/cpu_speed")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--long-tools", default=LONG_TOOLS, help="tools timed at the 2,048-token context")
    parser.add_argument("--int4", action="store_true", help="int4 builds (irc INT4 passes, builder -p int4)")
    parser.add_argument("--child-memory", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--hf", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_memory:
        child_memory(args.child_memory, args.hf)
        return
    variants = dict(v.split("=", 1) for v in args.variant)
    phases = ["prefill 128", "decode short"] if args.quick else list(PHASES)
    print(f"host: shared with other jobs (loaded); {os.cpu_count()} cores; {THREADS} intra-op threads per tool")
    for model, hf in hf_folders(args.models.split(",")).items():
        print(f"\n== {model} ({hf})", flush=True)
        built = build_all(hf, os.path.join(args.workdir, model + ("-int4" if args.int4 else "")), variants,
                          args.rebuild, set(args.tools.split(",")) if args.tools else set(), args.int4)
        notes = {name: note for name, (_, note) in built.items()}
        builds = {name: folder for name, (folder, note) in built.items() if folder}
        lengths = {128, 1024, 2048} if not args.quick else {128}
        prompts = {n: prompt_ids(hf, n) for n in lengths}
        head_dim = head_dim_of(hf)
        reference = reference_logits(hf, prompts[128])
        errors = {name: float(np.abs(last_logits(folder, prompts[128], head_dim) - reference).max())
                  for name, folder in builds.items()}
        results = measure(builds, prompts, phases, args.rounds, set(args.long_tools.split(",")))
        table = summarize(results)
        memory = {} if args.quick else {name: peak_memory(folder, hf) for name, folder in builds.items()}
        print_table(model, table, notes, memory, errors, phases)
        print("  MB on disk (model files): " + ", ".join(f"{n} {disk_mb(f):.1f}" for n, f in builds.items()))
        if args.int4:
            print_census(builds)
        for name in ["irc onnx-ort", *(f"irc {v}" for v in variants if v.startswith("ort"))]:
            print_targets(model, table, results, phases, name)
        if not args.no_profile:
            peers = [n for n in ("mobius", "builder") if n in table]
            fastest = min(peers, key=lambda n: table[n]["prefill 128"]) if peers else None
            for name in ["irc onnx-ort", *[f"irc {v}" for v in variants], fastest]:
                if name in builds:
                    print_profile(name, op_shares(builds[name], prompts[128], head_dim))


if __name__ == "__main__":
    main()
