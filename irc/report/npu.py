"""The NPU plan section: the target, per-layer DRAM traffic against its I/O lower bound,
SRAM occupancy against capacity, and the ops by lower-bound ratio (with tile, loop order and
fused ops where the plan records them). The one renderer of a plan: the report's section,
and alone on a page (``irc.report.npu_page``, what ``irc tile --report`` writes).

Data-driven from a plan dict, wherever it comes from (``graph.meta["npu_plan"]``, which the
``npu-tile`` pass attaches, or a ``plan.json``): a list of per-op entries under ``ops`` (or
``entries``), each with ``name, op, phase, dram_bytes, lower_bound_bytes, sram_bytes,
cycles, bound``, and optional ``totals`` (flat, or one dict per phase) and ``target``
(``target.sram.bytes`` or ``target.sram_bytes`` draws the capacity line). Missing fields
count as zero; entries are grouped per layer by their ``layer`` field or their name
(``layers.N.*``), the rest under "other".
"""
from __future__ import annotations

import json
import os
from collections import Counter
from html import escape
from typing import Optional

from irc.analysis import layer_of
from irc.inputs import read_json
from irc.report.svg import column_chart, format_count
from irc.text import format_bytes

FIELDS = ("name", "op", "phase", "dram_bytes", "lower_bound_bytes", "sram_bytes", "cycles", "bound")


def find_plan(graph_meta: dict, dump_dir: Optional[str] = None) -> Optional[dict]:
    """The plan to chart: the graph's ``meta["npu_plan"]``, else ``plan.json`` (or
    ``npu_plan.json``) in the dump directory, else None."""
    plan = graph_meta.get("npu_plan") if graph_meta else None
    if isinstance(plan, dict):
        return plan
    for name in ("plan.json", "npu_plan.json"):
        path = os.path.join(dump_dir, name) if dump_dir else None
        if path and os.path.exists(path):
            plan = read_json(path)
            return plan if isinstance(plan, dict) else None
    return None


def entries(plan: dict) -> list[dict]:
    for key in ("ops", "entries", "nodes", "tiles"):
        value = plan.get(key)
        if isinstance(value, list) and all(isinstance(e, dict) for e in value):
            return value
    return []


def _items(entry: dict, key: str) -> list:
    """``entry[key]`` when it is a list (a plan handed back may hold anything)."""
    value = entry.get(key)
    return value if isinstance(value, list) else []


def _num(entry: dict, key: str) -> float:
    value = entry.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def per_layer(ops: list[dict]) -> tuple[list[str], dict]:
    """Layer labels (``L0``..., ``other`` last) and, per label, summed traffic, bound and
    cycles and the peak SRAM bytes."""
    rows: dict[str, dict] = {}
    keys: dict[str, tuple] = {}
    for e in ops:
        layer = e.get("layer") if isinstance(e.get("layer"), int) else layer_of(str(e.get("name", "")))
        label = f"L{layer}" if layer is not None else "other"
        keys[label] = (0, layer) if layer is not None else (1, 0)
        row = rows.setdefault(label, {"dram": 0, "bound": 0, "cycles": 0, "sram": 0})
        row["dram"] += _num(e, "dram_bytes")
        row["bound"] += _num(e, "lower_bound_bytes")
        row["cycles"] += _num(e, "cycles")
        row["sram"] = max(row["sram"], _num(e, "sram_bytes"))
    labels = sorted(rows, key=lambda k: keys[k])
    return labels, rows


def _ratio(dram: float, bound: float) -> str:
    return f"{dram / bound:.2f}×" if bound else "–"


def render(plan: dict) -> str:
    """The section body (HTML); an explanation when the plan has no per-op entries."""
    ops = entries(plan)
    if not ops:
        return "<p>The NPU plan has no per-op entries (<code>ops</code>) to chart.</p>"
    target = plan.get("target") if isinstance(plan.get("target"), dict) else {}
    sram = target.get("sram") if isinstance(target.get("sram"), dict) else {}
    capacity = target.get("sram_bytes") or sram.get("bytes") or plan.get("sram_bytes")
    parts = [_target(plan, target, capacity)]
    for phase in sorted({str(e.get("phase") or "all") for e in ops}):
        parts += _phase(phase, [e for e in ops if str(e.get("phase") or "all") == phase], capacity)
    totals = plan.get("totals")
    if isinstance(totals, dict) and totals:
        parts.append(_totals(totals))
    return "\n".join(part for part in parts if part)


def _target(plan: dict, target: dict, capacity) -> str:
    """The target in a sentence: its whole description where the plan carries it (as
    ``irc tile`` writes it), else its name and SRAM size."""
    name = target.get("name") or plan.get("target_name")
    try:
        mac, dram, options = target["mac"], target["dram"], plan["options"]
        machine = (f"{escape(str(target['summary']))}. SRAM {escape(format_bytes(capacity))} "
                   f"({target['sram']['banks']} bank(s)), MAC array {mac['rows']}x{mac['cols']} at "
                   f"{target['clock_mhz']:g} MHz, DRAM {dram['bytes_per_cycle']:g} B/cycle, "
                   f"{target['dma']['channels']} DMA channel(s), {target['alignment_bytes']}-byte bursts. Operands "
                   f"{escape(str(options['dtype']))}, accumulators {escape(str(options['accumulator']))}; prefill "
                   f"{options['batch']}x{options['tokens']} tokens, decode over {options['past']:,} cached.")
    except (KeyError, TypeError, ValueError):
        machine = None
    if machine is not None:
        return f"<p>Target <b>{escape(str(name))}</b>: {machine}</p>"
    if name:
        return (f"<p>Target <b>{escape(str(name))}</b>"
                + (f", SRAM {escape(format_bytes(capacity))}" if capacity else "") + ".</p>")
    return ""


