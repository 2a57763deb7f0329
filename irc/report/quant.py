"""The ``quantize`` pass's figures in the report: what its dump stats hold under
``"quantize"`` (``irc.quant_report.pass_report``): the method, bytes before and after, SQNR
per layer against round-to-nearest's, the evaluation on a text (``--eval-text``) when there
was one, for a recurrent model the error against position (128, 1,024, 4,096) and the
params kept float on purpose, and the weakest tensors."""
from __future__ import annotations

import re
from html import escape

from irc.report.svg import column_chart

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
SHOWN = 40


def _layer(name: str) -> str:
    match = _LAYER.search(name)
    return match.group(1) if match else "other"


def _db(value) -> str:
    return "–" if value is None else f"{value:.1f} dB"


def render(report: dict) -> str:
    """HTML for one quantize step's report (empty when there is none)."""
    if not report or "summary" not in report:
        return ""
    summary, tensors = report["summary"], report.get("tensors", [])
    facts = [f"method <b>{escape(str(report.get('method')))}</b>, {summary['tensors']} tensors",
             f"params {summary['param_bytes_float'] / 1e6:,.1f} MB → "
             f"{summary['param_bytes_quantized'] / 1e6:,.1f} MB",
             f"SQNR mean {_db(summary.get('mean_sqnr_db'))}, min {_db(summary.get('min_sqnr_db'))}"]
    if summary.get("mean_sqnr_rtn_db") is not None:
        facts.append(f"round-to-nearest: mean {_db(summary['mean_sqnr_rtn_db'])}, "
                     f"min {_db(summary['min_sqnr_rtn_db'])}")
    parts = ["<div class='quant'><p class='facts'>" + "; ".join(facts) + "</p>"]
    result = report.get("eval")
    if result:
        parts.append(f"<p class='facts'>eval text, {result['tokens']} tokens (reference interpreter): perplexity "
                     f"{result['perplexity_float']:.3f} float → <b>{result['perplexity_quantized']:.3f}</b> "
                     f"quantized; top-1 agreement with the float graph <b>{result['top1_agreement']:.1%}</b></p>")
    parts.append(_positions(report.get("positions")))
    parts.append(_kept(report.get("kept") or []))
    if tensors:
        parts.append(_chart(report, tensors))
        parts.append(_table(tensors))
    parts.append("</div>")
    return "\n".join(parts)


def _positions(curve) -> str:
    """The error against position of a recurrent model (empty without one)."""
    if not curve:
        return ""
    if curve.get("skipped"):
        return f"<p class='facts'>error against position: skipped ({escape(curve['skipped'])})</p>"
    rows = [f"<p class='facts'>error against position, {curve['tokens']} tokens in chunks of {curve['chunk']} "
            "through the states (reference interpreter):</p><table class='num'><tr><th class='l'>positions</th>"
            "<th>logits rms relative error</th><th>max relative error</th><th>top-1 agreement</th></tr>"]
    for row in curve.get("rows", []):
        rows.append(f"<tr><td class='l'>{row['start']}–{row['stop']}</td><td>{row['rms_relative_error']:.4g}</td>"
                    f"<td>{row['max_relative_error']:.4g}</td><td>{row['top1_agreement']:.1%}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def _kept(kept: list) -> str:
    """The params kept float on purpose, and why."""
    if not kept:
        return ""
    rows = [f"<details><summary>Kept float on purpose ({len(kept)})</summary><table><tr><th class='l'>param</th>"
            "<th class='l'>why</th></tr>"]
    rows += [f"<tr><td class='l'>{escape(k['name'])}</td><td class='l'>{escape(k['reason'])}</td></tr>" for k in kept]
    rows.append("</table></details>")
    return "".join(rows)


def _chart(report: dict, tensors: list) -> str:
    layers: dict[str, list] = {}
    for t in tensors:
        layers.setdefault(_layer(t["name"]), []).append(t)
    names = sorted(layers, key=lambda n: (n == "other", int(n) if n.isdigit() else 0))

    def mean(key, rows):
        values = [r[key] for r in rows if r.get(key) is not None and r[key] != float("inf")]
        return sum(values) / len(values) if values else 0.0

    series = [(str(report.get("method")), [mean("sqnr_db", layers[n]) for n in names])]
    if any("sqnr_rtn_db" in t for t in tensors):
        series.append(("rtn", [mean("sqnr_rtn_db", layers[n]) for n in names]))
    return column_chart(names, series, title="Mean SQNR per layer (dB, higher is better)", y_label="dB",
                        y_format=lambda v: f"{v:.0f}", width=940)


def _table(tensors: list) -> str:
    worst = sorted(tensors, key=lambda t: (t["sqnr_db"], t["name"]))[:SHOWN]
    rows = ["<details><summary>Tensors by SQNR, lowest first "
            f"({min(SHOWN, len(tensors))} of {len(tensors)})</summary><table class='num'><tr><th class='l'>tensor"
            "</th><th>shape</th><th>scheme</th><th>SQNR</th><th>rtn SQNR</th><th>max error (steps)</th></tr>"]
    for t in worst:
        scheme = f"int{t['bits']} b{t['block_size']} {'sym' if t['symmetric'] else 'asym'}"
        rows.append(f"<tr><td class='l'>{escape(t['name'])}</td><td>{escape('x'.join(map(str, t['shape'])))}</td>"
                    f"<td>{escape(scheme)}</td><td>{_db(t['sqnr_db'])}</td><td>{_db(t.get('sqnr_rtn_db'))}</td>"
                    f"<td>{t['max_error_steps']:.2f}</td></tr>")
    rows.append("</table></details>")
    return "".join(rows)


__all__ = ["render"]
