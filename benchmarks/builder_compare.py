"""The comparison ``lfm2_vs_builder.py`` and ``delta_vs_builder.py`` share: one recurrent twin,
compiled by irc, onnxruntime-genai's builder and mobius-onnx, fp32 and int4, measured in one
run. Prints one table; asserts nothing; not run by pytest.

Tools (each a whole process, compiled into its own folder):

- ``irc fp32``: ``irc compile DIR --target onnx-ort``;
- ``irc int4``: the same with ``--passes "quantize{bits=4,group=32}"`` (the README's int4);
- ``builder fp32`` / ``builder int4``: ``python -m onnxruntime_genai.models.builder -i DIR -o OUT
  -p fp32|int4 -e cpu`` (its int4 defaults to accuracy level 4: int8 activations);
- ``mobius fp32``: ``mobius build --config DIR --dtype f32 --runtime ort-genai OUT``. mobius-onnx
  0.1.0 cannot quantize a float checkpoint (int4 comes only from pre-quantized checkpoints
  or GGUF), so it has no int4 column; where it does not build the family, its error is the cell.

Measurements: compile wall time (median of ``--compile-rounds``, interleaved) and size on disk;
the last position's logits in plain ONNX Runtime (empty caches) against transformers,
max |Δ| / max |ref|, for one unpadded 128-token prompt and a batch of two left-padded to 128
(each row against transformers running it alone); genai's 16 greedy tokens against
transformers'; and, in onnxruntime-genai's generate loop (``common.genai_round``, as
``benchmarks/cpu_speed.py`` times it: a fresh load per round, warm-up, ``--rounds``
interleaved rounds, medians), prefill of 128 and 1,024 tokens, decode tokens/s after the
128-token prompt (16 steps) and after a 2,048-token prompt (8 steps). A tool that fails at a
step gets its error in that step's cells. ``--quick`` builds a tiny twin (d 64) and runs one
round of each: a check that the script works, not a measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

import numpy as np

from common import (LONG_NEW, SHORT_NEW, cpu_session, genai_generate, genai_round, interleaved, markdown_table,
                    median, set_threads, timed_process)

PROMPT, SHORT, GREEDY = 128, 96, 16
IRC_INT4 = "quantize{bits=4,group=32}"
TOOLS = ("irc fp32", "irc int4", "builder fp32", "builder int4", "mobius fp32")
PHASES = ("prefill 128", "prefill 1024", "decode short", "decode 2048")
COLUMNS = ["compile", "size", "logits, 1 row", "logits, left-padded 2", f"genai greedy {GREEDY}", "prefill 128",
           "prefill 1,024", f"decode ({PROMPT}-token prompt)", "decode at 2,048"]


def arguments(description: str):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved speed rounds")
    parser.add_argument("--compile-rounds", type=int, default=3, help="interleaved compile rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--quick", action="store_true", help="a tiny twin, one round of each: checks the script")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.compile_rounds = 1, 1
    return args


# ---- compiling ---------------------------------------------------------------------------

def commands(hf: str, work: str) -> dict:
    """{tool: (argv, output folder)}."""
    bin_dir = os.path.dirname(sys.executable)
    out = {tool: os.path.join(work, tool.replace(" ", "-")) for tool in TOOLS}
    irc = [os.path.join(bin_dir, "irc"), "compile", hf, "--target", "onnx-ort", "--context", "4096", "--quiet"]
    builder = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf, "-e", "cpu"]
    return {"irc fp32": (irc + ["-o", os.path.join(out["irc fp32"], "model.onnx")], out["irc fp32"]),
            "irc int4": (irc + ["--passes", IRC_INT4, "-o", os.path.join(out["irc int4"], "model.onnx")],
                         out["irc int4"]),
            "builder fp32": (builder + ["-o", out["builder fp32"], "-p", "fp32"], out["builder fp32"]),
            "builder int4": (builder + ["-o", out["builder int4"], "-p", "int4"], out["builder int4"]),
            "mobius fp32": ([os.path.join(bin_dir, "mobius"), "build", "--config", hf, "--dtype", "f32", "--runtime",
                             "ort-genai", out["mobius fp32"]], out["mobius fp32"])}


def compile_all(hf: str, work: str, rounds: int) -> tuple[dict, dict, dict]:
    """({tool: median seconds}, {tool: error line or ""}, {tool: folder}), compiles interleaved.
    A compile that exits 0 without a genai_config.json is a failure too."""
    argv = commands(hf, work)

    def compile_one(tool: str) -> tuple[float, str]:
        command, folder = argv[tool]
        shutil.rmtree(folder, ignore_errors=True)
        seconds, error = timed_process(command, cwd=work)
        if not error and not os.path.exists(os.path.join(folder, "genai_config.json")):
            error = "no genai_config.json written"
        return seconds, error

    runs = interleaved({tool: lambda tool=tool: compile_one(tool) for tool in TOOLS}, rounds)
    return ({tool: median([seconds for seconds, _ in done]) for tool, done in runs.items()},
            {tool: done[-1][1] for tool, done in runs.items()}, {tool: folder for tool, (_, folder) in argv.items()})


# ---- logits in plain ONNX Runtime --------------------------------------------------------

def genai_model(folder: str) -> dict:
    with open(os.path.join(folder, "genai_config.json")) as f:
        return json.load(f)["model"]


def disk_bytes(folder: str) -> int:
    """Bytes of every model file in ``folder`` (graphs and their weight data; configs and the
    tokenizer left out): one model.onnx + data, or a pipeline of several (mobius' Qwen3.5)."""
    total = 0
    for here, _, files in os.walk(folder):
        total += sum(os.path.getsize(os.path.join(here, f)) for f in files
                     if not f.endswith(".json") and not f.startswith("tokenizer"))
    return total


def session(folder: str, part: str, threads: int):
    return cpu_session(os.path.join(folder, genai_model(folder)[part].get("filename", "model.onnx")), threads)


def prefill_feeds(sess, ids: np.ndarray, mask: np.ndarray, head_size: int) -> dict:
    """Feeds for one prefill: the ids, the mask, positions as HF makes them (where the graph
    takes them), empty KV caches and zero conv states, whatever the tool named them (a
    symbolic past length is 0, another symbolic dim beyond the batch the head size: the
    builder's ``kv_cache_dim``)."""
    batch = len(ids)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
             "tensor(int32)": np.int32}
    out = {}
    for i in sess.get_inputs():
        if i.name == "position_ids" and len(i.shape) == 3:  # multimodal RoPE: text rows equal in all three
            out[i.name] = np.ascontiguousarray(np.broadcast_to(positions[None], (3, *positions.shape)))
            continue
        if i.name in feeds:
            out[i.name] = feeds[i.name].astype(types[i.type])
            continue
        shape = [batch if n == 0 else d if isinstance(d, int) else 0 if "past" in str(d) or d == "P" else head_size
                 for n, d in enumerate(i.shape)]
        out[i.name] = np.zeros(shape, types[i.type])
    return out


