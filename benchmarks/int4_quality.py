"""Which int4 method should irc default to: a quality harness over what users see, on three
real models no one here wrote (issue 28, item 2). Prints one table; never asserts.

Models (prepared by their benchmark modules, float32 Hugging Face folders): SmolLM2-135M-
Instruct (``real_model``), Gemma-3-270M (``real_gemma3``), Qwen2.5-Coder-0.5B-Instruct
(``real_qwen_coder``). Per model, rows:

- ``irc fp32``, the reference: ``irc compile HF --target onnx-ort --logits all``. It is
  checked against transformers (eager, float32) on the first 2 plain and 2 chat prompts
  (16 greedy tokens) and on the first text's perplexity, printed above the table;
- ``irc M g32`` for every method M in ``METHODS``: ``--passes "lower-mlp,quantize{bits=4,
  group=32,embeddings=true,method=M},dce"`` (imatrix, gptq and awq add ``calibration=CALIBRATION,
  tokenizer=HF/tokenizer.json``; a ``calibration_chat=true`` row where the folder has no chat
  template calibrates with a copy of its tokenizer beside ``FIXED_TEMPLATE``, ``chat_tokenizer``),
  MatMulNBits at the target's default accuracy level (printed); a method that fails to
  compile or to run is "not available" with its error;
- ``builder int4``: ``python -m onnxruntime_genai.models.builder -i HF -o OUT -p int4 -e cpu``;
- for the best irc method (the one passing the verdict with the lowest mean perplexity,
  else the lowest mean perplexity), group 64 and 128, and a copy of its g32 model at
  ``accuracy_level`` 0 (same codes, ``int4_builds.with_level``).

Every model is compiled with ``--logits all`` (logits [B, T, V]) so one prefill scores a
whole text; onnxruntime-genai's generate loop reads the last position, so greedy decoding
sees what the default ``--logits last`` gives, up to float rounding in the head's MatMul.

Columns, all measured afresh on every run (only compiled models are cached):

- MB: model.onnx and its external data on disk;
- ppl A, ppl B: perplexity over the first ``EVAL_TOKENS`` tokens of each of ``EVAL_TEXTS``
  (two seed texts other than the calibration text), one plain ONNX Runtime prefill each;
- top-1: over both texts' positions, the fraction whose argmax equals fp32's;
- greedy: of the 32 prompts in ``prompts_int4.json`` (16 plain texts, tokenized as they are;
  16 chat requests, one user turn rendered with the folder's chat template through jinja2,
  or ``FIXED_TEMPLATE`` where the folder has none (Gemma-3-270M's), generation prompt on,
  tokenized without added special tokens), how many give the same
  first ``NEW_TOKENS`` greedy tokens as fp32; greedy is onnxruntime-genai's generator
  (``do_sample=False``), one loop for irc's and the builder's models, each output cut after
  its first end-of-sequence token (the HF config's ``eos_token_id`` or one of ``END_TOKENS``,
  so a loop that stops at a turn's end and one that runs on compare alike);
- prefix: the mean count of leading output tokens equal to fp32's (fp32's own value is the
  ceiling: outputs that end early are shorter), a softer view; not part of the verdict;
- degen: how many of the 32 outputs are degenerate, and in brackets how many of those are
  prompts whose fp32 output is not. An output (its tokens up to ``NEW_TOKENS``) is
  degenerate when one token id fills ``REPEAT_RUN`` or more consecutive positions, or when
  its decoded text holds a run of ``DIGIT_RUN`` or more consecutive decimal digits
  (" 11000000000000000000000" is both).

Verdict, per model: the irc methods (g32) that are no worse than the builder on every
column (MB <= 1.05x the builder's, each perplexity <=, top-1 >=, greedy >=) and never
degenerate where fp32 is not (0 in brackets).

Default verdict (issue 44: quality at the same bytes), per model: the rows whose greedy is
above the builder's, that never degenerate where fp32 is not, at <= ``BYTES_RATIO`` (1.10)
times the builder's MB, <= 1.00x where the builder keeps the embedding table float
(``builder_table_float``: a float initializer of vocabulary rows in its model). The "x bld"
column is MB over the builder's. Where the builder fails (Gemma-3: its rope config), ``irc ort
g32`` stands in for it: the builder's own codes (``passes.quantize_ort``) at the same layout. The rows of a mixed-precision recipe are methods with
options, ``--methods ort:mixed=q4_k_m`` ("irc ort:mixed=q4_k_m g32").

ORT sessions use ``--threads`` intra-op threads and are loaded one at a time; each model's
evaluation holds ``flock(LOCK)`` so timing jobs elsewhere are not disturbed. Compiled models
live under ``--workdir`` in a folder named by a digest of the command line; a folder is
complete when its ``.done`` file exists (the command and its seconds). An edited quantizer
is not noticed: ``--rebuild`` names rows to compile afresh (``int4``: every irc int4 row).

    python benchmarks/int4_quality.py [--models smollm2,gemma3,qwen-coder] [--workdir DIR]
        [--methods rtn,ort,mse,imatrix,gptq,awq,ort:mixed=q4_k_m] [--threads 2] [--rebuild irc-gptq-g32,...]
        [--no-extra] [--compile-only] [--only 'irc gptq g32,irc ort g32'] [--report-only]
"""
from __future__ import annotations

