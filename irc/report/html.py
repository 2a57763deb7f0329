"""``build_report``: one self-contained HTML page for a pipeline run.

Sections: the pipeline as a timeline (time, changed, check error, stats deltas per pass);
for each pass that changed the graph, its IR diff (changed regions with context, alike
layers folded into one) and pictures of the affected subgraph before and after; the model
at a glance (a transformer block, the layers that differ, parameters by component, KV
cache and FLOPs against context in both accountings); the NPU plan when there is one; and
the spec sources the nodes link to. Inline CSS and SVG only: no script, no network, no
timestamp, so the same input gives the same bytes (pass times are input: ``times=False``
leaves them out for reports that must match across runs).
"""
from __future__ import annotations

import os
from html import escape
from typing import Optional, Sequence, Union

from irc.errors import IRCError
from irc.graph import Graph
from irc.parser import parse_graph
from irc.report import diff, layout, mla, model, npu, provenance, quant, recurrent, svg
from irc.report.diff import layer_index
from irc.report.steps import Step, load_steps

MAX_GROUPS = 12            # region groups shown per pass
MAX_PICTURED = 3           # of which pictured before/after
MAX_REGION_LINES = 160
MAX_LINE = 240
STAT_COLUMNS = (("nodes", "nodes", "{:,}".format), ("param_bytes", "param bytes", svg.format_bytes),
                ("flops_per_token", "FLOPs/token", svg.format_count),
                ("kv_cache_bytes_per_token", "KV bytes/token", svg.format_bytes))


def build_report(dump: Union[str, Sequence[Step]], graph: Optional[Graph] = None, *,
                 input_graph: Optional[Graph] = None, records: Optional[Sequence] = None,
                 passes: Optional[Sequence] = None, npu_plan: Optional[dict] = None,
                 source_dirs: Sequence[str] = (), times: bool = True, title: Optional[str] = None) -> str:
    """The report page as a string.

    ``dump``: a dump directory (``NN-<pass>.ir`` + ``.stats.json``) or its ``Step``s;
    ``graph``: the final graph in memory (else the last dump, parsed); ``input_graph``: the
    graph before the passes, with its ``Node.origin``s (else the first dump, without
    origins); ``records``/``passes``: the pass manager's, for times and rule notes;
    ``npu_plan``: a plan dict (else ``graph.meta["npu_plan"]`` or ``plan.json`` in the dump
    directory); ``source_dirs``: where relative origin paths may be found."""
    dump_dir = dump if isinstance(dump, (str, os.PathLike)) else None
    steps = load_steps(str(dump), records, passes) if dump_dir is not None else list(dump)
    parsed = _Parsed(steps)
    final = graph if graph is not None else parsed.get(len(steps) - 1)
    source = input_graph if input_graph is not None else parsed.get(0)
    if final is None or source is None:
        raise IRCError("cannot read the dumped IR back", hint=parsed.error or "")
    found = {}
    for i, step in enumerate(steps[1:], start=1):
        changes = diff.regions(steps[i - 1].text, step.text) if step.changed is not False else []
        if changes:
            found[step.index] = changes
    prov = provenance.build(steps, found, [g for g in (input_graph, graph) if g is not None], source_dirs)
    context = steps[0].stats.get("context", 4096)
    if isinstance(context, bool) or not isinstance(context, int) or not 1 <= context <= 1 << 30:
        raise IRCError(f"the first dump's stats give context {str(context)[:40]}; expected a positive integer",
                       location=str(dump_dir))
    plan = npu_plan if npu_plan is not None else npu.find_plan(final.meta, str(dump_dir) if dump_dir else None)
    name = title or final.name
    body = [f"<header><h1>irc report: {escape(name)}</h1>", _summary(steps, final, times), _nav(plan), "</header>",
            '<section id="pipeline"><h2>Pipeline</h2>', _pipeline(steps, times), "</section>",
            '<section id="passes"><h2>Passes that changed the graph</h2>',
            _passes(steps, found, parsed, prov, times), "</section>",
            '<section id="model"><h2>Model at a glance</h2>', _model(source, final, context, prov), "</section>"]
    if plan is not None:
        body += ['<section id="npu"><h2>NPU plan</h2>', npu.render(plan), "</section>"]
    body += ['<section id="sources"><h2>Sources</h2>',
             provenance.sources_html(prov) or "<p>No spec source was found for the node origins; give "
             "<code>irc report --spec SPEC</code> to link nodes to their spec lines.</p>", "</section>"]
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>irc report: {escape(name)}</title>'
            f"<style>{CSS}</style></head><body>{svg.arrow_defs()}\n" + "\n".join(body) + "\n</body></html>\n")