def last_logits(folder: str, ids: np.ndarray, mask: np.ndarray, threads: int) -> np.ndarray:
    """A decoder that takes ``inputs_embeds`` (a pipeline's) gets them from its embedding
    model, with no image features."""
    config = genai_model(folder)
    sess = session(folder, "decoder", threads)
    feeds = prefill_feeds(sess, ids, mask, config["decoder"]["head_size"])
    if "inputs_embeds" in feeds:
        embed = session(folder, "embedding", threads)
        extra = {i.name: np.zeros([0, *i.shape[1:]], np.float32) for i in embed.get_inputs() if i.name != "input_ids"}
        feeds["inputs_embeds"] = embed.run(["inputs_embeds"], {"input_ids": ids, **extra})[0]
    return sess.run(["logits"], feeds)[0][:, -1].astype(np.float32)


def reference(model, rows: list) -> np.ndarray:
    """transformers' last-position logits of each prompt run alone, unpadded."""
    import torch

    with torch.no_grad():
        return np.stack([model(input_ids=torch.tensor([row])).logits[0, -1].float().numpy() for row in rows])


def left_padded(rows: list) -> tuple[np.ndarray, np.ndarray]:
    width = max(len(r) for r in rows)
    ids, mask = np.zeros((len(rows), width), np.int64), np.zeros((len(rows), width), np.int64)
    for n, row in enumerate(rows):
        ids[n, width - len(row):], mask[n, width - len(row):] = row, 1
    return ids, mask


