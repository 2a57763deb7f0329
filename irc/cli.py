"""The ``irc`` command line: show, compile, run, passes, report, tile.

User mistakes print one message (file:line and key, or the node) and exit with code 2;
``--debug`` shows the traceback instead. Outputs are written atomically.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

from irc.errors import IRCError

TARGETS = {
    # target: (default pipeline, what -o writes)
    "ir": ("", "the printed IR"),
    "numpy": ("dce,cse", "a standalone NumPy module (+ .npz weights)"),
    # the ONNX targets' pipelines depend on --opset: backends.onnx.targets has the table
    "onnx": ("dce,cse", "an ONNX model, standard ops (+ genai_config.json)"),
    "onnx-ort": ("dce,cse", "an ONNX model with ONNX Runtime contrib ops (+ genai_config.json)"),
    "triton": ("dce,cse,mla-absorb,moe-sort", "a Triton module: generated kernels + launcher (+ .pt weights)"),
}
ONNX_TARGETS = ("onnx", "onnx-ort")


def load(path: str):
    """A graph from a spec file: YAML (architecture or graph form), a DSL .py, or .ir text."""
    if not os.path.exists(path):
        raise IRCError(f"no such file: {path}")
    if path.endswith(".ir"):
        from irc.parser import parse_graph
        with open(path) as f:
            return parse_graph(f.read(), source=path)
    from frontends import load_spec
    return load_spec(path)


def _pipeline(text: Optional[str]):
    import passes  # noqa: F401  (registers the passes)
    from irc.passmanager import parse_pipeline
    return parse_pipeline(text or "")


def _apply_passes(graph, args, *, check: bool = False, out=sys.stdout):
    from irc.analysis import stats_line
    from irc.passmanager import PassManager

    pipeline = _pipeline(args.passes if args.passes is not None else _default_pipeline(args))
    checker = None
    if check:
        from backends.numpy.interpreter import random_feeds
        from irc.testing import compare_outputs
        from irc.weights import seed_absent

        seed_absent(graph, args.seed)

        def checker(before, after):  # feeds follow the graph: a pass may change what is cached
            feeds = random_feeds(before, batch=2, tokens=5, past=3, seed=args.seed)
            return compare_outputs(before, after, feeds, args.seed)

    from irc.dot import graph_to_dot

    def stats(g):
        return stats_line(g, args.context)

    dump_dir = getattr(args, "dump_dir", None)  # stats and pictures only where dumps will hold them
    manager = PassManager(pipeline, dump_dir=dump_dir,
                          print_after_all=getattr(args, "print_after_all", False),
                          print_after_change=getattr(args, "print_after_change", False),
                          checker=checker, stats=stats if dump_dir else None, dot=graph_to_dot, out=out)
    manager.run(graph)
    return manager


def _default_pipeline(args) -> str:
    target = getattr(args, "target", "ir")
    if target in ONNX_TARGETS:
        from backends.onnx.targets import TARGETS as ONNX
        return ONNX[target].pipeline(_onnx_options(args)[0])
    return TARGETS.get(target, ("",))[0]


def _onnx_options(args) -> tuple[int, str]:
    """(opset, weights) for an ONNX target; one BackendError for a bad option or combination.
    Imports only backends.onnx.targets (plain data), never onnx itself."""
    from backends.onnx.targets import DEFAULT_OPSET, check_options
    from irc.errors import BackendError

    opset = DEFAULT_OPSET if args.opset is None else args.opset
    weights = "seeded" if args.weights is None else args.weights
    if args.target not in ONNX_TARGETS:
        given = [flag for flag, value in (("--opset", args.opset), ("--weights", args.weights)) if value is not None]
        if given:
            raise BackendError(f"{given[0]} applies to the ONNX targets only, not --target {args.target}",
                               hint=f"use --target {' or '.join(ONNX_TARGETS)}")
        return opset, weights
    check_options(args.target, opset, weights)
    if not args.output:
        raise BackendError(f"--target {args.target} writes a model file: give -o FILE.onnx")
    return opset, weights


# ---- commands --------------------------------------------------------------------------

def cmd_show(args) -> int:
    from irc.analysis import analyze
    from irc.dtypes import DType

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
        (f"KV cache @ {summary['context']:,} tokens", _bytes(summary["kv_cache_bytes_at_context"])),
        ("KV cache/token if MHA", f"{summary['kv_cache_bytes_mha_equivalent_per_token']:,} bytes"),
        (f"KV cache @ {summary['context']:,} if MHA", _bytes(summary["kv_cache_bytes_mha_equivalent_at_context"])),
    ]
    if "kv_cache_latent_bytes_per_token" in summary:
        rows.append(("MLA latent cache/token", f"{summary['kv_cache_latent_bytes_per_token']:,} bytes "
                     f"({summary['kv_cache_latent_elements_per_token_per_layer']} elements/layer)"))
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")
    return 0


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n:,} bytes ({n / size:.4g} {unit})"
    return f"{n:,} bytes"


def cmd_compile(args) -> int:
    from irc.passmanager import write_atomic
    from irc.printer import print_graph

    if args.target not in TARGETS:
        raise IRCError(f"unknown target {args.target!r}", hint=f"targets: {', '.join(TARGETS)}")
    opset, weights = _onnx_options(args)
    graph = load(args.spec)
    if args.output:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    if args.output and args.target != "ir" and weights == "seeded":
        from irc.weights import seed_absent
        seed_absent(graph, args.seed)  # before the passes, so weights they derive (quantize) can be computed
    from irc.report.cli import compile_report
    with compile_report(args, graph) as report:  # --report FILE: dumps (to a temporary directory without --dump-dir), then the page
        manager = _apply_passes(graph, args, check=args.check, out=sys.stdout)
        report.write(manager, graph)
    for r in manager.records:
        check = "" if r.check_error is None else f"  check {r.check_error:.2e}{'' if r.exact else ' (reported)'}"
        print(f"{r.index:02d} {r.name:<24} {'changed' if r.changed else 'unchanged':<9} "
              f"{r.seconds * 1000:8.1f} ms{check}", file=sys.stderr)
    if args.check:
        exact = [r.check_error for r in manager.records if r.check_error is not None and r.exact]
        inexact = [r for r in manager.records if r.check_error is not None and not r.exact]
        print(f"check passed: {len(exact)} exact pass(es) hold the reference interpreter's outputs "
              f"(max relative error {max(exact, default=0.0):.2e})", file=sys.stderr)
        for r in inexact:
            print(f"check reported: {r.name} moves the outputs by {r.check_error:.2e} (relative; an "
                  f"approximating pass)", file=sys.stderr)
    if args.output:
        if args.target == "ir":
            write_atomic(args.output, print_graph(graph))
        elif args.target == "numpy":
            from backends.numpy.emit import emit_module
            emit_module(graph, args.output, source=args.spec)
        elif args.target in ONNX_TARGETS:
            return _emit_onnx(graph, args, opset, weights)
        elif args.target == "triton":
            from backends.triton.emit import emit_module as emit_triton  # imports torch and triton
            emit_triton(graph, args.output, source=args.spec)
        print(f"wrote {args.output} ({TARGETS[args.target][1]})", file=sys.stderr)
    elif args.target == "ir":
        sys.stdout.write(print_graph(graph))
    return 0


def _emit_onnx(graph, args, opset: int, weights: str) -> int:
    from backends.onnx.emit import emit_model  # onnx is imported only when an ONNX target is asked for

    result = emit_model(graph, args.output, target=args.target, opset=opset, weights=weights, seed=args.seed,
                        context=args.context)
    print(f"wrote {result.path} (target {result.target}, opset {result.opset})", file=sys.stderr)
    if result.data_path and result.weights_written:
        print(f"wrote {result.data_path} ({_bytes(result.weight_bytes)} of weights)", file=sys.stderr)
    elif result.data_path:
        print(f"shape-only compile: the model references {_bytes(result.weight_bytes)} of weights in "
              f"{result.data_path}, which was not written (--weights none)", file=sys.stderr)
    if result.genai_config:
        print(f"wrote {result.genai_config}", file=sys.stderr)
    elif result.genai_note:
        print(result.genai_note, file=sys.stderr)
    return 0


def cmd_run(args) -> int:
    from backends.numpy.interpreter import generate

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
    _pipeline("")
    from irc.passmanager import PASSES
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
    comp.add_argument("--opset", type=int, default=None,
                      help="ONNX opset for --target onnx/onnx-ort (default 23, at least 21)")
    comp.add_argument("--weights", default=None,
                      help="ONNX targets: seeded (default; absent weights seeded by name) or none (shape-only: "
                           "the model references external weights that are not written)")
    from irc.report.cli import add_compile_arguments, add_parser as add_report_parser
    add_compile_arguments(comp)
    comp.set_defaults(func=cmd_compile)

    run = sub.add_parser("run", help="greedy generation with the reference interpreter")
    common(run)
    run.add_argument("--prompt", required=True, help="token ids, e.g. 1,2,3")
    run.add_argument("--max-new-tokens", type=int, default=8)
    run.add_argument("--json", action="store_true")
    run.set_defaults(func=cmd_run)

    add_report_parser(sub)
    from backends.npu.cli import add_parser as add_tile_parser  # `irc tile`
    add_tile_parser(sub)

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


if __name__ == "__main__":
    sys.exit(main())
