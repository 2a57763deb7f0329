"""The human report of an NPU plan: one self-contained HTML page (inline CSS and SVG, no
scripts, nothing fetched).

It shows the target and options, the totals per phase (traffic against the lower bound,
cycles, time per token, peak SRAM, MAC utilisation), two pictures per phase (the SRAM
occupancy of each distinct op, buffer by buffer, against the SRAM size; the DRAM traffic
per layer, stacked by kind of op, with the lower bound marked) and the per-op table.
``render(plan)`` is deterministic: the same plan gives the same bytes.
"""
from __future__ import annotations

from html import escape

COLORS = {"a": "#4e79a7", "b": "#f28e2b", "c": "#59a14f", "epilogue": "#b07aa1", "q": "#4e79a7", "k": "#f28e2b",
          "v": "#edc948", "o": "#59a14f", "s": "#e15759"}
KINDS = (("attention core", "#e15759"), ("attention projections", "#4e79a7"), ("mlp / moe", "#59a14f"),
         ("other gemm", "#bab0ac"))
WIDTH = 860


def _bytes(n) -> str:
    if n is None:
        return "-"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def _seconds(s: float) -> str:
    for unit, size in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= size:
            return f"{s / size:.4g} {unit}"
    return f"{s * 1e9:.4g} ns"


def _kind(record: dict) -> str:
    if record["kind"] == "attention":
        return "attention core"
    if record["op"] in ("attention", "mla_attention", "mla_absorbed_attention") or record["role"] == "linear" and \
            record["name"].rsplit(".", 1)[-1] in ("q", "k", "v", "attn_out", "o"):
        return "attention projections"
    if record["op"] in ("swiglu", "geglu", "gelu_mlp", "moe") or "mlp" in record["name"]:
        return "mlp / moe"
    return "other gemm"


def _distinct(records: list) -> list:
    """The first op of each role (layer numbers removed from names), in plan order."""
    seen, out = set(), []
    for r in records:
        key = r["name"].split(".", 2)[-1] if r["layer"] is not None else r["name"]
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def sram_svg(records: list, sram_bytes: int) -> str:
    ops = _distinct(records)
    label, bar, row = 260, WIDTH - 300, 18
    height = row * len(ops) + 40
    scale = bar / sram_bytes
    parts = [f'<svg width="{WIDTH}" height="{height}" role="img">',
             f'<line x1="{label + bar}" y1="4" x2="{label + bar}" y2="{height - 22}" stroke="#000" '
             f'stroke-dasharray="4 3"/>',
             f'<text x="{label + bar}" y="{height - 8}" text-anchor="end" font-size="11">SRAM {_bytes(sram_bytes)}</text>']
    for i, r in enumerate(ops):
        y = 6 + i * row
        parts.append(f'<text x="{label - 6}" y="{y + 12}" text-anchor="end" font-size="11">{escape(r["name"])}</text>')
        x = label
        for name, buf in r["buffers"].items():
            w = buf["bytes"] * buf["copies"] * scale
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 4}" fill="{COLORS.get(name, "#999")}">'
                         f'<title>{escape(name)}: {buf["copies"]} x {_bytes(buf["bytes"])}</title></rect>')
            x += w
        parts.append(f'<text x="{min(x, label + bar) + 4:.1f}" y="{y + 12}" font-size="10">'
                     f'{r["sram_bytes"] / sram_bytes:.0%}</text>')
    legend = "".join(f'<tspan fill="{color}">&#9632; {name} </tspan>' for name, color in COLORS.items())
    parts.append(f'<text x="{label}" y="{height - 8}" font-size="11">{legend}</text></svg>')
    return "".join(parts)


