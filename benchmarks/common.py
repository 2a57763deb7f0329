"""What the benchmark scripts share, so each script holds only what it measures.

- paths: ``ROOT`` (the repository, put first on ``sys.path`` on import, so a script that
  imports this module imports ``irc``, ``frontends``, ... next);
- statistics and timing: ``median`` (NaN-free), ``seconds`` (one call), ``median_seconds``
  (warm-up, then the median of repeated calls), ``interleaved`` (every candidate once a
  round, A B C A B C ...: the host's cores are shared and noisy, so a slow stretch hits all
  candidates alike), ``timed_process`` (a whole process's wall time);
- model folders: ``work_folder``, ``SMALL`` / ``make_hf_folder`` (a small random Llama with
  a word-level tokenizer), ``write_tokenizer``, ``compile_graph`` (passes, then emit to a
  file), ``disk_bytes``, ``set_threads`` (genai_config.json);
- drivers: ``cpu_session`` (plain ONNX Runtime), ``ort_run`` (greedy prefill + decode with the
  genai signature), ``genai_generate`` / ``genai_round`` (onnxruntime-genai's generate loop),
  ``GenaiStepper`` / ``TorchStepper`` / ``timed_rounds`` (prefill and decode steps of models
  loaded afresh each round);
- tables: ``text_table`` (aligned columns), ``markdown_table`` (aligned or plain markdown),
  ``verdict`` (a logits error as a table cell).

Scripts import it by bare name (``from common import ...``: ``benchmarks/``, the script's
folder, is first on ``sys.path``). A script imports no other script: only this module, a
family's harness (``builder_compare``, ``int4_builds``, ``vlm_cells``) and the model
preparers (``real_*.py``).
"""
from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PROMPT, NEW = 128, 64  # the prompt and decode lengths of the decode-speed tables
SHORT_NEW, LONG_NEW = 16, 8  # genai_round's decode steps after 128 and after 2,048 tokens
TOLERANCE = 1e-4  # the largest relative logits error a cell calls exact


# ---- statistics and timing ---------------------------------------------------------------------

def median(values) -> float:
    """The median of ``values`` with NaNs (failed runs) left out; NaN when none is left."""
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def seconds(run) -> float:
    """Wall seconds (``time.perf_counter``) of one call of ``run()``."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def median_seconds(run, repeat: int, warmup: int = 1) -> float:
    """Median wall seconds (``time.perf_counter``) of ``repeat`` calls of ``run()``, after
    ``warmup`` untimed calls (a session's first run allocates)."""
    for _ in range(warmup):
        run()
    return statistics.median([seconds(run) for _ in range(repeat)])


def interleaved(candidates: dict, rounds: int, progress: str = "") -> dict:
    """{name: [one ``candidates[name]()`` result per round]}: each round calls every candidate
    once, in order (A B C A B C ...), so a noisy stretch of the shared host lands on all of
    them; ``progress`` prints "<progress>round i/n done" to stderr after each round."""
    results = {name: [] for name in candidates}
    for round_ in range(rounds):
        for name in candidates:
            results[name].append(candidates[name]())
        if progress:
            print(f"{progress}round {round_ + 1}/{rounds} done", file=sys.stderr, flush=True)
    return results


def timed_process(argv: list, cwd: str) -> tuple[float, str]:
    """(wall seconds, "") of one whole process (start-up and imports included), or (NaN, the
    last line of its stderr) when it exits non-zero."""
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        return float("nan"), (done.stderr.strip().splitlines() or ["failed"])[-1][:100]
    return seconds, ""


# ---- model folders ------------------------------------------------------------------------------

SMALL = dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=1408, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def work_folder(workdir: str | None, prefix: str) -> str:
    """``workdir`` (made when missing), else a new temporary folder named ``prefix``...; printed,
    and kept: the compiled models stay there to inspect."""
    import tempfile

    work = workdir or tempfile.mkdtemp(prefix=prefix)
    os.makedirs(work, exist_ok=True)
    print(f"work directory: {work}")
    return work


def write_tokenizer(folder: str, vocab: int) -> None:
    """A word-level tokenizer over ``vocab`` tokens ``t0``..``t{vocab-1}`` (tokenizer.json +
    tokenizer_config.json): what the builder needs to find and genai to run."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "t1", "eos_token": "t2",
                   "pad_token": "t0", "unk_token": "t0"}, f)


def make_hf_folder(directory: str):
    """The small Llama (``SMALL``: d 512, 8 layers, vocab 32000) with seeded random weights,
    saved to ``directory`` with a word-level tokenizer; returns the transformers model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMALL)).eval()
    model.save_pretrained(directory)
    write_tokenizer(directory, SMALL["vocab_size"])
    return model