import argparse
import fcntl
import gc
import json
import os
import re
import shutil
import sys
import time

import numpy as np

from common import ROOT, disk_bytes, set_threads
from int4_builds import build, irc_argv, ort_logits, prepare_model, with_level

HERE = os.path.dirname(os.path.abspath(__file__))

SEEDS = os.path.join(os.path.dirname(ROOT), "shared", "seeds")
EVAL_TEXTS = (os.path.join(SEEDS, "001_03b3848d8222c4ff.txt"), os.path.join(SEEDS, "004_966d6c578af5acc0.txt"))
EVAL_TOKENS, NEW_TOKENS, REPEAT_RUN, DIGIT_RUN = 512, 16, 8, 10
BYTES_RATIO = 1.10  # the default verdict's byte allowance over the builder (1.00 where it keeps the table float)
METHODS = ("rtn", "ort", "mse", "imatrix", "gptq", "awq", "ort:mixed=q4_k_m")
PROMPTS = os.path.join(HERE, "prompts_int4.json")
LOCK = "/tmp/bench.lock"
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<eos>")  # an output ends after the first
FIXED_CHAT = {  # where jinja2 is missing: each model's own layout, by hand
    "smollm2": "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
               "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
    "gemma3": "<bos><start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n",
    "qwen-coder": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                  "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
}

# a model's layout as jinja where its folder has no template (Gemma-3-270M's, prepared from a GGUF
# that carries none): its chat prompts render it, and calibration_chat rows calibrate with a copy
# of its tokenizer beside it as chat_template.jinja (chat_tokenizer)
FIXED_TEMPLATE = {
    "gemma3": "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' "
              "else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
              "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
}