def npu_page(plan: dict) -> str:
    """An NPU plan alone as one self-contained page (``irc tile --report``): the report's
    NPU section (``irc.report.npu.render``) under the report's style; same plan, same bytes."""
    target = plan.get("target") if isinstance(plan.get("target"), dict) else {}
    name = f"{plan.get('model', 'model')} on {target.get('name', 'an NPU')}"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>NPU plan: {escape(name)}</title>'
            f"<style>{CSS}</style></head><body>\n<header><h1>NPU plan: {escape(name)}</h1></header>\n"
            f'<section id="npu">{npu.render(plan)}</section>\n</body></html>\n')


class _Parsed:
    """Dumped IR parsed back on demand (only the steps the report pictures)."""

    def __init__(self, steps):
        self.steps, self.graphs, self.error = steps, {}, None

    def get(self, index: int) -> Optional[Graph]:
        if index not in self.graphs:
            step = self.steps[index]
            try:
                self.graphs[index] = parse_graph(step.text, source=f"{step.index:02d}-{step.name}.ir")
            except IRCError as err:
                self.error = f"{step.index:02d}-{step.name}.ir: {err}"
                self.graphs[index] = None
        return self.graphs[index]


# ---- header and pipeline ---------------------------------------------------------------

def _summary(steps, final: Graph, times: bool) -> str:
    first, last = steps[0].stats, steps[-1].stats
    changed = sum(1 for s in steps[1:] if s.changed)
    checked = [s.check_error for s in steps[1:] if s.check_error is not None]
    text = (f"{len(steps) - 1} passes, {changed} changed the graph; nodes {first.get('nodes', '?'):,} → "
            f"{last.get('nodes', len(final.nodes)):,}.") if isinstance(first.get("nodes"), int) else \
        f"{len(steps) - 1} passes, {changed} changed the graph."
    if checked:
        text += f" Numeric check after {len(checked)} passes: max relative error {max(checked):.2e}."
    if times and all(s.seconds is not None for s in steps[1:]) and len(steps) > 1:
        text += f" Pass time {sum(s.seconds for s in steps[1:]) * 1000:.1f} ms."
    return f"<p>{escape(text)}</p>"


def _nav(plan) -> str:
    links = [("pipeline", "Pipeline"), ("passes", "Passes"), ("model", "Model"), ("sources", "Sources")]
    if plan is not None:
        links.insert(3, ("npu", "NPU plan"))
    return "<nav>" + " · ".join(f'<a href="#{k}">{v}</a>' for k, v in links) + "</nav>"


def _delta(now, before, fmt) -> str:
    if not isinstance(now, (int, float)):
        return "<td>–</td>"
    if not isinstance(before, (int, float)) or now == before:
        return f"<td>{escape(fmt(now))}</td>"
    change = now - before
    sign = "+" if change > 0 else "−"
    return (f"<td>{escape(fmt(now))} <span class='{'up' if change > 0 else 'down'}'>{sign}"
            f"{escape(fmt(abs(change)))}</span></td>")


