"""``irc`` show, compile, passes (and run, report, tile from their modules).

User mistakes print one message (file:line and key, or the node) and exit with code 2;
``--debug`` shows the traceback instead. Outputs are written atomically.
"""
from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import sys
import time
from typing import Optional

import passes  # noqa: F401  (registers the passes)
from backends import TARGETS, EmitOptions, get_target
from backends.ir import printed
from frontends import companion_files, load_notes
from irc import limits
from irc.analysis import analyze, memory_against_context, visual_token_costs
from irc.analysis_mla import mla_forms, trade_lines
from irc.analysis_shard import shard_lines, shard_summary
from irc.dtypes import DType
from irc.errors import BackendError, IRCError
from irc.heap import keep_freed_memory
from irc.output import Terminated, forget_signals, record_signals
from irc.passmanager import PASSES
from irc.progress import Progress
from irc.text import describe_bytes, format_bytes
from irc.weights import seed_absent
from irc_cli import evaluate as eval_cli
from irc_cli import report as report_cli
from irc_cli import run as run_cli
from irc_cli import tile as tile_cli
from irc_cli import weights as weights_cli
from irc_cli.help import SPEC_HELP, parser_options
from irc_cli.pipeline import QUANTIZE_SHORT, apply_passes, target_options
from irc_cli.spec import load, resolve
from irc_cli.speculative_mtp import keep_head, mtp_summary


def cmd_show(args) -> int:
    graph = load(args.spec)
    weights = weights_cli.source(args.spec, graph)[1]
    degrees = ",".join(f"{k}={v}" for k, v in (("tp", args.tp), ("ep", args.ep), ("pp", args.pp)) if v is not None)
    if degrees:  # each rank's share: the shard pass last (irc.analysis_shard)
        args.passes = ",".join(p for p in (args.passes, f"shard{{{degrees}}}") if p)
    apply_passes(graph, args)
    cache = DType.parse(args.cache_dtype) if args.cache_dtype else None
    shard = shard_summary(graph, args.context, cache) if graph.meta.get("shard") else None
    summary = analyze(graph, context=args.context, cache_dtype=cache)
    trade = mla_forms(graph, cache_dtype=cache)  # the MLA absorption trade; None without MLA
    memory = memory_against_context(graph, cache_dtype=cache) if summary["state_elements_per_sequence"] else None
    costs = _visual_costs(args, summary, cache)
    seen = None
    if "vision" in graph.parts:  # a VLM: its vision model, and what an image costs this decoder
        apply_passes(graph.parts["vision"], args)
        seen = analyze(graph.parts["vision"], context=args.context, cache_dtype=cache)
        costs = visual_token_costs(seen["vision"], graph, cache, tokens=seen["vision"]["tokens"])
    words = analyze(graph.parts["text"], context=args.context) if "text" in graph.parts else None  # a dual encoder's
    head = mtp_summary(graph.parts["mtp"], args.context, cache) if "mtp" in graph.parts else None
    if args.json:
        print(json.dumps({**summary, "weights": weights, **({"mla_forms": trade} if trade else {}),
                          **({"mtp_head": head} if head else {}), **({"shard": shard} if shard else {}),
                          **({"vision_model": seen} if seen else {}), **({"text_tower": words} if words else {}),
                          **({"memory_against_context": memory} if memory else {}),
                          **({"visual_tokens": costs} if costs else {})}, indent=2, sort_keys=True))
        return 0
    print(f"{summary['name']}: {summary['n_layers']} layers, {summary['nodes']} nodes")
    print(f"  weights: {weights}")
    if "vision" in summary:
        _print_rows(_vision_rows(summary))
        if words:
            print(f"  text tower: {words['params_total']:,} parameters, {words['n_layers']} layers -> text_embeds")
        for line in _visual_token_lines(costs) if costs else []:
            print(line)
        return 0
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
    if summary["state_elements_per_sequence"]:
        kinds = summary["state_elements_by_kind"]
        parts = " + ".join(f"{kinds[k]:,} {k.replace('_state', '')}" for k in sorted(kinds))
        rows.append(("recurrent state/sequence", f"{summary['state_bytes_per_sequence']:,} bytes ({parts} "
                     f"elements, the same at every context)"))
        rows.append((f"KV + state @ {summary['context']:,} tokens",
                     describe_bytes(summary["memory_bytes_per_sequence_at_context"])))
    if "kv_cache_latent_bytes_per_token" in summary:
        rows.append(("MLA latent cache/token", f"{summary['kv_cache_latent_bytes_per_token']:,} bytes "
                     f"({summary['kv_cache_latent_elements_per_token_per_layer']} elements/layer)"))
    if head:  # the checkpoint's multi-token-prediction head, beside the decoder (frontends.hf.mtp)
        rows.append(("MTP head (compile --mtp)", f"{head['params_own']:,} parameters of its own (the embedding and "
                     f"LM head are the decoder's), KV cache {head['kv_cache_bytes_per_token']:,} bytes/token"))
    _print_rows(rows)
    for line in shard_lines(shard) if shard else []:
        print(line)
    for line in trade_lines(trade) if trade else []:
        print(line)
    for line in _memory_lines(memory, summary) if memory else []:
        print(line)
    if seen:
        print(f"  vision model ({seen['name']}):")
        _print_rows([("  " + label, value) for label, value in _vision_rows(seen)])
        for line in _visual_token_lines(costs, "image tokens in the prompt of"):
            print(line)
    return 0