def slug(method: str) -> str:
    """A row's folder-name part: ``ort:symmetric=false`` -> ``ort-symmetric-false``."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", method)


def builder_argv(hf: str, out: str) -> list:
    return [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", hf, "-o", out, "-p", "int4", "-e", "cpu",
            "-c", out + ".cache"]


def load_prompts(hf: str, model: str) -> tuple:
    """([token ids] of the 32 prompts, how the chat prompts were rendered)."""
    from tokenizers import Tokenizer

    with open(PROMPTS, encoding="utf-8") as f:
        prompts = json.load(f)
    tokenizer = Tokenizer.from_file(os.path.join(hf, "tokenizer.json"))
    render, how = chat_renderer(hf, model)
    ids = [tokenizer.encode(text).ids for text in prompts["plain"]]
    ids += [tokenizer.encode(render(text), add_special_tokens=False).ids for text in prompts["chat"]]
    return ids, how


def chat_renderer(hf: str, model: str) -> tuple:
    """(function from a user message to the rendered chat text, a word on how): the folder's
    template through ``irc.chat`` (as ``irc run --chat`` renders it), else ``FIXED_TEMPLATE``
    (the template ``calibration_chat`` rows calibrate with), else ``FIXED_CHAT``."""
    from irc.chat import TOKENIZER_CONFIG, read_config, renderer, template_of

    config = read_config(os.path.join(hf, TOKENIZER_CONFIG))
    source, how = template_of(config, hf), "the folder's chat template (jinja2)"
    if not source and model in FIXED_TEMPLATE:
        source, how = FIXED_TEMPLATE[model], "FIXED_TEMPLATE (no chat template in the folder)"
    try:
        import jinja2  # noqa: F401
    except ImportError:
        return FIXED_CHAT[model].format, "fixed format (jinja2 missing)"
    if not source:
        return FIXED_CHAT[model].format, "fixed format (no chat template in the folder)"
    conversation = renderer(source, config, hf, "chat prompts")
    return (lambda text: conversation([{"role": "user", "content": text}], True)), how


def chat_tokenizer(hf: str, model: str, work: str) -> str:
    """The tokenizer.json that ``calibration_chat`` rows calibrate with: the folder's own when
    it has a chat template (or no ``FIXED_TEMPLATE`` stands in), else a copy in ``work``
    beside a chat_template.jinja holding ``FIXED_TEMPLATE[model]``."""
    from irc.chat import CHAT_TEMPLATE, TOKENIZER_CONFIG, read_config, template_of

    if template_of(read_config(os.path.join(hf, TOKENIZER_CONFIG)), hf) or model not in FIXED_TEMPLATE:
        return os.path.join(hf, "tokenizer.json")
    folder = os.path.join(work, "chat-tokenizer")
    os.makedirs(folder, exist_ok=True)
    for name in ("tokenizer.json", TOKENIZER_CONFIG):
        shutil.copyfile(os.path.join(hf, name), os.path.join(folder, name))
    with open(os.path.join(folder, CHAT_TEMPLATE), "w", encoding="utf-8") as f:
        f.write(FIXED_TEMPLATE[model])
    return os.path.join(folder, "tokenizer.json")


def eos_ids(hf: str, tokenizer) -> set:
    """The config's ``eos_token_id`` and whichever of ``END_TOKENS`` the vocabulary holds."""
    with open(os.path.join(hf, "config.json")) as f:
        eos = json.load(f).get("eos_token_id")
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return ids | {tokenizer.token_to_id(t) for t in END_TOKENS if tokenizer.token_to_id(t) is not None}


def cut(tokens: list, eos: set) -> list:
    """``tokens`` up to and including the first end-of-sequence token."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[:i + 1]
    return tokens


def degenerate(tokens: list, decode) -> bool:
    """One token id in ``REPEAT_RUN`` consecutive positions, or ``DIGIT_RUN`` digits in a row."""
    run = longest = 0
    for i, token in enumerate(tokens):
        run = run + 1 if i and token == tokens[i - 1] else 1
        longest = max(longest, run)
    return longest >= REPEAT_RUN or re.search(r"\d{%d}" % DIGIT_RUN, decode(tokens)) is not None


def greedy(folder: str, prompts: list, eos: set) -> list:
    """The first ``NEW_TOKENS`` greedy tokens of each prompt through onnxruntime-genai."""
    import onnxruntime_genai as og

    model = og.Model(folder)
    outputs = []
    for ids in prompts:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(ids) + NEW_TOKENS, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(np.asarray([ids], np.int32))
        tokens = []
        while len(tokens) < NEW_TOKENS and not generator.is_done():
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
        outputs.append(cut(tokens, eos))
        del generator, params
    del model
    gc.collect()
    return outputs


def score(folder: str, data: dict, reference: dict | None, threads: int) -> dict:
    """Every column of one row (module docstring); ``reference`` is fp32's score (None: this is it)."""
    from irc.evaluate import next_token_nll, perplexity

    set_threads(folder, threads)
    row = {"MB": disk_bytes(folder) / 1e6, "ppl": [], "top": []}
    for ids in data["texts"]:
        logits = ort_logits(folder, ids, threads, data["head_dim"])
        row["ppl"].append(perplexity(next_token_nll(logits, ids)))
        row["top"].append(logits[:-1].argmax(axis=-1))
        del logits
        gc.collect()
    row["outputs"] = greedy(folder, data["prompts"], data["eos"])
    row["degenerate"] = [degenerate(out, data["decode"]) for out in row["outputs"]]
    reference = reference or row
    row["top1"] = float(np.mean(np.concatenate([a == b for a, b in zip(row["top"], reference["top"])])))
    row["greedy"] = sum(a == b for a, b in zip(row["outputs"], reference["outputs"]))
    row["prefix"] = float(np.mean([common_prefix(a, b) for a, b in zip(row["outputs"], reference["outputs"])]))
    row["new_degenerate"] = sum(d and not r for d, r in zip(row["degenerate"], reference["degenerate"]))
    return row