def traffic_svg(records: list) -> str:
    layers: dict = {}
    for r in records:
        key = r["layer"] if r["layer"] is not None else "rest"
        entry = layers.setdefault(key, {"bound": 0, **{k: 0 for k, _ in KINDS}})
        entry[_kind(r)] += r["dram_bytes"]
        entry["bound"] += r["lower_bound_bytes"]
    keys = sorted(k for k in layers if k != "rest") + (["rest"] if "rest" in layers else [])
    top = max(sum(layers[k][name] for name, _ in KINDS) for k in keys) or 1
    plot_h, left, bottom = 180, 60, 40
    step = (WIDTH - left - 20) / max(1, len(keys))
    parts = [f'<svg width="{WIDTH}" height="{plot_h + bottom + 24}" role="img">',
             f'<text x="4" y="14" font-size="11">{_bytes(top)}</text>',
             f'<line x1="{left}" y1="{10 + plot_h}" x2="{WIDTH - 10}" y2="{10 + plot_h}" stroke="#000"/>']
    for i, key in enumerate(keys):
        x, base = left + i * step, 10 + plot_h
        for name, color in KINDS:
            h = layers[key][name] / top * plot_h
            if h > 0:
                parts.append(f'<rect x="{x + 1:.1f}" y="{base - h:.1f}" width="{max(step - 2, 1):.1f}" height="{h:.1f}" '
                             f'fill="{color}"><title>layer {key}, {name}: {_bytes(layers[key][name])}</title></rect>')
                base -= h
        y = 10 + plot_h - layers[key]["bound"] / top * plot_h
        parts.append(f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x + step:.1f}" y2="{y:.1f}" stroke="#000" stroke-width="1.5">'
                     f'<title>lower bound {_bytes(layers[key]["bound"])}</title></line>')
        if len(keys) <= 40 or i % max(1, len(keys) // 20) == 0 or key == "rest":
            parts.append(f'<text x="{x + step / 2:.1f}" y="{plot_h + 24}" font-size="10" text-anchor="middle">{key}</text>')
    legend = "".join(f'<tspan fill="{color}">&#9632; {name} </tspan>' for name, color in KINDS)
    parts.append(f'<text x="{left}" y="{plot_h + bottom + 14}" font-size="11">{legend}'
                 f'<tspan fill="#000"> — lower bound</tspan> (x: layer)</text></svg>')
    return "".join(parts)


def _row(cells, header=False) -> str:
    tag = "th" if header else "td"
    return "<tr>" + "".join(f"<{tag}>{escape(str(c))}</{tag}>" for c in cells) + "</tr>"


OP_COLUMNS = ("op", "tile", "loop order", "double buffer", "SRAM", "DRAM", "lower bound", "ratio", "intensity (ops/B)",
              "bound", "cycles", "MAC util.", "fused")


def _op_cells(r: dict) -> list:
    tile = "x".join(f"{v}" for v in r["tile"].values())
    return [r["name"] + (f" (x{r['count']})" if r["count"] > 1 else ""), tile, ">".join(r["loop_order"]),
            "yes" if r["double_buffer"] else "no", _bytes(r["sram_bytes"]), _bytes(r["dram_bytes"]),
            _bytes(r["lower_bound_bytes"]), f"{r['ratio']:.3f}", r["intensity"], r["bound"], f"{r['cycles']:,}",
            f"{r['mac_utilization']:.1%}", ", ".join(r["fused"])]


def render(plan: dict) -> str:
    t, o = plan["target"], plan["options"]
    sram = t["sram"]["bytes"]
    out = ["<!DOCTYPE html><html><head><meta charset=\"utf-8\">",
           f"<title>NPU plan: {escape(plan['model'])} on {escape(t['name'])}</title><style>",
           "body{font:13px/1.4 system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0}"
           "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:first-child,th:first-child{text-align:left}"
           "th{background:#f3f3f3}h2{margin-top:28px}summary{cursor:pointer;font-weight:600}",
           "</style></head><body>",
           f"<h1>{escape(plan['model'])} on {escape(t['name'])}</h1>",
           f"<p>{escape(t['summary'])}. SRAM {_bytes(sram)} ({t['sram']['banks']} bank(s)), "
           f"MAC array {t['mac']['rows']}x{t['mac']['cols']} at {t['clock_mhz']:g} MHz, DRAM "
           f"{t['dram']['bytes_per_cycle']:g} B/cycle, {t['dma']['channels']} DMA channel(s), "
           f"{t['alignment_bytes']}-byte bursts. Operands {escape(o['dtype'])}, accumulators "
           f"{escape(o['accumulator'])}; prefill {o['batch']}x{o['tokens']} tokens, decode over {o['past']:,} cached.</p>",
           f"<p>Traffic: {escape(plan['accounting']['traffic'])}. Lower bound: "
           f"{escape(plan['accounting']['lower_bound'])} (S = {plan['accounting']['sram_words']:,} words).</p>",
           "<h2>Totals</h2><table>",
           _row(["phase", "DRAM", "lower bound", "ratio", "cycles", "time", "time/token", "tokens/s", "peak SRAM",
                 "MAC util.", "unplanned DRAM"], header=True)]
    for phase, tot in plan["totals"].items():
        out.append(_row([phase, _bytes(tot["dram_bytes"]), _bytes(tot["lower_bound_bytes"]), tot["ratio"],
                         f"{tot['cycles']:,}", _seconds(tot["seconds"]), _seconds(tot["seconds_per_token"]),
                         tot["tokens_per_second"], _bytes(tot["peak_sram_bytes"]),
                         f"{tot['mac_utilization']:.1%}" if tot["mac_utilization"] is not None else "-",
                         f"{_bytes(tot['unplanned']['dram_bytes'])} ({tot['unplanned']['nodes']} nodes)"]))
    out.append("</table>")
    for phase in plan["totals"]:
        records = [r for r in plan["ops"] if r["phase"] == phase]
        out += [f"<h2>{phase}</h2>", "<h3>SRAM occupancy (one op of each kind)</h3>", sram_svg(records, sram),
                "<h3>DRAM traffic per layer</h3>", traffic_svg(records),
                f"<details><summary>{len(records)} planned ops</summary><table>", _row(OP_COLUMNS, header=True)]
        out += [_row(_op_cells(r)) for r in records]
        out.append("</table></details>")
    out.append("</body></html>\n")
    return "\n".join(out)