def _print_rows(rows: list) -> None:
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")


def _vision_rows(summary: dict) -> list:
    """An image encoder's summary: an image in, its tokens out, and the work per image."""
    vision = summary["vision"]
    height, width = vision["image_size"]
    return [("parameters", f"{summary['params_total']:,}"),
            ("parameter bytes", f"{summary['param_bytes']:,}"),
            ("image", f"{vision['channels']} x {height} x {width}, patch {vision['patch']}: "
                      f"{vision['patches']:,} patches"),
            ("tokens per image", f"{vision['tokens']:,}"),
            ("FLOPs/image", f"{vision['flops_per_image']:,}")]


def _visual_costs(args, summary: dict, cache) -> Optional[dict]:
    """``--text-model``'s KV cost of the image's tokens (``irc.analysis.visual_token_costs``)."""
    if args.text_model is None:
        return None
    if "vision" not in summary:
        raise IRCError("--text-model goes with an image encoder: what its tokens cost a decoder",
                       location=args.spec)
    text = load(args.text_model)
    if not any(v.name.startswith("past_key_values.") for v in text.inputs):
        raise IRCError("--text-model must be a decoder with a KV cache", location=args.text_model)
    return visual_token_costs(summary["vision"], text, cache)


def _visual_token_lines(costs: dict, what: str = "patch tokens prepended to") -> list[str]:
    per_token = costs["kv_bytes_per_token"]
    if costs.get("bridge") == "cross-attention":
        what = f"image tokens in the cross-attention caches ({costs['cross_layers']} layers) of"
    lines = [f"  its {costs['image_tokens']:,} {what} {costs['text_model']} "
             f"({format_bytes(per_token)} of KV cache a token): {format_bytes(costs['image_kv_bytes'])} an image",
             f"    {'prompt':>8}  {'prompt KV':>10}  {'image share':>11}"]
    lines += [f"    {row['prompt_tokens']:>8,}  {format_bytes(row['prompt_kv_bytes']):>10}  {row['image_share']:>11.1%}"
              for row in costs["against_prompt"]]
    lines += [f"    merged {row['merge']} (pixel shuffle or pooling): {row['tokens']:,} tokens, "
              f"{format_bytes(row['kv_bytes'])}" for row in costs["compression"]]
    return lines


def _memory_lines(memory: list, summary: dict) -> list[str]:
    """The memory one sequence holds against context: the KV cache grows, the states do not."""
    kinds = {layer["mixer"] for layer in summary["layers"] if layer["mixer"]}
    lines = [f"  memory per sequence against context ({', '.join(sorted(kinds))} layers; KV at "
             f"{summary['cache_dtype']}, states at their own dtype):",
             f"    {'context':>9}  {'KV cache':>12}  {'state':>12}  {'total':>12}"]
    for row in memory:
        lines.append(f"    {row['context']:>9,}  {format_bytes(row['kv_cache_bytes']):>12}  "
                     f"{format_bytes(row['state_bytes']):>12}  {format_bytes(row['total_bytes']):>12}")
    return lines


PART_TARGETS = ("onnx", "onnx-ort", "ir")  # the targets that write a VLM's vision model too


