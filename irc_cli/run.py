"""``irc run``: text in, text out, from a spec or a folder ``irc compile`` wrote.

    irc run out/ --prompt "The capital of France is"          # a compiled ONNX folder
    irc run SmolLM2/ --prompt "What is 2+2?" --chat --json     # a Hugging Face folder
    irc run examples/tiny-llama3.yaml --prompt-ids 1,2,3       # token ids, no tokenizer
    irc run out_tt/ --tp 2 --prompt-ids 1,2,3                  # a Triton folder, shard{tp=2}: 2 processes

The prompt is tokenized with the input's tokenizer (``irc_cli.text``); generation is greedy
and stops at the model's eos (``irc_cli.engines`` picks the engine). On a terminal the
answer is printed token by token; ``--json`` prints one object (prompt and new tokens,
text, timing; the last logits only with ``--logits``). A line with tokens/s follows on
stderr unless ``--quiet``.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Optional

from irc.errors import IRCError
from irc_cli import engines, run_vlm, speculative, weights
from irc_cli.run_triton import check_world
from irc_cli.speculative_mtp import prepare_graph
from irc_cli.help import SPEC_HELP, parser_options
from irc_cli.text import Text, find_text


def add_parser(subparsers, common) -> None:
    """The ``run`` command; ``common(parser)`` adds spec, --passes, --context and --seed."""
    p = subparsers.add_parser("run", **parser_options("run"))
    common(p, spec_help=SPEC_HELP + " or a folder irc compile wrote")
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help="the prompt text, tokenized with the model's tokenizer.json")
    prompt.add_argument("--prompt-ids", metavar="IDS", help="the prompt as token ids, e.g. 1,2,3 (no tokenizer needed)")
    p.add_argument("--image", metavar="FILE", help="an image for an image encoder: its embeddings "
                   "(irc_cli.run_image; needs Pillow: pip install 'irc[vision]')")
    p.add_argument("--text", action="append", metavar="TEXT", help="with --image, for a dual encoder (CLIP, "
                   "SigLIP): a text to score the image against (repeat it; irc_cli.run_dual)")
    p.add_argument("--chat", action="store_true", help="lay the prompt out with the model's chat template (one user "
                   "turn, ready for the answer); needs jinja2")
    p.add_argument("--system", help="with --chat: a system message before the user's")
    p.add_argument("--max-new-tokens", type=int, default=64, help="stop after this many new tokens (default 64)")
    p.add_argument("--engine", choices=("auto", "genai", "ort"), default="auto",
                   help="for a compiled ONNX folder: onnxruntime-genai or plain onnxruntime with irc's greedy loop "
                        "(auto: genai when installed)")
    p.add_argument("--speculative", metavar="DRAFTER", help="speculative greedy decoding, the same tokens: ngram "
                   "(prompt lookup), ngram=K (at most K draft tokens a check) or draft=PATH (a smaller model with the "
                   "same tokenizer: a spec or a compiled folder; irc_cli.speculative); the reference interpreter or "
                   "onnxruntime")
    p.add_argument("--tp", type=int, metavar="N", help="a Triton folder compiled with shard{tp=N}: its N ranks, a "
                   "process each (torch.distributed: NCCL on GPUs, gloo on CPU; irc_cli.run_triton)")
    p.add_argument("--json", action="store_true", help="print one JSON object: tokens, text, timing")
    p.add_argument("--logits", action="store_true", help="with --json: the last step's logits too")
    p.add_argument("--quiet", action="store_true", help="no tokens/s line on stderr")
    weights.add_argument(p, shape_only=False)
    p.set_defaults(func=cmd_run)


class Stream:
    """The answer as it grows: on a terminal each token's text is written as soon as it is
    whole (an incomplete UTF-8 character waits for the next token)."""

    def __init__(self, text: Optional[Text], out, live: bool):
        self.text, self.out, self.live = text, out, live and text is not None
        self.ids, self.shown = [], ""

    def add(self, token: int) -> None:
        self.ids.append(token)
        if not self.live:
            return
        now = self.text.decode(self.ids)
        if not now.endswith("\ufffd") and now.startswith(self.shown):
            self.out.write(now[len(self.shown):])
            self.out.flush()
            self.shown = now

    def finish(self) -> str:
        whole = self.text.decode(self.ids)
        self.out.write((whole[len(self.shown):] if whole.startswith(self.shown) else "\n" + whole) + "\n")
        self.out.flush()
        return whole


def _ids(text: str, option: str, vocab: Optional[int]) -> list:
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise IRCError(f"{option} {text!r}: expected comma-separated token ids, e.g. 1,2,3") from None
    if not ids:
        raise IRCError(f"{option} is empty: give at least one token id")
    if any(i < 0 or (vocab and i >= vocab) for i in ids):
        raise IRCError(f"{option}: token ids must be in [0, {vocab or 'vocab'})")
    return ids


def _prompt(args, text: Optional[Text], vocab: Optional[int], special: bool = True) -> list:
    """The prompt's ids; ``special``: the tokenizer adds its special tokens to a plain prompt."""
    if args.prompt_ids is not None:
        if args.chat:
            raise IRCError("--chat lays out a text prompt: give --prompt TEXT, not --prompt-ids")
        return _ids(args.prompt_ids, "--prompt-ids", vocab)
    if text is None:
        raise IRCError(f"a text prompt needs the model's tokenizer, and there is no tokenizer.json for {args.spec}",
                       hint="give the prompt as token ids: --prompt-ids 1,2,3")
    ids = text.encode(text.chat(args.prompt, args.system), special=False) if args.chat else text.encode(
        args.prompt, special=special)
    if not ids:
        raise IRCError("--prompt is empty after tokenization")
    if vocab and max(ids) >= vocab:
        raise IRCError(f"the tokenizer gives id {max(ids)}, outside the model's vocabulary of {vocab}",
                       location=text.where, hint="use the model's own tokenizer")
    return ids


