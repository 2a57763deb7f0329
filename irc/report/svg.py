"""Inline SVG: graph pictures (from ``layout``) and the report's charts, no libraries.

Charts are plain functions of their data: ``line_chart`` (log2 or linear x), ``bar_chart``
(horizontal, one bar per row), ``column_chart`` (grouped columns, with an optional
reference line) and ``timeline`` (the pipeline as consecutive segments). Numbers are
rounded to one decimal in coordinates, so the same data gives the same bytes. Every mark
carries a ``<title>`` with its exact value, shown on hover.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Callable, Optional, Sequence

from irc.report.layout import CHAR_W, LINE_H, PAD_X, PAD_Y, Picture
from irc.text import DECIMAL, format_bytes, in_unit

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f")


def _n(v: float) -> str:
    """A coordinate: one decimal, no trailing zeros, never "-0"."""
    text = f"{v:.1f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def format_count(n: float) -> str:
    scaled = in_unit(n, DECIMAL)
    return f"{scaled[0]:.3g}{scaled[1]}" if scaled else f"{n:.3g}"


def format_context(n: float) -> str:
    return f"{n / 1024:g}K" if n >= 1024 and n % 1024 == 0 else f"{n:g}"


def format_percent(v: float) -> str:
    return f"{100 * v:.1f}%"


def _svg(width: float, height: float, body: list, label: str, cls: str) -> str:
    return (f'<svg class="{cls}" viewBox="0 0 {_n(width)} {_n(height)}" width="{_n(width)}" height="{_n(height)}" '
            f'role="img" aria-label="{escape(label)}">' + "".join(body) + "</svg>")


def frame(width: float, height: float, body: list, label: str, cls: str) -> str:
    """An ``<svg>`` element of the given size around ``body`` (for figures drawn elsewhere)."""
    return _svg(width, height, body, label, cls)


# ---- graph pictures --------------------------------------------------------------------

_CATEGORY = {
    "matmul": "mm", "linear": "mm", "attention": "attn", "mla_attention": "attn", "mla_absorbed_attention": "attn",
    "mla_latent_attention": "attn",
    "moe": "moe", "moe_sorted": "moe", "swiglu": "mlp", "geglu": "mlp", "gelu_mlp": "mlp",
    "rms_norm": "norm", "layer_norm": "norm", "rope": "rope", "embedding": "embed",
    "reshape": "move", "transpose": "move", "concat": "move", "slice": "move", "gather": "move",
    "broadcast": "move", "expand": "move", "repeat": "move", "cast": "move",
    "selective_scan": "scan", "ssd": "scan", "gated_delta_rule": "delta", "causal_conv1d": "conv",
    "gated_rms_norm": "norm",
}


def graph_svg(pic: Picture, label: str) -> str:
    body = []
    for e in pic.edges:
        body.append(_edge_path(e))
    for b in pic.boxes:
        body.append(_box(b))
    return _svg(pic.width, pic.height, body, label, "graph")


def _edge_path(e) -> str:
    pts = e.points
    d = [f"M{_n(pts[0][0])},{_n(pts[0][1])}"]
    if e.residual:                 # bow out to the left of both ends
        (x0, y0), (x1, y1) = pts[0], pts[-1]
        bow = min(x0, x1) - 26 - min(60.0, (y1 - y0) * 0.04)
        d.append(f"C{_n(bow)},{_n(y0 + 18)} {_n(bow)},{_n(y1 - 18)} {_n(x1)},{_n(y1)}")
    else:
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if abs(x0 - x1) < 0.05:
                d.append(f"L{_n(x1)},{_n(y1)}")
            else:
                mid = (y0 + y1) / 2
                d.append(f"C{_n(x0)},{_n(mid)} {_n(x1)},{_n(mid)} {_n(x1)},{_n(y1)}")
    cls, marker = ("edge residual", "arrow-residual") if e.residual else ("edge", "arrow")
    title = f"<title>{'residual: ' if e.residual else ''}{e.count} value{'s' if e.count != 1 else ''}</title>"
    return f'<path class="{cls}" d="{" ".join(d)}" marker-end="url(#{marker})">{title}</path>'


def _box(b) -> str:
    x, y = b.x - b.w / 2, b.y
    cat = _CATEGORY.get(b.op, "op") if b.kind == "op" else b.kind
    radius = 12 if b.kind == "io" else 3
    role = f" role-{b.role}" if b.role else ""
    parts = [f'<g class="node {b.kind} c-{cat}{role}">']
    title = b.title or " / ".join(b.lines)
    parts.append(f"<title>{escape(title)}</title>")
    parts.append(f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(b.w)}" height="{_n(b.h)}" rx="{radius}"/>')
    parts.append(f'<text x="{_n(x + PAD_X)}" y="{_n(y + PAD_Y + LINE_H - 3)}">')
    for i, line in enumerate(b.lines):
        cls = ' class="op"' if i == 0 else ""
        parts.append(f'<tspan x="{_n(x + PAD_X)}" dy="{0 if i == 0 else _n(LINE_H)}"{cls}>{escape(line)}</tspan>')
    parts.append("</text></g>")
    inner = "".join(parts)
    if b.href:
        return f'<a href="{escape(b.href)}">{inner}</a>'
    return inner


# ---- charts ----------------------------------------------------------------------------

def _y_grid(y_hi: float, py: Callable, left: float, plot_w: float, y_format: Callable) -> list[str]:
    """Horizontal grid lines with their labels, from 0 to ``y_hi``."""
    out = []
    for t in _ticks(0, y_hi):
        y = _n(py(t))
        out.append(f'<line class="grid" x1="{left}" x2="{left + plot_w}" y1="{y}" y2="{y}"/>')
        out.append(f'<text class="tick" x="{left - 6}" y="{_n(py(t) + 4)}" text-anchor="end">'
                   f'{escape(y_format(t))}</text>')
    return out


@dataclass
class Series:
    label: str
    points: list                  # (x, y)
    dashed: bool = False


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    step = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * step:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def line_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str,
               y_format: Callable[[float], str] = format_count, x_format: Callable[[float], str] = format_context,
               x_log2: bool = True, x_ticks: Optional[Sequence[float]] = None, y_max: Optional[float] = None,
               width: int = 600, height: int = 300) -> str:
    """Lines over x (log2 by default); the legend sits under the plot, one entry a line."""
    left, right, top, bottom = 74, 16, 28, 44
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    fx = math.log2 if x_log2 else (lambda v: v)
    x_lo, x_hi = fx(min(xs)), fx(max(xs))
    if not x_log2:
        x_lo = 0.0
    y_hi = y_max if y_max is not None else (max(ys) * 1.05 if ys and max(ys) > 0 else 1.0)
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(v):
        return left + (fx(v) - x_lo) / ((x_hi - x_lo) or 1) * plot_w

    def py(v):
        return top + plot_h - v / y_hi * plot_h

    body = [f'<text class="title" x="{left}" y="16">{escape(title)}</text>']
    body += _y_grid(y_hi, py, left, plot_w, y_format)
    for t in (x_ticks if x_ticks is not None else sorted(set(xs))):
        body.append(f'<line class="grid" x1="{_n(px(t))}" x2="{_n(px(t))}" y1="{top}" y2="{top + plot_h}"/>')
        body.append(f'<text class="tick" x="{_n(px(t))}" y="{top + plot_h + 16}" text-anchor="middle">'
                    f'{escape(x_format(t))}</text>')
    body.append(f'<text class="axis" x="{left + plot_w / 2:.0f}" y="{top + plot_h + 36}" text-anchor="middle">'
                f'{escape(x_label)}</text>')
    body.append(f'<text class="axis" transform="translate(14,{top + plot_h / 2:.0f}) rotate(-90)" '
                f'text-anchor="middle">{escape(y_label)}</text>')
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        path = " ".join(f"{'M' if k == 0 else 'L'}{_n(px(x))},{_n(py(y))}" for k, (x, y) in enumerate(s.points))
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        body.append(f'<path class="line" d="{path}" stroke="{color}"{dash}><title>{escape(s.label)}</title></path>')
        for x, y in s.points:
            body.append(f'<circle cx="{_n(px(x))}" cy="{_n(py(y))}" r="2.5" fill="{color}">'
                        f'<title>{escape(s.label)} at {escape(x_format(x))}: {escape(y_format(y))}</title></circle>')
    legend_top = height + 4
    for i, s in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        y = legend_top + i * 16
        body.append(f'<line x1="{left}" x2="{left + 22}" y1="{y}" y2="{y}" stroke="{color}" stroke-width="2"{dash}/>'
                    f'<text class="legend" x="{left + 28}" y="{y + 4}">{escape(s.label)}</text>')
    return _svg(width, height + 16 * len(series) + 4, body, title, "chart")


def bar_chart(rows: Sequence[tuple], *, title: str, value_format: Callable[[float], str] = format_count,
              width: int = 600) -> str:
    """Horizontal bars: rows of (label, value, note)."""
    label_w = max([len(r[0]) for r in rows] + [4]) * 6.6 + 12
    bar_h, top = 20, 28
    height = top + bar_h * len(rows) + 10
    hi = max([r[1] for r in rows] + [1])
    plot_w = width - label_w - 190
    body = [f'<text class="title" x="4" y="16">{escape(title)}</text>']
    for i, (label, value, note) in enumerate(rows):
        y = top + i * bar_h
        w = value / hi * plot_w
        body.append(f'<text class="tick" x="{_n(label_w - 6)}" y="{y + 14}" text-anchor="end">{escape(label)}</text>')
        body.append(f'<rect class="bar" x="{_n(label_w)}" y="{y + 3}" width="{_n(max(w, 0.5))}" height="{bar_h - 6}" '
                    f'fill="{PALETTE[i % len(PALETTE)]}"><title>{escape(label)}: {value:,}</title></rect>')
        body.append(f'<text class="value" x="{_n(label_w + w + 6)}" y="{y + 14}">{escape(value_format(value))}'
                    f'{(" · " + escape(note)) if note else ""}</text>')
    return _svg(width, height, body, title, "chart")


def column_chart(categories: Sequence[str], series: Sequence[tuple], *, title: str, y_label: str,
                 y_format: Callable[[float], str] = format_bytes, reference: Optional[tuple] = None,
                 width: int = 600, height: int = 280) -> str:
    """Grouped columns: ``series`` is (label, values per category); ``reference`` (label,
    value) draws a horizontal line, such as an SRAM capacity."""
    left, right, top, bottom = 74, 16, 44, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    values = [v for _, vs in series for v in vs] + ([reference[1]] if reference else [])
    y_hi = max(values + [1]) * 1.08
    slot = plot_w / max(len(categories), 1)
    bar_w = max(1.0, slot * 0.8 / max(len(series), 1))

    def py(v):
        return top + plot_h - v / y_hi * plot_h

    body = [f'<text class="title" x="{left}" y="16">{escape(title)}</text>']
    body += _y_grid(y_hi, py, left, plot_w, y_format)
    every = max(1, math.ceil(len(categories) / 24))
    for c, name in enumerate(categories):
        x0 = left + c * slot + slot * 0.1
        for s, (label, vals) in enumerate(series):
            v = vals[c]
            body.append(f'<rect class="bar" x="{_n(x0 + s * bar_w)}" y="{_n(py(v))}" width="{_n(bar_w)}" '
                        f'height="{_n(top + plot_h - py(v))}" fill="{PALETTE[s % len(PALETTE)]}">'
                        f'<title>{escape(name)} {escape(label)}: {escape(y_format(v))} ({v:,})</title></rect>')
        if c % every == 0:
            body.append(f'<text class="tick" x="{_n(left + (c + 0.5) * slot)}" y="{top + plot_h + 14}" '
                        f'text-anchor="middle">{escape(name)}</text>')
    if reference:
        y = py(reference[1])
        body.append(f'<line class="reference" x1="{left}" x2="{left + plot_w}" y1="{_n(y)}" y2="{_n(y)}">'
                    f'<title>{escape(reference[0])}: {escape(y_format(reference[1]))}</title></line>')
        body.append(f'<text class="tick" x="{left + plot_w}" y="{_n(y - 4)}" text-anchor="end">'
                    f'{escape(reference[0])}</text>')
    body.append(f'<text class="axis" transform="translate(14,{top + plot_h / 2:.0f}) rotate(-90)" '
                f'text-anchor="middle">{escape(y_label)}</text>')
    for s, (label, _) in enumerate(series):
        body.append(f'<rect x="{left + 8 + s * 170}" y="24" width="12" height="10" fill="{PALETTE[s % len(PALETTE)]}"/>'
                    f'<text class="tick" x="{left + 24 + s * 170}" y="33">{escape(label)}</text>')
    return _svg(width, height, body, title, "chart")


def timeline(segments: Sequence[tuple], *, title: str, width: int = 940) -> str:
    """The pipeline left to right: segments of (label, seconds or None, changed, href).
    Widths follow the times where all are known, else each segment is one equal slot."""
    known = all(s[1] is not None for s in segments) and sum(s[1] for s in segments) > 0
    total = sum(s[1] for s in segments) if known else len(segments)
    top, bar_h, plot_w = 24, 30, width - 20
    min_w = 4.0
    raw = [(s[1] if known else 1) / (total or 1) * plot_w for s in segments]
    scale = (plot_w - min_w * len(raw)) / (sum(raw) or 1)
    widths = [min_w + w * scale for w in raw]
    body = [f'<text class="title" x="10" y="16">{escape(title)}</text>']
    x = 10.0
    for (label, seconds, changed, href), w in zip(segments, widths):
        cls = "seg changed" if changed else "seg unchanged"
        when = f"{seconds * 1000:.1f} ms" if seconds is not None else "time not recorded"
        state = "changed" if changed else "unchanged"
        rect = (f'<rect class="{cls}" x="{_n(x)}" y="{top}" width="{_n(w - 1)}" height="{bar_h}">'
                f'<title>{escape(label)}: {state}, {escape(when)}</title></rect>')
        text = ""
        if w > 7 * len(label) * 0.9:
            on = "on" if changed else "off"
            text = f'<text class="seglabel {on}" x="{_n(x + 4)}" y="{top + 19}">{escape(label)}</text>'
        body.append(f'<a href="{escape(href)}">{rect}{text}</a>' if href else rect + text)
        x += w
    return _svg(width, top + bar_h + 8, body, title, "chart timeline")


def arrow_defs() -> str:
    """The arrowhead every graph picture's edges end in (one per page)."""
    markers = "".join(
        f'<marker id="{name}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        f'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="{color}"/></marker>'
        for name, color in (("arrow", "#667"), ("arrow-residual", "#e07b00")))
    return f'<svg class="defs" width="0" height="0" aria-hidden="true"><defs>{markers}</defs></svg>'


__all__ = ["Series", "frame", "line_chart", "bar_chart", "column_chart", "timeline", "graph_svg", "arrow_defs",
           "format_bytes", "format_count", "format_context", "format_percent", "CHAR_W"]