def common_prefix(a: list, b: list) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def level_of(folder: str) -> str:
    """The accuracy_level(s) of the model's MatMulNBits nodes, as text."""
    import onnx

    model = onnx.load(os.path.join(folder, "model.onnx"), load_external_data=False)
    levels = {next((a.i for a in n.attribute if a.name == "accuracy_level"), 0)
              for n in model.graph.node if n.op_type == "MatMulNBits"}
    return ",".join(str(v) for v in sorted(levels)) or "-"


class Locked:
    """``flock(LOCK)`` held for the ``with`` block (the same lock as ``flock /tmp/bench.lock``)."""

    def __enter__(self):
        self.file = open(LOCK, "a")
        fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def model_data(hf: str, model: str) -> dict:
    """What every row of one model is measured on: texts, prompts, EOS ids, decoder, head dim."""
    from real_model import eval_tokens
    from tokenizers import Tokenizer

    with open(os.path.join(hf, "config.json")) as f:
        config = json.load(f)
    prompts, how = load_prompts(hf, model)
    tokenizer = Tokenizer.from_file(os.path.join(hf, "tokenizer.json"))
    return {"texts": [eval_tokens(hf, path, EVAL_TOKENS) for path in EVAL_TEXTS], "prompts": prompts,
            "chat": how, "eos": eos_ids(hf, tokenizer), "decode": tokenizer.decode,
            "head_dim": config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]}


def evaluate(rows: dict, data: dict, threads: int, reference: dict | None) -> dict:
    """{row: score or {"note": why not}}; the first row scored is the reference unless given."""
    scores = {}
    for name, (folder, note) in rows.items():
        if folder is None:
            scores[name] = {"note": note}
        else:
            try:
                scores[name] = score(folder, data, reference, threads)
            except Exception as err:  # a model ORT or genai refuses is a row of the table, not the end of the run
                scores[name] = {"note": f"{type(err).__name__}: {str(err).splitlines()[0][:140] if str(err) else ''}"}
        if reference is None and "note" not in scores[name]:
            reference = scores[name]
        print(f"  scored {name}: {summary(scores[name])}", flush=True)
    return scores


def transformers_check(hf: str, data: dict, fp32: dict, threads: int) -> str:
    """How irc's fp32 compares with transformers eager (greedy on 4 prompts, perplexity of text A)."""
    import torch
    from irc.evaluate import next_token_nll, perplexity
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    picks = (0, 1, 16, 17)
    same = 0
    with torch.inference_mode():
        for index in picks:
            ids = torch.tensor([data["prompts"][index]])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 pad_token_id=next(iter(data["eos"]), 0))
            same += cut(out[0, ids.shape[1]:].tolist(), data["eos"]) == fp32["outputs"][index]
        text = data["texts"][0]
        ppl = perplexity(next_token_nll(model(torch.tensor([text])).logits[0].float().numpy(), text))
    del model
    gc.collect()
    return (f"transformers fp32 vs irc fp32: greedy {same}/{len(picks)} prompts equal (prompts {picks}); "
            f"ppl A {ppl:.3f} vs {fp32['ppl'][0]:.3f}")