def cmd_compile(args) -> int:
    started, wall = time.perf_counter(), time.time()
    record_signals()  # a Ctrl-C swallowed on the way still keeps the output from being committed (irc.output)
    keep_freed_memory()  # weights stream through buffers of tens of MB: reuse them (irc.heap)
    target = get_target(args.target)
    options = EmitOptions(args.target, args.spec, args.seed, args.context, target_options(args))
    if target.needs_output and not args.output:
        raise BackendError(f"--target {args.target} writes files: give -o PATH")
    graph = load(args.spec, args.gguf_weights)
    if args.part == "decoder":  # a VLM's decoder alone: image_features in, beside its ids
        if "vision" not in graph.parts:
            raise BackendError("--part decoder: this model is not a VLM (its decoder is the model itself)",
                               location=args.spec, hint="compile it without --part")
        graph.parts = {}
    elif args.part is not None:  # one part alone: a VLM's vision model, a dual encoder's text tower
        if args.part not in graph.parts:
            raise BackendError(f"--part {args.part}: this model has no {args.part} part"
                               + (f" (its parts: {', '.join(graph.parts)})" if graph.parts else ""),
                               location=args.spec)
        graph = graph.parts[args.part]
    if "vision" in graph.parts and args.target not in PART_TARGETS:
        raise BackendError(f"--target {args.target} writes one model, and this VLM has a vision model beside its "
                           "decoder", location=args.spec, hint="compile it with --target onnx or onnx-ort (vision, "
                                                                "embedding and decoder models), or ir; or its "
                                                                "two models one at a time, --part vision and "
                                                                "--part decoder")
    mtp_lines = keep_head(graph, args.mtp, args.target, args.spec)  # --mtp: the head as a part, or left out
    if (args.output and args.target != "ir") or args.eval_text:  # weights are output or measured (--check seeds its own)
        weights_cli.require(args.spec, graph, args.weights)
    if args.output and args.target != "ir" and args.weights != "none":
        seed_absent(graph, args.seed)  # before the passes, so weights they derive (quantize) can be computed
    eval_tokens = eval_cli.tokens(args, graph)
    progress = Progress.for_terminal(sys.stderr, quiet=args.quiet)  # bars on a terminal only
    with report_cli.compile_report(args, graph) as report:  # --report FILE: dumps, then the page
        manager = apply_passes(graph, args, check=args.check, out=sys.stdout, progress=progress,
                                eval_tokens=eval_tokens)
        report.write(manager, graph)
    part_lines = []
    for role, part in graph.parts.items():  # a VLM's vision model: the same pipeline, checked the same way
        if args.output and args.target != "ir" and args.weights != "none":
            seed_absent(part, args.seed)
        done = apply_passes(part, args, check=args.check, out=io.StringIO())
        checked = _check_lines(done) if args.check else []  # its outputs: the image features
        part_lines += [f"{role} model: {line}" for line in checked + [line for p in done.passes for line in p.headline]]
    if not args.quiet:
        _print_records(manager, args.check)
        for line in [line for p in manager.passes for line in p.headline] + part_lines:
            print(line, file=sys.stderr)
    for line in eval_cli.results(manager, graph) if eval_tokens is not None else []:
        print(line, file=sys.stderr)
    if args.output:
        files, notes = companion_files(args.spec)  # a tokenizer, for the model's folder
        lines = target.emit(graph, args.output, dataclasses.replace(options, files=files, progress=progress,
                                                                         report=getattr(args, "report", None)))
        if "text" in graph.parts and args.target not in PART_TARGETS:  # a dual encoder on a one-model target
            lines.append(f"the text tower is not written: --target {args.target} writes one model (the image "
                         "tower); --target onnx or onnx-ort writes both")
        for line in [] if args.quiet else load_notes(graph) + notes + lines + mtp_lines:
            print(line, file=sys.stderr)
    elif args.target == "ir":
        sys.stdout.write(printed(graph))
    if not args.quiet:
        print(_summary_line(graph, args, time.perf_counter() - started, wall), file=sys.stderr)
    return 0