def _pipeline(steps, times: bool) -> str:
    segments = [(s.label, s.seconds if times else None, bool(s.changed),
                 f"#pass-{s.index:02d}" if s.changed else None) for s in steps[1:]]
    parts = []
    if segments:
        label = "pass times, left to right" if times and all(s[1] is not None for s in segments) else \
            "passes in order (times not shown)"
        parts.append(svg.timeline(segments, title=f"Pipeline: {label}; dark = changed the graph"))
    head = "".join(f"<th>{escape(label)}</th>" for _, label, _ in STAT_COLUMNS)
    parts.append(f"<table class='num pipeline'><tr><th>#</th><th class='l'>pass</th><th>time</th><th>changed</th>"
                 f"<th>check error</th>{head}</tr>")
    previous: dict = {}
    for s in steps:
        when = f"{s.seconds * 1000:.1f} ms" if times and s.seconds is not None else "–"
        changed = "input" if s.index == 0 else ("changed" if s.changed else "unchanged")
        check = f"{s.check_error:.2e}" if s.check_error is not None else "–"
        name = (f'<a href="#pass-{s.index:02d}">{escape(s.label)}</a>' if s.changed else escape(s.label))
        cells = "".join(_delta(s.stats.get(k), previous.get(k), fmt) for k, _, fmt in STAT_COLUMNS)
        parts.append(f"<tr class='{changed}'><td>{s.index:02d}</td><td class='l'>{name}</td><td>{when}</td>"
                     f"<td>{changed}</td><td>{check}</td>{cells}</tr>")
        previous = s.stats
    parts.append("</table>")
    if steps[1:] and all(s.seconds is None for s in steps[1:]) and times:
        parts.append("<p class='note'>The dump holds no pass times (no <code>seconds</code> in its "
                     "<code>.stats.json</code>).</p>")
    return "\n".join(parts)


# ---- passes ----------------------------------------------------------------------------

def _passes(steps, found: dict, parsed: _Parsed, prov, times: bool) -> str:
    parts = []
    for step in steps[1:]:
        regions = found.get(step.index)
        if not step.changed and not regions:
            continue
        parts.append(_pass(step, steps[step.index - 1], regions or [], parsed, prov, times))
    return "\n".join(parts) or "<p>No pass changed the graph.</p>"


def _pass(step, before_step, regions, parsed: _Parsed, prov, times: bool) -> str:
    groups = diff.group_regions(regions)
    label = f"{step.index:02d} {step.label}"
    facts = []
    if times and step.seconds is not None:
        facts.append(f"{step.seconds * 1000:.1f} ms")
    if step.check_error is not None:
        facts.append(f"check error {step.check_error:.2e}")
    facts.append(f"{len(regions)} changed region{'s' if len(regions) != 1 else ''} in {len(groups)} "
                 f"kind{'s' if len(groups) != 1 else ''}")
    parts = [f'<article class="pass" id="pass-{step.index:02d}"><h3>{escape(label)}</h3>'
             f"<p class='facts'>{escape('; '.join(facts))}</p>"]
    if step.notes:
        parts.append("<ul class='notes'>" + "".join(f"<li>{escape(str(n))}</li>" for n in step.notes) + "</ul>")
    if isinstance(step.stats.get("quantize"), dict):  # the quantize pass's own figures
        parts.append(quant.render(step.stats["quantize"]))
    for number, group in enumerate(groups[:MAX_GROUPS]):
        parts.append(_group(step, before_step, group, number, parsed, prov))
    if len(groups) > MAX_GROUPS:
        rest = sum(len(g.regions) for g in groups[MAX_GROUPS:])
        parts.append(f"<p class='note'>{len(groups) - MAX_GROUPS} more kinds of change ({rest} regions) not shown; "
                     f"<code>diff {before_step.index:02d}-{before_step.name}.ir {step.index:02d}-{step.name}.ir</code> "
                     "has them all.</p>")
    parts.append("</article>")
    return "\n".join(parts)


def _where(group) -> str:
    layers = group.layers()
    n = len(group.regions)
    if not layers:
        return "outside the layers" + (f" ({n} regions alike)" if n > 1 else "")
    shown = group.first.layer
    text = f"layer{'s' if len(layers) > 1 else ''} {diff.compact_ranges(layers)}"
    if n > 1:
        text += f": {n} regions alike up to names, layer {shown} shown" if shown is not None else f": {n} regions alike"
    return text