def summary(row: dict) -> str:
    when = f"  (from the run of {row['measured']})" if row.get("earlier") else ""
    if "note" in row:
        return f"not available: {row['note']}{when}"
    degen = f"{sum(row['degenerate'])} ({row['new_degenerate']})"
    return (f"{row['MB']:8.1f} {row['ppl'][0]:8.2f} {row['ppl'][1]:8.2f} {row['top1']:7.1%} "
            f"{row['greedy']:4d}/{len(row['outputs'])} {row['prefix']:6.1f} {degen:>8}{when}")


def no_worse(row: dict, builder: dict) -> bool:
    """The verdict's test (module docstring) of one row against the builder's."""
    if "note" in row or "note" in builder:
        return False
    return (row["MB"] <= 1.05 * builder["MB"] and all(a <= b for a, b in zip(row["ppl"], builder["ppl"]))
            and row["top1"] >= builder["top1"] and row["greedy"] >= builder["greedy"] and row["new_degenerate"] == 0)


def builder_table_float(folder: str, vocab: int, hidden: int) -> bool:
    """Whether the builder's model holds a float [vocab, hidden] initializer (its table kept float)."""
    import onnx

    model = onnx.load(os.path.join(folder, "model.onnx"), load_external_data=False)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    return any(i.data_type in floats and sorted(i.dims) == sorted([vocab, hidden]) for i in model.graph.initializer)


def meets_default(row: dict, builder: dict, table_float: bool) -> bool:
    """The default verdict (module docstring) of one row against the builder's."""
    if "note" in row or "note" in builder:
        return False
    limit = 1.0 if table_float else BYTES_RATIO
    return row["greedy"] > builder["greedy"] and row["new_degenerate"] == 0 and row["MB"] <= limit * builder["MB"]


def best_method(scores: dict, methods: list) -> str | None:
    """The method passing the verdict with the lowest mean perplexity, else the lowest mean perplexity."""
    rows = {m: scores[f"irc {m} g32"] for m in methods if "note" not in scores.get(f"irc {m} g32", {"note": ""})}
    if not rows:
        return None
    passing = [m for m in rows if no_worse(rows[m], scores["builder int4"])] or list(rows)
    return min(passing, key=lambda m: float(np.mean(rows[m]["ppl"])))


def run_model(model: str, args, rebuild: set) -> dict:
    """Compile (cached), then score under the lock: the main rows, then the best method's extras.
    With ``args.only`` (and a saved last run), just those rows are compiled and scored against
    the saved fp32 reference; every other row is the saved one, marked with its time."""
    hf = prepare_model(model)
    work = os.path.join(args.workdir, model)
    data = model_data(hf, model)
    print(f"\n{model}: {hf}; chat prompts: {data['chat']}; work dir {work}", flush=True)
    jobs = {"irc fp32": ("irc-fp32", lambda out: irc_argv(hf, out), False)}
    chat = chat_tokenizer(hf, model, work) if any("calibration_chat" in m for m in args.methods) else None

    def tokenizer_of(method: str):  # calibration_chat rows: a folder with a chat template
        return chat if "calibration_chat" in method else None
    for method in args.methods:
        jobs[f"irc {method} g32"] = (f"irc-{slug(method)}-g32",
                                     lambda out, m=method: irc_argv(hf, out, m, tokenizer=tokenizer_of(m)), True)
    jobs["builder int4"] = ("builder-int4", lambda out: builder_argv(hf, out), False)
    old = load_saved(work) if args.only else None
    wanted = set(args.only) if old else set(jobs)
    rows = {name: build(work, *job, rebuild) for name, job in jobs.items() if name in wanted}
    if args.compile_only:
        return {}
    with Locked():
        reference = None if old is None else old["scores"]["irc fp32"]
        scores = evaluate(rows, data, args.threads, reference)
        fp32 = scores.get("irc fp32", reference)
        check = old["check"] if old else \
            transformers_check(hf, data, fp32, args.threads) if "note" not in fp32 else "no fp32 reference"
    print(f"  {check}", flush=True)
    levels = {name: level_of(folder) for name, (folder, _) in rows.items() if folder}
    best = best_method(scores, args.methods) if old is None else None
    if best and not args.no_extra:
        extra = {}
        for group in (64, 128):
            extra[f"irc {best} g{group}"] = build(work, f"irc-{slug(best)}-g{group}",
                                                  lambda out, g=group: irc_argv(hf, out, best, g, tokenizer_of(best)),
                                                  True, rebuild)
        extra[f"irc {best} g32 acc0"] = (with_level(rows[f"irc {best} g32"][0], 0, args.threads), "")
        with Locked():
            scores.update(evaluate(extra, data, args.threads, fp32))
        levels.update({name: level_of(folder) for name, (folder, _) in extra.items() if folder})
    scores, levels = merge_saved(work, old, scores, levels, check)
    return {"hf": hf, "scores": scores, "check": check, "best": best_method(scores, args.methods),
            "levels": levels, "data": data, "table_float": table_float(rows.get("builder int4"), hf)}


