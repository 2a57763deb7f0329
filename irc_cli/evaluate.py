"""``irc compile --eval-text FILE``: perplexity and top-1 agreement of an approximating pass
(``quantize``) on a text, through the reference interpreter.

``add_compile_arguments`` adds ``--eval-text``, ``--eval-tokens`` and ``--tokenizer``;
``tokens(args, graph)`` reads the text (the spec folder's ``tokenizer.json`` unless
``--tokenizer`` says otherwise; fewer than 2 tokens is a user error) and gives absent
weights their seeded data, so the float graph and the quantized one see the same weights;
``attach(passes, tokens)`` hands the tokens to every pass that evaluates a text (one with
``evaluate_on``; none is a user error); ``results(manager, graph)`` gives those passes'
report lines (their dump-stats report, computed here when no dump asked for it).
"""
from __future__ import annotations

import os
from typing import Optional

from irc.errors import IRCError
from irc.evaluate import text_tokens
from irc.quant_report import format_pass_report
from irc.weights import seed_absent

DEFAULT_TOKENS = 512


def add_compile_arguments(parser) -> None:
    parser.add_argument("--eval-text", metavar="FILE",
                        help="a text: report the quantize pass's perplexity and top-1 agreement with the float "
                             "graph on it (reference interpreter), in the output and the dump stats")
    parser.add_argument("--eval-tokens", type=int, default=DEFAULT_TOKENS,
                        help="how many of the text's tokens to evaluate (default %(default)s)")
    parser.add_argument("--tokenizer", metavar="TOKENIZER.json",
                        help="the tokenizer for --eval-text (default: tokenizer.json in the spec's folder)")


def tokens(args, graph) -> Optional[list[int]]:
    """The evaluation tokens, or None without ``--eval-text``."""
    if not getattr(args, "eval_text", None):
        return None
    if args.eval_tokens < 2:
        raise IRCError(f"--eval-tokens {args.eval_tokens}: perplexity needs at least 2 tokens")
    tokenizer = args.tokenizer
    if tokenizer is None:
        folder = args.spec if os.path.isdir(args.spec) else os.path.dirname(os.path.abspath(args.spec))
        tokenizer = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(tokenizer):
            raise IRCError(f"--eval-text needs a tokenizer: no tokenizer.json beside {args.spec}",
                           hint="give --tokenizer PATH/tokenizer.json")
    ids = text_tokens(args.eval_text, tokenizer, args.eval_tokens)
    vocab = graph.meta.get("vocab_size")
    if vocab and max(ids) >= vocab:
        raise IRCError(f"--eval-text: token id {max(ids)} is outside the model's vocabulary of {vocab}",
                       location=args.eval_text, hint="use the model's own tokenizer")
    seed_absent(graph, args.seed)
    return ids


def attach(passes, ids: Optional[list[int]]) -> None:
    if ids is None:
        return
    takers = [p for p in passes if callable(getattr(p, "evaluate_on", None))]
    if not takers:
        raise IRCError("--eval-text: no pass in the pipeline evaluates a text", hint="add quantize{...} to --passes")
    for p in takers:
        p.evaluate_on(ids)


def results(manager, graph) -> list[str]:
    """Report lines of the passes that evaluated the text."""
    lines = []
    for p in manager.passes:
        if getattr(p, "eval_tokens", None) is None or getattr(p, "float_graph", None) is None:
            continue
        report = p.last_report if p.last_report is not None else p.report(graph)
        lines.append(format_pass_report(report).rstrip("\n"))
    return lines


__all__ = ["add_compile_arguments", "tokens", "attach", "results"]