def _phase(phase: str, chosen: list[dict], capacity) -> list[str]:
    """One phase: the totals in a sentence, traffic and SRAM per layer, the ops table."""
    labels, rows = per_layer(chosen)
    dram = sum(_num(e, "dram_bytes") for e in chosen)
    bound = sum(_num(e, "lower_bound_bytes") for e in chosen)
    cycles = sum(_num(e, "cycles") for e in chosen)
    bounds = Counter(str(e.get("bound") or "?") for e in chosen)
    return [f'<h3 id="npu-{escape(phase)}">{escape(phase)}</h3>',
            f"<p>{len(chosen)} ops: DRAM traffic {escape(format_bytes(dram))} against a lower bound of "
            f"{escape(format_bytes(bound))} (ratio <b>{_ratio(dram, bound)}</b>), "
            f"{escape(format_count(cycles))} cycles; bound by "
            + ", ".join(f"{escape(k)} ×{v}" for k, v in sorted(bounds.items())) + ".</p>",
            '<div class="charts">',
            column_chart(labels, [("DRAM bytes", [rows[k]["dram"] for k in labels]),
                                  ("lower bound", [rows[k]["bound"] for k in labels])],
                         title=f"DRAM traffic per layer ({phase})", y_label="bytes"),
            column_chart(labels, [("peak SRAM bytes", [rows[k]["sram"] for k in labels])],
                         title=f"SRAM occupancy per layer ({phase})", y_label="bytes",
                         reference=("SRAM capacity", capacity) if capacity else None),
            "</div>", _ops_table(chosen)]


def _ops_table(chosen: list[dict]) -> str:
    """The ops, worst lower-bound ratio first (200 at most); tile, loop order and fused
    elementwise ops where the plan records them."""
    worst = sorted(chosen, key=lambda e: (-(_num(e, "dram_bytes") / _num(e, "lower_bound_bytes"))
                                          if _num(e, "lower_bound_bytes") else 0, str(e.get("name"))))
    detailed = any(isinstance(e.get("tile"), dict) for e in chosen)
    extra = ("<th>tile</th><th>loop order</th><th class='l'>fused</th>" if detailed else "")
    parts = [f"<details><summary>Ops by lower-bound ratio ({len(chosen)})</summary>"
             "<table class='num'><tr><th>op</th><th>name</th><th>DRAM</th><th>lower bound</th>"
             f"<th>ratio</th><th>SRAM</th><th>cycles</th><th>bound</th>{extra}</tr>"]
    for e in worst[:200]:
        cells = [f"<td>{escape(str(e.get('op', '')))}</td>",
                 f"<td class='l'>{escape(str(e.get('name', '')))}"
                 + (f" (×{e['count']})" if _num(e, "count") > 1 else "") + "</td>"]
        cells += [f"<td>{escape(format_bytes(_num(e, key)))}</td>" for key in ("dram_bytes", "lower_bound_bytes")]
        cells += [f"<td>{_ratio(_num(e, 'dram_bytes'), _num(e, 'lower_bound_bytes'))}</td>",
                  f"<td>{escape(format_bytes(_num(e, 'sram_bytes')))}</td>",
                  f"<td>{escape(format_count(_num(e, 'cycles')))}</td>", f"<td>{escape(str(e.get('bound', '')))}</td>"]
        if detailed:
            tile = e.get("tile") if isinstance(e.get("tile"), dict) else {}
            cells += [f"<td>{escape('x'.join(str(v) for v in tile.values()))}</td>",
                      f"<td>{escape('>'.join(str(v) for v in _items(e, 'loop_order')))}</td>",
                      f"<td class='l'>{escape(', '.join(str(v) for v in _items(e, 'fused')))}</td>"]
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</table></details>")
    return "".join(parts)


def _flat(values: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + str(key)] = value
    return out


def _shown(value) -> str:
    if isinstance(value, bool) or value is None or not isinstance(value, (int, float)):
        return json.dumps(value, sort_keys=True)
    return f"{value:,}" if isinstance(value, int) else f"{value:.6g}"


def _totals(totals: dict) -> str:
    """The plan's totals: one column per phase when it keeps them per phase."""
    per_phase = all(isinstance(v, dict) for v in totals.values())
    columns = sorted(totals) if per_phase else ["total"]
    flat = {c: _flat(totals[c]) for c in columns} if per_phase else {"total": _flat(totals)}
    keys = sorted({k for c in columns for k in flat[c]})
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    rows = "".join(f"<tr><th class='l'>{escape(k)}</th>" +
                   "".join(f"<td>{escape(_shown(flat[c].get(k, '')) if k in flat[c] else '–')}</td>" for c in columns)
                   + "</tr>" for k in keys)
    return f"<h3>Plan totals</h3><table class='num'><tr><th class='l'></th>{head}</tr>{rows}</table>"