def table_float(built: tuple | None, hf: str) -> bool | None:
    """``builder_table_float`` of the builder's folder (None: not built now)."""
    if not built or not built[0]:
        return None
    with open(os.path.join(hf, "config.json")) as f:
        config = json.load(f)
    return builder_table_float(built[0], config["vocab_size"], config["hidden_size"])


def saved_result(model: str, args, rebuild: set) -> dict:
    """``run_model``'s result from the saved scores alone (``--report-only``)."""
    hf = prepare_model(model)
    old = load_saved(os.path.join(args.workdir, model))
    if old is None:
        raise SystemExit(f"no saved scores for {model} under {args.workdir}")
    times = sorted({row.get("measured", "?") for row in old["scores"].values()})
    print(f"{model}: saved scores, measured {', '.join(times)}")
    builder = [os.path.join(args.workdir, model, d) for d in sorted(os.listdir(os.path.join(args.workdir, model)))
               if d.startswith("builder-int4-") and os.path.exists(os.path.join(args.workdir, model, d, ".done"))]
    return {"hf": hf, "scores": old["scores"], "check": old["check"], "best": best_method(old["scores"], args.methods),
            "levels": old["levels"], "data": model_data(hf, model),
            "table_float": table_float((builder[-1], "") if builder else None, hf)}