def _group(step, before_step, group, number, parsed: _Parsed, prov) -> str:
    region = group.first
    parts = [f"<div class='region'><h4>{escape(_where(group))} · rewritten by <b>{escape(step.label)}</b></h4>"]
    lines = region.lines[:MAX_REGION_LINES]
    out = []
    for tag, text in lines:
        shown = text if len(text) <= MAX_LINE else text[:MAX_LINE] + f"… ({len(text) - MAX_LINE:,} more characters)"
        name = diff.line_name(text)
        cls = {"-": "del", "+": "add", " ": "ctx"}[tag]
        origin = prov.origin_html(name) if name and tag != " " and not name.startswith("@") else ""
        title = f' title="{escape(prov.describe(name))}"' if name and tag != " " and not name.startswith("@") else ""
        out.append(f"<span class='{cls}'{title}><span class='gutter'>{origin}</span>{escape(tag + shown)}</span>")
    if len(region.lines) > MAX_REGION_LINES:
        more = len(region.lines) - MAX_REGION_LINES
        out.append(f"<span class='ctx'><span class='gutter'></span>… {more} more lines</span>")
    parts.append("<pre class='diff'>" + "".join(out) + "</pre>")
    if number < MAX_PICTURED:
        parts.append(_before_after(step, before_step, region, parsed, prov))
    parts.append("</div>")
    return "\n".join(parts)


def _before_after(step, before_step, region, parsed: _Parsed, prov) -> str:
    removed = {n for n in region.removed if not n.startswith("@")}
    added = {n for n in region.added if not n.startswith("@")}
    if not removed and not added:
        return ""
    figures = []
    for caption, index, names in (("before", before_step.index, removed), ("after", step.index, added)):
        graph = parsed.get(index)
        if graph is None:
            figures.append(f"<figure><figcaption>{caption}</figcaption><p class='note'>not pictured: "
                           f"{escape(parsed.error or '')}</p></figure>")
            continue
        if not names:
            figures.append(f"<figure><figcaption>{caption}</figcaption><p class='note'>no node</p></figure>")
            continue
        pic = layout.place(layout.picture(graph, lambda n, names=names: n.name in names, context=True,
                                          link=prov.link, max_boxes=40))
        note = f"<p class='note'>{escape(pic.note)}</p>" if pic.note else ""
        figures.append(f"<figure><figcaption>{caption} ({escape(f'{index:02d}')}; faded: neighbours)</figcaption>"
                       f"<div class='scroll'>{svg.graph_svg(pic, f'{caption} {step.label}')}</div>{note}</figure>")
    return "<div class='pair'>" + "".join(figures) + "</div>"


# ---- model at a glance -----------------------------------------------------------------

def _model(source: Graph, final: Graph, context: int, prov) -> str:
    g = model.glance(source, final, context)
    s, c, meta = g.summary, g.compiled, source.meta
    rows = [("parameters", f"{s['params_total']:,}" + (f" ({s['params_active']:,} active)"
                                                        if s["params_active"] != s["params_total"] else "")),
            ("parameter bytes (compiled)", f"{c['param_bytes']:,} ({svg.format_bytes(c['param_bytes'])})"),
            ("layers", f"{s['n_layers']}"),
            ("d_model / vocab", f"{meta.get('d_model', '?')} / {meta.get('vocab_size', '?')}")]
    if g.recurrent:
        rows.append(("layer kinds", recurrent.kind_counts(g)))
    if meta.get("attention") or not g.recurrent:
        rows.append(("attention", f"{meta.get('attention', '?')}: {meta.get('n_heads', '?')} heads, "
                                  f"{meta.get('n_kv_heads', '?')} KV heads, head dim {meta.get('head_dim', '?')}"))
    rows += [
            (f"FLOPs/token at {context:,} (irc forward)", f"{s['flops_per_token']:,}"),
            ("KV-cache bytes/token (input → compiled)",
             f"{s['kv_cache_bytes_per_token']:,} → {c['kv_cache_bytes_per_token']:,} ({s['cache_dtype']})"),
            ("nodes (input → compiled)", f"{len(source.nodes):,} → {len(final.nodes):,}")]
    if g.recurrent:
        rows.insert(-1, ("recurrent state/sequence (compiled)", recurrent.state_words(c)))
        rows.insert(-1, (f"KV + state @ {context:,} tokens (compiled)",
                         f"{c['memory_bytes_per_sequence_at_context']:,} "
                         f"({svg.format_bytes(c['memory_bytes_per_sequence_at_context'])})"))
    parts = ["<table class='facts'>" + "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
             + "</table>"]
    parts.append(recurrent.layer_map(g))
    parts.append(_block(source, final, g, prov))
    parts.append('<h3 id="params">Parameters by component</h3>')
    total = sum(n for _, n, _ in g.params) or 1
    parts.append(svg.bar_chart([(comp, n, f"{100 * n / total:.1f}%, {svg.format_bytes(b)}") for comp, n, b in g.params],
                               title="Parameters by component (compiled graph)"))
    parts.append(_kv(g))
    parts.append(recurrent.memory_section(g))
    parts.append(_flops(g, context))
    parts.append(mla.render(final))
    return "\n".join(parts)