def _text(args, where: str) -> Optional[Text]:
    """The tokenizer: required for a text prompt, optional (for the JSON text) with ids."""
    if args.prompt is not None:
        return find_text(where)
    try:
        return find_text(where)
    except IRCError:
        return None


def _source(args):
    """(runner, folder or graph, eos ids, context limit, vocab) for the input."""
    compiled = engines.compiled_folder(args.spec)
    if compiled:
        folder, runner = compiled
        if args.passes:
            raise IRCError("--passes applies to specs; this is a compiled folder", location=folder)
        if args.tp is not None:
            check_world(args.spec, folder, args.tp)
        eos, context = engines.folder_limits(folder)
        vocab = engines.folder_model(folder).get("vocab_size")
        return runner, folder, eos, context, vocab, folder
    from irc_cli.pipeline import apply_passes
    from irc_cli.spec import load

    if args.tp is not None:
        check_world(args.spec, None, args.tp)
    if args.engine != "auto":
        raise IRCError(f"--engine {args.engine} runs a compiled ONNX folder; a spec runs in the reference interpreter",
                       hint="compile it first: irc compile SPEC --target onnx -o OUT/model.onnx")
    weights.check(args.weights, weights.CHOICES[:1])
    graph = load(args.spec)
    if graph.meta.get("encoder"):
        raise IRCError("this model is an encoder (an embedding model): it has no logits to generate with",
                       location=args.spec, hint="compile it to an embedding model: irc compile SPEC --target onnx "
                                                "-o OUT/model.onnx")
    weights.require(args.spec, graph, args.weights)
    if args.speculative and args.speculative.partition("=")[0] == "mtp":
        prepare_graph(graph, args.spec)  # the decoder hands the head its hidden states
    apply_passes(graph, args)
    eos = graph.meta.get("eos_token_id")
    eos = set(eos) if isinstance(eos, list) else set() if eos is None else {eos}

    def interpreter(g, prompt, n, stop, clock, engine="auto", speculative=None):
        return engines.interpreter(g, prompt, n, stop, clock, seed=args.seed, speculative=speculative)

    return interpreter, graph, eos, graph.meta.get("max_positions"), graph.meta.get("vocab_size"), args.spec


