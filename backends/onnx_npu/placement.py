"""The placement report of an onnx-npu folder: per layer, what the NPU compiler accepted.

``irc compile ... --target onnx-npu -o OUT --report FILE.html`` compiles both graphs for
each checked SoC with onnxruntime-qnn (``backends.onnx_npu.qnn``) and reads the per-node
verdicts of its log. Nodes are grouped by the layer their name starts with
(``layers.3.…``; the rest is ``model``: embedding, RoPE gathers, final norm and head).
Where the graph carries irc's own NPU tiling plan (``meta["npu_plan"]``, from the
``npu-tile`` pass), each layer's row also shows the plan's ops and cycles for the same
phase (prefill for the chunk graph, decode for the decode graph), so the two views of a
layer sit side by side: what a real compiler placed, and what irc's machine model predicts.

The rows go to the terminal, to ``placement.json`` in the folder and, as a section, into
the HTML report. Without onnxruntime-qnn the report says so and shows the plan alone.
"""
from __future__ import annotations

import html
import json
import os
import re
from collections import defaultdict
from typing import Optional

from irc.output import OutputFolder

from backends.onnx_npu import qnn

SOCS = (60, 69)
PHASES = {"chunk": "prefill", "decode": "decode"}
LAYER = re.compile(r"^layers\.(\d+)[./]")


def layer_of(name: str) -> str:
    found = LAYER.match(name)
    return f"layer {found.group(1)}" if found else "model"


def _order(layer: str):
    return (0, int(layer.split()[1])) if layer != "model" else (1, 0)


def compile_all(folder: str, contract: dict, socs=SOCS) -> dict:
    """{(graph role, soc): qnn.Compiled}; the compiled contexts go to a temporary folder."""
    import tempfile

    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for role, name in sorted(contract["graphs"].items()):
            for soc in socs:
                results[(role, soc)] = qnn.compile_htp(os.path.join(folder, name), soc,
                                                       out=os.path.join(scratch, f"{role}_{soc}_ctx.onnx"))
    return results


def rows(results: dict, plan: Optional[dict]) -> list[dict]:
    """One row per (graph, layer): nodes on the HTP / refused per SoC, and the plan's share."""
    table: dict = defaultdict(dict)
    for (role, soc), compiled in sorted(results.items()):
        counts: dict = defaultdict(lambda: [0, 0])
        for node, provider in compiled.placements.items():
            counts[layer_of(node)][0 if provider == qnn.EP else 1] += 1
        for layer, (npu, cpu) in counts.items():
            table[(role, layer)][f"soc {soc}"] = {"htp": npu, "refused": cpu, "compiled": compiled.ok}
    for op in (plan or {}).get("ops", []):
        for role, phase in PHASES.items():
            if op.get("phase") == phase:
                layer = "model" if op.get("layer") is None else f"layer {op['layer']}"
                entry = table[(role, layer)].setdefault("plan", {"ops": 0, "cycles": 0, "dram_bytes": 0})
                entry["ops"] += 1
                entry["cycles"] += int(op.get("cycles", 0)) * int(op.get("count", 1))
                entry["dram_bytes"] += int(op.get("dram_bytes", 0)) * int(op.get("count", 1))
    return [{"graph": role, "layer": layer, **cells}
            for (role, layer), cells in sorted(table.items(), key=lambda kv: (kv[0][0], _order(kv[0][1])))]


def text_lines(report: dict) -> list[str]:
    lines = [f"placement ({report['compiler']}):"]
    for (role, soc), summary in sorted(report["compiles"].items()):
        lines.append(f"  {role} graph, soc {soc}: {'compiled' if summary['ok'] else 'FAILED'}, "
                     f"{summary['htp']} node(s) on the HTP, {summary['refused']} refused"
                     + (f" ({summary['error']})" if summary["error"] else ""))
    header = f"  {'graph':<7}{'layer':<10}" + "".join(f"{'soc ' + str(s):>12}" for s in report["socs"]) + \
        f"{'plan ops':>10}{'plan cycles':>13}"
    lines.append(header)
    for row in report["rows"]:
        cells = "".join(f"{_cell(row.get(f'soc {s}')):>12}" for s in report["socs"])
        plan = row.get("plan")
        lines.append(f"  {row['graph']:<7}{row['layer']:<10}{cells}"
                     + (f"{plan['ops']:>10}{plan['cycles']:>13,}" if plan else f"{'-':>10}{'-':>13}"))
    for reason in report["refusals"][:10]:
        lines.append(f"  refused: {reason}")
    return lines


def _cell(cell: Optional[dict]) -> str:
    if not cell:
        return "-"
    return f"{cell['htp']}/{cell['htp'] + cell['refused']} HTP"


def build(folder: str, contract: dict, plan: Optional[dict], socs=SOCS) -> dict:
    if not qnn.available():
        return {"compiler": "onnxruntime-qnn not installed (pip install '.[npu]'): irc's NPU plan only",
                "socs": [], "compiles": {}, "rows": rows({}, plan), "refusals": []}
    results = compile_all(folder, contract, socs)
    refusals = sorted({reason for compiled in results.values() for reason in compiled.refusals})
    compiles = {key: {"ok": c.ok, "htp": c.on_npu, "refused": c.on_cpu, "seconds": round(c.seconds, 2),
                      "context_bytes": c.context_bytes, "error": c.error} for key, c in results.items()}
    return {"compiler": "onnxruntime-qnn HTP, CPU fallback disabled", "socs": list(socs), "compiles": compiles,
            "rows": rows(results, plan), "refusals": refusals}


def html_section(report: dict) -> str:
    head = "".join(f"<th>soc {s}</th>" for s in report["socs"])
    body = []
    for row in report["rows"]:
        plan = row.get("plan")
        cells = "".join(f"<td>{html.escape(_cell(row.get(f'soc {s}')))}</td>" for s in report["socs"])
        ops, cycles = (str(plan["ops"]), f"{plan['cycles']:,}") if plan else ("-", "-")
        body.append(f"<tr><td>{row['graph']}</td><td>{row['layer']}</td>{cells}<td>{ops}</td><td>{cycles}</td></tr>")
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in report["refusals"])
    return (f'<section id="npu-placement"><h2>NPU placement ({html.escape(report["compiler"])})</h2>'
            f"<table><tr><th>graph</th><th>layer</th>{head}<th>plan ops</th><th>plan cycles</th></tr>"
            + "".join(body) + "</table>" + (f"<ul>{reasons}</ul>" if reasons else "") + "</section>")


def write(folder: str, contract: dict, plan: Optional[dict], report_path: Optional[str]) -> list[str]:
    """Build the report, write ``placement.json`` into ``folder`` and the section into the
    HTML report at ``report_path``; the lines for the terminal."""
    report = build(folder, contract, plan)
    serial = {**report, "compiles": [{"graph": role, "soc": soc, **summary}
                                     for (role, soc), summary in sorted(report["compiles"].items())]}
    with OutputFolder(os.path.abspath(folder), primary="placement.json") as out:
        out.write("placement.json", json.dumps(serial, indent=2, sort_keys=True) + "\n")
    if report_path and os.path.isfile(report_path):
        with open(report_path, encoding="utf-8") as f:
            page = f.read()
        marker = "</body>"
        page = page.replace(marker, html_section(report) + marker, 1) if marker in page else page + html_section(report)
        from irc.passmanager import write_atomic

        write_atomic(report_path, page)
    return text_lines(report) + [f"wrote {os.path.join(folder, 'placement.json')}"]
