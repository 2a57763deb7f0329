"""``irc`` show, compile, run, passes (and report, tile from their modules).

User mistakes print one message (file:line and key, or the node) and exit with code 2;
``--debug`` shows the traceback instead. Outputs are written atomically.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Optional

import passes  # noqa: F401  (registers the passes)
from backends import TARGETS, EmitOptions, get_target
from frontends import companion_files, load_notes
from irc.analysis import analyze, stats_line
from irc.check import compare_outputs
from irc.dot import graph_to_dot
from irc.dtypes import DType
from irc.errors import BackendError, IRCError
from irc.interpreter import generate, random_feeds
from irc.output import Terminated
from irc.passmanager import PASSES, PassManager, parse_pipeline
from irc.printer import print_graph
from irc.progress import SILENT, Progress
from irc.text import describe_bytes
from irc.weights import seed_absent
from irc_cli import evaluate as eval_cli
from irc_cli import report as report_cli
from irc_cli import tile as tile_cli
from irc_cli.spec import load


def _apply_passes(graph, args, *, check: bool = False, out=sys.stdout, progress: Progress = SILENT,
                  eval_tokens=None):
    pipeline = parse_pipeline(_pipeline_text(args))
    eval_cli.attach(pipeline, eval_tokens)  # --eval-text: the passes that evaluate a text
    checker = None
    if check:
        seed_absent(graph, args.seed)

        def checker(before, after):  # feeds follow the graph: a pass may change what is cached
            feeds = random_feeds(before, batch=2, tokens=5, past=3, seed=args.seed)
            return compare_outputs(before, after, feeds, args.seed)

    def stats(g):
        return stats_line(g, args.context)

    dump_dir = getattr(args, "dump_dir", None)  # stats and pictures only where dumps will hold them
    manager = PassManager(pipeline, dump_dir=dump_dir,
                          print_after_all=getattr(args, "print_after_all", False),
                          print_after_change=getattr(args, "print_after_change", False),
                          checker=checker, stats=stats if dump_dir else None, dot=graph_to_dot, out=out,
                          on_pass=progress.pass_started)
    with progress.passes(len(pipeline)):
        manager.run(graph)
    return manager


def _pipeline_text(args) -> str:
    """The target's prelude (``retype`` for ONNX), then ``--passes`` or the default pipeline."""
    main = args.passes if args.passes is not None else _default_pipeline(args)
    if getattr(args, "target", None) is None:
        return main
    prelude = get_target(args.target).prelude(_target_options(args))
    return ",".join(part for part in (prelude, main) if part)


def _default_pipeline(args) -> str:
    if getattr(args, "target", None) is None:  # show and run: no target, no default pipeline
        return ""
    return get_target(args.target).pipeline(_target_options(args))


def _target_options(args) -> dict:
    """The chosen target's own options; one BackendError for an option another target owns."""
    target = get_target(args.target)
    for name in sorted({a for t in TARGETS.values() for a in t.arguments} - set(target.arguments)):
        if getattr(args, name, None) is not None:
            owners = [n for n, t in TARGETS.items() if name in t.arguments]
            raise BackendError(f"--{name.replace('_', '-')} applies to {' and '.join(owners)} only, not "
                               f"--target {args.target}", hint=f"use --target {' or '.join(owners)}")
    return {name: getattr(args, name, None) for name in target.arguments}


# ---- commands --------------------------------------------------------------------------

def cmd_show(args) -> int:
    graph = load(args.spec)
    _apply_passes(graph, args)
    cache = DType.parse(args.cache_dtype) if args.cache_dtype else None
    summary = analyze(graph, context=args.context, cache_dtype=cache)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0
    print(f"{summary['name']}: {summary['n_layers']} layers, {summary['nodes']} nodes")
    rows = [
        ("parameters", f"{summary['params_total']:,}"),
        ("active parameters", f"{summary['params_active']:,}"),
        ("parameter bytes", f"{summary['param_bytes']:,}"),
        (f"FLOPs/token @ {summary['context']:,}", f"{summary['flops_per_token']:,}"),
        (f"KV cache/token ({summary['cache_dtype']})", f"{summary['kv_cache_bytes_per_token']:,} bytes"),
        ("KV elements/token/layer", f"{summary['kv_cache_elements_per_token_per_layer']:,}"),
        (f"KV cache @ {summary['context']:,} tokens", describe_bytes(summary["kv_cache_bytes_at_context"])),
        ("KV cache/token if MHA", f"{summary['kv_cache_bytes_mha_equivalent_per_token']:,} bytes"),
        (f"KV cache @ {summary['context']:,} if MHA",
         describe_bytes(summary["kv_cache_bytes_mha_equivalent_at_context"])),
    ]
    if "kv_cache_latent_bytes_per_token" in summary:
        rows.append(("MLA latent cache/token", f"{summary['kv_cache_latent_bytes_per_token']:,} bytes "
                     f"({summary['kv_cache_latent_elements_per_token_per_layer']} elements/layer)"))
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")
    return 0