def cmd_run(args) -> int:
    if args.image is not None and not run_vlm.takes_images(args.spec):
        from irc_cli.run_image import run_image
        return run_image(args)
    if args.text:
        raise IRCError("--text goes with --image: a dual encoder (CLIP, SigLIP) scores an image against texts",
                       hint="give the image: --image FILE")
    if args.prompt is None and args.prompt_ids is None:
        raise IRCError("give the prompt: --prompt TEXT or --prompt-ids IDS (or --image FILE for an image encoder)")
    if args.max_new_tokens < 1:
        raise IRCError(f"--max-new-tokens {args.max_new_tokens}: generate at least one token")
    if args.logits and not args.json:
        raise IRCError("--logits goes with --json")
    drafting = {}
    if args.speculative is not None:
        drafter, k, path = speculative.parse(args.speculative)
        drafting["speculative"] = (drafter, k, None if path is None else engines.draft_model(path, args.seed))
    runner, source, eos, context, vocab, where = _source(args)
    engine = "ort" if args.logits and args.engine == "auto" else args.engine
    if args.logits and engine == "genai":
        raise IRCError("--logits: onnxruntime-genai does not hand out logits here", hint="use --engine ort")
    text = _text(args, where)
    vlm = run_vlm.load_model(args, source)
    special = True  # the tokenizer adds its special tokens (PaliGemma's layout writes <bos> itself)
    if vlm is not None:  # a vision-language model: the image's features go in with the prompt
        pixels, grid = run_vlm.pixel_values(vlm, where, args.image) if args.image else (None, (0, 0))
        images = 0 if pixels is None else 1
        if args.prompt is not None:  # laid out in text, before tokenization, as the processors do
            args.prompt, special = run_vlm.expand_text(args.prompt, vlm, images, grid, where, text)
        runner = run_vlm.runner(vlm, pixels, grid)
        if drafting:
            raise IRCError("--speculative: a vision-language model's folder runs in its own loop", location=where,
                           hint="run it without --speculative")
        vocab = vocab and max(vocab, vlm.token + 1)  # an image token past the vocabulary (Llama-3.2-Vision's)
    prompt = _prompt(args, text, vocab, special)
    if vlm is not None and args.prompt is None:
        prompt = run_vlm.expand(prompt, vlm, images, where, text, grid)
    if context and len(prompt) + args.max_new_tokens > context:
        raise IRCError(f"{len(prompt)} prompt tokens + --max-new-tokens {args.max_new_tokens} exceed the model's "
                       f"context of {context} tokens", hint="ask for fewer new tokens")
    live = text is not None and args.prompt is not None and not args.json and sys.stdout.isatty()
    clock = Clock(Stream(text, sys.stdout, live))
    result = runner(source, prompt, args.max_new_tokens, eos, clock, engine=engine, **drafting)
    timing = clock.timing(len(prompt))
    stopped = "eos" if result.tokens and result.tokens[-1] in eos else "max_new_tokens"
    if args.json:
        report = {"prompt_tokens": prompt, "tokens": result.tokens,
                  "text": text.decode(result.tokens) if text else None, "engine": result.engine,
                  "stopped": stopped, "timing": timing}
        if args.logits:
            report["logits_last"] = [float(x) for x in result.logits]
        if drafting:
            report["speculative"] = clock.speculation
        print(json.dumps(report))
    elif args.prompt is not None:
        clock.stream.finish()
    else:
        print(" ".join(str(t) for t in result.tokens))
    if not args.quiet:
        print(_stats_line(timing, result.engine, stopped), file=sys.stderr)
        if drafting and (clock.speculation or {}).get("note"):
            print(f"irc run: note: {clock.speculation['note']}", file=sys.stderr)
    return 0


class Clock:
    """What a runner reports to: ``start()`` when the model is loaded and the prompt goes in,
    ``token(t)`` as each new token arrives (streamed on)."""

    def __init__(self, stream: Stream):
        self.stream, self.started, self.times = stream, None, []
        self.speculation = None  # irc_cli.speculative's report, where the run drafted

    def start(self) -> None:
        self.started = time.perf_counter()

    def token(self, token: int) -> None:
        self.times.append(time.perf_counter())
        self.stream.add(int(token))

    def timing(self, prompt_tokens: int) -> dict:
        """Seconds to the first token (prefill), for the rest (decode), and the decode rate."""
        times = self.times
        first = times[0] - (self.started or times[0]) if times else 0.0
        decode = times[-1] - times[0] if len(times) > 1 else 0.0
        rate = (len(times) - 1) / decode if decode > 0 else (len(times) / first if first > 0 else 0.0)
        return {"prompt_tokens": prompt_tokens, "new_tokens": len(times), "prefill_s": round(first, 4),
                "decode_s": round(decode, 4), "total_s": round(first + decode, 4), "tokens_per_s": round(rate, 1)}


def _stats_line(timing: dict, engine: str, stopped: str) -> str:
    return (f"irc run: {timing['new_tokens']} new tokens, {timing['tokens_per_s']:.1f} tokens/s "
            f"(prefill {timing['prompt_tokens']} tokens in {timing['prefill_s'] * 1000:.0f} ms, decode "
            f"{timing['decode_s']:.2f} s) with {engine}; stopped at {'eos' if stopped == 'eos' else '--max-new-tokens'}")
