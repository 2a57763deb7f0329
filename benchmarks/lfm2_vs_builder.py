"""irc's ``onnx-ort`` folder against onnxruntime-genai's builder on a small LFM2 twin (fp32,
random weights). Prints one table; asserts nothing; not run by pytest.

The twin: transformers' ``Lfm2ForCausalLM`` from a small config (d 512, 8 layers, attention
at layers 2, 5 and 7 with 8 heads over 2 KV heads of 64, LFM2's short convolution of 3 taps
elsewhere, SwiGLU MLP of 1408, vocab 32000, tied head), its weights randomised as the tests
do, saved with ``save_pretrained`` beside a word-level ``tokenizer.json`` of the twin's
vocabulary (the builder needs one). Then, per tool:

- compile: whole-process wall time of ``irc compile DIR --target onnx-ort`` and of
  ``python -m onnxruntime_genai.models.builder -i DIR -o OUT -p fp32 -e cpu`` (median of
  ``--compile-rounds``, interleaved), and the model's size on disk (model.onnx + data);
- logits: one prefill in plain ONNX Runtime with empty caches, the last position's logits
  against transformers (max |Δ| / max |ref|): one unpadded 128-token prompt, and a batch of
  two left-padded to 128 (the second prompt 96 tokens), each row held against transformers
  running it alone;
- greedy: onnxruntime-genai's 16 greedy tokens from the unpadded prompt, equal to
  transformers' or not;
- speed, in onnxruntime-genai's generate loop (2 threads; ``--rounds`` interleaved rounds,
  medians): prefill of 128 and 1,024 tokens, and decode tokens/s (64 tokens after the
  128-token prompt, 1 / the median step).

    python benchmarks/lfm2_vs_builder.py [--rounds 5] [--compile-rounds 3] [--threads 2] [--workdir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from big_checkpoint import write_tokenizer  # noqa: E402
from cpu_speed import generate  # noqa: E402
from int4_real import set_threads  # noqa: E402
from onnx_vs_peers import median, timed_process  # noqa: E402
from quantize_onnx import disk_bytes  # noqa: E402

TWIN = dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
            intermediate_size=2112, block_multiple_of=128, conv_L_cache=3, max_position_embeddings=4096,
            layer_types=["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv",
                         "full_attention"], bos_token_id=1, eos_token_id=2, pad_token_id=0)
PROMPT, SHORT, NEW, GREEDY = 128, 96, 64, 16
TOOLS = ("irc onnx-ort", "builder fp32")


# ---- set-up ----------------------------------------------------------------------------

def make_twin(folder: str):
    """The transformers twin (randomised as the tests do), saved with a tokenizer."""
    import torch  # noqa: F401
    import transformers

    from tests.frontends.test_hf_models import randomize

    config = transformers.Lfm2Config(**TWIN)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, seed=0, norm_centre=1.0)
    model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    write_tokenizer(folder, TWIN["vocab_size"])
    return model


def commands(hf: str, work: str) -> dict:
    irc = os.path.join(os.path.dirname(sys.executable), "irc")
    return {"irc onnx-ort": [irc, "compile", hf, "--target", "onnx-ort", "--context", "4096", "--quiet", "-o",
                             os.path.join(work, "irc", "model.onnx")],
            "builder fp32": [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf, "-o",
                             os.path.join(work, "builder"), "-p", "fp32", "-e", "cpu"]}


def compile_all(hf: str, work: str, rounds: int) -> tuple[dict, dict]:
    """({tool: median seconds}, {tool: error line or ""}), compiles interleaved."""
    argv, times, errors = commands(hf, work), {tool: [] for tool in TOOLS}, {}
    for _ in range(rounds):
        for tool in TOOLS:
            folder = os.path.join(work, "irc" if tool.startswith("irc") else "builder")
            shutil.rmtree(folder, ignore_errors=True)
            seconds, error = timed_process(argv[tool], cwd=work)
            times[tool].append(seconds)
            errors[tool] = error
    return {tool: median(values) for tool, values in times.items()}, errors


# ---- logits in plain ONNX Runtime --------------------------------------------------------

def session(folder: str, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.log_severity_level = 3
    return ort.InferenceSession(os.path.join(folder, "model.onnx"), options, providers=["CPUExecutionProvider"])


def prefill_feeds(sess, ids: np.ndarray, mask: np.ndarray, head_size: int) -> dict:
    """Feeds for one prefill: the ids, the mask, positions as HF makes them (where the graph
    takes them), empty KV caches and zero conv states, whatever the tool named them (a
    symbolic past length is 0, another symbolic dim beyond the batch the head size: the
    builder's ``kv_cache_dim``)."""
    batch = len(ids)
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": np.maximum(np.cumsum(mask, axis=1) - 1, 0)}
    types = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}
    out = {}
    for i in sess.get_inputs():
        if i.name in feeds:
            out[i.name] = feeds[i.name].astype(types[i.type])
            continue
        shape = [batch if n == 0 else d if isinstance(d, int) else 0 if "past" in str(d) or d == "P" else head_size
                 for n, d in enumerate(i.shape)]
        out[i.name] = np.zeros(shape, types[i.type])
    return out