def _block(source: Graph, final: Graph, g, prov) -> str:
    """Layer 0 drawn, and the first layer of each other kind of layer; a hybrid's layers of a
    new mixer kind are drawn open, the rest folded."""
    groups = g.groups
    def layer_picture(graph, index, label):
        pic = layout.place(layout.picture(graph, lambda n: layer_index(n.name) == index, context=True,
                                          link=prov.link, max_boxes=150))
        note = f"<p class='note'>{escape(pic.note)}</p>" if pic.note else ""
        return f"<div class='scroll tall'>{svg.graph_svg(pic, label)}</div>{note}"

    mixed = g.recurrent or len(set(g.kinds.values())) > 1
    parts = ['<h3 id="block">One block of each layer kind</h3>' if mixed else '<h3 id="block">One transformer block</h3>']
    if not groups:
        parts.append("<p>No node is named after a layer (<code>layers.N.*</code>): there is no block to draw.</p>")
    elif len(groups) == 1:
        parts.append(f"<p>All {len(groups[0].layers)} layers are alike ({escape(groups[0].description)}); "
                     "layer 0 is drawn, with its neighbours faded. Orange edges are residual connections.</p>")
    else:
        parts.append("<p>Layer 0 is drawn, with its neighbours faded; orange edges are residual connections. "
                     "The layers differ:</p><ul>")
        parts += [f"<li>layer{'s' if len(gr.layers) > 1 else ''} {escape(diff.compact_ranges(gr.layers))}: "
                  f"{escape(gr.description)}</li>" for gr in groups]
        parts.append("</ul>")
    parts.append(layer_picture(source, 0, "layer 0"))
    seen = {g.kinds.get(groups[0].layers[0])} if groups else set()
    for gr in groups[1:4 if mixed else 3]:
        first = gr.layers[0]
        kind = g.kinds.get(first)
        opened = " open" if mixed and kind not in seen else ""
        seen.add(kind)
        parts.append(f"<details{opened}><summary>layer {first} ({escape(gr.description)})</summary>"
                     f"{layer_picture(source, first, f'layer {first}')}</details>")
    if final is not source and [n.op for n in final.nodes] != [n.op for n in source.nodes]:
        parts.append(f"<details><summary>layer 0 as compiled</summary>{layer_picture(final, 0, 'layer 0 compiled')}"
                     "</details>")
    collapse = _kind_group(g.kinds) if mixed else _layer_group
    pic = layout.place(layout.picture(final, lambda n: layer_index(n.name) is None,
                                      collapse=collapse, link=prov.link))
    parts.append(f"<details open><summary>The compiled graph, one box per layer ({len(final.nodes):,} nodes)</summary>"
                 f"<div class='scroll tall'>{svg.graph_svg(pic, 'compiled graph grouped per layer')}</div></details>")
    return "\n".join(parts)


def _layer_group(name: str):
    layer = layer_index(name)
    return None if layer is None else f"layers.{layer}"


def _kind_group(kinds: dict):
    """A layer's group box named with its kind (``layers.4 attention``), for mixed stacks."""
    def group(name: str):
        layer = layer_index(name)
        return None if layer is None else f"layers.{layer} {kinds.get(layer, '')}".rstrip()
    return group