def error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def first_line(err: Exception, limit: int = 50) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0].split("Status Message: ")[-1][:limit]


def logits_errors(folder: str, want: dict, rows: list, threads: int) -> tuple[str, str]:
    """The two logits cells; ``want`` holds transformers' logits per batch (computed once)."""
    cells = []
    for key, batch in (("one", [rows[0]]), ("two", rows)):
        try:
            ids, mask = left_padded(batch)
            cells.append(f"{error(last_logits(folder, ids, mask, threads), want[key]):.1e}")
        except Exception as err:  # noqa: BLE001 - a tool's failure is a table cell
            cells.append(f"failed: {first_line(err)}")
    return cells[0], cells[1]


# ---- onnxruntime-genai ----------------------------------------------------------------------

def hf_greedy(model, prompt: list) -> list:
    import torch

    with torch.no_grad():
        return model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                              max_new_tokens=GREEDY, do_sample=False)[0, len(prompt):].tolist()


def greedy_matches(folder: str, want: list, prompt: list) -> str:
    import onnxruntime_genai as og

    genai = og.Model(folder)
    params = og.GeneratorParams(genai)
    params.set_search_options(max_length=len(prompt) + GREEDY, do_sample=False)
    generator = og.Generator(genai, params)
    generator.append_tokens(np.asarray([prompt], np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    got = list(generator.get_sequence(0))[len(prompt):]
    if got == want[:len(got)] and got:
        return "same"
    agree = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"differ from token {agree}"


def genai_failure(folder: str, prompt: np.ndarray) -> str:
    """"" when onnxruntime-genai generates two tokens from ``folder``, else the error's first line."""
    import onnxruntime_genai as og

    try:
        genai_generate(og.Model(folder), prompt, 2)
        return ""
    except Exception as err:  # noqa: BLE001 - a tool's failure is a table cell
        return "genai failed: " + first_line(err, 70)


def speeds(folders: dict, prompts: dict, rounds: int) -> tuple[dict, dict]:
    """({tool: {phase: median}}, {tool: error}): ``genai_round`` per tool, rounds interleaved;
    a prefill phase in seconds, a decode phase as the median step's seconds."""
    runs = {tool: {phase: [] for phase in PHASES} for tool in folders}
    failed = {}
    for r in range(rounds):
        for tool, folder in folders.items():
            if tool in failed:
                continue
            try:
                got = genai_round(folder, prompts, list(PHASES))
            except Exception as err:  # noqa: BLE001 - a tool's failure is a table cell
                failed[tool] = "genai failed: " + first_line(err, 70)
                continue
            for phase, value in got.items():
                runs[tool][phase].append(statistics.median(value) if isinstance(value, list) else value)
        print(f"  speed round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    return {tool: {phase: median(v) for phase, v in r.items()} for tool, r in runs.items() if tool not in failed}, \
        failed


# ---- the table --------------------------------------------------------------------------------

def measure_tool(folder: str, seconds: float, want: dict, greedy: list, rows: list, threads: int) -> dict:
    """The cells that need no speed round: compile, size, logits, greedy."""
    set_threads(folder, threads)
    unpadded, padded = logits_errors(folder, want, rows, threads)
    try:
        same = greedy_matches(folder, greedy, rows[0])
    except Exception as err:  # noqa: BLE001 - a tool's failure is a table cell
        same = f"failed: {first_line(err)}"
    return {"compile": f"{seconds:.1f} s", "size": f"{disk_bytes(folder) / 2 ** 20:.1f} MiB",
            "logits, 1 row": unpadded, "logits, left-padded 2": padded, f"genai greedy {GREEDY}": same}


def speed_cells(speed: dict) -> dict:
    return {"prefill 128": f"{speed['prefill 128'] * 1e3:.1f} ms",
            "prefill 1,024": f"{speed['prefill 1024'] * 1e3:.1f} ms",
            f"decode ({PROMPT}-token prompt)": f"{1.0 / speed['decode short']:.0f} tok/s",
            "decode at 2,048": f"{1.0 / speed['decode 2048']:.0f} tok/s"}


def ratios(speed: dict) -> list[str]:
    """irc against the builder at the same precision, where both ran."""
    lines = []
    for bits in ("fp32", "int4"):
        ours, theirs = speed.get(f"irc {bits}"), speed.get(f"builder {bits}")
        if not ours or not theirs:
            continue
        parts = [f"{label} {ours[phase] / theirs[phase]:.2f}x the builder's time"
                 for label, phase in (("prefill 128", "prefill 128"), ("prefill 1,024", "prefill 1024"))]
        parts += [f"{label} {theirs[phase] / ours[phase]:.2f}x the builder's speed"
                  for label, phase in (("decode", "decode short"), ("decode at 2,048", "decode 2048"))]
        lines.append(f"irc {bits}: " + "; ".join(parts))
    return lines


def compare(args, make_twin, title: str, prefix: str) -> None:
    """Build the twin (``make_twin(folder, quick) -> model``), compile it with every tool,
    and print the table (a tool's failure at a step is that step's cells)."""
    work = args.workdir or tempfile.mkdtemp(prefix=prefix)
    hf = os.path.join(work, "hf")
    model = make_twin(hf, args.quick)
    vocab = model.config.get_text_config().vocab_size
    compile_s, compile_errors, folders = compile_all(hf, work, args.compile_rounds)
    rng = np.random.default_rng(0)
    rows = [rng.integers(3, vocab, PROMPT).tolist(), rng.integers(3, vocab, SHORT).tolist()]
    prompts = {n: rng.integers(3, vocab, (1, n)).astype(np.int32) for n in (128, 1024, 2048)}
    want = {"one": reference(model, rows[:1]), "two": reference(model, rows)}
    greedy = hf_greedy(model, rows[0])
    table, built = {}, {}
    for tool, folder in folders.items():
        if compile_errors[tool]:
            table[tool] = {"compile": f"failed: {compile_errors[tool][:90]}"}
            continue
        built[tool] = folder
        table[tool] = measure_tool(folder, compile_s[tool], want, greedy, rows, args.threads)
    failures = {tool: genai_failure(folder, prompts[128][:, :16]) for tool, folder in built.items()}
    speed, failed = speeds({t: f for t, f in built.items() if not failures[t]}, prompts, args.rounds)
    for tool, failure in {**failures, **failed}.items():
        if failure:
            table[tool].update({column: failure if n == 0 else "-" for n, column in enumerate(COLUMNS[5:])})
    for tool, measured in speed.items():
        table[tool].update(speed_cells(measured))
    print(f"\n{title}; {args.threads} threads; medians of {args.rounds} interleaved rounds "
          f"({args.compile_rounds} for compile){' (--quick: a tiny twin, timings meaningless)' if args.quick else ''}"
          f"; logits: max |Δ| / max |ref| of the last position vs transformers (fp32); decode: {SHORT_NEW} steps "
          f"after {PROMPT} tokens, {LONG_NEW} after 2,048; irc int4 = --passes \"{IRC_INT4}\"")
    markdown_table(("metric", *TOOLS), [(column, *(table.get(tool, {}).get(column, "-") for tool in TOOLS))
                                        for column in COLUMNS])
    for line in ratios(speed):
        print(line)
    print(f"(work folder: {work})")