def compile_graph(graph, path: str, pipeline: str, **emit):
    """Run ``pipeline`` (pass-pipeline text) over ``graph`` in place, then emit it to ``path``
    (``backends.onnx.emit.emit_model`` with ``emit``'s keywords); returns the emit result."""
    import passes  # noqa: F401  (registers the passes)
    from backends.onnx.emit import emit_model
    from irc.passmanager import PassManager, parse_pipeline

    PassManager(parse_pipeline(pipeline)).run(graph)
    return emit_model(graph, path, **emit)


def disk_bytes(directory: str) -> int:
    """Bytes on disk of ``directory``/model.onnx plus the external data files it references."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors

    path = os.path.join(directory, "model.onnx")
    model = onnx.load(path, load_external_data=False)
    files = {e.value for t in _get_all_tensors(model) for e in t.external_data if e.key == "location"}
    return os.path.getsize(path) + sum(os.path.getsize(os.path.join(directory, f)) for f in files)


def set_threads(folder: str, threads: int, inter_op: int | None = 1) -> None:
    """Set the decoder's intra-op threads in ``folder``/genai_config.json (and its inter-op
    threads, unless ``inter_op`` is None): one genai_config edit for every benchmark."""
    path = os.path.join(folder, "genai_config.json")
    with open(path) as f:
        config = json.load(f)
    options = config["model"]["decoder"].setdefault("session_options", {})
    options["intra_op_num_threads"] = threads
    if inter_op is not None:
        options["inter_op_num_threads"] = inter_op
    with open(path, "w") as f:
        json.dump(config, f, indent=4)


# ---- drivers --------------------------------------------------------------------------------------

def cpu_session(path: str, threads: int, config: dict | None = None):
    """An ONNX Runtime CPU session: ``threads`` intra-op threads, one inter-op, warnings off,
    ``config`` as session config entries (e.g. ``session.qdq_matmulnbits_accuracy_level``)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.log_severity_level = 3
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def ort_run(engine, caches: dict, prompt: np.ndarray, new: int) -> tuple[float, list, np.ndarray]:
    """(prefill seconds, seconds of each of ``new`` greedy decode steps, prefill logits) driving
    ``engine`` (feeds -> outputs) with the genai signature (position_ids reach the models that
    take them); a step's time includes picking its token."""
    feeds = {"input_ids": prompt, "attention_mask": np.ones_like(prompt), **caches,
             "position_ids": np.arange(prompt.shape[1], dtype=np.int64)[None]}
    start = time.perf_counter()
    out = engine(feeds)
    prefill = time.perf_counter() - start
    logits = out["logits"]
    total, steps = prompt.shape[1], []
    for _ in range(new):
        start = time.perf_counter()
        token = np.argmax(out["logits"][:, -1], axis=-1)[:, None].astype(np.int64)
        total += 1
        feeds = {"input_ids": token, "attention_mask": np.ones((1, total), np.int64),
                 "position_ids": np.array([[total - 1]], np.int64),
                 **{k: out["present." + k[len("past_key_values."):]] for k in caches}}
        out = engine(feeds)
        steps.append(time.perf_counter() - start)
    return prefill, steps, logits


def genai_generate(model, prompt: np.ndarray, new: int) -> tuple[float, list]:
    """(prefill seconds, seconds of each of ``new`` decode steps) through onnxruntime-genai's
    greedy generate loop on a loaded ``og.Model``."""
    stepper = GenaiStepper(model, new)
    prefill = stepper.start(prompt)
    return prefill, [stepper.step() for _ in range(new)]


def genai_round(folder: str, prompts: dict, phases: list, short_new: int = SHORT_NEW,
                long_new: int = LONG_NEW) -> dict:
    """{phase: seconds (a prefill) or [step seconds] (a decode)} for one fresh load of
    ``folder`` (a warm-up first, the model dropped after): "prefill 128" and "decode short"
    (``short_new`` steps) after ``prompts[128]``, "prefill 1024", "decode 2048" (``long_new``)."""
    import onnxruntime_genai as og

    model = og.Model(folder)
    genai_generate(model, prompts[128][:, :16], 2)  # warm-up
    got = {}
    if "prefill 128" in phases or "decode short" in phases:
        got["prefill 128"], got["decode short"] = genai_generate(model, prompts[128], short_new)
    if "prefill 1024" in phases:
        got["prefill 1024"] = genai_generate(model, prompts[1024], 1)[0]
    if "decode 2048" in phases:
        got["decode 2048"] = genai_generate(model, prompts[2048], long_new)[1]
    del model
    gc.collect()
    return got