def load_saved(work: str) -> dict | None:
    """The last run's ``work/scores.json`` (fp32's argmax back as arrays), or None."""
    path = os.path.join(work, "scores.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        old = json.load(f)
    fp32 = old["scores"].get("irc fp32", {})
    if "top" not in fp32:
        return None
    fp32["top"] = [np.asarray(t) for t in fp32["top"]]
    return old


def merge_saved(work: str, old: dict | None, scores: dict, levels: dict, check: str) -> tuple:
    """(scores, levels): this run's rows, completed by ``old``'s others (marked ``earlier``);
    saved to ``work/scores.json`` (argmax kept for fp32 only, the reference of a later run)."""
    now = time.strftime("%H:%M UTC", time.gmtime())
    fresh = {name: {k: v for k, v in row.items() if k != "top" or name == "irc fp32"} | {"measured": now}
             for name, row in scores.items()}
    merged, merged_levels = dict(fresh), dict(levels)
    if old:
        merged = {k: fresh[k] if k in fresh else v | {"earlier": True} for k, v in old["scores"].items()}
        merged.update({k: v for k, v in fresh.items() if k not in merged})
        merged_levels = {**old["levels"], **levels}
    path = os.path.join(work, "scores.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"scores": merged, "levels": merged_levels, "check": check}, f, default=json_value)
    os.replace(path + ".tmp", path)
    return merged, merged_levels


def json_value(value):
    """numpy arrays and scalars as JSON lists and numbers."""
    return value.tolist() if isinstance(value, (np.ndarray, np.generic)) else str(value)


def report(results: dict, methods: list) -> None:
    print(f"\nint4 quality: MB on disk; perplexity on the first {EVAL_TOKENS} tokens of A = {EVAL_TEXTS[0]} and "
          f"B = {EVAL_TEXTS[1]}; top-1 agreement with irc fp32 over both; greedy = prompts (of 32) whose first "
          f"{NEW_TOKENS} greedy tokens equal fp32's; prefix = mean leading tokens equal to fp32's; degen = degenerate outputs (in brackets: where fp32's is not)")
    print(f"  {'model':<11} {'row':<44} {'acc':>4} {'x bld':>5} {'MB':>8} {'ppl A':>8} {'ppl B':>8} {'top-1':>7} "
          f"{'greedy':>7} {'prefix':>6} {'degen':>8}")
    canonical = ["irc fp32", *(f"irc {m} g32" for m in METHODS), "builder int4"]
    for model, result in results.items():
        names = sorted(result["scores"], key=lambda n: canonical.index(n) if n in canonical else len(canonical))
        builder_mb = result["scores"].get("builder int4", {}).get("MB") or \
            result["scores"].get("irc ort g32", {}).get("MB")
        for name in names:
            row = result["scores"][name]
            ratio = f"{row['MB'] / builder_mb:5.2f}" if builder_mb and "MB" in row else "    -"
            print(f"  {model:<11} {name:<44} {result['levels'].get(name, '-'):>4} {ratio} {summary(row)}")
    print()
    for model, result in results.items():
        builder, against = result["scores"].get("builder int4", {"note": "not run"}), "builder's"
        if "note" in builder and "note" not in result["scores"].get("irc ort g32", {"note": ""}):
            builder, against = result["scores"]["irc ort g32"], "irc ort g32's (the builder failed)"
        good = [name for name, row in result["scores"].items() if name.startswith("irc ") and name != "irc fp32"
                and meets_default(row, builder, bool(result["table_float"]))]
        limit = 1.0 if result["table_float"] else BYTES_RATIO
        print(f"default verdict {model} (greedy > {against} {builder.get('greedy', '-')}, no new degenerate, MB <= "
              f"{limit:.2f}x{', the builder keeps the table float' if result['table_float'] else ''}): "
              f"{', '.join(good) or 'none'}")
    print()
    for model, result in results.items():
        builder = result["scores"]["builder int4"]
        good = [m for m in methods if no_worse(result["scores"].get(f"irc {m} g32", {"note": "not run"}), builder)]
        print(f"verdict {model}: irc methods no worse than the builder on every column and never degenerate where "
              f"fp32 is not: {', '.join(good) or 'none'}; best by mean perplexity: {result['best']}; {result['check']}")
    print()
    for model, result in results.items():
        decode = result["data"]["decode"]
        for name, row in result["scores"].items():
            for index, bad in enumerate(row.get("degenerate", [])):
                if bad:
                    print(f"degenerate {model} {name} prompt {index}: {decode(row['outputs'][index])!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2,gemma3,qwen-coder")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--workdir", default="/tmp/int4-quality")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rebuild", default="", help="rows to compile afresh, e.g. irc-gptq-g32,irc-ort-g32")
    parser.add_argument("--no-extra", action="store_true", help="skip the block-size and accuracy-level rows")
    parser.add_argument("--only", default="", help="rows to measure now (with fp32 and the builder), e.g. "
                        "'irc gptq g32,irc ort g32'; the others come from the last run's saved scores")
    parser.add_argument("--report-only", action="store_true", help="print the table of the saved scores, measure nothing")
    parser.add_argument("--compile-only", action="store_true", help="compile the main rows into the cache, score nothing")
    args = parser.parse_args(argv)
    args.methods = [m for m in args.methods.split(",") if m]
    args.only = [r.strip() for r in args.only.split(",") if r.strip()]
    rebuild = {r for r in args.rebuild.split(",") if r}
    run = saved_result if args.report_only else run_model
    results = {model: run(model, args, rebuild) for model in args.models.split(",")}
    if not args.compile_only:
        report(results, args.methods)
    return 0


if __name__ == "__main__":
    sys.exit(main())