def last_logits(folder: str, ids: np.ndarray, mask: np.ndarray, threads: int) -> np.ndarray:
    with open(os.path.join(folder, "genai_config.json")) as f:
        head_size = json.load(f)["model"]["decoder"]["head_size"]
    sess = session(folder, threads)
    logits = sess.run(["logits"], prefill_feeds(sess, ids, mask, head_size))[0]
    return logits[:, -1]


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


def logits_errors(folder: str, model, rows: list, threads: int) -> tuple[str, str]:
    cells = []
    for batch in ([rows[0]], rows):
        try:
            ids, mask = left_padded(batch)
            cells.append(f"{error(last_logits(folder, ids, mask, threads), reference(model, batch)):.1e}")
        except Exception as err:  # noqa: BLE001 - a tool's failure is a table cell
            cells.append(f"failed: {str(err).splitlines()[0][:40]}")
    return cells[0], cells[1]


# ---- onnxruntime-genai ----------------------------------------------------------------------

def greedy_matches(folder: str, model, prompt: list) -> str:
    import onnxruntime_genai as og
    import torch

    with torch.no_grad():
        want = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                              max_new_tokens=GREEDY, do_sample=False)[0, len(prompt):].tolist()
    genai = og.Model(folder)
    params = og.GeneratorParams(genai)
    params.set_search_options(max_length=len(prompt) + GREEDY, do_sample=False)
    generator = og.Generator(genai, params)
    generator.append_tokens(np.asarray([prompt], np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    got = list(generator.get_sequence(0))[len(prompt):]
    return "same" if got == want[:len(got)] and got else "differ"


def speeds(folders: dict, prompts: dict, rounds: int) -> dict:
    """{tool: {"prefill 128": s, "prefill 1024": s, "decode": tokens/s}}, rounds interleaved."""
    import gc

    import onnxruntime_genai as og

    runs = {tool: {"prefill 128": [], "prefill 1024": [], "decode": []} for tool in folders}
    for _ in range(rounds):
        for tool, folder in folders.items():
            genai = og.Model(folder)
            generate(genai, prompts[128][:, :16], 2)  # warm-up
            prefill, steps = generate(genai, prompts[128], NEW)
            runs[tool]["prefill 128"].append(prefill)
            runs[tool]["decode"].append(median(steps))
            runs[tool]["prefill 1024"].append(generate(genai, prompts[1024], 1)[0])
            del genai
            gc.collect()
    return {tool: {"prefill 128": median(r["prefill 128"]), "prefill 1024": median(r["prefill 1024"]),
                   "decode": 1.0 / median(r["decode"])} for tool, r in runs.items()}


# ---- the table --------------------------------------------------------------------------------

COLUMNS = ["compile", "size", "logits, 1 row", "logits, left-padded 2", f"genai greedy {GREEDY}", "prefill 128",
           "prefill 1,024", "decode"]


def arguments(description: str):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved speed rounds")
    parser.add_argument("--compile-rounds", type=int, default=3, help="interleaved compile rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    return parser.parse_args()


def genai_failure(folder: str, prompt: np.ndarray) -> str:
    """"" when onnxruntime-genai generates two tokens from ``folder``, else the error's first line."""
    import onnxruntime_genai as og

    try:
        generate(og.Model(folder), prompt, 2)
        return ""
    except Exception as err:  # noqa: BLE001 - a tool's failure is a table cell
        return "genai failed: " + str(err).splitlines()[0].split("Status Message: ")[-1][:70]


def compare(args, make_twin, vocab: int, title: str, prefix: str) -> None:
    """Build the twin (``make_twin(folder) -> model``), compile it with both tools, and print
    the table: compile time, size, logits against transformers, genai's greedy tokens,
    prefill and decode (a tool genai cannot run gets its error in those cells)."""
    work = args.workdir or tempfile.mkdtemp(prefix=prefix)
    hf = os.path.join(work, "hf")
    model = make_twin(hf)
    compile_s, compile_errors = compile_all(hf, work, args.compile_rounds)
    folders = {"irc onnx-ort": os.path.join(work, "irc"), "builder fp32": os.path.join(work, "builder")}
    rng = np.random.default_rng(0)
    rows = [rng.integers(3, vocab, PROMPT).tolist(), rng.integers(3, vocab, SHORT).tolist()]
    prompts = {n: rng.integers(3, vocab, (1, n)).astype(np.int32) for n in (128, 1024)}
    table, built = {}, {}
    for tool, folder in folders.items():
        if compile_errors[tool]:
            table[tool] = {"compile": f"failed: {compile_errors[tool]}"}
            continue
        set_threads(folder, args.threads)
        built[tool] = folder
        unpadded, padded = logits_errors(folder, model, rows, args.threads)
        try:
            greedy = greedy_matches(folder, model, rows[0])
        except Exception as err:  # noqa: BLE001 - a tool's failure is a table cell
            greedy = f"failed: {str(err).splitlines()[0][:40]}"
        table[tool] = {"compile": f"{compile_s[tool]:.1f} s", "size": f"{disk_bytes(folder) / 2 ** 20:.1f} MiB",
                       "logits, 1 row": unpadded, "logits, left-padded 2": padded, f"genai greedy {GREEDY}": greedy}
    failures = {tool: genai_failure(folder, prompts[128][:, :16]) for tool, folder in built.items()}
    for tool, failure in failures.items():
        if failure:
            table[tool].update({"prefill 128": failure, "prefill 1,024": "-", "decode": "-"})
    for tool, speed in speeds({t: f for t, f in built.items() if not failures[t]}, prompts, args.rounds).items():
        table[tool].update({"prefill 128": f"{speed['prefill 128'] * 1e3:.1f} ms",
                            "prefill 1,024": f"{speed['prefill 1024'] * 1e3:.1f} ms",
                            "decode": f"{speed['decode']:.0f} tok/s"})
    print(f"\n{title}, fp32, {args.threads} threads; medians of {args.rounds} interleaved rounds "
          f"({args.compile_rounds} for compile); logits: max |Δ| / max |ref| of the last position vs transformers")
    print("| metric | " + " | ".join(TOOLS) + " |")
    print("|---|" + "---|" * len(TOOLS))
    for column in COLUMNS:
        print(f"| {column} | " + " | ".join(table.get(tool, {}).get(column, "-") for tool in TOOLS) + " |")
    if len(built) == 2 and not any(failures.values()):
        parts = []
        for phase in ("prefill 128", "prefill 1,024", "decode"):
            ours, theirs = (float(table[t][phase].split()[0]) for t in TOOLS)
            parts.append(f"{phase} {ours / theirs:.2f}x the builder's {'speed' if phase == 'decode' else 'time'}")
        print("irc: " + "; ".join(parts))
    print(f"(work folder: {work})")


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    title = (f"LFM2 twin (d {TWIN['hidden_size']}, {TWIN['num_hidden_layers']} layers: "
             f"{TWIN['layer_types'].count('full_attention')} attention, {TWIN['layer_types'].count('conv')} short "
             f"conv; vocab {TWIN['vocab_size']})")
    compare(args, make_twin, TWIN["vocab_size"], title, "irc-lfm2-bench-")


if __name__ == "__main__":
    main()