def _summary_line(graph, args, seconds: float, since: float) -> str:
    """One line at the end of a compile: output, size on disk, dtype, params, KV bytes/token, time."""
    summary = analyze(graph, context=args.context)
    bytes_by_dtype = {}
    for p in graph.params.values():
        bytes_by_dtype[str(p.dtype)] = bytes_by_dtype.get(str(p.dtype), 0) + p.nbytes
    dtypes = "+".join(sorted(bytes_by_dtype, key=bytes_by_dtype.get, reverse=True)) or "-"
    where = f"{args.output} ({format_bytes(_written_bytes(args.output, since))} on disk)" if args.output else "stdout"
    state = (f", state {summary['state_bytes_per_sequence']:,} bytes/sequence"
             if summary["state_elements_per_sequence"] else "")
    memory = (f"{summary['vision']['tokens']:,} tokens/image" if "vision" in summary else
              f"KV {summary['kv_cache_bytes_per_token']:,} bytes/token{state}")
    seen = graph.parts.get("vision")  # a VLM's vision model: its params and tokens too
    params = f"{summary['params_total']:,} params" + (
        f" + {analyze(seen)['params_total']:,} in the vision model ({seen.meta['vision']['tokens']:,} "
        "tokens/image)" if seen else "")
    if "text" in graph.parts:  # a dual encoder's text tower
        params += f" + {analyze(graph.parts['text'])['params_total']:,} in the text tower"
    if "mtp" in graph.parts:  # irc compile --mtp: the multi-token-prediction head
        params += f" + {analyze(graph.parts['mtp'])['params_total']:,} in the MTP head"
    return f"compiled {graph.name} -> {where}: {dtypes}, {params}, {memory}, {seconds:.1f} s"


def _written_bytes(output: str, since: float) -> int:
    """Bytes of the files in the output's folder written by this compile (modified since the
    second it began: file systems with coarse times round down)."""
    folder = output if os.path.isdir(output) else os.path.dirname(os.path.abspath(output))
    total = 0
    for entry in os.scandir(folder):
        if entry.is_file() and entry.stat().st_mtime >= int(since):
            total += entry.stat().st_size
    return total


def _print_records(manager, check: bool) -> None:
    for r in manager.records:
        error = "" if r.check_error is None else f"  check {r.check_error:.2e}{'' if r.exact else ' (reported)'}"
        print(f"{r.index:02d} {r.name:<24} {'changed' if r.changed else 'unchanged':<9} "
              f"{r.seconds * 1000:8.1f} ms{error}", file=sys.stderr)
    for line in _check_lines(manager) if check else []:
        print(line, file=sys.stderr)


def _check_lines(manager) -> list[str]:
    """--check's verdict: the exact passes' largest error, then each approximating pass's."""
    exact = [r.check_error for r in manager.records if r.check_error is not None and r.exact]
    inexact = [r for r in manager.records if r.check_error is not None and not r.exact]
    return [f"check passed: {len(exact)} exact pass(es) hold the reference interpreter's outputs "
            f"(max relative error {max(exact, default=0.0):.2e})"] + [
        f"check reported: {r.name} moves the outputs by {r.check_error:.2e} (relative; an approximating pass)"
        for r in inexact]


