"""The report's figures for recurrent layers: the layer map (one cell per layer, coloured by
its kind: attention, Mamba, Mamba-2, gated DeltaNet, short conv, MLP only) and the memory
one sequence holds against context, the KV cache growing beside the recurrent state that
stays flat. Every number is ``irc.analysis``'s (``memory_against_context``, ``analyze``'s
per-layer table), so the report and ``irc show`` agree; the table's rows are the contexts
``irc show`` prints.
"""
from __future__ import annotations

import math
from html import escape

from irc.report import model, svg

CELL_W, CELL_H, GAP = 64, 40, 3


def layer_map(g: model.Glance) -> str:
    """The layer stack as a strip of cells (kind above, MLP below, state or KV on hover);
    empty for a model whose layers are all attention."""
    kinds = g.kinds
    if not kinds or set(kinds.values()) <= {"attention"}:
        return ""
    layers = {layer["index"]: layer for layer in g.summary["layers"]}
    per_row = 16
    indices = sorted(kinds)
    rows = math.ceil(len(indices) / per_row)
    body = ['<text class="title" x="4" y="16">Layer stack: each layer\'s mixer and MLP</text>']
    for n, i in enumerate(indices):
        kind, layer = kinds[i], layers[i]
        x, y = 4 + (n % per_row) * (CELL_W + GAP), 26 + (n // per_row) * (CELL_H + 18)
        mlp = {"moe": "MoE", "dense": "MLP"}.get(layer["mlp"], "-")
        facts = [f"layer {i}: {model.kind_words(kind)}", f"{layer['params']:,} parameters",
                 {"moe": "mixture-of-experts MLP", "dense": "dense MLP"}.get(layer["mlp"], "no MLP op")]
        if layer["kv_cache_elements_per_token"]:
            facts.append(f"KV cache {layer['kv_cache_elements_per_token']:,} elements per token (grows)")
        if i in g.state_bytes:
            facts.append(f"state {g.state_bytes[i]:,} bytes per sequence (fixed)")
        body.append(f'<g class="layer c-{model.kind_category(kind)}"><title>{escape("; ".join(facts))}</title>'
                    f'<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" rx="3"/>'
                    f'<text x="{x + 4}" y="{y + 14}">{i}</text>'
                    f'<text class="op" x="{x + 4}" y="{y + 27}">{escape(_short(kind))}</text>'
                    f'<text class="tick" x="{x + 4}" y="{y + CELL_H - 3}">{escape(mlp)}</text></g>')
    width = 8 + min(len(indices), per_row) * (CELL_W + GAP)
    legend_y = 26 + rows * (CELL_H + 18)
    x = 4
    for kind in dict.fromkeys(kinds[i] for i in indices):
        label = f"{_short(kind)} = {model.kind_words(kind)}"
        body.append(f'<g class="layer c-{model.kind_category(kind)}"><rect x="{x}" y="{legend_y - 9}" width="12" '
                    f'height="10"/></g><text class="tick" x="{x + 16}" y="{legend_y}">{escape(label)}</text>')
        x += 16 + len(label) * 6.2 + 14
    return svg.frame(max(width, x), legend_y + 8, body, "layer stack", "chart layers")


_SHORT = {"attention": "attn", "mamba": "mamba", "mamba2": "mamba2", "gated_delta": "delta", "kimi_delta": "kda",
          "lightning_attention": "light", "short_conv": "conv", "conv": "conv", "none": "mlp"}


def _short(kind: str) -> str:
    return "+".join(_SHORT.get(part, part[:6]) for part in kind.split("+"))


def kind_counts(g: model.Glance) -> str:
    """``7 Mamba selective scan, 1 attention (layer 4)``: the kinds in order of first use."""
    by_kind: dict[str, list] = {}
    for i in sorted(g.kinds):
        by_kind.setdefault(g.kinds[i], []).append(i)
    parts = []
    for kind, layers in by_kind.items():
        where = "" if len(layers) > 3 else f" (layer{'s' if len(layers) > 1 else ''} " \
                                           f"{', '.join(str(i) for i in layers)})"
        parts.append(f"{len(layers)} {model.kind_words(kind)}{where}")
    return ", ".join(parts)


def state_words(summary: dict) -> str:
    """``39,424 bytes (2,688 conv + 7,168 recurrent elements), the same at every context``."""
    kinds = summary["state_elements_by_kind"]
    parts = " + ".join(f"{kinds[k]:,} {k.replace('_state', '')}" for k in sorted(kinds))
    return f"{summary['state_bytes_per_sequence']:,} bytes ({parts} elements), the same at every context"


def memory_section(g: model.Glance) -> str:
    """The memory chart and table, or "" for a model without recurrent state."""
    if not g.memory:
        return ""
    xs = [row["context"] for row in g.memory]
    series = [svg.Series("KV cache (grows with the context)", [(x, r["kv_cache_bytes"]) for x, r in zip(xs, g.memory)]),
              svg.Series("recurrent state (flat)", [(x, r["state_bytes"]) for x, r in zip(xs, g.memory)]),
              svg.Series("total", [(x, r["total_bytes"]) for x, r in zip(xs, g.memory)], True)]
    chart = svg.line_chart(series, title="Memory per sequence against context: KV cache and recurrent state",
                           x_label="context (tokens)", y_label="bytes", y_format=svg.format_bytes, x_log2=False,
                           x_ticks=[0, *xs])
    table_xs = [row["context"] for row in g.memory_table]
    log_series = [svg.Series(s.label, [(x, r[k]) for x, r in zip(table_xs, g.memory_table)], s.dashed)
                  for s, k in zip(series, ("kv_cache_bytes", "state_bytes", "total_bytes"))]
    log_chart = svg.line_chart(log_series, title="The table's contexts (log2)", x_label="context (tokens)",
                               y_label="bytes", y_format=svg.format_bytes)
    head = "<tr><th>context</th><th>KV cache</th><th>recurrent state</th><th>total</th><th>state share</th></tr>"
    rows = "".join(
        f"<tr><td>{r['context']:,}</td>" + "".join(
            f"<td title='{r[k]:,} bytes'>{escape(svg.format_bytes(r[k]))}</td>"
            for k in ("kv_cache_bytes", "state_bytes", "total_bytes"))
        + f"<td>{svg.format_percent(r['state_bytes'] / r['total_bytes'] if r['total_bytes'] else 0.0)}</td></tr>"
        for r in g.memory_table)
    c = g.compiled
    text = (f"One sequence, all layers: the recurrent layers hold {escape(state_words(c))}; "
            f"the KV cache of the attention layers grows by {c['kv_cache_bytes_per_token']:,} bytes per token "
            f"(at {escape(c['cache_dtype'])}; states at their own dtype).")
    windowed = any(layer["window"] for layer in c["layers"])
    if c["kv_cache_bytes_per_token"] and not windowed:
        cross = -(-c["state_bytes_per_sequence"] // c["kv_cache_bytes_per_token"])
        text += f" The KV cache outgrows the state from {cross:,} tokens on."
    elif not c["kv_cache_bytes_per_token"]:
        text += " No layer attends: the memory is the same at every context."
    return (f'<h3 id="memory">Memory per sequence against context</h3><p>{text}</p>'
            f"<div class='charts'>{chart}{log_chart}</div>"
            f"<table class='num memory'>{head}{rows}</table>")