def _kv(g) -> str:
    if g.recurrent and not any(layer["kv_cache_elements_per_token"] for layer in g.compiled["layers"]):
        return ('<h3 id="kv">KV cache against context</h3><p>No layer keeps a KV cache: the recurrent layers '
                'hold a fixed state instead (memory per sequence below).</p>')
    series = [svg.Series(label, list(zip(g.contexts, values)), dashed) for label, values, dashed in g.kv]
    step = max(1, max(g.contexts) // 8)
    chart = svg.line_chart(series, title="KV-cache bytes per sequence against context", x_label="context (keys)",
                           y_label="bytes", y_format=svg.format_bytes, x_log2=False,
                           x_ticks=[step * k for k in range(0, 9)])
    picks = [c for c in (4096, 32768, 131072) if c in g.contexts]
    head = "".join(f"<th>{svg.format_context(c)}</th>" for c in picks)
    rows = "".join(f"<tr><td class='l'>{escape(label)}</td>" +
                   "".join(f"<td>{escape(svg.format_bytes(values[g.contexts.index(c)]))}</td>" for c in picks) + "</tr>"
                   for label, values, _ in g.kv)
    attending = sum(1 for k in g.kinds.values() if model.is_attention(k))
    hybrid = (f" Only {attending} of the {len(g.kinds)} layers attend and cache keys; the recurrent layers' "
              "fixed state is charted under memory below." if g.recurrent else "")
    return (f'<h3 id="kv">KV cache against context</h3><p>One sequence, all layers, sliding windows kept; '
            f"dashed lines are alternatives for the same layers.{escape(hybrid)}</p>{chart}"
            f"<table class='num'><tr><th>cache</th>{head}</tr>{rows}</table>")


def _flops(g, context: int) -> str:
    f = g.flops
    xs = g.contexts
    chart = svg.line_chart([svg.Series("irc forward: 2·weights + 4·S·d per layer", list(zip(xs, f["forward"]))),
                            svg.Series("seed §5 training: 6N + 6·L·S·d", list(zip(xs, f["train"])), True)],
                           title="FLOPs per token against context", x_label="context S (keys)", y_label="FLOPs/token")
    share = svg.line_chart([svg.Series("irc forward", list(zip(xs, f["forward_share"]))),
                            svg.Series("seed §5 training", list(zip(xs, f["train_share"])), True)],
                           title="Attention share of FLOPs per token", x_label="context S (keys)",
                           y_label="attention share", y_format=svg.format_percent, y_max=1.0)
    picks = [c for c in (4096, 32768, 131072) if c in xs]
    hybrid = f["layers"] != f["all_layers"] and g.recurrent
    layer_word = "attention layer (recurrent layers cost the same at every S)" if hybrid else "layer"
    of_all = f" attention layers of {f['all_layers']}" if hybrid else ""
    rows = []
    for label, key in (("irc forward (decode one token)", "forward"), ("seed §5 training (6N + 6LSd)", "train")):
        for c in picks:
            i = xs.index(c)
            rows.append(f"<tr><td class='l'>{escape(label)}</td><td>{c:,}</td><td>{svg.format_count(f[key][i])}</td>"
                        f"<td>{svg.format_count(f[key + '_attention'][i])}</td>"
                        f"<td class='share'>{svg.format_percent(f[key + '_share'][i])}</td></tr>")
    return (f'<h3 id="flops">FLOPs per token against context</h3>'
            f"<p><b>irc forward</b> is irc's own accounting (<code>irc show</code>): decoding one token at context S "
            f"costs 2 FLOPs per matmul weight (LM head counted, embedding lookup not; "
            f"{svg.format_count(f['forward_fixed'])}) "
            f"plus 2·S·d for the scores and 2·S·d for the weighted sum per {layer_word}, S capped by any sliding "
            f"window. "
            f"<b>seed §5 training</b> is the training accounting of the course notes (Kaplan et al.): "
            f"6N per token for "
            f"N = {f['n']:,} parameters (active, embedding included) plus 6·L·S·d for attention "
            f"(L = {f['layers']}{of_all}, d = {f['d']}), no causal halving, no windows. The attention share is the part that "
            f"grows with the context.</p><div class='charts'>{chart}{share}</div>"
            f"<table class='num'><tr><th>accounting</th><th>context</th><th>FLOPs/token</th><th>attention</th>"
            f"<th>attention share</th></tr>{''.join(rows)}</table>")


CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0 auto;max-width:1280px;
padding:0 20px 40px;color:#1d2430;background:#fff}
h1{font-size:22px;margin:18px 0 4px}
h2{font-size:18px;border-bottom:2px solid #dde3ea;padding-bottom:3px;margin-top:34px}
h3{font-size:15px;margin:22px 0 6px}h4{font-size:13px;margin:12px 0 4px;font-weight:normal;color:#3a4656}
nav a{margin:0 2px}code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
table{border-collapse:collapse;margin:8px 0}th,td{padding:3px 8px;border-bottom:1px solid #e6ebf0;text-align:right;
white-space:nowrap}th{background:#f3f6f9;font-weight:600}td.l,th.l,table.facts th,table.facts td{text-align:left}
tr.unchanged td{color:#7a8594}tr.input td{background:#f8fafc}.up{color:#b35a00;font-size:11px}
.down{color:#1a7f37;font-size:11px}.note,.facts{color:#5b6776;font-size:12.5px}.share{font-weight:600}
pre.diff{background:#f8fafc;border:1px solid #e2e8f0;padding:6px 8px;overflow:auto;max-height:420px;margin:4px 0}
pre.diff span{display:block;white-space:pre}pre.diff .del{background:#ffecec;color:#8a1f1f}
pre.diff .add{background:#e8f8ec;color:#135e2a}pre.diff .ctx{color:#5b6776}
pre.diff .gutter{display:inline-block;width:28ch;margin-right:1ch;text-align:right;overflow:hidden;
vertical-align:bottom}a.origin,span.origin{color:#2f6db5;font-size:11px}
.pair{display:flex;gap:12px;flex-wrap:wrap}.pair figure{flex:1 1 420px;margin:0;min-width:0}
figcaption{font-size:12px;color:#5b6776}.scroll{overflow:auto;max-height:640px;border:1px solid #e2e8f0;
background:#fcfdfe}.scroll.tall{max-height:900px}.charts{display:flex;flex-wrap:wrap;gap:16px}
article.pass{border-left:3px solid #2f6db5;padding-left:12px;margin:18px 0}ul.notes{font-size:12.5px;color:#6b4b00}
pre.src{background:#f8fafc;border:1px solid #e2e8f0;padding:6px 0;overflow:auto;max-height:520px}
pre.src .line{display:block;padding:0 8px}pre.src .line:target{background:#fff3c4}
pre.src .ln{display:inline-block;width:3.5em;color:#9aa5b1;user-select:none}
svg text{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:11px;fill:#1d2430}
svg .title{font-family:system-ui,sans-serif;font-size:13px;font-weight:600}
svg .tick,svg .axis,svg .value{font-size:10.5px}
svg .grid{stroke:#e8edf2}svg .line{fill:none;stroke-width:2}
svg .reference{stroke:#d62728;stroke-dasharray:5 3;stroke-width:1.5}
svg .edge{fill:none;stroke:#667;stroke-width:1.1}svg .edge.residual{stroke:#e07b00;stroke-width:2}
svg .node rect{fill:#eef3f8;stroke:#7890a8}svg .node .op{font-weight:700}
svg .c-mm rect{fill:#dbe9fb;stroke:#3d7cc9}svg .c-attn rect{fill:#fde2d6;stroke:#c8582b}
svg .c-moe rect,svg .c-mlp rect{fill:#e6f4e1;stroke:#4b9a3c}svg .c-norm rect{fill:#f3ecfb;stroke:#8a63b8}
svg .c-rope rect{fill:#fff4d6;stroke:#b88a16}svg .c-embed rect{fill:#e3f5f5;stroke:#2d8c8c}
svg .c-move rect{fill:#f4f5f7;stroke:#a3adb8}svg .io rect{fill:#fff;stroke:#4a5563}
svg .group rect{fill:#eceaf7;stroke:#6a5fb0;stroke-width:1.5}svg .context rect{fill:#fafbfc;stroke:#c3cbd4;
stroke-dasharray:3 2}svg .context text{fill:#8a96a3}svg a .node:hover rect{stroke-width:2.2}
svg .c-scan rect{fill:#dff3ee;stroke:#1f8a70}svg .c-delta rect{fill:#fbe3f1;stroke:#b0418a}
svg .c-conv rect{fill:#e9f0d8;stroke:#6d8a2a}svg .role-state rect{fill:#fff;stroke:#1f8a70;stroke-width:2}
svg .role-cache rect{fill:#fff;stroke:#c8582b;stroke-width:2}svg .layer.c-op rect{fill:#eef3f8;stroke:#7890a8}
svg .layer .op{font-weight:700}
svg .seg.changed{fill:#2f6db5}svg .seg.unchanged{fill:#c9d6e3}svg .seglabel{font-size:10.5px}svg .seglabel.on{fill:#fff}
""".strip()
