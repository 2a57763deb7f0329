"""The report's MLA section: the absorption trade (``irc.analysis_mla``) as two tables, the
forms' numbers and the decode-roofline pick per device and context; the same numbers
``irc show`` prints."""
from __future__ import annotations

from html import escape

from irc.analysis_mla import count, mla_forms, size
from irc.graph import Graph
from irc.text import format_seconds


def render(graph: Graph) -> str:
    """The section's HTML, or "" for a graph without MLA."""
    trade = mla_forms(graph)
    if trade is None:
        return ""
    contexts = trade["contexts"]
    head = ("<tr><th>form</th><th>params</th><th>param bytes</th>"
            + "".join(f"<th>FLOPs/token @ {c:,}</th>" for c in contexts)
            + f"<th>KV bytes/token ({escape(trade['cache_dtype'])})</th>"
            + "".join(f"<th>bytes read/token @ {c:,}</th>" for c in contexts)
            + "".join(f"<th>FLOP/byte @ {c:,}</th>" for c in contexts) + "</tr>")
    rows = "".join(
        f"<tr><td class='l'>{escape(f['form'])}{' (compiled)' if f['form'] in trade['compiled'] else ''}</td>"
        f"<td>{f['params']:,}</td><td>{escape(size(f['param_bytes']))}</td>"
        + "".join(f"<td>{escape(count(f['flops_per_token'][c]))}</td>" for c in contexts)
        + f"<td>{escape(size(f['kv_bytes_per_token']))}</td>"
        + "".join(f"<td>{escape(size(f['bytes_per_token'][c]))}</td>" for c in contexts)
        + "".join(f"<td>{f['flops_per_byte'][c]:.3g}</td>" for c in contexts) + "</tr>"
        for f in trade["forms"])
    names = [f["form"] for f in trade["forms"]]
    roof_head = ("<tr><th>device</th><th>context</th>" + "".join(f"<th>{escape(n)}</th>" for n in names)
                 + "<th>fastest</th></tr>")
    roof = "".join(f"<tr><td class='l'>{escape(r['device'])}</td><td>{r['context']:,}</td>"
                   + "".join(f"<td>{escape(format_seconds(r['seconds'][n]))}</td>" for n in names)
                   + f"<td class='l'>{escape(r['fastest'])}</td></tr>" for r in trade["roofline"])
    return ('<h3 id="mla">MLA: absorbed at run time or folded</h3>'
            "<p>The model's MLA layers in each form (<code>mla-absorb</code> absorbs at run time: the checkpoint's "
            "weights, W<sup>UK</sup> and W<sup>UV</sup> applied per head; <code>mla-absorb{fold_weights=true}"
            "</code> folds them into the query and output weights). Per decoded token, batch 1; bytes read = the "
            "weights one token touches plus the whole cache. A device whose FLOP/s per byte/s exceeds a form's "
            "FLOP/byte decodes that form bandwidth-bound, and then the fewest bytes win.</p>"
            f"<table class='num'>{head}{rows}</table>"
            "<p>Decode roofline: time per token = max(bytes / bandwidth, FLOPs / compute), nominal figures.</p>"
            f"<table class='num'>{roof_head}{roof}</table>")