class GenaiStepper:
    """onnxruntime-genai's generate loop, one call at a time: ``start`` appends the prompt
    (the prefill), ``step`` generates one token; each returns its seconds."""

    def __init__(self, model, new: int = NEW):
        self.model, self.new, self.generator = model, new, None

    def start(self, prompt: np.ndarray) -> float:
        import onnxruntime_genai as og

        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=prompt.shape[1] + self.new + 1, do_sample=False)
        self.generator = og.Generator(self.model, params)
        begin = time.perf_counter()
        self.generator.append_tokens(prompt.astype(np.int32))
        return time.perf_counter() - begin

    def step(self) -> float:
        begin = time.perf_counter()
        self.generator.generate_next_token()
        return time.perf_counter() - begin


class TorchStepper:
    """transformers eager with its KV cache (``cache`` in transformers 5.x), greedy, one
    forward at a time; ``start`` and ``step`` return their seconds."""

    def __init__(self, model):
        import inspect

        self.model, self.out = model, None
        self.keyword = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def start(self, prompt: np.ndarray) -> float:
        import torch

        with torch.inference_mode():
            begin = time.perf_counter()
            self.out = self.model(torch.from_numpy(prompt), use_cache=True)
            return time.perf_counter() - begin

    def step(self) -> float:
        import torch

        with torch.inference_mode():
            begin = time.perf_counter()
            token = self.out.logits[:, -1].argmax(-1, keepdim=True)
            past = getattr(self.out, "cache", None) or self.out.past_key_values
            self.out = self.model(token, use_cache=True, **{self.keyword: past})
            return time.perf_counter() - begin


def timed_rounds(open_stepper, names: list, prompt: np.ndarray, rounds: int, new: int = NEW) -> dict:
    """{name: (prefill seconds per round, decode step seconds)}: every round runs each name
    in turn (A B C ... A B C ...), ``open_stepper(name)`` -> (stepper, model) loading it
    afresh, dropped after its run, so no idle session's spinning thread pool competes with
    the one being timed; a warm-up prefill and 4 steps first (a session's first run allocates),
    then one prefill and ``new`` steps."""
    timings = {name: ([], []) for name in names}
    for _ in range(rounds):
        for name in names:
            stepper, model = open_stepper(name)
            stepper.start(prompt)
            for _ in range(4):
                stepper.step()
            timings[name][0].append(stepper.start(prompt))
            timings[name][1].extend(stepper.step() for _ in range(new))
            del stepper, model
            gc.collect()
    return timings


# ---- tables -----------------------------------------------------------------------------------------

def _widths(header, rows) -> list:
    return [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]


def text_table(header, rows, left: int = 1) -> None:
    """Print ``header`` and ``rows`` as columns two spaces apart, each as wide as its widest
    cell: the first ``left`` columns left-aligned, the rest right-aligned (numbers)."""
    widths = _widths(header, rows)
    for row in [header, *rows]:
        print("  ".join(str(v).ljust(w) if i < left else str(v).rjust(w)
                        for i, (v, w) in enumerate(zip(row, widths))))


def markdown_table(header, rows, left: int | None = None) -> None:
    """Print a markdown table. ``left`` None: plain (``| a | b |`` and ``|---|---|``); a number:
    padded to the widest cell, the first ``left`` columns left-aligned, the rest right-aligned."""
    if left is None:
        print("| " + " | ".join(str(h) for h in header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(str(v) for v in row) + " |")
        return
    widths = _widths(header, rows)
    print("| " + " | ".join(str(h).ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(str(v).ljust(w) if i < left else str(v).rjust(w)
                                for i, (v, w) in enumerate(zip(row, widths))) + " |")


def verdict(error: float, same_tokens: bool = True) -> str:
    """A logits cell: "exact" (relative error <= ``TOLERANCE`` and the same greedy tokens),
    else "wrong (error[, tokens])"."""
    return "exact" if error <= TOLERANCE and same_tokens else f"wrong ({error:.1e}{'' if same_tokens else ', tokens'})"
