"""``irc tile``: plan a model on an NPU target, write plan.json and an HTML report.

    irc tile SPEC --target-npu examples/targets/edge-npu.yaml [--tokens T] [--past P]
             [--batch B] [--dtype int8] [--passes mla-absorb] [-o plan.json] [--report plan.html]

Runs ``--passes`` (if any) and then ``npu-tile`` through the pass manager, writes the
plan (``-o``, JSON, byte-identical for the same input) and the report (``--report``),
atomically, and prints the totals per phase: time per token for a decoder's prefill and
decode, time per image (and images per second) for an image encoder's one ``image`` phase,
which ``--tokens`` and ``--past`` do not apply to. A VLM gets both: its decoder's plan (image
rows not counted there) and its vision model's, written beside it (``plan.vision.json``,
``plan.vision.html``). ``add_parser`` registers the command on the ``irc`` parser; ``main``
runs it alone (``python -m irc_cli.tile``).
"""
from __future__ import annotations

import argparse
import sys


def add_parser(subparsers) -> argparse.ArgumentParser:
    from irc_cli.help import SPEC_HELP, parser_options

    p = subparsers.add_parser("tile", **parser_options("tile"))
    p.add_argument("spec", metavar="SPEC", help=SPEC_HELP)
    p.add_argument("--target-npu", required=True, metavar="TARGET.yaml", help="NPU target description")
    p.add_argument("--tokens", type=int, default=512, help="prefill tokens per sequence [512]")
    p.add_argument("--past", type=int, default=4096, help="cached tokens at decode [4096]")
    p.add_argument("--batch", type=int, default=1, help="sequences [1]")
    p.add_argument("--dtype", default="int8", help="operand dtype, one the target supports [int8]")
    p.add_argument("--passes", default=None, help="passes to run before tiling, e.g. mla-absorb")
    p.add_argument("-o", "--output", help="write the plan (JSON)")
    p.add_argument("--report", help="write the HTML report")
    p.set_defaults(func=cmd_tile)
    return p


def cmd_tile(args) -> int:
    from irc_cli.spec import load
    from irc.passmanager import PassManager, parse_pipeline, write_atomic
    from passes.npu_tile.plan import dumps
    from irc.report import npu_page
    from passes.npu_tile import NpuTile

    graph = load(args.spec)
    plans = []
    for part, role in [(graph, "")] + [(g, role) for role, g in graph.parts.items()]:  # a VLM's vision model too
        pipeline = parse_pipeline(args.passes or "") + [
            NpuTile(target=args.target_npu, tokens=args.tokens, past=args.past, batch=args.batch, dtype=args.dtype)]
        PassManager(pipeline, out=sys.stderr).run(part)
        plans.append((part.meta["npu_plan"], role))
    for plan, role in plans:
        for path, text in ((args.output, lambda: dumps(plan)), (args.report, lambda: npu_page(plan))):
            if path:
                path = beside(path, role)
                write_atomic(path, text())
                print(f"wrote {path}" + (f" ({len(plan['ops'])} planned ops)" if path.endswith(".json") else ""),
                      file=sys.stderr)
    print("\n".join(summary(plan) for plan, _ in plans))
    return 0


def beside(path: str, role: str) -> str:
    """``plan.json`` for the model itself, ``plan.vision.json`` for a VLM's vision model."""
    if not role:
        return path
    stem, dot, ext = path.rpartition(".")
    return f"{stem}.{role}.{ext}" if dot else f"{path}.{role}"


def summary(plan: dict) -> str:
    from irc.text import format_bytes, format_seconds

    options = plan["options"]
    vision = options.get("vision")
    per, key = ("image", "seconds_per_image") if vision is not None else ("token", "seconds_per_token")
    lines = [f"{plan['model']} on {plan['target']['name']} ({options['dtype']} operands, "
             f"{options['accumulator']} accumulators)",
             f"  {'phase':<8} {'ops':>5} {'DRAM':>10} {'bound':>10} {'ratio':>6} {'cycles':>15} {'time/' + per:>11} "
             f"{'peak SRAM':>10} {'MAC util':>8}"]
    for phase, t in plan["totals"].items():
        util = f"{t['mac_utilization']:.1%}" if t["mac_utilization"] is not None else "-"
        lines.append(f"  {phase:<8} {t['ops']:>5} {format_bytes(t['dram_bytes']):>10} "
                     f"{format_bytes(t['lower_bound_bytes']):>10} {t['ratio']:>6.3f} {t['cycles']:>15,} "
                     f"{format_seconds(t[key]):>11} {format_bytes(t['peak_sram_bytes']):>10} {util:>8}")
    if vision is not None:
        t = plan["totals"]["image"]
        lines.append(f"  {t['images_per_second']:,.2f} images/s at batch {t['images']} "
                     f"({vision['tokens']} tokens an image)")
    return "\n".join(lines)