def cmd_passes(args) -> int:
    width = max(len(n) for n in PASSES)
    for name in sorted(PASSES):
        print(f"{name:<{width}}  {PASSES[name].summary()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="irc", description="A compiler for transformer architectures.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p, passes_help="comma-separated passes, e.g. dce,cse", spec_help=SPEC_HELP):
        p.add_argument("spec", metavar="SPEC", help=spec_help)
        p.add_argument("--revision", default=None, metavar="REV", help="with a Hugging Face id (owner/name) as SPEC: "
                       "the branch, tag or commit to read [the default branch]")
        p.add_argument("--passes", default=None, help=passes_help)
        p.add_argument("--context", type=int, default=4096,
                       help="context length for FLOPs and KV totals; for the ONNX targets the longest sequence "
                            "the model serves (genai context_length, ORT RoPE tables)")
        p.add_argument("--seed", type=int, default=0, help="seed for absent weights and check inputs")
        p.add_argument("--max-nodes", type=int, default=None, metavar="N", help="refuse a spec whose graph would "
                       "have more than N nodes [2,000,000, or IRC_MAX_NODES] (irc.limits)")

    show = sub.add_parser("show", **parser_options("show"))
    common(show)
    show.add_argument("--json", action="store_true")
    show.add_argument("--cache-dtype", default=None, help="KV-cache dtype (default: the model's dtype)")
    show.add_argument("--tp", type=int, default=None, metavar="N",
                      help="tensor parallel over N ranks: each rank's parameters, KV cache and collective bytes "
                           "(the shard{tp=N} pass after --passes)")
    show.add_argument("--ep", type=int, default=None, metavar="N", help="with --tp N: whole experts, E/N a rank")
    show.add_argument("--pp", type=int, default=None, metavar="P",
                      help="P pipeline stages: each stage's parameters, KV cache and the bytes crossing stages")
    show.add_argument("--text-model", metavar="SPEC", default=None,
                      help="for an image encoder: what its tokens cost this decoder's KV cache when prepended")
    show.set_defaults(func=cmd_show)

    comp = sub.add_parser("compile", **parser_options("compile"))
    common(comp, "pipeline (default: the target's)")
    comp.add_argument("--target", default="ir", help=f"one of {', '.join(TARGETS)}")
    comp.add_argument("-o", "--output")
    comp.add_argument("--dump-dir")
    comp.add_argument("--print-after-all", action="store_true")
    comp.add_argument("--print-after-change", action="store_true")
    comp.add_argument("--check", action="store_true", help="hold every pass to the reference interpreter")
    comp.add_argument("--quantize", default=None, choices=sorted(QUANTIZE_SHORT),
                      help="weight-only quantization after the pipeline: int4 is quantize{bits=4} (every weight, "
                           "the embedding table and head included, block 32), int8 quantize{bits=8}; other "
                           "options go in --passes")
    comp.add_argument("--gguf-weights", default="blocks", choices=("blocks", "blocks4", "exact", "int4", "float"),
                      help="a GGUF's block formats: blocks keeps every block's values as the file's codes (Q5/Q6/Q8 "
                           "as 8-bit codes; int8 activations, accuracy level 4), blocks4 makes Q5/Q6 4-bit codes "
                           "(smaller, lossy, noted), int4 makes Q8_0 4-bit codes too (irc int4's size, lossy, "
                           "noted), exact keeps the file's codes at accuracy level 0 (float activations, slow), "
                           "float dequantizes all [blocks]")
    comp.add_argument("--part", choices=("vision", "decoder", "text"), default=None,
                      help="compile one part of a model alone: a VLM's vision model or its decoder (image_features "
                           "in), a dual encoder's text tower (for the targets that write one model: numpy, triton, "
                           "onnx-npu)")
    comp.add_argument("--mtp", action="store_true",
                      help="write the checkpoint's multi-token-prediction head beside the decoder (mtp.onnx; the "
                           "decoder returns hidden_states), for irc run --speculative mtp: ONNX targets and ir")
    comp.add_argument("--quiet", action="store_true",
                      help="no progress bar (shown only on a terminal anyway), no report or summary lines; errors still")
    weights_cli.add_argument(comp)
    for add_arguments in dict.fromkeys(t.add_arguments for t in TARGETS.values() if t.add_arguments):
        add_arguments(comp)  # each target's own options, once per backend
    report_cli.add_compile_arguments(comp)
    eval_cli.add_compile_arguments(comp)
    comp.set_defaults(func=cmd_compile)

    run_cli.add_parser(sub, common)

    report_cli.add_parser(sub)
    tile_cli.add_parser(sub)

    lst = sub.add_parser("passes", **parser_options("passes"))
    lst.set_defaults(func=cmd_passes)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with limits.applied(nodes=getattr(args, "max_nodes", None)):  # --max-nodes (irc.limits)
            resolve(args)  # a Hugging Face id (and --revision) -> its local snapshot (frontends.hub)
            return args.func(args)
    except IRCError as err:
        if args.debug:
            raise
        print(f"irc: error: {err}", file=sys.stderr)
        return 2
    except MemoryError:  # a spec within the size limits (irc.limits) that still outgrows this machine
        if args.debug:
            raise
        print(f"irc: error: {getattr(args, 'spec', 'irc')}: out of memory while running "
              f"'irc {args.command}' (hint: --weights none for a shape-only model, or a smaller spec)", file=sys.stderr)
        return 2
    except BrokenPipeError:  # irc show ... | head: the reader has gone, and that is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM while an output is written
        if args.debug:
            raise
        forget_signals()
        print("irc: interrupted; no output was left behind", file=sys.stderr)
        return 143 if isinstance(stop, Terminated) else 130


if __name__ == "__main__":
    sys.exit(main())
