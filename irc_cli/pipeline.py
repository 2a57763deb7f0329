"""The pass pipeline of a command: the target's prelude, ``--passes`` (or the target's default)
with ``--quantize``, the target's postlude, run with the dump and check options. ``compile``,
``show`` and ``run`` (a spec, an image) all apply it."""
from __future__ import annotations

import sys
from typing import Optional

import passes  # noqa: F401  (registers the passes the pipeline names)
from backends import TARGETS, get_target
from irc.analysis import stats_line
from irc.check import compare_outputs
from irc.dot import graph_to_dot
from irc.errors import BackendError, PassError
from irc.interpreter import random_feeds
from irc.passmanager import PassManager, parse_pipeline
from irc.progress import SILENT, Progress
from irc.weights import seed_absent
from irc_cli import evaluate as eval_cli
from irc_cli import weights as weights_cli


def apply_passes(graph, args, *, check: bool = False, out=sys.stdout, progress: Progress = SILENT,
                  eval_tokens=None):
    pipeline = parse_pipeline(pipeline_text(args))
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


def pipeline_text(args) -> str:
    """The target's prelude (``retype`` for ONNX), ``--passes`` or the default pipeline, then
    the target's postlude (``last-logits`` for ONNX)."""
    main = args.passes if args.passes is not None else default_pipeline(args)
    main = with_quantize(main, getattr(args, "quantize", None))
    if getattr(args, "target", None) is None:
        return main
    target, options = get_target(args.target), target_options(args)
    return ",".join(part for part in (target.prelude(options), main, target.postlude(options)) if part)


QUANTIZE_SHORT = {"int4": "quantize{bits=4}", "int8": "quantize{bits=8}"}


def with_quantize(main: str, short: Optional[str]) -> str:
    """``--quantize int4|int8``: the pipeline followed by ``quantize`` with its defaults
    (every weight, embedding table and head included); one error when the pipeline already
    quantizes (two spellings of one choice)."""
    if short is None:
        return main
    if any(p.name == "quantize" for p in parse_pipeline(main)):
        raise PassError(f"--quantize {short} and a quantize pass in --passes: give one of them",
                        hint="options beyond bits go in the pass: --passes \"quantize{bits=4,method=rtn}\"")
    return ",".join(part for part in (main, QUANTIZE_SHORT[short]) if part)


def default_pipeline(args) -> str:
    if getattr(args, "target", None) is None:  # show and run: no target, no default pipeline
        return ""
    return get_target(args.target).pipeline(target_options(args))


def target_options(args) -> dict:
    """The chosen target's own options; one BackendError for an option another target owns.
    ``--weights`` is every compile's (``irc_cli.weights``); ``none`` only for targets that read it."""
    target = get_target(args.target)
    weights_cli.check(getattr(args, "weights", None))
    if getattr(args, "weights", None) == "none" and "weights" not in target.arguments:
        owners = [n for n, t in TARGETS.items() if "weights" in t.arguments]
        raise BackendError(f"--weights none (a shape-only model) applies to {' and '.join(owners)} only, not "
                           f"--target {args.target}", hint="--weights seeded for random weights on purpose")
    for name in sorted({a for t in TARGETS.values() for a in t.arguments} - set(target.arguments) - {"weights"}):
        if getattr(args, name, None) is not None:
            owners = [n for n, t in TARGETS.items() if name in t.arguments]
            raise BackendError(f"--{name.replace('_', '-')} applies to {' and '.join(owners)} only, not "
                               f"--target {args.target}", hint=f"use --target {' or '.join(owners)}")
    return {name: getattr(args, name, None) for name in target.arguments}


# ---- commands --------------------------------------------------------------------------