def cmd_compile(args) -> int:
    target = get_target(args.target)
    options = EmitOptions(args.target, args.spec, args.seed, args.context, _target_options(args))
    if target.needs_output and not args.output:
        raise BackendError(f"--target {args.target} writes files: give -o PATH")
    graph = load(args.spec)
    if args.output and args.target != "ir" and options.target.get("weights") != "none":
        seed_absent(graph, args.seed)  # before the passes, so weights they derive (quantize) can be computed
    eval_tokens = eval_cli.tokens(args, graph)
    progress = Progress.for_terminal(sys.stderr, quiet=args.quiet)  # bars on a terminal only
    with report_cli.compile_report(args, graph) as report:  # --report FILE: dumps, then the page
        manager = _apply_passes(graph, args, check=args.check, out=sys.stdout, progress=progress,
                                eval_tokens=eval_tokens)
        report.write(manager, graph)
    if not args.quiet:
        _print_records(manager, args.check)
    for line in eval_cli.results(manager, graph) if eval_tokens is not None else []:
        print(line, file=sys.stderr)
    if args.output:
        files, notes = companion_files(args.spec)  # a tokenizer, for the model's folder
        lines = target.emit(graph, args.output, dataclasses.replace(options, files=files, progress=progress))
        for line in [] if args.quiet else load_notes(graph) + notes + lines:
            print(line, file=sys.stderr)
    elif args.target == "ir":
        sys.stdout.write(print_graph(graph))
    return 0


def _print_records(manager, check: bool) -> None:
    for r in manager.records:
        error = "" if r.check_error is None else f"  check {r.check_error:.2e}{'' if r.exact else ' (reported)'}"
        print(f"{r.index:02d} {r.name:<24} {'changed' if r.changed else 'unchanged':<9} "
              f"{r.seconds * 1000:8.1f} ms{error}", file=sys.stderr)
    if check:
        exact = [r.check_error for r in manager.records if r.check_error is not None and r.exact]
        inexact = [r for r in manager.records if r.check_error is not None and not r.exact]
        print(f"check passed: {len(exact)} exact pass(es) hold the reference interpreter's outputs "
              f"(max relative error {max(exact, default=0.0):.2e})", file=sys.stderr)
        for r in inexact:
            print(f"check reported: {r.name} moves the outputs by {r.check_error:.2e} (relative; an "
                  f"approximating pass)", file=sys.stderr)


def cmd_run(args) -> int:
    graph = load(args.spec)
    _apply_passes(graph, args)
    try:
        prompt = [int(t) for t in args.prompt.split(",") if t.strip()]
    except ValueError:
        raise IRCError(f"--prompt {args.prompt!r}: expected comma-separated token ids") from None
    vocab = graph.meta.get("vocab_size")
    if not prompt or (vocab and any(not 0 <= t < vocab for t in prompt)):
        raise IRCError(f"--prompt needs token ids in [0, {vocab})")
    tokens, last = generate(graph, prompt, args.max_new_tokens, seed=args.seed)
    if args.json:
        print(json.dumps({"tokens": tokens, "logits_last": [float(x) for x in last]}))
    else:
        print(" ".join(str(t) for t in tokens))
    return 0


def cmd_passes(args) -> int:
    width = max(len(n) for n in PASSES)
    for name in sorted(PASSES):
        print(f"{name:<{width}}  {PASSES[name].summary()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="irc", description="A compiler for transformer architectures.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p, passes_help="comma-separated passes, e.g. dce,cse"):
        p.add_argument("spec", help="model spec: .yaml, DSL .py or .ir")
        p.add_argument("--passes", default=None, help=passes_help)
        p.add_argument("--context", type=int, default=4096,
                       help="context length for FLOPs and KV totals; for the ONNX targets the longest sequence "
                            "the model serves (genai context_length, ORT RoPE tables)")
        p.add_argument("--seed", type=int, default=0, help="seed for absent weights and check inputs")

    show = sub.add_parser("show", help="summary and analysis of a model")
    common(show)
    show.add_argument("--json", action="store_true")
    show.add_argument("--cache-dtype", default=None, help="KV-cache dtype (default: the model's dtype)")
    show.set_defaults(func=cmd_show)

    comp = sub.add_parser("compile", help="run a pipeline and emit a target")
    common(comp, "pipeline (default: the target's)")
    comp.add_argument("--target", default="ir", help=f"one of {', '.join(TARGETS)}")
    comp.add_argument("-o", "--output")
    comp.add_argument("--dump-dir")
    comp.add_argument("--print-after-all", action="store_true")
    comp.add_argument("--print-after-change", action="store_true")
    comp.add_argument("--check", action="store_true", help="hold every pass to the reference interpreter")
    comp.add_argument("--quiet", action="store_true",
                      help="no progress bar (shown only on a terminal anyway) and no report lines; errors still")
    for add_arguments in dict.fromkeys(t.add_arguments for t in TARGETS.values() if t.add_arguments):
        add_arguments(comp)  # each target's own options, once per backend
    report_cli.add_compile_arguments(comp)
    eval_cli.add_compile_arguments(comp)
    comp.set_defaults(func=cmd_compile)

    run = sub.add_parser("run", help="greedy generation with the reference interpreter")
    common(run)
    run.add_argument("--prompt", required=True, help="token ids, e.g. 1,2,3")
    run.add_argument("--max-new-tokens", type=int, default=8)
    run.add_argument("--json", action="store_true")
    run.set_defaults(func=cmd_run)

    report_cli.add_parser(sub)
    tile_cli.add_parser(sub)

    lst = sub.add_parser("passes", help="list the passes")
    lst.set_defaults(func=cmd_passes)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except IRCError as err:
        if args.debug:
            raise
        print(f"irc: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM while an output is written
        if args.debug:
            raise
        print("irc: interrupted; no output was left behind", file=sys.stderr)
        return 143 if isinstance(stop, Terminated) else 130


if __name__ == "__main__":
    sys.exit(main())
